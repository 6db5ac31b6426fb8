#!/usr/bin/env bash
# Server-level TTFT A/B over the shaped link: for each tp, link rate and
# prompt length, scripts/ttft-ab.sh --link serves the same requests through
# echo-serve under mpirun (one process per rank, every byte between ranks
# over scripts/netlab.sh's shaped loopback) once per all-reduce, and this
# script gathers TTFT p50/p90 and ITL into one table (docs/network.md).
#
#   scripts/ttft-ab-lab.sh [--quick] [--out DIR] [--tps "2 4"] [--rates "1gbit"] [--lens "512 2048"]
#                          [--prompts N] [--modes exact,bf16,echo,echo:hadamard-g32] [--bin DIR]
#                          [--lab netlab|hostlab]
#     --lab       netlab (default: one shaped loopback) or hostlab (a namespace
#                 and a shaped link per rank, scripts/hostlab.sh)
#     --quick     tp 2, 1 Gbit/s, 128 tokens, 3 prompts (a smoke run, ~1 min)
#     --prompts   requests per all-reduce and configuration, one at a time (default 8)
# The model is random:qwen3-0.6b with 8 layers (echo-bench randmodel) and the
# Qwen3 tokenizer ($QWEN3_TOKENIZER, default ../shared/qwen3-tokenizer),
# written once to build/models/qwen3-0.6b-l8. Requests: random prompts of the
# given length, 16 output tokens, max concurrency 1 (TTFT is prefill, not
# queueing). Needs root and Open MPI. Writes DIR/<tp>-<rate>-<len>/ (ttft-ab's
# results) and DIR/ttft-serve.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/ttft-ab-lab bin=bin quick=0 tps="2 4" rates="1gbit" lens="512 2048" prompts=8
modes=exact,bf16,echo,echo:hadamard-g32 outlen=16 lab=netlab
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --bin) bin=$2; shift ;;
    --quick) quick=1 ;;
    --tps) tps=$2; shift ;;
    --rates) rates=$2; shift ;;
    --lens) lens=$2; shift ;;
    --prompts) prompts=$2; shift ;;
    --modes) modes=$2; shift ;;
    --lab) lab=$2; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ttft-ab-lab: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[ $quick = 1 ] && { tps=2 rates=1gbit lens=128 prompts=3 outlen=4; }
[[ "$prompts" =~ ^[1-9][0-9]*$ ]] || { echo "ttft-ab-lab: --prompts: expected a positive integer" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "ttft-ab-lab: needs root (network namespaces)" >&2; exit 1; }
for b in echo-bench echo-serve; do
  [ -x "$bin/$b" ] || { echo "ttft-ab-lab: $bin/$b not built (make)" >&2; exit 1; }
done
model=build/models/qwen3-0.6b-l8 tokdir=${QWEN3_TOKENIZER:-../shared/qwen3-tokenizer}
if [ ! -f "$model/tokenizer.json" ]; then
  [ -f "$tokdir/tokenizer.json" ] || { echo "ttft-ab-lab: no Qwen3 tokenizer at $tokdir (set QWEN3_TOKENIZER)" >&2; exit 1; }
  "$bin/echo-bench" randmodel --shape qwen3-0.6b --layers 8 --out "$model" --force >&2
  cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$model/"
fi
mkdir -p "$out"
runs=()
for tp in $tps; do
  for rate in $rates; do
    for len in $lens; do
      d="$out/$tp-$rate-$len"
      echo "ttft-ab-lab: tp $tp, link $rate, $len-token prompts" >&2
      timeout 1800 scripts/ttft-ab.sh --link "$rate" --lab "$lab" --model "$model" --tp "$tp" --device cpu --modes "$modes" \
        --bench "$bin/echo-bench" --serve "$bin/echo-serve" --out "$d" --probe-prompts 0 --no-plot \
        --serve-args "--max-model-len $((len + 64))" --num-prompts "$prompts" --input-len "$len" \
        --output-len "$outlen" --ignore-eos --max-concurrency 1 --request-rate inf --num-warmups 1 --no-progress \
        >"$d.log" 2>&1 || { echo "ttft-ab-lab: $d failed; see $d.log" >&2; tail -5 "$d.log" >&2; exit 1; }
      runs+=("$tp" "$rate" "$len" "$d")
    done
  done
done
python3 - "$modes" "${runs[@]}" > "$out/ttft-serve.md" <<'PY'
import json, sys
modes, runs = sys.argv[1].split(","), sys.argv[2:]
print("echo-serve under mpirun over the shaped loopback: TTFT p50 / p90 and mean inter-token latency (ms),")
print("requests one at a time; ratios are exact's p50 TTFT over each all-reduce's (> 1: faster than exact)\n")
print("| tp | link | prompt | n | " + " | ".join(f"{m} p50 / p90" for m in modes) + " | "
      + " | ".join(f"exact / {m}" for m in modes[1:]) + " | " + " | ".join(f"ITL {m}" for m in modes) + " |")
print("|" + "---|" * (4 + 3 * len(modes) - 1))
for i in range(0, len(runs), 4):
    tp, rate, ln, d = runs[i:i + 4]
    s = {m: json.load(open(f"{d}/{m}.json"))["summary"] for m in modes}
    n = min(s[m]["completed"] for m in modes)
    p50 = {m: s[m]["median_ttft_ms"] for m in modes}
    cells = [f"{p50[m]:.0f} / {s[m]['p90_ttft_ms']:.0f}" for m in modes]
    cells += [f"{p50[modes[0]] / p50[m]:.2f}x" for m in modes[1:]]
    cells += [f"{s[m]['mean_itl_ms']:.1f}" for m in modes]
    print(f"| {tp} | {rate} | {ln} | {n} | " + " | ".join(cells) + " |")
PY
cat "$out/ttft-serve.md"
