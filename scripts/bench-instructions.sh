#!/usr/bin/env bash
# CPU instructions and allocator calls per request inside the proxy process, counted by
# valgrind's callgrind: exact counts that do not depend on how busy the machine is (CPU time
# from /proc, scripts/bench-side-by-side.sh, does). The zero-cost simulator runs natively as the
# upstream; each proxy binary runs under callgrind. Per binary and body kind: wrk warms the
# connection for 2 s, the counters are zeroed, wrk runs SECS seconds (2 connections), the
# counters are dumped: instructions / requests, malloc+calloc+realloc+posix_memalign / requests.
# `net_of_idle` takes off what the process does in SECS seconds without requests (measured
# first, once per binary): the figure to compare between runs on a busy machine.
# Streaming (64 tokens, usage injected and stripped) and non-streaming, metering on (MEASURE=false:
# off). KINDS picks the requests (default "stream json"); agent traffic: `tool` (a
# streamed tool call: tools + named tool_choice + x-sim-fault tool-call=valid), `logprobs`
# (64-token stream, logprobs top 2), `traced` (the same with x-goodput-trace: 1) and `cusage`
# (64-token stream with continuous usage: usage on every chunk).
# SIM_TPOT_MS (default 0): the simulator's time per output token. At 0 a stream's 66 events
# reach the proxy in one or two reads (plain forwarding passes them on as one or two frames);
# at 1 or more each event comes on its own, as from an engine streaming token by token.
# Each dump is kept as OUT/KIND.BIN.PID.cg (OUT=/tmp/goodput-instructions; callgrind_annotate FILE).
#   scripts/bench-instructions.sh [BIN...]     # default: target/bench-build/goodput-proxy
#   KINDS="stream tool logprobs traced" SECS=6 scripts/bench-instructions.sh OLD NEW
#   scripts/bench-instructions.sh nginx BIN    # `nginx`: Debian's nginx as scripts/bench.sh runs it
# The proxy's own config comes from GOODPUT_PROXY_* in the environment (e.g.
# GOODPUT_PROXY_LOG_ACCESS=false, as nginx's access_log off).
# Needs valgrind and wrk (Debian: apt-get install valgrind wrk). Loopback ports BASE_PORT..+2 (18510-18512),
# bounded (about 40 s per binary), stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${SECS:-8}"
# Several engineers may run this at once on one machine: OUT and BASE_PORT keep runs apart.
W="${OUT:-/tmp/goodput-instructions}"; rm -rf "$W"; mkdir -p "$W"
SIM=${BASE_PORT:-18510}; PORT=$((SIM + 1)); ADMIN=$((SIM + 2))
bins=("$@"); [[ ${#bins[@]} -gt 0 ]] || { cargo build --profile bench-build -q -p goodput-proxy --features jemalloc; bins=(target/bench-build/goodput-proxy); }
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
sim_bin=$(printf '%s\n' "${bins[@]}" | grep -vx nginx | head -1)
[[ -n $sim_bin ]] || sim_bin=target/bench-build/goodput-proxy
"$sim_bin" sim --listen "127.0.0.1:$SIM" --ttft-ms 0 --tpot-ms "${SIM_TPOT_MS:-0}" --prefill-ms-per-token 0 \
    --tpot-ms-per-seq 0 --max-num-seqs 4096 >"$W/sim.log" 2>&1 & pids+=($!)
ready() { for _ in $(seq 1 300); do curl -fsS -o /dev/null "127.0.0.1:$1/v1/models" 2>/dev/null && return; sleep 0.2; done; echo "port $1 not ready" >&2; exit 1; }
ready "$SIM"
# Sums the allocator calls of one callgrind dump (the calls= lines under a `cfn=` of an allocator).
allocs() {
    python3 - "$1" <<'EOF'
import re, sys
names, cur, total = {}, None, 0
alloc = {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign"}
alloc |= {"_rjem_" + a for a in alloc | {"mallocx", "rallocx"}}  # jemalloc (the shipped binary's, --features jemalloc)
for line in open(sys.argv[1], errors="replace"):
    # Names uncompressed (--compress-strings=no): `fn=NAME` / `cfn=NAME`.
    m = re.match(r"(c?)fn=(.*)", line)
    if m:
        cur = m.group(2).strip() if m.group(1) else None
        continue
    if line.startswith("calls=") and cur is not None:
        if cur.split("'")[0] in alloc:
            total += int(line.split()[0][6:])
        cur = None
print(total)
EOF
}
for bin in "${bins[@]}"; do
    if [[ $bin == nginx ]]; then
        # The plain-forwarding reference, as scripts/bench.sh runs it (one worker,
        # proxy_buffering off, access_log off), in one process so callgrind sees all of it.
        sed -e "s#@NOFILE@#1024#g" -e "s#@W@#$W#g" -e "s#@SIM@#$SIM#g" -e "s#@PORT@#$PORT#g" \
            -e "s#^worker_processes 1;#worker_processes 1; master_process off; daemon off;#" \
            scripts/bench/nginx.conf >"$W/nginx.conf"
        command -v nginx >/dev/null || { echo "nginx: apt-get install nginx" >&2; exit 1; }
        valgrind --tool=callgrind --compress-strings=no --callgrind-out-file="$W/cg.%p" \
            nginx -c "$W/nginx.conf" >"$W/nginx.log" 2>&1 & pid=$!
    else
        GOODPUT_PROXY_SERVER_LISTEN="127.0.0.1:$PORT" GOODPUT_PROXY_SERVER_ADMIN_LISTEN="127.0.0.1:$ADMIN" \
        GOODPUT_PROXY_UPSTREAM_URLS="http://127.0.0.1:$SIM" GOODPUT_PROXY_MEASURE_ENABLED="${MEASURE:-true}" \
            valgrind --tool=callgrind --compress-strings=no --callgrind-out-file="$W/cg.%p" "$bin" serve >"$W/proxy.log" 2>&1 & pid=$!
    fi
    pids+=($pid)
    ready "$PORT"
    # What the process does with no request in SECS seconds (engine scraper, timers): taken
    # off each kind's count, so that the per-request figure does not grow when a loaded
    # machine serves fewer requests in the same time.
    callgrind_control -z "$pid" >/dev/null
    sleep "$SECS"
    rm -f "$W"/cg."$pid".*
    callgrind_control -d "$pid" >/dev/null
    sleep 1
    idle=$(awk '/^(summary|totals):/ {print $2; exit}' "$(ls -t "$W"/cg."$pid".* | head -1)")
    for kind in ${KINDS:-stream json}; do
        stream=1; [[ $kind == json ]] && stream=0
        shape=$kind; [[ $kind == stream || $kind == json ]] && shape=""
        export BENCH_STREAM=$stream BENCH_SHAPE=$shape
        wrk -t1 -c2 -d2s -s scripts/bench/wrk.lua "http://127.0.0.1:$PORT/v1/chat/completions" >/dev/null
        callgrind_control -z "$pid" >/dev/null
        out=$(wrk -t1 -c2 -d"${SECS}s" -s scripts/bench/wrk.lua "http://127.0.0.1:$PORT/v1/chat/completions")
        rm -f "$W"/cg."$pid".*
        callgrind_control -d "$pid" >/dev/null
        sleep 1
        dump=$(ls -t "$W"/cg."$pid".* | head -1)
        n=$(awk '/requests in/ {print $1}' <<<"$out")
        ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
        a=$(allocs "$dump")
        cp "$dump" "$W/$kind.$(basename "$bin").$pid.cg"  # for callgrind_annotate
        printf '%-28s %-8s requests=%-6s instructions_per_req=%-9s net_of_idle=%-9s allocs_per_req=%s %s\n' "$bin" "$kind" "$n" \
            "$((ir / n))" "$(((ir - idle) / n))" "$(awk -v a="$a" -v n="$n" 'BEGIN { printf "%.1f", a / n }')" \
            "$(grep -E 'Non-2xx|Socket errors' <<<"$out" | tr '\n' ' ')"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
done
