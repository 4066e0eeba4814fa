#!/usr/bin/env python3
"""Byte-exact passthrough against a real engine: what the engine sent vs what the client got.

Usage: passthrough.py ENGINE_URL PROXY_BIN [--model tiny] [--config FILE] [--save DIR]

Starts a recording TCP relay in front of the engine and a proxy (PROXY_BIN serve, on free
loopback ports, with --config FILE if given) whose upstream is the relay. Then sends each case
below through the proxy, one at a time, and compares the response body the client got with
the bytes the engine sent for that request (de-chunked), byte for byte. When the proxy injected
`stream_options.include_usage` (it changed the request body the engine saw), the expected client
body is the engine's with the usage chunk removed and its `system_fingerprint` put back on every
finish chunk, which is what vLLM 0.32 sends without include_usage
(tests/fixtures/vllm-0.32/stream-chat-n2-nousage.txt). Response headers are compared as
name/value lists minus hop-by-hop ones, `date` and the proxy's `x-request-id`.
Prints one line per case; exits 1 if any differs. Standard library only.
"""
import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-connection", "date", "x-request-id"}


class Relay:
    """TCP relay that records every byte each way, per connection."""

    def __init__(self, target):
        self.target = target
        self.lock = threading.Lock()
        self.conns = []  # [up bytearray (proxy -> engine), down bytearray (engine -> proxy)]
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            c, _ = self.sock.accept()
            u = socket.create_connection(self.target)
            bufs = [bytearray(), bytearray()]
            with self.lock:
                self.conns.append(bufs)
            threading.Thread(target=self._pump, args=(c, u, bufs[0]), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, bufs[1]), daemon=True).start()

    def _pump(self, src, dst, buf):
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                with self.lock:
                    buf += b
                dst.sendall(b)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def take(self):
        """Every (request bytes, response bytes) exchange seen since the last call."""
        out = []
        with self.lock:
            for up, down in self.conns:
                u, d = bytes(up), bytes(down)
                up.clear()
                down.clear()
                reqs = [m.start() for m in re.finditer(rb"(GET|POST|PUT|DELETE|HEAD) /\S* HTTP/1\.1\r\n", u)]
                resps = [m.start() for m in re.finditer(rb"HTTP/1\.1 \d\d\d ", d)]
                for k, start in enumerate(reqs):
                    if k >= len(resps):
                        break
                    uend = reqs[k + 1] if k + 1 < len(reqs) else len(u)
                    dend = resps[k + 1] if k + 1 < len(resps) else len(d)
                    out.append((u[start:uend], d[resps[k]:dend]))
        return out


def parse_response(raw):
    """One HTTP/1.1 response: (status, [(name, value)], de-chunked body)."""
    first, hdrs, body = parse_message(raw)
    return int(first.split()[1]), hdrs, body


