#!/usr/bin/env bash
# tests/mpi/engine.sh MPI BIN DEMO_MODEL — make test-mpi, ranks as processes:
#   1. echo-generate under mpirun -np 2, 3 and 4 with the exact all-reduce
#      gives HF transformers' 32 greedy tokens (the fixtures' reference.json)
#      on Qwen3, Llama and GGUF fixtures;
#   2. int4 and echo under mpirun -np 2 give the same bits (tokens and
#      logprobs) as two ranks as threads (the mpi transport equals local),
#      two-shot (--oneshot off) and echo one-shot (--oneshot 8192 both);
#      exact under mpirun -np 3 and 4 with the default one-shot (auto: on
#      for processes) gives the bits of ranks as threads (auto: off);
#   3. a rank count that differs from --tp is refused, on every rank, with
#      one message;
#   4. echo-serve under mpirun -np 2 answers completions, chat and a guided_regex one, and stops
#      on SIGTERM with no process left;
#      With --allreduce exact, a prompt served from the prefix cache gives the
#      logprobs of the same prompt computed whole, bit for bit;
#   5. a rank killed mid-request ends the job within seconds (no hang), with
#      mpirun naming the rank, and rank 0's /health answers 503 naming the
#      dead rank until then;
#   6. scripts/ttft-ab.sh --link: echo-serve under mpirun in the shaped lab,
#      exact vs echo, and no namespace left (root only);
#   7. one answer per path under mpirun -np 3 (tests/paths.sh): echo-eval,
#      echo-serve's prompt logprobs and echo-generate give the same logits
#      bits on SmolLM2 ($ECHO_SMOLLM2_GGUF) for every preset;
#   8. speculative decoding under mpirun -np 3 (tests/server/test_spec.py):
#      greedy answers with --speculative ngram equal those without.
#   9. --allreduce auto: the same choice on every rank under mpirun -np 3,
#      the chosen preset's bits; as threads exact, exact's bits.
# Every mpirun is bounded by `timeout`.
set -u
have=$1 bin=$2 demo=$3
if [ "$have" != 1 ]; then
    echo "test-mpi engine: skipped: this build has no Open MPI (MPI=0; make deps installs it)"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0 checks=0
ok() { checks=$((checks + 1)); }
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
srv_pid=
cleanup() {
    [ -n "$srv_pid" ] && kill -9 "$srv_pid" 2>/dev/null
    pkill -9 -f "$tmp/marker" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
M=tests/fixtures/models
run() { timeout 300 mpirun --oversubscribe "$@"; }

# 1. greedy tokens against HF, per fixture and process count
for spec in gqa4-deep:2 gqa4-deep:4 llama-tp3:3 llama-gqa:2 llama3-rope:2 gguf-llama/model.gguf:2 qwen2-bias:2; do
    model=${spec%:*} np=${spec##*:} dir=$M/${model%/model.gguf}
    prompt=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][1]["prompt"])))' "$dir/reference.json")
    if run -np "$np" "$bin/echo-generate" --model "$M/$model" --prompt-tokens "$prompt" --max-tokens 32 \
        --temperature 0 --ignore-eos --json --tp "$np" --allreduce exact --act-quant none --kv-cache-dtype fp32 >"$tmp/gen.json" 2>"$tmp/gen.err" &&
        python3 - "$tmp/gen.json" "$dir/reference.json" <<'PY'; then ok; else bad "$model at -np $np: $(tail -3 "$tmp/gen.err")"; fi
import json, sys
got = json.load(open(sys.argv[1]))["tokens"]
want = json.load(open(sys.argv[2]))["prompts"][1]["greedy"]
assert got == want, (got, want)
PY
done

# 2. quantized modes: processes == threads, bit for bit (echo-a8: also Q8_0 weights times
#    8-bit activations, --act-quant q8_0)
#    (auto's one-shot is on for processes only: both sides name it)
for mode in int4 echo echo-a8 echo:8192; do
    extra=(--oneshot off)
    [ "$mode" = echo-a8 ] && extra=(--oneshot off --quantize q8_0 --act-quant q8_0)
    [ "$mode" = echo:8192 ] && extra=(--oneshot 8192)
    m=${mode%-a8}
    args=(--model "$M/gqa4-deep" --prompt-tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7 --max-tokens 12 --temperature 0
          --ignore-eos --top-logprobs 3 --json --tp 2 --allreduce "${m%:*}" --threads 1 "${extra[@]}")
    "$bin/echo-generate" "${args[@]}" >"$tmp/threads.json" 2>/dev/null
    run -np 2 "$bin/echo-generate" "${args[@]}" >"$tmp/procs.json" 2>"$tmp/procs.err"
    if [ -s "$tmp/threads.json" ] && cmp -s "$tmp/threads.json" "$tmp/procs.json"; then ok
    else bad "$mode: mpirun -np 2 differs from --tp 2 threads: $(tail -2 "$tmp/procs.err")"; fi
    [ "$mode" = echo ] && cp "$tmp/threads.json" "$tmp/echo-twoshot.json"
