#!/usr/bin/env python3
"""The official JSON-Schema-Test-Suite's draft 2020-12 schemas through echo-serve's
structured outputs (issue 47): every schema is sent as guided_json; for each one
the server accepts, N seeded samples at temperature 1 are generated and every
COMPLETE one (finish_reason "stop": the grammar reached its end) is validated by
an independent validator, python-jsonschema (Draft202012Validator, with its
format checker). The goal: 0 complete outputs that fail; a schema the server
cannot enforce must be refused (400), never accepted and then violated.

The suite ships inside python-jsonschema's sdist (json/tests/draft2020-12/, 80
files in 4.26.0); it is fetched with pip, checked against a pinned sha256 and
never committed.

  python3 scripts/schema-suite.py --bin bin/echo-serve \\
      --model build/models/SmolLM2-135M-Instruct.Q4_1.gguf [--json out.json]

Run it with a Python that has jsonschema (the clients venv:
/work/main/build/venv-clients/bin/python). Exit status 0 when no complete
output fails validation.
"""
import argparse, glob, hashlib, json, os, subprocess, sys, tarfile, tempfile, time, urllib.request, urllib.error

SDIST = "jsonschema-4.26.0.tar.gz"
SHA256 = "0c26707e2efad8aa1bfc5b7ce170f3fccc2e4918ff85989ba9ffa9facb2be326"
SUITE = "jsonschema-4.26.0/json/tests/draft2020-12/"


def fetch_suite(cache):
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, SDIST)
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "pip", "download", "jsonschema==4.26.0", "--no-binary", ":all:",
                        "--no-deps", "-d", cache], check=True, stdout=subprocess.DEVNULL)
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if h != SHA256:
        sys.exit(f"schema-suite: {path} has sha256 {h}, expected {SHA256}")
    out = []
    with tarfile.open(path) as t:
        for m in sorted(t.getmembers(), key=lambda m: m.name):
            if m.name.startswith(SUITE) and m.name.endswith(".json"):
                rel = m.name[len(SUITE):]
                for gi, group in enumerate(json.load(t.extractfile(m))):
                    out.append((rel, gi, group["description"], group["schema"]))
    return out


def post(port, body, timeout=300):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/echo-serve")
    ap.add_argument("--model", default="build/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--port", type=int, default=0, help="use a server already running on this port")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--cache", default="build/schema-suite")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--only", help="files whose name contains this")
    a = ap.parse_args()
    import jsonschema  # the independent validator

    groups = fetch_suite(a.cache)
    if a.only:
        groups = [g for g in groups if a.only in g[0]]
    srv = None
    port = a.port
    if not port:
        port = 18000 + os.getpid() % 2000
        srv = subprocess.Popen([a.bin, "--model", a.model, "--port", str(port), "--log-level", "warning"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
    counts = dict(schemas=len(groups), accepted=0, refused=0, other=0, samples=0, complete=0, cut=0,
                  violations=0, unparsable=0)
    results = []
    t0 = time.time()
    try:
        for rel, gi, desc, schema in groups:
            st, js = post(port, {"prompt": "A JSON value:", "max_tokens": a.max_tokens, "temperature": 1,
                                 "seed": 47, "n": a.samples, "guided_json": schema})
            rec = dict(file=rel, group=gi, description=desc, status=st)
            if st == 400:
                counts["refused"] += 1
                rec["error"] = js.get("error", {}).get("message")
            elif st != 200:
                counts["other"] += 1
                rec["error"] = json.dumps(js)[:300]
            else:
                counts["accepted"] += 1
                rec["outputs"] = []
                v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
                for ch in js["choices"]:
                    counts["samples"] += 1
                    o = dict(text=ch["text"], finish=ch["finish_reason"])
                    if ch["finish_reason"] != "stop":
                        counts["cut"] += 1
                    else:
                        counts["complete"] += 1
                        try:
                            val = json.loads(ch["text"])
                        except ValueError:
                            counts["unparsable"] += 1
                            counts["violations"] += 1
                            o["violation"] = "not JSON"
                        else:
                            try:
                                errs = [e.message for e in v.iter_errors(val)]
                            except Exception as e:  # e.g. an unresolvable remote $ref in the validator
                                errs = [f"validator: {type(e).__name__}: {e}"]
                            if errs:
                                counts["violations"] += 1
                                o["violation"] = errs[0][:200]
                    rec["outputs"].append(o)
                bad = [o for o in rec["outputs"] if "violation" in o]
                if bad:
                    print(f"VIOLATION {rel}#{gi} {desc!r}: {json.dumps(schema)[:200]} -> {bad[0]['text'][:80]!r}: "
                          f"{bad[0]['violation']}", flush=True)
            results.append(rec)
    finally:
        if srv:
            srv.terminate()
            srv.wait()
    counts["seconds"] = round(time.time() - t0, 1)
    if a.json:
        json.dump(dict(counts=counts, results=results), open(a.json, "w"), indent=1)
    print("schema-suite: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if counts["violations"] or counts["other"] else 0


if __name__ == "__main__":
    sys.exit(main())
