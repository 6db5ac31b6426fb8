#!/usr/bin/env bash
# Prefix caching A/B: the same model and workload served with the prefix
# cache (the default), then with --no-prefix-caching; prints each run's
# TTFT per turn and the ratio. See docs/ttft.md ("Prefix caching").
#
#   scripts/prefix-ab.sh --model M [--serve-args "ARGS"] [--out DIR] [--off-first] [workload flags]
#
# Everything after the known options goes to `echo-bench serve` unchanged
# (default workload: one 4-turn chat with a 2,000-token system prompt).
# Each run starts its own echo-serve on a free port and stops it after;
# --off-first runs --no-prefix-caching first (on a shared machine, run both
# orders: a load that drifts during the A/B favours whichever ran first).
# Saves on.json, off.json, the server logs and /metrics after each run.
# Exit status: 0 ok, 1 a run failed, 2 usage.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model="" serve_args="" out="" off_first=0 bench=$root/bin/echo-bench serve=$root/bin/echo-serve
while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --serve-args) serve_args=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --off-first) off_first=1; shift ;;
    --bench) bench=$2; shift 2 ;;
    --serve) serve=$2; shift 2 ;;
    *) break ;;
    esac
done
[ -n "$model" ] || { echo "usage: scripts/prefix-ab.sh --model M [--serve-args ARGS] [--out DIR] [bench flags]" >&2; exit 2; }
workload=("$@")
[ ${#workload[@]} -gt 0 ] || workload=(--endpoint /v1/chat/completions --dataset multiturn --num-prompts 4
    --num-turns 4 --prefix-len 2000 --input-len 50 --output-len 32 --ignore-eos --max-concurrency 1)
out=${out:-prefix-ab-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null' EXIT

run() { # label, extra serve flags...
    local label=$1 port
    shift
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # shellcheck disable=SC2086
    "$serve" --model "$model" --port "$port" $serve_args "$@" >"$out/$label.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/health")" = 200 ] && break
        kill -0 "$pid" 2>/dev/null || { echo "echo-serve ($label) exited: $(tail -3 "$out/$label.log")" >&2; return 1; }
        sleep 0.5
    done
    "$bench" serve --no-progress --base-url "http://127.0.0.1:$port" --label "$label" \
        --save-result "$out/$label.json" "${workload[@]}" >"$out/$label.txt" 2>&1 || { cat "$out/$label.txt" >&2; return 1; }
    curl -s "127.0.0.1:$port/metrics" >"$out/$label.prom"
    kill "$pid"
    wait "$pid" 2>/dev/null
    pid=
}
if [ $off_first = 1 ]; then
    run off --no-prefix-caching || exit 1
    run on || exit 1
else
    run on || exit 1
    run off --no-prefix-caching || exit 1
fi
python3 - "$out/on.json" "$out/off.json" <<'PY'
import json, sys
on, off = (json.load(open(p))["summary"] for p in sys.argv[1:])
rows = on["ttft_by_turn"] or [{"turn": 1, "mean_ttft_ms": on["mean_ttft_ms"], "cached_tokens": on["total_cached_tokens"]}]
offt = off["ttft_by_turn"] or [{"turn": 1, "mean_ttft_ms": off["mean_ttft_ms"]}]
print("| turn | TTFT with cache (ms) | cached tokens | TTFT --no-prefix-caching (ms) | ratio |")
print("|---|---|---|---|---|")
for a, b in zip(rows, offt):
    print("| %d | %.1f | %d | %.1f | %.1fx |" % (a["turn"], a["mean_ttft_ms"], a["cached_tokens"] or 0,
                                               b["mean_ttft_ms"], b["mean_ttft_ms"] / a["mean_ttft_ms"]))
PY
