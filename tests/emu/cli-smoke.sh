#!/usr/bin/env bash
# The command-line programs on the emulated GPU (tests/emu): the paths that
# only run on a device — echo-generate --device cuda at tp 1 and 2 over both
# device transports, CUDA graphs, echo-bench forward's cuda measurements —
# run end to end here, so the first lent GPU does not meet them for the
# first time. Asserted (each a contract, true on a real GPU too):
#   - graphs: --cuda-graphs gives the same JSON (tokens and logprobs) as
#     eager steps (graph replays are bit-identical to eager steps);
#   - transports: at tp 2 with --allreduce echo (and int4), nccl and local
#     give the same JSON (both transports give the host path's bits);
#   - graphs at tp 2 over nccl (all-reduces captured): the same JSON as
#     eager, and no "has no effect" note;
#   - every run exits 0 and prints the tokens asked for;
#   - echo-bench forward --device cuda --cuda-graphs exits 0, reports a
#     matmul peak, prefill, decode (through graphs) and TTFT;
#   - echo-bench allreduce --transport nccl gives a row per algo with the
#     wire's bits per value and errors of the right size;
#   - echo-serve at tp 2 over nccl when a rank fails: that request fails,
#     the next completes; when re-creating the communicators fails too,
#     /health answers 503 with the reason and completions 503.
# Reported, not asserted: greedy agreement of cuda with the cpu (bf16 may
# flip a near-tie).
#
#   tests/emu/cli-smoke.sh EMU_BIN_DIR      (run from the repository root)
set -uo pipefail
BIN="${1:?usage: cli-smoke.sh EMU_BIN_DIR}"
MODEL=tests/fixtures/models/tied
PROMPT=3,14,15,92,65,35
TMP="$(mktemp -d /tmp/echo-emu-cli.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
fail=0
pass=0

gen() { # name args...
  local name="$1"
  shift
  "$BIN/echo-generate" --model "$MODEL" --prompt-tokens "$PROMPT" --max-tokens 8 --ignore-eos \
    --top-logprobs 2 --json "$@" >"$TMP/$name.json" 2>"$TMP/$name.err"
  local rc=$?
  if [ $rc != 0 ]; then
    echo "FAIL $name: exit $rc ($(tail -n 2 "$TMP/$name.err" | tr '\n' ' '))"
    rm -f "$TMP/$name.json" # a failed run has nothing to compare
    fail=1
    return 1
  fi
  local n
  n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["tokens"]))' "$TMP/$name.json")
  if [ "$n" != 8 ]; then
    echo "FAIL $name: $n tokens, expected 8"
    fail=1
    return 1
  fi
  return 0
}

same() { # what a b
  if [ ! -s "$TMP/$2.json" ] || [ ! -s "$TMP/$3.json" ]; then
    echo "FAIL $1: $2 or $3 did not run"
    fail=1
  elif cmp -s "$TMP/$2.json" "$TMP/$3.json"; then
    echo "PASS $1"
    pass=$((pass + 1))
  else
    echo "FAIL $1: $2 and $3 differ"
    diff <(python3 -m json.tool "$TMP/$2.json") <(python3 -m json.tool "$TMP/$3.json") | head -8
    fail=1
  fi
}

gen cpu --device cpu
gen cuda --device cuda
gen cuda-graphs --device cuda --cuda-graphs
same "echo-generate cuda tp 1: --cuda-graphs == eager (tokens and logprobs)" cuda cuda-graphs
for mode in echo int4; do
  gen "nccl-$mode" --device cuda --tp 2 --transport nccl --allreduce "$mode"
  gen "local-$mode" --device cuda --tp 2 --transport local --allreduce "$mode"
  same "echo-generate cuda tp 2 $mode: nccl == local (tokens and logprobs)" "nccl-$mode" "local-$mode"
