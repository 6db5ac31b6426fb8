#!/usr/bin/env bash
# echo under mpirun vs llama.cpp's RPC backend across "hosts" of the per-host
# lab (scripts/hostlab.sh): the same GGUF file, N hosts, one rank (echo) or
# one ggml-rpc-server -t 1 (llama.cpp; the client, llama-bench, in host 0
# with its own CPU device) per host, each host's link shaped to RATE.
# Per cell: prompt TTFT (ms, median of --iters prompts after a warm-up),
# batch-1 decode tok/s, and bytes on the wire per token.
#
#   scripts/bench-vs-llamacpp-rpc.sh --model GGUF --tp N [--rates "1gbit 10gbit none"]
#       [--host-cores "4 8 16"] [--prompts "512"] [--decode 16] [--reps 1] [--iters 3]
#       [--echo-modes "exact bf16 echo"] [--overlap "off auto"] [--sm "layer tensor"]
#       [--echo-args "ARGS"] [--out FILE]
#   scripts/bench-vs-llamacpp-rpc.sh --summary FILE [--plot PNG]   (table, plot)
#
# echo: echo-bench forward --prefill 16 --ttft-len P --decode-batch 1
# --decode-steps D --iters I --overlap O, 1 thread per rank, --act-quant
# default (auto: integer kernels on a quantized GGUF). llama.cpp:
# llama-bench -p P -n D -r I -t 1 --rpc host1,... -sm MODE (layer: pipeline,
# tensor: its tensor parallelism), from $LLAMACPP_BIN (default
# build/llamacpp/build/bin); its TTFT is the median of its I prompt samples.
# Each cell is one lab under `flock /work/cpu.lock`; cells run one after
# the other per repetition (--reps), so all see the same machine load.
# Bytes per token: the bytes every host's lab0 sent during the run over the
# tokens the run pushed through the model (warm-ups, prompts and decode
# steps together); for llama.cpp less the bytes of uploading the weights to
# its servers, measured once per (file, tp, -sm) by a load-only run
# (`llama-bench -p 0 -n 1 -r 1`, unshaped; cached in FILE.load.json).
# --host-cores "C...": compute-matched cells (scripts/hostlab.sh --host-cores
# C): the N hosts stand for hosts of C cores on each RATE, their links
# shaped to RATE x (this machine's cores / N) / C; rows carry host_cores.
# Results: one JSON line per run appended to FILE (default
# build/vs-llamacpp-rpc.jsonl), then the summary: per (file, prompt, tp,
# link) the median over runs of each setup's TTFT, decode tok/s and KB per
# token, and ratios: best llama.cpp mode's TTFT / this TTFT, and bf16's
# (same overlap) / this. --plot draws TTFT per setup (scripts/vs-llamacpp-rpc.gp).
# Needs root, Open MPI, gnuplot (--plot) and the llama.cpp build.
set -euo pipefail
cd "$(dirname "$0")/.."
model= tp=2 rates="1gbit 10gbit none" prompts=512 decode=16 reps=1 iters=3 emodes="exact bf16 echo"
overlaps="off auto" sms="layer tensor" eargs= out=build/vs-llamacpp-rpc.jsonl summary= plot= hcores=
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift ;;
    --tp) tp=$2; shift ;;
    --rates) rates=$2; shift ;;
    --host-cores) hcores=$2; shift ;;
    --prompt|--prompts) prompts=$2; shift ;;
    --decode) decode=$2; shift ;;
    --reps) reps=$2; shift ;;
    --iters) iters=$2; shift ;;
    --echo-modes) emodes=$2; shift ;;
    --overlap) overlaps=$2; shift ;;
    --sm) sms=$2; shift ;;
    --echo-args) eargs=$2; shift ;;
    --out) out=$2; shift ;;
    --summary) summary=$2; shift ;;
    --plot) plot=$2; shift ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-vs-llamacpp-rpc: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

