#!/usr/bin/env bash
# Capture real vLLM tool-call and reasoning streams, same file format as
# capture-extra.sh (`### ` lines, then the raw response head and body, byte for byte), so the
# simulator's agent shapes can be held to them. The engine must run with a tool parser (and,
# for the reasoning captures, a reasoning parser):
#   serve.sh 8011 --enable-auto-tool-choice --tool-call-parser hermes [--reasoning-parser R]
# Usage: capture-agent.sh BASE_URL OUTDIR [reasoning]
set -euo pipefail
B="${1:?usage: capture-agent.sh BASE_URL OUTDIR [reasoning]}"
OUT="${2:?usage: capture-agent.sh BASE_URL OUTDIR [reasoning]}"
MODE="${3:-tools}"
MODEL="${ENGINE_NAME:-tiny}"
mkdir -p "$OUT"

source "$(dirname "${BASH_SOURCE[0]}")/capture-post.sh"
msg='"messages":[{"role":"user","content":"What is the weather in Paris?"}]'
tools='"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}}]'
named='"tool_choice":{"type":"function","function":{"name":"get_weather"}}'
usage='"stream_options":{"include_usage":true}'

if [[ "$MODE" == reasoning ]]; then
  post stream-chat-reasoning.txt /v1/chat/completions \
    "{\"model\":\"${MODEL}\",${msg},\"stream\":true,\"max_tokens\":12,\"seed\":1,${usage}}"
  post nonstream-chat-reasoning.txt /v1/chat/completions \
    "{\"model\":\"${MODEL}\",${msg},\"max_tokens\":12,\"seed\":1}"
  exit 0
fi
# A named tool_choice: vLLM constrains the output to the function's arguments and streams
# delta.tool_calls (first delta: id, type, index, function.name; then argument fragments).
post stream-chat-tool-named.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},${tools},${named},\"stream\":true,\"max_tokens\":64,\"seed\":1,${usage}}"
post stream-chat-tool-named-logprobs.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},${tools},${named},\"stream\":true,\"max_tokens\":40,\"seed\":2,\"logprobs\":true,\"top_logprobs\":2,${usage}}"
post stream-chat-tool-required.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},${tools},\"tool_choice\":\"required\",\"stream\":true,\"max_tokens\":64,\"seed\":1,${usage}}"
# auto: the hermes parser looks for <tool_call> in the text; a random model rarely writes one.
post stream-chat-tool-auto.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},${tools},\"tool_choice\":\"auto\",\"stream\":true,\"max_tokens\":12,\"seed\":1,${usage}}"
post nonstream-chat-tool-named.txt /v1/chat/completions \
  "{\"model\":\"${MODEL}\",${msg},${tools},${named},\"max_tokens\":64,\"seed\":1}"
