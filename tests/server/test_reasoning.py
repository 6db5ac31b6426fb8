#!/usr/bin/env python3
"""Reasoning output and the tool-call formats (issue 43, points 1 and 4), against real echo-serve
processes on the demo model (random Qwen3 weights, the real Qwen3 tokenizer and chat template).
Run by tests/server/run.sh with the clients' venv python (HF tokenizers, openai, jsonschema).

The random model's text is gibberish, so the tests force what it says: the testing field
debug_force_output (--debug-request-fields) makes the output's first tokens a given text, and
grammars (guided_json, tool_choice) make it produce valid answers after the thinking. Expected
values are written here or computed with HF tokenizers from the model's tokenizer.json, never read
back from the server under test.
  reasoning   thinking in reasoning_content, answer in content, "<think>" + reasoning + "</think>" +
              content == the raw text of --reasoning-parser none; streams: reasoning deltas first;
              --reasoning-field reasoning / both; thinking_budget and --reasoning-budget to the
              token; usage.completion_tokens_details.reasoning_tokens; both field names on input;
              enable_thinking: false -> no reasoning; grammars apply after the thinking; 400s
  tools       hermes, qwen3_coder and mistral rows (--tool-call-parser): parse, stream and
              constrained (tool_choice required / named), each also after a thinking block
The last line printed is "N passed, M failed".
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import FAILED, PASSED, Server, check, cj, curl, section, sse_events  # noqa: E402

import jsonschema  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

NAME = "echo-demo"
COMMON = ["--served-model-name", NAME, "--max-model-len", "1024", "--max-num-seqs", "4",
          "--max-num-batched-tokens", "256", "--debug-request-fields"]
MSG = [{"role": "user", "content": "What is 2 + 2?"}]
THINK = "\nI should add 2 and 2.\n"
ANSWER = "\n\nThe answer is 4."
RAW = "<think>" + THINK + "</think>" + ANSWER


class Tok:
    """HF tokenizers on the model's tokenizer.json: the independent token counts."""

    def __init__(self, model_dir):
        self.t = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))

    def ids(self, text):
        return self.t.encode(text, add_special_tokens=False).ids

    def n(self, text):
        return len(self.ids(text))

    def decode(self, ids):
        return self.t.decode(ids, skip_special_tokens=False)


