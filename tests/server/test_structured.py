#!/usr/bin/env python3
"""Structured outputs on the trained model (SmolLM2-135M-Instruct, Q4_1 GGUF), run by
tests/server/run.sh when the GGUF is there (make test-server fetches it):
  errors     one constraint per request (two -> 400 naming both), unsupported JSON-schema
             keywords -> 400 naming them, bad regex / choices / grammar -> 400
  schema100  100 chat requests with a JSON schema (nested objects, arrays, enums, required
             fields, string patterns), greedy, and 100 at temperature 1: every answer
             validates against the schema with the `jsonschema` package
  kinds      json_object, guided_regex / guided_choice / guided_grammar and structured_outputs
             on /v1/completions and chat: outputs checked with Python's re / json / equality
  mixed      constrained and free requests in one batch: the free ones' greedy text equals
             the same request run alone
  parse      the openai client's chat.completions.parse(response_format=PydanticModel),
             and its .stream() helper, unmodified
  metrics    echo:constrained_requests_total, grammar compile and mask histograms
  tools      tool calling through the openai client: a named tool_choice call (grammar-enforced),
             its arguments valid under the function's schema, the tool result sent back and
             answered, streaming and not; the history rendered back; required / parallel; errors
  issue47    hostile schemas -> 400 before compiling (the server stays up), every shape xgrammar
             would not enforce refused naming keyword and location, no raw control characters in
             JSON, tool calls cut at max_tokens -> length, stream == whole answer, tool_call_id
  responses  /v1/responses through the openai client: create, stream (event sequence, raw SSE), a
             function-call round trip (named / required tool_choice; previous_response_id or input
             items), text.format json_schema / json_object, previous_response_id and store, Codex's
             tool types (200, one warning line), empty probes and bad fields (400 naming the field)
  tp3        constrained answers at --tp 3 validate (SmolLM2 has 9 heads)
The last line printed is "N passed, M failed".
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import PASSED, FAILED, Server, check, cj, curl, parse_metrics, sample, section  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
                 "minItems": 1, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}

PEOPLE = ["Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
CITIES = ["Paris", "Berlin", "Rome", "Madrid", "Oslo", "Vienna", "Lisbon", "Dublin", "Prague", "Athens"]


def chat(url, messages, **kw):
    body = {"messages": messages, "max_tokens": 200, **kw}
    return cj(url + "/v1/chat/completions", body, timeout=600)


def pj(url, body, timeout=600):
    """POST body as JSON with urllib (no command-line limit): (status, parsed JSON)."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            b = r.read()
            try:
                return r.status, json.loads(b)
            except ValueError:
                return r.status, {"raw": b[:300].decode("utf-8", "replace")}
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {}


def err_check(url, name, body, param_words, path="/v1/chat/completions"):
    st, j = cj(url + path, body)
    msg = j.get("error", {}).get("message", "") if isinstance(j, dict) else ""
    check(f"{name}: 400 naming {param_words}", st == 400 and all(w in msg for w in param_words), (st, j))


def errors_section(S):
    m = [{"role": "user", "content": "hi"}]
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    err_check(S.url, "response_format + guided_regex", {"messages": m, "response_format": rf, "guided_regex": "a+"},
              ["response_format", "guided_regex"])
    err_check(S.url, "guided_json + guided_choice", {"messages": m, "guided_json": SCHEMA, "guided_choice": ["a"]},
              ["guided_json", "guided_choice"])
    err_check(S.url, "structured_outputs with two kinds",
              {"messages": m, "structured_outputs": {"regex": "a", "choice": ["a"]}},
              ["structured_outputs.regex", "structured_outputs.choice"])
    bad = {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True},
                                            "n": {"not": {"type": "null"}}}}
    err_check(S.url, "unsupported schema keywords",
              {"messages": m, "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": bad}}},
              ["uniqueItems", "not", "#/properties/t"])
    err_check(S.url, "pattern with maxLength", {"messages": m, "guided_json": {
        "type": "string", "pattern": "^a+$", "maxLength": 3}}, ["pattern", "maxLength"])
    err_check(S.url, "unknown format", {"messages": m, "guided_json": {"type": "string", "format": "phone"}},
              ["format", "phone"])
    err_check(S.url, "bad regex", {"messages": m, "guided_regex": "([a-z]"}, ["regex"])
    err_check(S.url, "choice not a list", {"messages": m, "guided_choice": "yes"}, ["guided_choice"])
    err_check(S.url, "bad grammar", {"messages": m, "guided_grammar": "root ::= missing_rule"}, ["grammar"])
    err_check(S.url, "response_format type", {"messages": m, "response_format": {"type": "xml"}}, ["response_format"])
    err_check(S.url, "guided_json not JSON", {"prompt": "x", "guided_json": "{nope"}, ["guided_json"],
              path="/v1/completions")
    st, j = chat(S.url, m, response_format={"type": "text"}, max_tokens=4)
    check("response_format text: 200", st == 200, j)


