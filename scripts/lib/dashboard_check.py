#!/usr/bin/env python3
"""Proves config/grafana/goodput-proxy.json against a real Prometheus.

Starts two simulated engines (one with vLLM V1 metric names, one with v0 names), a goodput-proxy
in front of both, and Debian's `prometheus` scraping the proxy's admin port (the one scrape
target: it serves the engines' families relabelled `upstream`), with config/prometheus-rules.yml
loaded. Sends a short streaming load, light then past the simulators' slots (a third of it tool
calls), then evaluates every panel query and every template variable query through
`/api/v1/query` with `$__rate_interval` and
the variables substituted (All = `.*`, as Grafana sends it). A query fails when Prometheus
answers an error, returns no series, returns only NaN, or, when its legend is per upstream,
leaves out one of the upstreams (so both the V1 and the v0 names of every engine panel are
exercised).

With `--fleet mixed` the replicas are five simulated engines of different kinds (vLLM, SGLang,
llama.cpp, TGI, TensorRT-LLM personalities: docs/engines.md) instead: a per-upstream query must
then show every replica whose engine serves a family it reads (told from the proxy's own page),
and the panels of MIXED_COVERAGE every replica of the engines listed there (the canonical
signals, read through the mapping).

Stdlib only. Everything listens on 127.0.0.1 and is stopped on exit.
Usage: dashboard_check.py --proxy target/debug/goodput-proxy [--dashboard FILE] [--keep]
                          [--fleet vllm|mixed]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRAPE_INTERVAL_S = 1
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 x scrape interval); over a
# short range the second term wins.
RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"
ALL = ".*"
MODEL = "tiny"


# ---------- the pure part (unit-tested in test_dashboard_check.py) ----------


@dataclass
class Query:
    panel: str
    ref: str
    expr: str
    legend: str = ""


def panel_queries(dashboard: dict) -> list[Query]:
    """Every target of every panel, rows' nested panels included."""
    out: list[Query] = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append(Query(p.get("title", "?"), t.get("refId", "?"), t["expr"],
                                     t.get("legendFormat", "")))

    walk(dashboard.get("panels", []))
    return out


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def variable_queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(variable, label, PromQL) for each `label_values(metric, label)` query variable."""
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = _LABEL_VALUES.match(q or "")
        if not m:
            raise ValueError(f"variable {v.get('name')}: unsupported query {q!r}")
        out.append((v["name"], m.group(2), f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's substitution for what the dashboard uses: `$name` and `${name}`. A variable
    left over is an error (Prometheus would reject it anyway, less clearly)."""

    def one(m):
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise KeyError(f"unknown variable ${name} in {expr!r}")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


# Families the proxy leaves absent until it has seen attainment fall below `[scale] target`
# against load (docs/autoscaling.md: no data, never a made-up number). A short check on a
# loaded machine does not always get there: a query on them must be valid, and may be empty.
MAY_BE_ABSENT = re.compile(r"goodput_proxy_(headroom_|capacity_|desired_replicas)")


def judge(result: dict, want_upstreams: set[str] | None, expr: str = "") -> str | None:
    """None when the `/api/v1/query` answer has data; else what is wrong with it."""
    if result.get("status") != "success":
        return f"error: {result.get('errorType')}: {result.get('error')}"
    data = result.get("data", {})
    kind, rows = data.get("resultType"), data.get("result")
    if kind == "scalar":
        rows = [{"metric": {}, "value": rows}]
    if not rows:
        return None if MAY_BE_ABSENT.search(expr) else "no data"
    values = [float(r["value"][1]) for r in rows]
    if all(math.isnan(v) for v in values):
        return "only NaN"
    if want_upstreams:
        seen = {r["metric"].get("upstream") for r in rows if not math.isnan(float(r["value"][1]))}
        missing = sorted(want_upstreams - seen)
        if missing:
            return f"no data for upstream(s) {missing} (got {sorted(s for s in seen if s)})"
    return None


# The mixed fleet: one replica per engine personality, in this order.
MIXED = ["vllm", "sglang", "llamacpp", "tgi", "trtllm"]
# Panels that must show every replica of these engines on a mixed fleet (their per-upstream
# lines): the canonical signals, which every engine has (KV use: where the engine exports it).
MIXED_COVERAGE = {
    "Engine running and waiting": set(MIXED),
    "KV-cache use": {"vllm", "sglang", "trtllm"},
    "Autoscaler demand signal": set(MIXED),
    "Replica health": set(MIXED),
    "In flight per replica (proxy) and per model": set(MIXED),
}

_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NAME_REGEX = re.compile(r'__name__\s*=~\s*"([^"]*)"')


def metric_names(expr: str) -> set[str]:
    """Every name a query may read: its words (metric names among functions and labels) and
    the alternatives of `__name__=~"a|b"`."""
    names = set(_WORD.findall(expr))
    for alts in _NAME_REGEX.findall(expr):
        names.update(a for a in alts.split("|") if a)
    return names


