#!/usr/bin/env bash
# scripts/bench-network.sh — the all-reduce over the mpi transport on a
# shaped link (docs/network.md): exact (fp32), bf16, int4 and echo, for
# each rank count and link preset, 64 KiB .. 256 MiB in x4 steps; then the
# tables (measured beside the cost model) and the PNG plots.
#
#   scripts/bench-network.sh [--out DIR] [--bench PATH] [--ranks "2 4"]
#                            [--rates "none 2.5gbit 1gbit"] [--min-bytes 64K]
#                            [--max-bytes 256M] [--tag NAME] [--report-only]
#                            [--lab netlab|hostlab]
#
# Every run is `scripts/netlab.sh --rate R -- mpirun -np N echo-bench
# allreduce --transport mpi ... --json` into DIR/ar-nN-R[-TAG].json; the
# --lab hostlab runs each rank count in scripts/hostlab.sh instead (one
# namespace and one shaped link per rank; the cost model below is netlab's
# shared link, so its columns do not apply there). The
# report (DIR/network-tables.md, DIR/network-*.png) reads the untagged
# files, and lists tagged ones (repeats) beside them. Needs root (netlab),
# Open MPI, python3 and gnuplot. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-network bench=bin/echo-bench ranks="2 4" rates="none 2.5gbit 1gbit"
minb=64K maxb=256M tag= report_only=0 lab=netlab
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --min-bytes) minb=$2; shift 2 ;;
    --max-bytes) maxb=$2; shift 2 ;;
    --tag) tag=-$2; shift 2 ;;
    --report-only) report_only=1; shift ;;
    --lab) lab=$2; shift 2 ;;
    *) sed -n '2,22p' "$0" >&2; exit 2 ;;
    esac
done
case "$lab" in netlab) labcmd=(scripts/netlab.sh) ;; hostlab) labcmd=(scripts/hostlab.sh --hosts) ;;
    *) echo "bench-network: --lab: expected netlab or hostlab" >&2; exit 2 ;; esac
mkdir -p "$out"
if [ $report_only = 0 ]; then
    [ -x "$bench" ] || { echo "bench-network: $bench not found (make $bench)" >&2; exit 2; }
    for n in $ranks; do
        for r in $rates; do
            f=$out/ar-n$n-$r$tag.json
            echo "== $n ranks, link $r -> $f ($(date -u +%H:%M:%S))" >&2
            hosts=()
            [ "$lab" = netlab ] || hosts=("$n")
            "${labcmd[@]}" "${hosts[@]}" --rate "$r" -- mpirun --oversubscribe -np "$n" "$bench" allreduce --transport mpi \
                --algo exact,bf16,int4,echo --min-bytes "$minb" --max-bytes "$maxb" --step 4 --json >"$f.tmp"
            mv "$f.tmp" "$f"
        done
    done
fi

python3 - "$out" <<'PY'
import glob, json, os, re, subprocess, sys
out = sys.argv[1]
RATE = {"none": None, "1gbit": 1e9, "2.5gbit": 2.5e9, "10gbit": 10e9}
ALGOS = ["exact", "bf16", "int4", "echo"]
runs = {}    # (n, rate) -> {(bytes, algo): row}
extra = {}   # (n, rate, tag) -> rows
for f in sorted(glob.glob(os.path.join(out, "ar-n*-*.json"))):
    m = re.match(r"ar-n(\d+)-([0-9.a-z]+?)(?:-(.+))?\.json$", os.path.basename(f))
    if not m: continue
    n, rate, tag = int(m.group(1)), m.group(2), m.group(3)
    rows = {(r["bytes"], r["algo"]): r for r in json.load(open(f))}
    if tag: extra[(n, rate, tag)] = rows
    else: runs[(n, rate)] = rows

def wire_bytes(row, algo, group):  # bytes per value on the wire: the run's own figure
    if "wire_bits_per_value" in row: return row["wire_bits_per_value"] / 8
    return {"exact": 4.0, "bf16": 2.0}.get(algo, (4 + 16.0 / group) / 8)  # runs before it was recorded

def size(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)

def predict(n, rate, b, algo, group):
    """Cost model on the lab's link: every rank's bytes cross the one shaped
    loopback, so the link carries 2(N-1)*M*w bytes per call at R bit/s; the
    CPU work is the same call measured without shaping, not overlapped."""
    cpu = runs.get((n, "none"), {}).get((b, algo))
    if RATE.get(rate) is None or cpu is None: return None
    link = 2 * (n - 1) * (b / 4) * wire_bytes(runs[(n, rate)][(b, algo)], algo, group) * 8 / RATE[rate]
    return link * 1e6, (link * 1e6 + cpu["time_us"])

lines = []
def order(k):  # ranks, then none, 2.5gbit, 1gbit
    return (k[0], -(RATE.get(k[1]) or 1e99))
