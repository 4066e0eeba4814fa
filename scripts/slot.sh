#!/usr/bin/env bash
# Runs a command holding build slots of a shared 2-core machine, so that several engineers'
# builds and benchmarks do not slow each other (or a benchmark's figures) unseen:
#   scripts/slot.sh heavy CMD...   # one of the two slots: a build or a test run
#   scripts/slot.sh quiet CMD...   # both slots: a benchmark, with nothing heavy beside it
# The slots are lock files under SLOT_DIR (default /tmp/locks); it waits for them (flock).
set -euo pipefail
dir="${SLOT_DIR:-/tmp/locks}"; mkdir -p "$dir"
mode="${1:-}"; shift || true
[[ $# -gt 0 ]] || { sed -n '2,7p' "$0" >&2; exit 2; }
case "$mode" in
    heavy)
        while true; do
            for s in 1 2; do
                exec {fd}>"$dir/slot$s"
                if flock -n "$fd"; then exec "$@"; fi
                exec {fd}>&-
            done
            sleep 2
        done ;;
    quiet)
        exec 8>"$dir/slot1" 9>"$dir/slot2"
        flock 8; flock 9
        exec "$@" ;;
    *) echo "slot.sh: heavy or quiet, then the command" >&2; exit 2 ;;
esac
