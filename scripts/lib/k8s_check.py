#!/usr/bin/env python3
"""Offline validation of config/kubernetes/: no cluster needed.

1. Every built-in resource against the Kubernetes JSON schemas, strictly
   (`kubernetes-validate` from PyPI: unknown fields are errors).
2. What the schemas cannot see, for each variant directory:
   - each goodput-proxy config (a ConfigMap's goodput-proxy.toml) passes
     `goodput-proxy check-config` (when --proxy is given);
   - probes: liveness /healthz and readiness /readyz on the container port whose number is the
     config's admin port;
   - drain timings: drain_delay_ms + grace_period_ms < terminationGracePeriodSeconds, and any
     engine container in the same pod sleeps in preStop at least that long (so it outlives the
     proxy's drain) and less than the grace period;
   - ServiceMonitor (a CRD): selects a Service of the directory and names one of its ports,
     which targets the admin port; ScaledObject (a CRD): targets a workload of the kit, with a
     prometheus trigger that has serverAddress, query and threshold;
   - HPA: targets a workload of the kit; custom/external metric names are ones the
     prometheus-adapter rules define.
Usage: k8s_check.py [--proxy target/debug/goodput-proxy] [DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.37.0"
CONFIG_KEY = "goodput-proxy.toml"


def load(dir_: Path) -> list[tuple[str, dict]]:
    docs = []
    for f in sorted(dir_.rglob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                docs.append((str(f.relative_to(dir_)), d))
    return docs


def is_builtin(doc: dict) -> bool:
    return doc.get("kind") not in ("ServiceMonitor", "ScaledObject")


def schema_errors(docs) -> list[str]:
    out = []
    for f, d in docs:
        if not is_builtin(d):
            continue
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            out.append(f"{f}: {d['kind']}/{d['metadata']['name']}: {e.message} at {list(e.path)}")
        except kubernetes_validate.SchemaNotFoundError as e:
            out.append(f"{f}: {e}")
    return out


def pod_templates(docs):
    for f, d in docs:
        if d.get("kind") in ("Deployment", "StatefulSet"):
            yield f, d, d["spec"]["template"]["spec"]


def proxy_configs(docs) -> dict[str, str]:
    """ConfigMap name -> its goodput-proxy.toml text."""
    return {d["metadata"]["name"]: d["data"][CONFIG_KEY]
            for _, d in docs if d.get("kind") == "ConfigMap" and CONFIG_KEY in d.get("data", {})}


def check_config(proxy: str, name: str, text: str) -> list[str]:
    """`goodput-proxy check-config` on one config: the proxy's own validation."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as t:
        t.write(text)
        t.flush()
        r = subprocess.run([proxy, "check-config", t.name], capture_output=True, text=True)
    if r.returncode != 0:
        return [f"ConfigMap/{name}: goodput-proxy check-config: {r.stderr.strip()}"]
    return []


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def check_variant(docs, proxy_bin: str | None):
    """Errors and the workloads (kind, name) of one variant directory."""
    errors = []
    configs = proxy_configs(docs)
    services = [d for _, d in docs if d.get("kind") == "Service"]
    workloads = {(d["kind"], d["metadata"]["name"]) for _, d in docs
                 if d.get("kind") in ("Deployment", "StatefulSet")}
    admin_port_names = set()
    for f, d, pod in pod_templates(docs):
        where = f"{f}: {d['kind']}/{d['metadata']['name']}"
        proxies = [c for c in pod["containers"] if c["name"] == "goodput-proxy"]
        if not proxies:
            continue
        proxy = proxies[0]
        cm = next((v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v), None)
        if cm not in configs:
            errors.append(f"{where}: no ConfigMap {cm!r} with {CONFIG_KEY} in this directory")
            continue
        cfg = tomllib.loads(configs[cm])
        server = cfg.get("server", {})
        drain_ms = server.get("drain_delay_ms", 5000) + server.get("grace_period_ms", 30000)
        grace_s = pod.get("terminationGracePeriodSeconds", 30)
        if drain_ms >= grace_s * 1000:
            errors.append(f"{where}: drain_delay_ms + grace_period_ms = {drain_ms} ms is not below "
                          f"terminationGracePeriodSeconds = {grace_s} s")
        for c in pod["containers"]:
            if c is proxy:
                continue
            sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
            if sleep is None or not (drain_ms <= sleep * 1000 < grace_s * 1000):
                errors.append(f"{where}: container {c['name']} must sleep in preStop at least "
                              f"{drain_ms / 1000:g} s (the proxy's drain) and under {grace_s} s; has {sleep}")
        admin = port_of(server.get("admin_listen", "127.0.0.1:9090"))
        by_name = {p["name"]: p["containerPort"] for p in proxy.get("ports", [])}
        admin_names = {n for n, p in by_name.items() if p == admin}
        admin_port_names |= admin_names
        if not admin_names:
            errors.append(f"{where}: no container port is the admin port {admin}")
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = proxy.get(probe, {}).get("httpGet", {})
            port = get.get("port")
            if get.get("path") != path or not (port in admin_names or port == admin):
                errors.append(f"{where}: {probe} must GET {path} on the admin port {admin}; has {get}")
    for f, d in docs:
        kind, name = d.get("kind"), d["metadata"]["name"]
        where = f"{f}: {kind}/{name}"
        if kind == "ServiceMonitor":
            sel = d["spec"]["selector"]["matchLabels"]
            matched = [s for s in services
                       if sel.items() <= s["metadata"].get("labels", {}).items()]
            if not matched:
                errors.append(f"{where}: selects no Service of this directory")
            for ep in d["spec"]["endpoints"]:
                ports = [p for s in matched for p in s["spec"]["ports"] if p.get("name") == ep.get("port")]
                if not ports:
                    errors.append(f"{where}: endpoint port {ep.get('port')!r} is no port of the selected Service")
                elif not all(p.get("targetPort") in admin_port_names for p in ports):
                    errors.append(f"{where}: port {ep.get('port')!r} does not target the proxy's admin port")
                if ep.get("path", "/metrics") != "/metrics":
                    errors.append(f"{where}: path must be /metrics")
    for name, text in configs.items():
        if proxy_bin:
            errors += check_config(proxy_bin, name, text)
    return errors, workloads


