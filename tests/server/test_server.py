#!/usr/bin/env python3
"""echo-serve end-to-end tests: real server processes on loopback, real curl,
the official openai client, prometheus_client's parser, and hostile traffic.

Run through tests/server/run.sh (which installs the clients). Sections:
  curl        every endpoint, field and error code, streaming included
  openai      the openai package, unmodified: completions and chat, stream or not
  concurrency 32 simultaneous streams == the same requests run alone (greedy)
  metrics     /metrics through prometheus_client; histogram counts == requests
  servers     --api-key (401), queue limit (503), loading (503), tp 2, SIGTERM
  abuse       >= 1000 malformed/hostile requests, slowloris, 100 disconnects
The last line printed is "N passed, M failed".
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

PASSED, FAILED = [], []
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check(name, cond, detail=""):
    if cond:
        PASSED.append(name)
        print(f"  ok    {name}")
    else:
        FAILED.append(name)
        print(f"  FAIL  {name} {detail}")
    return cond


def section(name, fn, *args):
    print(f"== {name}")
    try:
        fn(*args)
    except Exception as e:  # a crashed section is one failure, the rest still runs
        traceback.print_exc()
        check(f"{name}: section ran to the end", False, repr(e))


# ---------------------------------------------------------------- server process

class Server:
    def __init__(self, binary, model, *extra, name="srv", wait_ready=True):
        self.log = tempfile.NamedTemporaryFile(prefix=f"echo-serve-{name}-", suffix=".log", delete=False)
        # fp32 KV unless a test names another: the sections below compare against transformers' fp32 logits
        # and against each other bit for bit (the oracle path); kv_section runs the default (bf16)
        kv = [] if "--kv-cache-dtype" in extra else ["--kv-cache-dtype", "fp32"]
        args = [binary, "--model", model, "--port", "0", "--device", "cpu", "--threads", "1",
                "--log-level", "info", *kv, *extra]
        self.args = args
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline and self.port is None:
            txt = self.logtext()
            m = re.search(r"listening on http://[^:]+:(\d+)", txt)
            if m:
                self.port = int(m.group(1))
                break
            if self.p.poll() is not None:
                raise RuntimeError(f"echo-serve exited early ({self.p.returncode}):\n{txt}")
            time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("echo-serve did not start listening")
        self.url = f"http://127.0.0.1:{self.port}"
        if wait_ready:
            self.wait_ready()

    def logtext(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                st, _, _ = request("GET", self.url + "/health", timeout=5)
                if st == 200:
                    return
            except OSError:
                pass
            if self.p.poll() is not None:
                raise RuntimeError(f"echo-serve exited ({self.p.returncode}):\n{self.logtext()}")
            time.sleep(0.1)
        raise RuntimeError("echo-serve never became ready")

    def stop(self, timeout=60):
        """SIGTERM; returns (exit status, log)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "hung (killed)"
        return rc, self.logtext()


# ---------------------------------------------------------------- HTTP helpers

def request(method, url, body=None, headers=None, timeout=60):
    """One HTTP request with http.client; returns (status, headers, body bytes)."""
    m = re.match(r"http://([^:/]+):(\d+)(.*)", url)
    c = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=timeout)
    h = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    c.request(method, m.group(3) or "/", body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hdrs, data


def curl(url, *args, data=None, timeout=60):
    """Run the curl binary; returns (status, body text)."""
    cmd = ["curl", "-sS", "-N", "--max-time", str(timeout), "-o", "-", "-w", "\n%{http_code}", *args]
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary",
                data if isinstance(data, str) else json.dumps(data)]
    cmd.append(url)
    out = subprocess.run(cmd, capture_output=True, timeout=timeout + 10).stdout.decode("utf-8", "replace")
    body, _, code = out.rpartition("\n")
    return int(code or 0), body


def cj(url, data=None, *args, **kw):
    st, body = curl(url, *args, data=data, **kw)
    try:
        return st, json.loads(body)
    except ValueError:
        return st, body


def sse_events(body):
    """Parse an SSE body: list of data payloads (json or the string [DONE])."""
    out = []
    for block in body.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                p = line[6:]
                out.append(p if p == "[DONE]" else json.loads(p))
    return out


def is_error_shape(j, status=None):
    if not isinstance(j, dict) or not isinstance(j.get("error"), dict):
        return False
    e = j["error"]
    ok = isinstance(e.get("message"), str) and isinstance(e.get("type"), str) and "param" in e and "code" in e
    return ok and (status is None or e["code"] == status)


# ---------------------------------------------------------------- sections

