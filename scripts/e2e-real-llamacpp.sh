#!/usr/bin/env bash
# End-to-end check of goodput-proxy in front of a real llama.cpp server (`llama-server`, built
# by scripts/real-llamacpp/setup.sh from the llama.cpp source PyPI's llama-cpp-python vendors;
# a random-weight GGUF model written locally). Opt-in: not part of .ci/run.
#
#   scripts/e2e-real-llamacpp.sh
#
# Steps: install if needed; start llama-server with one slot (so requests queue) and --metrics;
# build the proxy (debug) unless E2E_NO_BUILD=1; start it with a JSONL record sink and a 200 ms
# scrape; then scripts/lib/e2e_llamacpp_check.py: concurrent streams through the proxy while the
# admin /metrics is polled (engine kind detected as llamacpp, the canonical queue/running gauges
# equal to llama.cpp's own requests_deferred/processing on the same page), then the meter on
# llama.cpp's streams (records: success, TTFT after the prompt-progress chunks, exact tokens)
# and what the client received compared with the engine's own answer. Then llama-server again
# without --metrics and a fresh proxy: the kind told from its `Server` header, its streams left
# as the client wrote them. Stops what it started.
#
# Environment: E2E_ENGINE_PORT (default 8093), E2E_PROXY_PORT and E2E_ADMIN_PORT (default: free
# ports), E2E_OUT (default target/e2e-real-llamacpp/<time>), E2E_NO_BUILD=1, LLAMACPP_DIR
# (default /opt/llamacpp).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PORT="${E2E_ENGINE_PORT:-8093}"
DIR="${LLAMACPP_DIR:-/opt/llamacpp}"
OUT="${E2E_OUT:-$ROOT/target/e2e-real-llamacpp/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
RL="$ROOT/scripts/real-llamacpp"
step() { echo "== $*"; }

PROXY_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$PROXY_PID" ]] && kill -0 "$PROXY_PID" 2>/dev/null; then
    kill -TERM "$PROXY_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PROXY_PID" 2>/dev/null || true
  fi
  bash "$RL/stop.sh" "$PORT" >/dev/null 2>&1 || true
  exit "$rc"
}
trap cleanup EXIT INT TERM

step "install (idempotent)"
bash "$RL/setup.sh" >/dev/null
# A larger random model than the capture one, so that decoding takes milliseconds per token
# and requests visibly queue behind the single slot.
if [[ ! -f "$DIR/slow.gguf" ]]; then
  "$DIR/venv/bin/python" "$RL/make_tiny_gguf.py" "$DIR/slow.gguf" --embd 512 --layers 8 \
    --heads 8 --kv-heads 8 --ff 2048
fi
step "llama-server on 127.0.0.1:$PORT (1 slot, --metrics)"
LLAMACPP_MODEL="$DIR/slow.gguf" LLAMACPP_SLOTS=1 LLAMACPP_LOG="$OUT/llama-server.log" \
  bash "$RL/serve.sh" "$PORT" >/dev/null

if [[ "${E2E_NO_BUILD:-0}" != 1 ]]; then
  step "building the proxy"
  cargo build --bin goodput-proxy >"$OUT/build.log" 2>&1
fi
PROXY_BIN="$ROOT/target/debug/goodput-proxy"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
LISTEN="127.0.0.1:${E2E_PROXY_PORT:-$(free_port)}"
ADMIN="127.0.0.1:${E2E_ADMIN_PORT:-$(free_port)}"
ENGINE="http://127.0.0.1:$PORT"
proxy_config() { # RECORDS
cat <<TOML
[server]
listen = "$LISTEN"
admin_listen = "$ADMIN"
drain_delay_ms = 0
grace_period_ms = 2000

[upstream]
urls = ["$ENGINE"]

[measure]
usage_injection = "auto"
models = ["tiny"]
sink_path = "$1"

[engine]
scrape_interval_ms = 200
TOML
}
start_proxy() { # NAME
  proxy_config "$OUT/$1-records.jsonl" > "$OUT/$1-proxy.toml"
  "$PROXY_BIN" serve --config "$OUT/$1-proxy.toml" >"$OUT/$1-proxy.log" 2>&1 &
  PROXY_PID=$!
  for _ in $(seq 1 100); do
    curl -sf -m 1 -o /dev/null "http://$ADMIN/readyz" && return 0
    kill -0 "$PROXY_PID" 2>/dev/null || { cat "$OUT/$1-proxy.log" >&2; exit 1; }
    sleep 0.1
  done
}
stop_proxy() {
  kill -TERM "$PROXY_PID" 2>/dev/null || true
  wait "$PROXY_PID" 2>/dev/null || true
  PROXY_PID=""
}
step "proxy on $LISTEN (admin $ADMIN)"
start_proxy metrics
step "checks"
rc=0
python3 "$ROOT/scripts/lib/e2e_llamacpp_check.py" --proxy "http://$LISTEN" --admin "http://$ADMIN" \
  --engine "$ENGINE" --records "$OUT/metrics-records.jsonl" --out "$OUT" || rc=1

step "llama-server without --metrics, a fresh proxy"
stop_proxy
bash "$RL/stop.sh" "$PORT"
LLAMACPP_MODEL="$DIR/slow.gguf" LLAMACPP_SLOTS=1 LLAMACPP_NO_METRICS=1 \
  LLAMACPP_LOG="$OUT/llama-server-no-metrics.log" bash "$RL/serve.sh" "$PORT" >/dev/null
start_proxy no-metrics
python3 "$ROOT/scripts/lib/e2e_llamacpp_check.py" --proxy "http://$LISTEN" --admin "http://$ADMIN" \
  --engine "$ENGINE" --records "$OUT/no-metrics-records.jsonl" --out "$OUT" --phase no-metrics \
  || rc=1
exit "$rc"