def schema_prompt(i):
    p, c = PEOPLE[i % 10], CITIES[(i // 10) % 10]
    return [{"role": "system", "content": "You answer with a JSON object describing a person."},
            {"role": "user", "content": f"Describe {p}, age {20 + i % 50}, who lives in {c}. Request {i}."}]


def schema100_section(S):
    import jsonschema
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    for label, extra in (("greedy", {"temperature": 0}), ("temperature 1", {"temperature": 1.0, "top_p": 1.0})):
        def one(i):
            kw = dict(extra)
            if "top_p" in kw:
                kw["seed"] = 1000 + i
            return chat(S.url, schema_prompt(i), response_format=rf, **kw)
        with cf.ThreadPoolExecutor(8) as ex:
            res = list(ex.map(one, range(100)))
        bad = []
        for i, (st, j) in enumerate(res):
            try:
                assert st == 200, (st, j)
                c = j["choices"][0]
                assert c["finish_reason"] == "stop", c["finish_reason"]
                jsonschema.validate(json.loads(c["message"]["content"]), SCHEMA)
            except Exception as e:  # noqa: BLE001 - report every kind of failure
                bad.append((i, repr(e)[:300]))
        check(f"schema100 {label}: 100 chat answers validate against the schema (jsonschema)", not bad, bad[:3])
        if label == "greedy":
            texts = {j["choices"][0]["message"]["content"] for st, j in res if st == 200}
            check("schema100 greedy: the answers depend on the prompt (>= 10 distinct)", len(texts) >= 10, len(texts))
            print(f"  e.g. {next(iter(texts))}")


def kinds_section(S):
    st, j = cj(S.url + "/v1/completions", {"prompt": "A JSON object with a list of fruits:", "max_tokens": 120,
                                           "temperature": 0, "response_format": {"type": "json_object"}})
    txt = j["choices"][0]["text"] if st == 200 else ""
    ok = False
    try:
        ok = isinstance(json.loads(txt), dict) and j["choices"][0]["finish_reason"] == "stop"
    except ValueError:
        pass
    check("completions json_object: a JSON object", ok, (st, j))
    rx = r"[0-9]{3}-[0-9]{4}"
    st, j = cj(S.url + "/v1/completions", {"prompt": "Call me at", "max_tokens": 20, "temperature": 0.8, "seed": 3,
                                           "guided_regex": rx})
    check("completions guided_regex: text matches", st == 200 and re.fullmatch(rx, j["choices"][0]["text"]), j)
    choices = ["positive", "negative", "neutral"]
    st, j = chat(S.url, [{"role": "user", "content": "Classify: I love this movie!"}], guided_choice=choices,
                 temperature=0)
    check("chat guided_choice: one of the choices", st == 200 and j["choices"][0]["message"]["content"] in choices, j)
    st, j = cj(S.url + "/v1/completions", {"prompt": "Answer:", "max_tokens": 10, "temperature": 0,
                                           "structured_outputs": {"choice": ["yes", "no"]}})
    check("completions structured_outputs.choice", st == 200 and j["choices"][0]["text"] in ("yes", "no"), j)
    g = 'root ::= "The answer is " [0-9]+ "."'
    st, j = cj(S.url + "/v1/completions", {"prompt": "What is 2+2?", "max_tokens": 20, "temperature": 0,
                                           "guided_grammar": g})
    check("completions guided_grammar: text matches", st == 200 and re.fullmatch(r"The answer is [0-9]+\.",
                                                                                 j["choices"][0]["text"]), j)
    st, j = chat(S.url, [{"role": "user", "content": "Give a color."}], n=3, temperature=1.0, seed=5,
                 structured_outputs={"json": {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}},
                                              "required": ["color"]}})
    ok = st == 200 and len(j["choices"]) == 3 and all(
        json.loads(c["message"]["content"])["color"] in ("red", "blue") for c in j["choices"])
    check("chat structured_outputs.json with n=3: every choice conforms", ok, j)
    # streamed: the concatenated deltas are the constrained text
    from test_server import curl, sse_events
    st, body = curl(S.url + "/v1/chat/completions", data={
        "messages": [{"role": "user", "content": "Pick"}], "stream": True, "temperature": 0,
        "guided_choice": ["alpha", "beta"]})
    ev = sse_events(body) if st == 200 else []
    txt = "".join(e["choices"][0]["delta"].get("content") or "" for e in ev if isinstance(e, dict) and e["choices"])
    check("chat stream guided_choice: deltas join to a choice", txt in ("alpha", "beta"), (st, body[:300]))


def mixed_section(S):
    free = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    st, alone = cj(S.url + "/v1/completions", free)
    con = {"prompt": "JSON:", "max_tokens": 60, "temperature": 1.0, "seed": 9, "response_format": {"type": "json_object"}}
    with cf.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(cj, S.url + "/v1/completions", free if i % 2 else con) for i in range(8)]
        res = [f.result() for f in futs]
    same = all(j["choices"][0]["text"] == alone["choices"][0]["text"] for i, (s_, j) in enumerate(res) if i % 2)
    check("mixed batch: free greedy requests unchanged beside constrained ones", st == 200 and same,
          [j["choices"][0]["text"] for _, j in res[:2]])
    objs = 0
    for i, (s_, j) in enumerate(res):
        if i % 2 == 0 and s_ == 200:
            try:
                objs += isinstance(json.loads(j["choices"][0]["text"]), dict)
            except ValueError:
                pass
    check("mixed batch: constrained requests give JSON objects", objs == 4, [j for _, j in res[::2]][:1])


