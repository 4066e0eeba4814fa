#!/usr/bin/env bash
# Records raw responses (headers and body, byte for byte; our `### ` lines on top) of a running
# llama-server (serve.sh). Usage: capture.sh PORT [OUTDIR]
# Default OUTDIR: tests/engine_fixtures/llamacpp-<commit> of this repository.
set -euo pipefail
PORT="${1:?usage: capture.sh PORT [OUTDIR]}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${2:-$ROOT/tests/engine_fixtures/llamacpp-0c1e570}"
B="http://127.0.0.1:${PORT}"
mkdir -p "$OUT"
post() {
  local name="$1" path="$2" body="$3"
  {
    echo "### POST ${path}"
    echo "### request body: ${body}"
    echo "### ---- raw response (headers then body, unmodified) ----"
    curl -sS -N -D - -H 'Content-Type: application/json' -d "$body" "${B}${path}"
  } > "${OUT}/${name}"
  echo "wrote ${OUT}/${name}"
}
M='"model":"tiny","messages":[{"role":"user","content":"Hello there"}]'
post stream-chat.txt /v1/chat/completions "{${M},\"stream\":true,\"max_tokens\":5,\"seed\":1}"
post stream-chat-usage.txt /v1/chat/completions \
  "{${M},\"stream\":true,\"max_tokens\":5,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
# return_progress: prompt_progress chunks (role deltas, content null) before the first token
post stream-chat-progress-usage.txt /v1/chat/completions \
  "{${M},\"stream\":true,\"max_tokens\":5,\"seed\":1,\"return_progress\":true,\"stream_options\":{\"include_usage\":true}}"
post stream-completions-usage.txt /v1/completions \
  "{\"model\":\"tiny\",\"prompt\":\"Hello there\",\"stream\":true,\"max_tokens\":4,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
post nonstream-chat.txt /v1/chat/completions "{${M},\"max_tokens\":4,\"seed\":1}"
{
  echo "### GET /metrics"
  curl -sS -D - -H 'Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1' "${B}/metrics"
} > "${OUT}/metrics.txt"
echo "wrote ${OUT}/metrics.txt"
