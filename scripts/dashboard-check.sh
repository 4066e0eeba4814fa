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
# vLLM replicas (V1 and v0 names) and a fleet mixing the five engine personalities, side by
# side: each takes its own free ports and temporary directory, and mostly waits on scrapes
# (about 14 s each), so together they take the time of one. Each one's output is shown whole,
# after both end.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
fleets=(vllm mixed)
pids=()
for fleet in "${fleets[@]}"; do
    python3 scripts/lib/dashboard_check.py --proxy "$PROXY_BIN" --fleet "$fleet" "$@" \
        >"$logs/$fleet.log" 2>&1 &
    pids+=("$!")
done
rc=0
for i in "${!fleets[@]}"; do
    fleet_rc=0
    wait "${pids[$i]}" || fleet_rc=$?
    cat "$logs/${fleets[$i]}.log"
    if [[ $fleet_rc != 0 ]]; then
        echo "dashboard-check: the ${fleets[$i]} fleet failed (exit $fleet_rc)" >&2
        rc=$fleet_rc
    fi
done
exit "$rc"
