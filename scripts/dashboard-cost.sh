#!/usr/bin/env bash
# What the live page costs the proxy: bytes and proxy CPU per refresh of /dashboard.json.
# Starts a proxy (demo mode: its built-in simulated engine) from BIN on loopback ports, fills
# its record ring with a bounded load (goodput-loadtest, RATE requests/s for DURATION s), then
# asks /dashboard.json?window=60 N times in a row and reads the proxy's CPU time
# (/proc/PID/stat) before and after; the same N asks of /healthz give the HTTP baseline.
#
#   scripts/dashboard-cost.sh [BIN] [LOADTEST]   (default target/release/goodput-proxy,
#                                                 target/debug/goodput-loadtest)
# Environment: RATE (default 100), DURATION (default 60), N (default 200); IMAGE=TAG runs the
# proxy from that image (podman, scripts/image.sh) instead of BIN: a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/goodput-proxy}"
LOADTEST="${2:-target/debug/goodput-loadtest}"
RATE="${RATE:-100}"
DURATION="${DURATION:-60}"
N="${N:-200}"
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api="$(port)"
admin="$(port)"
out="$(mktemp -d)"
if [[ -n "${IMAGE:-}" ]]; then
    name="gp-dashboard-cost-$$"
    n="$(ulimit -Hn)"; [[ "$n" == unlimited || "$n" -gt 65536 ]] && n=65536
    podman --runtime runc run -d --name "$name" --ulimit "nofile=$n:$n" --ulimit nproc=4096:4096 \
        -e GOODPUT_PROXY_LOG_ACCESS=false -p "127.0.0.1:$api:8080" -p "127.0.0.1:$admin:9090" \
        "$IMAGE" >/dev/null 2>"$out/podman.log"
    pid="$(podman --runtime runc inspect --format '{{.State.Pid}}' "$name")"
    BIN="$IMAGE (container)"
    trap 'podman --runtime runc rm -f -t 2 "$name" >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
else
    GOODPUT_PROXY_SERVER_LISTEN="127.0.0.1:$api" GOODPUT_PROXY_SERVER_ADMIN_LISTEN="127.0.0.1:$admin" \
        GOODPUT_PROXY_LOG_ACCESS=false "$BIN" serve >"$out/proxy.log" 2>&1 &
    pid=$!
    trap 'kill "$pid" 2>/dev/null || true; rm -rf "$out"' EXIT
fi
for _ in $(seq 1 100); do
    curl -fs --max-time 1 "http://127.0.0.1:$admin/readyz" >/dev/null && break
    sleep 0.1
done
"$LOADTEST" run --target "http://127.0.0.1:$api" --rate "$RATE" --duration "$DURATION" \
    --max-tokens 16 --stream --out "$out/load" >"$out/load.log" 2>&1
# CPU ticks (user + system) of the proxy process.
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
hz="$(getconf CLK_TCK)"
measure() {
    local path="$1" before after bytes
    before="$(ticks)"
    for _ in $(seq 1 "$N"); do
        bytes="$(curl -fs --max-time 10 "http://127.0.0.1:$admin$path" | wc -c)"
    done
    after="$(ticks)"
    echo "$path: $bytes bytes, $(python3 -c "print(f'{($after - $before) / $hz / $N * 1e3:.2f}')") ms proxy CPU per request (over $N requests)"
}
echo "proxy $BIN, ring filled by $RATE req/s x $DURATION s ($(grep -c . "$out/load/requests.jsonl") requests)"
measure "/dashboard.json?window=60"
measure "/dashboard.json?window=600"
measure "/healthz"
echo "page (once, then 304): $(curl -fs "http://127.0.0.1:$admin/" | wc -c) bytes"
