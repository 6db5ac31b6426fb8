#!/usr/bin/env python3
"""Issue 47's measurements of the structured-output limits (docs/structured-outputs.md):

  compile   the worst accepted compile of each budget: a fresh echo-serve per case, the request's
            wall time (max_tokens 1) and RSS before / after / peak (VmHWM) from /proc
  decode    a 32-token greedy decode idle and while 4 worst-case compiles run, 3 interleaved pairs
  sigterm   SIGTERM while 4 worst-case compiles run: exit status and seconds to exit (drain 5 s)
  rss N     RSS after every 400 of N distinct small schemas (default 2400)

  flock /work/cpu.lock python3 scripts/grammar-limits.py compile   (timed ones under the lock)
Run from the repository root (bin/echo-serve, build/models/SmolLM2-135M-Instruct.Q4_1.gguf).
"""
import json, os, signal, statistics, subprocess, sys, threading, time, urllib.request, urllib.error
ROOT = os.getcwd()
PORT = 18000 + os.getpid() % 1000
def obj_props(n, sub):
    return {"type": "object", "properties": {f"p{i}": sub(i) for i in range(n)}}
W = {
 "256 optional properties, 60-byte names (16 KiB)": {"guided_json": {"type": "object", "properties": {f"p{i:03d}" + "k" * 59: {"type": "integer"} for i in range(256)}}},
 "256 optional string properties, 60-byte names, maxLength": {"guided_json": {"type": "object", "properties": {f"p{i:03d}" + "k" * 59: {"type": "string", "maxLength": 30} for i in range(256)}}},
 "16 objects x 16 optional properties, 60-byte names": {"guided_json": {"type": "object", "properties": {f"o{j}": {"type": "object", "properties": {f"p{i:03d}" + "k" * 59: {"type": "integer"} for i in range(16)}} for j in range(15)}}},
 "256 patterns of 240 bytes": {"guided_json": obj_props(255, lambda i: {"type": "string", "pattern": "^(" + "|".join(f"w{i}x{j}" for j in range(40))[:236] + ")$"})},
 "1024 enum strings, 64 KiB": {"guided_json": {"type": "string", "enum": [f"{i:04d}" + "e" * 56 for i in range(1024)]}},
 "2000 nodes: nested anyOf": {"guided_json": {"type": "array", "items": {"anyOf": [{"type": "object", "properties": {f"q{j}": {"anyOf": [{"type": "integer", "minimum": j}, {"type": "string", "maxLength": j + 1}, {"type": "array", "items": {"type": "number"}}]} for j in range(28)}} for i in range(9)]}}},
 "1024 choices, 64 KiB": {"guided_choice": [f"{i:04d}" + "c" * 59 for i in range(1024)]},
 "64 KiB regex alternation": {"guided_regex": "(" + "|".join(f"r{i:05d}[a-z]{{2,9}}" for i in range(3200))[:65000].rsplit("|", 1)[0] + ")"},
 "64 KiB EBNF": {"guided_grammar": "root ::= " + " | ".join(f'"g{i:05d}" [a-z]+' for i in range(4000))[:65000].rsplit("|", 1)[0] + "\n"},
 "64 KiB regex, nested repeats": {"guided_regex": "(" + "|".join(f"([a-z]{{1,{(i%50)+1}}}[0-9]{{0,9}})" for i in range(3000))[:65000].rsplit("|", 1)[0] + ")"},
}


def rss_of(pid):
    d = {}
    for l in open(f"/proc/{pid}/status"):
        k, v = l.split(":", 1)
        if k in ("VmRSS", "VmHWM"): d[k] = int(v.split()[0]) // 1024
    return d