def upstreams_by_name(page: str) -> dict[str, set[str]]:
    """Sample name -> the `upstream` label values it has on a Prometheus text page."""
    out: dict[str, set[str]] = {}
    for line in page.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{\s]", line, maxsplit=1)[0]
        m = re.search(r'upstream="([^"]*)"', line)
        if m:
            out.setdefault(name, set()).add(m.group(1))
    return out


def operands(expr: str, op: str = " - ") -> list[str]:
    """`expr` split at `op` outside parentheses and quotes: the operands of a top-level
    arithmetic between two vectors."""
    parts, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(expr):
        c = expr[i]
        if c == '"':
            quoted = not quoted
        elif not quoted and c in "([{":
            depth += 1
        elif not quoted and c in ")]}":
            depth -= 1
        elif not quoted and depth == 0 and expr.startswith(op, i):
            parts.append(expr[start:i])
            start = i + len(op)
            i = start
            continue
        i += 1
    parts.append(expr[start:])
    return parts


def expected_upstreams(expr: str, served: dict[str, set[str]]) -> set[str]:
    """The replicas whose page has a series of a metric the query reads; for a difference of
    two vectors, the replicas both operands have (PromQL matches their series one to one)."""
    sides = operands(expr)
    if len(sides) > 1:
        return set.intersection(*(expected_upstreams(e, served) for e in sides))
    out: set[str] = set()
    for n in metric_names(expr):
        out |= served.get(n, set())
    return out


# ---------- the processes ----------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def wait_for(url: str, within_s: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            get(url, timeout=0.5)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {url} within {within_s} s")


class Procs:
    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append((name, p))
        return p

    def stop(self) -> None:
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for _, p in reversed(self.procs):
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# A function offered in `tools` on the tool-call share of the load: the simulator answers with
# a streamed call whose arguments fit its schema, lose their closing `}`, or break the `enum`.
TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "required": ["location"], "properties": {
        "location": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}]
TOOL_CALLS = ["valid", "invalid-json", "schema-violation"]


