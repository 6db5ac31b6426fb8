#!/usr/bin/env bash
# tests/accuracy_quick.sh BIN GGUF [--record] — the quick accuracy check (issue 30):
# SmolLM2-135M at tp 3 on five kinds of text, about 300 tokens each, from
# committed files: prose ("doc"), reference/markup (man pages, "man") and
# source code ("code") from the tokenizer corpus
# (tests/fixtures/tokenizer/qwen3_encode.jsonl), non-English text (its l10n
# strings, one line per language) and chat (the multi-turn conversations of
# tests/fixtures/tokenizer/qwen3_chat.jsonl rendered through SmolLM2's own
# chat template by echo-serve's /tokenize). Each preset (echo, echo-nofb,
# int4, bf16, echo3) runs against exact with echo-eval; the check fails when a
# preset's mean KL to exact on a domain exceeds its bound in
# tests/accuracy_quick.json (measured, then x2 + 0.01: a jump, not noise), or
# its next-token accuracy drops more than the bound's points. 300 tokens
# cannot rank presets (a point of accuracy is ~2 standard errors here);
# scripts/accuracy.sh is the measurement. --record prints the measured
# values as a new bounds file instead of checking.
set -u
bin=$1 gguf=$2 record=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f "$gguf" ]; then
    echo "accuracy-quick: skipped: $gguf not found (make default-model)"
    exit 0
fi
tmp=$(mktemp -d)
srv_pid=
cleanup() {
    [ -n "$srv_pid" ] && kill -9 "$srv_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fx=$here/fixtures/tokenizer

# the texts of four domains
python3 - "$fx/qwen3_encode.jsonl" "$tmp" <<'PY' || exit 1
import json, sys
src, tmp = sys.argv[1], sys.argv[2]
by = {"doc": [], "man": [], "code": [], "l10n": []}
for line in open(src, encoding="utf-8"):
    o = json.loads(line)
    k = "l10n" if o["src"].startswith("l10n:") else o["src"]
    if k in by:
        by[k].append(o["text"])
for k, ts in by.items():
    # the l10n strings of languages other than English
    if k == "l10n":
        ts = [t for t in ts if t.strip()]
    open(f"{tmp}/{k}.txt", "w", encoding="utf-8").write("\n".join(ts))
PY
# chat: SmolLM2's template via /tokenize (tp 1 server, exact)
port=$((23000 + $$ % 20000))
"$bin/echo-serve" --model "$gguf" --port $port --threads 2 --max-model-len 2048 --served-model-name m \
    >"$tmp/srv.log" 2>&1 &
srv_pid=$!
up=0
for _ in $(seq 240); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && { up=1; break; }
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.5
done
if [ $up != 1 ]; then
    echo "FAIL accuracy-quick: echo-serve did not start: $(tail -3 "$tmp/srv.log")"
    exit 1
fi
python3 - "$fx/qwen3_chat.jsonl" "$tmp" "$port" <<'PY' || { echo "FAIL accuracy-quick: chat rendering"; exit 1; }
import json, sys, urllib.request
src, tmp, port = sys.argv[1], sys.argv[2], sys.argv[3]
ids, seen = [], set()
for line in open(src, encoding="utf-8"):
    o = json.loads(line)
    msgs = [m for m in o["messages"] if m.get("role") in ("system", "user", "assistant") and
            isinstance(m.get("content"), str) and m["content"]]
    key = json.dumps(msgs)
    if len(msgs) < 2 or key in seen:
        continue
    seen.add(key)
    req = urllib.request.Request(f"http://localhost:{port}/tokenize", method="POST",
                                 headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "m", "messages": msgs,
                                                  "add_generation_prompt": False}).encode())
    ids += json.load(urllib.request.urlopen(req, timeout=60))["tokens"]
json.dump(ids, open(f"{tmp}/chat.ids", "w"))
assert len(ids) >= 320, len(ids)
PY
kill -TERM "$srv_pid"; wait "$srv_pid" 2>/dev/null; srv_pid=

# prompts: 2 x 160 tokens per domain
for d in doc man code l10n; do
    "$bin/echo-tokenize" --model "$gguf" <"$tmp/$d.txt" | tr ' ' '\n' | grep -v '^$' >"$tmp/$d.ids.txt" || exit 1
done
python3 - "$tmp" <<'PY' || { echo "FAIL accuracy-quick: too little text"; exit 1; }
import json, sys
tmp = sys.argv[1]
for d in ("doc", "man", "code", "l10n", "chat"):
    ids = json.load(open(f"{tmp}/chat.ids")) if d == "chat" else [int(x) for x in open(f"{tmp}/{d}.ids.txt")]
    # from the middle of the text: the first lines of a corpus are often its headers
    mid = max(0, len(ids) // 2 - 160)
    ps = [ids[mid:mid + 160], ids[mid + 160:mid + 320]]
    assert all(len(p) == 160 for p in ps), (d, len(ids))
    with open(f"{tmp}/{d}.jsonl", "w") as f:
        for p in ps:
            f.write(json.dumps(p) + "\n")
PY

fail=0
for d in doc man code l10n chat; do
    if ! "$bin/echo-eval" --model "$gguf" --tp 3 --prompts "$tmp/$d.jsonl" --modes echo,echo3,echo-nofb,int4,bf16 \
        --gen-tokens 1 --threads 2 --json >"$tmp/$d.json" 2>"$tmp/$d.err"; then
        echo "FAIL accuracy-quick: echo-eval on $d: $(tail -3 "$tmp/$d.err")"
        fail=1
    fi
done
[ $fail = 0 ] || exit 1
python3 - "$tmp" "$here/accuracy_quick.json" "$record" <<'PY'
import json, sys
tmp, bounds_path, record = sys.argv[1], sys.argv[2], sys.argv[3] == "--record"
got = {}
for d in ("doc", "man", "code", "l10n", "chat"):
    j = json.load(open(f"{tmp}/{d}.json"))
    for r in j["modes"]:
        got[f"{d}/{r['mode']}"] = {"kl_mean": r["kl_mean"], "delta_pt": r["next_token_acc_delta_pt"],
                                   "tokens": j["tokens_scored"], "allreduce": r["allreduce"]}
if record:
    print(json.dumps({k: {"kl_mean_max": round(2 * v["kl_mean"] + 0.01, 4),
                          "delta_pt_min": round(min(v["delta_pt"], 0) * 2 - 3.0, 2),
                          "measured_kl_mean": round(v["kl_mean"], 4), "measured_delta_pt": round(v["delta_pt"], 2),
                          "allreduce": v["allreduce"]} for k, v in sorted(got.items())}, indent=1))
    sys.exit(0)
bounds = json.load(open(bounds_path))
bad = 0
for k, b in sorted(bounds.items()):
    g = got.get(k)
    if g is None:
        print(f"FAIL accuracy-quick: {k}: not measured"); bad = 1; continue
    ok = g["kl_mean"] <= b["kl_mean_max"] and g["delta_pt"] >= b["delta_pt_min"]
    print(f"  {'ok  ' if ok else 'FAIL'}  {k:16s} KL {g['kl_mean']:.4f} (<= {b['kl_mean_max']}), "
          f"d acc {g['delta_pt']:+.2f} pt (>= {b['delta_pt_min']}), {g['tokens']} tokens")
    bad |= not ok
print(f"accuracy-quick: {len(bounds)} preset x domain checks, {'all within bounds' if not bad else 'some jumped'}")
sys.exit(bad)
PY
