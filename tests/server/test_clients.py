#!/usr/bin/env python3
"""Third-party clients, unmodified, against a real echo-serve (run by tests/server/run.sh with the
python of the clients' venv):
  guidellm  a short load run with streams: zero errors, and its TTFT request count == /metrics'
            TTFT histogram count; then a shared-prefix synthetic run (prefix_tokens=128,
            prefix_count=1): zero errors, and /metrics' prefix-cache hits == the cached_tokens it
            recorded from the responses' usage, summed
  lm-eval   local-completions on the committed tasks of tests/fixtures/lmeval (loglikelihood,
            loglikelihood_rolling, multiple_choice) with --batch_size 4; every per-sample
            loglikelihood == the engine's own logprobs of the same tokens, taken one token at a time
            on the decode path (logit_bias +100 makes the token the greedy choice; its reported
            logprob is the raw distribution's), to 1e-4; and == transformers' fp32 forward of the
            same tokens on the fixture the demo model is made of (tests/fixtures/models/realvocab)
The last line printed is "N passed, M failed".
"""
import argparse
import concurrent.futures as cf
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import (PASSED, FAILED, REPO, Server, check, cj, parse_metrics, sample,  # noqa: E402
                         section)

NAME = "echo-demo"


def run(cmd, timeout, env=None):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO,
                       env=dict(os.environ, **(env or {})))
    out = p.stdout.decode(errors="replace")
    print(f"  ({os.path.basename(cmd[0])} exited {p.returncode} after {time.time() - t0:.0f}s)")
    return p.returncode, out


