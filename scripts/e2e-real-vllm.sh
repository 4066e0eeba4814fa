#!/usr/bin/env bash
# End-to-end check of goodput-proxy against a real vLLM engine (CPU build, tiny random-weight
# model; see docs/real-vllm.md and shared/real-vllm/README.md).
#
#   scripts/e2e-real-vllm.sh            # everything: install if needed, engine, proxy, load, checks
#
# Steps: install the engine if it is missing (shared/real-vllm/setup.sh); start it on
# 127.0.0.1:$E2E_ENGINE_PORT unless one already answers there; build the release binaries; check
# byte-exact passthrough through a recording relay; start the proxy with a JSONL record sink; run
# loadtest/scenarios/real-vllm.toml through it (with --proxy-admin, --engine-metrics,
# --proxy-records); hang up some streams; then check and print (scripts/lib/e2e_check.py).
# Exits non-zero when a check fails; stops everything it started (the engine only if it
# started it).
#
# Environment:
#   E2E_ENGINE_PORT   engine port (default 8011)
#   E2E_OUT           output directory (default target/e2e-real-vllm/<time>)
#   E2E_NO_BUILD=1    use the existing target/release binaries
#   E2E_KEEP_ENGINE=1 leave an engine this script started running
#   E2E_ENGINE_ARGS   vllm serve options for an engine it starts (default
#                     "--enable-per-request-metrics --enable-prompt-tokens-details")
#   E2E_PRIO=none     do not run the proxy and the client in the real-time class / at nice -10
#   REAL_VLLM_DIR     where setup.sh/serve.sh/stop.sh live (default: the first shared/real-vllm
#                     found beside or above the repository)
#   ENGINE_*          passed on to serve.sh (ENGINE_VENV, ENGINE_MODEL, ENGINE_LOG, ...)
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1 CI="${CI:-true}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
T_START=$(date +%s.%N)
LIB="$ROOT/scripts/lib"
PORT="${E2E_ENGINE_PORT:-8011}"
ENGINE="http://127.0.0.1:${PORT}"
MODEL="${ENGINE_NAME:-tiny}"
OUT="${E2E_OUT:-$ROOT/target/e2e-real-vllm/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

