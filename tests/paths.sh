#!/usr/bin/env bash
# tests/paths.sh [--np N] BIN GGUF — one answer per path (issue 30).
#
# The same prompt token ids, at tp 3, through every program that runs a
# prompt through the engine, must give the same logits bits, for every
# preset (exact, int4, echo, echo-nofb, bf16, echo3):
#   - echo-eval --prompts (eng_step_states, each prompt one item) with
#     --logprobs-out: the log-probability of every prompt token, and the
#     top 5 after the last one;
#   - echo-serve, /v1/completions with echo + logprobs + max_tokens 0 (the
#     prompt's logprobs, the three prompts in one request, so their chunks
#     share steps) and with max_tokens 1 (the first token's logprob);
#   - echo-generate --max-tokens 1 (eng_generate): the top 5 after the
#     prompt, sampled with temperature 1 so that the full row comes back (a
#     greedy request takes the candidates path, whose logprob is val - lse
#     of the ranks' fp32 slices: the same logits, another last bit).
# Logprobs are compared as fp32 (what the server prints, 9 digits): equal
# logits give equal values. The prompts are 40, 513 and 530 tokens of
# committed text: the long ones cross C = 512 (engine.h, "Passes"), one by
# a single token. With --np N every program runs under mpirun -np N (ranks
# as processes, the mpi transport), else as threads.
set -u
np=
if [ "${1:-}" = --np ]; then np=$2; shift 2; fi
bin=$1 gguf=$2
presets=${ECHO_PATHS_PRESETS:-exact int4 echo echo-nofb bf16 echo3}
tp=3
if [ ! -f "$gguf" ]; then
    echo "paths: skipped: $gguf not found (make default-model)"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch=(timeout 900)
