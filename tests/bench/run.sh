#!/usr/bin/env bash
# echo-bench serve / plot and scripts/ttft-ab.sh against a real echo-serve on
# the demo model (cpu backend, loopback); echo-bench randmodel / forward on a
# tiny random-weight model. JSON checks are tests/bench/check.py and
# check_forward.py (python3 stdlib only).
#   usage: tests/bench/run.sh ECHO_BENCH ECHO_SERVE MODEL_DIR
# Prints "N passed, M failed" as its last line; exit status 0 only when M = 0.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bench=${1:?usage: $0 ECHO_BENCH ECHO_SERVE MODEL_DIR}
serve=${2:?usage: $0 ECHO_BENCH ECHO_SERVE MODEL_DIR}
model=${3:?usage: $0 ECHO_BENCH ECHO_SERVE MODEL_DIR}
for tool in curl python3 gnuplot; do
  command -v "$tool" >/dev/null || { echo "test-bench: '$tool' is required (make deps)"; echo "0 passed, 1 failed"; exit 1; }
done
tmp=$(mktemp -d /tmp/echo-test-bench.XXXXXX)
pass=0 fail=0 srv_pid=""
check() { # name, then a command: passes when it exits 0
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$tmp/check.out" 2>&1; then
    pass=$((pass + 1)); echo "ok   $name ($((SECONDS - t0)) s)"
  else
    fail=$((fail + 1)); echo "FAIL $name"; sed 's/^/     /' "$tmp/check.out" | tail -25
  fi
}
start_server() { # extra echo-serve flags -> srv_pid, url
  "$serve" --model "$model" --device cpu --threads 1 --port 0 --log-level info "$@" >"$tmp/serve.log" 2>&1 &
  srv_pid=$!
  local port="" i
  for i in $(seq 600); do
    port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$tmp/serve.log" | head -1)
    [ -n "$port" ] && break
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "test-bench: echo-serve did not start:"; cat "$tmp/serve.log"; return 1; }
  url="http://127.0.0.1:$port"
}
stop_server() {
  [ -n "$srv_pid" ] && { kill -TERM "$srv_pid" 2>/dev/null; wait "$srv_pid" 2>/dev/null; }
  srv_pid=""
}
trap 'stop_server; rm -rf "$tmp"' EXIT
chk() { python3 "$here/check.py" "$@"; }
bench_serve() { "$bench" serve --no-progress "$@"; }

# ---- the load generator against a served demo model
if start_server --max-num-seqs 4; then
  check "serve: 20 completions requests -> 20 records, summary printed" \
    bash -c "$(printf '%q ' "$bench") serve --no-progress --base-url $url --num-prompts 20 --request-rate 40 \
      --input-len 48 --range-ratio 0.5 --output-len 8 --ignore-eos --seed 3 --save-result $tmp/a.json --label a \
      >$tmp/a.txt && grep -q 'Serving Benchmark Result' $tmp/a.txt && grep -q '^Mean TTFT (ms):' $tmp/a.txt \
      && python3 $here/check.py records $tmp/a.json 20 && python3 $here/check.py all-ok $tmp/a.json max \
      && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[\"requests\"]; assert len({x[\"max_tokens\"] for x in r}) > 1' $tmp/a.json"
  check "serve: percentiles/mean/std equal a sorted-array recomputation from the saved JSON" chk percentiles "$tmp/a.json"
  check "serve: same seed -> same prompt lengths" bash -c \
    "$(printf '%q ' "$bench") serve --no-progress --base-url $url --num-prompts 20 --input-len 48 --range-ratio 0.5 \
      --output-len 2 --seed 3 --num-warmups 0 --save-result $tmp/a2.json >/dev/null && python3 -c '