elapsed() { python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$1"; }
step() { echo "== [$(elapsed "$T_START") s] $*"; }

RV="${REAL_VLLM_DIR:-}"
if [[ -z "$RV" ]]; then
  for d in "$ROOT/shared/real-vllm" "$ROOT/../shared/real-vllm" "$ROOT/../../shared/real-vllm"; do
    [[ -f "$d/serve.sh" ]] && { RV="$(cd "$d" && pwd)"; break; }
  done
fi
[[ -n "$RV" && -f "$RV/serve.sh" ]] || { echo "e2e: shared/real-vllm not found; set REAL_VLLM_DIR" >&2; exit 2; }

STARTED_ENGINE=0
PROXY_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$PROXY_PID" ]] && kill -0 "$PROXY_PID" 2>/dev/null; then
    kill -TERM "$PROXY_PID" 2>/dev/null || true
    # the proxy drains (drain_delay_ms = 0 in our config): give it a moment, then make sure
    for _ in $(seq 1 50); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PROXY_PID" 2>/dev/null || true
  fi
  if [[ "$STARTED_ENGINE" == 1 && "${E2E_KEEP_ENGINE:-0}" != 1 ]]; then
    bash "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
    echo "== engine on port $PORT stopped"
  fi
  echo "== total time $(elapsed "$T_START") s (exit $rc); outputs in $OUT"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 0. the checker's own self-tests (pure parts, milliseconds) ----
python3 -m unittest discover -s "$LIB" -p 'test_*.py' 2>"$OUT/selftest.txt" \
  || { cat "$OUT/selftest.txt" >&2; echo "e2e: checker self-tests failed" >&2; exit 1; }
step "checker self-tests passed ($(grep -o 'Ran [0-9]* tests' "$OUT/selftest.txt"))"

# ---- 1. engine install ----
VENV="${ENGINE_VENV:-/opt/vllm-venv}"
MODEL_DIR="${ENGINE_MODEL:-/opt/vllm-tiny-model}"
if [[ -x "$VENV/bin/vllm" && -f "$MODEL_DIR/config.json" ]]; then
  step "engine installed ($VENV, $MODEL_DIR)"
else
  step "installing the engine (setup.sh: ~40 s, ~3.3 GB download, 6 GB disk)"
  bash "$RV/setup.sh"
fi

# ---- 2. engine start (in the background, while the build runs) ----
SERVE_PID=""
if curl -sf -m 2 -o /dev/null "$ENGINE/v1/models"; then
  step "engine already answers on $ENGINE: using it (not stopped at the end)"
else
  step "starting the engine on $ENGINE (serve.sh, ENGINE_WARMUP=1: ~60-180 s)"
  STARTED_ENGINE=1
  # The engine reports its own per-request timings and cached prompt tokens (where TTFT goes).
  # shellcheck disable=SC2086
  ENGINE_WARMUP="${ENGINE_WARMUP:-1}" bash "$RV/serve.sh" "$PORT" ${E2E_ENGINE_ARGS---enable-per-request-metrics --enable-prompt-tokens-details} \
    >"$OUT/serve.out" 2>"$OUT/serve.err" &
  SERVE_PID=$!
fi

# ---- 3. build ----
if [[ "${E2E_NO_BUILD:-0}" == 1 ]]; then
  step "build skipped (E2E_NO_BUILD=1)"
else
  step "cargo build --release --workspace"
  T_B=$(date +%s.%N)
  cargo build --release --workspace --features goodput-proxy/jemalloc --quiet
  step "build done in $(elapsed "$T_B") s"
fi
PROXY_BIN="$ROOT/target/release/goodput-proxy"
LOADTEST_BIN="$ROOT/target/release/goodput-loadtest"

if [[ -n "$SERVE_PID" ]]; then
  if ! wait "$SERVE_PID"; then
    cat "$OUT/serve.err" >&2
    echo "e2e: the engine did not start" >&2
    exit 1
  fi
  step "$(grep 'ready on' "$OUT/serve.err" || echo 'engine ready')"
fi
curl -sf -m 5 "$ENGINE/v1/models" | grep -q "\"id\":\"$MODEL\"" \
  || { echo "e2e: $ENGINE does not serve model $MODEL" >&2; exit 1; }
curl -sf -m 5 "$ENGINE/version" > "$OUT/engine-version.json" || true

# ---- 4. byte-exact passthrough (recording relay between proxy and engine) ----
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat > "$OUT/passthrough-off.toml" <<EOF
[measure]
usage_injection = "off"
EOF
cat > "$OUT/passthrough-auto.toml" <<EOF
[measure]
usage_injection = "auto"
EOF
step "passthrough, usage_injection = off: engine bytes vs client bytes"
mkdir -p "$OUT/passthrough-off" "$OUT/passthrough-auto"
set +e
python3 "$LIB/passthrough.py" "$ENGINE" "$PROXY_BIN" --model "$MODEL" \
  --config "$OUT/passthrough-off.toml" --save "$OUT/passthrough-off" | tee "$OUT/passthrough-off.txt"
step "passthrough, usage_injection = auto (the proxy adds include_usage and strips the usage chunk)"
python3 "$LIB/passthrough.py" "$ENGINE" "$PROXY_BIN" --model "$MODEL" \
  --config "$OUT/passthrough-auto.toml" --save "$OUT/passthrough-auto" | tee "$OUT/passthrough-auto.txt"
set -e

# ---- 5. the proxy under test ----
# The proxy and the load client measure; on a 2-core machine they share a core with vLLM's API
# server (and whatever else runs), and any scheduling stall between the client's clock and the
# proxy's shows up as a client-proxy difference (docs/real-vllm.md, "Timing noise"). Run both
# in the real-time class when allowed (root; they are event-driven and never spin), else at
# nice -10, so the comparison measures the proxy rather than the scheduler. E2E_PRIO=none: off.
PRIO=()
case "${E2E_PRIO:-auto}" in
  none) ;;
  *) if chrt -f 10 true 2>/dev/null; then PRIO=(chrt -f 10)
     elif [[ "$(nice -n -10 nice 2>/dev/null)" == "-10" ]]; then PRIO=(nice -n -10); fi ;;
