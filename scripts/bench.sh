#!/usr/bin/env bash
# The forwarding benchmark, in one run: the same requests sent alternately straight to the
# zero-cost simulator (direct), through nginx (one worker, proxy_buffering off: plain
# forwarding), through goodput-proxy with metering on and with `[measure] enabled = false`, and
# through LiteLLM (1 worker, prometheus callback) when it can be installed.
#
#   scripts/bench.sh                       # everything; out/bench/{bench.md,bench.json,raw.jsonl}
#   PARTS="wrk" CONNS=64 scripts/bench.sh  # the first slice: throughput at 64 connections
#
# Parts (PARTS, default all):
#   wrk    wrk -c CONNS (1 64 512), streaming (64 tokens) and JSON, SECS each, ROUNDS rounds with
#          the paths alternating inside each round: requests/s, SSE events/s, wrk's p50/p99, and
#          the forwarder's CPU (utime+stime from /proc/PID/stat) per request and per SSE event
#   paced  `goodput-loadtest bench paced`: PACED (64 512) closed-loop streams whose tokens the
#          simulator paces (x-sim-fault: stall-every=10, so a stream lasts ~0.3 s): client TTFT
#          p50/p99, exact; added = through a path minus direct, same run
#   held   `goodput-loadtest bench burst` of STREAMS streams held open ~HOLD_S s each: the
#          forwarder's RSS before, at the peak (per open stream) and 2 s after they ended
#   burst  STREAMS zero-cost streams started at once on new connections: errors counted
# Env: SECS=2 ROUNDS=2 CONNS="1 64 512" PACED="64 512" STREAMS=10000 HOLD_S=8 OUT=out/bench
#      (the defaults fit a clean checkout, build included, in 10 minutes on 2 cores; SECS=4
#      HOLD_S=12 for steadier figures)
#      LITELLM=auto|off (auto: use `import litellm` from python3 or LITELLM_VENV, else try
#      `pip install 'litellm[proxy]' prometheus_client` once into LITELLM_VENV=/tmp/goodput-bench-litellm)
#      PROXY_BIN=path (skip the build and bench that binary) BASE_PORT=18500
#      ACCESS_LOG=false (true: the proxies write an access line per request; nginx never does)
#      ONLY="proxy-on proxy-off" (these paths besides direct) PROXY_PRELOAD=lib.so (LD_PRELOAD of
#      the proxies only: another malloc under the same binary, e.g. libmimalloc.so.2)
# Installs wrk and nginx (Debian) when missing. Loopback only, bounded in time, stops everything
# it started (trap). Needs a machine otherwise idle for figures worth comparing; the load
# average before and after is recorded with the results.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${SECS:-2}"
ROUNDS="${ROUNDS:-2}"
CONNS="${CONNS:-1 64 512}"
PACED="${PACED:-64 512}"
STREAMS="${STREAMS:-10000}"
HOLD_S="${HOLD_S:-8}"
OUT="${OUT:-out/bench}"
PARTS="${PARTS:-wrk paced held burst}"
LITELLM="${LITELLM:-auto}"
LITELLM_VENV="${LITELLM_VENV:-/tmp/goodput-bench-litellm}"
BASE="${BASE_PORT:-18500}"
# OUT relative to the repository or absolute: every path below is made from the absolute one.
[[ $OUT == /* ]] || OUT="$PWD/$OUT"
W="$OUT/work"
rm -rf "$OUT"; mkdir -p "$W"
RAW="$OUT/raw.jsonl"; : >"$RAW"
log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
t_start=$(date +%s)

# --- tools ---------------------------------------------------------------------------------
if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
    log "installing wrk and nginx (apt-get)"
    (apt-get install -y -qq wrk nginx || (apt-get update -qq && apt-get install -y -qq wrk nginx)) \
        </dev/null >"$W/apt.log" 2>&1
fi

# --- processes ------------------------------------------------------------------------------
pids=()
NGINX_CONF="$W/nginx.conf"
cleanup() {
    [[ -f $W/nginx.pid ]] && nginx -c "$NGINX_CONF" -s stop 2>/dev/null || true
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Every process started below inherits the fd limit raised to the hard limit.
NOFILE=$(ulimit -Hn); [[ $NOFILE == unlimited ]] && NOFILE=1048576
ulimit -n "$NOFILE"
SIM=$((BASE + 1)); NGX=$BASE; PON=$((BASE + 2)); POFF=$((BASE + 4)); LLM=$((BASE + 6))
# The build goes first, in the background: LiteLLM's one-time install and its start (a minute)
# happen meanwhile.
build_pid=""
if [[ -z "${PROXY_BIN:-}" ]]; then
    # The `bench-build` profile (Cargo.toml): release optimisation, built in a fraction of
    # `--release`'s time (more codegen units, no debug info), so that a clean checkout fits.
    log "cargo build --profile bench-build (goodput-proxy, goodput-loadtest), in the background"
    b0=$(date +%s)
    cargo build --profile bench-build -q -p goodput-proxy -p goodput-loadtest --features goodput-proxy/jemalloc >"$W/build.log" 2>&1 &
    build_pid=$!; pids+=("$build_pid")
fi
litellm_py=""; litellm_note="off (LITELLM=off)"
if [[ $LITELLM != off ]]; then
    for py in python3 "$LITELLM_VENV/bin/python"; do
        if [[ -x $(command -v "$py" 2>/dev/null) ]] && "$py" -c 'import litellm' 2>/dev/null; then litellm_py=$py; break; fi
    done
    if [[ -z $litellm_py && ! -e $LITELLM_VENV/.tried ]]; then
        log "trying pip install 'litellm[proxy]' prometheus_client into $LITELLM_VENV (once)"
        mkdir -p "$LITELLM_VENV"; touch "$LITELLM_VENV/.tried"
        if timeout 600 bash -c "python3 -m venv '$LITELLM_VENV' && '$LITELLM_VENV/bin/pip' install -q 'litellm[proxy]' prometheus_client" \
            </dev/null >"$W/pip.log" 2>&1 && "$LITELLM_VENV/bin/python" -c 'import litellm' 2>/dev/null; then
            litellm_py="$LITELLM_VENV/bin/python"
        fi
    fi
    if [[ -n $litellm_py ]]; then
        litellm_note="$("$litellm_py" -c 'import importlib.metadata as m; print("litellm " + m.version("litellm"))' 2>/dev/null || echo litellm)"
    else
        litellm_note="skipped: litellm is not importable and pip install failed or was tried before (rm -r $LITELLM_VENV to try again)"
    fi
fi
log "LiteLLM: $litellm_note"
# LiteLLM takes a minute to start: it does so while the build runs.
LLM_PID=0
if [[ -n $litellm_py ]]; then
    cat >"$W/litellm.yaml" <<EOF
model_list:
  - model_name: tiny
    litellm_params: { model: openai/tiny, api_base: "http://127.0.0.1:$SIM/v1", api_key: none }
litellm_settings:
  callbacks: ["prometheus"]
general_settings:
  # Loopback only; goodput-proxy and nginx run without auth here too.
  dangerously_permit_weak_or_unset_master_key: true
EOF
    LITELLM_LOCAL_MODEL_COST_MAP=True "$litellm_py" -m litellm.proxy.proxy_cli --config "$W/litellm.yaml" \
        --host 127.0.0.1 --port "$LLM" --num_workers 1 >"$W/litellm.log" 2>&1 & pids+=($!); LLM_PID=$!
fi
build_s=0
if [[ -n $build_pid ]]; then
    log "waiting for the build"
    wait "$build_pid" || { tail -n 30 "$W/build.log" >&2; log "the build failed ($W/build.log)"; exit 1; }
    build_pid=""
    build_s=$(( $(date +%s) - b0 ))
fi
PROXY_BIN="${PROXY_BIN:-target/bench-build/goodput-proxy}"
LT="${LOADTEST_BIN:-target/bench-build/goodput-loadtest}"

"$PROXY_BIN" sim --listen "127.0.0.1:$SIM" --ttft-ms 0 --tpot-ms 0 --prefill-ms-per-token 0 \
    --tpot-ms-per-seq 0 --max-num-seqs 65536 >"$W/sim.log" 2>&1 & pids+=($!); SIM_PID=$!
sed -e "s#@W@#$W#g" -e "s#@NOFILE@#$NOFILE#g" -e "s#@SIM@#$SIM#g" -e "s#@PORT@#$NGX#g" \
    scripts/bench/nginx.conf >"$NGINX_CONF"
nginx -c "$NGINX_CONF"
# nginx runs with `access_log off`; the proxies too (`[log] access = false`), so that both do
# the same work per request (ACCESS_LOG=true: the proxies write their access line).
proxy() { # PORT ADMIN METERING
    GOODPUT_PROXY_SERVER_LISTEN=127.0.0.1:$1 GOODPUT_PROXY_SERVER_ADMIN_LISTEN=127.0.0.1:$2 \
    GOODPUT_PROXY_LOG_ACCESS="${ACCESS_LOG:-false}" GOODPUT_PROXY_MEASURE_ENABLED=$3 GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT=100000 GOODPUT_PROXY_LIMITS_MAX_CONNECTIONS=$NOFILE \
    GOODPUT_PROXY_UPSTREAM_URLS=http://127.0.0.1:$SIM LD_PRELOAD="${PROXY_PRELOAD:-}" \
        "$PROXY_BIN" serve >"$W/proxy-$3.log" 2>&1 &
    pids+=($!)
}
proxy "$PON" $((PON + 1)) true; PON_PID=$!
proxy "$POFF" $((POFF + 1)) false; POFF_PID=$!
wait_up() { # PORT TRIES
    for _ in $(seq 1 "$2"); do
        curl -fsS -o /dev/null -m 2 -H 'content-type: application/json' \
            -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2}' \
            "http://127.0.0.1:$1/v1/chat/completions" 2>/dev/null && return 0
        sleep 0.2
    done
    return 1
}
for p in $SIM $NGX $PON $POFF; do wait_up "$p" 100 || { log "port $p did not come up"; exit 1; }; done
NGX_PID=$(cat "$W/nginx.pid"); NGX_PID=$(pgrep -P "$NGX_PID" | head -1)
paths="direct:$SIM:0 nginx:$NGX:$NGX_PID proxy-on:$PON:$PON_PID proxy-off:$POFF:$POFF_PID"
if [[ $LLM_PID != 0 ]]; then
    if wait_up "$LLM" 450; then paths+=" litellm:$LLM:$LLM_PID"
    else litellm_note="skipped: started but did not answer within 90 s (see $W/litellm.log)"; log "$litellm_note"; fi
fi

if [[ -n ${ONLY:-} ]]; then
    kept=""; for side in $paths; do [[ ${side%%:*} == direct || " $ONLY " == *" ${side%%:*} "* ]] && kept+=" $side"; done
    paths=${kept# }
fi

tree() { echo "$1"; for c in $(pgrep -P "$1"); do tree "$c"; done; }
cpu() { # PID -> utime+stime ticks of the process and its children (LiteLLM's workers)
    [[ $1 == 0 ]] && { echo 0; return; }
    local t=0 p
    for p in $(tree "$1"); do t=$((t + $(awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
    echo "$t"
}
rss() { # PID -> VmRSS kB, summed over the process tree
    [[ $1 == 0 ]] && { echo 0; return; }
    local t=0 p
    for p in $(tree "$1"); do t=$((t + $(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0))); done
    echo "$t"
}
events=$(curl -sN -H 'content-type: application/json' -d '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":64,"ignore_eos":true,"stream":true}' \
    "http://127.0.0.1:$SIM/v1/chat/completions" | grep -c '^data:')
emit() { printf '%s\n' "$1" >>"$RAW"; }
meta() { # PHASE
    emit "{\"part\":\"meta\",\"phase\":\"$1\",\"loadavg\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"t\":$(date +%s)}"
}
meta start
log "paths: $paths; $events SSE events a stream; fd limit $NOFILE"

# --- wrk: throughput and CPU ----------------------------------------------------------------
if has wrk; then
    for mode in stream json; do
        for c in $CONNS; do
            for r in $(seq 1 "$ROUNDS"); do
                for side in $paths; do
                    IFS=: read -r name port pid <<<"$side"
                    # LiteLLM serves tens of requests/s: one round, at most 64 connections.
                    [[ $name == litellm ]] && { [[ $r -gt 1 || $c -gt 64 ]] && continue; }
                    threads=2; [[ $c -lt 2 ]] && threads=1
                    dur=$SECS; [[ $name == litellm ]] && dur=$((2 * SECS > 8 ? 2 * SECS : 8))
                    c0=$(cpu "$pid")
                    out=$(BENCH_STREAM=$([[ $mode == stream ]] && echo 1 || echo 0) timeout $((dur + 30)) \
                        wrk -t$threads -c"$c" -d"${dur}s" --timeout 10s -s scripts/bench/wrk.lua \
                        "http://127.0.0.1:$port/v1/chat/completions" 2>&1 || true)
                    c1=$(cpu "$pid")
                    res=$(sed -n 's/^BENCH //p' <<<"$out"); [[ -z $res ]] && res=null
                    emit "{\"part\":\"wrk\",\"path\":\"$name\",\"mode\":\"$mode\",\"conns\":$c,\"round\":$r,\"cpu_ticks\":$((c1 - c0)),\"rss_kb\":$(rss "$pid"),\"wrk\":$res}"
                    log "wrk $mode c=$c round $r $name: $(awk '/Requests\/sec/ {print $2}' <<<"$out") req/s"
                done
            done
        done
    done
    meta wrk
fi

# --- paced streams: client TTFT -------------------------------------------------------------
if has paced; then
    for n in $PACED; do
        for r in $(seq 1 "$ROUNDS"); do
            for side in $paths; do
                IFS=: read -r name port pid <<<"$side"
                [[ $name == litellm ]] && { [[ $r -gt 1 || $n -gt 64 ]] && continue; }
                c0=$(cpu "$pid")
                res=$(timeout 60 "$LT" bench paced --target "http://127.0.0.1:$port" --streams "$n" \
                    --warmup 1 --duration "$((SECS > 3 ? 3 : SECS))" --max-tokens 32 \
                    --header 'x-sim-fault: stall-every=10' 2>>"$W/loadtest.log" || echo null)
                c1=$(cpu "$pid")
                emit "{\"part\":\"paced\",\"path\":\"$name\",\"streams\":$n,\"round\":$r,\"cpu_ticks\":$((c1 - c0)),\"bench\":$res}"
                log "paced $n round $r $name done"
            done
        done
    done
    meta paced
fi

# --- held streams: RSS per open stream and after --------------------------------------------
# A forwarder holds two sockets a stream (client and upstream): the fd limit caps the streams.
held=$STREAMS
if (( 2 * held + 200 > NOFILE )); then
    held=$(( (NOFILE - 200) / 2 ))
    log "held streams: $held, not $STREAMS: a forwarder needs 2 fds a stream and the hard fd limit is $NOFILE"
fi
if has held; then
    stall=$(( HOLD_S * 1000 / 7 ))
    for side in $paths; do
        IFS=: read -r name port pid <<<"$side"
        [[ $name == direct || $name == litellm ]] && continue
        before=$(rss "$pid")
        timeout $((HOLD_S + 120)) "$LT" bench burst --target "http://127.0.0.1:$port" --streams "$held" \
            --max-tokens 8 --timeout $((HOLD_S + 90)) --header "x-sim-fault: stall-every=$stall" \
            >"$W/held-$name.json" 2>>"$W/loadtest.log" &
        client=$!; peak=$before
        while kill -0 "$client" 2>/dev/null; do
            now=$(rss "$pid"); (( now > peak )) && peak=$now; sleep 0.1
        done
        wait "$client" || true
        sleep 2
        after=$(rss "$pid")
        res=$(cat "$W/held-$name.json"); [[ -z $res ]] && res=null
        emit "{\"part\":\"held\",\"path\":\"$name\",\"streams\":$held,\"rss_before_kb\":$before,\"rss_peak_kb\":$peak,\"rss_after_kb\":$after,\"bench\":$res}"
        log "held $held streams $name: RSS $before -> $peak -> $after kB"
    done
    meta held
fi

# --- burst: new streams at once, errors counted ---------------------------------------------
if has burst; then
    for side in $paths; do
        IFS=: read -r name port pid <<<"$side"
        [[ $name == litellm ]] && continue
        res=$(timeout 180 "$LT" bench burst --target "http://127.0.0.1:$port" --streams "$STREAMS" \
            --max-tokens 64 --timeout 120 2>>"$W/loadtest.log" || echo null)
        emit "{\"part\":\"burst\",\"path\":\"$name\",\"streams\":$STREAMS,\"bench\":$res}"
        log "burst $STREAMS $name: $(grep -o '"errors":[0-9]*' <<<"$res" | head -1)"
    done
    meta burst
fi

meta end
emit "{\"part\":\"run\",\"git\":\"$(git rev-parse --short HEAD 2>/dev/null)\",\"date\":\"$(date -u +%FT%TZ)\",\"nproc\":$(nproc),\"kernel\":\"$(uname -r)\",\"clk_tck\":$(getconf CLK_TCK),\"events_per_stream\":$events,\"nofile\":$NOFILE,\"secs\":$SECS,\"rounds\":$ROUNDS,\"build_s\":$build_s,\"total_s\":$(( $(date +%s) - t_start )),\"nginx\":\"$(nginx -v 2>&1 | sed 's/.*: //')\",\"wrk\":\"$(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)\",\"litellm\":\"$litellm_note\",\"proxy_preload\":\"${PROXY_PRELOAD:-}\",\"access_log\":\"${ACCESS_LOG:-false}\",\"held\":$held}"
python3 scripts/bench/report.py "$RAW" "$OUT"
log "wrote $OUT/bench.md, $OUT/bench.json, $RAW"