def check_autoscaling(docs, workloads) -> list[str]:
    errors = []
    adapter = [yaml.safe_load(d["data"]["config.yaml"]) for _, d in docs
               if d.get("kind") == "ConfigMap" and "config.yaml" in d.get("data", {})]
    custom = {r["name"]["as"] for a in adapter for r in a.get("rules", [])}
    external = {r["name"]["as"] for a in adapter for r in a.get("externalRules", [])}
    for f, d in docs:
        kind, name = d.get("kind"), d["metadata"]["name"]
        where = f"{f}: {kind}/{name}"
        if kind == "HorizontalPodAutoscaler":
            ref = d["spec"]["scaleTargetRef"]
            if (ref["kind"], ref["name"]) not in workloads:
                errors.append(f"{where}: targets {ref['kind']}/{ref['name']}, not a workload of the kit")
            for m in d["spec"]["metrics"]:
                if m["type"] == "Pods" and m["pods"]["metric"]["name"] not in custom:
                    errors.append(f"{where}: pods metric {m['pods']['metric']['name']} has no adapter rule")
                if m["type"] == "External" and m["external"]["metric"]["name"] not in external:
                    errors.append(f"{where}: external metric {m['external']['metric']['name']} has no adapter rule")
        if kind == "ScaledObject":
            ref = d["spec"]["scaleTargetRef"]
            if (ref.get("kind", "Deployment"), ref["name"]) not in workloads:
                errors.append(f"{where}: targets {ref.get('kind')}/{ref['name']}, not a workload of the kit")
            for t in d["spec"]["triggers"]:
                md = t.get("metadata", {})
                if t.get("type") != "prometheus" or not all(md.get(k) for k in ("serverAddress", "query", "threshold")):
                    errors.append(f"{where}: trigger needs type prometheus with serverAddress, query, threshold")
                elif "goodput_proxy" not in md["query"]:
                    errors.append(f"{where}: the query does not read a goodput_proxy signal")
                try:
                    float(md.get("threshold", "x"))
                except ValueError:
                    errors.append(f"{where}: threshold must be a number in a string")
    return errors


def check(dir_: Path, proxy: str | None) -> list[str]:
    docs = load(dir_)
    errors = schema_errors(docs)
    workloads = set()
    for variant in sorted({f.split("/")[0] for f, _ in docs if "/" in f} - {"autoscaling"}):
        vdocs = [(f, d) for f, d in docs if f.startswith(variant + "/")]
        e, w = check_variant(vdocs, proxy)
        errors += e
        workloads |= w
    errors += check_autoscaling(docs, workloads)
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=str(ROOT / "config/kubernetes"))
    ap.add_argument("--proxy", help="goodput-proxy binary: also run check-config on each config")
    args = ap.parse_args()
    docs = load(Path(args.dir))
    errors = check(Path(args.dir), args.proxy)
    kinds = sorted({d["kind"] for _, d in docs})
    if errors:
        print("\n".join(errors), file=sys.stderr)
        print(f"kubernetes check FAILED ({len(errors)})", file=sys.stderr)
        return 1
    print(f"kubernetes check: {len(docs)} resources ({', '.join(kinds)}) valid against "
          f"Kubernetes {K8S_VERSION} schemas (strict) and consistent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
