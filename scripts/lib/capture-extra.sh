#!/usr/bin/env bash
# Capture the real vLLM responses that shared/real-vllm/capture.sh does not record (same file
# format: `### ` lines, then the raw response head and body, byte for byte), so the simulator
# can be held to them. Usage: capture-extra.sh BASE_URL OUTDIR   (BASE_URL e.g. http://127.0.0.1:8011)
set -euo pipefail
B="${1:?usage: capture-extra.sh BASE_URL OUTDIR}"
OUT="${2:?usage: capture-extra.sh BASE_URL OUTDIR}"
MODEL="${ENGINE_NAME:-tiny}"
mkdir -p "$OUT"

source "$(dirname "${BASH_SOURCE[0]}")/capture-post.sh"
msg='"messages":[{"role":"user","content":"Hello"}]'

# n=2 without include_usage: which finish chunks carry system_fingerprint?
post stream-chat-n2-nousage.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},\"stream\":true,\"max_tokens\":4,\"n\":2,\"seed\":1}"
# completions stream without usage, and with n=2 + usage
post stream-completions-nousage.txt /v1/completions \
  "{\"model\":\"${MODEL}\",\"prompt\":\"The quick brown fox\",\"stream\":true,\"max_tokens\":6,\"seed\":1}"
post stream-completions-n2-usage.txt /v1/completions \
  "{\"model\":\"${MODEL}\",\"prompt\":\"The quick brown fox\",\"stream\":true,\"max_tokens\":3,\"n\":2,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
# completions + continuous usage
post stream-completions-usage-continuous.txt /v1/completions \
  "{\"model\":\"${MODEL}\",\"prompt\":\"The quick brown fox\",\"stream\":true,\"max_tokens\":3,\"seed\":1,\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}}"
# stream_options without include_usage (empty, or continuous only): vLLM 0.32 sends no usage at all
post stream-chat-continuous-only.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},\"stream\":true,\"max_tokens\":3,\"seed\":1,\"stream_options\":{\"continuous_usage_stats\":true}}"
post stream-chat-stream-options-empty.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},\"stream\":true,\"max_tokens\":3,\"seed\":1,\"stream_options\":{}}"
# chat: one token only, with usage
post stream-chat-max1-usage.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},\"stream\":true,\"max_tokens\":1,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
# non-streaming bodies
post nonstream-completions.txt /v1/completions \
  "{\"model\":\"${MODEL}\",\"prompt\":\"The quick brown fox\",\"max_tokens\":6,\"seed\":1}"
post nonstream-chat-n2.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},\"max_tokens\":4,\"n\":2,\"seed\":1}"
post nonstream-chat-logprobs.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},\"max_tokens\":2,\"seed\":1,\"logprobs\":true,\"top_logprobs\":1}"
# error bodies a proxy passes through (and the simulator should answer alike)
post error-invalid-json.txt /v1/chat/completions '{"model":"tiny","messages":['
post error-missing-messages.txt /v1/chat/completions "{\"model\":\"${MODEL}\",\"stream\":true}"
post error-missing-prompt.txt /v1/completions "{\"model\":\"${MODEL}\",\"stream\":true}"
post error-bad-type.txt /v1/chat/completions "{\"model\":\"${MODEL}\",${msg},\"max_tokens\":\"ten\"}"
post error-stream-options-nonstream.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},\"max_tokens\":2,\"stream_options\":{\"include_usage\":true}}"
post error-unknown-model-completions.txt /v1/completions \
  "{\"model\":\"no-such-model\",\"prompt\":\"Hi\",\"stream\":true}"
post error-empty-body.txt /v1/chat/completions ''

# get NAME METHOD PATH: appends to OUT/NAME
get() {
  { echo "### $2 $3"; curl -sS -D - -X "$2" "${B}$3"; echo; } >> "${OUT}/$1"
}
: > "${OUT}/get-extra.txt"
get get-extra.txt GET /v1/chat/completions
get get-extra.txt GET /v1/no-such-path
get get-extra.txt GET /ping
echo "wrote ${OUT}/get-extra.txt"
