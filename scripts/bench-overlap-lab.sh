#!/usr/bin/env bash
# Prefill overlap in the per-host lab: TTFT with --overlap off vs on
# (engine/overlap.h), side by side, for each all-reduce. Ranks as processes
# under mpirun, one per host of scripts/hostlab.sh (a namespace and a shaped
# link each); `echo-bench forward` times one prompt (median of --iters
# after a warm-up). For each tp one lab; inside it the runs alternate
# (mode, off), (mode, on), so both see the same machine.
#
#   scripts/bench-overlap-lab.sh [--out DIR] [--model M] [--bin DIR] [--tps "2 4"]
#                                [--rate 1gbit] [--host-cores C] [--len 512] [--iters 3]
#                                [--modes "exact bf16 echo"] [--on 2] [--extra "ARGS"]
#     --model M   default random:qwen3-0.6b (Qwen3-0.6B's shape, all 28 layers)
#     --on N      the overlapped runs' --overlap (default 2)
#     --host-cores C  hosts standing for C-core machines on --rate
#                 (scripts/hostlab.sh --host-cores: each link shaped to
#                 rate x cores per lab host / C)
# Needs root (network namespaces) and Open MPI. Writes DIR/overlap.jsonl (one
# echo-bench forward JSON per run, with "overlap_flag") and DIR/overlap.md
# (the table); docs/network.md quotes it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/overlap-lab model="random:qwen3-0.6b" bin=bin tps="2 4" rate=1gbit len=512 iters=3
modes="exact bf16 echo" on=2 extra= hca=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --model) model=$2; shift ;;
    --bin) bin=$2; shift ;;
    --tps) tps=$2; shift ;;
    --rate) rate=$2; shift ;;
    --host-cores) hca=(--host-cores "$2"); shift ;;
    --len) len=$2; shift ;;
    --iters) iters=$2; shift ;;
    --modes) modes=$2; shift ;;
    --on) on=$2; shift ;;
    --extra) extra=$2; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "bench-overlap-lab: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "bench-overlap-lab: needs root (network namespaces)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "bench-overlap-lab: needs Open MPI (make deps)" >&2; exit 1; }
[ -x "$bin/echo-bench" ] || { echo "bench-overlap-lab: $bin/echo-bench not built (make)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
: >"$out/overlap.jsonl"
for tp in $tps; do
  # one lab per tp; the loop runs in host 0
  # shellcheck disable=SC2016 # expanded inside the lab
  timeout 3600 scripts/hostlab.sh --hosts "$tp" --rate "$rate" "${hca[@]}" -- bash -c '
    set -euo pipefail
    tp=$1 model=$2 bin=$3 len=$4 iters=$5 modes=$6 on=$7 extra=$8 jsonl=$9
    for mode in $modes; do
      for ov in off "$on"; do
        echo "bench-overlap-lab: tp $tp, $mode, --overlap $ov" >&2
        # shellcheck disable=SC2086 # --extra is a list of flags
        mpirun --oversubscribe -np "$tp" "$bin/echo-bench" forward --model "$model" --tp "$tp" --allreduce "$mode" \
          --overlap "$ov" $extra --prefill 16 --decode-batch 1 --decode-steps 2 --ttft-len "$len" --iters "$iters" \
          --gemm-dim 0 --copy-bytes 16M --json |
          python3 -c "import json,sys; j=json.load(sys.stdin); j[\"overlap_flag\"]=sys.argv[1]; print(json.dumps(j))" "$ov" \
          >>"$jsonl"
      done
    done' _ "$tp" "$model" "$bin" "$len" "$iters" "$modes" "$on" "$extra" "$out/overlap.jsonl"
done
python3 - "$out/overlap.jsonl" "$model" "$rate" "$len" >"$out/overlap.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"TTFT of a {sys.argv[4]}-token prompt, {sys.argv[2]}, one rank per host at {sys.argv[3]} "
      "(scripts/hostlab.sh), prefill overlap off vs on (median of the runs)\n")
print("| tp | all-reduce | TTFT overlap off | TTFT overlap on (micro-batches) | off / on |")
print("|---|---|---|---|---|")
seen = []
for r in rows:
    k = (r["tp"], r["allreduce"])
    if k not in seen:
        seen.append(k)
for k in seen:
    off = [r for r in rows if (r["tp"], r["allreduce"]) == k and r["overlap_flag"] == "off"]
    on = [r for r in rows if (r["tp"], r["allreduce"]) == k and r["overlap_flag"] != "off"]
    if not off or not on:
        continue
    a, b = off[0]["ttft"]["ms"], on[0]["ttft"]["ms"]
    print(f"| {k[0]} | {k[1]} | {a:.0f} ms | {b:.0f} ms ({on[0].get('overlap', '?')}) | {a / b:.2f}x |")
PY
cat "$out/overlap.md"