for (n, rate) in sorted(runs, key=order):
    rows = runs[(n, rate)]
    sizes = sorted({b for b, _ in rows})
    lines.append("\n### %d ranks, link %s\n" % (n, rate))
    hdr = "| size | exact ms | bf16 ms | int4 ms | echo ms | echo vs bf16 | echo vs fp32 | rel_err bf16 | rel_err echo |"
    if RATE.get(rate): hdr += " model: bf16 ms | model: echo ms | model: echo vs bf16 | link-only: echo vs bf16 |"
    lines.append(hdr)
    lines.append("|" + "---|" * (hdr.count("|") - 1))
    for b in sizes:
        t = {a: rows[(b, a)]["time_us"] / 1e3 for a in ALGOS if (b, a) in rows}
        if len(t) < 4: continue
        g = rows[(b, "echo")]["group"]
        s = "| %s | %.2f | %.2f | %.2f | %.2f | **%.2f** | %.2f | %.2g | %.2g |" % (
            size(b), t["exact"], t["bf16"], t["int4"], t["echo"], t["bf16"] / t["echo"], t["exact"] / t["echo"],
            rows[(b, "bf16")]["rel_err"], rows[(b, "echo")]["rel_err"])
        if RATE.get(rate):
            pb, pe = predict(n, rate, b, "bf16", g), predict(n, rate, b, "echo", g)
            if pb and pe:
                s += " %.2f | %.2f | %.2f | %.2f |" % (pb[1] / 1e3, pe[1] / 1e3, pb[1] / pe[1], pb[0] / pe[0])
            else:
                s += " | | | |"
        lines.append(s)
if extra:
    lines.append("\n### Repeats (same command, another time)\n")
    lines.append("| ranks | link | tag | size | exact ms | bf16 ms | int4 ms | echo ms | echo vs bf16 |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for (n, rate, tag), rows in sorted(extra.items()):
        for b in sorted({b for b, _ in rows}):
            t = {a: rows[(b, a)]["time_us"] / 1e3 for a in ALGOS if (b, a) in rows}
            if len(t) < 4: continue
            lines.append("| %d | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | **%.2f** |" % (
                n, rate, tag, size(b), t["exact"], t["bf16"], t["int4"], t["echo"], t["bf16"] / t["echo"]))
open(os.path.join(out, "network-tables.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

# plots: time vs size per rank count (one panel per link), and the speed-up
def gp(script):
    subprocess.run(["gnuplot"], input=script.encode(), check=True)
term = "set terminal pngcairo size 1500,500 font ',10'\n"
try:
    subprocess.run(["gnuplot", "-e", "set terminal pngcairo"], check=True, capture_output=True)
except Exception:
    term = "set terminal png size 1500,500\n"
for n in sorted({k[0] for k in runs}):
    rates = sorted([r for (m, r) in runs if m == n], key=lambda r: -(RATE.get(r) or 1e99))
    sc = term + "set output '%s/network-time-%dranks.png'\nset multiplot layout 1,%d\n" % (out, n, len(rates))
    for r in rates:
        rows = runs[(n, r)]
        sc += ("set title '%d ranks, link %s'\nset logscale xy 2\nset xlabel 'message (KiB, fp32)'\n"
               "set ylabel 'time per all-reduce (ms)'\nset key top left\nset grid\n" % (n, r))
        sc += "plot " + ", ".join("'-' using 1:2 with linespoints title '%s'" % a for a in ALGOS) + "\n"
        for a in ALGOS:
            for b in sorted({b for b, x in rows if x == a}):
                sc += "%d %g\n" % (b >> 10, rows[(b, a)]["time_us"] / 1e3)
            sc += "e\n"
    sc += "unset multiplot\n"
    gp(sc)
sc = term.replace("1500,500", "800,500") + "set output '%s/network-speedup.png'\n" % out
sc += ("set title 'echo vs bf16-exact (time of bf16 / time of echo), mpi transport'\nset logscale xy 2\n"
       "set yrange [0.25:64]\nset xlabel 'message (KiB, fp32)'\nset ylabel 'speed-up'\nset key top right\n"
       "set grid\n")
keys = sorted(runs, key=order)
sc += "plot 1 with lines lc rgb 'gray' notitle, " + ", ".join(
    "'-' using 1:2 with linespoints title '%d ranks, %s'" % k for k in keys) + "\n"
for k in keys:
    rows = runs[k]
    for b in sorted({b for b, _ in rows}):
        if (b, "bf16") in rows and (b, "echo") in rows:
            sc += "%d %g\n" % (b >> 10, rows[(b, "bf16")]["time_us"] / rows[(b, "echo")]["time_us"])
    sc += "e\n"
gp(sc)
print("plots in %s/network-*.png" % out, file=sys.stderr)
PY
