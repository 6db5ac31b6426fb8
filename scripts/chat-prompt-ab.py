#!/usr/bin/env python3
# scripts/chat-prompt-ab.py ECHO_SERVE MODEL OUT.json — what a chat request becomes, for an
# A/B of two builds (issue 46: one chat-context builder, tools parsed once, the template
# compiled once must change no prompt): starts ECHO_SERVE on MODEL (cpu, 1 thread), sends
# 27 chat bodies to /tokenize (plain, system/developer, reasoning both names, tools with
# every tool_choice, tool calls and results, content parts, chat_template_kwargs, unicode,
# and 8 invalid ones) and the first 17 to /v1/chat/completions (max_tokens 1), and writes
# every status and body (prompt ids; the chat's prompt_tokens and error). Run it with both
# binaries on the same model and `cmp` the two files. Models worth running: one with its
# own template, one without (the built-in Qwen3 template: a copy of a folder minus
# tokenizer_config.json's chat_template), one whose template has no tools (Hermes rewrite).
import json, os, re, subprocess, sys, tempfile, time, urllib.error, urllib.request
if len(sys.argv) != 4:
    sys.exit("usage: chat-prompt-ab.py ECHO_SERVE MODEL OUT.json")
binary, model, out = sys.argv[1:4]
log = tempfile.NamedTemporaryFile(delete=False, suffix=".log")
p = subprocess.Popen([binary, "--model", model, "--port", "0", "--device", "cpu", "--threads", "1", "--max-model-len", "2048",
                      "--log-level", "info"], stdout=subprocess.DEVNULL, stderr=log)
port = None
for _ in range(2400):
    t = open(log.name, errors="replace").read()
    m = re.search(r"listening on http://[^:]+:(\d+)", t)
    if m: port = int(m.group(1)); break
    if p.poll() is not None: print(t); sys.exit(1)
    time.sleep(0.05)
url = f"http://127.0.0.1:{port}"
for _ in range(2400):
    try:
        if urllib.request.urlopen(url + "/health", timeout=2).status == 200: break
    except Exception: time.sleep(0.05)
def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=60); return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
T = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
     {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}}}}]
U = {"role": "user", "content": "Hello there, how are you?"}
calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
         {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":2.5}"}}]
P = [
 {"messages": [U]},
 {"messages": [{"role": "system", "content": "Be terse."}, U]},
 {"messages": [{"role": "developer", "content": "Be terse."}, U]},
 {"messages": [U, {"role": "assistant", "content": "Fine.", "reasoning_content": "think a"}, {"role": "user", "content": "More?"}]},
 {"messages": [U, {"role": "assistant", "content": "<think>\nold\n</think>\n\nFine."}, {"role": "user", "content": "More?"}]},
 {"messages": [U, {"role": "assistant", "content": "Fine.", "reasoning": "think b"}]},
 {"messages": [U], "tools": T},
 {"messages": [{"role": "system", "content": "Sys."}, U], "tools": T, "tool_choice": "auto"},
 {"messages": [U], "tools": T, "tool_choice": "none"},
 {"messages": [U], "tools": T, "tool_choice": {"type": "function", "function": {"name": "add"}}},
 {"messages": [U, {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "22C"},
               {"role": "tool", "tool_call_id": "call_2", "content": "3.5"}], "tools": T},
 {"messages": [U, {"role": "assistant", "content": "Let me check.", "tool_calls": calls[:1]},
               {"role": "tool", "tool_call_id": "call_1", "content": "22C"}, {"role": "user", "content": "thanks"}]},
 {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "part two"}]}]},
 {"messages": [U], "chat_template_kwargs": {"enable_thinking": False}},
 {"messages": [U], "chat_template_kwargs": {"enable_thinking": True, "other": 3}},
 {"messages": [U], "add_generation_prompt": False},
 {"messages": [{"role": "user", "content": "héllo — 日本語 \u2028 emoji 🎉", "name": "bob", "extra": {"x": [1, 2]}}]},
 {"messages": [{"role": "user", "content": None}]},
 {"messages": [U, {"role": "assistant", "content": None, "tool_calls": []}]},
 {"messages": [{"role": "wizard", "content": "x"}]},
 {"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]},
 {"messages": [U], "tools": [{"type": "function"}]},
 {"messages": [U], "tools": T, "tool_choice": "required"},
 {"messages": [U], "chat_template_kwargs": 5},
 {"messages": [U], "chat_template_kwargs": {"enable_thinking": "no"}},
 {"messages": [U, {"role": "assistant", "content": "x", "reasoning_content": "a", "reasoning": "b"}]},
 {"messages": []},
]
res = []
for b in P:
    res.append(["tokenize", post("/tokenize", b)])
for b in P[:17]:
    c = dict(b, max_tokens=1, temperature=0)
    st, body = post("/v1/chat/completions", c)
    try:
        j = json.loads(body); body = [j.get("usage", {}).get("prompt_tokens"), j.get("error")]
    except Exception: pass
    res.append(["chat", st, body])
json.dump(res, open(out, "w"), indent=0, ensure_ascii=False)
p.terminate(); p.wait()
os.unlink(log.name)
print(out, len(res))
