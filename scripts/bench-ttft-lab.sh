#!/usr/bin/env bash
# End-to-end TTFT and inter-token latency over a shaped link: the ranks as
# processes (mpirun), every byte between them through scripts/netlab.sh's
# shaped loopback, `echo-bench forward` measuring time to first token of one
# prompt and batch-1 decode, for each all-reduce mode side by side (modes
# interleaved per configuration, so they see the same machine).
#
#   scripts/bench-ttft-lab.sh [--quick] [--out DIR] [--model M] [--bin DIR] [--tps "2 4"]
#                             [--rates "1gbit none"] [--lens "512 2048"] [--iters N]
#                             [--lab netlab|hostlab] [--modes "exact bf16 echo echo:hadamard-g32"]
#                             [--extra "ARGS"] [--host-cores C]
#     --lab       netlab (default: one shaped loopback for all ranks) or hostlab
#                 (scripts/hostlab.sh: a namespace and a shaped link per rank)
#     --extra     more echo-bench forward flags for every run
#     --host-cores C  (hostlab) hosts standing for C-core machines on each
#                 rate: scripts/hostlab.sh --host-cores; rows carry host_cores
#     --model M   default random:qwen3-0.6b,layers=8 (Qwen3-0.6B's shape,
#                 8 of its 28 layers: hidden 1024, 16 heads, 8 KV heads)
#     --quick     tp 2, 1 Gbit/s, 512 tokens only (a smoke run, ~1 min)
# All-reduces, side by side: exact (fp32), bf16, echo (the default preset,
# hout2-g128) and echo with the hadamard-g32 codec (fast host loops).
# Needs root (network namespaces) and Open MPI. Writes DIR/ttft.jsonl (one
# echo-bench forward JSON per run) and DIR/ttft.md (the table); docs/network.md
# quotes it. About 25 minutes on 2 cores for the full sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/ttft-lab model="random:qwen3-0.6b,layers=8" bin=bin quick=0 tps_arg= rates_arg= lens_arg= iters_arg=
lab=netlab modes_arg= extra= hc=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --model) model=$2; shift ;;
    --bin) bin=$2; shift ;;
    --quick) quick=1 ;;
    --tps) tps_arg=$2; shift ;;
    --rates) rates_arg=$2; shift ;;
    --lens) lens_arg=$2; shift ;;
    --iters) iters_arg=$2; shift ;;
    --lab) lab=$2; shift ;;
    --modes) modes_arg=$2; shift ;;
    --extra) extra=$2; shift ;;
    --host-cores) hc=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "bench-ttft-lab: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "bench-ttft-lab: needs root (network namespaces)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "bench-ttft-lab: needs Open MPI (make deps)" >&2; exit 1; }
[ -x "$bin/echo-bench" ] || { echo "bench-ttft-lab: $bin/echo-bench not built (make)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
: > "$out/ttft.jsonl"
if [ $quick = 1 ]; then tps="2"; rates="1gbit"; lens="512"; iters=2
else tps="2 4"; rates="1gbit 2.5gbit none"; lens="512 2048"; iters=3; fi
tps=${tps_arg:-$tps} rates=${rates_arg:-$rates} lens=${lens_arg:-$lens} iters=${iters_arg:-$iters}
modes=${modes_arg:-"exact bf16 echo echo:hadamard-g32"}
case "$lab" in netlab | hostlab) ;; *) echo "bench-ttft-lab: --lab: expected netlab or hostlab" >&2; exit 2 ;; esac
[ -z "$hc" ] || [ "$lab" = hostlab ] || { echo "bench-ttft-lab: --host-cores needs --lab hostlab" >&2; exit 2; }
for tp in $tps; do
  for rate in $rates; do
    for len in $lens; do
      for mode in $modes; do
        echo "bench-ttft-lab: tp $tp, link $rate, $len tokens, $mode" >&2
        codec=()
        [ "${mode#*:}" = "$mode" ] || codec=(--echo-codec "${mode#*:}")
        hosts=()
        [ "$lab" = netlab ] || hosts=(--hosts "$tp")
        [ -z "$hc" ] || hosts+=(--host-cores "$hc")
        # shellcheck disable=SC2086 # --extra is a list of flags
        line=$(timeout 900 scripts/$lab.sh "${hosts[@]}" --rate "$rate" -- mpirun --oversubscribe -np "$tp" \
          "$bin/echo-bench" forward --model "$model" --tp "$tp" --allreduce "${mode%%:*}" "${codec[@]}" $extra --prefill "$len" \
          --ttft-len "$len" --decode-batch 1 --decode-steps 16 --iters "$iters" --gemm-dim 0 \
          --copy-bytes 64M --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))')
        python3 -c 'import json, sys
j = json.loads(sys.argv[3])
j["link"], j["len"], j["lab"] = sys.argv[1], int(sys.argv[2]), sys.argv[4]
j["host_cores"] = float(sys.argv[5]) if sys.argv[5] else None
if j.get("allreduce") == "echo":
    j["allreduce"] = "echo:%s-g%d" % (j["echo_codec"], j["echo_group"])
print(json.dumps(j))' "$rate" "$len" "$line" "$lab" "$hc" >>"$out/ttft.jsonl"
      done
    done
  done
done
python3 - "$out/ttft.jsonl" "$model" "$lab" > "$out/ttft.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda r: (r["tp"], r["link"], r["len"])
where = {"netlab": "over the shaped loopback", "hostlab": "one per host (scripts/hostlab.sh), a shaped link each"}
print(f"TTFT and batch-1 inter-token latency, {sys.argv[2]}, ranks as processes {where[sys.argv[3]]}")
print("(median of the runs; ITL = one batch-1 decode step)\n")
names = []
for r in rows:
    if r["allreduce"] not in names:
        names.append(r["allreduce"])
print("| tp | link | prompt | " + " | ".join(f"TTFT {n}" for n in names) + " | "
      + " | ".join(f"exact / {n}" for n in names[1:]) + " | " + " | ".join(f"ITL {n}" for n in names) + " |")
print("|" + "---|" * (3 + 2 * len(names) + len(names) - 1))
seen = []
for r in rows:
    if key(r) not in seen:
        seen.append(key(r))
for k in seen:
    by = {r["allreduce"]: r for r in rows if key(r) == k}
    def ttft(m): return by[m]["ttft"]["ms"] if m in by else float("nan")
    def itl(m):
        d = [x for x in by[m]["decode"] if x["batch"] == 1] if m in by else []
        return d[0]["ms_per_step"] if d else float("nan")
    cells = [f"{ttft(n):.0f} ms" for n in names] + [f"{ttft(names[0]) / ttft(n):.2f}x" for n in names[1:]] \
        + [f"{itl(n):.1f} ms" for n in names]
    print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
PY
cat "$out/ttft.md"
