#!/usr/bin/env python3
"""Checks on an `echo-bench serve --save-result` file, stdlib only.

  check.py records FILE N            N records, completed + failed == N, failed == records with error
  check.py percentiles FILE          summary stats == the same definition recomputed from the records
  check.py all-ok FILE [N|max]      every record succeeded (and produced N / its max_tokens tokens)
  check.py refused FILE              some records failed with an HTTP 503, each with null timings
  check.py all-failed FILE           every record failed, with null timings

Percentiles: linear interpolation between closest ranks (numpy.percentile's
default), written out here independently of the C code. Exit 0 = pass;
otherwise the reason is printed.
"""
import json
import math
import sys


def pct(sorted_x, p):
    n = len(sorted_x)
    pos = (n - 1) * p / 100.0
    k = math.floor(pos)
    if k >= n - 1:
        return sorted_x[-1]
    return sorted_x[k] + (sorted_x[k + 1] - sorted_x[k]) * (pos - k)


def close(a, b):
    return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))


def fail(msg):
    print("check.py:", msg)
    sys.exit(1)


def main():
    what, path = sys.argv[1], sys.argv[2]
    d = json.load(open(path))
    s, reqs = d["summary"], d["requests"]
    bad = [r for r in reqs if r["error"] is not None]
    good = [r for r in reqs if r["error"] is None]
    if what == "records":
        n = int(sys.argv[3])
        if len(reqs) != n:
            fail(f"{len(reqs)} records, expected {n}")
        if s["completed"] + s["failed"] != n or s["failed"] != len(bad) or s["completed"] != len(good):
            fail(f"completed {s['completed']} failed {s['failed']} vs records {len(good)} ok / {len(bad)} errors")
        if [r["index"] for r in reqs] != list(range(n)):
            fail("record indices are not 0..N-1")
    elif what == "percentiles":
        if not good:
            fail("no successful records")
        series = {
            "ttft": [r["ttft_ms"] for r in good],
            "e2el": [r["e2e_ms"] for r in good],
            "tpot": [r["tpot_ms"] for r in good if r["tpot_ms"] is not None],
            "itl": [x for r in good for x in r["itl_ms"]],
        }
        checked = 0
        for name, xs in series.items():
            xs = sorted(xs)
            if not xs:
                continue
            mean = sum(xs) / len(xs)
            want = {
                "mean": mean, "median": pct(xs, 50), "p90": pct(xs, 90), "p95": pct(xs, 95), "p99": pct(xs, 99),
                "min": xs[0], "max": xs[-1], "std": math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)),
            }
            for k, v in want.items():
                got = s[f"{k}_{name}_ms"]
                if not close(got, v):
                    fail(f"{k}_{name}_ms = {got}, recomputed {v}")
                checked += 1
        tin = sum(r["prompt_tokens"] for r in good)
        tout = sum(r["output_tokens"] for r in good)
        if s["total_input_tokens"] != tin or s["total_output_tokens"] != tout:
            fail(f"token totals {s['total_input_tokens']}/{s['total_output_tokens']} vs records {tin}/{tout}")
        for r in good:  # tpot definition: (e2e - ttft) / (output_tokens - 1)
            if r["output_tokens"] > 1 and not close(r["tpot_ms"], (r["e2e_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1)):
                fail(f"record {r['index']}: tpot_ms {r['tpot_ms']} disagrees with its e2e/ttft")
            if not 0 < r["ttft_ms"] <= r["e2e_ms"]:
                fail(f"record {r['index']}: ttft {r['ttft_ms']} not in (0, e2e {r['e2e_ms']}]")
        print(f"check.py: {checked} summary statistics match the recomputation")
    elif what == "all-ok":
        if bad:
            fail(f"{len(bad)} failed, first: {bad[0]['error']}")
        if len(sys.argv) > 3:  # a count, or "max": each record's own max_tokens (--ignore-eos runs)
            for r in good:
                want = r["max_tokens"] if sys.argv[3] == "max" else int(sys.argv[3])
                if r["output_tokens"] != want:
                    fail(f"record {r['index']} has {r['output_tokens']} output tokens, expected {want}")
    elif what in ("refused", "all-failed"):
        if what == "refused" and (not bad or not good):
            fail(f"expected both refused and served requests, got {len(good)} ok / {len(bad)} failed")
        if what == "all-failed" and good:
            fail(f"{len(good)} requests succeeded, expected none")
        for r in bad:
            if any(r[k] is not None for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")):
                fail(f"failed record {r['index']} has timings: {r}")
            if what == "refused" and "HTTP 503" not in r["error"]:
                fail(f"record {r['index']}: error {r['error']!r} is not an HTTP 503")
        print(f"check.py: {len(bad)} failed with null timings ({bad[0]['error'][:70]}), {len(good)} ok")
    else:
        fail(f"unknown check {what}")


if __name__ == "__main__":
    main()
