#!/usr/bin/env python3
"""Clients that hang up mid-stream, and what the engine and the proxy make of it.

Usage: hangup.py PROXY_URL PROXY_ADMIN_URL ENGINE_URL [--n 4] [--after 6] [--model tiny] [--out FILE]

Opens N concurrent streaming chat requests through the proxy (max_tokens 1500, ignore_eos),
reads AFTER SSE data events of each, then closes each socket. Then polls the engine's /metrics
every 10 ms until vllm:num_requests_running is 0 and reports how long that took after the last
close; waits (up to 5 s) until the proxy's goodput_proxy_requests_total{outcome="client_abort"}
grew by N; and reports the engine's abort counter (vllm:request_success_total{finished_reason="abort"})
and vllm:generation_tokens_total before and after. Writes one JSON object (stdout or --out).
Standard library only; the pass/fail judgement is e2e_check.py's.
"""
import argparse
import http.client
import json
import socket
import threading
import time
import urllib.parse

from promtext import metric_sum


def get(url, timeout=5):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("GET", u.path + (("?" + u.query) if u.query else ""))
    r = conn.getresponse()
    body = r.read().decode("utf-8", "replace")
    conn.close()
    return body


def one_stream(proxy, model, after, rid, result, barrier):
    u = urllib.parse.urlsplit(proxy)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Tell me everything."}],
                       "stream": True, "max_tokens": 1500, "ignore_eos": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {u.hostname}:{u.port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"x-request-id: {rid}\r\n\r\n").encode()
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    barrier.wait()
    s.sendall(head + body)
    buf = b""
    events = 0
    while events < after:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        events = buf.count(b"data: ")  # chunked framing sits between events; count their starts
    # hang up: close the socket (FIN); the proxy must drop the upstream request at once
    s.close()
    result[rid] = {"events_seen": events, "closed_at": time.monotonic()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("proxy")
    ap.add_argument("admin")
    ap.add_argument("engine")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--after", type=int, default=6)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prefix", default="e2e-hangup")
    ap.add_argument("--out")
    a = ap.parse_args()

    em0 = get(a.engine + "/metrics")
    pm0 = get(a.admin + "/metrics")
    result = {}
    barrier = threading.Barrier(a.n)
    ids = [f"{a.prefix}-{i}" for i in range(a.n)]
    threads = [threading.Thread(target=one_stream, args=(a.proxy, a.model, a.after, rid, result, barrier))
               for rid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last_close = max(r["closed_at"] for r in result.values())

    # poll the engine until nothing runs (10 ms steps, 10 s cap)
    polls = []
    zero_after = None
    while time.monotonic() - last_close < 10:
        t = time.monotonic()
        running = metric_sum(get(a.engine + "/metrics"), "vllm:num_requests_running")
        polls.append((round(t - last_close, 4), running))
        if running == 0:
            zero_after = t - last_close
            break
        time.sleep(0.01)

    # the proxy counts a client abort when it notices the hang-up; give it a moment
    want = metric_sum(pm0, "goodput_proxy_requests_total", {"outcome": "client_abort"}) + a.n
    deadline = time.monotonic() + 5
    while True:
        pm1 = get(a.admin + "/metrics")
        got = metric_sum(pm1, "goodput_proxy_requests_total", {"outcome": "client_abort"})
        if got >= want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.5)  # let the engine settle before the final snapshot
    em1 = get(a.engine + "/metrics")
    pm1 = get(a.admin + "/metrics")

    def delta(m0, m1, name, labels=None):
        return metric_sum(m1, name, labels) - metric_sum(m0, name, labels)

    out = {
        "n": a.n,
        "after_events": a.after,
        "request_ids": ids,
        "events_seen": [result[i]["events_seen"] for i in ids],
        "running_zero_after_s": zero_after,
        "polls": polls[-5:],
        "poll_count": len(polls),
        "proxy_client_abort_delta": delta(pm0, pm1, "goodput_proxy_requests_total", {"outcome": "client_abort"}),
        "proxy_requests_delta": delta(pm0, pm1, "goodput_proxy_requests_total"),
        "proxy_generation_tokens_delta": delta(pm0, pm1, "goodput_proxy_generation_tokens_total"),
        "engine_abort_delta": delta(em0, em1, "vllm:request_success_total", {"finished_reason": "abort"}),
        "engine_success_delta": delta(em0, em1, "vllm:request_success_total"),
        "engine_generation_tokens_delta": delta(em0, em1, "vllm:generation_tokens_total"),
        "engine_ttft_count_delta": delta(em0, em1, "vllm:time_to_first_token_seconds_count"),
        "engine_e2e_count_delta": delta(em0, em1, "vllm:e2e_request_latency_seconds_count"),
        "engine_running_after": metric_sum(em1, "vllm:num_requests_running"),
    }
    text = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