def guidellm_section(S, venv_bin, model):
    out = tempfile.mkdtemp(prefix="guidellm-")
    m0 = parse_metrics(S.url)
    n = 24
    rc, log = run([os.path.join(venv_bin, "guidellm"), "run",
                   "--backend", f"kind=openai_http,target={S.url}",
                   "--profile", "kind=concurrent,streams=4",
                   "--constraint", f"kind=max_requests,count={n}",
                   "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=16",
                   "--tokenizer", f"kind=huggingface_auto,model={os.path.abspath(model)}",
                   "--output", f"kind=json,path={out}/out.json", "--disable-console-interactive"], timeout=600,
                  env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if not check("guidellm: run exits 0", rc == 0, log[-3000:]):
        return
    d = json.load(open(f"{out}/out.json"))
    met = d["benchmarks"][0]["metrics"]
    tot = met["request_totals"]
    check(f"guidellm: {n} requests, zero errors, none incomplete", tot["successful"] == n and tot["errored"] == 0 and
          tot["incomplete"] == 0, tot)
    ttft_n = met["time_to_first_token_ms"]["successful"]["count"]
    m1 = parse_metrics(S.url)

    def cnt(m):
        return sample(m, "echo:time_to_first_token_seconds", "echo:time_to_first_token_seconds_count") or 0
    check("guidellm: its TTFT request count == /metrics' TTFT histogram count", ttft_n == cnt(m1) - cnt(m0),
          (ttft_n, cnt(m1) - cnt(m0)))


def guidellm_prefix_section(S, venv_bin, model):
    """A shared-prefix synthetic workload (one 128-token system prompt for every request): runs clean, the
    server reuses the prefix, and /metrics' prefix-cache hits == the cached_tokens guidellm recorded from
    the responses' usage, summed."""
    out = tempfile.mkdtemp(prefix="guidellm-prefix-")
    hits = ("echo:prefix_cache_hits", "echo:prefix_cache_hits_total")
    h0 = sample(parse_metrics(S.url), *hits) or 0
    n = 16
    rc, log = run([os.path.join(venv_bin, "guidellm"), "run",
                   "--backend", f"kind=openai_http,target={S.url}",
                   "--profile", "kind=concurrent,streams=4",
                   "--constraint", f"kind=max_requests,count={n}",
                   "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=8,prefix_tokens=128,prefix_count=1",
                   "--tokenizer", f"kind=huggingface_auto,model={os.path.abspath(model)}",
                   "--output", f"kind=json,path={out}/out.json", "--disable-console-interactive"], timeout=600,
                  env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if not check("guidellm prefix: run exits 0", rc == 0, log[-3000:]):
        return
    b = json.load(open(f"{out}/out.json"))["benchmarks"][0]
    tot = b["metrics"]["request_totals"]
    check(f"guidellm prefix: {n} requests, zero errors, none incomplete", tot["successful"] == n and
          tot["errored"] == 0 and tot["incomplete"] == 0, tot)
    cached = [r.get("cached_tokens") or 0 for r in b["requests"]["successful"]]
    dh = (sample(parse_metrics(S.url), *hits) or 0) - h0
    check("guidellm prefix: the shared prefix is reused (cached_tokens > 0 in most responses)",
          sum(c > 0 for c in cached) >= n - 4, cached)
    check("guidellm prefix: /metrics prefix_cache_hits_total grew by the cached_tokens summed over its responses",
          dh == sum(cached), (dh, sum(cached)))


def forced_logprob(url, prefix, tok):
    st, j = cj(url + "/v1/completions", {"prompt": prefix, "max_tokens": 1, "temperature": 0, "logprobs": 0,
                                         "logit_bias": {str(tok): 100}})
    lp = j["choices"][0]["logprobs"]
    return lp["token_logprobs"][0], lp["tokens"][0]


def hf_loglikelihoods(jobs):
    """transformers' own forward (bf16 weights upcast to fp32, eager attention: how the fixture's
    reference.bin was made) over the same token windows."""
    import torch
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(REPO, "tests/fixtures/models/realvocab"),
                                                          dtype=torch.float32, attn_implementation="eager")
    m.eval()
    out = []
    with torch.no_grad():
        for _, _, wins in jobs:
            tot = 0.0
            for ctx, cont in wins:
                seq = list(ctx) + list(cont)
                lp = torch.log_softmax(m(torch.tensor([seq])).logits[0].double(), -1)
                tot += sum(lp[len(ctx) + j - 1, cont[j]].item() for j in range(len(cont)))
            out.append(tot)
    return out


def lmeval_section(S, venv_bin, model):
    out = tempfile.mkdtemp(prefix="lmeval-")
    margs = (f"model={NAME},base_url={S.url}/v1/completions,tokenizer={os.path.abspath(model)},"
             f"tokenizer_backend=huggingface,num_concurrent=2,max_retries=1,max_length=200")
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    rc, log = run([os.path.join(venv_bin, "lm_eval"), "--model", "local-completions", "--model_args", margs,
                   "--tasks", "echo_ll,echo_rolling,echo_mc", "--include_path", "tests/fixtures/lmeval",
                   "--batch_size", "4", "--log_samples", "--output_path", out], timeout=900, env=env)
    if not check("lm-eval: local-completions runs loglikelihood, loglikelihood_rolling and multiple_choice tasks "
                 "at --batch_size 4", rc == 0, log[-3000:]):
        return
    os.environ.update(env)
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval import utils as lu
    lm = LocalCompletionsAPI(model=NAME, base_url=S.url + "/v1/completions", tokenizer=os.path.abspath(model),
                             tokenizer_backend="huggingface", max_length=200)
    samples = {}
    for task in ("echo_ll", "echo_rolling", "echo_mc"):
        f = glob.glob(f"{out}/**/samples_{task}_*.jsonl", recursive=True)
        samples[task] = [json.loads(l) for l in open(f[0])] if f else []
    # (task, doc, what lm-eval reported, token pairs (context ids, continuation ids) it scored)
    jobs = []
    for s in samples["echo_ll"] + samples["echo_mc"]:
        args = s["arguments"]
        for k in sorted(args, key=lambda x: int(x.split("_")[-1])):
            ctx, cont = args[k]["arg_0"], args[k]["arg_1"]
            i = int(k.split("_")[-1])
            got = float(s["resps"][i][0][0])
            jobs.append((s["doc_id"], got, [lm._encode_pair(ctx, cont)]))
    for s in samples["echo_rolling"]:
        text = s["arguments"]["gen_args_0"]["arg_0"]
        wins = list(map(lu.make_disjoint_window, lu.get_rolling_token_windows(
            token_list=lm.tok_encode(text), prefix_token=lm.prefix_token_id, max_seq_len=lm.max_length,
            context_len=1)))
        jobs.append((s["doc_id"], float(s["resps"][0][0]), wins))
    check("lm-eval: samples of every task logged (6 + 3 + 5 docs)", [len(samples[t]) for t in
          ("echo_ll", "echo_rolling", "echo_mc")] == [6, 3, 5], {t: len(v) for t, v in samples.items()})

    def expected(job):
        _, got, wins = job
        total = 0.0
        for ctx, cont in wins:
            seq = list(ctx) + list(cont)
            for j in range(len(cont)):
                lp, _ = forced_logprob(S.url, seq[:len(ctx) + j], cont[j])
                total += lp
        return got, total, sum(len(c) for _, c in wins)
    with cf.ThreadPoolExecutor(4) as ex:
        res = list(ex.map(expected, jobs))
    worst = max(abs(g - e) for g, e, _ in res) if res else 1
    ntok = sum(n for _, _, n in res)
    check(f"lm-eval: {len(res)} per-sample loglikelihoods ({ntok} tokens) == the engine's decode-path logprobs "
          f"(max diff {worst:.2e})", len(res) == 6 + 16 + 3 and worst < 1e-4,
          [r for r in res if abs(r[0] - r[1]) >= 1e-4][:5])
    hf = hf_loglikelihoods(jobs)
    worst = max(abs(g - h) for (_, g, _), h in zip(jobs, hf))
    check(f"lm-eval: the {len(hf)} per-sample loglikelihoods == transformers' fp32 forward on the fixture "
          f"(max diff {worst:.2e})", len(hf) == len(jobs) and worst < 1e-4,
          [(g, h) for (_, g, _), h in zip(jobs, hf) if abs(g - h) >= 1e-4][:5])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--venv-bin", required=True)
    a = ap.parse_args()
    t0 = time.time()
    S = Server(a.bin, a.model, "--served-model-name", NAME, "--max-model-len", "512", "--max-num-seqs", "8",
               name="clients")
    try:
        section("guidellm", guidellm_section, S, a.venv_bin, a.model)
        section("guidellm shared prefix", guidellm_prefix_section, S, a.venv_bin, a.model)
        section("lm-eval", lmeval_section, S, a.venv_bin, a.model)
    finally:
        rc, log = S.stop()
    check("clients server: SIGTERM -> exit 0", rc == 0, (rc, log[-2000:]))
    print(f"(client tests took {time.time() - t0:.0f}s)")
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