def parse_message(raw):
    """One HTTP/1.1 message: (first line, [(name, value)], de-chunked body)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0]
    hdrs = [(k.strip().lower(), v.strip()) for k, v in (l.split(":", 1) for l in lines[1:])]
    h = dict(hdrs)
    if h.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2:]
        return status, hdrs, bytes(body)
    n = int(h.get("content-length", "0"))
    return status, hdrs, rest[:n]


def request_body(raw):
    return parse_message(raw)[2]


def without_usage(body):
    """What vLLM 0.32 sends without include_usage, given its stream with include_usage.
    An engine that puts usage on chunks with choices (--enable-force-include-usage) sends the
    same stream whatever the request says: nothing to take away."""
    events = body.split(b"\n\n")
    if any(ev.startswith(b"data: {") and b'"usage":' in ev and b'"choices":[{' in ev
           for ev in events):
        return body
    fp = None
    kept = []
    for ev in events:
        if ev.startswith(b"data: {") and b'"choices":[]' in ev and b'"usage":' in ev:
            m = re.search(rb',"system_fingerprint":("[^"]*")', ev)
            fp = m.group(1) if m else None
            continue
        kept.append(ev)
    if fp is None:
        return body
    out = []
    for ev in kept:
        if ev.startswith(b"data: {"):
            obj = json.loads(ev[6:])
            if any(ch.get("finish_reason") is not None for ch in obj.get("choices", [])):
                ev = ev[:-1] + b',"system_fingerprint":' + fp + b"}"
        out.append(ev)
    return b"\n\n".join(out)


def cases(model):
    msg = [{"role": "user", "content": "Hello"}]
    chat = lambda **kw: ("POST", "/v1/chat/completions",
                         json.dumps({"model": model, "messages": msg, "seed": 1, **kw}))
    cmpl = lambda **kw: ("POST", "/v1/completions",
                         json.dumps({"model": model, "prompt": "The quick brown fox", "seed": 1, **kw}))
    usage = {"stream_options": {"include_usage": True}}
    return [
        ("chat stream", chat(stream=True, max_tokens=16)),
        ("chat stream include_usage", chat(stream=True, max_tokens=16, **usage)),
        ("chat stream continuous usage", chat(stream=True, max_tokens=6,
          stream_options={"include_usage": True, "continuous_usage_stats": True})),
        ("chat stream logprobs", chat(stream=True, max_tokens=8, logprobs=True, top_logprobs=2)),
        ("chat stream n=2", chat(stream=True, max_tokens=4, n=2)),
        ("chat stream n=2 include_usage", chat(stream=True, max_tokens=4, n=2, **usage)),
        ("chat stream stop string", chat(stream=True, max_tokens=64, stop=["e"])),
        ("chat stream max_tokens=1", chat(stream=True, max_tokens=1)),
        ("completions stream", cmpl(stream=True, max_tokens=16)),
        ("completions stream include_usage", cmpl(stream=True, max_tokens=16, **usage)),
        ("completions stream logprobs=2", cmpl(stream=True, max_tokens=4, logprobs=2)),
        ("completions stream n=2", cmpl(stream=True, max_tokens=3, n=2)),
        ("chat non-stream", chat(max_tokens=8)),
        ("chat non-stream n=2", chat(max_tokens=4, n=2)),
        ("completions non-stream", cmpl(max_tokens=6)),
        ("error invalid JSON", ("POST", "/v1/chat/completions", '{"model":"tiny","messages":[')),
        ("error missing messages", ("POST", "/v1/chat/completions",
                                    json.dumps({"model": model, "stream": True}))),
        ("error unknown model", ("POST", "/v1/chat/completions",
                                 json.dumps({"model": "no-such-model", "messages": msg, "stream": True}))),
        ("error max_tokens too large", chat(stream=True, max_tokens=100000)),
        ("error stream_options without stream", chat(max_tokens=2, **usage)),
        ("GET /v1/models", ("GET", "/v1/models", None)),
        ("GET /version", ("GET", "/version", None)),
        ("GET /health", ("GET", "/health", None)),
    ]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("proxy_bin")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--config")
    ap.add_argument("--save", help="write each case's engine and client bytes here")
    a = ap.parse_args()
    eu = urllib.parse.urlsplit(a.engine)
    relay = Relay((eu.hostname, eu.port))
    listen, admin = free_port(), free_port()
    cmd = [a.proxy_bin, "serve", "--upstream", f"http://127.0.0.1:{relay.port}",
           "--listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{admin}"]
    if a.config:
        cmd += ["--config", a.config]
    log = open(os.path.join(a.save, "passthrough-proxy.log") if a.save else os.devnull, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        for _ in range(100):
            try:
                c = http.client.HTTPConnection("127.0.0.1", admin, timeout=1)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            print("passthrough: proxy did not start")
            sys.exit(1)
        time.sleep(0.3)
        relay.take()  # health probes so far
        bad = 0
        all_cases = cases(a.model)
        for i, (name, (method, path, body)) in enumerate(all_cases):
            conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=60)
            conn.request(method, path, body=body,
                         headers={"content-type": "application/json"} if body is not None else {})
            r = conn.getresponse()
            cbody = r.read()
            chdrs = [(k.lower(), v) for k, v in r.getheaders()]
            conn.close()
            time.sleep(0.05)  # let the relay see the end
            picked = None
            for eup, edown in relay.take():
                line = eup[:eup.index(b"\r\n")].decode().split()
                if line[0] == method and line[1] == path:
                    picked = (eup, edown)
            if picked is None:
                print(f"DIFF {name:40s} the engine never saw the request")
                bad += 1
                continue
            eup, edown = picked
            es, ehdrs, ebody = parse_response(edown)
            injected = body is not None and request_body(eup) != body.encode()
            want = without_usage(ebody) if injected else ebody
            same = want == cbody
            eh = [(k, v) for k, v in ehdrs if k not in HOP]
            ch = [(k, v) for k, v in chdrs if k not in HOP]
            # header order is not meaningful (hyper writes content-length of an empty body last)
            ok = same and es == r.status and sorted(eh) == sorted(ch)
            bad += not ok
            note = "identical" if ebody == cbody else (
                "identical after removing the injected usage" if same else "DIFFERENT")
            print(f"{'ok  ' if ok else 'DIFF'} {name:36s} {es}/{r.status} engine {len(ebody):5d} B, "
                  f"client {len(cbody):5d} B: {note}{' (usage injected)' if injected else ''}"
                  + ("" if eh == ch else f"; headers engine {eh} client {ch}"
                     + (" (same, reordered)" if sorted(eh) == sorted(ch) else "")))
            if not same:
                print("     engine :", want[-700:])
                print("     client :", cbody[-700:])
            if a.save:
                with open(os.path.join(a.save, f"passthrough-{i:02d}.engine"), "wb") as f:
                    f.write(edown)
                with open(os.path.join(a.save, f"passthrough-{i:02d}.client"), "wb") as f:
                    f.write(cbody)
        print(f"passthrough: {len(all_cases) - bad} of {len(all_cases)} cases byte-identical")
        sys.exit(1 if bad else 0)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
