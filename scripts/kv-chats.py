#!/usr/bin/env python3
# docs/kv-cache.md, "Memory": 100 chats, 8 at a time, against an OpenAI-style server on 127.0.0.1:PORT.
#   scripts/kv-chats.py PORT MODEL_NAME
import json, sys, urllib.request, concurrent.futures as cf
port, model = sys.argv[1], sys.argv[2]
topics = ["France", "Japan", "the sun", "water", "music", "cats", "the ocean", "mathematics", "trees", "the moon"]
def one(i):
    q = f"Tell me one short fact about {topics[i % 10]} (question {i})."
    body = {"model": model, "messages": [{"role": "user", "content": q}], "max_tokens": 64, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    j = json.load(urllib.request.urlopen(req, timeout=600))
    return j["usage"]["completion_tokens"], j["usage"]["prompt_tokens"]
with cf.ThreadPoolExecutor(8) as ex:
    res = list(ex.map(one, range(100)))
print(f"chats ok: {len(res)}, prompt tokens {sum(r[1] for r in res)}, completion tokens {sum(r[0] for r in res)}")
