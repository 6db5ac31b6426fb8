#!/usr/bin/env python3
"""Prompts for speculative decoding (docs/speculative.md), generated from a seed so
every run gets the same ones; one JSON object per line on stdout:
  {"kind": K, "id": N, "messages": [...], optional "response_format" / "tools" / "tool_choice"}
Kinds:
  code     editing code given in the prompt (rename, add a line, change a value: the answer
           copies most of the code back)                                     -- repetitive
  quote    a long context (a made-up report) and a question answered by quoting it
                                                                            -- repetitive
  prose    open questions and stories with nothing to copy                  -- held-out prose
  schema   a JSON schema answer (response_format json_schema)               -- structured
  tool     a tool call (tools + tool_choice)                                 -- structured
usage: scripts/spec_prompts.py [--kinds code,quote,prose,schema,tool] [--n N per kind] [--seed S]
                               [--bench OUTPUT_LEN]
--bench: echo-bench serve's jsonl instead ({"prompt": the messages' text, "output_len": M}; for
--endpoint /v1/chat/completions, which sends it as one user message).
"""
import argparse
import json
import random

NOUNS = ["order", "invoice", "user", "sensor", "packet", "ticket", "record", "account", "job", "item",
         "session", "device", "report", "batch", "event", "metric", "file", "queue", "price", "score"]
VERBS = ["load", "parse", "check", "update", "count", "merge", "filter", "format", "send", "store"]
CITIES = ["Paris", "Berlin", "Rome", "Madrid", "Oslo", "Vienna", "Lisbon", "Dublin", "Prague", "Athens"]
TOPICS = ["the history of tea", "why the sky is blue", "how bridges stay up", "the life of bees",
          "learning a new language", "the first airplanes", "how rain forms", "a day at the seaside",
          "the invention of paper", "why cats purr", "how volcanoes work", "a walk in the mountains",
          "the moon landing", "how bread rises", "the northern lights", "a robot who learns to paint",
          "a lighthouse keeper", "a lost umbrella", "the oldest tree in a village", "a dragon who is afraid of the dark"]


def code_snippet(rng):
    fns = []
    for _ in range(rng.randint(3, 5)):
        v, n = rng.choice(VERBS), rng.choice(NOUNS)
        a, b = rng.sample(["x", "y", "data", "items", "value", "limit", "key"], 2)
        k = rng.randint(2, 9)
        body = rng.choice([
            f"    result = []\n    for e in {a}:\n        if e > {b}:\n            result.append(e * {k})\n    return result\n",
            f"    total = 0\n    for e in {a}:\n        total += e % {k}\n    return total + {b}\n",
            f"    if {a} is None:\n        return {b}\n    return {a} + {k}\n",
            f"    out = dict({a})\n    out['{n}'] = {b}\n    return out\n",
        ])
        fns.append((f"{v}_{n}", f"def {v}_{n}({a}, {b}):\n{body}"))
    return fns


def code_prompt(rng, i):
    fns = code_snippet(rng)
    code = "\n".join(src for _, src in fns)
    old = rng.choice(fns)[0]
    new = old.split("_")[0] + "_" + rng.choice(NOUNS) + "s"
    task = rng.choice([
        f"Rename the function {old} to {new} and write out the whole code again.",
        f"Repeat the code above exactly, but add a comment line '# checked' at the top.",
        f"Rewrite the code above, keeping everything the same except that {old} is renamed to {new}.",
        "Copy the code above exactly, then explain in one sentence what the first function does.",
    ])
    return [{"role": "user", "content": f"Here is some Python code:\n\n```python\n{code}```\n\n{task}"}]


def report(rng):
    lines = []
    for c in rng.sample(CITIES, 6):
        n, m = rng.randint(10, 99), rng.choice(NOUNS)
        lines.append(f"In {c}, the team processed {n} {m}s last week and reported that the {m} queue was "
                     f"{rng.choice(['stable', 'slow', 'growing', 'empty', 'full'])} for most of the period.")
    return lines


def quote_prompt(rng, i):
    lines = report(rng)
    city = rng.choice([l.split(",")[0][3:] for l in lines])
    q = rng.choice([
        f"Quote, word for word, the sentence about {city}.",
        "Repeat the report above exactly as it is written.",
        f"Copy the sentences about the first three cities exactly, one per line.",
        f"What did the report say about {city}? Answer by quoting it exactly.",
    ])
    ctx = "\n".join(lines)
    return [{"role": "system", "content": "You answer by quoting the context exactly when asked."},
            {"role": "user", "content": f"Report:\n{ctx}\n\n{q}"}]


def prose_prompt(rng, i):
    t = TOPICS[i % len(TOPICS)]
    q = rng.choice([f"Write a short story about {t}.", f"Explain {t} to a child.",
                    f"Write a few sentences about {t}.", f"Tell me something interesting about {t}."])
    return [{"role": "user", "content": q}]


SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "city": {"type": "string", "enum": CITIES},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["name", "city", "age"], "additionalProperties": False}

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def schema_prompt(rng, i):
    c = rng.choice(CITIES)
    return [{"role": "user", "content": f"Describe a person called {rng.choice(['Ann', 'Bob', 'Eve', 'Ivan'])} "
                                        f"from {c}, age {rng.randint(18, 80)}, as JSON."}]


def tool_prompt(rng, i):
    return [{"role": "user", "content": f"What is the weather like in {rng.choice(CITIES)} today, in "
                                        f"{rng.choice(['celsius', 'fahrenheit'])}?"}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="code,quote,prose,schema,tool")
    ap.add_argument("--n", type=int, default=10, help="prompts per kind")
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--bench", type=int, default=0, metavar="OUTPUT_LEN")
    a = ap.parse_args()
    makers = {"code": code_prompt, "quote": quote_prompt, "prose": prose_prompt, "schema": schema_prompt,
              "tool": tool_prompt}
    k = 0
    for kind in a.kinds.split(","):
        rng = random.Random(f"{a.seed}-{kind}")
        for i in range(a.n):
            o = {"kind": kind, "id": k, "messages": makers[kind](rng, i)}
            if kind == "schema":
                o["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
            if kind == "tool":
                o["tools"] = [TOOL]
                o["tool_choice"] = rng.choice(["required", {"type": "function", "function": {"name": "get_weather"}}])
            if a.bench:
                o = {"prompt": "\n\n".join(m["content"] for m in o["messages"]), "output_len": a.bench}
            print(json.dumps(o))
            k += 1


if __name__ == "__main__":
    main()
