#!/usr/bin/env bash
# Capture what vLLM 0.32's stream options do to the bytes (same file format as capture-extra.sh:
# `### ` lines, then the raw response head and body, byte for byte). Start the engine with the
# options first, then: capture-options.sh SET BASE_URL OUTDIR, where SET names the options the
# engine was started with and prefixes every file:
#   metrics   --enable-per-request-metrics --enable-prompt-tokens-details
#   interval4 --stream-interval 4
#   force     --enable-force-include-usage
#   keepalive --sse-keep-alive-interval 1 --max-num-seqs 1 (a long request holds the one slot,
#             so the captured stream waits in the queue and keep-alive comments go out)
#   all       every option above at once (keep-alive capture included)
set -euo pipefail
SET="${1:?usage: capture-options.sh SET BASE_URL OUTDIR}"
B="${2:?usage: capture-options.sh SET BASE_URL OUTDIR}"
OUT="${3:?usage: capture-options.sh SET BASE_URL OUTDIR}"
MODEL="${ENGINE_NAME:-tiny}"
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/capture-post.sh"
msg='"messages":[{"role":"user","content":"Hello"}]'
chat() { echo "{\"model\":\"${MODEL}\",${msg},$1}"; }
cmpl() { echo "{\"model\":\"${MODEL}\",\"prompt\":\"The quick brown fox\",$1}"; }

common() {
  local p="$1"
  post "$p-stream-chat.txt" /v1/chat/completions "$(chat '"stream":true,"max_tokens":10,"seed":1')"
  post "$p-stream-chat-usage.txt" /v1/chat/completions \
    "$(chat '"stream":true,"max_tokens":10,"seed":1,"stream_options":{"include_usage":true}')"
  post "$p-stream-chat-options-empty.txt" /v1/chat/completions \
    "$(chat '"stream":true,"max_tokens":10,"seed":1,"stream_options":{}')"
  post "$p-stream-chat-usage-continuous.txt" /v1/chat/completions \
    "$(chat '"stream":true,"max_tokens":10,"seed":1,"stream_options":{"include_usage":true,"continuous_usage_stats":true}')"
  post "$p-stream-chat-logprobs-usage.txt" /v1/chat/completions \
    "$(chat '"stream":true,"max_tokens":10,"seed":1,"logprobs":true,"top_logprobs":1,"stream_options":{"include_usage":true}')"
  post "$p-stream-chat-n2-usage.txt" /v1/chat/completions \
    "$(chat '"stream":true,"max_tokens":5,"n":2,"seed":1,"stream_options":{"include_usage":true}')"
  post "$p-stream-chat-max1.txt" /v1/chat/completions "$(chat '"stream":true,"max_tokens":1,"seed":1')"
  post "$p-stream-completions.txt" /v1/completions "$(cmpl '"stream":true,"max_tokens":10,"seed":1')"
  post "$p-stream-completions-usage.txt" /v1/completions \
    "$(cmpl '"stream":true,"max_tokens":10,"seed":1,"stream_options":{"include_usage":true}')"
  post "$p-stream-completions-logprobs.txt" /v1/completions \
    "$(cmpl '"stream":true,"max_tokens":10,"seed":1,"logprobs":1')"
  post "$p-nonstream-chat.txt" /v1/chat/completions "$(chat '"max_tokens":10,"seed":1')"
  post "$p-nonstream-chat-n2.txt" /v1/chat/completions "$(chat '"max_tokens":5,"n":2,"seed":1')"
  post "$p-nonstream-completions.txt" /v1/completions "$(cmpl '"max_tokens":10,"seed":1')"
}

# A prompt of about 700 tokens sent twice: the second answer shows the cached prefix.
long_prefix() {
  local p="$1" words
  words=$(python3 -c 'print(" ".join(f"word{i} alpha beta" for i in range(240)))')
  local body
  body="{\"model\":\"${MODEL}\",\"messages\":[{\"role\":\"user\",\"content\":\"${words}\"}],\"stream\":true,\"max_tokens\":4,\"seed\":1,\"stream_options\":{\"include_usage\":true}}"
  post "$p-stream-chat-prefix-first.txt" /v1/chat/completions "$body"
  post "$p-stream-chat-prefix-again.txt" /v1/chat/completions "$body"
  body="{\"model\":\"${MODEL}\",\"messages\":[{\"role\":\"user\",\"content\":\"${words}\"}],\"max_tokens\":4,\"seed\":1}"
  post "$p-nonstream-chat-prefix-again.txt" /v1/chat/completions "$body"
}

# The one decode slot is held by a long request while the captured stream waits for it.
queued_stream() {
  local p="$1" name="$2" extra="$3"
  curl -sS -o /dev/null -H 'Content-Type: application/json' \
    --data-binary "$(chat '"max_tokens":1900,"ignore_eos":true,"seed":2')" "${B}/v1/chat/completions" &
  local blocker=$!
  sleep 0.3
  post "$p-$name" /v1/chat/completions "$(chat "\"stream\":true,\"max_tokens\":10,\"seed\":1${extra}")"
  wait "$blocker"
}

case "$SET" in
  metrics) common metrics; long_prefix metrics ;;
  interval4) common interval4 ;;
  force) common force ;;
  keepalive)
    queued_stream keepalive stream-chat-queued.txt ''
    queued_stream keepalive stream-chat-queued-usage.txt ',"stream_options":{"include_usage":true}' ;;
  all)
    common all; long_prefix all
    queued_stream all stream-chat-queued.txt ''
    queued_stream all stream-chat-queued-usage.txt ',"stream_options":{"include_usage":true}' ;;
  *) echo "capture-options.sh: unknown set $SET" >&2; exit 2 ;;
esac
