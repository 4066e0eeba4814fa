#!/usr/bin/env bash
# Side by side in one run, alternating per round: wrk straight to the zero-cost simulator, through
# nginx (one worker, proxy_buffering off: plain forwarding, nothing measured), through
# goodput-proxy with metering on, and with `[measure] enabled = false`. Streaming (66 SSE events
# a request) and non-streaming. Prints requests/s, wrk's p50/p99 and each forwarder's CPU per
# request from /proc/PID/stat (utime+stime). Installs nginx-light and wrk (Debian) when missing.
# Loopback only (ports 18500-18505), bounded, stops what it started.
#   scripts/bench-side-by-side.sh            # CONNS=64 SECONDS=8 ROUNDS=2
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS="${CONNS:-64}"; SECS="${SECONDS_PER_SIDE:-8}"; ROUNDS="${ROUNDS:-2}"
W=/tmp/goodput-bench; rm -rf "$W"; mkdir -p "$W"
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
    (apt-get install -y -qq nginx-light wrk || (apt-get update -qq && apt-get install -y -qq nginx-light wrk)) </dev/null >"$W/apt.log" 2>&1
fi
cargo build --release -q
B=target/release/goodput-proxy
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; nginx -c "$PWD/scripts/bench/nginx.conf" -s stop 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
$B sim --listen 127.0.0.1:18501 --ttft-ms 0 --tpot-ms 0 --prefill-ms-per-token 0 --tpot-ms-per-seq 0 --max-num-seqs 4096 >"$W/sim.log" 2>&1 & pids+=($!)
nginx -c "$PWD/scripts/bench/nginx.conf"
proxy() { # LISTEN ADMIN ENABLED
    GOODPUT_PROXY_SERVER_LISTEN=$1 GOODPUT_PROXY_SERVER_ADMIN_LISTEN=$2 GOODPUT_PROXY_MEASURE_ENABLED=$3 \
    GOODPUT_PROXY_UPSTREAM_URLS=http://127.0.0.1:18501 $B serve >"$W/proxy-$3.log" 2>&1 & pids+=($!)
}
proxy 127.0.0.1:18502 127.0.0.1:18503 true; PON=$!
proxy 127.0.0.1:18504 127.0.0.1:18505 false; POFF=$!
for p in 18501 18500 18502 18504; do
    for _ in $(seq 1 100); do curl -fsS -o /dev/null "127.0.0.1:$p/v1/models" 2>/dev/null && break; sleep 0.1; done
done
NGX=$(pgrep -f "nginx: worker" | head -1)
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
run() { # LUA
    for r in $(seq 1 "$ROUNDS"); do
        for side in direct:18501:0 nginx:18500:$NGX proxy-on:18502:$PON proxy-off:18504:$POFF; do
            IFS=: read -r name port pid <<<"$side"
            c0=0; [[ $pid != 0 ]] && c0=$(cpu "$pid")
            out=$(wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s "scripts/bench/$1" "http://127.0.0.1:$port/v1/chat/completions" 2>&1)
            c1=0; [[ $pid != 0 ]] && c1=$(cpu "$pid")
            n=$(awk '/requests in/ {print $1}' <<<"$out")
            printf '%-6s round=%s %-9s rps=%-9s p50=%-8s p99=%-8s cpu_us_per_req=%s %s\n' "${1%.lua}" "$r" "$name" \
                "$(awk '/Requests\/sec/ {print $2}' <<<"$out")" "$(awk '$1=="50%" {print $2}' <<<"$out")" \
                "$(awk '$1=="99%" {print $2}' <<<"$out")" \
                "$(awk -v c=$((c1 - c0)) -v n="$n" 'BEGIN { if (n > 0) printf "%.1f", c * 10000 / n; else print "-" }')" \
                "$(grep -E 'Non-2xx|Socket errors' <<<"$out" | tr '\n' ' ')"
        done
    done
}
run stream.lua
run json.lua