esac
PRIO_NOTE=""
[[ ${#PRIO[@]} -gt 0 ]] && PRIO_NOTE=" (proxy and client under: ${PRIO[*]})"

LISTEN="127.0.0.1:$(free_port)"
ADMIN="127.0.0.1:$(free_port)"
cat > "$OUT/proxy.toml" <<EOF
[server]
listen = "$LISTEN"
admin_listen = "$ADMIN"
drain_delay_ms = 0
grace_period_ms = 2000

[upstream]
urls = ["$ENGINE"]

[measure]
usage_injection = "auto"
models = ["$MODEL"]
sink_path = "$OUT/records.jsonl"
EOF
step "starting the proxy on $LISTEN (admin $ADMIN) in front of $ENGINE, records to records.jsonl"
"${PRIO[@]}" "$PROXY_BIN" serve --config "$OUT/proxy.toml" >"$OUT/proxy.log" 2>&1 &
PROXY_PID=$!
for _ in $(seq 1 100); do
  curl -sf -m 1 -o /dev/null "http://$ADMIN/readyz" && break
  kill -0 "$PROXY_PID" 2>/dev/null || { cat "$OUT/proxy.log" >&2; echo "e2e: proxy exited" >&2; exit 1; }
  sleep 0.1
done
curl -sf -m 1 -o /dev/null "http://$ADMIN/readyz" || { echo "e2e: proxy not ready" >&2; exit 1; }

# ---- 6. load ----
curl -sf -m 5 "http://$ADMIN/metrics" > "$OUT/proxy-metrics-before.txt"
curl -sf -m 5 "$ENGINE/metrics" > "$OUT/engine-metrics-before.txt"
step "load: loadtest/scenarios/real-vllm.toml through the proxy$PRIO_NOTE"
"${PRIO[@]}" "$LOADTEST_BIN" run --target "http://$LISTEN" --scenario "$ROOT/loadtest/scenarios/real-vllm.toml" \
  --out "$OUT/lt" --proxy-admin "http://$ADMIN" --engine-metrics "$ENGINE/metrics" \
  --proxy-records "$OUT/records.jsonl" --no-progress > "$OUT/loadtest.txt" 2>&1 \
  || { cat "$OUT/loadtest.txt"; echo "e2e: the load run failed" >&2; exit 1; }
# the sink writes off the request path: wait until every client request has its record
python3 - "$OUT" <<'EOF'
import json, os, sys, time
d = sys.argv[1]
want = {json.loads(l)["request_id"] for l in open(os.path.join(d, "lt", "requests.jsonl")) if l.strip()}
deadline = time.time() + 10
while time.time() < deadline:
    try:
        have = {json.loads(l)["id"] for l in open(os.path.join(d, "records.jsonl")) if l.strip()}
    except (OSError, ValueError):
        have = set()
    if want <= have:
        break
    time.sleep(0.1)
EOF
curl -sf -m 5 "http://$ADMIN/metrics" > "$OUT/proxy-metrics-after.txt"
curl -sf -m 5 "$ENGINE/metrics" > "$OUT/engine-metrics-after.txt"
sed -n '/^client vs proxy vs engine/,$p' "$OUT/loadtest.txt"

# ---- 7. hang-ups ----
step "hang-ups: 4 streams through the proxy, closed after 6 events each"
python3 "$LIB/hangup.py" "http://$LISTEN" "http://$ADMIN" "$ENGINE" --n 4 --after 6 \
  --model "$MODEL" --out "$OUT/hangup.json"

# ---- 8. checks ----
step "checks"
set +e
python3 "$LIB/e2e_check.py" "$OUT" --model "$MODEL"
RC=$?
python3 "$LIB/ttft_split_check.py" "$OUT" "$LISTEN" --model "$MODEL" | tee "$OUT/ttft-split.txt"
(( ${PIPESTATUS[0]} == 0 )) || RC=1
set -e
exit "$RC"
