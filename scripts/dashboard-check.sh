#!/usr/bin/env bash
# The Grafana dashboard against a real Prometheus, plus the Prometheus rules' unit tests
# (docs/dashboard.md), on vLLM replicas and on a fleet mixing engines (docs/engines.md).
# Needs Debian's `prometheus` package (promtool comes with it): .ci/run installs it when
# missing. Reuses an already built proxy binary (PROXY_BIN, default
# target/debug/goodput-proxy, which `cargo test` builds); builds it only when absent.
set -euo pipefail
cd "$(dirname "$0")/.."
PROXY_BIN="${PROXY_BIN:-target/debug/goodput-proxy}"
for tool in prometheus promtool; do
    command -v "$tool" >/dev/null 2>&1 || { echo "dashboard-check: $tool not found (apt-get install prometheus)" >&2; exit 1; }
done
[[ -x "$PROXY_BIN" ]] || cargo build --bin goodput-proxy
promtool check rules config/prometheus-rules.yml
promtool test rules config/prometheus-rules.test.yml
# vLLM replicas (V1 and v0 names), then a fleet mixing the five engine personalities.
python3 scripts/lib/dashboard_check.py --proxy "$PROXY_BIN" --fleet vllm "$@"
python3 scripts/lib/dashboard_check.py --proxy "$PROXY_BIN" --fleet mixed "$@"