def parse_section(S):
    import openai
    from pydantic import BaseModel, Field
    from typing import List, Literal

    # bounded strings and lists: a 135M model's greedy string can otherwise run to max_tokens
    class Pet(BaseModel):
        name: str = Field(max_length=20)
        kind: Literal["cat", "dog", "bird"]
        age: int

    class Owner(BaseModel):
        owner: str = Field(max_length=20)
        pets: List[Pet] = Field(max_length=3)

    client = openai.OpenAI(base_url=S.url + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "Tom has a cat named Tiger, age 3."}]
    r = client.chat.completions.parse(model="smollm2", messages=msgs, response_format=Owner, temperature=0,
                                      max_tokens=200)
    p = r.choices[0].message.parsed
    check("openai parse(): message.parsed is the Pydantic model", isinstance(p, Owner), r)
    with client.chat.completions.stream(model="smollm2", messages=msgs, response_format=Owner, temperature=0,
                                        max_tokens=200) as stream:
        for _ in stream:
            pass
        fin = stream.get_final_completion()
    p2 = fin.choices[0].message.parsed
    check("openai stream() with response_format: parsed, == non-streamed", isinstance(p2, Owner) and p2 == p, (p, p2))


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z][a-z]{2,10}/[A-Z][a-z]{2,10}$"}},
                   "required": ["tz"]}}}