def stop(S):
    """SIGTERM: exit 0, and no sanitizer report in its log (an ASan build run by hand)."""
    rc, log = S.stop()
    bad = [l for l in log.splitlines()
           if re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|Sanitizer has encountered|runtime error:", l)]
    name = os.path.basename(S.log.name)[len("echo-serve-"):].rsplit("-", 1)[0]
    check(f"server {name}: SIGTERM -> exit 0, no sanitizer report", rc == 0 and not bad, (rc, bad[:5]))


def chat(S, **kw):
    body = dict({"model": NAME, "messages": MSG, "temperature": 0}, **kw)
    return cj(S.url + "/v1/chat/completions", body, timeout=300)


def stream(S, **kw):
    body = dict({"model": NAME, "messages": MSG, "temperature": 0, "stream": True,
                 "stream_options": {"include_usage": True}}, **kw)
    st, text = curl(S.url + "/v1/chat/completions", data=body, timeout=300)
    return st, (sse_events(text) if st == 200 else text)


def deltas(events):
    """(kind, text) per delta in order, kind 'reasoning_content' / 'reasoning' / 'content'; the usage."""
    out, usage, calls = [], None, []
    for ev in events:
        if ev == "[DONE]":
            continue
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            d = ch.get("delta", {})
            for k in ("reasoning_content", "reasoning", "content"):
                if d.get(k):
                    out.append((k, d[k]))
            calls += d.get("tool_calls") or []
    return out, usage, calls


def reasoning_section(binary, model, tk):
    n_raw = tk.n(RAW)
    R = Server(binary, model, *COMMON, name="rz")
    N = Server(binary, model, *COMMON, "--reasoning-parser", "none", name="rz-none")
    try:
        check("log: auto picks the qwen3 parser from the Qwen3 template",
              "reasoning parser: qwen3 (auto" in R.logtext(), R.logtext()[-800:])
        # non-streamed
        st, raw = chat(N, max_tokens=n_raw, debug_force_output=RAW)
        rawtext = raw["choices"][0]["message"]["content"] if st == 200 else None
        check("--reasoning-parser none: the raw text in content, no reasoning field",
              st == 200 and rawtext == RAW and "reasoning_content" not in raw["choices"][0]["message"], raw)
        st, j = chat(R, max_tokens=n_raw, debug_force_output=RAW)
        m = j["choices"][0]["message"] if st == 200 else {}
        check("chat: thinking in reasoning_content, the answer in content",
              m.get("reasoning_content") == THINK and m.get("content") == ANSWER, j)
        check("chat: <think> + reasoning + </think> + content == the raw text of --reasoning-parser none",
              "<think>" + m.get("reasoning_content", "") + "</think>" + m.get("content", "") == rawtext)
        check("usage.completion_tokens_details.reasoning_tokens == the thinking's tokens (HF tokenizers)",
              st == 200 and j["usage"].get("completion_tokens_details", {}).get("reasoning_tokens") == tk.n(THINK),
              (j.get("usage"), tk.n(THINK)))
        # streamed
        st, ev = stream(R, max_tokens=n_raw, debug_force_output=RAW)
        ds, usage, _ = deltas(ev) if st == 200 else ([], None, [])
        kinds = [k for k, _ in ds]
        first_content = kinds.index("content") if "content" in kinds else len(kinds)
        check("stream: delta.reasoning_content carries the thinking, delta.content the answer",
              "".join(t for k, t in ds if k == "reasoning_content") == THINK and
              "".join(t for k, t in ds if k == "content") == ANSWER, ds)
        check("stream: every reasoning delta comes before the first content delta",
              kinds and all(k == "reasoning_content" for k in kinds[:first_content]) and
              "reasoning_content" not in kinds[first_content:], kinds)
        check("stream: usage.completion_tokens_details.reasoning_tokens",
              usage and usage.get("completion_tokens_details", {}).get("reasoning_tokens") == tk.n(THINK), usage)
        st, ev = stream(N, max_tokens=n_raw, debug_force_output=RAW)
        ds, _, _ = deltas(ev) if st == 200 else ([], None, [])
        check("stream, --reasoning-parser none: content only, == the raw text",
              all(k == "content" for k, _ in ds) and "".join(t for _, t in ds) == RAW, ds)

        # thinking budget, to the token: the first `b` thinking tokens, then </think>
        long_think = "\n" + " ".join(f"step{i}" for i in range(40)) + "\n"
        forced = "<think>" + long_think + "</think>\n\nDone."
        think_ids = tk.ids("<think>" + long_think)[1:]
        for b in (0, 1, 7):
            st, j = chat(R, max_tokens=40, thinking_budget=b, debug_force_output=forced)
            m = j["choices"][0]["message"] if st == 200 else {}
            check(f"thinking_budget {b}: reasoning_tokens == {b}, the reasoning is the first {b} thinking tokens",
                  st == 200 and j["usage"]["completion_tokens_details"]["reasoning_tokens"] == b and
                  m.get("reasoning_content") == tk.decode(think_ids[:b]), (j.get("usage"), m))
        st, ev = stream(R, max_tokens=40, thinking_budget=5, debug_force_output=forced)
        ds, usage, _ = deltas(ev) if st == 200 else ([], None, [])
        check("stream, thinking_budget 5: reasoning deltas are the first 5 thinking tokens",
              "".join(t for k, t in ds if k == "reasoning_content") == tk.decode(think_ids[:5]) and
              usage["completion_tokens_details"]["reasoning_tokens"] == 5, (ds[:8], usage))
        # the random model's own thinking (only the opening is forced), closed by the budget
        st, j = chat(R, max_tokens=30, thinking_budget=6, debug_force_output="<think>")
        check("thinking_budget 6 on the model's own (random) thinking: reasoning_tokens == 6",
              st == 200 and j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6, j.get("usage"))

        # a grammar applies to the answer, after the thinking
        schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
                  "additionalProperties": False}
        st, j = chat(R, max_tokens=60, thinking_budget=4, debug_force_output="<think>",
                     response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        m = j["choices"][0]["message"] if st == 200 else {}
        ok = False
        try:
            jsonschema.validate(json.loads(m.get("content") or ""), schema)
            ok = True
        except Exception:
            pass
        check("json_schema after thinking: 4 unconstrained thinking tokens, then content valid under the schema",
              ok and j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4 and
              isinstance(m.get("reasoning_content"), str), m)
        st, j = chat(R, max_tokens=60, guided_regex="[a-z]{3,8}")
        m = j["choices"][0]["message"] if st == 200 else {}
        check("guided_regex without thinking: the grammar from the first token, no reasoning field",
              st == 200 and "reasoning_content" not in m and 3 <= len(m.get("content", "")) <= 8 and
              m["content"].isalpha(), m)

        st, j = chat(R, max_tokens=12, guided_regex="[a-z]{3,8}", debug_force_output="ab9",
                     chat_template_kwargs={"enable_thinking": False})
        m = j["choices"][0]["message"] if st == 200 else {}
        check("a forced output the grammar refuses ends where it is refused (200, the grammar holds)",
              st == 200 and m.get("content", "").startswith("ab") and m["content"].isalpha() and
              3 <= len(m["content"]) <= 8, j)

        # enable_thinking: false -> the template closes the block, no reasoning at all
        kw = {"chat_template_kwargs": {"enable_thinking": False}}
        st, j = chat(R, max_tokens=n_raw, debug_force_output="Four.", **kw)
        m = j["choices"][0]["message"] if st == 200 else {}
        check("enable_thinking false: no reasoning field, the text in content, no reasoning usage",
              "reasoning_content" not in m and m.get("content", "").startswith("Four.") and
              "completion_tokens_details" not in j.get("usage", {}), j)
        st, ev = stream(R, max_tokens=4, **kw)
        ds, _, _ = deltas(ev) if st == 200 else ([], None, [])
        check("enable_thinking false, streamed: no reasoning deltas", ds and all(k == "content" for k, _ in ds), ds)

        # input: both names of the thinking in assistant history
        def prompt_tokens(msg_extra):
            msgs = [MSG[0], dict({"role": "assistant", "content": "4."}, **msg_extra)]
            st, j = cj(R.url + "/tokenize", {"model": NAME, "messages": msgs, "add_generation_prompt": False})
            return st, j

        s1, a = prompt_tokens({"reasoning_content": "I added them."})
        s2, b_ = prompt_tokens({"reasoning": "I added them."})
        s3, c = prompt_tokens({})
        want = tk.ids("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\nI added them.\n"
                      "</think>\n\n4.<|im_end|>\n")
        check("history: reasoning_content and reasoning render the same prompt, the thinking in it",
              s1 == s2 == s3 == 200 and a["tokens"] == b_["tokens"] == want and c["tokens"] != want,
              (a, b_, c))
        st, j = chat(R, max_tokens=2, messages=[MSG[0], {"role": "assistant", "content": "4.", "reasoning": "x",
                                                         "reasoning_content": "y"}, MSG[0]])
        check("history: reasoning and reasoning_content that differ -> 400 naming messages",
              st == 400 and j["error"]["param"] == "messages", j)

        # /v1/responses: the same splitter gives a reasoning item before the message
        body = {"model": NAME, "input": MSG[0]["content"], "max_output_tokens": n_raw, "temperature": 0,
                "debug_force_output": RAW}
        st, j = cj(R.url + "/v1/responses", body, timeout=300)
        out = j.get("output", []) if st == 200 else []
        kinds = [it.get("type") for it in out]
        rtext = "".join(c.get("text", "") for it in out if it.get("type") == "reasoning" for c in it.get("content", []))
        mtext = "".join(c.get("text", "") for it in out if it.get("type") == "message" for c in it.get("content", []))
        check("responses: a reasoning item with the thinking, then a message with the answer",
              kinds == ["reasoning", "message"] and rtext == THINK and mtext == ANSWER, j)
        check("responses: usage.output_tokens_details.reasoning_tokens == the thinking's tokens",
              st == 200 and j["usage"]["output_tokens_details"]["reasoning_tokens"] == tk.n(THINK), j.get("usage"))
        st, text = curl(R.url + "/v1/responses", data=dict(body, stream=True), timeout=300)
        evs = [e for e in sse_events(text) if isinstance(e, dict)] if st == 200 else []
        types = [e.get("type") for e in evs]
        rd = "".join(e.get("delta", "") for e in evs if e.get("type") == "response.reasoning_text.delta")
        od = "".join(e.get("delta", "") for e in evs if e.get("type") == "response.output_text.delta")
        last_r = max((i for i, t in enumerate(types) if t == "response.reasoning_text.delta"), default=-1)
        first_o = min((i for i, t in enumerate(types) if t == "response.output_text.delta"), default=-1)
        check("responses stream: reasoning_text deltas (the thinking) before output_text deltas (the answer)",
              rd == THINK and od == ANSWER and 0 <= last_r < first_o and types[-1] == "response.completed", types)
        # errors
        for bad in (-1, "3", 1.5, 2 ** 40):
            st, j = chat(R, max_tokens=2, thinking_budget=bad)
            check(f"thinking_budget {bad!r} -> 400 naming it", st == 400 and j["error"]["param"] == "thinking_budget",
                  j)
        st, j = chat(N, max_tokens=2, thinking_budget=3)
        check("thinking_budget on a --reasoning-parser none server -> 400", st == 400 and
              j["error"]["param"] == "thinking_budget", j)
    finally:
        stop(R)
        stop(N)

    # field names, and the server-wide budget
    F = Server(binary, model, *COMMON, "--reasoning-field", "reasoning", "--reasoning-budget", "2", name="rz-field")
    B = Server(binary, model, *COMMON, "--reasoning-field", "both", name="rz-both")
    try:
        st, j = chat(F, max_tokens=n_raw, debug_force_output=RAW)
        m = j["choices"][0]["message"] if st == 200 else {}
        check("--reasoning-field reasoning + --reasoning-budget 2: message.reasoning holds the first 2 thinking "
              "tokens, no reasoning_content",
              m.get("reasoning") == tk.decode(tk.ids(RAW)[1:3]) and "reasoning_content" not in m and
              j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2, j)
        st, j = chat(F, max_tokens=n_raw, thinking_budget=100, debug_force_output=RAW)
        m = j["choices"][0]["message"] if st == 200 else {}
        check("thinking_budget overrides --reasoning-budget", m.get("reasoning") == THINK, m)
        st, ev = stream(F, max_tokens=n_raw, thinking_budget=100, debug_force_output=RAW)
        ds, _, _ = deltas(ev) if st == 200 else ([], None, [])
        check("--reasoning-field reasoning, streamed: delta.reasoning",
              "".join(t for k, t in ds if k == "reasoning") == THINK and
              not any(k == "reasoning_content" for k, _ in ds), ds)
        st, j = chat(B, max_tokens=n_raw, debug_force_output=RAW)
        m = j["choices"][0]["message"] if st == 200 else {}
        check("--reasoning-field both: both keys, equal", m.get("reasoning") == THINK == m.get("reasoning_content"), m)
    finally:
        stop(F)
        stop(B)
    # deepseek_r1: the template opens the block in the prompt, only </think> shows in the output.
    # A copy of the demo model whose template appends "<think>\n" to the generation prompt: auto
    # must pick deepseek_r1 from it.
    gen = "{{- '<|im_start|>assistant\\n' }}"

    def r1(t):
        assert gen in t, "the Qwen3 template's generation prompt moved"
        return t.replace(gen, "{{- '<|im_start|>assistant\\n<think>\\n' }}", 1)

    tmp = model_with_template(model, r1)
    D = Server(binary, tmp, *COMMON, name="rz-r1")
    try:
        check("auto picks deepseek_r1 for a template that opens <think> in the prompt",
              "reasoning parser: deepseek_r1 (auto" in D.logtext(), D.logtext()[-600:])
        text = "Adding.\n</think>\n\n4"
        st, j = chat(D, max_tokens=tk.n(text), debug_force_output=text)
        m = j["choices"][0]["message"] if st == 200 else {}
        check("deepseek_r1: the output starts inside the block; reasoning up to </think>, then the answer",
              m.get("reasoning_content") == "Adding.\n" and m.get("content") == "\n\n4", j)
        st, j = chat(D, max_tokens=20, thinking_budget=3)
        check("deepseek_r1: thinking_budget 3 on the model's own thinking from the first token",
              st == 200 and j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3 and
              isinstance(j["choices"][0]["message"].get("reasoning_content"), str), j)
    finally:
        stop(D)
        shutil.rmtree(tmp, ignore_errors=True)
    p = subprocess.run([binary, "--model", model, "--port", "0", "--device", "cpu", "--reasoning-parser", "none",
                        "--reasoning-budget", "4"], capture_output=True, timeout=120)
    err = p.stderr.decode(errors="replace")
    check("--reasoning-budget without a reasoning parser: exit 1 naming the flag",
          p.returncode == 1 and "--reasoning-budget 4 needs a reasoning parser" in err, (p.returncode, err[-400:]))
    S = Server(binary, model, *[a for a in COMMON if a != "--debug-request-fields"], name="rz-nodebug")
    try:
        st, j = chat(S, max_tokens=2, debug_force_output="x")
        check("debug_force_output without --debug-request-fields -> 400 naming it",
              st == 400 and j["error"]["param"] == "debug_force_output", j)
    finally:
        stop(S)


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"], "additionalProperties": False}}}
NOOP = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, NOOP]

