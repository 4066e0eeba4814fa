#!/usr/bin/env bash
# The soak (criteria and latest results in docs/RELIABILITY.md):
# `goodput-loadtest soak` runs the real proxy binary in front of in-process simulators with a
# mixed fault share for a bounded time, then prints a machine-checked PASS/FAIL with figures
# (and OUT/soak.json). Exit 0 on PASS, 2 on FAIL, 1 when it could not run.
#
#   scripts/soak.sh                       # 30 minutes, 128 workers
#   scripts/soak.sh --duration 180s       # the CI version (3 minutes)
#   scripts/soak.sh --duration 30m --concurrency 64 --out /tmp/soak-30m
#
# Binaries: target/debug/goodput-{proxy,loadtest}, brought up to date by `cargo test --workspace
# --no-run` (the feature set of `cargo test --workspace`, so after it this is a no-op; a plain
# `cargo build` would resolve other features and rebuild dependencies). SOAK_BUILD=0 skips it.
# Everything listens on 127.0.0.1; the trap stops the proxy if the load generator dies.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${SOAK_BUILD:-1}" != 0 ]]; then
    cargo test --workspace --no-run -q >/dev/null
fi
bin=target/debug
out=soak-out
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --out) out="${args[$((i + 1))]:-$out}" ;;
        --out=*) out="${args[$i]#--out=}" ;;
    esac
done
mkdir -p "$out"
rm -f "$out/proxy.pid"

cleanup() {
    if [[ -n "${lt:-}" ]] && kill -0 "$lt" 2>/dev/null; then
        kill -TERM "$lt" 2>/dev/null || true
        wait "$lt" 2>/dev/null || true
    fi
    if [[ -f "$out/proxy.pid" ]]; then
        pid="$(cat "$out/proxy.pid")"
        # Only our child: a goodput-proxy process with that pid.
        if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == goodput-proxy ]]; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
}
trap cleanup EXIT INT TERM

"$bin/goodput-loadtest" soak --proxy-bin "$bin/goodput-proxy" "$@" &
lt=$!
rc=0
wait "$lt" || rc=$?
lt=
exit "$rc"