def one_request(proxy: str, max_tokens: int, tool_call: str | None = None) -> None:
    req_body = {"model": MODEL, "stream": True, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "Hello there"}]}
    headers = {"content-type": "application/json"}
    if tool_call:
        req_body["tools"] = TOOLS
        headers["x-sim-fault"] = f"tool-call={tool_call}"
    req = urllib.request.Request(f"{proxy}/v1/chat/completions",
                                 data=json.dumps(req_body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            while r.read(4096):
                pass
    except urllib.error.HTTPError as e:
        e.read()  # injected faults answer 5xx: counted by the proxy, fine here


def load(proxy: str, seconds: float, concurrency: int) -> int:
    stop_at = time.monotonic() + seconds
    sent = [0] * concurrency

    def worker(i):
        n = 0
        while time.monotonic() < stop_at:
            # Every third request asks for a tool call, the kinds in turn (max_tokens 32: room
            # for the whole arguments, so each kind is judged as asked).
            k = n * concurrency + i
            if k % 3 == 0:
                one_request(proxy, 32, TOOL_CALLS[(k // 3) % len(TOOL_CALLS)])
            else:
                one_request(proxy, 8 + (n * 7 + i) % 24)
            n += 1
        sent[i] = n

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(sent)


def prom_query(prom: str, expr: str, at: float) -> dict:
    qs = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    try:
        return json.loads(get(f"{prom}/api/v1/query?{qs}", timeout=10))
    except urllib.error.HTTPError as e:  # 400/422 carry the error document
        return json.loads(e.read() or b"{}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxy", default=str(ROOT / "target/debug/goodput-proxy"))
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "prometheus")
    ap.add_argument("--dashboard", default=str(ROOT / "config/grafana/goodput-proxy.json"))
    ap.add_argument("--rules", default=str(ROOT / "config/prometheus-rules.yml"))
    ap.add_argument("--light-seconds", type=float, default=3.0)
    ap.add_argument("--load-seconds", type=float, default=8.0)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) afterwards")
    ap.add_argument("--fleet", choices=["vllm", "mixed"], default="vllm",
                    help="vllm: V1 and v0 names; mixed: one replica per engine personality")
    args = ap.parse_args()

    dashboard = json.loads(Path(args.dashboard).read_text())
    queries = panel_queries(dashboard)
    variables = variable_queries(dashboard)
    tmp = Path(tempfile.mkdtemp(prefix="goodput-dash-"))
    procs = Procs(tmp)
    started = time.monotonic()
    try:
        sims = []
        if args.fleet == "mixed":
            extras = [["--personality", k] for k in MIXED]
            # per-request timings (the TTFT-split panels): vLLM's, and llama.cpp's `timings`
            extras[0].append("--enable-per-request-metrics")
        else:
            # per-request timings: the TTFT-split panels
            extras = [["--enable-per-request-metrics"],
                      ["--enable-per-request-metrics", "--legacy-metric-names"]]
        for i, extra in enumerate(extras):
            port = free_port()
            p = procs.start(f"sim{i}", [args.proxy, "sim", "--listen", f"127.0.0.1:{port}",
                                        "--model", MODEL, "--ttft-ms", "20", "--tpot-ms", "4",
                                        "--jitter", "lognormal", "--jitter-cv", "0.5",
                                        "--seed", str(i + 1), "--max-num-seqs", "2",
                                        "--fault", "0.05:status=503", *extra])
            sims.append((f"http://127.0.0.1:{port}", p))
        kinds = dict(zip((u for u, _ in sims), MIXED)) if args.fleet == "mixed" else {}
        for url, p in sims:
            wait_for(f"{url}/health", 10, f"sim {url}", p)
        listen, admin = free_port(), free_port()
        cfg = tmp / "proxy.toml"
        cfg.write_text(f"""
[server]
listen = "127.0.0.1:{listen}"
admin_listen = "127.0.0.1:{admin}"
drain_delay_ms = 0
grace_period_ms = 1000
[upstream]
urls = [{", ".join(json.dumps(u) for u, _ in sims)}]
health_interval_ms = 200
[engine]
scrape_interval_ms = 500
[engine.kinds]
# trtllm-serve's Prometheus page is on /prometheus/metrics: its kind is set, the rest detected.
{"".join(f'"{u}" = "trtllm"' + chr(10) for u, k in kinds.items() if k == "trtllm")}
[measure]
models = ["{MODEL}"]
[slo]
# Tight on purpose: some requests miss, so the SLO-miss panel has data.
ttft_ms = 30
tpot_ms = 8
[scale]
# The light load meets about three quarters of these SLOs, the heavy one fewer (requests wait
# for the simulators' 4 slots): with a target between the two the proxy usually sees its limit
# within the load, and the headroom and desired-replicas panels have data (not always on a
# loaded machine: MAY_BE_ABSENT).
target = 0.5
tick_ms = 100
load_window_ms = 500
min_requests = 10
""")
        proxy = procs.start("proxy", [args.proxy, "serve", "--config", str(cfg)])
        wait_for(f"http://127.0.0.1:{admin}/readyz", 15, "proxy", proxy)
        prom_port = free_port()
        (tmp / "prometheus.yml").write_text(f"""
global:
  scrape_interval: {SCRAPE_INTERVAL_S}s
  evaluation_interval: {SCRAPE_INTERVAL_S}s
rule_files: [{json.dumps(str(Path(args.rules).resolve()))}]
scrape_configs:
  - job_name: goodput-proxy
    static_configs: [{{targets: ["127.0.0.1:{admin}"]}}]
""")
        prom = procs.start("prometheus", [
            args.prometheus, f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn"])
        prom_url = f"http://127.0.0.1:{prom_port}"
        wait_for(f"{prom_url}/-/ready", 20, "prometheus", prom)
        # Light, then past the simulators' 4 slots: attainment against load on both sides of
        # the limit.
        sent = load(f"http://127.0.0.1:{listen}", args.light_seconds, 1)
        sent += load(f"http://127.0.0.1:{listen}", args.load_seconds, 8)
        # Evaluate at an instant inside the load, one rate interval after its start at least,
        # once Prometheus has scraped past it.
        at = time.time() - 1.0
        time.sleep(2 * SCRAPE_INTERVAL_S)

        upstreams = {u for u, _ in sims}
        served = upstreams_by_name(get(f"http://127.0.0.1:{admin}/metrics").decode())
        vars_ = {"model": ALL, "upstream": ALL, "__rate_interval": RATE_INTERVAL,
                 "datasource": "prometheus"}
        failures = []
        for name, label, expr in variables:
            problem = judge(prom_query(prom_url, expr, at), None)
            if problem:
                failures.append(f"variable ${name}: {problem}\n    {expr}")
        for q in queries:
            expr = substitute(q.expr, vars_)
            want = upstreams if "{{upstream}}" in q.legend else None
            if want and kinds:
                want = expected_upstreams(expr, served)
                missed = {u for u, k in kinds.items()
                          if k in MIXED_COVERAGE.get(q.panel, set())} - want
                if missed:
                    failures.append(f"panel {q.panel!r} {q.ref}: reads no family of "
                                    f"{sorted(kinds[u] for u in missed)}\n    {expr}")
            problem = judge(prom_query(prom_url, expr, at), want, expr)
            if problem:
                failures.append(f"panel {q.panel!r} {q.ref}: {problem}\n    {expr}")
        elapsed = time.monotonic() - started
        print(f"dashboard check ({args.fleet} fleet, {len(sims)} replicas): {len(queries)} "
              f"panel queries, {len(variables)} variables, {sent} requests of load, "
              f"{elapsed:.1f} s")
        if failures:
            print("\n".join(failures), file=sys.stderr)
            print(f"dashboard check FAILED ({len(failures)}); logs in {tmp}", file=sys.stderr)
            args.keep = True
            return 1
        return 0
    except RuntimeError as e:
        print(f"dashboard check: {e}; logs in {tmp}", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        procs.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