# (row, the model's text with two calls, the calls it holds, the content around them)
FORMATS = [
    ("hermes",
     'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
     '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'),
    ("qwen3_coder",
     "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
     "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>"),
    ("mistral",
     'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
     '{"name": "noop", "arguments": {}}]'),
]
WANT_CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("noop", {})]
MARKERS = {"hermes": "<tool_call>", "qwen3_coder": "<tool_call>", "mistral": "[TOOL_CALLS]"}


def calls_of(tcs):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tcs]


def model_with_template(model, edit):
    """A copy of the model folder (symlinks) whose chat template is edit(template)."""
    tmp = tempfile.mkdtemp(prefix="echo-tpl-")
    for f in os.listdir(model):
        if f != "tokenizer_config.json":
            os.symlink(os.path.abspath(os.path.join(model, f)), os.path.join(tmp, f))
    with open(os.path.join(model, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    cfg["chat_template"] = edit(cfg["chat_template"])
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return tmp


def tools_section(binary, model, tk):
    # auto: the row whose string the template contains (a Jinja comment is enough), hermes by default
    for fmt, mark in (("qwen3_coder", "<function=NAME>"), ("mistral", "[TOOL_CALLS]"), ("hermes", None)):
        tmp = model_with_template(model, lambda t: t + ("{# " + mark + " #}" if mark else ""))
        S = Server(binary, tmp, *COMMON, name=f"tools-auto-{fmt}")
        try:
            check(f"--tool-call-parser auto picks {fmt} from the template",
                  f"tool-call format: {fmt} (auto" in S.logtext(), S.logtext()[-500:])
        finally:
            stop(S)
            shutil.rmtree(tmp, ignore_errors=True)
    for fmt, text in FORMATS:
        S = Server(binary, model, *COMMON, "--tool-call-parser", fmt, name=f"tools-{fmt}")
        try:
            check(f"{fmt}: the log names the row", f"tool-call format: {fmt}" in S.logtext())
            n = tk.n(text)
            # parse
            st, j = chat(S, max_tokens=n, tools=TOOLS, debug_force_output=text)
            ch = j["choices"][0] if st == 200 else {}
            # the forced text fills max_tokens exactly: "length" (issue 47: a run that hit
            # max_tokens says so, whatever was parsed); content is the text before the first call
            check(f"{fmt} parse: two calls, typed arguments, content before them, finish_reason length",
                  calls_of(ch["message"]["tool_calls"]) == WANT_CALLS and
                  ch["message"]["content"] == text[:text.index(MARKERS[fmt])] and ch["finish_reason"] == "length", j)
            # stream
            st, ev = stream(S, max_tokens=n, tools=TOOLS, debug_force_output=text)
            ds, _, calls = deltas(ev) if st == 200 else ([], None, [])
            content = "".join(t for k, t in ds if k == "content")
            check(f"{fmt} stream: content up to the calls (no marker byte), as the answer without streaming",
                  content == text[:text.index(MARKERS[fmt])], (ds, calls))
            check(f"{fmt} stream: the calls", calls_of(calls) == WANT_CALLS, calls)
            # after a thinking block, and a call that ends the thinking without </think>
            st, j = chat(S, max_tokens=n + 20, tools=TOOLS, debug_force_output="<think>\nweather first\n</think>\n\n" + text)
            m = j["choices"][0]["message"] if st == 200 else {}
            check(f"{fmt} after thinking: reasoning_content, then the calls",
                  m.get("reasoning_content") == "\nweather first\n" and calls_of(m["tool_calls"]) == WANT_CALLS, m)
            call_only = text[len("Checking."):].lstrip("\n")
            st, j = chat(S, max_tokens=n + 20, tools=TOOLS, debug_force_output="<think>\nplan" + call_only)
            m = j["choices"][0]["message"] if st == 200 else {}
            check(f"{fmt}: {MARKERS[fmt]} ends the thinking (no </think>)",
                  m.get("reasoning_content") == "\nplan" and calls_of(m.get("tool_calls", [])) == WANT_CALLS, m)
            # constrained: the random model must produce a valid call
            for choice, label in (("required", "required"),
                                  ({"type": "function", "function": {"name": "get_weather"}}, "named")):
                for streamed in (False, True):
                    # thinking off: the random model would otherwise open a block it never closes
                    kw = dict(max_tokens=120, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                              chat_template_kwargs={"enable_thinking": False})
                    if streamed:
                        st, ev = stream(S, **kw)
                        _, _, calls = deltas(ev) if st == 200 else ([], None, [])
                        fin = [c.get("finish_reason") for e in ev if e != "[DONE]" for c in e.get("choices", [])]
                    else:
                        st, j = chat(S, **kw)
                        calls = j["choices"][0]["message"]["tool_calls"] if st == 200 else []
                        fin = [j["choices"][0]["finish_reason"]] if st == 200 else []
                    ok = len(calls) == 1 and "tool_calls" in fin
                    try:
                        name = calls[0]["function"]["name"]
                        args = json.loads(calls[0]["function"]["arguments"])
                        spec = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
                        jsonschema.validate(args, spec[name])
                        ok = ok and (label != "named" or name == "get_weather")
                    except Exception as e:  # no call, or arguments outside the schema
                        ok = False
                        calls = (calls, repr(e))
                    check(f"{fmt} constrained ({label}, {'streamed' if streamed else 'whole'}): one call, its "
                          f"arguments valid under the schema", ok, calls)
            # constrained after a thinking block the budget closes
            st, j = chat(S, max_tokens=150, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                         thinking_budget=3, debug_force_output="<think>")
            m = j["choices"][0]["message"] if st == 200 else {}
            ok = False
            try:
                c = m["tool_calls"][0]["function"]
                jsonschema.validate(json.loads(c["arguments"]),
                                    {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[c["name"]])
                ok = j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
            except Exception:
                pass
            check(f"{fmt} constrained after 3 thinking tokens: the grammar starts after </think>", ok, j)
        finally:
            stop(S)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    tk = Tok(a.model)
    section("reasoning", reasoning_section, a.bin, a.model, tk)
    section("tool-call formats", tools_section, a.bin, a.model, tk)
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