def tools_section(S):
    import jsonschema
    import openai
    client = openai.OpenAI(base_url=S.url + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for stream in (False, True):
        tag = "stream" if stream else "non-stream"
        kw = dict(model="smollm2", messages=msgs, tools=[WEATHER, TIME], tool_choice=named, temperature=0,
                  max_tokens=120)
        if stream:
            calls, fin, content = {}, None, ""
            for ch in client.chat.completions.create(stream=True, **kw):
                if not ch.choices:
                    continue
                d = ch.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    c["id"] = tc.id or c["id"]
                    c["name"] += tc.function.name or ""
                    c["arguments"] += tc.function.arguments or ""
                fin = ch.choices[0].finish_reason or fin
            call = calls.get(0)
        else:
            r = client.chat.completions.create(**kw)
            fin, m = r.choices[0].finish_reason, r.choices[0].message
            content = m.content or ""
            call = m.tool_calls and {"id": m.tool_calls[0].id, "name": m.tool_calls[0].function.name,
                                     "arguments": m.tool_calls[0].function.arguments}
        ok = fin == "tool_calls" and call and call["name"] == "get_weather" and call["id"].startswith("call_")
        check(f"tools {tag}: named tool_choice -> one get_weather call, finish_reason tool_calls", ok,
              (fin, call, content))
        if not ok:
            continue
        args = json.loads(call["arguments"])
        try:
            jsonschema.validate(args, WEATHER["function"]["parameters"])
            valid = True
        except jsonschema.ValidationError as e:
            valid = repr(e)
        check(f"tools {tag}: the arguments validate against the function's parameters", valid is True, (args, valid))
        # the round trip: the client sends the call and the tool's result back
        hist = msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "22 degrees and sunny"}]
        kw2 = dict(model="smollm2", messages=hist, tools=[WEATHER, TIME], temperature=0, max_tokens=40)
        if stream:
            txt, fin2 = "", None
            for ch in client.chat.completions.create(stream=True, **kw2):
                if ch.choices:
                    txt += ch.choices[0].delta.content or ""
                    fin2 = ch.choices[0].finish_reason or fin2
        else:
            r2 = client.chat.completions.create(**kw2)
            txt, fin2 = r2.choices[0].message.content or "", r2.choices[0].finish_reason
        check(f"tools {tag}: the model answers after the tool result", fin2 in ("stop", "length", "tool_calls") and
              (txt or fin2 == "tool_calls"), (fin2, txt))
    # the history is rendered back through the template (Hermes block for SmolLM2's template)
    hist = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "MARKER-42"}]
    st, tk = cj(S.url + "/tokenize", {"messages": hist, "tools": [WEATHER]})
    st2, dt = cj(S.url + "/detokenize", {"tokens": tk.get("tokens", [])}) if st == 200 else (st, {})
    p = dt.get("prompt", "") if isinstance(dt, dict) else ""
    check("tools: tool definitions, the assistant call and the tool result are in the rendered prompt",
          "get_weather" in p and '"city": "Rome"' in p and "MARKER-42" in p and "<tool_call>" in p and
          "<tool_response>" in p, p[:600])
    st, tk0 = cj(S.url + "/tokenize", {"messages": msgs, "tools": [WEATHER], "tool_choice": "none"})
    st1, tk1 = cj(S.url + "/tokenize", {"messages": msgs})
    check("tools: tool_choice none leaves the tools out of the prompt", st == st1 == 200 and
          tk0["count"] == tk1["count"], (tk0.get("count"), tk1.get("count")))
    # required, parallel calls off: exactly one call of either tool
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Time in Berlin?"}],
                                       tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
                                       temperature=1.0, seed=4, max_tokens=120)
    tcs = r.choices[0].message.tool_calls or []
    check("tools: required + parallel_tool_calls false -> exactly one call of a defined tool",
          r.choices[0].finish_reason == "tool_calls" and len(tcs) == 1 and
          tcs[0].function.name in ("get_weather", "get_time"), r)
    # required with parallel calls: one or more, ids distinct
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                       tools=[WEATHER, TIME], tool_choice="required", temperature=1.0, seed=11,
                                       max_tokens=200)
    tcs = r.choices[0].message.tool_calls or []
    check("tools: required (parallel) -> >= 1 calls with distinct ids", len(tcs) >= 1 and
          len({t.id for t in tcs}) == len(tcs), r)
    # errors
    m = [{"role": "user", "content": "x"}]
    err_check(S.url, "tool_choice names an unknown function", {"messages": m, "tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, ["nope"])
    err_check(S.url, "required without tools", {"messages": m, "tool_choice": "required"}, ["tools"])
    err_check(S.url, "tool with a bad name", {"messages": m, "tools": [{"type": "function", "function": {
        "name": "a b"}}]}, ["tools[0]"])
    err_check(S.url, "required + response_format", {"messages": m, "tools": [WEATHER], "tool_choice": "required",
                                                    "response_format": {"type": "json_object"}}, ["tool_choice"])
    err_check(S.url, "unsupported keyword in a tool's parameters", {"messages": m, "tool_choice": "required",
              "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                  "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]}, ["uniqueItems"])


def issue47_section(S):
    """Issue 47: hostile schemas are a 400 before any compile (the server stays up), every
    combination xgrammar would not enforce is refused naming keyword and location, xgrammar's
    log prefix is gone, raw control characters never reach a JSON string, and tool calls agree
    streamed and not."""
    m = [{"role": "user", "content": "hi"}]
    comp = "/v1/completions"

    def err_check(url, name, body, words, path="/v1/chat/completions"):  # bodies too big for a curl argument
        st, j = pj(url + path, body)
        e = j.get("error", {}) if isinstance(j, dict) else {}
        msg, param = e.get("message", ""), e.get("param") or ""
        check(f"{name}: 400 naming {words}", st == 400 and all(w in msg or w == param for w in words), (st, j))

    n = 1500
    d = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    d[f"d{n}"] = {"type": "integer"}
    err_check(S.url, "a $ref chain of 1500 links in $defs", {"prompt": "x", "max_tokens": 1,
              "guided_json": {"$defs": d, "$ref": "#/$defs/d0"}}, ["guided_json", "nesting", "#/$defs/d"], path=comp)
    d = {f"o{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/o{i + 1}"}}} for i in range(2000)}
    d["o2000"] = {"type": "integer"}
    err_check(S.url, "an object chain of 2000 properties->$ref links", {"prompt": "x", "max_tokens": 1,
              "guided_json": {"$defs": d, "$ref": "#/$defs/o0"}}, ["nesting", "#/$defs/o"], path=comp)
    fan = {"$defs": {f"f{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/f{i + 1}"},
                                                                "b": {"$ref": f"#/$defs/f{i + 1}"}}}
                     for i in range(20)}, "$ref": "#/$defs/f0"}
    fan["$defs"]["f20"] = {"type": "integer"}
    err_check(S.url, "a $ref fan-out of 2^20 nodes", {"prompt": "x", "max_tokens": 1, "guided_json": fan},
              ["budget"], path=comp)
    err_check(S.url, "3000 optional properties", {"prompt": "x", "max_tokens": 1, "guided_json": {
        "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}},
        ["properties", "budget"], path=comp)
    err_check(S.url, "a 1 MB choice", {"prompt": "x", "max_tokens": 1, "guided_choice": ["a" * (1 << 20)]},
              ["guided_choice", "budget"], path=comp)
    err_check(S.url, "4096 long choices", {"prompt": "x", "max_tokens": 1,
              "guided_choice": [f"{i}" + "b" * 200 for i in range(4096)]}, ["guided_choice", "budget"], path=comp)
    def big(k):  # a $ref fan-out of 255 resolutions: under the budget of 256 alone, not twice
        d = {f"f{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/f{i + 1}"},
                                                        "b": {"$ref": f"#/$defs/f{i + 1}"}}} for i in range(7)}
        d["f7"] = {"type": "integer"}
        return {"type": "function", "function": {"name": f"f{k}", "parameters": {"$defs": d, "$ref": "#/$defs/f0"}}}
    st, j = pj(S.url + "/v1/chat/completions", {"messages": m, "tools": [big(0)], "tool_choice": "required",
                                                "max_tokens": 1})
    check("issue 47: one tool with 255 $ref resolutions: 200", st == 200, j)
    err_check(S.url, "issue 47: two such tools in one grammar share the budget",
              {"messages": m, "tools": [big(0), big(1)], "tool_choice": "required"}, ["tools", "budget", "[1]#"])
    st, j = chat(S.url, m, max_tokens=2)
    check("issue 47: the server is still up after the hostile schemas", st == 200, j)
    defs = {"s": {"type": "string"}}
    for name, sch, words in [
            ("pattern with format", {"type": "string", "pattern": "^a+$", "format": "email"}, ["pattern", "format", "#"]),
            ("enum beside $ref", {"$defs": defs, "$ref": "#/$defs/s", "enum": ["x"]}, ["enum", "$ref"]),
            ("maxLength beside $ref", {"$defs": defs, "$ref": "#/$defs/s", "maxLength": 2}, ["maxLength", "$ref"]),
            ("type beside anyOf", {"anyOf": [{"type": "string"}, {"type": "integer"}], "type": "integer"},
             ["type", "anyOf"]),
            ("properties/required beside allOf", {"allOf": [{"type": "object"}], "properties": {
                "a": {"type": "integer"}}, "required": ["a"]}, ["properties", "required", "allOf"]),
            ("required key absent from properties", {"type": "object", "properties": {"a": {"type": "integer"}},
                                                    "required": ["b"]}, ["required", '"b"']),
            ("required key forbidden", {"type": "object", "properties": {"a": False}, "required": ["a"]},
             ["required", "forbids"]),
            ("oneOf with overlapping branches", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, ["oneOf"]),
            ("const contradicting type", {"type": "string", "const": 3}, ["const", "type"]),
            ("enum contradicting type", {"type": "integer", "enum": [1, "a"]}, ["enum", "type"]),
            ("remote $ref", {"$ref": "http://example.com/s.json"}, ["remote", "$ref"]),
            ("minItems -1", {"type": "array", "minItems": -1}, ["minItems"]),
            ("minimum without type", {"minimum": 3}, ["minimum", "type"]),
            ("a pattern naming a tab", {"type": "string", "pattern": "^\\t$"}, ["pattern", "control"]),
            ("nested location", {"type": "object", "properties": {"x": {"type": "array", "items": {
                "type": "string", "const": 1}}}}, ["const", "#/properties/x/items"])]:
        err_check(S.url, f"issue 47: {name}", {"prompt": "x", "max_tokens": 1, "guided_json": sch},
                  ["guided_json"] + words, path=comp)
    err_check(S.url, "issue 47: structured_outputs {}", {"prompt": "x", "structured_outputs": {}},
              ["structured_outputs"], path=comp)
    st, j = pj(S.url + comp, {"prompt": "x", "max_tokens": 1, "guided_json": {
        "type": "string", "minLength": 5, "maxLength": 2}})
    msg = j.get("error", {}).get("message", "") if isinstance(j, dict) else ""
    check("issue 47: xgrammar's message has no [time] /path/file.cc:line: prefix",
          st == 400 and "minLength" in msg and not re.search(r"\[\d\d:\d\d:\d\d\]|\.cc:\d+", msg), (st, msg))
    # raw control characters: xgrammar allows them in a string with a length; the mask does not
    # (the JSON-Schema-Test-Suite's unevaluatedProperties.json #1, as scripts/schema-suite.py sends it: without
    # the mask these samples hold raw tabs)
    texts = []
    for sch in ({"unevaluatedProperties": {"type": "string", "minLength": 3}},
                {"type": "object", "properties": {"name": {"type": "string", "minLength": 3}}, "required": ["name"]}):
        st, j = pj(S.url + comp, {"prompt": "A JSON value:", "max_tokens": 96, "temperature": 1, "seed": 47, "n": 3,
                                  "guided_json": sch})
        texts += [c["text"] for c in j.get("choices", [])] if st == 200 else [None]
    bad = [t for t in texts if t is None or any(ord(ch) < 0x20 for ch in t)]
    check("issue 47: no raw control character in 6 JSON samples at temperature 1", texts and not bad, bad[:2])
    # tool calls cut at max_tokens: finish_reason length, and the stream says the same as the whole answer
    WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
            "tool_choice": "required", "temperature": 0, "max_tokens": 60, "ignore_eos": True, "seed": 3}
    st, j = pj(S.url + "/v1/chat/completions", body)
    c = j["choices"][0] if st == 200 else {}
    whole = (c.get("finish_reason"), (c.get("message") or {}).get("content") or "",
             [(t["function"]["name"], t["function"]["arguments"]) for t in (c.get("message") or {}).get("tool_calls") or []])
    req = urllib.request.Request(S.url + "/v1/chat/completions", json.dumps(dict(body, stream=True)).encode(),
                                 {"Content-Type": "application/json"})
    ev = [ln[6:] for ln in urllib.request.urlopen(req, timeout=300).read().decode().split("\n") if ln.startswith("data: ")]
    content, calls, fin = "", [], None
    for e in ev[:-1]:
        for ch in json.loads(e).get("choices", []):
            content += ch["delta"].get("content") or ""
            calls += [(t["function"]["name"], t["function"]["arguments"]) for t in ch["delta"].get("tool_calls") or []]
            fin = ch.get("finish_reason") or fin
    check("issue 47: tool calls cut at max_tokens -> finish_reason length (whole answer)",
          whole[0] == "length" and whole[2], whole)
    check("issue 47: streamed and whole answers carry the same finish_reason, content and calls",
          (fin, content, calls) == whole and ev[-1] == "[DONE]", ((fin, content, calls), whole))
    # a client gone while its grammar waits for a compile slot is dropped, not compiled: both slots
    # (--grammar-compiles 2) are held by six rounds of slow distinct compiles, and the client hangs up
    # right after sending, so the server sees the hang-up while it waits (its 100 ms poll) however fast
    # this machine compiles. (With a slot free the compile may start before the hang-up arrives.)
    import socket
    slow = lambda t: {"prompt": "x", "max_tokens": 1, "guided_json": {"type": "object", "properties": {
        f"p{i:03d}{t}" + "k" * 55: {"type": "integer"} for i in range(256)}}}
    dropped = lambda: sample(parse_metrics(S.url), "echo:grammar_compiles_dropped",
                             "echo:grammar_compiles_dropped_total", why="client_gone_before_compile")
    for busy in (12,):
        cc0 = dropped()
        ths = [threading.Thread(target=pj, args=(S.url + comp, slow(f"{busy}{k:02d}"))) for k in range(busy)]
        for th in ths:
            th.start()
        time.sleep(0.1)
        body = json.dumps(slow(f"g{busy}")).encode()
        sk = socket.create_connection(("127.0.0.1", S.port))
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body)
        sk.close()
        for th in ths:
            th.join()
        cc1 = None
        for _ in range(30):  # the server notices within its 100 ms poll; bounded at 3 s
            time.sleep(0.1)
            cc1 = dropped()
            if cc0 is not None and cc1 == cc0 + 1:
                break
        check(f"issue 47: a client gone before its grammar compiles is dropped ({busy} compiles queued) "
              "(echo:grammar_compiles_dropped_total{why=client_gone_before_compile} + 1)", cc0 is not None and
              cc1 == cc0 + 1, (cc0, cc1))
    hist = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}]
    for stream in (False, True):
        err_check(S.url, f"issue 47: a tool message without tool_call_id (stream {stream})",
                  {"messages": hist + [{"role": "tool", "content": "x"}], "stream": stream}, ["tool_call_id"])
        err_check(S.url, f"issue 47: a tool_call_id no earlier call has (stream {stream})",
                  {"messages": hist + [{"role": "tool", "tool_call_id": "call_8", "content": "x"}], "stream": stream},
                  ["tool_call_id", "call_8"])
    st, j = chat(S.url, hist + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}], max_tokens=2)
    check("issue 47: a tool_call_id an earlier call has: 200", st == 200, j)


