#!/usr/bin/env python3
"""Batch-1 decode tok/s with and without --speculative ngram (docs/speculative.md), with
echo-generate, side by side: per prompt of scripts/spec_prompts.py, one run off then one on
(interleaved pairs), greedy; decode tok/s after the first token (echo-generate --json's
timing), summed per kind as tokens / seconds; the tokens of each pair are compared.
  scripts/spec_bench.py [--kinds code,quote,prose] [--n 10] [--max-tokens 64] [--tp N]
                        [--launch 'mpirun -np 3'] [--gen bin/echo-generate] [-- EXTRA FLAGS]
Run it under `flock /work/cpu.lock` on a shared machine; in the per-host lab:
  scripts/hostlab.sh --hosts 3 --rate 1gbit -- scripts/spec_bench.py --tp 3 --launch 'mpirun -np 3'
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="code,quote,prose")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--launch", default="")
    ap.add_argument("--gen", default=os.path.join(ROOT, "bin", "echo-generate"))
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "spec_prompts.py"), "--kinds", a.kinds,
                          "--n", str(a.n)], check=True, capture_output=True, text=True).stdout
    ps = [json.loads(l) for l in out.splitlines()]
    base = [*shlex.split(a.launch), a.gen, "--model", a.model, "--chat", "--max-tokens", str(a.max_tokens), "--json",
            "--tp", str(a.tp), *a.extra]
    if a.tp > 1 and "--allreduce" not in a.extra:
        base += ["--allreduce", "exact"]
    agg = {}
    for p in ps:
        text = "\n\n".join(m["content"] for m in p["messages"])
        res = {}
        for mode in ("none", "ngram"):
            r = subprocess.run(base + ["--timing", "--prompt", text, "--speculative", mode], capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"echo-generate failed ({mode}, prompt {p['id']}):\n{r.stderr[-2000:]}")
            res[mode] = json.loads(r.stdout)
        k = agg.setdefault(p["kind"], {"n": 0, "same": 0, "tok": {"none": 0, "ngram": 0},
                                       "sec": {"none": 0.0, "ngram": 0.0}, "drafted": 0, "accepted": 0, "steps": 0})
        k["n"] += 1
        k["same"] += res["none"]["tokens"] == res["ngram"]["tokens"]
        for mode in ("none", "ngram"):
            t = res[mode]["timing"]
            k["tok"][mode] += len(res[mode]["tokens"]) - 1
            k["sec"][mode] += t["decode_s"]
        s = res["ngram"]["speculative"]
        k["drafted"] += s["drafted"]
        k["accepted"] += s["accepted"]
        k["steps"] += s["steps"]
        print(f"  {p['kind']:6s} #{p['id']:3d}: off {res['none']['timing']['decode_tok_s']:7.1f} tok/s, on "
              f"{res['ngram']['timing']['decode_tok_s']:7.1f} tok/s, accepted {s['accepted']}/{s['drafted']}",
              flush=True)
    print(f"{'kind':6s} {'prompts':>7s} {'same':>5s} {'off tok/s':>10s} {'on tok/s':>10s} {'ratio':>6s} "
          f"{'accept':>7s} {'tok/step':>8s}")
    for kind, k in agg.items():
        off = k["tok"]["none"] / k["sec"]["none"]
        on = k["tok"]["ngram"] / k["sec"]["ngram"]
        acc = k["accepted"] / k["drafted"] if k["drafted"] else 0
        tps = k["tok"]["ngram"] / k["steps"] if k["steps"] else 0
        print(f"{kind:6s} {k['n']:7d} {k['same']:5d} {off:10.1f} {on:10.1f} {on / off:6.2f} {acc:7.2f} {tps:8.2f}")


if __name__ == "__main__":
    main()
