#!/usr/bin/env bash
# echo under mpirun vs llama.cpp's RPC backend across "hosts" of the per-host
# lab (scripts/hostlab.sh): the same GGUF file, N hosts, one rank (echo) or
# one ggml-rpc-server -t 1 (llama.cpp; the client, llama-bench, in host 0
# with its own CPU device) per host, each host's link shaped to RATE.
# Per cell: prompt TTFT (ms), batch-1 decode tok/s, and the bytes all hosts
# sent during the run (tx of every host's lab0, prefill and decode together).
#
#   scripts/bench-vs-llamacpp-rpc.sh --model GGUF --tp N [--rates "1gbit 10gbit none"]
#       [--prompt 512] [--decode 32] [--reps 1] [--echo-modes "exact bf16 echo"]
#       [--sm "layer tensor"] [--echo-args "ARGS"] [--out FILE]
#
# echo: echo-bench forward --prefill P --ttft-len P --decode-batch 1
# --decode-steps D --iters 1, 1 thread per rank. llama.cpp: llama-bench -p P
# -n D -r 1 -t 1 --rpc host1,... -sm MODE (layer: pipeline, tensor: its tensor
# parallelism), from $LLAMACPP_BIN (default build/llamacpp/build/bin). Cells
# run one after the other per repetition, so all see the same machine load.
# Results: one JSON line per run in FILE (default build/vs-llamacpp-rpc.jsonl)
# and a table on stdout. Needs root, Open MPI and the llama.cpp build.
set -euo pipefail
cd "$(dirname "$0")/.."
model= tp=2 rates="1gbit 10gbit none" prompt=512 decode=32 reps=1 emodes="exact bf16 echo" sms="layer tensor"
eargs= out=build/vs-llamacpp-rpc.jsonl
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift ;;
    --tp) tp=$2; shift ;;
    --rates) rates=$2; shift ;;
    --prompt) prompt=$2; shift ;;
    --decode) decode=$2; shift ;;
    --reps) reps=$2; shift ;;
    --echo-modes) emodes=$2; shift ;;
    --sm) sms=$2; shift ;;
    --echo-args) eargs=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-vs-llamacpp-rpc: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
lbin=${LLAMACPP_BIN:-build/llamacpp/build/bin}
[ -f "$model" ] || { echo "bench-vs-llamacpp-rpc: --model: no GGUF file '$model'" >&2; exit 2; }
[[ "$tp" =~ ^[2-9]$ ]] || { echo "bench-vs-llamacpp-rpc: --tp: 2..9" >&2; exit 2; }
for b in "$lbin/llama-bench" "$lbin/ggml-rpc-server" bin/echo-bench; do
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
for rep in $(seq "$reps"); do
  for rate in $rates; do
    for m in $emodes; do
      echo "bench-vs-llamacpp-rpc: rep $rep, $rate, echo $m" >&2
      # shellcheck disable=SC2086 # --echo-args is a list of flags
      res=$(flock /work/cpu.lock timeout 900 scripts/hostlab.sh --hosts "$tp" --rate "$rate" -- build/.rpc-cell.sh echo \
        mpirun -np "$tp" bin/echo-bench forward --model "$model" --tp "$tp" --allreduce "$m" $eargs --prefill "$prompt" \
        --ttft-len "$prompt" --decode-batch 1 --decode-steps "$decode" --iters 1 --gemm-dim 0 --copy-bytes 1M \
        --threads 1 --json 2>/dev/null) || { echo "  failed" >&2; continue; }
      python3 -c 'import json, sys
txt = sys.stdin.read(); tx = int(txt.rsplit("TX ", 1)[1]); j = json.loads(txt.rsplit("TX ", 1)[0])
d = [x for x in j["decode"] if x["batch"] == 1][0]
print(json.dumps({"who": "echo " + sys.argv[1], "rate": sys.argv[2], "tp": int(sys.argv[3]), "rep": int(sys.argv[4]),
  "ttft_ms": j["ttft"]["ms"], "decode_tok_s": d["tokens_per_s"], "tx_bytes": tx, "load": open("/proc/loadavg").read().split()[0]}))' \
        "$m" "$rate" "$tp" "$rep" <<<"$res" >>"$out"
      tail -1 "$out" >&2
    done
    for sm in $sms; do
      echo "bench-vs-llamacpp-rpc: rep $rep, $rate, llama.cpp -sm $sm" >&2
      res=$(flock /work/cpu.lock timeout 900 env LBIN="$lbin" scripts/hostlab.sh --hosts "$tp" --rate "$rate" -- \
        build/.rpc-cell.sh llama "$lbin/llama-bench" -m "$model" -rpc "$rpcs" -sm "$sm" -p "$prompt" -n "$decode" \
        -r 1 -t 1 -o json 2>/dev/null) || { echo "  failed" >&2; continue; }
      python3 -c 'import json, sys
txt = sys.stdin.read(); tx = int(txt.rsplit("TX ", 1)[1]); rows = json.loads(txt.rsplit("TX ", 1)[0])
pp = [r for r in rows if r.get("n_prompt", 0) > 0][0]; tg = [r for r in rows if r.get("n_gen", 0) > 0][0]
print(json.dumps({"who": "llama.cpp -sm " + sys.argv[1], "rate": sys.argv[2], "tp": int(sys.argv[3]), "rep": int(sys.argv[4]),
  "ttft_ms": pp["avg_ns"] / 1e6, "decode_tok_s": tg["avg_ts"], "tx_bytes": tx, "load": open("/proc/loadavg").read().split()[0]}))' \
        "$sm" "$rate" "$tp" "$rep" <<<"$res" >>"$out"
      tail -1 "$out" >&2
    done
  done
done
python3 - "$out" "$model" "$tp" "$prompt" "$decode" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r["tp"] == int(sys.argv[3])]
print(f"\n{sys.argv[2]}, tp {sys.argv[3]}, {sys.argv[4]}-token prompt, {sys.argv[5]} decode steps (median of runs)\n")
print("| link | who | runs | TTFT ms | decode tok/s | MB sent by all hosts per run |")
print("|---|---|---|---|---|---|")
seen = []
for r in rows:
    k = (r["rate"], r["who"])
    if k not in seen: seen.append(k)
for k in seen:
    g = [r for r in rows if (r["rate"], r["who"]) == k]
    print(f"| {k[0]} | {k[1]} | {len(g)} | {st.median(r['ttft_ms'] for r in g):.0f} | "
          f"{st.median(r['decode_tok_s'] for r in g):.1f} | {st.median(r['tx_bytes'] for r in g) / 1e6:.1f} |")
PY