done
if ! cmp -s "$tmp/echo-twoshot.json" "$tmp/threads.json"; then ok
else bad "echo: --oneshot 8192 had no effect"; fi
# exact, the defaults: one-shot under mpirun, two-shot on threads; the same bits
for spec in llama-tp3:3 gqa4-deep:4; do
    np=${spec##*:}
    args=(--model "$M/${spec%:*}" --prompt-tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7 --max-tokens 12 --temperature 0
          --ignore-eos --top-logprobs 3 --json --tp "$np" --allreduce exact --threads 1)
    "$bin/echo-generate" "${args[@]}" >"$tmp/threads.json" 2>/dev/null
    run -np "$np" "$bin/echo-generate" "${args[@]}" >"$tmp/procs.json" 2>"$tmp/procs.err"
    if [ -s "$tmp/threads.json" ] && cmp -s "$tmp/threads.json" "$tmp/procs.json"; then ok
    else bad "exact: mpirun -np $np (one-shot by default) differs from --tp $np threads: $(tail -2 "$tmp/procs.err")"; fi
done

# 3. a rank count that does not match --tp
run -np 2 "$bin/echo-generate" --model "$M/gqa4-deep" --prompt-tokens 1,2 --max-tokens 1 --tp 4 >/dev/null 2>"$tmp/mis.err"
rc=$?
n=$(grep -c "mpirun started 2 processes" "$tmp/mis.err")
if [ $rc != 0 ] && [ "$n" = 1 ]; then ok; else bad "-np 2 --tp 4: rc $rc, message $n times: $(head -3 "$tmp/mis.err")"; fi

# 4. the server under mpirun -np 2
port=$((20000 + $$ % 20000))
start_server() { # extra echo-serve flags...
    # the marker names this run's processes for cleanup
    timeout 300 mpirun --oversubscribe -np 2 -x ECHO_TEST_MARKER="$tmp/marker" "$bin/echo-serve" --model "$demo" \
        --tp 2 --port "$port" --device cpu --max-model-len 512 --served-model-name demo "$@" >"$tmp/srv.log" 2>&1 &
    srv_pid=$!
    for _ in $(seq 120); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && return 0
        kill -0 "$srv_pid" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}
served() { pgrep -f "echo-serve --model $demo --tp 2 --port $port" >/dev/null; }
if start_server; then
    c=$(curl -s -m 60 "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"demo","prompt":"Hello there","max_tokens":6,"temperature":0}')
    h=$(curl -s -m 60 "localhost:$port/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"model":"demo","messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"temperature":0}')
    # constrained decoding: the mask is applied where rank 0 samples
    x=$(curl -s -m 60 "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"demo","prompt":"Hello","max_tokens":12,"temperature":1,"seed":3,"guided_regex":"[0-9]{3}-[a-z]{2}"}')
    if python3 -c 'import json,re,sys
c, h, x = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert c["usage"]["completion_tokens"] == 6 and c["choices"][0]["finish_reason"] == "length", c
assert h["choices"][0]["message"]["role"] == "assistant" and h["usage"]["completion_tokens"] >= 1, h
assert re.fullmatch("[0-9]{3}-[a-z]{2}", x["choices"][0]["text"]), x' "$c" "$h" "$x"; then ok
    else bad "server under mpirun: completions $c / chat $h / guided_regex $x"; fi
    kill -TERM "$srv_pid"
    for _ in $(seq 40); do served || break; sleep 0.5; done
    if ! served; then ok; else bad "server under mpirun: processes left 20 s after SIGTERM"; fi
    wait "$srv_pid" 2>/dev/null
    srv_pid=
else
    bad "server under mpirun -np 2 did not become healthy: $(tail -5 "$tmp/srv.log")"
fi

# 4b. prefix caching with the ranks as processes: with --allreduce exact a prompt served from the
#     cache (rank 0 maps the blocks, rank 1 follows its block table) gives the logprobs of the
#     same prompt computed whole, bit for bit; then a strict prefix and a longer prompt
stop_server() {
    kill -TERM "$srv_pid"
    for _ in $(seq 40); do served || break; sleep 0.5; done
    wait "$srv_pid" 2>/dev/null
    srv_pid=
}
if start_server --allreduce exact; then
    P=$(python3 -c 'import random; r = random.Random(4); print(",".join(str(r.randrange(1000, 20000)) for _ in range(90)))')
    q() { curl -s -m 60 "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":[$1],\"max_tokens\":6,\"temperature\":0,\"logprobs\":3,\"ignore_eos\":true}"; }
    a=$(q "$P") b=$(q "$P") c=$(q "$(echo "$P" | cut -d, -f1-40)") d=$(q "$P,7,8,9,10,11,12,13,14,15,16,17,18")
    if python3 -c 'import json,sys
a, b, c, d = (json.loads(x) for x in sys.argv[1:])
k = [x["usage"]["prompt_tokens_details"]["cached_tokens"] for x in (a, b, c, d)]
assert k == [0, 80, 32, 80], k
assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"], "cache hit differs from the whole prompt"' "$a" "$b" "$c" "$d"
    then ok; else bad "prefix cache under mpirun -np 2 (exact): $a / $b / $c / $d"; fi
    stop_server
else
    bad "server under mpirun -np 2 --allreduce exact did not become healthy: $(tail -5 "$tmp/srv.log")"
fi

# 5. rank 1 killed while a request runs (after requests that filled and hit the prefix cache):
#    the job ends, mpirun names the rank (a long context, so the requests in flight
#    cannot finish before the kill however fast the demo model decodes)
if start_server --max-model-len 4096; then
    for _ in 1 2; do
        curl -s -m 60 "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
            -d '{"model":"demo","prompt":"Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello","max_tokens":2}' >/dev/null
    done
    # in flight when the rank dies: a whole answer and a stream (issue 47: both must hear why)
    curl -s -m 120 -w ' %{http_code}' "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"demo","prompt":"Hello","max_tokens":4000,"ignore_eos":true}' >"$tmp/inflight.json" 2>&1 &
    curl -s -N -m 120 "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"demo","prompt":"Hello","max_tokens":4000,"ignore_eos":true,"stream":true}' \
        >"$tmp/inflight.sse" 2>&1 &
    sleep 1
    victim=
    for p in $(pgrep -f "echo-serve --model $demo --tp 2 --port $port"); do
        r=$(tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        [ "$r" = 1 ] && victim=$p
    done
    if [ -n "$victim" ]; then
        kill -9 "$victim"
        t0=$(date +%s)
        # rank 0's /health, polled until the job ends, must say why (503)
        for _ in $(seq 600); do
            echo "$(curl -s -m 1 -w ' %{http_code}' "localhost:$port/health" 2>/dev/null | tr '\n' ' ')" >>"$tmp/health.log"
            kill -0 "$srv_pid" 2>/dev/null || break
            [ $(($(date +%s) - t0)) -lt 30 ] || break
            sleep 0.05
        done
        dt=$(($(date +%s) - t0))
        if ! kill -0 "$srv_pid" 2>/dev/null && ! served && grep -q "rank 1" "$tmp/srv.log"; then ok
        else bad "killed rank 1: job still up after ${dt}s or no message: $(tail -5 "$tmp/srv.log")"; fi
        if grep -q "rank 1 (pid $victim on .*) has exited.* 503 *$" "$tmp/health.log"; then ok
        else bad "killed rank 1: rank 0's /health never said why: $(sort -u "$tmp/health.log" | head -3)"; fi
        sleep 0.5 # the curls write what they got
        if grep -q '"code":503.* 503$' "$tmp/inflight.json" && grep -q "rank 1 (pid $victim" "$tmp/inflight.json"; then ok
        else bad "killed rank 1: the whole answer in flight was not a 503 naming rank 1: $(tail -c 300 "$tmp/inflight.json")"; fi
        if python3 - "$tmp/inflight.sse" "$victim" <<'PY'; then ok; else bad "killed rank 1: the stream in flight did not end with an error naming rank 1 then [DONE]: $(tail -c 300 "$tmp/inflight.sse")"; fi
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert ev and ev[-1] == "[DONE]", ev[-3:]
err = json.loads(ev[-2]).get("error", {})
assert err.get("code") == 503 and f"rank 1 (pid {sys.argv[2]}" in err.get("message", ""), ev[-2]
PY
    else
        bad "killed rank: no rank-1 process found"
    fi
    kill -9 "$srv_pid" 2>/dev/null
    wait "$srv_pid" 2>/dev/null
    srv_pid=
else
    bad "server under mpirun -np 2 (second start) did not become healthy: $(tail -5 "$tmp/srv.log")"
fi

# 6. the server-level TTFT A/B over the shaped lab link (root only): both
#    all-reduces served by echo-serve under mpirun inside the namespace
if [ "$(id -u)" = 0 ] && command -v tc >/dev/null; then
    if timeout 300 scripts/ttft-ab.sh --link 1gbit --model "$demo" --tp 2 --device cpu --modes exact,echo \
        --bench "$bin/echo-bench" --serve "$bin/echo-serve" --out "$tmp/ab" --probe-prompts 0 --no-plot \
        --num-prompts 3 --input-len 32 --output-len 4 --ignore-eos --max-concurrency 1 --no-progress \
        >"$tmp/ab.log" 2>&1 && grep -q "tp 2 (processes).*link 1gbit" "$tmp/ab.log" &&
        grep -q '^| exact | 3/0 |' "$tmp/ab/summary.md" && grep -q '^| echo | 3/0 |' "$tmp/ab/summary.md" &&
        grep -Eq '^\| quiet \| echo \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|' "$tmp/ab/summary.md"; then ok
    else bad "ttft-ab.sh --link 1gbit: $(tail -5 "$tmp/ab.log")"; fi
    if ip netns list | grep -q '^echo-lab-'; then bad "ttft-ab.sh --link left a namespace: $(ip netns list)"; else ok; fi
else
    echo "test-mpi engine: the lab TTFT A/B check is skipped (needs root and tc)"
fi

# 7. one answer per path, ranks as processes
if [ -n "${ECHO_SMOLLM2_GGUF:-}" ]; then
    if tests/paths.sh --np 3 "$bin" "$ECHO_SMOLLM2_GGUF"; then ok; else bad "tests/paths.sh --np 3 (above)"; fi
else
    echo "test-mpi engine: the path check is skipped (ECHO_SMOLLM2_GGUF not set)"
fi

# 8. speculative decoding under mpirun -np 3, exact: the greedy answers of 50 prompts equal
#    those without (docs/speculative.md)
if [ -n "${ECHO_SMOLLM2_GGUF:-}" ]; then
    if timeout 1200 python3 tests/server/test_spec.py --bin "$bin/echo-serve" --model "$ECHO_SMOLLM2_GGUF" --tp 3 \
        --launch "mpirun --oversubscribe -np 3" --sections equal >"$tmp/spec.log" 2>&1; then ok
    else bad "test_spec.py under mpirun -np 3: $(grep -E 'FAIL|differs' "$tmp/spec.log" | head -5)"; fi
else
    echo "test-mpi engine: the speculative check is skipped (ECHO_SMOLLM2_GGUF not set)"
fi

# 9. --allreduce auto (comm/auto.c, the default): under mpirun -np 3 every
#    rank makes the same choice (the engine checks it at start-up: a rank
#    that differs fails the start) and the output equals the chosen preset's
#    forced with the same one-shot, size policy and overlap; as threads (one
#    machine) it picks exact, whose bits equal --allreduce exact's.
args=(--model "$M/llama-tp3" --prompt-tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7 --max-tokens 8 --temperature 0
      --ignore-eos --top-logprobs 3 --json --tp 3 --threads 1)
if run -np 3 "$bin/echo-generate" "${args[@]}" --allreduce auto >"$tmp/auto.json" 2>"$tmp/auto.err" &&
    forced=$(python3 - "$tmp/auto.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["allreduce_auto"]
f = ["--allreduce", a["large_calls"], "--oneshot", str(a["small_bytes"]) if a["small_oneshot"] else "off",
     "--overlap", str(a["overlap"]) if a["overlap"] > 1 else "off"]
if a["small_calls"] == "exact" and a["large_calls"] != "exact":
    f += ["--echo-min-bytes", str(a["small_bytes"] + 1)]
print(" ".join(f))
PY
    ) && run -np 3 "$bin/echo-generate" "${args[@]}" $forced >"$tmp/forced.json" 2>"$tmp/forced.err" &&
    python3 - "$tmp/auto.json" "$tmp/forced.json" <<'PY'; then ok; else bad "auto under -np 3 ($forced): $(tail -3 "$tmp/auto.err" "$tmp/forced.err")"; fi
import json, sys
a, f = (json.load(open(p)) for p in sys.argv[1:])
a.pop("allreduce_auto")
assert a == f, (a, f)
PY
"$bin/echo-generate" "${args[@]}" --allreduce auto >"$tmp/auto-t.json" 2>/dev/null
"$bin/echo-generate" "${args[@]}" --allreduce exact >"$tmp/exact-t.json" 2>/dev/null
if python3 - "$tmp/auto-t.json" "$tmp/exact-t.json" <<'PY'; then ok; else bad "auto as threads is not exact's bits"; fi
import json, sys
a, e = (json.load(open(p)) for p in sys.argv[1:])
au = a.pop("allreduce_auto")
assert au["shared_memory"] and au["large_calls"] == "exact" and au["small_calls"] == "exact", au
assert a == e, (a, e)
PY

echo "test-mpi engine: $checks checks passed, $([ $fail = 0 ] && echo 0 || echo some) failed"
exit $fail
