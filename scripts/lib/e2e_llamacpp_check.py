#!/usr/bin/env python3
"""Checks for scripts/e2e-real-llamacpp.sh (stdlib only): the proxy in front of a real
llama-server. Prints one line per check (PASS / FAIL / NOTE) and a summary; exit 1 on a FAIL.

1. signals: concurrent streams through the proxy against one slot; the admin /metrics polled
   meanwhile: the kind is detected as llamacpp, the canonical gauges equal llama.cpp's own
   families on the same page, the queue was seen above 0;
2. meter: every record a success with TTFT, exact tokens (llama.cpp's timings, or the usage
   injected before the kind was known) and the engine's view from timings;
3. prompt progress: with return_progress the record's TTFT comes after its first chunk;
4. bytes: what the client got against the engine's own answer to the same request.

With `--phase no-metrics` (llama-server started without `--metrics`, a fresh proxy): the kind
is still detected as llamacpp (from the `Server: llama.cpp` header of its 501), no queue series
is served, and a stream through the proxy is left as the client wrote it (no usage injected,
the engine's own bytes, tokens exact from `timings`).
"""
import argparse
import json
import re
import threading
import time
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')
RESULTS = []


def check(ok, what):
    RESULTS.append((ok, what))
    print(("PASS " if ok else "FAIL ") + what, flush=True)


def note(what):
    print("NOTE " + what, flush=True)


def post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def page(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def series(text):
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def value(s, name, **labels):
    for l, v in s.get(name, []):
        if all(l.get(k) == want for k, want in labels.items()):
            return v
    return None


def events(body):
    return [b[len("data: "):] for b in body.split("\n\n") if b.startswith("data: ")]


def chat(max_tokens, **extra):
    b = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}],
         "stream": True, "max_tokens": max_tokens, "ignore_eos": True, "seed": 1,
         "temperature": 0}
    b.update(extra)
    return b


def shape(body, keep_timings=True):
    """A stream's events with the per-request fields (ids, clocks) blanked."""
    out = []
    for e in events(body):
        if e == "[DONE]":
            out.append(e)
            continue
        v = json.loads(e)
        for k in ("id", "created"):
            v.pop(k, None)
        # the prompt cache differs between two runs of one request
        if isinstance(v.get("usage"), dict):
            v["usage"].pop("prompt_tokens_details", None)
        if "timings" in v:
            if keep_timings:
                v["timings"] = sorted(v["timings"])
            else:
                v.pop("timings")
        out.append(v)
    return out


def no_metrics(a):
    up = a.engine
    kinds, s = set(), {}
    deadline = time.time() + 10
    while time.time() < deadline:
        s = series(page(a.admin + "/metrics"))
        kinds = {l.get("kind") for l, v in s.get("goodput_proxy_engine_kind", [])
                 if v == 1.0 and l.get("upstream") == up}
        if kinds:
            break
        time.sleep(0.2)
    check(kinds == {"llamacpp"},
          f"without --metrics: engine kind detected {sorted(kinds)} (its Server header)")
    up_v = value(s, "goodput_proxy_engine_up", upstream=up)
    errs = value(s, "goodput_proxy_engine_scrape_errors_total", upstream=up)
    qd = value(s, "goodput_proxy_upstream_queue_depth", upstream=up)
    check(up_v == 0.0 and (errs or 0) >= 1 and qd is None,
          f"scrapes fail (engine_up {up_v}, scrape errors {errs}), no queue series ({qd})")
    b = chat(6)
    direct_body = post(up + "/v1/chat/completions", b)
    via_body = post(a.proxy + "/v1/chat/completions", b)
    with open(f"{a.out}/no-metrics-direct.txt", "w") as f:
        f.write(direct_body)
    with open(f"{a.out}/no-metrics-via-proxy.txt", "w") as f:
        f.write(via_body)
    check(shape(direct_body) == shape(via_body),
          "the client's stream is the engine's own (no usage injected, timings where the "
          "engine put them)")
    time.sleep(0.5)
    recs = [json.loads(l) for l in open(a.records) if l.strip()]
    r = recs[-1] if recs else {}
    check(r.get("usage_injected") is False and r.get("tokens_exact") is True
          and r.get("completion_tokens") == 6 and r.get("outcome") == "success",
          f"record: {dict((k, r.get(k)) for k in ('usage_injected', 'tokens_exact', 'completion_tokens', 'outcome'))}")


