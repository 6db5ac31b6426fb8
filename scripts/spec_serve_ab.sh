#!/usr/bin/env bash
# scripts/spec_serve_ab.sh — serving with and without --speculative ngram, side by side
# (docs/speculative.md): two echo-serve processes on the trained SmolLM2 GGUF (the same flags
# but --speculative), and echo-bench serve against each in turn, per client count and
# workload (scripts/spec_prompts.py: "rep" = code edits + quotes, "prose"), greedy chat.
#   scripts/spec_serve_ab.sh [CLIENTS...]     (default 1 4 16)
# Env: N prompts per kind per run (default 8), OUT output tokens (default 64), FLAGS extra
# echo-serve flags, MODEL. Prints one summary line per run; results in $RESULTS (default
# /tmp/spec-serve-ab).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-$root/build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
n=${N:-8} out=${OUT:-64} res=${RESULTS:-/tmp/spec-serve-ab}
clients=("$@"); [ ${#clients[@]} -gt 0 ] || clients=(1 4 16)
mkdir -p "$res"
python3 "$root/scripts/spec_prompts.py" --kinds code,quote --n "$n" --bench "$out" >"$res/rep.jsonl"
python3 "$root/scripts/spec_prompts.py" --kinds prose --n $((2 * n)) --bench "$out" >"$res/prose.jsonl"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
start() { # name port flags...
    local name=$1 port=$2; shift 2
    "$root/bin/echo-serve" --model "$model" --port "$port" --max-num-seqs 16 ${FLAGS:-} "$@" >"$res/$name.log" 2>&1 &
    pids+=($!)
}
start off 18601
start on 18602 --speculative ngram
for port in 18601 18602; do
    for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
done
printf '%-6s %3s %-4s %10s %10s %10s %10s\n' work C spec "out tok/s" "ITL p50" "ITL mean" "TPOT mean"
for w in rep prose; do
    for c in "${clients[@]}"; do
        for side in off:18601 on:18602; do
            name=${side%:*} port=${side#*:}
            f="$res/$w-c$c-$name.json"
            "$root/bin/echo-bench" serve --base-url "http://127.0.0.1:$port" --endpoint /v1/chat/completions \
                --dataset "jsonl:$res/$w.jsonl" --num-prompts "$(wc -l <"$res/$w.jsonl")" --max-concurrency "$c" \
                --no-progress --save-result "$f" --label "$w-$name" >"$res/$w-c$c-$name.txt" 2>&1 || {
                echo "echo-bench failed: $(tail -3 "$res/$w-c$c-$name.txt")"; exit 1; }
            python3 - "$f" "$w" "$c" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
g = lambda *ks: next((s[k] for k in ks if k in s), float("nan"))
print(f"{sys.argv[2]:6s} {sys.argv[3]:>3s} {sys.argv[4]:4s} {g('output_throughput'):10.1f} "
      f"{g('median_itl_ms'):10.2f} {g('mean_itl_ms'):10.2f} {g('mean_tpot_ms'):10.2f}")
PY
        done
    done
done