done
# tp 2 over nccl with graphs: the all-reduces are captured with the step
gen nccl-echo-graphs --device cuda --tp 2 --transport nccl --allreduce echo --cuda-graphs
same "echo-generate cuda tp 2 echo nccl: --cuda-graphs == eager (tokens and logprobs)" nccl-echo nccl-echo-graphs
if grep -q "no effect" "$TMP/nccl-echo-graphs.err"; then
  echo "FAIL echo-generate tp 2 nccl --cuda-graphs says it has no effect: $(grep 'no effect' "$TMP/nccl-echo-graphs.err")"
  fail=1
fi
if [ -s "$TMP/cpu.json" ] && [ -s "$TMP/cuda.json" ]; then
  python3 - "$TMP/cpu.json" "$TMP/cuda.json" <<'EOF'
import json, sys
a, b = (json.load(open(p))["tokens"] for p in sys.argv[1:3])
k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
print(f"INFO echo-generate greedy, cuda vs cpu: {k} of {len(a)} tokens agree before the first difference")
EOF
fi

# echo-bench forward on the emulated device: every cuda-only measurement
# runs (tiny sizes: the emulator is slow; the numbers mean nothing).
if "$BIN/echo-bench" forward --model random:tiny --device cuda --cuda-graphs --prefill 16 --decode-batch 1,2 \
  --decode-steps 2 --decode-prompt 4 --ttft-len 16 --iters 1 --copy-bytes 1M --gemm-dim 64 --json \
  >"$TMP/fwd.json" 2>"$TMP/fwd.err"; then
  if python3 - "$TMP/fwd.json" <<'EOF'; then
import json, sys
r = json.load(open(sys.argv[1]))
assert r.get("cuda_graphs") is True, "cuda_graphs not true: %r" % r.get("cuda_graphs")
assert r.get("gemm_peak_tflops", 0) > 0, "no matmul peak"
assert r.get("prefill") and r.get("decode"), "prefill or decode rows missing"
assert r.get("ttft") or r.get("ttft_s") or r.get("ttft_ms"), "no TTFT"
EOF
    echo "PASS echo-bench forward --device cuda --cuda-graphs (peak, prefill, decode through graphs, TTFT)"
    pass=$((pass + 1))
  else
    echo "FAIL echo-bench forward: unexpected JSON"
    head -c 600 "$TMP/fwd.json"
    echo
    fail=1
  fi
else
  echo "FAIL echo-bench forward --device cuda: exit $? ($(tail -n 3 "$TMP/fwd.err" | tr '\n' ' '))"
  fail=1
fi
# echo-bench allreduce over nccl (rank r on emulated GPU r): every algo
# runs; the wire carries 16 bits per value for exact and the default codec's
# 4 + (scales, outliers)/G, at most 4.5 (the codec table, comm/echo.h), for
# the codec; exact's error is bf16 rounding, the codec's one int4 rounding.
if "$BIN/echo-bench" allreduce --transport nccl --ranks 2 --min-bytes 2K --max-bytes 4K --iters 2 --json \
  >"$TMP/ar.json" 2>"$TMP/ar.err"; then
  if python3 - "$TMP/ar.json" <<'EOF'; then
import json, sys
rows = json.load(open(sys.argv[1]))
assert sorted({r["algo"] for r in rows}) == ["echo", "exact", "int4"], rows
assert len(rows) == 6, rows
for r in rows:
    assert r["transport"] == "nccl" and r["dtype"] == "bf16" and r["time_us"] > 0, r
    if r["algo"] == "exact":
        assert r["wire_bits_per_value"] == 16 and r["rel_err"] < 0.01, r
    else:
        assert 4.0 < r["wire_bits_per_value"] <= 4.5 + 1e-9 and 0.01 < r["rel_err"] < 0.3, r
EOF
    echo "PASS echo-bench allreduce --transport nccl (exact, int4, echo rows; wire bits; errors)"
    pass=$((pass + 1))
  else
    echo "FAIL echo-bench allreduce --transport nccl: unexpected JSON"
    head -c 600 "$TMP/ar.json"
    echo
    fail=1
  fi