def compile_cases(only):
    rss = rss_of
    for name, extra in W.items():
        if only and not any(o in name for o in only): continue
        p = subprocess.Popen([f"{ROOT}/bin/echo-serve", "--model", f"{ROOT}/build/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--port", str(PORT), "--threads", "1", "--grammar-compile-timeout", "600", "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try: urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1); break
            except Exception: time.sleep(0.2)
        body = lambda e: urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(dict({"prompt": "x", "max_tokens": 1}, **e)).encode(), {"Content-Type": "application/json"})
        urllib.request.urlopen(body({"guided_json": {"type": "integer"}}), timeout=60).read()  # the vocab, once
        r0 = rss(p.pid); t = time.time()
        try:
            with urllib.request.urlopen(body(extra), timeout=700) as r: st = r.status; out = r.read()[:0]
        except urllib.error.HTTPError as e: st = e.code; out = e.read()[:200]
        dt = time.time() - t; r1 = rss(p.pid)
        print(f"{name:42s} {st} compile {dt:7.2f} s  RSS {r0['VmRSS']}->{r1['VmRSS']} MB  peak +{r1['VmHWM'] - r0['VmRSS']} MB {out}", flush=True)
        p.terminate(); p.wait()
    print("load", open("/proc/loadavg").read().strip())

WORST = W["256 optional properties, 60-byte names (16 KiB)"]["guided_json"]
def worst(tag):  # distinct names each time (same sizes): no cache hit
    s = json.loads(json.dumps(WORST))
    s["properties"] = {k[:4] + tag[:3] + k[7:]: v for k, v in s["properties"].items()}
    return s
def start(*extra):
    p = subprocess.Popen([f"{ROOT}/bin/echo-serve", "--model", f"{ROOT}/build/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--port", str(PORT), "--log-level", "warning", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(200):
        try: urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1); break
        except Exception: time.sleep(0.2)
    return p
def post(body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r: return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read())
    except Exception as e: return None, str(e)
def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) // 1024
def decode32():
    t = time.time(); st, j = post({"prompt": "Once upon a time", "max_tokens": 32, "ignore_eos": True, "temperature": 0})
    assert st == 200 and j["usage"]["completion_tokens"] == 32, (st, j)
    return time.time() - t
def main_load(what):
    if what == "decode":
        p = start()
        post({"prompt": "x", "max_tokens": 1, "guided_json": {"type": "integer"}})  # the vocab
        decode32()
        idle, busy, n = [], [], 0
        for rnd in range(3):
            idle.append(decode32())
            ths = []
            res = []
            for k in range(4):
                n += 1
                th = threading.Thread(target=lambda n=n: res.append(post({"prompt": "x", "max_tokens": 1, "guided_json": worst(f"{n:03d}")})[0])); th.start(); ths.append(th)
            time.sleep(0.3)
            busy.append(decode32())
            for th in ths: th.join()
            print(f"round {rnd}: idle {idle[-1]:.2f} s, with 4 worst compiles {busy[-1]:.2f} s, compiles {res}", flush=True)
        print(f"32-token decode: idle median {statistics.median(idle):.2f} s, during 4 worst-case compiles median {statistics.median(busy):.2f} s, ratio {statistics.median(busy)/statistics.median(idle):.2f}")
        p.terminate(); p.wait()
    elif what == "sigterm":
        for rnd in range(2):
            p = start("--drain-seconds", "5")
            post({"prompt": "x", "max_tokens": 1, "guided_json": {"type": "integer"}})
            ths = [threading.Thread(target=post, args=({"prompt": "x", "max_tokens": 1, "guided_json": worst(f"{rnd}{k}{k}")},)) for k in range(4)]
            for th in ths: th.start()
            time.sleep(0.3)
            t = time.time(); p.send_signal(signal.SIGTERM); rc = p.wait(); dt = time.time() - t
            err = p.stderr.read().decode()[-300:]
            print(f"SIGTERM with 4 worst-case compiles in flight: exit {rc} after {dt:.2f} s (drain 5 s) {err.strip().splitlines()[-2:]}", flush=True)
    elif what == "rss":
        p = start()
        post({"prompt": "x", "max_tokens": 1, "guided_json": {"type": "integer"}})
        r0 = rss(p.pid); t0 = time.time(); print("start RSS", r0, "MB", flush=True)
        N = int(sys.argv[2]) if len(sys.argv) > 2 else 2400
        def one(i):
            s = {"type": "object", "properties": {f"a{i}": {"type": "integer", "minimum": i % 97}, "b": {"type": "string", "maxLength": i % 50 + 1}, "c": {"type": "array", "items": {"type": "string", "enum": [f"e{i}", "x", "y"]}}}, "required": [f"a{i}", "c"]}
            st, j = post({"prompt": "x", "max_tokens": 1, "guided_json": s}); assert st == 200, (st, j)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2) as ex:
            for k in range(0, N, 400):
                list(ex.map(one, range(k, min(N, k + 400))))
                print(f"after {min(N, k + 400)} distinct schemas: RSS {rss(p.pid)} MB (+{rss(p.pid) - r0}), {time.time() - t0:.0f} s", flush=True)
        p.terminate(); p.wait()
    print("load", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "compile"
    if what == "compile":
        compile_cases(sys.argv[2:])
    else:
        main_load(what)
