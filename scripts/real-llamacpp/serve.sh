#!/usr/bin/env bash
# Starts llama-server (installed by setup.sh) on 127.0.0.1:PORT with its /metrics on, waits
# until /health answers 200, prints its PID. Usage: serve.sh PORT [extra llama-server args]
# Environment: LLAMACPP_DIR (default /opt/llamacpp), LLAMACPP_MODEL (default the tiny model),
# LLAMACPP_SLOTS (parallel slots, default 2), LLAMACPP_THREADS (default 1),
# LLAMACPP_LOG (default $LLAMACPP_DIR/server-PORT.log), LLAMACPP_NO_METRICS=1 (start it
# without --metrics: its /metrics then answers 501).
set -euo pipefail
PORT="${1:?usage: serve.sh PORT [llama-server args]}"
shift
DIR="${LLAMACPP_DIR:-/opt/llamacpp}"
MODEL="${LLAMACPP_MODEL:-$DIR/tiny.gguf}"
LOG="${LLAMACPP_LOG:-$DIR/server-$PORT.log}"
[[ -x "$DIR/bin/llama-server" ]] || { echo "serve.sh: run setup.sh first" >&2; exit 2; }
METRICS=(--metrics)
[[ "${LLAMACPP_NO_METRICS:-0}" == 1 ]] && METRICS=()
setsid "$DIR/bin/llama-server" -m "$MODEL" --alias tiny --host 127.0.0.1 --port "$PORT" \
  "${METRICS[@]}" --no-webui -np "${LLAMACPP_SLOTS:-2}" -c 4096 -t "${LLAMACPP_THREADS:-1}" "$@" \
  >"$LOG" 2>&1 < /dev/null &
PID=$!
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    echo "$PID"
    exit 0
  fi
  kill -0 "$PID" 2>/dev/null || { tail -20 "$LOG" >&2; exit 1; }
  sleep 0.1
done
echo "serve.sh: llama-server on $PORT not healthy after 30 s" >&2
kill "$PID" 2>/dev/null || true
exit 1