# The summary: medians per setup and the ratios (also after the runs).
summarize() {  # JSONL [PNG]
  python3 - "$1" "${2:-}" <<'PY'
import json, os, statistics as st, subprocess, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def setup(r):
    return r["who"] + (" overlap " + r["overlap"] if r.get("overlap") else "")
groups = []
for r in rows:
    g = (r["model"], r["prompt"], r["tp"], r["rate"], r.get("host_cores"))
    if g not in groups: groups.append(g)
med = lambda xs: st.median(xs) if xs else float("nan")
plotrows, cols = [], []
for g in groups:
    gr = [r for r in rows if (r["model"], r["prompt"], r["tp"], r["rate"], r.get("host_cores")) == g]
    names = []
    for r in gr:
        if setup(r) not in names: names.append(setup(r))
    m = {n: [r for r in gr if setup(r) == n] for n in names}
    ttft = {n: med([r["ttft_ms"] for r in m[n]]) for n in names}
    llama = [ttft[n] for n in names if n.startswith("llama.cpp")]
    best = min(llama) if llama else None
    hc = f" (hosts standing for {g[4]}-core machines: each link shaped to {g[3]} x cores per lab host / {g[4]})" if g[4] else ""
    print(f"\n{g[0]}, tp {g[2]}, link {g[3]}{hc}, {g[1]}-token prompt (median over runs; each run's TTFT "
          f"is the median of its prompts)\n")
    print("| setup | runs | TTFT ms | best llama.cpp / this | bf16 / this | decode tok/s | KB per token | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        rs = m[n]
        ov = rs[0].get("overlap")
        bf = [k for k in names if k.startswith("echo bf16") and ov is not None and k.endswith("overlap " + ov)]
        bfr = f"{ttft[bf[0]] / ttft[n]:.2f}x" if bf else ""
        bpt = [r["bytes_per_token"] for r in rs if r.get("bytes_per_token") is not None]
        loads = sorted(float(r["load"]) for r in rs)
        print(f"| {n} | {len(rs)} | {ttft[n]:.0f} | {f'{best / ttft[n]:.2f}x' if best else ''} | {bfr} | "
              f"{med([r['decode_tok_s'] for r in rs]):.1f} | {f'{med(bpt) / 1e3:.1f}' if bpt else '?'} | "
              f"{loads[0]:.1f}-{loads[-1]:.1f} |")
        if n not in cols: cols.append(n)
    plotrows.append((f"{os.path.basename(g[0]).replace('.gguf', '').replace('_', '-')} tp{g[2]} {g[3]}"
                     f"{' ' + str(g[4]) + 'c' if g[4] else ''} {g[1]}", ttft))
if sys.argv[2]:
    dat = sys.argv[2] + ".dat"
    with open(dat, "w") as f:
        f.write("setup\t" + "\t".join('"' + c + '"' for c in cols) + "\n")
        for label, t in plotrows:
            f.write('"' + label + '"\t' + "\t".join(f"{t[c] / 1e3:.3f}" if c in t else "?" for c in cols) + "\n")
    subprocess.run(["gnuplot", "-e", f"dat='{dat}'; out='{sys.argv[2]}'; n={len(cols)}",
                    "scripts/vs-llamacpp-rpc.gp"], check=True)
    print(f"\nplot: {sys.argv[2]} (data {dat})")
PY
}
if [ -n "$summary" ]; then
  [ -f "$summary" ] || { echo "bench-vs-llamacpp-rpc: --summary: no file '$summary'" >&2; exit 2; }
  summarize "$summary" "$plot"
  exit 0
fi

lbin=${LLAMACPP_BIN:-build/llamacpp/build/bin}
# without llama.cpp cells (--sm "") echo's model may be a folder or random:SHAPE
[ -f "$model" ] || { [ -z "${sms// }" ] && { [ -d "$model" ] || [[ "$model" == random:* ]]; }; } ||
  { echo "bench-vs-llamacpp-rpc: --model: no GGUF file '$model'" >&2; exit 2; }
for c in $hcores; do
  [[ "$c" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "bench-vs-llamacpp-rpc: --host-cores: core counts, got '$c'" >&2; exit 2; }
done
[[ "$tp" =~ ^[2-9]$ ]] || { echo "bench-vs-llamacpp-rpc: --tp: 2..9" >&2; exit 2; }
[[ "$reps" =~ ^[1-9][0-9]*$ && "$iters" =~ ^[1-9][0-9]*$ && "$decode" =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench-vs-llamacpp-rpc: --reps, --iters, --decode: counts >= 1" >&2; exit 2; }
for o in $overlaps; do
  [[ "$o" =~ ^(off|auto|[1-8])$ ]] || { echo "bench-vs-llamacpp-rpc: --overlap: off, auto or 1..8, got '$o'" >&2; exit 2; }
done
for b in ${sms:+"$lbin/llama-bench" "$lbin/ggml-rpc-server"} bin/echo-bench; do
  [ -x "$b" ] || { echo "bench-vs-llamacpp-rpc: $b not built" >&2; exit 2; }
done
mkdir -p "$(dirname "$out")"

# Run inside the lab (host 0): CMD..., then print the bytes every host sent.
cat >build/.rpc-cell.sh <<'EOF'
#!/usr/bin/env bash
# $1: echo|llama; rest: the command. Prints the command's stdout, then "TX <bytes>".
set -u
kind=$1; shift
tx() { local t=0 ns; for ns in $ECHO_HOSTLAB_NS; do
  t=$((t + $(ip netns exec "$ns" cat /sys/class/net/lab0/statistics/tx_bytes))); done; echo $t; }
pids=()
if [ "$kind" = llama ]; then
  i=0
  for ns in $ECHO_HOSTLAB_NS; do
    if [ $i -gt 0 ]; then
      ip netns exec "$ns" "$LBIN/ggml-rpc-server" -t 1 -H "10.77.0.$((i + 1))" -p 50052 >/dev/null 2>&1 &
      pids+=($!)
    fi
    i=$((i + 1))
  done
  for _ in $(seq 50); do  # servers listening
    ok=1; i=0
    for ns in $ECHO_HOSTLAB_NS; do
      [ $i -gt 0 ] && ! ip netns exec "$ns" sh -c "ss -ltn | grep -q ':50052 '" && ok=0
      i=$((i + 1))
    done
    [ $ok = 1 ] && break; sleep 0.2
  done
fi
t0=$(tx)
"$@"
rc=$?
t1=$(tx)
for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
echo "TX $((t1 - t0))"
exit $rc
EOF
chmod +x build/.rpc-cell.sh
rpcs=$(for ((i = 1; i < tp; i++)); do printf '10.77.0.%d:50052,' $((i + 1)); done); rpcs=${rpcs%,}
loadf=$out.load.json
[ -f "$loadf" ] || echo '{}' >"$loadf"

# cell RATE HOST_CORES CMD...: one lab of tp hosts at RATE (standing for
# hosts of HOST_CORES cores; "_": none) under the lock, at most 10
# minutes; prints the command's output and the TX line; one retry (an
# mpirun start in the lab fails now and then).
cell() {
  local rate=$1 hc=$2 try res; shift 2
  local hca=()
  [ "$hc" = _ ] || hca=(--host-cores "$hc")
  for try in 1 2; do
    echo "== $(date -u +%FT%TZ) tp $tp rate $rate host cores $hc try $try: $*" >>"$out.err"
    if res=$(flock /work/cpu.lock timeout 600 env LBIN="$lbin" scripts/hostlab.sh --hosts "$tp" --rate "$rate" \
      "${hca[@]}" -- \
      build/.rpc-cell.sh "$@" 2>>"$out.err"); then printf '%s\n' "$res"; return 0; fi
    echo "  failed (try $try; stderr in $out.err)" >&2
  done
  return 1
}

# The bytes llama.cpp sends to load the model on its servers (per file, tp, -sm).
upload_bytes() {  # sm
  local key="$model|$tp|$1" res
  res=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$loadf" "$key")
  if [ -z "$res" ]; then
    echo "bench-vs-llamacpp-rpc: llama.cpp -sm $1: bytes of the model upload (load-only run)" >&2
    res=$(cell none _ llama "$lbin/llama-bench" -m "$model" -rpc "$rpcs" -sm "$1" -p 0 -n 1 -r 1 -t 1 -o json |
      sed -n 's/^TX //p') || return 1
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d[sys.argv[2]] = int(sys.argv[3])
json.dump(d, open(sys.argv[1], "w"), indent=1)' "$loadf" "$key" "$res"
  fi
  echo "$res"
}

for rep in $(seq "$reps"); do
  for prompt in $prompts; do
    for rate in $rates; do
     for hc in ${hcores:-_}; do
      for m in $emodes; do
        for ov in $overlaps; do
          echo "bench-vs-llamacpp-rpc: rep $rep, $rate, host cores $hc, P $prompt, echo $m, overlap $ov (load $(cut -d' ' -f1 /proc/loadavg))" >&2
          # shellcheck disable=SC2086 # --echo-args is a list of flags
          res=$(cell "$rate" "$hc" echo mpirun -np "$tp" bin/echo-bench forward --model "$model" --tp "$tp" --allreduce "$m" \
            --overlap "$ov" $eargs --prefill 16 --ttft-len "$prompt" --decode-batch 1 --decode-steps "$decode" \
            --iters "$iters" --gemm-dim 0 --copy-bytes 1M --threads 1 --json) || continue
          python3 -c 'import json, sys
txt = sys.stdin.read(); tx = int(txt.rsplit("TX ", 1)[1]); j = json.loads(txt.rsplit("TX ", 1)[0])
model, m, ov, rate, tp, rep, P, D, I, hc = sys.argv[1:]; P, D, I = int(P), int(D), int(I)
d = [x for x in j["decode"] if x["batch"] == 1][0]
# prefill phase (16 tokens, warm-up + I), decode phase (16-token prompt, 1 warm-up step, D steps), TTFT (warm-up + I)
tokens = (1 + I) * 16 + 16 + 1 + D + (1 + I) * P
print(json.dumps({"model": model, "who": "echo " + m, "overlap": ov, "rate": rate, "tp": int(tp), "rep": int(rep),
  "prompt": P, "decode": D, "iters": I, "ttft_ms": j["ttft"]["ms"], "decode_tok_s": d["tokens_per_s"], "tx_bytes": tx,
  "tokens": tokens, "bytes_per_token": tx / tokens, "allreduce": j.get("allreduce"),
  "allreduce_auto": j.get("allreduce_auto"), "host_cores": None if hc == "_" else float(hc),
  "load": open("/proc/loadavg").read().split()[0]}))' \
            "$model" "$m" "$ov" "$rate" "$tp" "$rep" "$prompt" "$decode" "$iters" "$hc" <<<"$res" >>"$out" &&
            tail -1 "$out" >&2 || echo "  no result parsed" >&2
        done
      done
      for sm in $sms; do
        up=$(upload_bytes "$sm") || up=
        echo "bench-vs-llamacpp-rpc: rep $rep, $rate, host cores $hc, P $prompt, llama.cpp -sm $sm (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        res=$(cell "$rate" "$hc" llama "$lbin/llama-bench" -m "$model" -rpc "$rpcs" -sm "$sm" -p "$prompt" -n "$decode" \
          -r "$iters" -t 1 -o json) || continue
        python3 -c 'import json, statistics as st, sys
txt = sys.stdin.read(); tx = int(txt.rsplit("TX ", 1)[1]); rows = json.loads(txt.rsplit("TX ", 1)[0])
model, sm, rate, tp, rep, P, D, I, up, hc = sys.argv[1:]; P, D, I = int(P), int(D), int(I)
pp = [r for r in rows if r.get("n_prompt", 0) > 0][0]; tg = [r for r in rows if r.get("n_gen", 0) > 0][0]
runs = [x / 1e6 for x in pp.get("samples_ns", [pp["avg_ns"]])]
tokens = (1 + I) * P + 1 + I * D  # prompt warm-up + I prompts; 1 warm-up token + I * D decode tokens
bpt = (tx - int(up)) / tokens if up else None
print(json.dumps({"model": model, "who": "llama.cpp -sm " + sm, "overlap": None, "rate": rate, "tp": int(tp),
  "rep": int(rep), "prompt": P, "decode": D, "iters": I, "ttft_ms": st.median(runs), "ttft_runs_ms": runs,
  "decode_tok_s": st.median(tg.get("samples_ts", [tg["avg_ts"]])), "tx_bytes": tx, "upload_bytes": int(up) if up else None,
  "tokens": tokens, "bytes_per_token": bpt, "host_cores": None if hc == "_" else float(hc),
  "load": open("/proc/loadavg").read().split()[0]}))' \
          "$model" "$sm" "$rate" "$tp" "$rep" "$prompt" "$decode" "$iters" "$up" "$hc" <<<"$res" >>"$out" &&
          tail -1 "$out" >&2 || echo "  no result parsed" >&2
      done
     done
    done
  done
done
summarize "$out" "$plot"