def metrics_section(S):
    m = parse_metrics(S.url)
    n = sample(m, "echo:constrained_requests", "echo:constrained_requests_total") or 0
    check("metrics: constrained_requests_total counts the constrained requests", n >= 200, n)
    mc = sample(m, "echo:grammar_mask_seconds", "echo:grammar_mask_seconds_count") or 0
    ms = sample(m, "echo:grammar_mask_seconds", "echo:grammar_mask_seconds_sum") or 0
    cc = sample(m, "echo:grammar_compile_seconds", "echo:grammar_compile_seconds_count") or 0
    check("metrics: grammar mask time per token observed", mc > 1000 and ms > 0, (mc, ms))
    check("metrics: grammar compile time observed per constraint", cc >= 200, cc)
    if mc:
        print(f"  mask: {1e6 * ms / mc:.1f} us/token over {int(mc)} tokens")


def tp3_section(binary, model, url1):
    """tp 3 (threads as ranks, sampling and masking on rank 0): the constrained answers
    validate. Not compared with tp 1 token for token: the all-reduce's summation order
    moves the logits slightly, and a 135M model's near-ties then pick other tokens."""
    import jsonschema
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    S3 = Server(binary, model, "--tp", "3", "--allreduce", "exact", "--max-model-len", "2048", "--threads", "3",
                name="structured-tp3")
    try:
        bad = []
        with cf.ThreadPoolExecutor(4) as ex:
            res = list(ex.map(lambda i: chat(S3.url, schema_prompt(i), response_format=rf, temperature=0.7,
                                             seed=i), range(8)))
        for st, j in res:
            try:
                assert st == 200 and j["choices"][0]["finish_reason"] == "stop", j
                jsonschema.validate(json.loads(j["choices"][0]["message"]["content"]), SCHEMA)
            except Exception as e:  # noqa: BLE001
                bad.append(repr(e)[:300])
        check("tp 3: 8 concurrent schema-constrained answers validate", not bad, bad[:2])
    finally:
        S3.stop()


