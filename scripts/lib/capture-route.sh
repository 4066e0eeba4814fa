#!/usr/bin/env bash
# Capture what routing depends on from a real vLLM 0.32 (same file format as capture-extra.sh:
# `### ` lines, then the raw response head and body, byte for byte): the admission rejection of
# `--max-num-queued-reqs` (stream, JSON, completions), `cached_tokens` with
# `--enable-prompt-tokens-details` (the same long system prompt sent twice), and /metrics after
# them (prefix-cache counters in tokens, admission_rejections_total).
# The engine must run with `--max-num-queued-reqs 1 --max-num-seqs 1 --enable-prompt-tokens-details`.
# Usage: capture-route.sh BASE_URL OUTDIR   (BASE_URL e.g. http://127.0.0.1:8011)
set -euo pipefail
B="${1:?usage: capture-route.sh BASE_URL OUTDIR}"
OUT="${2:?usage: capture-route.sh BASE_URL OUTDIR}"
MODEL="${ENGINE_NAME:-tiny}"
mkdir -p "$OUT"

source "$(dirname "${BASH_SOURCE[0]}")/capture-post.sh"

# One long stream holds the engine's only admission slot while the next requests arrive.
hold() {
  curl -sS -N -o /dev/null -H 'Content-Type: application/json' \
    -d "{\"model\":\"${MODEL}\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"stream\":true,\"max_tokens\":1800,\"ignore_eos\":true}" \
    "${B}/v1/chat/completions" &
  HOLD=$!
  sleep 0.5
}
hold
post stream-chat-admission-rejected.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"stream\":true,\"max_tokens\":8,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
post nonstream-chat-admission-rejected.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":8,\"seed\":1}"
post stream-completions-admission-rejected.txt /v1/completions \
  "{\"model\":\"${MODEL}\",\"prompt\":\"The quick brown fox\",\"stream\":true,\"max_tokens\":8,\"seed\":1}"
wait "$HOLD"

# A system prompt of several 128-token blocks, then a short question: the second request finds
# the prefix cached (cached_tokens is block-aligned and below the prompt length).
sys=$(printf 'You are a careful assistant for the payments team; answer with the policy section number, then one sentence. %.0s' $(seq 1 12))
chat() { echo "{\"model\":\"${MODEL}\",\"messages\":[{\"role\":\"system\",\"content\":\"${sys}\"},{\"role\":\"user\",\"content\":\"$1\"}],$2}"; }
post stream-chat-prompt-details-cold.txt /v1/chat/completions \
  "$(chat 'Which section covers refunds?' '"stream":true,"max_tokens":4,"seed":1,"stream_options":{"include_usage":true}')"
post stream-chat-prompt-details-cached.txt /v1/chat/completions \
  "$(chat 'Which section covers chargebacks?' '"stream":true,"max_tokens":4,"seed":1,"stream_options":{"include_usage":true}')"
post nonstream-chat-prompt-details-cached.txt /v1/chat/completions \
  "$(chat 'Which section covers disputes?' '"max_tokens":4,"seed":1')"
post stream-chat-prompt-details-continuous.txt /v1/chat/completions \
  "$(chat 'Which section covers fees?' '"stream":true,"max_tokens":2,"seed":1,"stream_options":{"include_usage":true,"continuous_usage_stats":true}')"
post stream-completions-prompt-details.txt /v1/completions \
  "{\"model\":\"${MODEL}\",\"prompt\":\"${sys}\",\"stream\":true,\"max_tokens\":2,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
post nonstream-completions-prompt-details.txt /v1/completions \
  "{\"model\":\"${MODEL}\",\"prompt\":\"${sys}\",\"max_tokens\":2,\"seed\":1}"
post stream-chat-prompt-details-nousage.txt /v1/chat/completions \
  "$(chat 'Which section covers fees?' '"stream":true,"max_tokens":2,"seed":1')"
{ echo "### GET /metrics (after the requests above)"; curl -sS -D - "${B}/metrics"; } > "${OUT}/metrics-prefix-cache.txt"
echo "wrote ${OUT}/metrics-prefix-cache.txt"

# The in-band form: requests that pass the API server's preflight check together and then race
# for the last slot; the loser's stream is already started (200) and carries the error event.
body="{\"model\":\"${MODEL}\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"stream\":true,\"max_tokens\":8,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
race=$(mktemp -d)
for round in $(seq 1 10); do
  for i in 1 2 3 4; do
    curl -sS -N -D - -H 'Content-Type: application/json' --data-binary "$body" \
      "${B}/v1/chat/completions" > "$race/$i" &
  done
  wait
  hit=$(grep -l '^HTTP/1.1 200' "$race"/* | xargs -r grep -l '^data: {"error"' | head -n 1 || true)
  if [[ -n "$hit" ]]; then
    { echo "### POST /v1/chat/completions
### note: 4 at once at an idle engine; the one rejected in-band"
      echo "### request body: ${body}"
      echo "### ---- raw response (headers then body, unmodified) ----"
      cat "$hit"; } > "${OUT}/stream-chat-admission-rejected-inband.txt"
    echo "wrote ${OUT}/stream-chat-admission-rejected-inband.txt (round $round)"
    break
  fi
done
rm -rf "$race"
