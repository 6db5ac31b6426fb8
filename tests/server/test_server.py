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
        args = [binary, "--model", model, "--port", "0", "--device", "cpu", "--threads", "1",
                "--log-level", "info", *extra]
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
    check("completion: default max_tokens fills the context", cj(U + "/v1/completions", {"prompt": "Hi", "temperature": 0,
          "ignore_eos": True})[1]["usage"]["total_tokens"] == 256)

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
    err("n = 2 unsupported", {"prompt": "x", "n": 2}, 400, "n")
    err("unknown field is named", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate")
    err("presence_penalty unsupported", {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty")
    err("min_tokens > max_tokens", {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens")
    err("repetition_penalty <= 0", {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty")
    err("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
        "stream_options")
    err("prompt + max_tokens beyond the context", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens")
    err("prompt longer than the context", {"prompt": list(range(300))}, 400, "prompt")
    err("echo with logprobs", {"prompt": "x", "echo": True, "logprobs": 1}, 400, "echo")
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
    err("chat: unknown chat_template_kwargs key", {"messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"foo": 1}}, 400, "chat_template_kwargs", path="/v1/chat/completions")
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
    check("metrics: vLLM's TTFT buckets", les[:3] == ["0.001", "0.005", "0.01"] and les[-2:] == ["2560.0", "+Inf"]
          or les[-2:] == ["2560", "+Inf"], les)
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
    rc, _ = S.stop()
    check("queue server: SIGTERM -> exit 0", rc == 0, rc)

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
    check("start-up log shows the plan", "plan: tp 2" in S.logtext() and "allreduce exact" in S.logtext())
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


def hostile_bodies(rng, n):
    fixed = [
        b"", b"{", b"}", b"null", b"true", b"123", b'"str"', b"[]", b"{\"prompt\":}", b"{'prompt': 'x'}",
        b'{"prompt": "x", "max_tokens": 1e999}', b'{"prompt": "x", "max_tokens": 99999999999999999999999}',
        b'{"prompt": "x", "max_tokens": -99999999999}', b'{"prompt": "x", "temperature": NaN}',
        b'{"prompt": "x", "temperature": Infinity}', b'{"prompt": "\xff\xfe"}', b'{"prompt": "\\ud800"}',
        b'{"prompt": [1, 2, "3"]}', b'{"prompt": [1.5]}', b'{"prompt": [-1]}', b'{"prompt": [4294967296]}',
        b'{"prompt": {"a": 1}}', b'{"prompt": [[1], [2]]}', b'{"prompt": ["a", "b"]}', b'{"prompt": "x", "stop": [1]}',
        b'{"prompt": "x", "stop": ["' + b"s" * 5000 + b'"]}', b'{"prompt": "x", "stop": ' +
        json.dumps(["a"] * 100).encode() + b'}', b'{"prompt": "x", "prompt": "y"}',
        b'[' * 5000 + b']' * 5000, b'{"a":' * 3000 + b'1' + b'}' * 3000, b'{"prompt": "x", "seed": 1e400}',
        b'{"messages": "hi"}', b'{"messages": [{"role": "user"}]}', b'{"messages": [1]}',
        b'{"prompt": "x", "logprobs": true}', b'{"prompt": "x", "n": 0}', b'{"prompt": "x", "top_k": 9999999999}',
        b'{"prompt": "x", "max_tokens": null, "temperature": null, "stop": null, "stream": true, "stream_options": 5}',
        b"\x00\x01\x02\x03", b'{"prompt": "x"}garbage', b'{"prompt": "x", "min_tokens": -1}',
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
            d["max_tokens"] = rng.choice([0, -5, "many", 10 ** 12, 1.5, [], {}])
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


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["full", "asan"], default="full")
    a = ap.parse_args()
    name = "echo-demo"
    t0 = time.time()
    common = ["--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "8",
              "--max-num-batched-tokens", "64", "--timeout", "3", "--drain-seconds", "3"]
    S = Server(a.bin, a.model, *common, name="main")
    try:
        if a.mode == "full":
            section("curl", curl_section, S, name)
            section("openai", openai_section, S, name)
            section("concurrency", concurrency_section, S)
            section("metrics", metrics_section, S)
            section("abuse", abuse_section, S)
        else:
            section("curl (smoke)", lambda: check("asan: completion", cj(S.url + "/v1/completions", {
                "prompt": "hi", "max_tokens": 4, "temperature": 0})[0] == 200))
            section("concurrency (8)", concurrency_section, S, 8)
            section("abuse", abuse_section, S)
    finally:
        rc, log = S.stop()
    check("main server: SIGTERM -> exit 0", rc == 0, (rc, log[-2000:]))
    bad = [l for l in log.splitlines()
           if re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|Sanitizer has encountered|runtime error:", l)]
    check("main server: no sanitizer reports (leaks included) at shutdown", not bad, "\n".join(bad[:10]) +
          ("\n" + log[-4000:] if bad else ""))
    if a.mode == "full":
        section("servers", servers_section, a.bin, a.model, name)
    print(f"(server tests took {time.time() - t0:.0f}s)")
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