def main():
    ap = argparse.ArgumentParser()
    for a in ("proxy", "admin", "engine", "records", "out"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--phase", choices=["metrics", "no-metrics"], default="metrics")
    a = ap.parse_args()
    up = a.engine
    if a.phase == "no-metrics":
        no_metrics(a)
        failed = [w for ok, w in RESULTS if not ok]
        print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
        return 1 if failed else 0

    # 1. signals under load
    bodies, errors = [], []

    def one():
        try:
            bodies.append(post(a.proxy + "/v1/chat/completions", chat(150)))
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            errors.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    pages, max_queue, mismatches, kinds = 0, 0.0, [], set()
    deadline = time.time() + 120
    while any(t.is_alive() for t in threads) and time.time() < deadline:
        s = series(page(a.admin + "/metrics"))
        q = value(s, "goodput_proxy_upstream_queue_depth", upstream=up)
        r = value(s, "goodput_proxy_upstream_running", upstream=up)
        own_q = value(s, "llamacpp:requests_deferred", upstream=up)
        own_r = value(s, "llamacpp:requests_processing", upstream=up)
        for l, v in s.get("goodput_proxy_engine_kind", []):
            if v == 1.0 and l.get("upstream") == up:
                kinds.add(l.get("kind"))
        if q is not None and own_q is not None:
            pages += 1
            max_queue = max(max_queue, q)
            if (q, r) != (own_q, own_r):
                mismatches.append((q, r, own_q, own_r))
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=5)
    check(not errors and len(bodies) == 4, f"4 streams through the proxy ({errors or 'no error'})")
    check(kinds == {"llamacpp"}, f"engine kind detected: {sorted(kinds)}")
    check(pages > 0 and not mismatches,
          f"canonical queue/running equal llamacpp:requests_deferred/processing on {pages} pages"
          f" (mismatches: {mismatches[:3]})")
    check(max_queue >= 1, f"the queue was seen (max goodput_proxy_upstream_queue_depth {max_queue})")

    # 2. meter: records of those streams
    time.sleep(0.5)
    recs = [json.loads(l) for l in open(a.records) if l.strip()]
    load = [r for r in recs if r.get("completion_tokens") == 150]
    check(len(load) == 4, f"4 records with exact completion_tokens 150 ({len(recs)} records)")
    check(all(r.get("outcome") == "success" and r.get("ttft_s") and r.get("tokens_exact")
              for r in load), "each a success with a TTFT and exact tokens")
    check(all("usage" not in json.dumps([json.loads(e) for e in events(b) if e != "[DONE]"])
              for b in bodies), "no usage chunk in what the clients got (none asked for usage)")
    check(all(r.get("engine_ttft_s") is not None and r.get("engine_decode_s") is not None
              and r.get("cached_prompt_tokens") is not None for r in load),
          "each with the engine's view from llama.cpp's timings (engine TTFT, decode, cached)")

    # 3. prompt progress chunks come before the first token
    n = len(recs)
    body = post(a.proxy + "/v1/chat/completions", chat(8, return_progress=True))
    time.sleep(0.5)
    recs = [json.loads(l) for l in open(a.records) if l.strip()]
    new = recs[n:]
    progress = sum(1 for e in events(body) if '"prompt_progress"' in e)
    check(progress >= 1, f"the client got {progress} prompt_progress chunks")
    ok = len(new) == 1 and new[0].get("ttft_s") and new[0]["ttft_s"] >= new[0].get("ttfc_s", 0)
    check(bool(ok), f"TTFT counted from the first token, not a progress chunk: {new[-1:] and {k: new[-1].get(k) for k in ('ttfc_s', 'ttft_s', 'completion_tokens', 'outcome')}}")

    # 4. bytes: the engine's own answer vs what the client got through the proxy (ids and
    # clock fields differ per request: compared after blanking them)
    for name, path, b in [
        ("chat", "/v1/chat/completions", chat(6)),
        ("completions", "/v1/completions",
         {"model": "tiny", "prompt": "Hello there", "stream": True, "max_tokens": 6,
          "ignore_eos": True, "seed": 1, "temperature": 0}),
    ]:
        direct_body, via_body = post(up + path, b), post(a.proxy + path, b)
        with open(f"{a.out}/{name}-direct.txt", "w") as f:
            f.write(direct_body)
        with open(f"{a.out}/{name}-via-proxy.txt", "w") as f:
            f.write(via_body)
        # The replica is known as llama.cpp by now: no usage injected, `timings` where the
        # engine puts them (the finish chunk).
        check(shape(direct_body) == shape(via_body),
              f"{name}: the client's stream has the engine's own shape, timings included "
              f"(engine {sum('timings' in json.dumps(v) for v in shape(direct_body))}, "
              f"via proxy {sum('timings' in json.dumps(v) for v in shape(via_body))} chunks "
              f"with timings; see {name}-direct.txt / {name}-via-proxy.txt)")

    failed = [w for ok, w in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