def curl_section(S, name):
    U = S.url
    st, body = curl(U + "/health")
    check("GET /health is 200 when ready", st == 200, st)
    st, j = cj(U + "/v1/models")
    check("GET /v1/models lists the served model", st == 200 and j["object"] == "list" and j["data"][0]["id"] == name, j)

    req = {"model": name, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
    st, j = cj(U + "/v1/completions", req)
    ok = st == 200 and j["object"] == "text_completion" and j["model"] == name and j["id"].startswith("cmpl-")
    check("completion: 200, text_completion object", ok, j)
    c = j["choices"][0]
    check("completion: finish_reason length at max_tokens", c["finish_reason"] in ("length", "stop"), c)
    u = j["usage"]
    check("completion: usage counts", u["completion_tokens"] <= 12 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u)
    t = j.get("timings", {})
    check("completion: timings object (queue, prefill, ttft, decode, per-token ms)",
          all(k in t for k in ("queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "per_token_ms")), t)
    greedy_text = c["text"]
    st2, j2 = cj(U + "/v1/completions", req)
    check("completion: greedy is deterministic", st2 == 200 and j2["choices"][0]["text"] == greedy_text)

    st, tk = cj(U + "/tokenize", {"model": name, "prompt": "The capital of France is"})
    check("POST /tokenize: tokens and count", st == 200 and tk["count"] == len(tk["tokens"]) == u["prompt_tokens"], tk)
    st, dt = cj(U + "/detokenize", {"model": name, "tokens": tk["tokens"]})
    check("POST /detokenize round-trips", st == 200 and dt["prompt"] == "The capital of France is", dt)
    st, tkm = cj(U + "/tokenize", {"model": name, "messages": [{"role": "user", "content": "hi"}]})
    check("POST /tokenize with messages (chat template)", st == 200 and tkm["count"] > 3, tkm)

    st, j = cj(U + "/v1/completions", {"prompt": tk["tokens"], "max_tokens": 12, "temperature": 0})
    check("completion: prompt as token ids == prompt as text", st == 200 and j["choices"][0]["text"] == greedy_text, j)
    st, j = cj(U + "/v1/completions", {"prompt": [tk["tokens"]], "max_tokens": 12, "temperature": 0})
    check("completion: prompt as a batch of one token list", st == 200 and j["choices"][0]["text"] == greedy_text)

    # seeds
    sreq = {"prompt": "Once upon", "max_tokens": 16, "temperature": 1.0, "seed": 1234, "top_k": 50, "top_p": 0.9}
    a = cj(U + "/v1/completions", sreq)[1]["choices"][0]["text"]
    b = cj(U + "/v1/completions", sreq)[1]["choices"][0]["text"]
    check("completion: same seed, same sampled text", a == b)

    # stop strings across token boundaries, non-stream and stream
    long = cj(U + "/v1/completions", {"prompt": "Hello", "max_tokens": 24, "temperature": 0, "ignore_eos": True})[1]
    full = long["choices"][0]["text"]
    stop = full[len(full) // 3: len(full) // 3 + 4] if len(full) >= 8 else full[-3:]
    cut = full[: full.find(stop)]
    st, j = cj(U + "/v1/completions", {"prompt": "Hello", "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                                       "stop": [" zzqx", stop]})
    check("stop string spanning tokens: text cut before it, finish stop",
          st == 200 and j["choices"][0]["text"] == cut and j["choices"][0]["finish_reason"] == "stop",
          (stop, cut, j))
    st, body = curl(U + "/v1/completions", data={"prompt": "Hello", "max_tokens": 24, "temperature": 0,
                                                 "ignore_eos": True, "stop": stop, "stream": True})
    ev = sse_events(body)
    streamed = "".join(e["choices"][0]["text"] for e in ev if isinstance(e, dict) and e.get("choices"))
    check("stream + stop string: no partial stop text leaks", st == 200 and streamed == cut and ev[-1] == "[DONE]",
          (stop, cut, streamed))

    # streaming completions
    st, body = curl(U + "/v1/completions", data=dict(req, stream=True, stream_options={"include_usage": True}))
    ev = sse_events(body)
    chunks = [e for e in ev if isinstance(e, dict)]
    text = "".join(e["choices"][0]["text"] for e in chunks if e["choices"])
    check("stream completion: data events, [DONE] last", st == 200 and ev[-1] == "[DONE]" and
          all(e["object"] == "text_completion" for e in chunks), body[:300])
    check("stream completion: text == non-stream text", text == greedy_text, (text, greedy_text))
    check("stream completion: final usage chunk (choices [])", chunks[-1]["choices"] == [] and
          chunks[-1]["usage"]["completion_tokens"] > 0, chunks[-1])
    fins = [e["choices"][0]["finish_reason"] for e in chunks if e["choices"]]
    check("stream completion: one finish_reason, on the last choice chunk", fins[-1] is not None and
          all(f is None for f in fins[:-1]), fins)
    st, body = curl(U + "/v1/completions", data=dict(req, stream=True))
    check("stream completion: no usage chunk unless asked",
          all(e.get("usage") is None for e in sse_events(body) if isinstance(e, dict)))

    # chat
    creq = {"model": name, "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Say hi"}],
            "max_tokens": 10, "temperature": 0}
    st, j = cj(U + "/v1/chat/completions", creq)
    ok = st == 200 and j["object"] == "chat.completion" and j["choices"][0]["message"]["role"] == "assistant"
    check("chat: 200, chat.completion, assistant message", ok, j)
    chat_text = j["choices"][0]["message"]["content"]
    st, body = curl(U + "/v1/chat/completions", data=dict(creq, stream=True, stream_options={"include_usage": True}))
    ev = sse_events(body)
    chunks = [e for e in ev if isinstance(e, dict)]
    check("stream chat: chat.completion.chunk events, role first, [DONE] last",
          ev[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"].get("role") == "assistant" and
          all(e["object"] == "chat.completion.chunk" for e in chunks), body[:300])
    ctext = "".join(e["choices"][0]["delta"].get("content") or "" for e in chunks if e["choices"])
    check("stream chat: content == non-stream content", ctext == chat_text, (ctext, chat_text))
    check("stream chat: usage chunk", chunks[-1]["choices"] == [] and "usage" in chunks[-1])
    a = cj(U + "/v1/chat/completions", dict(creq, chat_template_kwargs={"enable_thinking": False}))[1]
    b = cj(U + "/v1/chat/completions", dict(creq, chat_template_kwargs={"enable_thinking": True}))[1]
    check("chat: chat_template_kwargs.enable_thinking=false adds the empty think block",
          a["usage"]["prompt_tokens"] > b["usage"]["prompt_tokens"], (a.get("usage"), b.get("usage")))
    st, j = cj(U + "/v1/chat/completions", dict(creq, max_tokens=None, max_completion_tokens=3))
    check("chat: max_completion_tokens", st == 200 and j["usage"]["completion_tokens"] <= 3, j)
    st, j = cj(U + "/v1/chat/completions", dict(creq, messages=[{"role": "user", "content": [
        {"type": "text", "text": "Say"}, {"type": "text", "text": " hi"}]}]))
    check("chat: content as text parts", st == 200, j)
    st, j = cj(U + "/v1/chat/completions", dict(creq, messages=[
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "easy"},
        {"role": "user", "content": "and 3+3?"}], user="tester"))
    check("chat: multi-turn with reasoning_content, user field", st == 200, j)

    # logprobs
    st, j = cj(U + "/v1/completions", dict(req, logprobs=3))
    lp = j["choices"][0]["logprobs"] if st == 200 else None
    ok = lp and len(lp["tokens"]) == j["usage"]["completion_tokens"] == len(lp["token_logprobs"]) == \
        len(lp["top_logprobs"]) == len(lp["text_offset"])
    ok = ok and all(len(d) <= 3 and x <= 0 for d, x in zip(lp["top_logprobs"], lp["token_logprobs"]))
    ok = ok and all(abs(max(d.values()) - x) < 1e-6 for d, x in zip(lp["top_logprobs"], lp["token_logprobs"]))
    check("completion logprobs: tokens/token_logprobs/top_logprobs/text_offset; greedy token is the top one", ok, lp)
    st, j = cj(U + "/v1/chat/completions", dict(creq, logprobs=True, top_logprobs=2))
    content = j["choices"][0]["logprobs"]["content"] if st == 200 else []
    check("chat logprobs: content[] with token, logprob, bytes, top_logprobs",
          len(content) == j["usage"]["completion_tokens"] and
          all({"token", "logprob", "bytes", "top_logprobs"} <= set(x) and len(x["top_logprobs"]) == 2 for x in content),
          content[:1])
    st, body = curl(U + "/v1/chat/completions", data=dict(creq, logprobs=True, top_logprobs=1, stream=True))
    n_lp = sum(len(e["choices"][0]["logprobs"]["content"]) for e in sse_events(body)
               if isinstance(e, dict) and e["choices"] and e["choices"][0].get("logprobs"))
    check("stream chat logprobs cover every token", n_lp == j["usage"]["completion_tokens"], n_lp)

    # other fields
    st, j = cj(U + "/v1/completions", dict(req, echo=True))
    check("completion: echo prepends the prompt", st == 200 and j["choices"][0]["text"] ==
          "The capital of France is" + greedy_text, j)
    st, j = cj(U + "/v1/completions", dict(req, n=1))
    check("completion: n=1 accepted", st == 200)
    st, j = cj(U + "/v1/completions", dict(req, max_tokens=20, min_tokens=20, ignore_eos=False))
    check("completion: min_tokens holds off EOS/stop", st == 200 and j["usage"]["completion_tokens"] == 20, j)
    st, j = cj(U + "/v1/completions", dict(req, max_tokens=40, ignore_eos=True))
    check("completion: ignore_eos runs to max_tokens", st == 200 and j["usage"]["completion_tokens"] == 40, j)
    st, j = cj(U + "/v1/completions", dict(req, repetition_penalty=1.3))
    check("completion: repetition_penalty accepted", st == 200, j)
    eos = 151645
    st, j = cj(U + "/v1/completions", dict(req, max_tokens=30, ignore_eos=True, stop_token_ids=[]))
    check("completion: stop_token_ids accepted", st == 200, j)
    st, j = cj(U + "/v1/completions", {"prompt": "Hi", "max_tokens": 5})
    check("completion: defaults from generation_config.json (no sampling fields)", st == 200, j)
    check("completion: default max_tokens is 16 (OpenAI, vLLM)", cj(U + "/v1/completions", {"prompt": "Hi",
          "temperature": 0, "ignore_eos": True})[1]["usage"]["completion_tokens"] == 16)
    check("chat: default max_tokens fills the context", cj(U + "/v1/chat/completions", {"messages": [
          {"role": "user", "content": "Hi"}], "temperature": 0, "ignore_eos": True})[1]["usage"]["total_tokens"] == 256)

    # errors
    def err(desc, payload, status, param=None, path="/v1/completions", raw=False):
        st, body = curl(U + path, data=payload if not raw else payload)
        try:
            j = json.loads(body)
        except ValueError:
            j = body
        ok = st == status and is_error_shape(j, status)
        if ok and param is not None:
            ok = j["error"]["param"] == param
        check(f"error {status}: {desc}", ok, (st, body[:200]))

    err("malformed JSON", '{"prompt": "x", ', 400, raw=True)
    err("body is not an object", '[1,2]', 400, raw=True)
    err("empty body", '', 400, raw=True)
    err("prompt missing", {"max_tokens": 3}, 400, "prompt")
    err("prompt wrong type", {"prompt": 12}, 400, "prompt")
    err("prompt empty", {"prompt": ""}, 400, "prompt")
    err("token id out of range", {"prompt": [1, 10 ** 7]}, 400, "prompt")
    err("max_tokens wrong type", {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens")
    err("max_tokens float", {"prompt": "x", "max_tokens": 5.5}, 400, "max_tokens")
    err("max_tokens zero", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens")
    err("temperature out of range", {"prompt": "x", "temperature": 5}, 400, "temperature")
    err("temperature wrong type", {"prompt": "x", "temperature": "hot"}, 400, "temperature")
    err("top_p zero", {"prompt": "x", "top_p": 0}, 400, "top_p")
    err("top_k below -1", {"prompt": "x", "top_k": -2}, 400, "top_k")
    err("logprobs too many", {"prompt": "x", "logprobs": 50}, 400, "logprobs")
    err("seed wrong type", {"prompt": "x", "seed": "s"}, 400, "seed")
    err("stop wrong type", {"prompt": "x", "stop": 3}, 400, "stop")
    err("stream wrong type", {"prompt": "x", "stream": "yes"}, 400, "stream")
    err("n = 0", {"prompt": "x", "n": 0}, 400, "n")
    err("best_of < n", {"prompt": "x", "n": 3, "best_of": 2}, 400, "best_of")
    err("best_of > n streamed", {"prompt": "x", "n": 1, "best_of": 2, "stream": True}, 400, "best_of")
    err("presence_penalty out of range", {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty")
    err("frequency_penalty wrong type", {"prompt": "x", "frequency_penalty": "x"}, 400, "frequency_penalty")
    err("min_p above 1", {"prompt": "x", "min_p": 1.5}, 400, "min_p")
    err("logit_bias key not a token id", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias")
    err("logit_bias value out of range", {"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias")
    err("suffix not honoured", {"prompt": "x", "suffix": "end"}, 400, "suffix")
    err("prompt_logprobs streamed", {"prompt": "x", "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs")
    err("batch with a non-prompt", {"prompt": ["a", 5]}, 400, "prompt")
    err("too many runs (prompts x n)", {"prompt": ["a"] * 20, "n": 10}, 400, "prompt")
    err("min_tokens > max_tokens", {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens")
    err("repetition_penalty <= 0", {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty")
    err("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
        "stream_options")
    err("prompt + max_tokens beyond the context", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens")
    err("prompt longer than the context", {"prompt": list(range(300))}, 400, "prompt")
    err("unknown model", {"model": "nope", "prompt": "x"}, 404, "model")
    err("chat: messages missing", {"max_tokens": 3}, 400, "messages", path="/v1/chat/completions")
    err("chat: bad role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages",
        path="/v1/chat/completions")
    err("chat: image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
        "messages", path="/v1/chat/completions")
    err("chat: logprobs wrong type", {"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, 400, "logprobs",
        path="/v1/chat/completions")
    err("chat: top_logprobs without logprobs", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400,
        "top_logprobs", path="/v1/chat/completions")
    err("chat: tools unsupported", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        400, "tools", path="/v1/chat/completions")
    err("tokenize: prompt wrong type", {"prompt": 5}, 400, "prompt", path="/tokenize")
    err("detokenize: id out of range", {"tokens": [-1]}, 400, "tokens", path="/detokenize")
    err("detokenize: unknown model", {"model": "nope", "tokens": [1]}, 404, "model", path="/detokenize")
    st, body = curl(U + "/v1/nothing")
    check("error 404: unknown path", st == 404 and is_error_shape(json.loads(body), 404), body)
    st, body = curl(U + "/v1/completions")
    check("error 405: GET on a POST route", st == 405 and is_error_shape(json.loads(body), 405), body)
    st, body = curl(U + "/v1/models", "-X", "POST", "-d", "{}")
    check("error 405: POST on a GET route", st == 405 and is_error_shape(json.loads(body), 405), body)
    big = tempfile.NamedTemporaryFile(delete=False)
    big.write(b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
    big.close()
    st, body = curl(U + "/v1/completions", "-H", "Content-Type: application/json", "--data-binary", "@" + big.name)
    check("error 413: 9 MB body", st == 413 and is_error_shape(json.loads(body), 413), (st, body[:200]))
    os.unlink(big.name)


def openai_section(S, name):
    import openai
    client = openai.OpenAI(base_url=S.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    models = client.models.list()
    check("openai: models.list", [m.id for m in models.data] == [name])
    r = client.completions.create(model=name, prompt="The capital of France is", max_tokens=12, temperature=0)
    ref = cj(S.url + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0})[1]
    check("openai: completions.create", r.choices[0].text == ref["choices"][0]["text"] and
          r.usage.completion_tokens == ref["usage"]["completion_tokens"], r)
    text = ""
    for ch in client.completions.create(model=name, prompt="The capital of France is", max_tokens=12,
                                        temperature=0, stream=True):
        text += ch.choices[0].text if ch.choices else ""
    check("openai: completions stream", text == ref["choices"][0]["text"], text)
    msgs = [{"role": "user", "content": "Say hi"}]
    r = client.chat.completions.create(model=name, messages=msgs, max_tokens=10, temperature=0, seed=7,
                                       logprobs=True, top_logprobs=2)
    check("openai: chat.completions.create (+logprobs)", r.choices[0].message.role == "assistant" and
          len(r.choices[0].logprobs.content) == r.usage.completion_tokens, r)
    ctext, usage = "", None
    for ch in client.chat.completions.create(model=name, messages=msgs, max_tokens=10, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ch.choices:
            ctext += ch.choices[0].delta.content or ""
        if ch.usage:
            usage = ch.usage
    check("openai: chat stream with include_usage", ctext == r.choices[0].message.content and usage is not None and
          usage.completion_tokens == r.usage.completion_tokens, (ctext, usage))
    r = client.chat.completions.create(model=name, messages=msgs, max_completion_tokens=4, temperature=0.7,
                                       top_p=0.9, stop=["\n"], user="u1",
                                       extra_body={"top_k": 10, "min_tokens": 1, "repetition_penalty": 1.1,
                                                   "ignore_eos": False,
                                                   "chat_template_kwargs": {"enable_thinking": False}})
    check("openai: chat with vLLM extensions via extra_body", r.usage.completion_tokens <= 4)
    try:
        client.completions.create(model="missing", prompt="x", max_tokens=2)
        check("openai: unknown model raises NotFoundError", False)
    except openai.NotFoundError:
        check("openai: unknown model raises NotFoundError", True)
    try:
        client.completions.create(model=name, prompt="x", max_tokens=2, temperature=9)
        check("openai: bad temperature raises BadRequestError", False)
    except openai.BadRequestError as e:
        check("openai: bad temperature raises BadRequestError", "temperature" in str(e))


def stream_text(url, payload, timeout=300):
    st, _, body = request("POST", url + "/v1/completions", dict(payload, stream=True), timeout=timeout)
    ev = sse_events(body.decode())
    text = "".join(e["choices"][0]["text"] for e in ev if isinstance(e, dict) and e.get("choices"))
    ntok = sum(1 for e in ev if isinstance(e, dict) and e.get("choices") and e["choices"][0]["text"])
    return st, text, ev


def concurrency_section(S, n=32):
    rng = random.Random(5)
    reqs = []
    for i in range(n):
        plen = rng.choice([1, 3, 7, 20, 45, 90, 130])  # > 64 tokens: chunked prefill under the step budget
        prompt = [rng.randrange(100, 150000) for _ in range(plen)]
        reqs.append({"prompt": prompt, "max_tokens": rng.randrange(4, 48), "temperature": 0, "ignore_eos": True,
                     "logprobs": 1})
    alone = []
    for r in reqs:
        st, j = cj(S.url + "/v1/completions", r)
        alone.append((j["choices"][0]["text"], j["choices"][0]["logprobs"]["tokens"]))
    t0 = time.time()
    with cf.ThreadPoolExecutor(n) as ex:
        res = list(ex.map(lambda r: stream_text(S.url, r), reqs))
    dt = time.time() - t0
    ok_all = all(st == 200 and ev[-1] == "[DONE]" for st, _, ev in res)
    check(f"concurrency: {n} simultaneous streams all complete ({dt:.1f}s)", ok_all)
    same = 0
    for (st, text, ev), (atext, atoks) in zip(res, alone):
        toks = [t for e in ev if isinstance(e, dict) and e.get("choices") and e["choices"][0].get("logprobs")
                for t in e["choices"][0]["logprobs"]["tokens"]]
        same += text == atext and toks == atoks
    check(f"concurrency: greedy tokens under load == alone ({same}/{n})", same == n)


def parse_metrics(url):
    from prometheus_client.parser import text_string_to_metric_families
    st, hdr, body = request("GET", url + "/metrics")
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return fams


def sample(fams, fam, sname, **labels):
    tot = 0.0
    found = False
    for s in fams[fam].samples:
        if s.name == sname and all(s.labels.get(k) == v for k, v in labels.items()):
            tot += s.value
            found = True
    return tot if found else None


def metrics_section(S):
    before = parse_metrics(S.url)
    names = ["echo:time_to_first_token_seconds", "echo:inter_token_latency_seconds", "echo:e2e_request_latency_seconds",
             "echo:request_queue_time_seconds", "echo:prompt_tokens", "echo:generation_tokens",
             "echo:request_success", "echo:num_requests_running", "echo:num_requests_waiting",
             "echo:kv_cache_usage_perc", "echo:allreduce_seconds", "echo:allreduce_bytes"]
    missing = [n for n in names if n not in before]
    check("metrics: every required family parses with prometheus_client", not missing, missing)
    types = {n: before[n].type for n in names if n in before}
    check("metrics: types (histogram/counter/gauge)",
          types.get("echo:time_to_first_token_seconds") == "histogram" and types.get("echo:prompt_tokens") == "counter"
          and types.get("echo:kv_cache_usage_perc") == "gauge", types)
    k, plen, gen = 6, 0, 0
    for i in range(k):
        j = cj(S.url + "/v1/completions", {"prompt": "metrics test %d" % i, "max_tokens": 5 + i, "temperature": 0,
                                           "ignore_eos": True})[1]
        plen += j["usage"]["prompt_tokens"]
        gen += j["usage"]["completion_tokens"]
    after = parse_metrics(S.url)

    def d(fam, sname, **lb):
        a, b = sample(after, fam, sname, **lb), sample(before, fam, sname, **lb) or 0
        return None if a is None else a - b

    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        f = "echo:" + h
        check(f"metrics: {h}_count grew by the {k} requests served", d(f, f + "_count") == k, d(f, f + "_count"))
        check(f"metrics: {h} +Inf bucket == count", sample(after, f, f + "_bucket", le="+Inf") ==
              sample(after, f, f + "_count"))
    f = "echo:inter_token_latency_seconds"
    check("metrics: inter-token count == generated tokens - requests", d(f, f + "_count") == gen - k,
          (d(f, f + "_count"), gen - k))
    check("metrics: prompt_tokens_total", d("echo:prompt_tokens", "echo:prompt_tokens_total") == plen)
    check("metrics: generation_tokens_total", d("echo:generation_tokens", "echo:generation_tokens_total") == gen)
    check("metrics: request_success_total{finished_reason=length}",
          d("echo:request_success", "echo:request_success_total", finished_reason="length") == k)
    buckets = [s.value for s in after["echo:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    check("metrics: buckets are cumulative", all(a <= b for a, b in zip(buckets, buckets[1:])))
    les = [s.labels["le"] for s in after["echo:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    check("metrics: vLLM's TTFT buckets", les[:3] == ["0.001", "0.005", "0.01"] and les[-2:] == ["2560.0", "+Inf"],
          les)
    st, _, raw = request("GET", S.url + "/metrics")
    check('metrics: bucket labels as prometheus_client writes them (le="1.0")',
          'le="1.0"' in raw.decode() and 'le="1"' not in raw.decode())
    for h, want in (("request_prompt_tokens", plen), ("request_generation_tokens", gen),
                    ("iteration_tokens_total", plen + gen - k)):
        f = "echo:" + h
        check(f"metrics: {h} histogram sum grew by {want}", d(f, f + "_sum") == want, d(f, f + "_sum"))
    f = "echo:request_inference_time_seconds"
    check("metrics: request_inference_time_seconds count grew by the requests", d(f, f + "_count") == k)
    check("metrics: num_preemptions_total (0: KV reserved at admission)",
          sample(after, "echo:num_preemptions", "echo:num_preemptions_total") == 0)
    cc = [s_ for s_ in after["echo:cache_config_info"].samples] if "echo:cache_config_info" in after else []
    check("metrics: cache_config_info with the block size", cc and cc[0].labels.get("block_size") == "16" and
          int(cc[0].labels.get("num_gpu_blocks", "0")) > 0, cc)
    modes = {s.labels.get("mode") for s in after["echo:allreduce_bytes"].samples}
    check("metrics: allreduce_{seconds,bytes}_total by mode", {"exact", "int4", "echo"} <= modes, modes)
    check("metrics: gauges idle after the requests", sample(after, "echo:num_requests_running",
          "echo:num_requests_running") == 0 and sample(after, "echo:kv_cache_usage_perc", "echo:kv_cache_usage_perc") == 0)


def servers_section(binary, model, name):
    # --api-key
    S = Server(binary, model, "--api-key", "sekret", "--served-model-name", name, name="auth")
    st, _ = curl(S.url + "/v1/models")
    check("auth: no key -> 401", st == 401)
    st, body = curl(S.url + "/v1/completions", "-H", "Authorization: Bearer wrong", data={"prompt": "x"})
    check("auth: wrong key -> 401 in OpenAI error shape", st == 401 and is_error_shape(json.loads(body), 401), body)
    st, _ = curl(S.url + "/v1/completions", "-H", "Authorization: Bearer sekret",
                 data={"prompt": "x", "max_tokens": 2})
    check("auth: right key -> 200", st == 200)
    st, _ = curl(S.url + "/health")
    check("auth: /health needs no key", st == 200)
    import openai
    c = openai.OpenAI(base_url=S.url + "/v1", api_key="sekret", max_retries=0)
    check("auth: openai client with api_key", c.completions.create(model=name, prompt="x", max_tokens=2).usage
          .completion_tokens > 0)
    rc, log = S.stop()
    check("auth server: SIGTERM -> exit 0", rc == 0, (rc, log[-500:]))

    # queue limit -> 503
    S = Server(binary, model, "--max-num-seqs", "1", "--max-queue", "1", name="queue")
    payload = {"prompt": "x", "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda _: curl(S.url + "/v1/completions", data=payload), range(8)))
    codes = sorted(st for st, _ in res)
    over = [b for st, b in res if st == 503]
    check("queue limit: overload answered 503 in error shape, the rest 200",
          over and all(is_error_shape(json.loads(b), 503) for b in over) and set(codes) <= {200, 503}, codes)
    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda _: request("POST", S.url + "/v1/completions", payload), range(8)))
    over = [h for st, h, _ in res if st == 503]
    check("queue limit: every 503 carries Retry-After", over and all(h.get("retry-after") for h in over),
          [st for st, _, _ in res])
    rc, _ = S.stop()
    check("queue server: SIGTERM -> exit 0", rc == 0, rc)

    # generation_config.json values out of range are named at load, not silently replaced
    gdir = tempfile.mkdtemp()
    for f in os.listdir(model):
        if f != "generation_config.json":
            os.symlink(os.path.realpath(os.path.join(model, f)), os.path.join(gdir, f))
    with open(os.path.join(gdir, "generation_config.json"), "w") as f:
        json.dump({"temperature": 7, "top_p": 0, "top_k": "many", "repetition_penalty": -1}, f)
    S = Server(binary, gdir, name="genconf")
    log = S.logtext()
    rc, _ = S.stop()
    # a tokenizer whose vocabulary does not fit the model's is named (this config no longer fits its
    # weights either, so the load then fails; the warning comes first)
    vdir = tempfile.mkdtemp()
    for f in os.listdir(model):
        if f != "config.json":
            os.symlink(os.path.realpath(os.path.join(model, f)), os.path.join(vdir, f))
    cfg = json.load(open(os.path.join(model, "config.json")))
    cfg["vocab_size"] = 151650  # above its EOS id, below the tokenizer's 151669
    json.dump(cfg, open(os.path.join(vdir, "config.json"), "w"))
    V = Server(binary, vdir, name="vocab", wait_ready=False)
    try:
        V.p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    rc, vlog = V.stop()
    check("load: a tokenizer vocabulary larger than the model's is named in a warning",
          re.search(r"WARNING .*tokenizer's vocabulary \(\d+ ids\) does not fit the model's \(151650\)", vlog)
          is not None, vlog[-1500:])
    check("load: out-of-range generation_config.json values each named in a warning",
          all(re.search(r"WARNING .*generation_config.json: " + k, log)
              for k in ("temperature", "top_p", "top_k", "repetition_penalty")), log[-1500:])

    # KV exhaustion: requests wait for blocks instead of failing
    S = Server(binary, model, "--num-kv-blocks", "6", "--max-num-seqs", "4", name="kv")
    payload = {"prompt": [11, 12, 13, 14, 15, 16, 17, 18], "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    with cf.ThreadPoolExecutor(6) as ex:
        res = list(ex.map(lambda _: cj(S.url + "/v1/completions", payload), range(6)))
    texts = {j["choices"][0]["text"] for st, j in res if st == 200}
    check("KV exhaustion: 6 requests needing 3 of 6 blocks each all complete (they wait), same greedy text",
          all(st == 200 for st, _ in res) and len(texts) == 1, [st for st, _ in res])
    st, j = cj(S.url + "/v1/completions", dict(payload, max_tokens=120))
    check("KV capacity: prompt + max_tokens beyond the whole cache -> 400", st == 400 and is_error_shape(j, 400), j)
    rc, _ = S.stop()
    check("kv server: SIGTERM -> exit 0", rc == 0, rc)

    # loading state, tensor parallel 2 with the exact all-reduce
    S = Server(binary, model, "--debug-load-delay", "2", "--tp", "2", "--allreduce", "exact", name="load",
               wait_ready=False)
    st, _ = curl(S.url + "/health")
    check("loading: /health 503 while loading", st == 503, st)
    st, body = curl(S.url + "/v1/completions", data={"prompt": "x"})
    check("loading: completions 503 while loading", st == 503 and is_error_shape(json.loads(body), 503), (st, body))
    S.wait_ready()
    st, j = cj(S.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0})
    check("tp 2: serves", st == 200 and j["usage"]["completion_tokens"] > 0, j)
    m = parse_metrics(S.url)
    check("tp 2: allreduce_bytes_total{mode=exact} > 0",
          (sample(m, "echo:allreduce_bytes", "echo:allreduce_bytes_total", mode="exact") or 0) > 0)
    check("start-up log shows the plan", "plan: tp 2" in S.logtext() and "allreduce exact: fp32, 32 bits/value" in S.logtext())
    # prompt logprobs gather every row's vocabulary slices across the ranks: == the reference rows
    fx = os.path.join(REPO, "tests/fixtures/models/realvocab/reference.json")
    p = json.load(open(fx))["prompts"][-1]
    st, j = cj(S.url + "/v1/completions", {"prompt": p["prompt"] + p["greedy"][:8], "max_tokens": 0, "echo": True,
                                           "logprobs": 1})
    lp = j["choices"][0]["logprobs"] if st == 200 else None
    check("tp 2: echo + logprobs, every prompt row argmax == the reference greedy tokens",
          lp is not None and all(max(t.values()) == x for t, x in
                                 zip(lp["top_logprobs"][len(p["prompt"]):], lp["token_logprobs"][len(p["prompt"]):])),
          j)
    # SIGTERM with a request in flight: it finishes (drain), exit 0
    box = {}
    t = threading.Thread(target=lambda: box.update(r=stream_text(S.url, {"prompt": "x", "max_tokens": 100,
                                                                        "ignore_eos": True})))
    t.start()
    time.sleep(0.3)
    rc, log = S.stop()
    t.join(30)
    st, text, ev = box.get("r", (0, "", []))
    check("SIGTERM mid-stream: stream ends with [DONE], server exits 0", rc == 0 and ev and ev[-1] == "[DONE]",
          (rc, ev[-2:] if ev else None))

    # the codec and weight format are flags too: echo with hadamard-g32 over Q8_0 weights (8-bit
    # activations) at tp 2
    S = Server(binary, model, "--tp", "2", "--allreduce", "echo", "--echo-codec", "hadamard-g32", "--quantize",
               "q8_0", "--act-quant", "q8_0", name="codec")
    st, j = cj(S.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0})
    m = parse_metrics(S.url)
    check("--echo-codec hadamard-g32 --quantize q8_0 --act-quant q8_0: serves, the plan names the codec, echo calls "
          "counted",
          st == 200 and j["usage"]["completion_tokens"] > 0 and "allreduce echo: hadamard-g32, 4.500 bits/value, error feedback on" in S.logtext() and
          "8-bit activations on the quantized matrices" in S.logtext() and
          (sample(m, "echo:allreduce_bytes", "echo:allreduce_bytes_total", mode="echo") or 0) > 0, (st, j))
    # the echo preset sends the last 2 calls of a pass (2 per layer) in bf16: 4.5 bits on the others
    ncalls = 2 * json.load(open(os.path.join(model, "config.json")))["num_hidden_layers"] \
        if os.path.isdir(model) else None
    arl = [x for x in m["echo:allreduce_config_info"].samples] if "echo:allreduce_config_info" in m else []
    if ncalls is None and arl:
        ncalls = int(arl[0].labels.get("calls", "0"))
    check("/metrics: allreduce_config_info names preset, codec, group, bits/value over a pass, feedback and the tail",
          ncalls and sample(m, "echo:allreduce_config_info", "echo:allreduce_config_info", preset="echo",
                            codec="hadamard", group="32",
                            bits_per_value="%.3f" % (((ncalls - 2) * 4.5 + 2 * 16) / ncalls), feedback="on", tp="2",
                            tail_calls="2", calls=str(ncalls), tail_codec="bf16") == 1.0
          and f"the last 2 of {ncalls} calls of a pass bf16" in S.logtext(),
          arl or m.keys())
    S.stop()
    for flag, val in (("--echo-codec", "int3"), ("--quantize", "q2_k"), ("--act-quant", "q4")):
        p = subprocess.run([binary, "--model", model, flag, val], capture_output=True, text=True)
        check(f"{flag} {val}: usage error (exit 2) naming the flag", p.returncode == 2 and flag in p.stderr,
              (p.returncode, p.stderr[-300:]))

    p = subprocess.run([binary, "--model", model, "--act-quant", "q8_0", "--port", "0"], capture_output=True, text=True,
                       timeout=120)
    check("--act-quant q8_0 without Q8_0 weights: exit 1, says there is no Q8_0 matrix",
          p.returncode == 1 and "no Q8_0 matrix" in p.stderr, (p.returncode, p.stderr[-300:]))

    # name resolution errors list where they looked
    p = subprocess.run([binary, "--model", "no-such-model-xyz"], capture_output=True, text=True,
                       env=dict(os.environ, ECHO_MODEL_DIR="/nonexistent", HF_HOME="/nonexistent-hf"))
    check("unknown model name: exit 1, message lists the places looked",
          p.returncode == 1 and "ECHO_MODEL_DIR" not in p.stderr.split("looked")[0] and
          "/nonexistent/no-such-model-xyz" in p.stderr and "models/no-such-model-xyz" in p.stderr and
          "nonexistent-hf/hub" in p.stderr, p.stderr)
    hub = tempfile.mkdtemp()
    snap = os.path.join(hub, "hub", "models--Qwen--Qwen3-Demo", "snapshots", "abc123")
    os.makedirs(snap)
    for f in os.listdir(model):
        os.symlink(os.path.realpath(os.path.join(model, f)), os.path.join(snap, f))
    S = Server(binary, "qwen3-demo", name="hf", wait_ready=True) if False else None
    p = subprocess.Popen([binary, "--model", "qwen3-demo", "--port", "0", "--device", "cpu"], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, env=dict(os.environ, HF_HOME=os.path.join(hub)))
    line, deadline = "", time.time() + 60
    while "ready on port" not in line and time.time() < deadline:
        line = p.stderr.readline().decode()
        if not line and p.poll() is not None:
            break
    check("HF cache: qwen3-demo resolves to models--Qwen--Qwen3-Demo/snapshots/<rev>", "ready on port" in line, line)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    check("usage error: exit 2", subprocess.run([binary, "--bogus"], capture_output=True).returncode == 2)


# ---------------------------------------------------------------- abuse

def raw_exchange(port, data, timeout=20, read=True):
    """Send raw bytes; return the response bytes (b'' if closed without one)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
        return out
    finally:
        s.close()


# "add_special_tokens": 0 (not a boolean) keeps the generation bodies invalid on /tokenize too,
# where the generation fields are unknown and so ignored
def hostile_bodies(rng, n):
    fixed = [
        b"", b"{", b"}", b"null", b"true", b"123", b'"str"', b"[]", b"{\"prompt\":}", b"{'prompt': 'x'}",
        b'{"add_special_tokens": 0, "prompt": "x", "max_tokens": 1e999}', b'{"add_special_tokens": 0, "prompt": "x", "max_tokens": 99999999999999999999999}',
        b'{"add_special_tokens": 0, "prompt": "x", "max_tokens": -99999999999}', b'{"add_special_tokens": 0, "prompt": "x", "temperature": NaN}',
        b'{"add_special_tokens": 0, "prompt": "x", "temperature": Infinity}', b'{"prompt": "\xff\xfe"}', b'{"prompt": "\\ud800"}',
        b'{"prompt": [1, 2, "3"]}', b'{"prompt": [1.5]}', b'{"prompt": [-1]}', b'{"prompt": [4294967296]}',
        b'{"prompt": {"a": 1}}', b'{"prompt": [[1], ["2"]]}', b'{"prompt": ["a", 5]}', b'{"add_special_tokens": 0, "prompt": "x", "stop": [1]}',
        b'{"add_special_tokens": 0, "prompt": "x", "stop": ["' + b"s" * 5000 + b'"]}', b'{"add_special_tokens": 0, "prompt": "x", "stop": ' +
        json.dumps(["a"] * 100).encode() + b'}', b'{"add_special_tokens": 0, "prompt": "x", "prompt": "y"}',
        b'[' * 5000 + b']' * 5000, b'{"a":' * 3000 + b'1' + b'}' * 3000, b'{"add_special_tokens": 0, "prompt": "x", "seed": 1e400}',
        b'{"messages": "hi"}', b'{"messages": [{"role": "user"}]}', b'{"messages": [1]}',
        b'{"add_special_tokens": 0, "prompt": "x", "logprobs": true}', b'{"add_special_tokens": 0, "prompt": "x", "n": 0}', b'{"add_special_tokens": 0, "prompt": "x", "top_k": 9999999999}',
        b'{"add_special_tokens": 0, "prompt": "x", "max_tokens": null, "temperature": null, "stop": null, "stream": true, "stream_options": 5}',
        b"\x00\x01\x02\x03", b'{"prompt": "x"}garbage', b'{"add_special_tokens": 0, "prompt": "x", "min_tokens": -1}',
    ]
    out = list(fixed)
    fields = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "logprobs", "n",
              "echo", "min_tokens", "ignore_eos", "repetition_penalty", "messages", "model", "stream_options"]
    values = [None, True, False, -1, 0, 1, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 1e308, -1e308, 0.5, "", "x" * 100, [],
              [None], {}, {"x": 1}, [1, 2, 3], "\u0000", "é\u2028", [[]]]
    while len(out) < n:
        kind = rng.random()
        if kind < 0.3:  # random bytes
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
        elif kind < 0.5:  # truncated valid JSON
            b = json.dumps({"prompt": "hello", "max_tokens": 5, "temperature": 0.5}).encode()
            out.append(b[: rng.randrange(1, len(b))])
        else:  # well-formed JSON, hostile values (always invalid: one bad field at least)
            d = {f: rng.choice(values) for f in rng.sample(fields, rng.randrange(1, 6))}
            d["max_tokens"] = rng.choice([-5, "many", 10 ** 12, 1.5, [], {}])
            d["add_special_tokens"] = rng.choice([5, "x", [], {}])  # /tokenize: unknown fields are ignored
            d["tokens"] = rng.choice(["x", [-1], [10 ** 9], {}])     # /detokenize: likewise
            out.append(json.dumps(d).encode())
    return out[:n]


def keepalive_post(port, path, bodies, results):
    """POST bodies on one keep-alive connection (reconnecting when closed)."""
    conn = None
    for b in bodies:
        for attempt in range(2):
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("POST", path, body=b, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                results.append((r.status, data))
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
                break
            except (http.client.HTTPException, OSError) as e:
                if conn:
                    conn.close()
                conn = None
                if attempt == 1:
                    results.append(("closed", repr(e).encode()))
    if conn:
        conn.close()


def abuse_section(S, n_bodies=800, n_disconnect=100, n_slow=20, timeout_s=3):
    rng = random.Random(11)
    port = S.port
    total = 0
    ref = cj(S.url + "/v1/completions", {"prompt": "abuse reference", "max_tokens": 8, "temperature": 0})[1]

    # 1. malformed / hostile bodies over keep-alive connections, 8 in parallel
    bodies = hostile_bodies(rng, n_bodies)
    results = []
    paths = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
    chunks = [bodies[i::8] for i in range(8)]
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: keepalive_post(port, paths[i % 4], chunks[i], results), range(8)))
    total += len(results)
    bad = [(st, d[:120]) for st, d in results
           if not (isinstance(st, int) and 400 <= st < 500 and is_error_shape(json.loads(d)))]
    check(f"abuse: {len(results)} malformed/hostile bodies each answered 4xx in error shape", not bad and
          len(results) == n_bodies, bad[:5])

    # 2. hostile request lines, methods, headers
    raws = [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"h" * 100000 + b"\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100,
            b"DELETE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", b"PUT /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /tokenize HTTP/1.0\r\nContent-Length: 3\r\n\r\n{}}"]
    methods = [b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"HEAD", b"TRACE", b"BREW"]
    urls = [b"/", b"/v1", b"/v1/completions", b"/v1/chat/completions", b"/metrics", b"/health", b"/tokenize",
            b"/v1/models/x", b"/%00", b"/v1/completions?x=1", b"//v1//models"]
    while len(raws) < 120:
        raws.append(rng.choice(methods) + b" " + rng.choice(urls) + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    b"Content-Length: 2\r\n\r\n{}")
    outcomes = []

    def one_raw(d):
        t0 = time.time()
        try:
            out = raw_exchange(port, d, timeout=timeout_s + 10)
            return ("answered" if out.startswith(b"HTTP/1.") else "closed", time.time() - t0)
        except OSError as e:
            return ("closed:" + type(e).__name__, time.time() - t0)

    with cf.ThreadPoolExecutor(8) as ex:
        outcomes = list(ex.map(one_raw, raws))
    total += len(raws)
    slow = [o for o in outcomes if o[1] > timeout_s + 8]
    check(f"abuse: {len(raws)} hostile request lines/methods/headers answered or closed promptly", not slow, slow[:3])

    # 3. 10 MB bodies: with Content-Length (413 before the body is read) and chunked (read, dropped, 413)
    big = tempfile.NamedTemporaryFile(delete=False)
    big.write(b'{"prompt": "' + b"a" * (10 << 20) + b'"}')
    big.close()
    st, body = curl(S.url + "/v1/completions", "-H", "Content-Type: application/json", "--data-binary", "@" + big.name)
    check("abuse: 10 MB body -> 413", st == 413 and is_error_shape(json.loads(body), 413), (st, body[:100]))
    st, body = curl(S.url + "/v1/completions", "-H", "Content-Type: application/json", "-H",
                    "Transfer-Encoding: chunked", "--data-binary", "@" + big.name)
    check("abuse: 10 MB chunked body -> 413", st == 413 and is_error_shape(json.loads(body), 413), (st, body[:100]))
    os.unlink(big.name)
    total += 2

    # 4. slowloris: partial headers / partial bodies, trickled; closed within the server's timeout
    def slowloris(i):
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout_s + 15)
        t0 = time.time()
        try:
            if i % 2:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                msg = b"X-Slow: " + b"a" * 100
            else:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
                msg = b" " * 100
            for k in range(len(msg)):
                time.sleep(timeout_s + 1 if k == 0 else 0.0)
                s.sendall(msg[k:k + 1])
                if time.time() - t0 > timeout_s + 12:
                    break
            s.settimeout(timeout_s + 10)
            data = s.recv(4096)
            return ("closed" if not data else "answered", time.time() - t0)
        except OSError:
            return ("closed", time.time() - t0)
        finally:
            s.close()

    with cf.ThreadPoolExecutor(n_slow) as ex:
        slows = list(ex.map(slowloris, range(n_slow)))
    total += n_slow
    check(f"abuse: {n_slow} slowloris connections closed within the timeout bound",
          all(t < timeout_s + 12 for _, t in slows), slows[:4])

    # 5. mid-stream disconnects
    def disconnect(i):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        body = json.dumps({"prompt": "disconnect %d" % i, "max_tokens": 200, "ignore_eos": True,
                           "stream": True, "temperature": 0}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data: " not in got:
            b = s.recv(4096)
            if not b:
                break
            got += b
        s.close()
        return b"data: " in got

    m0 = parse_metrics(S.url)
    aborted0 = sample(m0, "echo:request_success", "echo:request_success_total", finished_reason="abort") or 0
    with cf.ThreadPoolExecutor(16) as ex:
        dis = list(ex.map(disconnect, range(n_disconnect)))
    total += n_disconnect
    check(f"abuse: {n_disconnect} streams opened and dropped mid-stream", all(dis), dis.count(False))
    deadline, m = time.time() + 60, None
    while time.time() < deadline:
        m = parse_metrics(S.url)
        if sample(m, "echo:num_requests_running", "echo:num_requests_running") == 0 and \
                sample(m, "echo:num_requests_waiting", "echo:num_requests_waiting") == 0:
            break
        time.sleep(0.2)
    aborted = (sample(m, "echo:request_success", "echo:request_success_total", finished_reason="abort") or 0) - aborted0
    check("abuse: disconnected streams cancelled (finished_reason=abort), nothing left running, KV freed",
          aborted >= n_disconnect * 0.9 and sample(m, "echo:num_requests_running", "echo:num_requests_running") == 0 and
          sample(m, "echo:kv_cache_usage_perc", "echo:kv_cache_usage_perc") == 0, (aborted,))

    print(f"  ({total} hostile requests in all)")
    check("abuse: >= 1000 hostile requests sent", total >= 1000, total)
    st, _ = curl(S.url + "/health")
    again = cj(S.url + "/v1/completions", {"prompt": "abuse reference", "max_tokens": 8, "temperature": 0})[1]
    check("abuse: server still healthy and answers the same", st == 200 and
          again["choices"][0]["text"] == ref["choices"][0]["text"])


def post(url, payload, timeout=120):
    st, j = cj(url, payload, timeout=timeout)
    return st, j


def features_section(S, name, repo):
    """Prompt logprobs, batches, n / best_of, penalties, stop_reason: each checked against an
    independent path (the decode path's logprobs, transformers' logits, single requests)."""
    U = S.url
    # 1. echo + logprobs == the decode path's logprobs of the same tokens
    st, g = post(U + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
                                         "logprobs": 3, "ignore_eos": True})
    st, ids = post(U + "/tokenize", {"prompt": "The capital of France is"})
    gen_lp = g["choices"][0]["logprobs"]
    ptoks = ids["tokens"]
    st, e = post(U + "/v1/completions", {"prompt": ptoks, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                         "echo": True, "logprobs": 3})
    el = e["choices"][0]["logprobs"]
    n = len(ptoks)
    check("echo+logprobs: prompt tokens then completion, the first null", st == 200 and
          el["token_logprobs"][0] is None and el["top_logprobs"][0] is None and
          len(el["token_logprobs"]) == n + 6 and e["choices"][0]["text"].startswith("The capital of France is"), e)
    check("echo+logprobs: completion part == non-echo logprobs",
          all(abs(a - b) < 1e-6 for a, b in zip(el["token_logprobs"][n:], gen_lp["token_logprobs"])))
    st, pl = post(U + "/v1/completions", {"prompt": ptoks, "max_tokens": 1, "temperature": 0, "ignore_eos": True,
                                          "prompt_logprobs": 2})
    plp = pl["choices"][0].get("prompt_logprobs")
    check("prompt_logprobs: vLLM's shape (null, then {id: {logprob, rank, decoded_token}})",
          st == 200 and plp is not None and plp[0] is None and len(plp) == n and
          all(str(t) in d and {"logprob", "rank", "decoded_token"} <= set(d[str(t)]) for t, d in zip(ptoks[1:], plp[1:])),
          pl)
    check("prompt_logprobs == echo's prompt token_logprobs",
          plp is not None and all(abs(d[str(t)]["logprob"] - x) < 1e-6
                                  for t, d, x in zip(ptoks[1:], plp[1:], el["token_logprobs"][1:n])))
    # forced decode: logit_bias +100 makes the token the greedy choice; its reported logprob is the raw
    # distribution's, computed on the decode path (one full row), not on the prompt-rows path
    worst = 0.0
    for i in range(1, n):
        st, f = post(U + "/v1/completions", {"prompt": ptoks[:i], "max_tokens": 1, "temperature": 0, "logprobs": 0,
                                             "logit_bias": {str(ptoks[i]): 100}})
        worst = max(worst, abs(f["choices"][0]["logprobs"]["token_logprobs"][0] - el["token_logprobs"][i]))
    check(f"prompt logprobs == decode-path logprobs of the same tokens (max diff {worst:.2e})", worst < 1e-4)
    st, z = post(U + "/v1/completions", {"prompt": ptoks, "max_tokens": 0, "echo": True, "logprobs": 1})
    check("echo + max_tokens 0 scores the prompt only", st == 200 and z["usage"]["completion_tokens"] == 0 and
          z["choices"][0]["logprobs"]["token_logprobs"][1:] == el["token_logprobs"][1:n], z)
    # 2. the transformers reference (tests/fixtures/models/realvocab: the demo model's weights)
    import struct
    fx = os.path.join(repo, "tests/fixtures/models/realvocab")
    ref = json.load(open(fx + "/reference.json"))
    raw = open(fx + "/reference.bin", "rb").read()
    nf = struct.unpack("<Q", raw[8:16])[0]
    V = ref["vocab_size"]
    worst, count = 0.0, 0
    import math
    for p in ref["prompts"]:
        seqr = p["prompt"] + p["greedy"]
        st, j = post(U + "/v1/completions", {"prompt": seqr, "max_tokens": 0, "echo": True, "logprobs": 1})
        lps = j["choices"][0]["logprobs"]["token_logprobs"]
        for r in range(p["logits_rows"]):
            pos = p["logits_first_position"] + r
            if pos + 1 >= len(seqr):
                continue
            off = 16 + 4 * (p["logits_offset"] + r * V)
            row = struct.unpack(f"<{V}f", raw[off:off + 4 * V])
            mx = max(row)
            lse = mx + math.log(sum(math.exp(x - mx) for x in row))
            worst = max(worst, abs(lps[pos + 1] - (row[seqr[pos + 1]] - lse)))
            count += 1
    check(f"prompt logprobs == transformers' fp32 logits ({count} positions, max diff {worst:.2e})",
          count > 0 and worst < 1e-4 and nf > 0)
    # 3. batched prompts: one choice per prompt, each == the prompt alone
    prompts = ["Hello there", "One two three", [1, 2, 3, 4]]
    st, b = post(U + "/v1/completions", {"prompt": prompts, "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    alone = [post(U + "/v1/completions", {"prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": True})[1]
             for p in prompts]
    check("batched prompts: one choice per prompt (index), each == the prompt alone", st == 200 and
          [c["index"] for c in b["choices"]] == [0, 1, 2] and
          [c["text"] for c in b["choices"]] == [a["choices"][0]["text"] for a in alone] and
          b["usage"]["completion_tokens"] == 15, b)
    # 4. n and best_of (seeded: run j uses seed + j)
    req = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 11, "ignore_eos": True,
           "logprobs": 0}
    st, nn = post(U + "/v1/completions", dict(req, n=3))
    st1, one = post(U + "/v1/completions", req)
    check("n = 3: three choices, the first == n = 1 with the same seed", st == 200 and len(nn["choices"]) == 3 and
          nn["choices"][0]["text"] == one["choices"][0]["text"] and nn["usage"]["completion_tokens"] == 18, nn)
    st, bo = post(U + "/v1/completions", dict(req, n=1, best_of=3))
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in nn["choices"]]
    check("best_of = 3: the run with the highest cumulative logprob", st == 200 and len(bo["choices"]) == 1 and
          bo["choices"][0]["text"] == nn["choices"][max(range(3), key=lambda k: sums[k])]["text"], (bo, sums))
    # 5. stop_reason
    st, g = post(U + "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    text = g["choices"][0]["text"]
    stop = text[3:5] if len(text) > 5 else None
    if stop:
        st, sj = post(U + "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "stop": [stop]})
        check("stop_reason: the matched stop string", sj["choices"][0]["finish_reason"] == "stop" and
              sj["choices"][0]["stop_reason"] == stop, sj)
    st, tk = post(U + "/tokenize", {"prompt": "Hello"})
    # the 2nd greedy token's id: its string (top 1 of its row) through /tokenize
    st, d = post(U + "/v1/completions", {"prompt": tk["tokens"], "max_tokens": 3, "temperature": 0,
                                         "ignore_eos": True, "logprobs": 5})
    top2 = d["choices"][0]["logprobs"]["top_logprobs"][1]
    st, ids2 = post(U + "/tokenize", {"prompt": next(iter(top2)), "add_special_tokens": False})
    if len(ids2["tokens"]) == 1:
        sid = ids2["tokens"][0]
        st, sj = post(U + "/v1/completions", {"prompt": tk["tokens"], "max_tokens": 3, "temperature": 0,
                                              "ignore_eos": True, "stop_token_ids": [sid]})
        check("stop_reason: the stop_token_ids entry", sj["choices"][0]["stop_reason"] == sid and
              sj["usage"]["completion_tokens"] == 2, sj)
    # 6. penalties, min_p, logit_bias against the raw top logprobs (greedy: argmax of the adjusted row)
    pen = {"presence_penalty": 1.0, "frequency_penalty": 1.5}
    st, pj = post(U + "/v1/completions", dict({"prompt": "a a a a a", "max_tokens": 10, "temperature": 0,
                                               "ignore_eos": True, "logprobs": 20}, **pen))
    lpj = pj["choices"][0]["logprobs"]
    ok, seen = True, {}
    for tokstr, top in zip(lpj["tokens"], lpj["top_logprobs"]):
        adj = {t: v - (pen["frequency_penalty"] * seen.get(t, 0) + pen["presence_penalty"] * (t in seen))
               for t, v in top.items()}
        ok &= max(adj, key=adj.get) == tokstr
        seen[tokstr] = seen.get(tokstr, 0) + 1
    check("presence/frequency_penalty: each greedy token is the argmax of the penalized row", st == 200 and ok, pj)
    st, gj = post(U + "/v1/completions", {"prompt": "a a a a a", "max_tokens": 6, "temperature": 0,
                                          "ignore_eos": True})
    st, mj = post(U + "/v1/completions", {"prompt": "a a a a a", "max_tokens": 6, "temperature": 1.0, "seed": 3,
                                          "min_p": 1.0, "ignore_eos": True})
    check("min_p = 1: only the most likely token survives (== greedy)", mj["choices"][0]["text"] ==
          gj["choices"][0]["text"], (mj, gj))
    st, lb = post(U + "/v1/completions", {"prompt": "a a a a a", "max_tokens": 4, "temperature": 0,
                                          "ignore_eos": True, "logit_bias": {"9707": 100}})
    st, dt = post(U + "/detokenize", {"tokens": [9707] * 4})
    check("logit_bias +100: that token every step", lb["choices"][0]["text"] == dt["prompt"], (lb, dt))
    # 7. stream_options.continuous_usage_stats
    st, _, body = request("POST", U + "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 0,
                          "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True,
                                                                                 "continuous_usage_stats": True}})
    ev = [e for e in sse_events(body.decode()) if e != "[DONE]"]
    us = [e.get("usage") for e in ev]
    check("continuous_usage_stats: usage on every chunk, completion_tokens growing to 4",
          st == 200 and all(u is not None for u in us) and us[-1]["completion_tokens"] == 4 and
          [u["completion_tokens"] for u in us] == sorted(u["completion_tokens"] for u in us), us)
    # 8. n > 1 streamed: every index finishes
    st, _, body = request("POST", U + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                          "max_tokens": 3, "n": 2, "stream": True, "temperature": 0})
    ev = [e for e in sse_events(body.decode()) if e != "[DONE]"]
    fins = sorted(c["index"] for e in ev for c in e["choices"] if c.get("finish_reason"))
    check("chat n = 2 streamed: both indices finish", st == 200 and fins == [0, 1], ev[-3:])
    # 9. routes and the field policy
    st, m = cj(U + "/v1/models/" + name)
    st2, m2 = cj(U + "/v1/models/nope")
    check("GET /v1/models/{id}: the model, 404 for another", st == 200 and m["id"] == name and st2 == 404, (m, m2))
    st, v = cj(U + "/version")
    check("GET /version", st == 200 and isinstance(v.get("version"), str), v)
    st, j = post(U + "/v1/completions", {"prompt": "x", "max_tokens": 1, "frobnicate": 1, "stream_options_x": 2})
    time.sleep(0.2)
    check("unknown fields: accepted, one warning line naming them",
          st == 200 and re.search(r"WARNING .*ignoring unknown fields: 'frobnicate', 'stream_options_x'", S.logtext())
          is not None, j)
    st, j = post(U + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "weird": 1}],
                                              "max_tokens": 1, "chat_template_kwargs": {"foo": 1}})
    check("chat: unknown message key and chat_template_kwargs key ignored", st == 200, j)
    # 10. token-id arrays are read straight from the body text: the same answers as jansson's path (an
    # escaped key, which the fast path leaves alone, forces that one), and a 7 MB array costs a few times
    # its size in memory rather than ~20x
    for body in ['{"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0}',
                 '{"prompt": [[5, 6], [7], [8, 9, 10]], "max_tokens": 2, "temperature": 0}',
                 '{"prompt": [1, 999999999]}', '{"prompt": [[1], []]}', '{"prompt": []}', '{"prompt": [1.0]}',
                 '{"prompt": [[1], "two"], "max_tokens": 1, "temperature": 0}', '{"prompt": [-0], "max_tokens": 2, "temperature": 0}']:
        a = curl(U + "/v1/completions", data=body)
        b = curl(U + "/v1/completions", data=body.replace('"prompt"', '"pr\\u006fmpt"', 1))
        ja, jb = json.loads(a[1]), json.loads(b[1])
        same = a[0] == b[0] and ([c["text"] for c in ja["choices"]] == [c["text"] for c in jb["choices"]]
                                 if a[0] == 200 else ja["error"]["message"] == jb["error"]["message"])
        check(f"id arrays from the body text == jansson's path: {body[:40]}", same, (a, b))

    def status_kb(key):
        for line in open(f"/proc/{S.p.pid}/status"):
            if line.startswith(key):
                return int(line.split()[1])
    rng = random.Random(5)
    ids = [rng.randrange(100) for _ in range(2_500_000)]
    for path, key in (("/detokenize", "tokens"), ("/v1/completions", "prompt")):
        body = json.dumps({key: ids}, separators=(",", ":"))
        with open(f"/proc/{S.p.pid}/clear_refs", "w") as f:
            f.write("5")  # resets the peak (VmHWM) to the current RSS
        before = status_kb("VmRSS")
        st, _, _ = request("POST", U + path, body, timeout=120)
        rise = (status_kb("VmHWM") - before) * 1024
        check(f"{path}: a {len(body) / 1e6:.1f} MB id array peaks at {rise / len(body):.1f}x its size (< 5x)",
              st in (200, 400) and rise < 5 * len(body), (st, rise))
    # 10. the openai client
    import openai
    client = openai.OpenAI(base_url=U + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.completions.create(model=name, prompt="Hello", max_tokens=4, n=2, temperature=0)
    check("openai: completions n = 2", len(r.choices) == 2 and {c.index for c in r.choices} == {0, 1})
    r = client.completions.create(model=name, prompt=ptoks, max_tokens=1, temperature=0, echo=True, logprobs=1)
    check("openai: echo + logprobs", r.choices[0].logprobs.token_logprobs[0] is None and
          abs(r.choices[0].logprobs.token_logprobs[n - 1] - el["token_logprobs"][n - 1]) < 1e-6)
    r = client.completions.create(model=name, prompt="a a a a a", max_tokens=10, temperature=0, logprobs=20,
                                  presence_penalty=1.0, frequency_penalty=1.5, extra_body={"ignore_eos": True})
    check("openai: penalties", r.choices[0].text == pj["choices"][0]["text"])
    if stop:
        r = client.completions.create(model=name, prompt="Hello", max_tokens=8, temperature=0, stop=[stop])
        check("openai: stop_reason", (r.choices[0].model_extra or {}).get("stop_reason") == stop, r)
    r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, n=3,
                                       temperature=0.9, seed=4)
    check("openai: chat n = 3", sorted(c.index for c in r.choices) == [0, 1, 2])
    check("openai: models.retrieve", client.models.retrieve(name).id == name)


def features_smoke(S):
    """The new request paths once each, for the sanitizers: batches x n, best_of, prompt logprobs, penalties,
    multi-choice streams, a hang-up while waiting."""
    U = S.url
    reqs = [("/v1/completions", {"prompt": ["a b", [1, 2, 3]], "n": 2, "max_tokens": 3, "temperature": 0.7, "seed": 1}),
            ("/v1/completions", {"prompt": "x y z", "best_of": 3, "max_tokens": 3, "temperature": 1.0, "seed": 2}),
            ("/v1/completions", {"prompt": [5, 6, 7, 8], "echo": True, "logprobs": 3, "max_tokens": 0}),
            ("/v1/completions", {"prompt": [5, 6, 7, 8], "echo": True, "logprobs": 2, "max_tokens": 2,
                                 "prompt_logprobs": 4, "stop": ["e"], "stop_token_ids": [9]}),
            ("/v1/completions", {"prompt": "p", "max_tokens": 4, "presence_penalty": 1, "frequency_penalty": 1,
                                 "min_p": 0.2, "logit_bias": {"5": 3}, "temperature": 0.9, "seed": 3}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "odd": 1}], "n": 2,
                                      "max_tokens": 2, "prompt_logprobs": 1, "unknown": [1]})]
    ok = all(cj(U + path, body)[0] == 200 for path, body in reqs)
    st, _, body = request("POST", U + "/v1/completions", {"prompt": ["a", "b"], "n": 2, "max_tokens": 3,
                          "stream": True, "echo": True, "logprobs": 1, "stream_options": {
                              "include_usage": True, "continuous_usage_stats": True}})
    ok &= st == 200 and body.endswith(b"data: [DONE]\n\n")
    s = socket.create_connection(("127.0.0.1", S.port))
    b = json.dumps({"prompt": "gone", "n": 3, "max_tokens": 100, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    time.sleep(0.3)
    s.close()
    check("asan: batches, n, best_of, prompt logprobs, penalties, multi-choice streams, a hang-up", ok)


def prefix_cache_section(binary, model, name, mode):
    """Automatic prefix caching: cached_tokens in usage (completions, chat, streamed), the same logprobs as
    without the cache (tp 1 is exact), a strict prefix, the same prompt twice at once, prompt logprobs
    computing their prompt whole, /metrics' hits == the cached_tokens summed over the responses, eviction
    when KV memory is full, and --no-prefix-caching. Run under ASan too (leaks at shutdown)."""
    common = ["--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "4"]
    rng = random.Random(32)

    def ids(n):
        return [rng.randrange(1000, 20000) for _ in range(n)]

    def comp(S, prompt, **kw):
        body = dict({"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2, "ignore_eos": True}, **kw)
        st, j = cj(S.url + "/v1/completions", body)
        assert st == 200, (st, j)
        return j

    def cached(j):
        return j["usage"]["prompt_tokens_details"]["cached_tokens"]

    def hits(S):
        m = parse_metrics(S.url)
        return tuple(sample(m, f, f + "_total") for f in ("echo:prefix_cache_hits", "echo:prefix_cache_queries",
                                                          "echo:prefix_cache_requests"))

    on = Server(binary, model, *common, name="prefix-on")
    off = None
    try:
        check("prefix: the plan line says prefix caching is on and how many blocks it may hold",
              re.search(r"plan: .*prefix caching on \(may hold all \d+ blocks", on.logtext()), on.logtext()[-800:])
        h0 = hits(on)
        seen, queried, looked = 0, 0, 0
        p = ids(100)
        a = comp(on, p)
        b = comp(on, p)
        check("prefix: first request cached_tokens 0, the same prompt again 96 (6 blocks of 16; the last token "
              "is recomputed)", cached(a) == 0 and cached(b) == 96, (a["usage"], b["usage"]))
        check("prefix: the cached request's tokens and logprobs == the uncached one's, bit for bit",
              a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"] and
              a["choices"][0]["text"] == b["choices"][0]["text"])
        c = comp(on, p[:40])
        check("prefix: a strict prefix of a cached prompt reuses its whole blocks (32 of 40)", cached(c) == 32,
              c["usage"])
        longer = p[:70] + ids(30)
        d = comp(on, longer)
        check("prefix: a prompt sharing 70 tokens reuses 64", cached(d) == 64, d["usage"])
        seen += sum(cached(x) for x in (a, b, c, d))
        queried += 100 + 100 + 40 + 100
        looked += 4
        # streamed usage: the final usage chunk and continuous usage stats carry cached_tokens
        st, _, body = request("POST", on.url + "/v1/completions", {"prompt": p, "max_tokens": 3, "temperature": 0,
                              "stream": True, "stream_options": {"include_usage": True,
                                                                 "continuous_usage_stats": True}})
        ev = [e for e in sse_events(body.decode()) if isinstance(e, dict)]
        us = [e["usage"]["prompt_tokens_details"]["cached_tokens"] for e in ev if e.get("usage")]
        check("prefix: streamed usage (final chunk and continuous) reports cached_tokens", st == 200 and us and
              all(u == 96 for u in us), us)
        seen += 96
        queried += 100
        looked += 1
        # chat: the same conversation twice, then one more turn
        msgs = [{"role": "system", "content": " ".join(["rules"] * 80)}, {"role": "user", "content": "hi there"}]
        st1, c1 = cj(on.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "temperature": 0})
        st2, c2 = cj(on.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "temperature": 0,
                                                       "stream": False})
        turn = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
        st3, c3 = cj(on.url + "/v1/chat/completions", {"messages": turn, "max_tokens": 3, "temperature": 0})
        ok = st1 == st2 == st3 == 200
        check("prefix: chat reports cached_tokens (0, then > 0 for the same messages and for the next turn), "
              "same answer", ok and cached(c1) == 0 and cached(c2) > 0 and cached(c3) >= cached(c2) - 16 and
              c1["choices"][0]["message"] == c2["choices"][0]["message"], [x.get("usage") for x in (c1, c2, c3)])
        for x in (c1, c2, c3):
            seen += cached(x) if ok else 0
            queried += x["usage"]["prompt_tokens"] if ok else 0
        looked += 3
        # the same new prompt twice at once (n = 2: both in one step): both computed, same answers
        q = ids(50)
        st, j = cj(on.url + "/v1/completions", {"prompt": q, "n": 2, "max_tokens": 4, "temperature": 0,
                                                "logprobs": 1})
        ch = j.get("choices", [{}, {}])
        check("prefix: the same prompt twice in one step: same tokens and logprobs", st == 200 and
              ch[0].get("logprobs") == ch[1].get("logprobs"), j)
        seen += cached(j) if st == 200 else 0
        queried += 100
        looked += 2
        e = comp(on, q)
        check("prefix: ... and the next request maps the prompt once cached (48 of 50)", cached(e) == 48, e["usage"])
        seen += cached(e)
        queried += 50
        looked += 1
        # prompt logprobs (vLLM's prompt_logprobs; echo + logprobs) compute their prompt whole
        f = comp(on, p, prompt_logprobs=1)
        g = comp(on, p, echo=True)
        check("prefix: prompt_logprobs and echo + logprobs requests report cached_tokens 0 (prompt computed whole)",
              cached(f) == 0 and cached(g) == 0, (f["usage"], g["usage"]))
        h1 = hits(on)
        dh = [x - y for x, y in zip(h1, h0)]
        check("prefix: /metrics prefix_cache_hits_total grew by the cached_tokens summed over the responses, "
              "queries by their prompt tokens, requests by the lookups", dh == [seen, queried, looked],
              (dh, [seen, queried, looked]))
        m = parse_metrics(on.url)
        cc = m["echo:cache_config_info"].samples[0].labels if "echo:cache_config_info" in m else {}
        check("prefix: cache_config_info says enable_prefix_caching True; blocks gauges idle-consistent",
              cc.get("enable_prefix_caching") == "True" and
              sample(m, "echo:kv_blocks_in_use", "echo:kv_blocks_in_use") == 0 and
              sample(m, "echo:prefix_cache_blocks", "echo:prefix_cache_blocks") ==
              sample(m, "echo:prefix_cache_evictable_blocks", "echo:prefix_cache_evictable_blocks") > 0, cc)
        # --no-prefix-caching: nothing cached, the same logprobs as the cache hit above
        off = Server(binary, model, *common, "--no-prefix-caching", name="prefix-off")
        x1, x2 = comp(off, p), comp(off, p)
        check("prefix: --no-prefix-caching: cached_tokens 0 twice, the plan line says off, logprobs == the "
              "cache hit's", cached(x1) == cached(x2) == 0 and "prefix caching off" in off.logtext() and
              x2["choices"][0]["logprobs"] == b["choices"][0]["logprobs"], (x1["usage"], x2["usage"]))
    finally:
        logs = [on.stop()] + ([off.stop()] if off else [])
    check("prefix servers: SIGTERM -> exit 0", all(rc == 0 for rc, _ in logs), [rc for rc, _ in logs])
    # KV memory full: 24 blocks of 16 (384 tokens) for requests of 120 + 8: cached prompts are evicted
    small = Server(binary, model, "--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "2",
                   "--num-kv-blocks", "24", name="prefix-small")
    try:
        prompts = [ids(120) for _ in range(6)]
        first = comp(small, prompts[0], max_tokens=8)
        with cf.ThreadPoolExecutor(4) as ex:
            rs = list(ex.map(lambda pr: comp(small, pr, max_tokens=8), prompts[1:] * 2))
        again = comp(small, prompts[0], max_tokens=8)
        m = parse_metrics(small.url)
        ev = sample(m, "echo:prefix_cache_evicted_blocks", "echo:prefix_cache_evicted_blocks_total")
        check("prefix: KV full: every request served, cached blocks evicted, and a prompt whose blocks were "
              "evicted gets the same logprobs", len(rs) == 10 and ev and ev > 0 and
              again["choices"][0]["logprobs"] == first["choices"][0]["logprobs"], (ev, again["usage"]))
    finally:
        rc, log = small.stop()
    logs.append((rc, log))
    check("prefix small-KV server: SIGTERM -> exit 0", rc == 0, rc)
    bad = [l for _, lg in logs for l in lg.splitlines()
           if re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|Sanitizer has encountered|runtime error:", l)]
    check("prefix servers: no sanitizer reports (leaks included) at shutdown", not bad, "\n".join(bad[:10]))


def limits_section(binary, model, name):
    """Hostile clients: the request deadline, the per-client cap, --max-connections (503 + Retry-After at
    once, counted in /metrics), and a non-streaming request whose client hangs up."""
    S = Server(binary, model, "--served-model-name", name, "--max-model-len", "256", "--timeout", "30",
               "--request-deadline", "2", "--max-connections", "16", "--max-connections-per-client", "4",
               name="limits")
    try:
        port = S.port
        m0 = parse_metrics(S.url)

        def slow_conn(src):
            s = socket.socket()
            s.bind((src, 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            return s

        slow = [slow_conn("127.0.0.2") for _ in range(20)]
        t0 = time.time()
        # the 16 over the per-client cap get a whole 503 with Retry-After at once
        def read_all(s, limit):
            s.settimeout(limit)
            data = b""
            try:
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    data += b
            except OSError:
                pass
            return data
        over = [read_all(s, 1.0) for s in slow[4:]]
        check("per-client cap: 16 connections over it answered 503 + Retry-After at once",
              all(d.startswith(b"HTTP/1.1 503") and b"Retry-After:" in d and b'"code":503' in d for d in over) and
              time.time() - t0 < 5, [d[:40] for d in over][:3])
        # /health from another address answers while the slow ones trickle, each byte resetting the idle timeout
        ok = 0
        for i in range(20):
            for s in slow[:4]:
                try:
                    s.sendall(b"X")
                except OSError:
                    pass
            try:
                st, _, _ = request("GET", S.url + "/health", timeout=2)
                ok += st == 200
            except OSError:
                pass
            time.sleep(0.1)
        check("/health answers 20 of 20 probes during the slow clients", ok == 20, ok)
        closed = []
        for s in slow[:4]:
            d = read_all(s, 4.0)
            closed.append((d, time.time() - t0))
        check("request deadline: the trickling connections are closed (~2 s) though each byte resets the idle "
              "timeout (30 s)", all(d == b"" for d, _ in closed) and max(t for _, t in closed) < 8,
              [(d[:20], round(t, 1)) for d, t in closed])
        for s in slow:
            s.close()
        # the server sees those closes (and the probes') asynchronously: let them land before counting to 16
        time.sleep(1.0)
        # --max-connections: 16 idle connections from 4 addresses, then a 17th from a 5th
        idle = [slow_conn(f"127.0.0.{3 + i // 4}") for i in range(16)]
        time.sleep(0.3)
        extra = slow_conn("127.0.0.9")
        d = read_all(extra, 2.0)
        check("--max-connections: the 17th connection answered 503 + Retry-After", d.startswith(b"HTTP/1.1 503") and
              b"Retry-After:" in d, d[:80])
        for s in idle + [extra]:
            s.close()
        time.sleep(0.5)
        st, h, _ = request("GET", S.url + "/health")
        m1 = parse_metrics(S.url)

        def delta(fam, sname, **lb):
            return (sample(m1, fam, sname, **lb) or 0) - (sample(m0, fam, sname, **lb) or 0)
        check("/metrics counts the refused connections by reason",
              delta("echo:http_connections_rejected", "echo:http_connections_rejected_total", reason="per_client") == 16
              and delta("echo:http_connections_rejected", "echo:http_connections_rejected_total",
                        reason="max_connections") == 1 and
              delta("echo:http_request_deadline_closed", "echo:http_request_deadline_closed_total") >= 4,
              {k: v for k, v in m1.items() if "rejected" in k or "deadline" in k})
        # every 503 carries Retry-After (queue full: a server with a tiny queue below)
        # non-streaming requests whose clients hang up are cancelled, their KV freed
        gen0 = sample(m1, "echo:generation_tokens", "echo:generation_tokens_total") or 0
        ab0 = sample(m1, "echo:request_success", "echo:request_success_total", finished_reason="abort") or 0
        # (max-model-len is 256 here.) Finished with "abort", not "length": cut before their 200 tokens
        # however fast the model decodes, so the tokens stay below 3 x 200
        body = json.dumps({"prompt": "hang up", "max_tokens": 200, "ignore_eos": True, "temperature": 0}).encode()
        socks = []
        for i in range(3):  # the cap is 4 per address: /metrics keeps one
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            socks.append(s)
        time.sleep(0.4)
        for s in socks:
            s.close()
        m2 = None
        for _ in range(50):
            m2 = parse_metrics(S.url)
            if (sample(m2, "echo:num_requests_running", "echo:num_requests_running") == 0 and
                    (sample(m2, "echo:request_success", "echo:request_success_total", finished_reason="abort") or 0)
                    - ab0 >= 3):
                break
            time.sleep(0.1)
        gen = (sample(m2, "echo:generation_tokens", "echo:generation_tokens_total") or 0) - gen0
        ab = (sample(m2, "echo:request_success", "echo:request_success_total", finished_reason="abort") or 0) - ab0
        check("abandoned non-streaming requests cancelled (abort), KV freed, fewer than 3 x 200 tokens",
              ab == 3 and gen < 600 and sample(m2, "echo:kv_cache_usage_perc", "echo:kv_cache_usage_perc") == 0,
              (ab, gen))
    finally:
        rc, log = S.stop()
    check("limits server: SIGTERM -> exit 0", rc == 0, (rc, log[-2000:]))
    bad = [l for l in log.splitlines()
           if re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|Sanitizer has encountered|runtime error:", l)]
    check("limits server: no sanitizer reports", not bad, "\n".join(bad[:10]))


# ---------------------------------------------------------------- issue 35: repros and the property test

def raw_http(port, method, target, headers=(), body=None, timeout=30):
    """One request from raw bytes (target and headers may hold any bytes but CR/LF);
    returns (status or None when closed unanswered, headers dict, body bytes)."""
    h = [b"Host: x", b"Connection: close"] + list(headers)
    if body is not None:
        h.append(b"Content-Length: %d" % len(body))
    data = method + b" " + target + b" HTTP/1.1\r\n" + b"\r\n".join(h) + b"\r\n\r\n" + (body or b"")
    out = raw_exchange(port, data, timeout=timeout)
    head, _, rest = out.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    if not m:
        return None, {}, out
    hdrs = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        hdrs[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        dec, p = b"", rest
        while p:
            ln, _, p = p.partition(b"\r\n")
            n = int(ln.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            dec, p = dec + p[:n], p[n + 2:]
        rest = dec
    return int(m.group(1)), hdrs, rest


def strict_json(body):
    """The body as JSON, or None: strict UTF-8 first (jansson must never emit anything else)."""
    try:
        return json.loads(body.decode("utf-8", "strict"))
    except (UnicodeDecodeError, ValueError):
        return None


def pct(b):
    return "".join(chr(c) if (0x30 <= c <= 0x39 or 0x41 <= c <= 0x5a or 0x61 <= c <= 0x7a or c in b"-._~")
                   else "%%%02X" % c for c in b).encode()


def regress35_section(S, name):
    """Issue 35's repros, each with the status or offsets the issue names."""
    port, U = S.port, S.url
    a199 = b"a" * 199
    fives = lambda: int(re.search(r'^echo:http_responses_total\{status="5xx"\} (\d+)$',
                                  request("GET", U + "/metrics")[2].decode(), re.M).group(1))
    fives0 = fives()

    def post_raw(path, body):
        return raw_http(port, b"POST", path, [b"Content-Type: application/json"], body)

    def err_ok(res, status):
        st, _, body = res
        j = strict_json(body)
        return st == status and is_error_shape(j, status), (st, body[:200])

    # D1: strings cut by bytes, path ids unchecked, every encoding failure called "out of memory"
    body = b'{"model": "' + a199 + "é".encode() + b'", "prompt": "hi", "max_tokens": 1}'
    ok, d = err_ok(post_raw(b"/v1/completions", body), 404)
    check("issue 35 D1: completions model '<199 a>é' -> 404 in error shape", ok, d)
    body = b'{"model": "' + a199 + "€".encode() + b'", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    ok, d = err_ok(post_raw(b"/v1/chat/completions", body), 404)
    check("issue 35 D1: chat model '<199 a>€' -> 404 in error shape", ok, d)
    for tgt in [b"%ff", b"%c3", a199 + b"%C3%A9"]:
        ok, d = err_ok(raw_http(port, b"GET", b"/v1/models/" + tgt), 404)
        check(f"issue 35 D1: GET /v1/models/{tgt[-12:].decode()} -> 404 in error shape", ok, d)
    key = "a" + "é" * 100
    ok, d = err_ok(post_raw(b"/v1/completions", json.dumps(
        {"prompt": "hi", "max_tokens": 1, "logit_bias": {key: 1}}, ensure_ascii=False).encode()), 400)
    check("issue 35 D1: logit_bias key 'a' + 'é' x 100 -> 400 in error shape", ok, d)
    # every one of those was a 500 "out of memory"; nothing answered 5xx since
    check("issue 35 D1: none of those answered 5xx (/metrics' count)", fives() == fives0, (fives0, fives()))

    # D2: text_offset in characters (code points)
    st, j = cj(U + "/v1/completions", {"prompt": "é中文😀a", "echo": True, "logprobs": 0, "max_tokens": 0})
    lp = j["choices"][0]["logprobs"] if st == 200 else {}
    check("issue 35 D2: echo text_offset of 'é中文😀a' == [0, 1, 3, 4]", lp.get("text_offset") == [0, 1, 3, 4], j)
    # a character split over two byte-level tokens: it counts once, with the token holding its
    # first byte; the next token starts after it (internal.h, srv_offsets)
    vocab = json.load(open(os.path.join(S.args[S.args.index("--model") + 1], "tokenizer.json")))["model"]["vocab"]
    ids = [vocab["a"], vocab["Ã"], vocab["©"], vocab["b"]]  # byte-level: 0xC3 0xA9 is 'é'
    st, j = cj(U + "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 0, "max_tokens": 0})
    ch = j["choices"][0] if st == 200 else {}
    check("issue 35 D2: 'a' + (0xC3 | 0xA9) + 'b' as 4 tokens -> text 'aéb', text_offset [0, 1, 2, 2]",
          ch.get("text") == "aéb" and ch["logprobs"]["text_offset"] == [0, 1, 2, 2], j)
    # generated tokens, whole and streamed: the same offsets, each a character index into the text
    req = {"prompt": "日本語のテキスト", "max_tokens": 12, "temperature": 0, "logprobs": 1, "echo": True,
           "ignore_eos": True}
    st, j = cj(U + "/v1/completions", req)
    ch = j["choices"][0]
    text, lpx = ch["text"], ch["logprobs"]
    offs, toks = lpx["text_offset"], lpx["tokens"]
    inside = all(text[o:o + len(t)] == t for o, t in zip(offs, toks) if "\ufffd" not in t)
    check("issue 35 D2: echo + generated: each whole token string sits at its text_offset (characters)",
          st == 200 and inside and offs == sorted(offs) and offs[-1] <= len(text), (text, offs, toks))
    st, _, body = request("POST", U + "/v1/completions", dict(req, stream=True))
    evs = [e for e in sse_events(body.decode()) if isinstance(e, dict)]
    soffs = [o for e in evs for c in e["choices"] if c.get("logprobs") for o in c["logprobs"]["text_offset"]]
    check("issue 35 D2: streamed text_offset == the whole answer's", soffs == offs, (soffs, offs))
    req2 = dict(req, echo=False)
    st, j2 = cj(U + "/v1/completions", req2)
    o2 = j2["choices"][0]["logprobs"]["text_offset"]
    st, _, body = request("POST", U + "/v1/completions", dict(req2, stream=True))
    s2 = [o for e in sse_events(body.decode()) if isinstance(e, dict) for c in e["choices"]
          if c.get("logprobs") for o in c["logprobs"]["text_offset"]]
    np_ = len(offs) - len(o2)
    check("issue 35 D2: generated-only text_offset == the echoed ones less the prompt's characters",
          st == 200 and o2 and o2 == [x - offs[np_] for x in offs[np_:]] and
          offs[np_] == len("日本語のテキスト"), (o2, offs))
    check("issue 35 D2: generated-only text_offset streamed == whole", s2 == o2, (s2, o2))

    # D3: a NUL in a path id is a byte of it
    ok, d = err_ok(raw_http(port, b"GET", b"/v1/models/" + name.encode() + b"%00x"), 404)
    check(f"issue 35 D3: GET /v1/models/{name}%00x -> 404", ok, d)
    st, _, body = raw_http(port, b"GET", b"/v1/models/" + pct(name.encode()).replace(b"-", b"%2D"))
    check("issue 35 D3: a percent-encoded id still names the model (200)",
          st == 200 and (strict_json(body) or {}).get("id") == name, (st, body[:200]))

    # D4: the stop_token_ids cap says so; a 100 kB target gets a JSON error
    st, _, body = request("POST", U + "/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                                          "stop_token_ids": list(range(100000))})
    j = strict_json(body)
    check("issue 35 D4: 100,000 stop_token_ids -> 400 naming the cap",
          st == 400 and is_error_shape(j, 400) and "at most 1024" in j["error"]["message"], j)
    for meth, path in [(b"GET", b"/v1/models/"), (b"POST", b"/v1/completions?x=")]:
        st, hd, body = raw_http(port, meth, path + b"a" * 100000, body=b"{}" if meth == b"POST" else None)
        check(f"issue 35 D4: {meth.decode()} with a 100 kB target -> 414 JSON error",
              st == 414 and is_error_shape(strict_json(body), 414) and "json" in hd.get("content-type", ""),
              (st, body[:200]))

    # D5: "developer" is "system" for a template without that role
    def toks(role):
        st, j = cj(U + "/tokenize", {"messages": [{"role": role, "content": "Be brief."},
                                                  {"role": "user", "content": "hi"}]})
        return st, j.get("tokens") if isinstance(j, dict) else j
    sd, td = toks("developer")
    ss, ts = toks("system")
    check("issue 35 D5: role developer renders as system (same prompt tokens)", sd == ss == 200 and td == ts, (sd, td, ts))
    st, j = cj(U + "/v1/chat/completions", {"messages": [{"role": "developer", "content": "Be brief."},
                                                         {"role": "user", "content": "hi"}], "max_tokens": 2})
    check("issue 35 D5: chat with a developer message -> 200", st == 200, j)


def adversarial_strings():
    """Byte strings (may be invalid UTF-8) and raw JSON escape texts ("esc", s) to put into string fields."""
    out = []
    for ch in ["é", "€", "😀", "中"]:  # a multi-byte character across every cut the server has made
        for k in [39, 40, 59, 60, 199, 200, 201, 509, 510, 511, 1023]:
            out.append(b"a" * k + ch.encode())
            out.append(b"a" * k + ch.encode() + b"z" * 5)
    out += [b"\xff", b"\xfe\xff", b"\xc3", b"a\xc3", b"\xe2\x82", b"\x80", b"\xbf\xbf",  # split / stray bytes
            b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf8\x88\x80\x80\x80",  # overlong
            b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80",  # surrogates, beyond U+10FFFF
            b"\x00", b"a\x00b", b"\x00" * 3,  # raw NULs
            b"%00", b"%ff", b"%c3", b"%C3%A9", b"%2F..%2F", b"%", b"%%", b"%zz",  # percent-encoded bytes
            b"a" * 100000, "é".encode() * 50000, "😀".encode() * 25000, b"a" * 99999 + "é".encode(),  # 100 kB
            b"", b" ", b"\t\x01\x1f\x7f", "\u2028\u2029\ufeff\ufffd".encode(), "e\u0301".encode()]
    out += [("esc", e) for e in ["\\u0000", "a\\u0000b", "\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d",
                                 "\\ud83d\\ude00", "\\u00e9" * 300]]
    return out


def json_str(v):
    """A JSON string literal from bytes (raw, only '"', '\\' and control bytes escaped) or an escape text."""
    if isinstance(v, tuple):
        return b'"' + v[1].encode() + b'"'
    o = bytearray(b'"')
    for c in v:
        if c in (0x22, 0x5c):
            o += b"\\" + bytes([c])
        elif c < 0x20:
            o += b"\\u%04x" % c
        else:
            o.append(c)
    return bytes(o + b'"')


def to_json(x):
    """Serialize with bytes / ("esc", s) leaves as raw string literals (keys too)."""
    if isinstance(x, dict):
        return b"{" + b",".join(to_json(k if not isinstance(k, str) else k.encode()) + b":" + to_json(v)
                                for k, v in x.items()) + b"}"
    if isinstance(x, list):
        return b"[" + b",".join(to_json(v) for v in x) + b"]"
    if isinstance(x, (bytes, tuple)):
        return json_str(x)
    if isinstance(x, str):
        return json_str(x.encode())
    return json.dumps(x).encode()


def adv_text(x):
    """An adversarial string as text (schemas are built and dumped as Python JSON)."""
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else x[1] if isinstance(x, tuple) else str(x)


def gen_schema(rng, adv, depth=0):
    """A random JSON schema for the structured-output property: well-formed and malformed, the
    keywords xgrammar enforces and those it does not, $ref chains, cycles, fan-outs and remote
    refs, siblings beside $ref/anyOf/const, contradictions, odd counts and adversarial text."""
    A = lambda: adv_text(rng.choice(adv))
    S = lambda: gen_schema(rng, adv, depth + 1) if depth < 4 else {"type": rng.choice(["integer", "string"])}
    r = rng.random()
    if r < 0.05:
        return rng.choice([True, False, None, 3, "x", [], {}])
    if r < 0.12:  # a $ref chain (sometimes far past the nesting budget), a cycle, a fan-out
        n = rng.choice([2, 5, 40, 300, 1500])
        d = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
        d[f"d{n}"] = rng.choice([{"type": "integer"}, {"$ref": "#/$defs/d0"}, S()])
        if rng.random() < 0.3:
            d = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"},
                                                            "b": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
            d[f"d{n}"] = {"type": "integer"}
        return {"$defs": d, "$ref": "#/$defs/d0"}
    if r < 0.16:
        return {"$ref": rng.choice(["http://example.com/s.json", "#/nope", "#/$defs/" + A(), "s.json#/a", A(), "#"]),
                "$defs": {"x": S()}}
    t = rng.choice(["object", "object", "array", "string", "integer", "number", "boolean", "null", None, ["string", "null"]])
    sch = {} if t is None else {"type": t}
    if t == "object":
        k = rng.choice([0, 1, 3, 8, 300])
        props = ({f"p{i}": {"type": "integer"} for i in range(k)} if k == 300 else  # past the properties budget
                 {(A()[:40] if rng.random() < 0.3 else f"p{i}"): S() for i in range(k)})
        sch["properties"] = props
        if rng.random() < 0.5:
            keys = list(props)
            sch["required"] = rng.sample(keys, min(len(keys), rng.randint(0, 2))) + ([A()] if rng.random() < 0.2 else [])
        if rng.random() < 0.3:
            sch["additionalProperties"] = rng.choice([False, True, S()])
    elif t == "array":
        sch["items"] = S()
        if rng.random() < 0.3:
            sch["minItems"] = rng.choice([-1, 0, 1, 2, 1.5, "2"])
        if rng.random() < 0.3:
            sch["maxItems"] = rng.choice([0, 1, 3])
        if rng.random() < 0.2:
            sch["prefixItems"] = [S()]
    elif t == "string":
        if rng.random() < 0.3:
            sch["pattern"] = rng.choice(["^[a-z]{1,5}$", "^\\t$", "(", "^\\d+$", A()[:60]])
        if rng.random() < 0.3:
            sch["format"] = rng.choice(["email", "date", "uuid", "phone", A()[:20]])
        if rng.random() < 0.3:
            sch[rng.choice(["minLength", "maxLength"])] = rng.choice([-1, 0, 3, 10, 2**40])
    elif t in ("integer", "number"):
        for kw in ("minimum", "maximum", "exclusiveMinimum", "multipleOf"):
            if rng.random() < 0.25:
                sch[kw] = rng.choice([-5, 0, 3, 2.5, 1e300, "3"])
    if rng.random() < 0.15:
        sch["enum"] = [rng.choice([A(), 1, None, True, [1], {"a": 1}]) for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.1:
        sch["const"] = rng.choice([A(), 3, None, {"a": [1]}])
    if rng.random() < 0.12:
        sch[rng.choice(["anyOf", "oneOf", "allOf"])] = [S() for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.08:  # beside a $ref: siblings xgrammar would ignore
        sch["$defs"] = {"s": S()}
        sch["$ref"] = "#/$defs/s"
    if rng.random() < 0.08:
        sch[rng.choice(["not", "if", "uniqueItems", "contains", "dependentRequired", "$anchor", A()[:30]])] = S()
    return sch


def gen_constraint(rng, adv):
    """One structured-output field of a request: a schema, choices, a regex, a grammar, or several."""
    A = lambda: adv_text(rng.choice(adv))
    r = rng.random()
    if r < 0.45:
        field = rng.choice(["guided_json", "structured_outputs", "response_format"])
        sch = gen_schema(rng, adv)
        if field == "structured_outputs":
            return {field: rng.choice([{"json": sch}, {}, {"json": sch, "regex": "a"}, {"json_object": rng.choice([True, 1])}])}
        if field == "response_format":
            return {field: {"type": "json_schema", "json_schema": {"name": "x", "schema": sch}}}
        return {field: rng.choice([sch, json.dumps(sch), json.dumps(sch)[:-1]])}  # a schema, its text, cut text
    if r < 0.65:
        n = rng.choice([0, 1, 3, 20, 2000])
        ch = [rng.choice([A(), "yes", "", 3, None]) for _ in range(min(n, 20))] if n < 2000 else [f"c{i}" for i in range(n)]
        return {rng.choice(["guided_choice", "structured_outputs"]): ch} if rng.random() < 0.8 else {"structured_outputs": {"choice": ch}}
    if r < 0.82:
        rx = rng.choice(["[a-z]+", "(a|b)*c", "(", "a{1000000}", "\\d{3}-\\d{4}", A()[:200], "(" * 200 + ")" * 200])
        return rng.choice([{"guided_regex": rx}, {"structured_outputs": {"regex": rx}}])
    g = rng.choice(['root ::= "a" | "b"', "root ::= missing", 'root ::= "x" root | "y"', A()[:200],
                    "root ::= " + " | ".join(f'"{i}"' for i in range(rng.choice([2, 500])))])
    return rng.choice([{"guided_grammar": g}, {"structured_outputs": {"grammar": g}}])


def gen_tools(rng, adv):
    """tools / tool_choice / tool messages, well-formed and not."""
    A = lambda: adv_text(rng.choice(adv))
    tools = [{"type": "function", "function": {"name": rng.choice(["f", "get_weather", A()[:70]]),
                                               "parameters": gen_schema(rng, adv) if rng.random() < 0.8 else A()}}
             for _ in range(rng.randint(0, 3))]
    body = {"tools": tools, "tool_choice": rng.choice(["auto", "required", "none", {"type": "function", "function": {
        "name": "f"}}, A()])}
    if rng.random() < 0.4:
        cid = rng.choice(["call_1", A()])
        body["messages"] = [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                            rng.choice([{"role": "tool", "content": "r"}, {"role": "tool", "tool_call_id": cid,
                                                                           "content": "r"}])]
    if rng.random() < 0.3:
        body["parallel_tool_calls"] = rng.choice([True, False])
    return body


def props_bodies(rng, name, adv, structured=False):
    """(path, body) pairs: one adversarial string in one string field (or key) of a valid request."""
    msg = lambda **kw: dict({"role": "user", "content": "hi"}, **kw)
    A = lambda: rng.choice(adv)
    base_c = lambda: {"model": name, "prompt": "hi", "max_tokens": 1, "temperature": 0}
    base_h = lambda: {"model": name, "messages": [msg()], "max_tokens": 1, "temperature": 0}
    base_r = lambda: {"model": name, "input": "hi", "max_output_tokens": 1, "temperature": 0}
    makers = [
        ("/v1/completions", lambda: dict(base_c(), model=A())),
        ("/v1/completions", lambda: dict(base_c(), prompt=A())),
        ("/v1/completions", lambda: dict(base_c(), prompt=[A(), "x"])),
        ("/v1/completions", lambda: dict(base_c(), stop=A())),
        ("/v1/completions", lambda: dict(base_c(), stop=["x", A()])),
        ("/v1/completions", lambda: dict(base_c(), user=A())),
        ("/v1/completions", lambda: dict(base_c(), suffix=A())),
        ("/v1/completions", lambda: dict(base_c(), logit_bias={A(): 1})),
        ("/v1/completions", lambda: dict(base_c(), **{"stream_options": {A(): True}})),
        ("/v1/completions", lambda: {**base_c(), A(): 1}),
        ("/v1/completions", lambda: dict(base_c(), echo=True, logprobs=1, prompt=A())),
        ("/v1/chat/completions", lambda: dict(base_h(), model=A())),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(content=A())])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(role=A())])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(name=A())])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(content=[{"type": "text", "text": A()}])])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(content=[{"type": A(), "text": "x"}])])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(), {"role": "assistant", "content": "x",
                                                                          "reasoning_content": A()}, msg()])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(), {"role": "assistant", "content": "",
                                              "tool_calls": [{"id": A(), "type": "function", "function": {
                                                  "name": A(), "arguments": A()}}]}, msg()])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(), {"role": "tool", "content": A(),
                                                                          "tool_call_id": A()}])),
        ("/v1/chat/completions", lambda: dict(base_h(), chat_template_kwargs={A(): A()})),
        # issue 43's fields: reasoning in history (either name), the thinking budget, the testing
        # field (refused: the main server runs without --debug-request-fields)
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(), {"role": "assistant", "content": "x",
                                                                          "reasoning": A()}, msg()])),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[msg(), {"role": "assistant", "content": A(),
                                              "reasoning": A(), "reasoning_content": A()}, msg()])),
        ("/v1/chat/completions", lambda: dict(base_h(), thinking_budget=A())),
        ("/v1/chat/completions", lambda: dict(base_h(), thinking_budget=rng.choice(
            [-1, 0, 1, 2 ** 31, 2 ** 63, -2 ** 63, 1e308, 0.5, True, None, [], {}]))),
        ("/v1/chat/completions", lambda: dict(base_h(), chat_template_kwargs={"enable_thinking": A()},
                                              thinking_budget=rng.choice([0, 3]))),
        ("/v1/chat/completions", lambda: dict(base_h(), debug_force_output=A())),
        ("/v1/chat/completions", lambda: dict(base_h(), thinking_budget=0,
                                              tools=[{"type": "function", "function": {"name": "f"}}],
                                              tool_choice=rng.choice(["auto", "required", A()]))),
        ("/v1/chat/completions", lambda: dict(base_h(), stop=A(), user=A())),
        ("/v1/chat/completions", lambda: dict(base_h(), tool_choice=A())),
        ("/v1/chat/completions", lambda: dict(base_h(), response_format={"type": A()})),
        ("/v1/chat/completions", lambda: {**base_h(), A(): A()}),
        ("/v1/chat/completions", lambda: dict(base_h(), messages=[{**msg(), A(): 1}])),
        # /v1/responses (issue 43): every string field of its input items, tools and formats
        ("/v1/responses", lambda: dict(base_r(), model=A())),
        ("/v1/responses", lambda: dict(base_r(), input=A())),
        ("/v1/responses", lambda: dict(base_r(), instructions=A())),
        ("/v1/responses", lambda: dict(base_r(), input=[{"role": A(), "content": "hi"}])),
        ("/v1/responses", lambda: dict(base_r(), input=[{"type": A(), "role": "user", "content": "hi"}])),
        ("/v1/responses", lambda: dict(base_r(), input=[{"role": "user", "content": [{"type": A(), "text": A()}]}])),
        ("/v1/responses", lambda: dict(base_r(), input=[{"role": "user", "content": "hi"},
                                                        {"type": "reasoning", "summary": [], "content": [
                                                            {"type": "reasoning_text", "text": A()}]},
                                                        {"type": "function_call", "call_id": A(), "name": A(),
                                                         "arguments": A()},
                                                        {"type": "function_call_output", "call_id": A(),
                                                         "output": A()}])),
        ("/v1/responses", lambda: dict(base_r(), tools=[{"type": A(), "name": A()}])),
        ("/v1/responses", lambda: dict(base_r(), tools=[{"type": "function", "name": A(), "parameters": {}}],
                                       tool_choice=A())),
        ("/v1/responses", lambda: dict(base_r(), tools=[{"type": "function", "name": "f", "parameters": {}}],
                                       tool_choice={"type": "function", "name": A()})),
        ("/v1/responses", lambda: dict(base_r(), text={"format": {"type": A()}})),
        ("/v1/responses", lambda: dict(base_r(), text={"format": {"type": "json_schema", "name": A(),
                                                                  "schema": {"type": "object"}}})),
        ("/v1/responses", lambda: dict(base_r(), previous_response_id=A())),
        ("/v1/responses", lambda: dict(base_r(), reasoning={"effort": A()}, metadata={A(): A()})),
        ("/v1/responses", lambda: {**base_r(), A(): A()}),
        ("/v1/responses", lambda: dict(base_r(), stream=True, input=A())),
        ("/tokenize", lambda: {"model": A(), "prompt": "hi"}),
        ("/tokenize", lambda: {"model": name, "prompt": A()}),
        ("/tokenize", lambda: {"model": name, "messages": [msg(content=A())]}),
        ("/tokenize", lambda: {"prompt": "hi", A(): A()}),
        ("/detokenize", lambda: {"model": A(), "tokens": [1, 2]}),
        ("/detokenize", lambda: {"tokens": A()}),
        ("/detokenize", lambda: {"tokens": [1], A(): 1}),
    ]
    if structured:  # issue 47: structured outputs and tools (schemas, choices, regexes, grammars, tool calls)
        makers = [
            ("/v1/completions", lambda: dict(base_c(), **gen_constraint(rng, adv))),
            ("/v1/completions", lambda: dict(base_c(), **gen_constraint(rng, adv), stream=True)),
            ("/v1/chat/completions", lambda: dict(base_h(), **gen_constraint(rng, adv))),
            ("/v1/chat/completions", lambda: dict(base_h(), **gen_tools(rng, adv))),
            ("/v1/chat/completions", lambda: dict(base_h(), max_tokens=8, stream=rng.random() < 0.5,
                                                  **gen_tools(rng, adv))),
        ]
    path, mk = rng.choice(makers)
    return path, to_json(mk())


def props47_section(S, name):
    """Issue 47's property: the same checks over random structured-output constraints (schemas with
    $ref chains up to 1 500 links, fan-outs, cycles, remote refs, siblings, contradictions; choices,
    regexes, grammars) and tools / tool messages. Seeded ($ECHO_PROPS_SEED), 400 requests, 150 s."""
    props_section(S, name, n=int(os.environ.get("ECHO_PROPS47_N", 400)), structured=True)


def props_section(S, name, n=None, seed=None, structured=False):
    """Issue 35's property: random and adversarial strings in every string field, path and header of
    every route; the server never answers 5xx to them, every refusal is JSON in the error shape (strict
    UTF-8), every JSON answer parses, and /health stays 200. Seeded ($ECHO_PROPS_SEED), bounded in count
    ($ECHO_PROPS_N) and time (90 s)."""
    seed = int(os.environ.get("ECHO_PROPS_SEED", seed if seed is not None else 35))
    n = int(os.environ.get("ECHO_PROPS_N", n if n is not None else 2000))
    rng = random.Random(seed)
    adv = adversarial_strings()
    adv_bytes = [a for a in adv if isinstance(a, bytes)]
    port = S.port
    json_get = {b"/v1/models", b"/version"}
    gets = [b"/v1/models", b"/version", b"/health", b"/metrics"]

    def make():
        kind = rng.random()
        hdrs = [b"Content-Type: application/json"]
        if kind < 0.55 or structured:  # a string field of a request body
            path, body = props_bodies(rng, name, adv, structured)
            return b"POST", path.encode(), hdrs, body
        if kind < 0.75:  # a path id, percent-encoded or raw (no space, CR, LF: the request line must stay one)
            a = rng.choice(adv_bytes)
            if rng.random() < 0.5 or any(c in a for c in b" \r\n"):
                tgt = b"/v1/models/" + pct(a)
            else:
                tgt = b"/v1/models/" + a.replace(b"\x00", b"%00")
            if rng.random() < 0.2:
                tgt = rng.choice([b"/", b"/v1/", b"/v1/models/x/", b"/health/"]) + pct(a)
            return b"GET", tgt[:120000] or b"/", [], None
        if kind < 0.85:  # a query string on any route
            a = rng.choice(adv_bytes)
            tgt = rng.choice(gets + [b"/v1/models/" + name.encode()]) + b"?" + pct(a[:50]) + b"=" + pct(a)
            return b"GET", tgt, [], None
        # a header value (or name) on any route: raw bytes, CR and LF dropped
        a = rng.choice(adv_bytes).replace(b"\r", b"").replace(b"\n", b"")
        h = rng.choice([b"Authorization: Bearer " + a, b"Content-Type: " + a, b"X-Echo-Test: " + a,
                        b"X-" + re.sub(rb"[\x00-\x20:\x7f]", b"", a)[:2000] + b": 1", b"User-Agent: " + a,
                        b"Accept: " + a, b"Cookie: k=" + a])
        if rng.random() < 0.5:
            path, body = props_bodies(rng, name, [b"ok"])
            return b"POST", path.encode(), [h, b"Content-Type: application/json"], body
        return b"GET", rng.choice(gets + [b"/v1/models/" + name.encode()]), [h], None

    cases = [make() for _ in range(n)]
    bad, statuses, t0 = [], {}, time.time()
    lock = threading.Lock()

    def run(i):
        if time.time() - t0 > (150 if structured else 90):
            return None
        meth, tgt, hdrs, body = cases[i]
        try:
            st, hd, resp = raw_http(port, meth, tgt, hdrs, body, timeout=60)
        except OSError as e:
            st, hd, resp = None, {}, repr(e).encode()
        why = None
        if st is None:
            why = "closed without an answer"
        elif st >= 500:
            why = f"{st}"
        elif st >= 400:
            if not is_error_shape(strict_json(resp), st):
                why = f"{st} not JSON in the error shape"
        elif hd.get("content-type", "").startswith("text/event-stream"):  # every event JSON, then [DONE]
            ev = [ln[6:] for ln in resp.split(b"\n") if ln.startswith(b"data: ")]
            if tgt.split(b"?")[0] == b"/v1/responses":  # the Responses stream has no [DONE]: it ends with its final event
                last = strict_json(ev[-1]) if ev else None
                if (not ev or any(strict_json(e) is None for e in ev) or not isinstance(last, dict) or
                        last.get("type") not in ("response.completed", "response.incomplete", "response.failed",
                                                 "error")):
                    why = f"{st} responses stream: an event not JSON, or no final event"
            elif not ev or ev[-1] != b"[DONE]" or any(strict_json(e) is None for e in ev[:-1]):
                why = f"{st} stream: an event not JSON, or no [DONE]"
        elif tgt.split(b"?")[0] in json_get or meth == b"POST" or tgt.startswith(b"/v1/models/"):
            if strict_json(resp) is None:
                why = f"{st} body not valid JSON"
        with lock:
            statuses[st] = statuses.get(st, 0) + 1
            if why:
                bad.append((why, meth, tgt[:100], [x[:80] for x in hdrs], (body or b"")[:160], resp[:200]))
            if i % 50 == 49:
                hs, _, _ = raw_http(port, b"GET", b"/health")
                if hs != 200:
                    bad.append(("/health not 200", hs))
        return st

    with cf.ThreadPoolExecutor(4) as ex:
        done = [r for r in ex.map(run, range(n))]
    ran = n - done.count(None)
    hs, _, _ = raw_http(port, b"GET", b"/health")
    print(f"  (seed {seed}: {ran} of {n} requests in {time.time() - t0:.1f}s; statuses {sorted(statuses.items(), key=str)})")
    for b in bad[:8]:
        print("   ", b)
    check(f"issue {47 if structured else 35} property: {ran} adversarial requests (seed {seed}) over "
          f"{'structured outputs and tools' if structured else 'every route'}: no 5xx, every "
          f"refusal JSON in the error shape, JSON answers parse; /health 200", not bad and hs == 200 and ran >= n // 2,
          f"{len(bad)} bad, e.g. {bad[:3]}")


# ---------------------------------------------------------------- main

def kv_section(binary, model, name):
    """KV cache types and the memory budget (docs/kv-cache.md): the default cache is bf16 and says so (plan
    line, /metrics), a prompt served again from the prefix cache gives the same logprobs, a budget of two
    sequences admits eight concurrent requests one after another with none lost or cut, a --max-model-len the
    budget cannot hold and a q8_0 cache on head_dim 16 are start-up errors naming the flags."""
    # the demo model: 2 layers, 1 kv head of 16 -> bf16 2*2*1*16*2 = 128 bytes per token
    per_tok = 2 * 2 * 1 * 16 * 2
    budget = 2 * 256 * per_tok  # two full 256-token sequences: 32 blocks of 16
    S = Server(binary, model, "--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "8",
               "--kv-cache-dtype", "auto", "--kv-cache-memory", str(budget), "--max-num-batched-tokens", "64",
               name="kv")
    try:
        log = S.logtext()
        check("kv: plan names bf16 and 128 B/token/rank, budget pool of 32 blocks",
              re.search(r"KV 32 blocks x 16 tokens bf16 \(128 B/token/rank", log) is not None, log[-1500:])
        m = parse_metrics(S.url)
        info = [x for x in m["echo:cache_config_info"].samples if x.name == "echo:cache_config_info"]
        check("kv: /metrics cache_config_info cache_dtype=bf16", info and info[0].labels.get("cache_dtype") == "bf16",
              info)
        check("kv: /metrics echo:kv_bytes_in_use starts at 0", sample(m, "echo:kv_bytes_in_use",
                                                                     "echo:kv_bytes_in_use") == 0)
        body = {"prompt": "The quick brown fox jumps over the lazy dog. " * 6, "max_tokens": 4, "temperature": 0,
                "logprobs": 2}
        st1, a = cj(S.url + "/v1/completions", body)
        st2, b = cj(S.url + "/v1/completions", body)
        check("kv: bf16 prompt again from the prefix cache: same tokens and logprobs, cached_tokens > 0",
              st1 == st2 == 200 and a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"] and
              b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, (a, b))
        m = parse_metrics(S.url)
        used = sample(m, "echo:kv_bytes_in_use", "echo:kv_bytes_in_use")
        touched = sample(m, "echo:kv_bytes_touched", "echo:kv_bytes_touched")
        check("kv: kv_bytes_in_use counts the cached blocks (whole 16-token blocks of 128 B/token)",
              used and used % (16 * per_tok) == 0 and touched >= used, (used, touched))
        # eight requests of ~100 prompt + 100 generated tokens (13 blocks each) against 32 blocks
        import concurrent.futures as cf

        def one(i):
            return cj(S.url + "/v1/completions", {"prompt": f"Request {i}: " + "count the words again " * 20,
                                                  "max_tokens": 100, "temperature": 0, "ignore_eos": True},
                      timeout=300)
        with cf.ThreadPoolExecutor(8) as ex:
            res = list(ex.map(one, range(8)))
        check("kv: 8 concurrent requests under a 2-sequence budget all finish whole (200, 100 tokens, length)",
              all(st == 200 and j["usage"]["completion_tokens"] == 100 and j["choices"][0]["finish_reason"] == "length"
                  for st, j in res), [(st, j if st != 200 else j["usage"]) for st, j in res][:3])
    finally:
        rc, log = S.stop()
    check("kv server: SIGTERM -> exit 0", rc == 0, log[-1500:])

    def start_error(*extra):
        p = subprocess.run([binary, "--model", model, "--port", "0", "--device", "cpu", "--threads", "1", *extra],
                           capture_output=True, timeout=120)
        return p.returncode, p.stderr.decode(errors="replace")
    rc, err = start_error("--max-model-len", "256", "--kv-cache-memory", str(100 * per_tok))
    check("kv: --max-model-len over the budget is a start-up error naming both numbers",
          rc != 0 and "--max-model-len 256" in err and "--kv-cache-memory 12800" in err and "holds 96 tokens" in err,
          (rc, err[-800:]))
    rc, err = start_error("--kv-cache-dtype", "q8_0")
    check("kv: q8_0 on head_dim 16 is a start-up error naming the flag",
          rc != 0 and "--kv-cache-dtype q8_0" in err and "head_dim is 16" in err, (rc, err[-800:]))
    rc, err = start_error("--kv-cache-memory", "lots")
    check("kv: a bad --kv-cache-memory is a usage error (2)", rc == 2 and "--kv-cache-memory" in err, (rc, err))
    rc, err = start_error("--gpu-memory-utilization", "1.5")
    check("kv: --gpu-memory-utilization outside (0, 1] is a usage error (2)",
          rc == 2 and "--gpu-memory-utilization" in err, (rc, err))

    # a random model of a published shape (no files; issue 44's qwen3-8b at tp 4 is docs/kv-cache.md's
    # command): it needs --tokenizer, names an unknown shape, and serves with Qwen3's tokenizer
    tokdir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "tokenizer", "qwen3")
    spec = "random:qwen3-0.6b,layers=1"

    def random_error(*extra):
        p = subprocess.run([binary, "--port", "0", "--device", "cpu", "--threads", "1", *extra],
                           capture_output=True, timeout=120)
        return p.returncode, p.stderr.decode(errors="replace")
    rc, err = random_error("--model", spec)
    check("kv: a random: model without --tokenizer is a start-up error naming the flag",
          rc != 0 and "--tokenizer" in err, (rc, err[-800:]))
    rc, err = random_error("--model", "random:nope", "--tokenizer", tokdir)
    check("kv: an unknown random: shape is an error listing the known ones",
          rc != 0 and "unknown shape" in err and "qwen3-8b" in err, (rc, err[-800:]))
    S = Server(binary, spec, "--tokenizer", tokdir, "--tp", "2", "--max-model-len", "128", "--kv-cache-dtype", "auto",
               name="kv-random")
    try:
        log = S.logtext()
        st, j = cj(S.url + "/v1/completions", {"model": spec, "prompt": "Hello", "max_tokens": 3, "temperature": 0})
        check("kv: random:qwen3-0.6b,layers=1 at tp 2 loads (random weights), plans a bf16 pool, serves 3 tokens",
              "random weights generated in memory" in log and re.search(r"KV \d+ blocks x 16 tokens bf16", log)
              and st == 200 and j["usage"]["completion_tokens"] == 3, (st, j, log[-1500:]))
    finally:
        rc, log = S.stop()
    check("kv random server: SIGTERM -> exit 0", rc == 0, log[-1500:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["full", "asan"], default="full")
    ap.add_argument("--only", choices=["props", "kv"],
                    help="props: only issue 35's repros and property test (any binary); kv: only the KV cache section")
    a = ap.parse_args()
    name = "echo-demo"
    t0 = time.time()
    common = ["--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "8",
              "--max-num-batched-tokens", "64", "--timeout", "3", "--drain-seconds", "3"]
    if a.only == "kv":
        section("kv cache", kv_section, a.bin, a.model, name)
        print(f"{len(PASSED)} passed, {len(FAILED)} failed")
        sys.exit(1 if FAILED else 0)
    S = Server(a.bin, a.model, *common, name="main")
    try:
        if a.only == "props":
            section("issue 35 property test", props_section, S, name)
            section("issue 47 property test", props47_section, S, name)
            section("issue 35 repros", regress35_section, S, name)
        elif a.mode == "full":
            section("curl", curl_section, S, name)
            section("openai", openai_section, S, name)
            section("features", features_section, S, name, REPO)
            section("concurrency", concurrency_section, S)
            section("metrics", metrics_section, S)
            section("abuse", abuse_section, S)
            section("issue 35 property test", props_section, S, name)
            section("issue 47 property test", props47_section, S, name)
            section("issue 35 repros", regress35_section, S, name)
        else:
            section("curl (smoke)", lambda: check("asan: completion", cj(S.url + "/v1/completions", {
                "prompt": "hi", "max_tokens": 4, "temperature": 0})[0] == 200))
            section("features (smoke)", features_smoke, S)
            section("concurrency (8)", concurrency_section, S, 8)
            section("abuse", abuse_section, S)
            section("issue 35 property test", props_section, S, name)
            section("issue 47 property test", props47_section, S, name)
            section("issue 35 repros", regress35_section, S, name)
    finally:
        rc, log = S.stop()
    check("main server: SIGTERM -> exit 0", rc == 0, (rc, log[-2000:]))
    if a.only != "props":
        section("limits", limits_section, a.bin, a.model, name)
        section("prefix cache", prefix_cache_section, a.bin, a.model, name, a.mode)
        section("kv cache", kv_section, a.bin, a.model, name)
    bad = [l for l in log.splitlines()
           if re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|Sanitizer has encountered|runtime error:", l)]
    check("main server: no sanitizer reports (leaks included) at shutdown", not bad, "\n".join(bad[:10]) +
          ("\n" + log[-4000:] if bad else ""))
    if a.mode == "full" and a.only != "props":
        section("servers", servers_section, a.bin, a.model, name)
    print(f"(server tests took {time.time() - t0:.0f}s)")
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
