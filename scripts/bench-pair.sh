#!/usr/bin/env bash
# Two builds of the proxy side by side in one go, as BENCHMARKS.md's sections report them:
#   1. instructions per request (callgrind, scripts/bench-instructions.sh): nginx, BEFORE and
#      AFTER with metering on, then BEFORE and AFTER with metering off;
#   1b. the same for streams whose events come one by one (SIM_TPOT_MS=1: the simulator paces
#      its tokens, as an engine streaming token by token; at 0 a stream's 66 events reach the
#      proxy in one or two reads, and plain forwarding does no work per event);
#   2. wall clock (scripts/bench.sh PARTS=wrk, 64 connections): nginx, metering on and off, for
#      BEFORE then AFTER, back to back;
#   3. RSS per held stream (scripts/bench.sh PARTS=held) for each.
#
#   scripts/bench-pair.sh BEFORE_BIN AFTER_BIN [OUT]      # OUT defaults to /tmp/goodput-pair
#   STEPS="cg" scripts/bench-pair.sh ...                  # only the instruction counts
#
# BEFORE_BIN and AFTER_BIN are release builds of goodput-proxy (`cargo build --release --workspace
# --features goodput-proxy/jemalloc`); the held-stream client is the goodput-loadtest beside
# AFTER_BIN (LOADTEST_BIN overrides). The access log is off in every step, as nginx's is.
# Env: STEPS="cg paced wall held" KINDS="stream json cusage" SECS=8 (callgrind) BASE_PORT=18600
# (uses BASE_PORT..+199). Each step's results stay under OUT; a summary is printed as it goes.
# Bounded (about 8 minutes for all four steps), loopback only; the scripts it runs stop what
# they start. Figures worth comparing need a machine otherwise idle: run nothing heavy beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n '2,20p' "$0" >&2; exit 2; }
before=$(realpath "$1"); after=$(realpath "$2"); out="${3:-/tmp/goodput-pair}"
for b in "$before" "$after"; do [[ -x $b ]] || { echo "bench-pair: $b is not an executable" >&2; exit 2; }; done
steps="${STEPS:-cg paced wall held}"; base="${BASE_PORT:-18600}"
lt="${LOADTEST_BIN:-$(dirname "$after")/goodput-loadtest}"
if [[ " $steps " == *" held "* && ! -x $lt ]]; then
    echo "bench-pair: no load generator at $lt (set LOADTEST_BIN, or drop held from STEPS)" >&2; exit 2
fi
mkdir -p "$out"
has() { [[ " $steps " == *" $1 "* ]]; }
say() { printf '[bench-pair %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
export GOODPUT_PROXY_LOG_ACCESS=false

if has cg; then
    say "instructions, metering on (nginx, BEFORE, AFTER)"
    OUT="$out/cg-on" BASE_PORT="$base" SECS="${SECS:-8}" KINDS="${KINDS:-stream json cusage}" \
        scripts/bench-instructions.sh nginx "$before" "$after" | tee "$out/cg-on.txt"
    say "instructions, metering off (BEFORE, AFTER)"
    OUT="$out/cg-off" BASE_PORT=$((base + 10)) SECS="${SECS:-8}" KINDS="${KINDS:-stream json cusage}" MEASURE=false \
        scripts/bench-instructions.sh "$before" "$after" | tee "$out/cg-off.txt"
fi
if has paced; then
    say "instructions, paced streams (SIM_TPOT_MS=1): metering on (nginx, BEFORE, AFTER), then off"
    OUT="$out/cgp-on" BASE_PORT=$((base + 20)) SECS="${SECS:-8}" KINDS=stream SIM_TPOT_MS=1 \
        scripts/bench-instructions.sh nginx "$before" "$after" | tee "$out/cgp-on.txt"
    OUT="$out/cgp-off" BASE_PORT=$((base + 30)) SECS="${SECS:-8}" KINDS=stream SIM_TPOT_MS=1 MEASURE=false \
        scripts/bench-instructions.sh "$before" "$after" | tee "$out/cgp-off.txt"
fi
if has wall; then
    for name in before after; do
        bin=$before; [[ $name == after ]] && bin=$after
        say "wall clock, $name ($bin)"
        PARTS=wrk CONNS=64 SECS=4 ROUNDS=3 LITELLM=off ONLY="nginx proxy-on proxy-off" \
            PROXY_BIN="$bin" BASE_PORT=$((base + 50)) OUT="$out/wall-$name" scripts/bench.sh
        cat "$out/wall-$name/bench.md"
    done
fi
if has held; then
    for name in before after; do
        bin=$before; [[ $name == after ]] && bin=$after
        say "held streams, $name ($bin)"
        PARTS=held LITELLM=off ONLY="proxy-on proxy-off" PROXY_BIN="$bin" LOADTEST_BIN="$lt" \
            BASE_PORT=$((base + 100)) OUT="$out/held-$name" scripts/bench.sh
        cat "$out/held-$name/bench.md"
    done
fi
say "done: $out"
