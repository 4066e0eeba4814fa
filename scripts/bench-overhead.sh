#!/usr/bin/env bash
# Side-by-side benchmark, in one run: the same load sent straight to the simulated engine and
# through goodput-proxy, alternating (direct, proxy, direct, proxy, ...) so that machine noise
# hits both sides alike. Prints throughput and latency percentiles of each side and their ratio.
#
#   scripts/bench-overhead.sh                # defaults below
#   ROUNDS=3 DURATION=10 RATE=200 scripts/bench-overhead.sh
#
# Two workloads:
#   saturate  closed loop (CONC workers), zero-cost engine: how many requests/s and SSE events/s
#             each path carries when nothing else limits it (the proxy's CPU cost shows here).
#   paced     open-loop Poisson at RATE/s, engine with TTFT_MS / TPOT_MS: the latency the proxy
#             adds to TTFT, TPOT and E2E at a realistic pace (exact client-side percentiles).
# Everything binds 127.0.0.1, is bounded in time, and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-2}"
DURATION="${DURATION:-8}"
CONC="${CONC:-32}"
RATE="${RATE:-100}"
MAX_TOKENS="${MAX_TOKENS:-64}"
TTFT_MS="${TTFT_MS:-50}"
TPOT_MS="${TPOT_MS:-10}"
OUT="${OUT:-out/bench-overhead}"
BASE_PORT="${BASE_PORT:-18400}"

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

log "building release binaries"
cargo build --release --workspace --features goodput-proxy/jemalloc --quiet
BIN=target/release
rm -rf "$OUT"; mkdir -p "$OUT"

wait_up() { # URL
    for _ in $(seq 1 200); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.05; done
    echo "bench: $1 did not come up" >&2; return 1
}

start_pair() { # NAME SIM_PORT PROXY_PORT ADMIN_PORT SIM_ARGS...
    local name=$1 sp=$2 pp=$3 ap=$4; shift 4
    "$BIN/goodput-proxy" sim --listen "127.0.0.1:$sp" --max-num-seqs 4096 "$@" \
        >"$OUT/$name-sim.log" 2>&1 &
    pids+=($!)
    "$BIN/goodput-proxy" serve --listen "127.0.0.1:$pp" --admin-listen "127.0.0.1:$ap" \
        --upstream "http://127.0.0.1:$sp" >"$OUT/$name-proxy.log" 2>&1 &
    pids+=($!)
    wait_up "http://127.0.0.1:$sp/health"
    wait_up "http://127.0.0.1:$ap/readyz"
}

load() { # TARGET OUTDIR LOAD_ARGS...
    local target=$1 dir=$2; shift 2
    CI=true "$BIN/goodput-loadtest" run --target "$target" --out "$dir" --no-progress \
        --duration "$DURATION" --requests 100000000 --max-tokens "$MAX_TOKENS" --prompt-tokens 64 \
        --stream true --seed 7 --max-in-flight 4096 "$@" >"$dir.txt" 2>&1
}

p=$BASE_PORT
log "workload saturate: zero-cost engine, $CONC closed-loop clients, ${DURATION}s x $ROUNDS rounds per side"
start_pair saturate $p $((p + 1)) $((p + 2)) --ttft-ms 0 --tpot-ms 0 --prefill-ms-per-token 0 --tpot-ms-per-seq 0
for r in $(seq 1 "$ROUNDS"); do
    load "http://127.0.0.1:$p" "$OUT/saturate-direct-$r" --concurrency "$CONC"
    load "http://127.0.0.1:$((p + 1))" "$OUT/saturate-proxy-$r" --concurrency "$CONC"
done

p=$((BASE_PORT + 10))
log "workload paced: engine TTFT ${TTFT_MS} ms, TPOT ${TPOT_MS} ms, Poisson ${RATE}/s, ${DURATION}s x $ROUNDS rounds per side"
start_pair paced $p $((p + 1)) $((p + 2)) --ttft-ms "$TTFT_MS" --tpot-ms "$TPOT_MS" \
    --prefill-ms-per-token 0 --tpot-ms-per-seq 0
for r in $(seq 1 "$ROUNDS"); do
    load "http://127.0.0.1:$p" "$OUT/paced-direct-$r" --rate "$RATE"
    load "http://127.0.0.1:$((p + 1))" "$OUT/paced-proxy-$r" --rate "$RATE"
done

python3 scripts/lib/bench_table.py "$OUT" "$ROUNDS" | tee "$OUT/table.txt"
log "raw results: $OUT (summary.json and requests.jsonl per round)"