else
  echo "FAIL echo-bench allreduce --transport nccl: exit $? ($(tail -n 3 "$TMP/ar.err" | tr '\n' ' '))"
  fail=1
fi
# echo-serve when a rank fails: at tp 2 over nccl with graphs, rank 1's
# third graph launch fails (the emulator's hook, armed from the
# environment). That request fails; the engine re-creates the
# communicators, /health stays 200 and the next request completes. With
# re-creating the communicators made to fail as well, the world can never
# work again: /health answers 503 naming why, and a new completion gets
# 503 at once instead of another failed step.
serve_fault() { # dead: 0 | 1
  local dead=$1 d="$TMP/srv-model" log="$TMP/serve-$1.log" port="" pid url h0="" c1 h1 c2 rc ok=0 what
  mkdir -p "$d"
  for f in "$MODEL/config.json" "$MODEL/generation_config.json" "$MODEL/model.safetensors" \
    tests/fixtures/tokenizer/qwen3/tokenizer.json tests/fixtures/tokenizer/qwen3/tokenizer_config.json; do
    ln -sf "$(realpath "$f")" "$d/"
  done
  ECHO_EMU_FAIL_GRAPH_LAUNCH=1:2 ECHO_EMU_FAIL_COMM_INIT=$([ "$dead" = 1 ] && echo 1 || echo -1) \
    "$BIN/echo-serve" --model "$d" --device cuda --tp 2 --transport nccl --cuda-graphs --port 0 --max-model-len 64 \
    --max-num-seqs 1 --max-num-batched-tokens 64 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 1200); do
    port=$(grep -oE 'listening on http://[^:]+:[0-9]+' "$log" | grep -oE '[0-9]+$' | head -1)
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  url="http://127.0.0.1:$port"
  for _ in $(seq 1 1200); do
    [ -n "$port" ] || break
    h0=$(curl -s -o /dev/null -w '%{http_code}' "$url/health")
    [ "$h0" = 200 ] && break
    sleep 0.1
  done
  local body='{"model":"srv-model","prompt":[3,14,15,92,65,35],"max_tokens":8,"temperature":0,"ignore_eos":true}'
  c1=$(curl -s -o "$TMP/c1.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "$url/v1/completions")
  h1=$(curl -s -o "$TMP/h1.txt" -w '%{http_code}' "$url/health")
  c2=$(curl -s -o "$TMP/c2.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "$url/v1/completions")
  kill -TERM $pid 2>/dev/null
  wait $pid
  rc=$?
  if [ "$dead" = 1 ]; then
    [ "$h0" = 200 ] && [ "${c1:0:1}" = 5 ] && [ "$h1" = 503 ] &&
      grep -q "engine unusable: re-creating the communicators" "$TMP/h1.txt" && [ "$c2" = 503 ] &&
      grep -q "no more steps" "$TMP/c2.json" && [ $rc = 0 ] && ok=1
    what="world dead after a rank's failure: request $c1, /health 503 with the reason, next 503, clean exit"
  else
    [ "$h0" = 200 ] && [ "${c1:0:1}" = 5 ] && [ "$h1" = 200 ] && [ "$c2" = 200 ] && [ $rc = 0 ] && ok=1
    what="a rank's failure: that request $c1, communicators re-created, /health 200, next request 200"
  fi
  if [ $ok = 1 ]; then
    echo "PASS echo-serve tp 2 nccl, $what"
    pass=$((pass + 1))
  else
    echo "FAIL echo-serve (dead world: $dead): health $h0 -> $h1 ($(head -c 200 "$TMP/h1.txt" 2>/dev/null)), completions $c1 then $c2 ($(head -c 200 "$TMP/c2.json" 2>/dev/null)), exit $rc"
    tail -n 5 "$log"
    fail=1
  fi
}
serve_fault 0
serve_fault 1

echo "cli: $pass passed, $([ $fail = 0 ] && echo 0 || echo '>= 1') failed"
exit $fail
