#!/usr/bin/env python3
"""Turns scripts/bench.sh's raw.jsonl into bench.json (figures per path) and bench.md (tables,
ratios). Standard library only.

    python3 scripts/bench/report.py out/bench/raw.jsonl out/bench

Each figure over rounds is the median, with the range of the rounds beside it. "Added" latency
is a path's percentile minus direct's in the same round (then the median over rounds); CPU per
request is the forwarder's utime+stime over the measurement divided by the requests completed.
"""
import json
import statistics
import sys
from collections import defaultdict

PATHS = ["direct", "nginx", "proxy-on", "proxy-off", "litellm"]
LABEL = {
    "direct": "direct to the simulator",
    "nginx": "nginx (1 worker, proxy_buffering off)",
    "proxy-on": "goodput-proxy, metering on",
    "proxy-off": "goodput-proxy, metering off",
    "litellm": "LiteLLM (1 worker, prometheus callback)",
}


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rng(xs):
    xs = [x for x in xs if x is not None]
    return [min(xs), max(xs)] if xs else None


def load(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    run = next((r for r in rows if r["part"] == "run"), {})
    loadavg = {r["phase"]: r["loadavg"] for r in rows if r["part"] == "meta"}
    return rows, run, loadavg


def throughput(rows, run):
    tck = run.get("clk_tck", 100)
    events = run.get("events_per_stream", 0)
    per = defaultdict(list)  # (mode, conns, path) -> rounds
    direct = {}  # (mode, conns, round) -> wrk
    for r in rows:
        if r["part"] != "wrk" or not r.get("wrk"):
            continue
        w = r["wrk"]
        secs = w["duration_us"] / 1e6
        n = w["requests"]
        if not n:  # nothing completed in the window (LiteLLM's streams at 64 connections)
            w["latency_us"] = {"p50": None, "p99": None}
        cpu_us = r["cpu_ticks"] * 1e6 / tck
        e = w["errors"]
        x = {
            "round": r["round"],
            "rps": n / secs if secs else None,
            "p50_ms": w["latency_us"]["p50"] / 1e3 if n else None,
            "p99_ms": w["latency_us"]["p99"] / 1e3 if n else None,
            "cpu_us_per_req": cpu_us / n if n and r["path"] != "direct" else None,
            "rss_mb": r["rss_kb"] / 1024 if r["path"] != "direct" else None,
            "errors": e["connect"] + e["read"] + e["write"] + e["status"] + e["timeout"],
        }
        per[(r["mode"], r["conns"], r["path"])].append(x)
        if r["path"] == "direct":
            direct[(r["mode"], r["conns"], r["round"])] = x
    out = []
    for (mode, conns, path), xs in per.items():
        ev = events if mode == "stream" else 0
        added = lambda k: [  # noqa: E731
            x[k] - direct[(mode, conns, x["round"])][k]
            for x in xs
            if (mode, conns, x["round"]) in direct and x[k] is not None
        ]
        row = {
            "mode": mode,
            "conns": conns,
            "path": path,
            "rounds": len(xs),
            "rps": med([x["rps"] for x in xs]),
            "rps_range": rng([x["rps"] for x in xs]),
            "events_per_s": med([x["rps"] * ev for x in xs if x["rps"] is not None]) if ev else None,
            "p50_ms": med([x["p50_ms"] for x in xs]),
            "p99_ms": med([x["p99_ms"] for x in xs]),
            "added_p50_ms": med(added("p50_ms")) if path != "direct" else None,
            "added_p99_ms": med(added("p99_ms")) if path != "direct" else None,
            "cpu_us_per_req": med([x["cpu_us_per_req"] for x in xs]),
            "cpu_us_per_req_range": rng([x["cpu_us_per_req"] for x in xs]),
            "cpu_us_per_event": (
                med([x["cpu_us_per_req"] / ev for x in xs if x["cpu_us_per_req"]]) if ev else None
            ),
            "rss_mb": med([x["rss_mb"] for x in xs]),
            "errors": sum(x["errors"] for x in xs),
        }
        out.append(row)
    out.sort(key=lambda r: (r["mode"] != "stream", r["conns"], PATHS.index(r["path"])))
    return out


def paced(rows, run):
    tck = run.get("clk_tck", 100)
    per = defaultdict(list)
    direct = {}
    for r in rows:
        if r["part"] != "paced" or not r.get("bench") or not r["bench"].get("ttft_ms"):
            continue
        b = r["bench"]
        x = {
            "round": r["round"],
            "p50": b["ttft_ms"]["p50"],
            "p99": b["ttft_ms"]["p99"],
            "requests": b["requests"],
            "errors": b["errors"],
            "cpu_us_per_req": (
                r["cpu_ticks"] * 1e6 / tck / b["completed"]
                if b.get("completed") and r["path"] != "direct"
                else None
            ),
        }
        per[(r["streams"], r["path"])].append(x)
        if r["path"] == "direct":
            direct[(r["streams"], r["round"])] = x
    out = []
    for (streams, path), xs in per.items():
        added = lambda k: [  # noqa: E731
            x[k] - direct[(streams, x["round"])][k] for x in xs if (streams, x["round"]) in direct
        ]
        out.append(
            {
                "streams": streams,
                "path": path,
                "rounds": len(xs),
                "requests": sum(x["requests"] for x in xs),
                "errors": sum(x["errors"] for x in xs),
                "ttft_p50_ms": med([x["p50"] for x in xs]),
                "ttft_p99_ms": med([x["p99"] for x in xs]),
                "added_ttft_p50_ms": med(added("p50")) if path != "direct" else None,
                "added_ttft_p99_ms": med(added("p99")) if path != "direct" else None,
                "added_ttft_p99_ms_range": rng(added("p99")) if path != "direct" else None,
                "cpu_us_per_req": med([x["cpu_us_per_req"] for x in xs]),
            }
        )
    out.sort(key=lambda r: (r["streams"], PATHS.index(r["path"])))
    return out


def held(rows):
    out = []
    for r in rows:
        if r["part"] != "held":
            continue
        b = r.get("bench") or {}
        peak_open = b.get("peak_open") or 0
        grown = r["rss_peak_kb"] - r["rss_before_kb"]
        out.append(
            {
                "path": r["path"],
                "streams": r["streams"],
                "peak_open": peak_open,
                "errors": b.get("errors"),
                "statuses": b.get("statuses"),
                "rss_before_mb": r["rss_before_kb"] / 1024,
                "rss_peak_mb": r["rss_peak_kb"] / 1024,
                "rss_after_mb": r["rss_after_kb"] / 1024,
                "kib_per_open_stream": grown / peak_open if peak_open else None,
                "after_over_before_mb": (r["rss_after_kb"] - r["rss_before_kb"]) / 1024,
            }
        )
    return out


def burst(rows):
    out = []
    for r in rows:
        if r["part"] != "burst":
            continue
        b = r.get("bench") or {}
        out.append(
            {
                "path": r["path"],
                "streams": r["streams"],
                "requests": b.get("requests"),
                "errors": b.get("errors"),
                "statuses": b.get("statuses"),
                "error_samples": b.get("error_samples"),
                "peak_open": b.get("peak_open"),
                "elapsed_s": b.get("elapsed_s"),
                "e2e_p99_ms": (b.get("e2e_ms") or {}).get("p99"),
            }
        )
    return out


def find(rows, **kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def ratio(a, b):
    return a / b if a is not None and b else None


def ratios(tp, pc, hd, bs):
    g = lambda mode, path, key, conns=64: (find(tp, mode=mode, conns=conns, path=path) or {}).get(key)  # noqa: E731
    p = lambda n, path, key: (find(pc, streams=n, path=path) or {}).get(key)  # noqa: E731
    h = lambda path, key: (find(hd, path=path) or {}).get(key)  # noqa: E731
    on_cpu, off_cpu = g("stream", "proxy-on", "cpu_us_per_req"), g("stream", "proxy-off", "cpu_us_per_req")
    return {
        "streams_per_s_proxy_on_over_nginx_64": ratio(g("stream", "proxy-on", "rps"), g("stream", "nginx", "rps")),
        "streams_per_s_proxy_off_over_nginx_64": ratio(g("stream", "proxy-off", "rps"), g("stream", "nginx", "rps")),
        "cpu_us_per_event_64": {k: g("stream", k, "cpu_us_per_event") for k in ("nginx", "proxy-on", "proxy-off", "litellm")},
        "metering_on_over_off_cpu_per_stream": ratio(on_cpu, off_cpu),
        "json_rps_proxy_on_over_nginx_64": ratio(g("json", "proxy-on", "rps"), g("json", "nginx", "rps")),
        "json_cpu_per_req_proxy_on_over_nginx_64": ratio(g("json", "proxy-on", "cpu_us_per_req"), g("json", "nginx", "cpu_us_per_req")),
        "json_rps_proxy_off_over_nginx_64": ratio(g("json", "proxy-off", "rps"), g("json", "nginx", "rps")),
        "added_ttft_p99_ms": {
            f"{n}": {k: p(n, k, "added_ttft_p99_ms") for k in ("nginx", "proxy-on", "proxy-off", "litellm")}
            for n in sorted({r["streams"] for r in pc})
        },
        "kib_per_open_stream": {k: h(k, "kib_per_open_stream") for k in ("nginx", "proxy-on", "proxy-off")},
        "rss_after_over_before_mb": {k: h(k, "after_over_before_mb") for k in ("nginx", "proxy-on", "proxy-off")},
        "burst_errors": {r["path"]: r["errors"] for r in bs},
    }


def f(x, d=0, unit=""):
    if x is None:
        return "-"
    return f"{x:,.{d}f}{unit}"


def fr(r, d=0):
    return "-" if not r else f"{r[0]:,.{d}f}-{r[1]:,.{d}f}"


def markdown(run, loadavg, tp, pc, hd, bs, rt):
    L = []
    L.append(
        f"Run {run.get('date', '?')}, git {run.get('git', '?')}, {run.get('nproc', '?')} cores, kernel "
        f"{run.get('kernel', '?')}, {run.get('nginx', '?')}, {run.get('wrk', '?')}, {run.get('litellm', '?')}; "
        f"{run.get('events_per_stream', '?')} SSE events a stream (64 tokens); {run.get('secs', '?')} s a "
        f"measurement, {run.get('rounds', '?')} rounds; total {run.get('total_s', '?')} s "
        f"(bench-build {run.get('build_s', '?')} s)"
        + (f"; the proxies ran with LD_PRELOAD={run['proxy_preload']}" if run.get("proxy_preload") else "")
        + (
            "; the proxies wrote an access line per request (nginx: access_log off)"
            if run.get("access_log") == "true"
            else "; access lines off for nginx and the proxies alike"
        )
        + ". Load average (1/5/15 min) at start, after each part: "
        + "; ".join(f"{k} {v}" for k, v in loadavg.items())
        + "."
    )
    L.append("")
    for mode, title in (("stream", "Streaming (64-token chat streams)"), ("json", "Non-streaming (same request, JSON)")):
        rows = [r for r in tp if r["mode"] == mode]
        if not rows:
            continue
        L.append(f"### {title}, wrk")
        L.append("")
        ev = mode == "stream"
        L.append(
            "| conns | path | req/s (range) | "
            + ("SSE events/s | " if ev else "")
            + "p50 / p99 ms | added p50 / p99 ms | CPU us/req (range) | "
            + ("CPU us/event | " if ev else "")
            + "RSS MiB | errors |"
        )
        L.append("| --- " * (9 if ev else 7) + "|")
        for r in rows:
            L.append(
                f"| {r['conns']} | {r['path']} | {f(r['rps'])} ({fr(r['rps_range'])}) | "
                + (f"{f(r['events_per_s'])} | " if ev else "")
                + f"{f(r['p50_ms'], 2)} / {f(r['p99_ms'], 2)} | {f(r['added_p50_ms'], 2)} / {f(r['added_p99_ms'], 2)} | "
                + f"{f(r['cpu_us_per_req'])} ({fr(r['cpu_us_per_req_range'])}) | "
                + (f"{f(r['cpu_us_per_event'], 2)} | " if ev else "")
                + f"{f(r['rss_mb'], 1)} | {r['errors']} |"
            )
        L.append("")
    if pc:
        L.append("### Paced streams (simulator paces tokens 10 ms apart, 32 tokens): client TTFT, exact")
        L.append("")
        L.append("| streams | path | requests | errors | TTFT p50 / p99 ms | added p50 / p99 ms (p99 range) | CPU us/req |")
        L.append("| --- " * 7 + "|")
        for r in pc:
            L.append(
                f"| {r['streams']} | {r['path']} | {r['requests']} | {r['errors']} | {f(r['ttft_p50_ms'], 3)} / {f(r['ttft_p99_ms'], 3)} | "
                f"{f(r['added_ttft_p50_ms'], 3)} / {f(r['added_ttft_p99_ms'], 3)} ({fr(r['added_ttft_p99_ms_range'], 3)}) | {f(r['cpu_us_per_req'])} |"
            )
        L.append("")
    if hd:
        L.append("### Held streams (opened at once, each held open for seconds)")
        L.append("")
        L.append("| path | streams | peak open | errors | RSS before / peak / after MiB | KiB per open stream | after - before MiB |")
        L.append("| --- " * 7 + "|")
        for r in hd:
            L.append(
                f"| {r['path']} | {r['streams']} | {r['peak_open']} | {f(r['errors'])} | {f(r['rss_before_mb'], 1)} / {f(r['rss_peak_mb'], 1)} / "
                f"{f(r['rss_after_mb'], 1)} | {f(r['kib_per_open_stream'], 1)} | {f(r['after_over_before_mb'], 1)} |"
            )
        L.append("")
    if bs:
        L.append("### Burst of new streams (zero-cost, started at once, each on a new connection)")
        L.append("")
        L.append("| path | streams | errors | statuses | peak open | took s | E2E p99 ms | first errors |")
        L.append("| --- " * 8 + "|")
        for r in bs:
            L.append(
                f"| {r['path']} | {r['streams']} | {f(r['errors'])} | {json.dumps(r['statuses'] or {})} | {f(r['peak_open'])} | "
                f"{f(r['elapsed_s'], 1)} | {f(r['e2e_p99_ms'])} | {'; '.join(r['error_samples'] or [])[:200]} |"
            )
        L.append("")
    L.append("### Ratios against the targets")
    L.append("")
    c = rt["cpu_us_per_event_64"]
    L.append(f"- streams/s at 64 conns, proxy / nginx: metering on {f(rt['streams_per_s_proxy_on_over_nginx_64'], 2)}, off {f(rt['streams_per_s_proxy_off_over_nginx_64'], 2)} (target >= 0.9)")
    L.append(f"- CPU per SSE event at 64 conns, us: proxy on {f(c['proxy-on'], 2)}, off {f(c['proxy-off'], 2)}, nginx {f(c['nginx'], 2)} (target <= 1.0)")
    on_off = rt["metering_on_over_off_cpu_per_stream"]
    L.append(f"- metering on over off, CPU per stream: {f(on_off, 2)}x ({f((on_off - 1) * 100 if on_off else None)}% more; target <= 15%)")
    L.append(f"- non-streaming at 64 conns, proxy (on) / nginx: req/s {f(rt['json_rps_proxy_on_over_nginx_64'], 2)} (off {f(rt['json_rps_proxy_off_over_nginx_64'], 2)}; target >= 0.85), CPU per request {f(rt['json_cpu_per_req_proxy_on_over_nginx_64'], 2)} (target <= 1.5)")
    for n, v in rt["added_ttft_p99_ms"].items():
        L.append(f"- added TTFT p99 at {n} paced streams, ms: proxy on {f(v['proxy-on'], 3)}, off {f(v['proxy-off'], 3)}, nginx {f(v['nginx'], 3)} (target <= {'0.2' if n == '64' else '1'})")
    k = rt["kib_per_open_stream"]
    a = rt["rss_after_over_before_mb"]
    L.append(f"- RSS per open stream, KiB: proxy on {f(k['proxy-on'], 1)}, off {f(k['proxy-off'], 1)}, nginx {f(k['nginx'], 1)} (target <= 32); after the streams end, over before, MiB: proxy on {f(a['proxy-on'], 1)}, off {f(a['proxy-off'], 1)}, nginx {f(a['nginx'], 1)}")
    L.append(f"- burst errors: " + ", ".join(f"{p} {f(e)}" for p, e in rt["burst_errors"].items()) + " (target 0)")
    return "\n".join(L) + "\n"


def main():
    raw, out = sys.argv[1], sys.argv[2]
    rows, run, loadavg = load(raw)
    tp, pc, hd, bs = throughput(rows, run), paced(rows, run), held(rows), burst(rows)
    rt = ratios(tp, pc, hd, bs)
    doc = {"run": run, "loadavg": loadavg, "throughput": tp, "paced": pc, "held": hd, "burst": bs, "ratios": rt}
    with open(f"{out}/bench.json", "w") as fh:
        json.dump(doc, fh, indent=1)
    md = markdown(run, loadavg, tp, pc, hd, bs, rt)
    with open(f"{out}/bench.md", "w") as fh:
        fh.write(md)
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
