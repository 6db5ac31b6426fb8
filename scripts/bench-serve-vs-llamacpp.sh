#!/usr/bin/env bash
# echo-serve vs llama-server on the same GGUF file, the same threads, the
# same client (echo-bench serve) and the same prompts: streamed
# /v1/completions of text prompts (about INPUT tokens of held-out English),
# OUTPUT tokens each (ignore_eos), at each concurrency of CONC. Both servers
# run side by side for the whole script (each idle while the other is
# measured); for every concurrency echo and llama.cpp are measured back to
# back, so they see the same machine load. Prints one table (output tok/s,
# TTFT and inter-token latency p50) and writes the raw results under OUT.
# docs/bench-forward.md, "Serving: echo-serve vs llama-server", has the results.
#
#   scripts/bench-serve-vs-llamacpp.sh
#   CONC="1 8" THREADS=2 scripts/bench-serve-vs-llamacpp.sh
#
# Environment (defaults):
#   MODEL     build/models/SmolLM2-135M-Instruct.Q4_1.gguf (make serve's file)
#   LLAMA_BIN build/llamacpp/build/bin   llama-server
#   THREADS   2            threads of each server
#   CONC      "1 4 8 16"   concurrencies (max in-flight requests)
#   INPUT     256          prompt tokens, about (words x 1.33 of the held-out text)
#   OUTPUT    128          output tokens per request
#   PROMPTS   "C, at least 4"  requests per concurrency (each prompt used once)
#   ECHO_ARGS ""           extra echo-serve flags (e.g. --act-quant none)
#   LLAMA_ARGS ""          extra llama-server flags (e.g. --poll 0: no spinning, for a loaded machine)
#   OUT       build/bench-serve    results (one JSON per server and concurrency)
#   ECHO_BIN  bin          where echo-serve and echo-bench are (another build's, to compare)
#   CONC=1 gives a quick one-client check of ITL (about 2 minutes on 2 vCPUs).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${MODEL:-$ROOT/build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
LLAMA_BIN=${LLAMA_BIN:-$ROOT/build/llamacpp/build/bin}
THREADS=${THREADS:-2}
CONC=${CONC:-"1 4 8 16"}
INPUT=${INPUT:-256}
OUTPUT=${OUTPUT:-128}
ECHO_ARGS=${ECHO_ARGS:-}
LLAMA_ARGS=${LLAMA_ARGS:-}
OUT=${OUT:-$ROOT/build/bench-serve}
BIN=${ECHO_BIN:-$ROOT/bin}
EPORT=${EPORT:-18431}
LPORT=${LPORT:-18432}

[ -f "$MODEL" ] || { echo "bench-serve-vs-llamacpp: no $MODEL (scripts/fetch-model.sh)" >&2; exit 1; }
[ -x "$LLAMA_BIN/llama-server" ] || { echo "bench-serve-vs-llamacpp: no $LLAMA_BIN/llama-server" >&2; exit 1; }
mkdir -p "$OUT"
maxc=$(printf '%s\n' $CONC | sort -n | tail -1)

# ---- prompts: held-out text (the Python tutorial, as scripts/accuracy.sh) or the README ----
src=/usr/share/doc/python3.11/html/_sources/tutorial
if [ -d "$src" ]; then
    python3 "$ROOT/scripts/rst2text.py" "$src"/*.rst.txt >"$OUT/text.txt"
else
    cat "$ROOT"/README.md "$ROOT"/docs/*.md >"$OUT/text.txt"
fi
# Each concurrency gets prompts of its own (consecutive chunks of the text, a
# warm-up one apart), so neither server's prompt cache sees a prompt twice.
python3 - "$OUT/text.txt" "$INPUT" "$OUTPUT" "$OUT" $CONC <<'EOF'
import json, sys
words = open(sys.argv[1]).read().split()
n, m, out = int(int(sys.argv[2]) / 1.33), int(sys.argv[3]), sys.argv[4]
chunks = [" ".join(words[i:i + n]) for i in range(0, len(words) - n, n)]
k = 0
for c in sys.argv[5:]:
    need = max(4, int(c)) + 1
    if k + need > len(chunks):
        k = 0  # the text is too short: reuse from the start (the caches may then hit)
    with open(f"{out}/prompts-c{c}.jsonl", "w") as f:
        for p in chunks[k:k + need]:
            f.write(json.dumps({"prompt": p, "output_len": m}) + "\n")
    k += need
EOF

# ---- the servers ----
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$BIN/echo-serve" --model "$MODEL" --device cpu --threads "$THREADS" --port "$EPORT" --max-num-seqs "$maxc" \
    --max-model-len 2048 --served-model-name m $ECHO_ARGS >"$OUT/echo-serve.log" 2>&1 &
pids+=($!)
"$LLAMA_BIN/llama-server" -m "$MODEL" -t "$THREADS" -tb "$THREADS" --port "$LPORT" -np "$maxc" \
    -c $((maxc * 2048)) --alias m $LLAMA_ARGS >"$OUT/llama-server.log" 2>&1 &
pids+=($!)
for port in $EPORT $LPORT; do
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.5
    done
    curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "server on $port did not start" >&2; tail "$OUT"/*.log >&2; exit 1; }
done
grep -m1 "plan:" "$OUT/echo-serve.log" || true

# ---- the runs: per concurrency, echo then llama.cpp ----
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cpus; $THREADS threads each;" \
    "$(basename "$MODEL"); prompts ~$INPUT tokens, $OUTPUT output tokens"
for c in $CONC; do
    n=$((c > 4 ? c : 4))
    for s in echo llama; do
        port=$EPORT
        [ $s = echo ] || port=$LPORT
        echo "# concurrency $c, $s: load $(cut -d' ' -f1 /proc/loadavg)" >&2
        "$BIN/echo-bench" serve --base-url "http://127.0.0.1:$port" --model m --dataset "jsonl:$OUT/prompts-c$c.jsonl" \
            --num-prompts "$n" --max-concurrency "$c" --output-len "$OUTPUT" --ignore-eos --num-warmups 1 \
            --no-progress --label "$s-c$c" --save-result "$OUT/$s-c$c.json" >"$OUT/$s-c$c.txt"
    done
done

python3 - "$OUT" $CONC <<'EOF'
import json, sys
out, conc = sys.argv[1], sys.argv[2:]
print(f"{'clients':>7} | {'echo out tok/s':>14} {'llama out tok/s':>15} {'ratio':>6} | {'echo ITL p50':>12} "
      f"{'llama ITL p50':>13} | {'echo TTFT p50':>13} {'llama TTFT p50':>14} | failed e/l")
for c in conc:
    e = json.load(open(f"{out}/echo-c{c}.json"))["summary"]
    l = json.load(open(f"{out}/llama-c{c}.json"))["summary"]
    print(f"{c:>7} | {e['output_throughput']:14.1f} {l['output_throughput']:15.1f} "
          f"{e['output_throughput'] / l['output_throughput']:6.2f} | {e['median_itl_ms']:10.1f}ms "
          f"{l['median_itl_ms']:11.1f}ms | {e['median_ttft_ms']:11.0f}ms {l['median_ttft_ms']:12.0f}ms | "
          f"{e['failed']}/{l['failed']}")
EOF
