#!/usr/bin/env python3
"""Speculative decoding in echo-serve (docs/speculative.md) on the trained model
(SmolLM2-135M-Instruct GGUF): a server with --speculative ngram against one without,
same flags otherwise, the exact all-reduce when --tp > 1.
  equal     the prompts of scripts/spec_prompts.py (code edits, quotes, prose, JSON-schema
            answers, tool calls; --n per kind, 5 kinds), greedy, 4 at a time (batches mix
            sequences with and without drafts): content, tool calls, finish reason, completion
            tokens and every token of the logprobs equal; schema answers validate
  rollback  a stop string met inside a draft, max_tokens reached inside a draft, answers that
            end at EOS, the same prompt again from the prefix cache: the same answers as
            without speculation; seeded sampling gives the same text twice
  metrics   echo:spec_decode_* counters (accepted <= drafted, > 0), the config line, and
            timings.speculative per response (absent without speculation)
  gate      a third server with --spec-max-batch 1: two choices decoding side by side get no
            draft, one request alone does, and its answer is the plain server's
--launch "mpirun -np 3 ..." runs both servers under it (ranks as processes), every all-reduce
one-shot (rank-order sums: rows that do not depend on the batch, as on threads).
The last line printed is "N passed, M failed".
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import PASSED, FAILED, check, cj, parse_metrics, request, sample, section  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Srv:
    def __init__(self, launch, binary, model, extra, name):
        self.log = tempfile.NamedTemporaryFile(prefix=f"echo-spec-{name}-", suffix=".log", delete=False)
        self.args = [*launch, binary, "--model", model, "--port", "0", "--device", "cpu", "--threads", "1",
                     "--act-quant", "none", "--log-level", "info", *extra]
        self.p = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline, self.url = time.time() + 300, None
        while time.time() < deadline and not self.url:
            m = re.search(r"listening on http://[^:]+:(\d+)", self.text())
            if m:
                self.url = f"http://127.0.0.1:{m.group(1)}"
            elif self.p.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.text()}")
            time.sleep(0.1)
        while time.time() < deadline:
            try:
                if request("GET", self.url + "/health", timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server never became ready:\n{self.text()}")

    def text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


def prompts(n):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "spec_prompts.py"), "--n", str(n)],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines()]


def ask(url, p, **kw):
    body = {"messages": p["messages"], "max_tokens": 48, "temperature": 0, "logprobs": True, **kw}
    for k in ("response_format", "tools", "tool_choice"):
        if k in p:
            body[k] = p[k]
    st, j = cj(url + "/v1/chat/completions", body, timeout=900)
    return st, j


def shape(st, j):
    """What must be equal: status, message (tool call ids dropped), finish, tokens, logprob tokens."""
    if st != 200:
        return (st, j)
    c = j["choices"][0]
    msg = dict(c["message"])
    msg["tool_calls"] = [{k: v for k, v in t.items() if k != "id"} for t in msg.get("tool_calls") or []]
    lp = [t["token"] for t in ((c.get("logprobs") or {}).get("content") or [])]
    return (st, json.dumps(msg, sort_keys=True), c["finish_reason"], j["usage"]["completion_tokens"], lp)


def run_all(url, ps, **kw):
    with cf.ThreadPoolExecutor(4) as ex:
        return list(ex.map(lambda p: ask(url, p, **kw), ps))


def equal_section(A, B, ps, state):
    import jsonschema
    ra, rb = run_all(A.url, ps), run_all(B.url, ps)
    state["ra"] = ra
    kinds = {}
    for p, a, b in zip(ps, ra, rb):
        same = shape(*a) == shape(*b)
        k = kinds.setdefault(p["kind"], [0, 0])
        k[0] += same
        k[1] += 1
        if not same:
            print(f"    differs: {p['kind']} #{p['id']}:\n      off {shape(*a)}\n      on  {shape(*b)}")
    for kind, (ok, n) in kinds.items():
        check(f"equal: {kind}: {ok}/{n} greedy answers token for token", ok == n)
    check(f"equal: {len(ps)} prompts (>= 50)", len(ps) >= 50)
    bad = 0
    for p, (st, j) in zip(ps, rb):
        if p["kind"] == "schema":
            try:
                jsonschema.validate(json.loads(j["choices"][0]["message"]["content"]),
                                    p["response_format"]["json_schema"]["schema"])
            except Exception:
                bad += j["choices"][0]["finish_reason"] != "length"  # a cut answer cannot validate
        if p["kind"] == "tool":
            calls = j["choices"][0]["message"].get("tool_calls") or []
            bad += not (calls and calls[0]["function"]["name"] == "get_weather")
    check("equal: schema answers validate, tool calls name the tool", bad == 0, bad)
    acc = sum(j["timings"]["speculative"]["accepted_tokens"] for st, j in rb if st == 200)
    check(f"equal: drafts were accepted ({acc} tokens)", acc > 0)


def rollback_section(A, B, ps, state):
    rep = [p for p in ps if p["kind"] in ("code", "quote")]
    ra = state.get("ra") or run_all(A.url, ps)
    # stop strings inside a draft: a piece of the answer's middle (a draft covers it when accepted)
    n_stop = 0
    for p in rep[:8]:
        st, j = ra[ps.index(p)]
        toks = [t["token"] for t in j["choices"][0]["logprobs"]["content"]]
        if len(toks) < 30:
            continue
        stop = "".join(toks[20:22])
        if not stop.strip():
            continue
        a, b = ask(A.url, p, stop=[stop]), ask(B.url, p, stop=[stop])
        n_stop += 1
        check(f"rollback: stop {stop!r} inside the answer of #{p['id']}: equal", shape(*a) == shape(*b),
              (shape(*a), shape(*b)))
    check("rollback: stop-string cases ran", n_stop >= 3, n_stop)
    # max_tokens inside a draft
    for p in rep[:4]:
        for m in (5, 9, 14, 23):
            a, b = ask(A.url, p, max_tokens=m), ask(B.url, p, max_tokens=m)
            ok = shape(*a) == shape(*b) and b[1]["usage"]["completion_tokens"] == m
            check(f"rollback: max_tokens {m} on #{p['id']}: equal, {m} tokens", ok, (shape(*a), shape(*b)))
    # answers that end at EOS: longer budget, at least some end with "stop"
    ends = 0
    for p in rep[:6]:
        a, b = ask(A.url, p, max_tokens=200), ask(B.url, p, max_tokens=200)
        check(f"rollback: #{p['id']} to EOS or 200 tokens: equal", shape(*a) == shape(*b))
        ends += a[0] == 200 and a[1]["choices"][0]["finish_reason"] == "stop"
    check(f"rollback: answers ending at EOS ({ends})", ends >= 1, ends)
    # the prefix cache: the same prompt again is served from cached blocks, same answer
    p = rep[0]
    b1, b2 = ask(B.url, p), ask(B.url, p)
    check("rollback: again from the prefix cache: cached tokens, same answer",
          b2[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and shape(*b1) == shape(*b2) and
          shape(*b1) == shape(*ra[ps.index(p)]))
    # seeded sampling with drafts: reproducible
    s1 = ask(B.url, rep[1], temperature=0.8, seed=7)
    s2 = ask(B.url, rep[1], temperature=0.8, seed=7)
    check("rollback: seeded sampling with drafts gives the same text twice", shape(*s1) == shape(*s2))


def metrics_section(A, B, ps, state):
    fa, fb = parse_metrics(A.url), parse_metrics(B.url)
    d = sample(fb, "echo:spec_decode_num_draft_tokens", "echo:spec_decode_num_draft_tokens_total")
    a = sample(fb, "echo:spec_decode_num_accepted_tokens", "echo:spec_decode_num_accepted_tokens_total")
    n = sample(fb, "echo:spec_decode_num_drafts", "echo:spec_decode_num_drafts_total")
    rate = sample(fb, "echo:spec_decode_acceptance_rate", "echo:spec_decode_acceptance_rate")
    check("metrics: drafts, draft tokens, accepted > 0, accepted <= drafted", n and d and a and 0 < a <= d, (n, d, a))
    check("metrics: acceptance rate = accepted / drafted", rate is not None and abs(rate - a / d) < 1e-6, rate)
    h = sample(fb, "echo:spec_decode_accepted_tokens_per_step", "echo:spec_decode_accepted_tokens_per_step_sum")
    hc = sample(fb, "echo:spec_decode_accepted_tokens_per_step", "echo:spec_decode_accepted_tokens_per_step_count")
    check("metrics: accepted-per-step histogram sums to the counter", h == a and hc == n, (h, hc))
    check("metrics: config line says ngram / none",
          sample(fb, "echo:spec_decode_config_info", "echo:spec_decode_config_info", method="ngram") == 1 and
          sample(fa, "echo:spec_decode_config_info", "echo:spec_decode_config_info", method="none") == 1)
    check("metrics: no drafts without speculation",
          sample(fa, "echo:spec_decode_num_drafts", "echo:spec_decode_num_drafts_total") == 0)
    st, j = ask(B.url, ps[0], max_tokens=8)
    st2, j2 = ask(A.url, ps[0], max_tokens=8)
    sp = j["timings"].get("speculative") or {}
    check("timings.speculative on, absent off",
          set(sp) == {"draft_steps", "draft_tokens", "accepted_tokens", "acceptance_rate"} and
          "speculative" not in j2["timings"], (j["timings"], j2["timings"]))


def gate_section(A, B, ps, state):
    """--spec-max-batch 1: two choices of one request decode side by side and get no draft; one alone
    drafts. The answers equal the plain server's either way."""
    C = Srv(state["launch"], state["bin"], state["model"], state["extra"] + ["--speculative", "ngram",
                                                                             "--spec-max-batch", "1"], "gate")
    try:
        drafts = lambda: sample(parse_metrics(C.url), "echo:spec_decode_num_drafts", "echo:spec_decode_num_drafts_total")
        p = next(q for q in ps if q["kind"] == "quote")
        d0 = drafts()
        st, j = ask(C.url, p, n=2, max_tokens=24, ignore_eos=True)
        d1 = drafts()
        check("gate: n=2 under --spec-max-batch 1 -> no draft", st == 200 and d0 == 0 and d1 == 0, (st, d0, d1))
        st1, j1 = ask(C.url, p, max_tokens=24, ignore_eos=True)
        d2 = drafts()
        check("gate: one request alone under --spec-max-batch 1 drafts", st1 == 200 and d2 and d2 > 0, (st1, d2))
        sa, ja = ask(A.url, p, max_tokens=24, ignore_eos=True)
        check("gate: its answer equals the plain server's", shape(st1, j1) == shape(sa, ja))
        check("gate: the start-up log names --spec-max-batch", "at most 1 requests decode" in C.text())
    finally:
        C.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=10, help="prompts per kind (5 kinds)")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--launch", default="", help="e.g. 'mpirun -np 3 --oversubscribe'")
    ap.add_argument("--sections", default="equal,rollback,metrics,gate")
    a = ap.parse_args()
    launch = shlex.split(a.launch)
    extra = ["--tp", str(a.tp), "--allreduce", "exact"] if a.tp > 1 else []
    if a.tp > 1 and launch:
        # Under mpirun exact's two-shot is MPI_Allreduce, whose summation order follows the message
        # size, so a decode row's bits would depend on the batch (and on the drafts beside it). Every
        # call one-shot sums the ranks in rank order whatever the batch: the rows of threads.
        extra += ["--oneshot", "1073741824"]
    ps = prompts(a.n)
    A = B = None
    try:
        A = Srv(launch, a.bin, a.model, extra, "off")
        B = Srv(launch, a.bin, a.model, extra + ["--speculative", "ngram"], "on")
        state = {"launch": launch, "bin": a.bin, "model": a.model, "extra": extra}
        for name, fn in (("equal", equal_section), ("rollback", rollback_section), ("metrics", metrics_section),
                         ("gate", gate_section)):
            if name in a.sections.split(","):
                section(f"{name} (tp {a.tp}{', ' + a.launch if a.launch else ''})", fn, A, B, ps, state)
    finally:
        for s in (A, B):
            if s:
                s.stop()
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