# ---------------------------------------------------------------- /v1/responses (issue 43)

R_WEATHER = {"type": "function", "name": "get_weather", "description": WEATHER["function"]["description"],
             "parameters": WEATHER["function"]["parameters"], "strict": True}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}$"},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def responses_section(S):
    """OpenAI's Responses API through the unmodified openai client: create, stream, a function-call round
    trip (named and required tool_choice), text.format json_schema, previous_response_id and its store,
    Codex's tool types, the raw event stream, empty probes."""
    import jsonschema
    import openai
    client = openai.OpenAI(base_url=S.url + "/v1", api_key="x")
    kw = dict(model="smollm2", input="Write one sentence about the sea.", temperature=0, max_output_tokens=24)
    r = client.responses.create(**kw)
    # the chat path gives the same greedy text for the same conversation (independent of the Responses mapping)
    st, cc = chat(S.url, [{"role": "user", "content": kw["input"]}], temperature=0, max_tokens=24)
    check("responses: create -> a message with output_text equal to chat's greedy answer; id resp_, usage",
          r.id.startswith("resp_") and r.object == "response" and r.output and r.output[0].type == "message" and
          r.output_text and st == 200 and r.output_text == cc["choices"][0]["message"]["content"] and
          r.usage.output_tokens == cc["usage"]["completion_tokens"] and
          r.usage.input_tokens == cc["usage"]["prompt_tokens"] and
          r.status == ("incomplete" if cc["choices"][0]["finish_reason"] == "length" else "completed"),
          (r.model_dump(), cc))
    types, deltas = [], []
    with client.responses.stream(**kw) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        fin = stream.get_final_response()
    need = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
            "response.output_text.delta", "response.output_text.done", "response.content_part.done",
            "response.output_item.done", "response.completed"]
    order = [t for t in types if t in need]
    check("responses: stream -> the Responses event sequence; deltas add up to the final text = create's",
          order[:4] == need[:4] and order[-4:] == need[-4:] and "".join(deltas) == fin.output_text == r.output_text,
          (types, "".join(deltas), fin.output_text, r.output_text))
    # the raw stream: "event:" lines naming each data's type, sequence_number 0, 1, 2, ...
    stc, body = curl(S.url + "/v1/responses", data=dict(kw, stream=True))
    evs, names = [], []
    for block in body.split("\n\n"):
        lines = block.split("\n")
        ev = [x[7:] for x in lines if x.startswith("event: ")]
        da = [json.loads(x[6:]) for x in lines if x.startswith("data: ")]
        if da:
            evs.append(da[0])
            names.append(ev[0] if ev else None)
    check("responses: raw stream: event names = data types, sequence_number counts from 0, ends with completed",
          stc == 200 and evs and all(n == e["type"] for n, e in zip(names, evs)) and
          [e["sequence_number"] for e in evs] == list(range(len(evs))) and evs[-1]["type"] == "response.completed"
          and evs[-1]["response"]["usage"]["output_tokens"] == r.usage.output_tokens, body[:800])
    # a function call round trip, the call forced by a named tool_choice
    q = "What is the weather in Paris?"
    r1 = client.responses.create(model="smollm2", input=q, tools=[R_WEATHER], temperature=0, max_output_tokens=120,
                                 tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False)
    calls = [o for o in r1.output if o.type == "function_call"]
    ok = len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    valid = False
    if ok:
        try:
            jsonschema.validate(json.loads(calls[0].arguments), R_WEATHER["parameters"])
            valid = True
        except (ValueError, jsonschema.ValidationError) as e:
            valid = repr(e)
    check("responses: named tool_choice -> one function_call item whose arguments validate", ok and valid is True,
          (r1.model_dump(), valid))
    if ok:
        out = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "MARKER-77 degrees"}
        r2 = client.responses.create(model="smollm2", previous_response_id=r1.id, input=[out], tools=[R_WEATHER],
                                     temperature=0, max_output_tokens=20)
        # the same conversation spelled out as input items, without the store
        items = [{"role": "user", "content": q}, {"type": "function_call", "call_id": calls[0].call_id,
                                                  "name": "get_weather", "arguments": calls[0].arguments}, out]
        r3 = client.responses.create(model="smollm2", input=items, tools=[R_WEATHER], temperature=0,
                                     max_output_tokens=20)
        hist = [{"role": "user", "content": q}, {"role": "assistant", "content": "", "tool_calls": [
            {"id": calls[0].call_id, "type": "function", "function": {"name": "get_weather",
                                                                       "arguments": calls[0].arguments}}]},
            {"role": "tool", "tool_call_id": calls[0].call_id, "content": out["output"]}]
        st, tk = cj(S.url + "/tokenize", {"messages": hist, "tools": [
            {"type": "function", "function": dict(WEATHER["function"], strict=True)}]})
        check("responses: round trip: the tool result sent back (previous_response_id, or as input items) is "
              "answered; the prompt is the chat history's token for token",
              r2.status in ("completed", "incomplete") and r2.output and r3.output_text == r2.output_text and
              st == 200 and r2.usage.input_tokens == r3.usage.input_tokens == tk["count"],
              (r2.model_dump(), r3.model_dump(), tk.get("count")))
    # required, streamed: the call's arguments arrive as function_call_arguments events
    types, args = [], ""
    with client.responses.stream(model="smollm2", input=q, tools=[R_WEATHER], tool_choice="required",
                                 temperature=0, max_output_tokens=120, parallel_tool_calls=False) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
        fin = stream.get_final_response()
    fcs = [o for o in fin.output if o.type == "function_call"]
    check("responses: stream, tool_choice required -> function_call_arguments.delta/done and one call",
          "response.function_call_arguments.done" in types and len(fcs) == 1 and fcs[0].arguments == args and
          json.loads(args).get("city") in ("Paris", "Berlin", "Rome"), (types, fin.model_dump()))
    # text.format json_schema -> structured output
    r = client.responses.create(model="smollm2", input="Describe a person as JSON.", temperature=0,
                                max_output_tokens=80,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                 "strict": True}})
    try:
        jsonschema.validate(json.loads(r.output_text), PERSON)
        valid = True
    except (ValueError, jsonschema.ValidationError) as e:
        valid = repr(e)
    check("responses: text.format json_schema -> output_text validates", valid is True, (r.output_text, valid))
    r = client.responses.create(model="smollm2", input="Give a JSON object.", temperature=0, max_output_tokens=40,
                                text={"format": {"type": "json_object"}})
    check("responses: text.format json_object -> a JSON object (or cut short)",
          r.output_text.startswith("{"), r.output_text)
    # previous_response_id: the earlier turns are in the prompt (counted against /tokenize of the chat history)
    a = client.responses.create(model="smollm2", input="My name is Zed.", instructions="Be brief.",
                                temperature=0, max_output_tokens=12)
    b = client.responses.create(model="smollm2", input="What is my name?", previous_response_id=a.id,
                                instructions="Be terse.", temperature=0, max_output_tokens=12)
    hist = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "My name is Zed."},
            {"role": "assistant", "content": a.output_text}, {"role": "user", "content": "What is my name?"}]
    st, tk = cj(S.url + "/tokenize", {"messages": hist})
    check("responses: previous_response_id -> the stored turns (not the old instructions) precede the input",
          st == 200 and b.usage.input_tokens == tk["count"] and b.previous_response_id == a.id,
          (b.usage, tk, a.output_text))
    try:
        client.responses.create(model="smollm2", input="x", previous_response_id="resp_does_not_exist")
        nf = "accepted"
    except openai.NotFoundError as e:
        nf = str(e)
    check("responses: an unknown previous_response_id -> 404 naming it", "resp_does_not_exist" in nf, nf)
    c = client.responses.create(model="smollm2", input="hi", store=False, max_output_tokens=2)
    try:
        client.responses.create(model="smollm2", input="x", previous_response_id=c.id, max_output_tokens=2)
        nf = "accepted"
    except openai.NotFoundError as e:
        nf = str(e)
    check("responses: store false -> not kept (404 later)", c.id in nf, nf)
    # Codex's request: built-in tool types beside a function, reasoning items in the input -> 200
    codex = {"model": "smollm2", "instructions": "You are a coding agent.", "max_output_tokens": 8,
             "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "ctx"}]},
                       {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
                       {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}],
                        "content": None, "encrypted_content": None},
                       {"type": "local_shell_call", "call_id": "c1", "status": "completed",
                        "action": {"type": "exec", "command": ["ls"]}}],
             "tools": [{"type": "web_search"}, {"type": "local_shell"},
                       {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                       {"type": "namespace", "name": "mcp", "tools": []}, R_WEATHER],
             "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium"},
             "store": False, "stream": True, "include": ["reasoning.encrypted_content"],
             "prompt_cache_key": "abc"}
    st, body = curl(S.url + "/v1/responses", data=codex)
    check("responses: a Codex request (web_search, local_shell, custom, namespace tools) -> 200 stream, completed",
          st == 200 and "response.completed" in body, (st, body[:400]))
    check("responses: the dropped tool types are named in one warning line",
          re.search(r"dropped \(not supported\):.*web_search.*local_shell.*custom.*namespace", S.logtext()) is not None,
          S.logtext()[-800:])
    # empty probes and bad fields: answered 4xx in the error shape, never 5xx
    for name, data, word in (("{}", {}, "input"), ("input []", {"input": []}, "input"),
                             ("input 3", {"input": 3}, "input"), ("bad item", {"input": [{"role": "robot"}]}, "role"),
                             ("image part", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
                              "input"),
                             ("text.format", {"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
                             ("max_output_tokens", {"input": "x", "max_output_tokens": 0}, "max_output_tokens")):
        st, j = cj(S.url + "/v1/responses", data)
        msg = j.get("error", {}).get("message", "") if isinstance(j, dict) else ""
        check(f"responses: {name} -> 400 naming {word}", st == 400 and word in msg + str(j["error"].get("param")),
              (st, j))
    st, body = curl(S.url + "/v1/responses", "-X", "POST")
    check("responses: an empty POST -> 400 JSON error", st == 400 and '"error"' in body, (st, body))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True, help="the SmolLM2 GGUF")
    ap.add_argument("--only", default="", help="comma-separated section names (debugging); default all")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    S = Server(a.bin, a.model, "--max-model-len", "2048", "--threads", "2", "--served-model-name", "smollm2",
               name="structured")
    try:
        for name, fn, args in (("errors", errors_section, (S,)), ("schema100", schema100_section, (S,)),
                               ("kinds", kinds_section, (S,)), ("mixed", mixed_section, (S,)),
                               ("parse", parse_section, (S,)), ("tools", tools_section, (S,)),
                               ("responses", responses_section, (S,)),
                               ("metrics", metrics_section, (S,)), ("issue47", issue47_section, (S,)), ("tp3", tp3_section, (a.bin, a.model, S.url))):
            if not only or name in only:
                section(f"structured: {name}", fn, *args)
    finally:
        rc, log = S.stop()
        check("structured: server exits 0 on SIGTERM", rc == 0, log[-2000:])
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
