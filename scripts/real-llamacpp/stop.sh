#!/usr/bin/env bash
# Stops the llama-server listening on 127.0.0.1:PORT (SIGTERM, then SIGKILL after 5 s).
# Usage: stop.sh PORT
set -euo pipefail
PORT="${1:?usage: stop.sh PORT}"
PIDS=$(pgrep -f "llama-server .*--port $PORT( |$)" || true)
[[ -z "$PIDS" ]] && exit 0
kill -TERM $PIDS 2>/dev/null || true
for _ in $(seq 1 50); do
  kill -0 $PIDS 2>/dev/null || exit 0
  sleep 0.1
done
kill -KILL $PIDS 2>/dev/null || true
