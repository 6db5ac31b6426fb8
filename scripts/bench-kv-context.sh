#!/bin/bash
# Batch-1 decode tokens/s at a long context, per KV cache type, echo beside
# llama.cpp on the same GGUF file: interleaved rounds (every type of both
# programs in turn), each run under `flock build/cpu.lock`, one JSON line per run
# (with the load average before and after) and the medians at the end.
# docs/kv-cache.md, "Decode speed against context length", quotes it.
#
# usage: scripts/bench-kv-context.sh [--ctx N] [--rounds R] [--threads T]
#          [--echo-types "fp32 bf16 q8_0"] [--llama-types "f16 q8_0"]
#          [--model FILE.gguf] [--out FILE.jsonl]
# Needs bin/echo-bench (make all) and llama-bench (build/llamacpp, built by
# scripts/bench-vs-llamacpp.sh). A 16k run prefills 16,384 tokens first: 3 to
# 4 minutes per echo run on 2 cores, 4 (f16) to 14 (q8_0) for llama.cpp's.
set -euo pipefail
cd "$(dirname "$0")/.."
ctx=16384 rounds=3 threads=2 etypes="fp32 bf16 q8_0" ltypes="f16 q8_0"
model=build/models/SmolLM2-135M-Instruct.Q4_1.gguf out=build/bench-kv-context.jsonl
llama=build/llamacpp/build/bin/llama-bench
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --ctx) ctx=$2; shift 2;; --rounds) rounds=$2; shift 2;; --threads) threads=$2; shift 2;;
    --echo-types) etypes=$2; shift 2;; --llama-types) ltypes=$2; shift 2;;
    --model) model=$2; shift 2;; --out) out=$2; shift 2;;
    -h|--help) usage 0;;
    *) echo "bench-kv-context: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
case "$ctx$rounds$threads" in *[!0-9]*) echo "bench-kv-context: --ctx, --rounds and --threads take integers" >&2; exit 2;; esac
[ -f "$model" ] || { echo "bench-kv-context: no model $model" >&2; exit 2; }
[ -x bin/echo-bench ] || { echo "bench-kv-context: bin/echo-bench missing: make all" >&2; exit 2; }
if [ -n "$ltypes" ] && [ ! -x "$llama" ]; then echo "bench-kv-context: $llama missing (or pass --llama-types '')" >&2; exit 2; fi
mkdir -p build "$(dirname "$out")"
# SmolLM2's config stops at 8,192 positions: a longer context gets yarn (the
# positions exist, up to 32k; decode speed does not depend on the factor).
rope=(); [ "$ctx" -gt 8000 ] && rope=(--rope-scaling yarn:4)
run() { # program type command...
  local prog=$1 t=$2; shift 2
  local l0 l1 t0 s o tps rc=0
  l0=$(cut -d' ' -f1-3 /proc/loadavg) t0=$(date +%s) s=$(date -u +%H:%M:%S)
  o=$(flock build/cpu.lock timeout 1800 "$@" 2>"$out.err") || rc=$?
  l1=$(cut -d' ' -f1-3 /proc/loadavg)
  if [ "$prog" = echo ]; then
    tps=$(printf '%s' "$o" | python3 -c 'import sys,json; print([x for x in json.load(sys.stdin)["decode"] if x["batch"]==1][0]["tokens_per_s"])' 2>/dev/null || echo null)
  else
    tps=$(printf '%s' "$o" | python3 -c 'import sys,json; print([x for x in json.load(sys.stdin) if x["n_gen"]>0][0]["avg_ts"])' 2>/dev/null || echo null)
  fi
  printf '{"ctx":%d,"prog":"%s","kv":"%s","start":"%s","wall_s":%d,"rc":%d,"load_before":"%s","load_after":"%s","tokens_per_s":%s}\n' \
    "$ctx" "$prog" "$t" "$s" $(( $(date +%s) - t0 )) "$rc" "$l0" "$l1" "$tps" | tee -a "$out"
}
echo "bench-kv-context: $rounds round(s) at $ctx tokens of context, $threads threads, $model -> $out" >&2
for r in $(seq "$rounds"); do
  echo "round $r of $rounds" >&2
  for t in $etypes; do
    run echo "$t" bin/echo-bench forward --model "$model" --threads "$threads" --prefill 16 --iters 1 \
      --decode-batch 1 --decode-prompt "$ctx" --decode-steps 16 --ttft-len 0 --gemm-dim 0 \
      --act-quant none --kv-cache-dtype "$t" "${rope[@]}" --json
  done
  for t in $ltypes; do
    run llama "$t" "$llama" -m "$model" -t "$threads" -p 0 -n 16 -d "$ctx" -ctk "$t" -ctv "$t" \
      -fa on -r 1 --repack 0 -o json
  done
done
python3 - "$out" "$ctx" <<'PY'
import collections, json, statistics, sys
g = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["ctx"] == int(sys.argv[2]) and r["tokens_per_s"] is not None:
        g[(r["prog"], r["kv"])].append(r["tokens_per_s"])
for (p, t), v in sorted(g.items()):
    print(f"{p:6} {t:5} median {statistics.median(v):7.2f} tok/s over {len(v)} run(s): " + " ".join(f"{x:.2f}" for x in v))
PY
