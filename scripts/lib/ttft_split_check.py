"""Where TTFT goes, checked on a real engine's run (standard library only).

    python3 ttft_split_check.py OUT_DIR PROXY_ADDR [--model tiny]

OUT_DIR holds the load generator's lt/requests.jsonl and the proxy's records.jsonl (joined by
request id). For every request whose engine reported its per-request timings (vLLM started with
--enable-per-request-metrics: streams of one choice, whose usage chunk was asked for or injected):
  - engine queue + engine TTFT <= the client's TTFT (the load generator's) and the proxy's;
  - proxy + queue + prefill + rest = the proxy's TTFT within 1 us, no part negative, none clamped.
Then a long prompt is sent twice through the proxy at PROXY_ADDR: the second record must show
cached prompt tokens. Prints the figures; exits non-zero when a check fails.
"""
import argparse
import http.client
import json
import os
import sys
import time


def pct(values, q):
    v = sorted(values)
    if not v:
        return None
    h = (len(v) - 1) * q
    lo = int(h)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (h - lo) * (v[hi] - v[lo])


def ms(v):
    return "-" if v is None else f"{v * 1e3:.3f}"


def load(path, key):
    out = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            out[r[key]] = r
    return out


def wait_records(path, ids, within=10.0):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            have = load(path, "id")
        except (OSError, ValueError):
            have = {}
        if all(i in have for i in ids):
            return have
        time.sleep(0.1)
    return load(path, "id")


def post_stream(addr, body):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    rid = r.getheader("x-request-id")
    c.close()
    return rid


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("proxy")
    ap.add_argument("--model", default="tiny")
    a = ap.parse_args()
    client = load(os.path.join(a.out, "lt", "requests.jsonl"), "request_id")
    records = load(os.path.join(a.out, "records.jsonl"), "id")
    failures = []
    parts = {k: [] for k in ("proxy", "queue", "prefill", "rest")}
    slack_client, slack_proxy, sum_err = [], [], []
    split = no_engine = 0
    for rid, c in client.items():
        r = records.get(rid)
        if r is None or c.get("ttft_seconds") is None:
            continue
        if r.get("engine_queue_s") is None or r.get("engine_ttft_s") is None:
            no_engine += 1
            continue
        split += 1
        engine = r["engine_queue_s"] + r["engine_ttft_s"]
        slack_client.append(c["ttft_seconds"] - engine)
        slack_proxy.append(r["ttft_s"] - engine)
        p = [r.get(f"ttft_{k}_s") for k in parts]
        if None in p:
            failures.append(f"{rid}: engine timings but no split")
            continue
        for k, v in zip(parts, p):
            parts[k].append(v)
        sum_err.append(abs(sum(p) - r["ttft_s"]))
        if c["ttft_seconds"] < engine:
            failures.append(f"{rid}: engine queue + TTFT {engine:.6f} s > client TTFT {c['ttft_seconds']:.6f} s")
        if min(p) < 0 or r.get("ttft_split_clamped"):
            failures.append(f"{rid}: a part negative or clamped: {p}")
        if abs(sum(p) - r["ttft_s"]) > 1e-6:
            failures.append(f"{rid}: parts sum {sum(p):.9f} != TTFT {r['ttft_s']:.9f}")
    print(f"TTFT split: {split} requests with the engine's timings "
          f"({no_engine} streamed requests without them: n > 1, or no usage chunk)")
    for k, v in parts.items():
        print(f"  {k:8s} p50 {ms(pct(v, 0.5))} ms  p99 {ms(pct(v, 0.99))} ms  max {ms(max(v) if v else None)} ms")
    print(f"  client TTFT - (engine queue + engine TTFT): min {ms(min(slack_client) if slack_client else None)} ms, "
          f"p50 {ms(pct(slack_client, 0.5))} ms")
    print(f"  proxy TTFT - (engine queue + engine TTFT): min {ms(min(slack_proxy) if slack_proxy else None)} ms")
    print(f"  |proxy + queue + prefill + rest - TTFT|: max {max(sum_err) * 1e9 if sum_err else 0:.0f} ns")
    if split == 0:
        failures.append("no request carried the engine's timings (is vLLM started with --enable-per-request-metrics?)")

    words = " ".join(f"word{i} alpha beta" for i in range(200))
    body = {"model": a.model, "messages": [{"role": "user", "content": words}],
            "stream": True, "max_tokens": 4, "seed": 1}
    ids = [post_stream(a.proxy, body) for _ in range(2)]
    recs = wait_records(os.path.join(a.out, "records.jsonl"), ids)
    cached = [recs.get(i, {}).get("cached_prompt_tokens") for i in ids]
    prompt = recs.get(ids[1], {}).get("prompt_tokens")
    print(f"repeated long prefix ({prompt} prompt tokens) through the proxy: cached prompt tokens "
          f"{cached[0]} then {cached[1]}")
    if not cached[1]:
        failures.append(f"the repeated prompt showed no cached tokens: {cached}")
    for f in failures[:20]:
        print("FAIL", f)
    print("ttft split checks:", "FAILED" if failures else "ok")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