import json, sys
a, b = (json.load(open(f))[\"requests\"] for f in sys.argv[1:])
assert [r[\"input_len\"] for r in a] == [r[\"input_len\"] for r in b], \"input lengths differ\"
assert len(set(r[\"input_len\"] for r in a)) > 1, \"range-ratio did not vary lengths\"
assert all(r[\"prompt_tokens\"] == r[\"input_len\"] for r in a), \"prompt_tokens != input_len\"
' $tmp/a.json $tmp/a2.json"
  check "serve: chat endpoint (role-only first chunk is not the first token)" bash -c \
    "$(printf '%q ' "$bench") serve --no-progress --base-url $url --endpoint /v1/chat/completions --num-prompts 4 \
      --input-len 16 --output-len 6 --ignore-eos --max-concurrency 2 --save-result $tmp/c.json >/dev/null \
      && python3 $here/check.py records $tmp/c.json 4 && python3 $here/check.py all-ok $tmp/c.json 6 \
      && python3 $here/check.py percentiles $tmp/c.json"
  printf '%s\n' '{"prompt": "The capital of France is", "output_len": 3}' '' \
    '{"prompt": [1000, 2000, 3000, 4000], "output_len": 5}' '{"prompt": "Hello"}' >"$tmp/d.jsonl"
  check "serve: jsonl dataset (text, token ids, default output_len), cycled to N" bash -c \
    "$(printf '%q ' "$bench") serve --no-progress --base-url $url --dataset jsonl:$tmp/d.jsonl --num-prompts 5 \
      --output-len 2 --ignore-eos --save-result $tmp/j.json >/dev/null && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))[\"requests\"]
assert [x[\"output_tokens\"] for x in r] == [3, 5, 2, 3, 5], [x[\"output_tokens\"] for x in r]
assert r[1][\"prompt_tokens\"] == 4 and all(x[\"error\"] is None for x in r)
' $tmp/j.json"
  check "serve: multiturn (3 conversations x 3 turns over a 200-word system prompt, chat): a turn starts after its \
conversation's previous one ended, later turns report cached tokens, TTFT per turn" bash -c \
    "$(printf '%q ' "$bench") serve --no-progress --base-url $url --endpoint /v1/chat/completions --dataset multiturn \
      --num-prompts 9 --num-turns 3 --prefix-len 200 --input-len 12 --output-len 4 --ignore-eos \
      --save-result $tmp/m.json >$tmp/m.txt && grep -q '^Turn 3 mean / median' $tmp/m.txt && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
s, r = d[\"summary\"], d[\"requests\"]
assert len(r) == 9 and all(x[\"error\"] is None for x in r), r
assert [x[\"turn\"] for x in r] == [1, 1, 1, 2, 2, 2, 3, 3, 3], [x[\"turn\"] for x in r]
for i in range(3, 9):  # request i is turn t of conversation i % 3: after i - 3 ended
    assert r[i][\"start_ms\"] >= r[i - 3][\"start_ms\"] + r[i - 3][\"e2e_ms\"] - 1, (i, r[i], r[i - 3])
    assert r[i][\"prompt_tokens\"] > r[i - 3][\"prompt_tokens\"] and r[i][\"cached_tokens\"] >= 192, r[i]
assert [t[\"turn\"] for t in s[\"ttft_by_turn\"]] == [1, 2, 3] and s[\"total_cached_tokens\"] == sum(x[\"cached_tokens\"] for x in r)
' $tmp/m.json"
  check "serve: prefix dataset (completions ids): every prompt = the shared 64-token prefix + 8 own" bash -c \
    "$(printf '%q ' "$bench") serve --no-progress --base-url $url --dataset prefix --num-prompts 6 --prefix-len 64 \
      --input-len 8 --output-len 2 --max-concurrency 1 --save-result $tmp/p.json >/dev/null && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))[\"requests\"]
assert all(x[\"prompt_tokens\"] == 72 for x in r), [x[\"prompt_tokens\"] for x in r]
assert r[0][\"cached_tokens\"] == 0 and all(x[\"cached_tokens\"] == 64 for x in r[1:]), [x[\"cached_tokens\"] for x in r]
' $tmp/p.json"
  stop_server
fi

if start_server --max-num-seqs 1 --max-queue 1; then
  check "serve: refused requests (max-num-seqs 1, max-queue 1, rate inf, concurrency 8) are counted as errors" bash -c \
    "$(printf '%q ' "$bench") serve --no-progress --base-url $url --num-prompts 16 --request-rate inf \
      --max-concurrency 8 --input-len 32 --output-len 24 --ignore-eos --save-result $tmp/r.json >$tmp/r.txt; \
      grep -Eq '^Failed requests: +[1-9]' $tmp/r.txt && python3 $here/check.py records $tmp/r.json 16 \
      && python3 $here/check.py refused $tmp/r.json"
  stop_server
fi

# ---- the SSE parser against a server that splits events anywhere (tests/bench/fake_sse.py)
python3 "$here/fake_sse.py" >"$tmp/fake.port" 2>"$tmp/fake.err" &
fake_pid=$!
for _ in $(seq 100); do [ -s "$tmp/fake.port" ] && break; sleep 0.05; done
fake_url="http://127.0.0.1:$(cat "$tmp/fake.port")"
for ep in /v1/completions /v1/chat/completions; do
  check "serve: SSE split every 3 bytes, CRLF, comments, role-only/empty first chunk ($ep)" bash -c \
    "$(printf '%q ' "$bench") serve --no-progress --base-url $fake_url --endpoint $ep --num-prompts 3 \
      --max-concurrency 3 --output-len 5 --save-result $tmp/f.json >/dev/null && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))[\"requests\"]
assert all(x[\"error\"] is None for x in r), r
assert all(x[\"prompt_tokens\"] == 7 and x[\"output_tokens\"] == 5 for x in r), r
assert all(len(x[\"itl_ms\"]) == 4 and x[\"ttft_ms\"] > 0 for x in r), r
' $tmp/f.json"
done
kill "$fake_pid" 2>/dev/null; wait "$fake_pid" 2>/dev/null

# ---- bad input: nothing listening, malformed flags
free_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
check "serve: unreachable server -> exit 1, every request recorded as an error, no hang" bash -c \
  "timeout 30 $(printf '%q ' "$bench") serve --no-progress --base-url http://127.0.0.1:$free_port --num-prompts 7 \
    --connect-timeout 2 --save-result $tmp/u.json >/dev/null 2>$tmp/u.err; test \$? -eq 1 \
    && grep -q 'all 7 requests failed' $tmp/u.err && python3 $here/check.py records $tmp/u.json 7 \
    && python3 $here/check.py all-failed $tmp/u.json"
usage_case() { # expected message fragment, then echo-bench arguments
  local want=$1; shift
  "$bench" "$@" >/dev/null 2>"$tmp/usage.err"
  local rc=$?
  [ $rc -eq 2 ] || { echo "exit $rc, expected 2: $*"; cat "$tmp/usage.err"; return 1; }
  grep -q -- "$want" "$tmp/usage.err" || { echo "no '$want' in:"; cat "$tmp/usage.err"; return 1; }
}
check "serve: malformed flags -> exit 2 with a clear message" bash -c "
  $(declare -f usage_case); tmp=$tmp; bench=$(printf '%q' "$bench")
  usage_case \"--num-prompts: expected\" serve --num-prompts abc &&
  usage_case \"--request-rate: expected\" serve --request-rate -3 &&
  usage_case \"--endpoint: expected\" serve --endpoint /v1/embeddings &&
  usage_case \"--dataset: expected\" serve --dataset sharegpt &&
  usage_case \"--num-turns: expected\" serve --num-turns 0 &&
  usage_case \"--prefix-len: expected\" serve --prefix-len x &&
  usage_case \"unknown option '--bogus'\" serve --bogus &&
  usage_case \"needs a value\" serve --seed &&
  usage_case \"unexpected argument\" serve stray &&
  usage_case \"-o FILE.png is required\" plot $tmp/a.json &&
  usage_case \"--metric: expected\" plot --metric foo -o $tmp/x.png $tmp/a.json"
check "echo-bench: --help lists the subcommand table (exit 0); bad commands and flags exit 2 clearly" bash -c "
  $(declare -f usage_case); tmp=$tmp; bench=$(printf '%q' "$bench")
  \$bench --help >$tmp/help.out 2>&1 || exit 1
  for c in allreduce chain codec serve plot randmodel forward; do
    grep -q \"^  \$c  *[a-zA-Z]\" $tmp/help.out || { echo \"--help does not list \$c\"; cat $tmp/help.out; exit 1; }
  done
  usage_case \"unknown command 'bogus'\" bogus &&
  usage_case \"usage: echo-bench <command>\" &&
  usage_case \"forward: option '--tp' needs a value\" forward --tp &&
  usage_case \"plot: unknown option '--frob'\" plot --frob &&
  usage_case \"randmodel: option '--out' needs a value\" randmodel --out &&
  usage_case \"usage: echo-bench chain\" chain --codec nope &&
  usage_case \"usage: echo-bench codec\" codec --dist outlier &&
  usage_case \"usage: echo-bench allreduce\" allreduce --group &&
  usage_case \"unknown transport 'bogus'\" allreduce --transport bogus"

check "echo-serve --help lists every transport, preset and device from the tables" bash -c "
  $(printf '%q' "$serve") --help >$tmp/shelp.out 2>&1 || exit 1
  grep -q '^  --transport  *auto, local, nccl, mpi\$' $tmp/shelp.out || { echo 'no transport list'; tail -6 $tmp/shelp.out; exit 1; }
  grep -q '^  --allreduce .*exact.*echo-nofb.*echo.*bf16.*int4' $tmp/shelp.out || { echo 'no preset list'; exit 1; }
  grep -q '^  --device  *auto, cpu' $tmp/shelp.out || { echo 'no device list'; exit 1; }"

# ---- plots
png_ok() { python3 -c '
import sys, os
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
assert len(d) > 5000, f"only {len(d)} bytes"
' "$1"; }
check "plot: TTFT CDF of serve results -> PNG" bash -c "$(declare -f png_ok); \
  $(printf '%q ' "$bench") plot $tmp/a.json $tmp/r.json -o $tmp/cdf.png && png_ok $tmp/cdf.png"
check "plot: allreduce --json algbw vs size -> PNG" bash -c "$(declare -f png_ok); \
  $(printf '%q ' "$bench") allreduce --ranks 2 --algo exact,int4,echo --min-bytes 1K --max-bytes 64K --iters 3 --json \
    >$tmp/ar.json && $(printf '%q ' "$bench") plot $tmp/ar.json -o $tmp/ar.png && png_ok $tmp/ar.png"
check "plot: mixing serve and allreduce results -> exit 2" bash -c \
  "$(printf '%q ' "$bench") plot $tmp/a.json $tmp/ar.json -o $tmp/mix.png 2>&1 | grep -q 'cannot mix'; \
   test \${PIPESTATUS[0]} -eq 2"

# ---- the A/B script, smoke size: tp 2, three modes, quiet and busy
check "ttft-ab.sh: exact/echo/int4 x quiet/busy(cpu-membw) at tp 2 on the cpu backend" bash -c \
  "$(printf '%q ' "$root/scripts/ttft-ab.sh") --model $model --tp 2 --device cpu --bench $bench --serve $serve \
    --out $tmp/ab --background cpu-membw --probe-prompts 4 --serve-args '--threads 2' \
    --num-prompts 8 --input-len 32 --output-len 6 --ignore-eos --request-rate 20 --no-progress >$tmp/ab.txt 2>&1 \
  && for l in exact echo int4 exact+busy-cpu-membw echo+busy-cpu-membw int4+busy-cpu-membw; do
       python3 $here/check.py records $tmp/ab/\$l.json 8 && python3 $here/check.py all-ok $tmp/ab/\$l.json 6 \
       && grep -q \"^| \$l | 8/0 |\" $tmp/ab/summary.md || { cat $tmp/ab.txt; exit 1; }; done \
  && grep -Eq '^\\| quiet \\| echo \\| [0-9.]+ \\|' $tmp/ab/summary.md && grep -q '%' $tmp/ab/summary.md \
  && test -s $tmp/ab/ttft-cdf.png"

# ---- echo-bench randmodel / forward: random-weight Qwen3 folders and the engine benchmark (cpu backend)
gen=$(dirname "$bench")/echo-generate
fw_small=(--prefill 16,32 --decode-batch 1,4 --decode-steps 4 --ttft-len 16 --iters 2 --copy-bytes 8M)
check "randmodel: tiny folder passes the safetensors/config checks and loads in the engine" bash -c \
  "$(printf '%q ' "$bench") randmodel --shape tiny --out $tmp/rm/tiny --seed 7 >/dev/null \
  && python3 $here/check_forward.py randmodel $tmp/rm/tiny tiny 2 \
  && if [ -x $(printf '%q' "$gen") ]; then $(printf '%q' "$gen") --model $tmp/rm/tiny --prompt-tokens 1,2,3 \
       --max-tokens 2 --device cpu --threads 1 >/dev/null; \
     else echo 'note: no echo-generate next to echo-bench; loading through echo-bench forward instead'; \
       $(printf '%q ' "$bench") forward --model $tmp/rm/tiny --device cpu --prefill 4 --decode-batch 1 \
       --decode-steps 1 --ttft-len 0 --iters 1 --copy-bytes 8K >/dev/null; fi"
check "randmodel: same seed -> same file, --threads does not change it, another seed differs" bash -c \
  "$(printf '%q ' "$bench") randmodel --out $tmp/rm/same --seed 7 --threads 1 >/dev/null \
  && $(printf '%q ' "$bench") randmodel --out $tmp/rm/other --seed 8 >/dev/null \
  && cmp -s $tmp/rm/tiny/model.safetensors $tmp/rm/same/model.safetensors \
  && ! cmp -s $tmp/rm/tiny/model.safetensors $tmp/rm/other/model.safetensors"
check "randmodel: qwen3-0.6b shape (--layers 1): published config fields, tied head, N(0, 0.02) weights" bash -c \
  "$(printf '%q ' "$bench") randmodel --shape qwen3-0.6b --layers 1 --out $tmp/rm/q06 >/dev/null \
  && python3 $here/check_forward.py randmodel $tmp/rm/q06 qwen3-0.6b 1; rc=\$?; rm -rf $tmp/rm/q06; exit \$rc"
check "randmodel: a non-empty folder is refused without --force (exit 1, files kept), written with it" bash -c \
  "cp $tmp/rm/tiny/model.safetensors $tmp/rm/before; \
   $(printf '%q ' "$bench") randmodel --out $tmp/rm/tiny --seed 9 >/dev/null 2>$tmp/rm/err; test \$? -eq 1 \
  && grep -q 'not empty; pass --force' $tmp/rm/err && cmp -s $tmp/rm/before $tmp/rm/tiny/model.safetensors \
  && $(printf '%q ' "$bench") randmodel --out $tmp/rm/tiny --seed 9 --force >/dev/null \
  && ! cmp -s $tmp/rm/before $tmp/rm/tiny/model.safetensors && test ! -e $tmp/rm/tiny/model.safetensors.tmp"
check "forward: tiny model on cpu -> JSON, every rate positive and consistent, logits finite; table prints" bash -c \
  "$(printf '%q ' "$bench") forward --model $tmp/rm/tiny --device cpu ${fw_small[*]} --threads 1 --json >$tmp/fw.json \
  && python3 $here/check_forward.py forward $tmp/fw.json \
  && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); \
assert [r[\"tokens\"] for r in d[\"prefill\"]] == [16, 32] and [r[\"batch\"] for r in d[\"decode\"]] == [1, 4]; \
assert d[\"ttft\"][\"tokens\"] == 16 and d[\"device\"] == \"cpu\"' $tmp/fw.json \
  && $(printf '%q ' "$bench") forward --model $tmp/rm/tiny --device auto ${fw_small[*]} --threads 1 >$tmp/fw.txt \
  && grep -q '^# prefill' $tmp/fw.txt && grep -q '% roof' $tmp/fw.txt && grep -q '^# ttft' $tmp/fw.txt"
check "forward: tp 2 on the cpu backend" bash -c \
  "$(printf '%q ' "$bench") forward --model $tmp/rm/tiny --device cpu --tp 2 ${fw_small[*]} --threads 2 --json \
    >$tmp/fw2.json && python3 $here/check_forward.py forward $tmp/fw2.json"
check "forward: a random model generated in memory (random:tiny, no files), with the matmul peak beside prefill" bash -c \
  "$(printf '%q ' "$bench") forward --model random:tiny,layers=3 --device cpu ${fw_small[*]} --threads 1 --gemm-dim 256 \
    --json >$tmp/fwr.json && python3 $here/check_forward.py forward $tmp/fwr.json \
  && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); \
assert d[\"config\"][\"num_layers\"] == 3 and d[\"config\"][\"hidden_size\"] == 64, d[\"config\"]; \
assert d[\"gemm_dim\"] == 256 and d[\"gemm_peak_tflops\"] > 0; \
assert all(abs(r[\"gemm_peak_pct\"] - 100 * r[\"tflops\"] / d[\"gemm_peak_tflops\"]) < 1e-3 for r in d[\"prefill\"])' $tmp/fwr.json \
  && $(printf '%q ' "$bench") forward --model random:tiny --device cpu ${fw_small[*]} --threads 1 --gemm-dim 0 --json \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); assert \"gemm_peak_tflops\" not in d'"
check "randmodel/forward: malformed flags -> exit 2 with a clear message; runtime errors -> exit 1" bash -c "
  $(declare -f usage_case); tmp=$tmp; bench=$(printf '%q' "$bench")
  usage_case \"--out DIR is required\" randmodel &&
  usage_case \"--shape: expected\" randmodel --out $tmp/rm/x --shape qwen3-70b &&
  usage_case \"--layers: expected\" randmodel --out $tmp/rm/x --layers 0 &&
  usage_case \"--dtype: only bf16\" randmodel --out $tmp/rm/x --dtype f32 &&
  usage_case \"unknown option '--bogus'\" randmodel --bogus &&
  usage_case \"--model DIR is required\" forward &&
  usage_case \"--prefill: expected\" forward --model $tmp/rm/tiny --prefill 16,0 &&
  usage_case \"--decode-batch: expected\" forward --model $tmp/rm/tiny --decode-batch 1,,x &&
  usage_case \"--device: expected\" forward --model $tmp/rm/tiny --device tpu &&
  usage_case \"--copy-bytes: expected\" forward --model $tmp/rm/tiny --copy-bytes 1X &&
  usage_case \"needs a value\" forward --model &&
  usage_case \"unexpected argument\" forward --model $tmp/rm/tiny stray &&
  usage_case \"--gemm-dim: expected\" forward --model $tmp/rm/tiny --gemm-dim -3 &&
  { \$bench forward --model random:nope --device cpu >/dev/null 2>$tmp/rm/e2; test \$? -eq 1; } &&
  grep -q 'unknown shape' $tmp/rm/e2 &&
  test ! -e $tmp/rm/x &&
  { \$bench forward --model $tmp/rm/tiny --prefill 5000 --device cpu >/dev/null 2>$tmp/rm/e1; test \$? -eq 1; } &&
  grep -q 'max_position_embeddings' $tmp/rm/e1 &&
  { \$bench forward --model $tmp/rm/none --device cpu >/dev/null 2>/dev/null; test \$? -eq 1; }"

# The codec rows: every rate and ratio present, positive and finite, the ratios the rates'
# (so traf/cpy is the encode traffic's rate over memcpy's, as docs/echo.md §8c reads it),
# and the table's columns, at 1 and 2 threads
check "codec: --json rows carry encode, decode, memcpy and encode-traffic rates and their ratios" bash -c "
  for t in 1 2; do
    $bench codec --codec hout2 --group 128 --count 65536 --iters 2 --threads \$t --json >$tmp/codec\$t.json || exit 1
    python3 - $tmp/codec\$t.json \$t <<'PY' || exit 1
import json, math, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 1, rows
r = rows[0]
assert r['codec'] == 'hout2' and r['group'] == 128 and r['threads'] == int(sys.argv[2]), r
for k in ('encode_gbps', 'decode_acc_gbps', 'memcpy_gbps', 'traffic_gbps', 'encode_vs_memcpy', 'decode_acc_vs_memcpy', 'traffic_vs_memcpy'):
    assert isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] > 0, (k, r)
for rate, ratio in (('encode_gbps', 'encode_vs_memcpy'), ('decode_acc_gbps', 'decode_acc_vs_memcpy'), ('traffic_gbps', 'traffic_vs_memcpy')):
    assert abs(r[rate] / r['memcpy_gbps'] - r[ratio]) <= 0.01 * r[ratio] + 2e-3, (rate, ratio, r)
PY
  done
  $bench codec --codec int4 --group 64 --count 65536 --iters 1 >$tmp/codec.txt &&
  grep -q 'traf/cpy' $tmp/codec.txt && grep -Eq '^ +64 +4\.2500( +[0-9.]+){8}$' $tmp/codec.txt"

# 64 threads' stacks (8 MiB each) do not fit in 200 MB more address space than one thread
# needs (found in 100 MB steps; a CUDA build maps far more just to load): some fail to
# start, and the benchmarks must then say so and exit 1 instead of hanging on barriers
# sized for all of them
check "codec / allreduce / chain: threads that cannot start -> exit 1 naming them, no hang" bash -c "
  base=''
  for v in \$(seq 200000 100000 16000000); do
    if (ulimit -s 8192 && ulimit -v \$v && $bench codec --codec int4 --group 128 --count 65536 --iters 1 \
        --threads 1 >/dev/null 2>&1); then base=\$v; break; fi
  done
  test -n \"\$base\" && ulimit -s 8192 && ulimit -v \$((base + 200000)) &&
  { timeout 60 $bench codec --codec int4 --group 128 --count 65536 --iters 1 --threads 64 >/dev/null 2>$tmp/th1; test \$? -eq 1; } &&
  grep -q 'could not start 64 threads' $tmp/th1 &&
  { timeout 60 $bench allreduce --ranks 64 --algo exact --min-bytes 1K --max-bytes 1K --iters 1 >/dev/null 2>$tmp/th2; test \$? -eq 1; } &&
  grep -q 'could not start 64 rank threads' $tmp/th2 &&
  { timeout 60 $bench chain --ranks 64 --depth 2 --count 1024 >/dev/null 2>$tmp/th3; test \$? -eq 1; } &&
  grep -q 'could not start 64 rank threads' $tmp/th3"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
