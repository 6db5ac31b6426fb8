#!/usr/bin/env python3
"""Decode speed with and without a JSON schema (docs/structured-outputs.md, "Cost").

Starts bin/echo-serve on the given model and runs, for batch 1 and batch B (concurrent
requests), free text (ignore_eos, max_tokens N) and schema-constrained text (an array of
exactly K enum strings: about as many tokens). Reports per batch and mode the decode time per
token of each sequence (the response's timings: decode_ms / (tokens - 1)) and the aggregate
decode rate (sum of tokens / wall time), medians over rounds, plus /metrics' mask time per
token. Run it under `flock /work/cpu.lock` on a shared machine and note the load.
  scripts/bench-structured.py --bin bin/echo-serve --model build/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
from test_server import Server, cj, parse_metrics, sample  # noqa: E402

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "minItems": 30, "maxItems": 30, "items": {
    "type": "string", "enum": ["alpha", "beta", "gamma", "delta"]}}}, "required": ["items"],
    "additionalProperties": False}


def one(url, mode, n_tok, i):
    body = {"messages": [{"role": "user", "content": f"List some Greek letters ({i})."}], "temperature": 0}
    if mode == "free":
        body.update(max_tokens=n_tok, ignore_eos=True)
    else:
        body.update(max_tokens=4 * n_tok, response_format={"type": "json_schema", "json_schema": {
            "name": "letters", "schema": SCHEMA}})
    st, j = cj(url + "/v1/chat/completions", body, timeout=600)
    assert st == 200, j
    if mode == "schema":
        json.loads(j["choices"][0]["message"]["content"])  # the schema held
    n = j["usage"]["completion_tokens"]
    return n, j["timings"]["decode_ms"] / max(n - 1, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/echo-serve")
    ap.add_argument("--model", default="build/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    S = Server(a.bin, a.model, "--threads", a.threads, "--max-model-len", "2048", "--max-num-seqs", str(a.batch),
               name="bench-structured")
    rows = []
    try:
        one(S.url, "schema", a.tokens, 0)  # compile the grammar and build the vocabulary once, untimed
        for batch in (1, a.batch):
            for mode in ("free", "schema"):
                per_tok, rates, toks = [], [], []
                for r in range(a.rounds):
                    t0 = time.time()
                    with cf.ThreadPoolExecutor(batch) as ex:
                        res = list(ex.map(lambda i: one(S.url, mode, a.tokens, i), range(batch)))
                    wall = time.time() - t0
                    per_tok.append(statistics.mean(ms for _, ms in res))
                    rates.append(sum(n for n, _ in res) / wall)
                    toks.append(statistics.mean(n for n, _ in res))
                rows.append((batch, mode, statistics.median(toks), statistics.median(per_tok),
                             statistics.median(rates)))
        m = parse_metrics(S.url)
        mc = sample(m, "echo:grammar_mask_seconds", "echo:grammar_mask_seconds_count") or 0
        ms = sample(m, "echo:grammar_mask_seconds", "echo:grammar_mask_seconds_sum") or 0
    finally:
        S.stop()
    print(f"load average at the end: {open('/proc/loadavg').read().split()[:3]}")
    print("| batch | mode | tokens/seq | decode ms/token (per seq) | aggregate tok/s |")
    print("|---|---|---|---|---|")
    for b, mode, n, pt, rate in rows:
        print(f"| {b} | {mode} | {n:.0f} | {pt:.1f} | {rate:.1f} |")
    for b in sorted({r[0] for r in rows}):
        f = [r for r in rows if r[0] == b and r[1] == "free"][0]
        s = [r for r in rows if r[0] == b and r[1] == "schema"][0]
        print(f"batch {b}: schema / free decode time per token = {s[3] / f[3]:.3f}")
    if mc:
        print(f"mask time per constrained token (/metrics): {1e6 * ms / mc:.1f} us over {int(mc)} tokens")


if __name__ == "__main__":
    main()
