#!/usr/bin/env bash
# End-to-end TTFT and inter-token latency over a shaped link: the ranks as
# processes (mpirun), every byte between them through scripts/netlab.sh's
# shaped loopback, `echo-bench forward` measuring time to first token of one
# prompt and batch-1 decode, for each all-reduce mode side by side (modes
# interleaved per configuration, so they see the same machine).
#
#   scripts/bench-ttft-lab.sh [--quick] [--out DIR] [--model M] [--bin DIR]
#     --model M   default random:qwen3-0.6b,layers=8 (Qwen3-0.6B's shape,
#                 8 of its 28 layers: hidden 1024, 16 heads, 8 KV heads)
#     --quick     tp 2, 1 Gbit/s, 512 tokens only (a smoke run, ~1 min)
# Needs root (network namespaces) and Open MPI. Writes DIR/ttft.jsonl (one
# echo-bench forward JSON per run) and DIR/ttft.md (the table); docs/network.md
# quotes it. About 25 minutes on 2 cores for the full sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/ttft-lab model="random:qwen3-0.6b,layers=8" bin=bin quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --model) model=$2; shift ;;
    --bin) bin=$2; shift ;;
    --quick) quick=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
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
modes="exact bf16 echo"
for tp in $tps; do
  for rate in $rates; do
    for len in $lens; do
      for mode in $modes; do
        echo "bench-ttft-lab: tp $tp, link $rate, $len tokens, $mode" >&2
        line=$(timeout 900 scripts/netlab.sh --rate "$rate" -- mpirun --oversubscribe -np "$tp" \
          "$bin/echo-bench" forward --model "$model" --tp "$tp" --allreduce "$mode" --prefill "$len" \
          --ttft-len "$len" --decode-batch 1 --decode-steps 16 --iters "$iters" --gemm-dim 0 \
          --copy-bytes 64M --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))')
        python3 -c 'import json, sys
j = json.loads(sys.argv[3])
j["link"], j["len"] = sys.argv[1], int(sys.argv[2])
print(json.dumps(j))' "$rate" "$len" "$line" >>"$out/ttft.jsonl"
      done
    done
  done
done
python3 - "$out/ttft.jsonl" "$model" > "$out/ttft.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda r: (r["tp"], r["link"], r["len"])
print(f"TTFT and batch-1 inter-token latency, {sys.argv[2]}, ranks as processes over the shaped loopback")
print("(median of the runs; ITL = one batch-1 decode step)\n")
print("| tp | link | prompt | TTFT exact | TTFT bf16 | TTFT echo | echo vs exact | echo vs bf16 | ITL exact | ITL bf16 | ITL echo |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
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
    print(f"| {k[0]} | {k[1]} | {k[2]} | {ttft('exact'):.0f} ms | {ttft('bf16'):.0f} ms | {ttft('echo'):.0f} ms | "
          f"{ttft('exact') / ttft('echo'):.2f}x | {ttft('bf16') / ttft('echo'):.2f}x | {itl('exact'):.1f} ms | "
          f"{itl('bf16'):.1f} ms | {itl('echo'):.1f} ms |")
PY
cat "$out/ttft.md"
