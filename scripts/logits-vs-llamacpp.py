#!/usr/bin/env python3
"""echo's first-step top-k logprobs and greedy tokens against llama.cpp's own
on the same GGUF file (llama-server's /completion, n_probs), for the
trained-model fixture's prompts (tests/fixtures/smollm2/reference.json) and
a few chat prompts, with echo's integer path (--act-quant auto, the default)
and its exact path (--act-quant none). docs/accuracy.md, "8-bit activations
against llama.cpp".

  scripts/logits-vs-llamacpp.py [--model FILE.gguf] [--llama-bin DIR] [--bin DIR]
"""
import argparse, json, math, os, socket, subprocess, sys, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="build/models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--llama-bin", default="build/llamacpp/build/bin")
ap.add_argument("--bin", default="bin")
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--llama-args", default="", help="extra llama-server flags, e.g. '-ctk f32 -ctv f32'")
a = ap.parse_args()

ref = json.load(open("tests/fixtures/smollm2/reference.json"))["cases"]
prompts = [c["prompt_ids"] for c in ref]

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

port = free_port()
srv = subprocess.Popen([os.path.join(a.llama_bin, "llama-server"), "-m", a.model, "-t", str(a.threads), "--port",
                        str(port), "-c", "2048", "-np", "1"] + a.llama_args.split(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read(); break
        except Exception:
            time.sleep(0.5)
    def llama(ids):
        body = {"prompt": ids, "n_predict": a.tokens, "temperature": 0, "n_probs": 5, "cache_prompt": False,
                "ignore_eos": True, "post_sampling_probs": False, "samplers": ["top_k"], "top_k": 1}
        r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                   json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=600)
        d = json.loads(r.read())
        cp = d["completion_probabilities"]
        toks = [s["id"] for s in cp]
        top = [(t["id"], t["logprob"]) for t in cp[0]["top_logprobs"]]
        return toks, top
    def echo(ids, act):
        out = subprocess.run([os.path.join(a.bin, "echo-generate"), "--model", a.model, "--prompt-tokens",
                              ",".join(map(str, ids)), "--max-tokens", str(a.tokens), "--temperature", "0",
                              "--top-logprobs", "5", "--ignore-eos", "--json", "--threads", str(a.threads),
                              "--act-quant", act], capture_output=True, text=True, check=True).stdout
        d = json.loads(out)
        return d["tokens"], [tuple(x) for x in d["steps"][0]["top_logprobs"]]
    worst = {"auto": 0.0, "none": 0.0}
    for i, ids in enumerate(prompts):
        lt, ltop = llama(ids)
        hf = ref[i]["greedy"][:a.tokens]
        print(f"   llama.cpp greedy = HF transformers' (reference.json) for "
              f"{next((k for k in range(len(hf)) if hf[k] != lt[k]), len(hf))}/{len(hf)} tokens")
        for act in ("auto", "none"):
            et, etop = echo(ids, act)
            print(f"   echo --act-quant {act}: greedy = HF's for "
                  f"{next((k for k in range(len(hf)) if hf[k] != et[k]), len(hf))}/{len(hf)}; "
                  f"top-5 {[(t, round(lp, 4)) for t, lp in etop]}")
            lmap = dict(ltop)
            d = max(abs(lp - lmap[t]) for t, lp in etop if t in lmap)
            same_top = [t for t, _ in etop] == [t for t, _ in ltop]
            first = next((k for k in range(len(et)) if et[k] != lt[k]), len(et))
            worst[act] = max(worst[act], d)
            print(f"prompt {i} ({len(ids)} tokens), echo --act-quant {act}: first-step top-5 max |dlogprob| vs "
                  f"llama.cpp {d:.4f}, same top-5 order {same_top}, greedy equal for {first}/{len(et)} tokens")
        print(f"   llama.cpp top-5 {[(t, round(lp, 4)) for t, lp in ltop]}")
    print(json.dumps({"worst_first_step_top5_dlogprob": worst}))
finally:
    srv.terminate(); srv.wait()