[ -n "$np" ] && launch=(timeout 900 mpirun --oversubscribe -np "$np")
what="tp $tp, threads"
[ -n "$np" ] && what="tp $tp, mpirun -np $np"
fail=0 checks=0
tmp=$(mktemp -d)
srv_pid=
cleanup() {
    [ -n "$srv_pid" ] && kill -9 "$srv_pid" 2>/dev/null
    pkill -9 -f "$tmp/marker" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
bad() { echo "FAIL ($what): $*"; fail=1; }

# prompts: token ids of committed text (docs/echo.md), 40, 513 and 530 long
python3 - "$tmp" <<'PY' || { echo "paths: cannot cut the text"; exit 1; }
import sys
t = open("docs/echo.md", encoding="utf-8").read()
open(sys.argv[1] + "/text.txt", "w").write(t[:20000])
PY
"$bin/echo-tokenize" --model "$gguf" <"$tmp/text.txt" | tr ' ' '\n' | grep -v '^$' >"$tmp/ids" || exit 1
python3 - "$tmp" <<'PY' || { echo "paths: too few tokens"; exit 1; }
import json, sys
ids = [int(x) for x in open(sys.argv[1] + "/ids")]
ps = [ids[0:40], ids[100:613], ids[700:1230]]
assert all(len(p) == n for p, n in zip(ps, (40, 513, 530))), [len(p) for p in ps]
with open(sys.argv[1] + "/prompts.jsonl", "w") as f:
    for p in ps:
        f.write(json.dumps(p) + "\n")
for i, p in enumerate(ps):
    open(sys.argv[1] + f"/p{i}.ids", "w").write(",".join(map(str, p)))
json.dump(ps, open(sys.argv[1] + "/prompts.json", "w"))
PY

# echo-eval: exact and every other preset, one run
modes=$(echo "$presets" | tr ' ' '\n' | grep -v '^exact$' | paste -sd,)
if ! "${launch[@]}" "$bin/echo-eval" --model "$gguf" --tp $tp --prompts "$tmp/prompts.jsonl" --gen-tokens 1 \
    --modes "$modes" --threads 2 --json --logprobs-out "$tmp/eval.jsonl" >"$tmp/eval.json" 2>"$tmp/eval.err"; then
    bad "echo-eval: $(tail -3 "$tmp/eval.err")"
fi

port=$((21000 + $$ % 20000))
for preset in $presets; do
    # echo-generate: the first token and its logprob, per prompt
    for i in 0 1 2; do
        "${launch[@]}" "$bin/echo-generate" --model "$gguf" --tp $tp --allreduce "$preset" --threads 2 \
            --prompt-tokens "$(cat "$tmp/p$i.ids")" --max-tokens 1 --temperature 1 --seed 7 --ignore-eos --top-logprobs 5 \
            --json >"$tmp/gen-$preset-$i.json" 2>"$tmp/gen.err" || bad "echo-generate $preset prompt $i: $(tail -2 "$tmp/gen.err")"
    done
    # echo-serve: the three prompts in one request, prompt logprobs only, then one token each
    if [ -n "$np" ]; then srv=(timeout 900 mpirun --oversubscribe -np "$np" -x ECHO_TEST_MARKER="$tmp/marker")
    else srv=(); fi
    "${srv[@]+"${srv[@]}"}" "$bin/echo-serve" --model "$gguf" --tp $tp --allreduce "$preset" --threads 2 --port $port \
        --max-model-len 1024 --served-model-name m >"$tmp/srv.log" 2>&1 &
    srv_pid=$!
    up=0
    for _ in $(seq 240); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && { up=1; break; }
        kill -0 "$srv_pid" 2>/dev/null || break
        sleep 0.5
    done
    if [ $up = 1 ]; then
        for mt in 0 1; do
            curl -s -m 600 "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
                -d "{\"model\":\"m\",\"prompt\":$(cat "$tmp/prompts.json"),\"echo\":true,\"logprobs\":1,\"max_tokens\":$mt,\"temperature\":0,\"ignore_eos\":true}" \
                >"$tmp/srv-$preset-$mt.json"
        done
    else
        bad "echo-serve --allreduce $preset did not become healthy: $(tail -3 "$tmp/srv.log")"
    fi
    kill -TERM "$srv_pid" 2>/dev/null
    for _ in $(seq 40); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$srv_pid" 2>/dev/null
    wait "$srv_pid" 2>/dev/null
    srv_pid=
done

out=$(python3 - "$tmp" "$presets" <<'PY'
import json, struct, sys
tmp, presets = sys.argv[1], sys.argv[2].split()
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
fails, checks = [], 0
ev = {}
try:
    for line in open(tmp + "/eval.jsonl"):
        o = json.loads(line)
        ev[(o["mode"], o["prompt"])] = o
except OSError:
    pass
ps = json.load(open(tmp + "/prompts.json"))
for pr in presets:
    try:
        s0 = json.load(open(f"{tmp}/srv-{pr}-0.json"))["choices"]
        s1 = json.load(open(f"{tmp}/srv-{pr}-1.json"))["choices"]
    except Exception as e:
        fails.append(f"{pr}: no server answer ({e})"); continue
    s0 = sorted(s0, key=lambda c: c["index"]); s1 = sorted(s1, key=lambda c: c["index"])
    for i, p in enumerate(ps):
        e = ev.get((pr, i))
        if e is None:
            fails.append(f"{pr} prompt {i}: no echo-eval line"); continue
        srv = [f32(x) for x in s0[i]["logprobs"]["token_logprobs"][1:]]
        ref = [f32(x) for x in e["token_logprobs"]]
        checks += 1
        if srv != ref:
            d = [k for k in range(min(len(srv), len(ref))) if srv[k] != ref[k]]
            fails.append(f"{pr} prompt {i} ({len(p)} tokens): server prompt logprobs differ from echo-eval at "
                         f"{len(d)} of {len(ref)} positions, first {d[:1]}: {srv[d[0]] if d else None} vs "
                         f"{ref[d[0]] if d else None}")
        s1lp = s1[i]["logprobs"]["token_logprobs"]
        checks += 1
        if [f32(x) for x in s1lp[1:len(p)]] != ref:
            fails.append(f"{pr} prompt {i}: server prompt logprobs with max_tokens 1 differ from echo-eval")
        try:
            g = json.load(open(f"{tmp}/gen-{pr}-{i}.json"))["steps"][0]
        except Exception as ex:
            fails.append(f"{pr} prompt {i}: no echo-generate answer ({ex})"); continue
        top = e["last_top"][0]
        checks += 1
        gt = [(t[0], f32(t[1])) for t in g["top_logprobs"]]
        et = [(t[0], f32(t[1])) for t in e["last_top"]]
        if gt != et:
            fails.append(f"{pr} prompt {i}: echo-generate's first top-5 {gt} vs echo-eval's {et}")
        checks += 1
        if f32(s1lp[len(p)]) != f32(top[1]):
            fails.append(f"{pr} prompt {i}: the server's first token lp {f32(s1lp[len(p)])} vs echo-eval's {f32(top[1])}")
print(checks)
for f in fails:
    print(f)
PY
)
checks=$(echo "$out" | head -1)
echo "$out" | tail -n +2 | while read -r l; do [ -n "$l" ] && echo "FAIL ($what): $l"; done
echo "$out" | tail -n +2 | grep -q . && fail=1
echo "paths ($what): $checks comparisons, $([ $fail = 0 ] && echo "all equal" || echo "some differ")"
exit $fail
