#!/usr/bin/env python3
"""A deliberately awkward OpenAI-style streaming server for echo-bench serve's
SSE parser: CRLF line ends, comment and `event:` lines, a role-only first chat
chunk, an empty-text completions chunk, and every response written a few bytes
at a time (TCP_NODELAY, a pause between writes) so events split anywhere
across libcurl's write callbacks. Prints its port, then serves until killed.
Every response: 5 content chunks, usage {prompt_tokens: 7, completion_tokens: 5}.
"""
import json
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        chat = self.path == "/v1/chat/completions"
        events = [": keep-alive comment\r\n"]
        if chat:
            events.append(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        else:
            events.append(json.dumps({"choices": [{"index": 0, "text": ""}]}))
        for i in range(5):
            piece = f"tok{i} \u00e9"
            c = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            events.append(json.dumps({"choices": [c]}))
        events.append(json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}))
        events.append("[DONE]")
        out = b""
        for e in events:
            if e.startswith(":"):
                out += e.encode()
            else:
                out += b"event: message\r\ndata: " + e.encode() + b"\r\n\r\n"
        assert body.get("stream") is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.flush()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        step = 3
        for i in range(0, len(out), step):
            self.wfile.write(out[i:i + step])
            self.wfile.flush()
            time.sleep(0.0003)


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
