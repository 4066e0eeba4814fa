#!/usr/bin/env bash
# A throwaway ClickHouse server for the tests: Debian's clickhouse-server, installed only when
# missing, run as the current user from a private directory on a loopback HTTP port.
#
#   scripts/clickhouse.sh install   # apt-get install clickhouse-server when the binary is missing
#   scripts/clickhouse.sh start     # start (install if needed), wait for /ping, apply schema.sql
#   scripts/clickhouse.sh stop      # stop the server this script started (by its pid file)
#   scripts/clickhouse.sh kill      # SIGKILL it at once (the outage test: a graceful stop keeps
#                                   # serving open keep-alive connections for seconds)
#   scripts/clickhouse.sh restart   # stop + start, keeping the data
#   scripts/clickhouse.sh url       # print the HTTP URL
#
# Environment: GOODPUT_CH_PORT (HTTP, default 18123; the native port is that + 1),
# GOODPUT_CH_DIR (data, logs, pid; default /tmp/goodput-clickhouse). Exit code 3 from
# `install`/`start` means "cannot install": callers print SKIPPED instead of failing.
#
# GOODPUT_CH_ENGINE=chdb runs a current ClickHouse engine instead of Debian's 18.16: chdb (the
# engine in-process, PyPI, installed with pip when missing) behind ClickHouse's HTTP interface
# (scripts/lib/chdb_http.py); defaults port 18133, directory /tmp/goodput-chdb. The same
# tests run against it (docs/clickhouse.md, "Versions").
set -euo pipefail

ENGINE="${GOODPUT_CH_ENGINE:-server}"
CHDB_VERSION=4.4.0
if [[ "$ENGINE" == chdb ]]; then
    PORT="${GOODPUT_CH_PORT:-18133}"
    DIR="${GOODPUT_CH_DIR:-/tmp/goodput-chdb}"
else
    PORT="${GOODPUT_CH_PORT:-18123}"
    DIR="${GOODPUT_CH_DIR:-/tmp/goodput-clickhouse}"
fi
TCP_PORT=$((PORT + 1))
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
URL="http://127.0.0.1:${PORT}"
BIN=/usr/sbin/clickhouse-server

have_server() { [[ -x "$BIN" ]] || command -v clickhouse-server >/dev/null 2>&1; }

install_chdb() {
    python3 -c 'import chdb' 2>/dev/null && return 0
    if ! python3 -m pip install -q "chdb==$CHDB_VERSION" </dev/null >/tmp/goodput-chdb-pip.log 2>&1; then
        echo "clickhouse.sh: pip install chdb failed (see /tmp/goodput-chdb-pip.log)" >&2
        return 3
    fi
}

install() {
    [[ "$ENGINE" == chdb ]] && { install_chdb; return $?; }
    have_server && return 0
    if ! command -v apt-get >/dev/null 2>&1 || [[ "$(id -u)" != 0 ]]; then
        echo "clickhouse.sh: clickhouse-server missing and apt-get unusable (not root?)" >&2
        return 3
    fi
    if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends clickhouse-server) \
        </dev/null >/tmp/goodput-ch-apt.log 2>&1; then
        echo "clickhouse.sh: apt-get install clickhouse-server failed (see /tmp/goodput-ch-apt.log)" >&2
        return 3
    fi
    have_server || return 3
}

write_config() {
    mkdir -p "$DIR/data" "$DIR/tmp" "$DIR/user_files" "$DIR/log"
    cat >"$DIR/config.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <logger><level>warning</level><log>$DIR/log/server.log</log><errorlog>$DIR/log/error.log</errorlog></logger>
    <http_port>$PORT</http_port>
    <tcp_port>$TCP_PORT</tcp_port>
    <listen_host>127.0.0.1</listen_host>
    <path>$DIR/data/</path>
    <tmp_path>$DIR/tmp/</tmp_path>
    <user_files_path>$DIR/user_files/</user_files_path>
    <users_config>$DIR/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <mark_cache_size>268435456</mark_cache_size>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <max_concurrent_queries>64</max_concurrent_queries>
    <mlock_executable>false</mlock_executable>
</yandex>
EOF
    cat >"$DIR/users.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <profiles><default><max_memory_usage>2000000000</max_memory_usage></default></profiles>
    <users><default><password></password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
        <profile>default</profile><quota>default</quota></default></users>
    <quotas><default></default></quotas>
</yandex>
EOF
}

ping() { curl -fsS --max-time 1 "$URL/ping" >/dev/null 2>&1; }

query() { curl -fsS --max-time 10 "$URL/" --data-binary @-; }

apply_schema() {
    # One statement per POST (the HTTP interface takes one at a time); `--` comments dropped.
    python3 - "$ROOT/config/clickhouse/schema.sql" "$URL" <<'EOF'
import sys, urllib.request
text = "\n".join(l for l in open(sys.argv[1]).read().splitlines() if not l.lstrip().startswith("--"))
for stmt in (s.strip() for s in text.split(";")):
    if stmt:
        urllib.request.urlopen(urllib.request.Request(sys.argv[2] + "/", data=stmt.encode()), timeout=30).read()
EOF
}

start() {
    install || return $?
    if [[ -f "$DIR/pid" ]] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null && ping; then
        return 0
    fi
    if [[ "$ENGINE" == chdb ]]; then
        mkdir -p "$DIR/data" "$DIR/log"
        python3 "$ROOT/scripts/lib/chdb_http.py" --port "$PORT" --dir "$DIR/data" \
            </dev/null >"$DIR/log/stdout.log" 2>"$DIR/log/error.log" &
    else
        write_config
        local bin="$BIN"
        [[ -x "$bin" ]] || bin="$(command -v clickhouse-server)"
        "$bin" --config-file="$DIR/config.xml" --pid-file="$DIR/pid" \
            </dev/null >"$DIR/log/stdout.log" 2>&1 &
    fi
    echo $! >"$DIR/pid"
    for _ in $(seq 1 150); do
        ping && break
        if ! kill -0 "$(cat "$DIR/pid")" 2>/dev/null; then
            echo "clickhouse.sh: server exited; see $DIR/log/" >&2
            tail -20 "$DIR/log/error.log" "$DIR/log/stdout.log" >&2 2>/dev/null || true
            return 1
        fi
        sleep 0.1
    done
    ping || { echo "clickhouse.sh: no /ping answer on $URL after 15 s" >&2; return 1; }
    apply_schema
}

stop() {
    [[ -f "$DIR/pid" ]] || return 0
    local pid signal="${1:-TERM}"
    pid="$(cat "$DIR/pid")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -s "$signal" "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$DIR/pid"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    kill) stop KILL ;;
    restart) stop; start ;;
    url) echo "$URL" ;;
    wipe) stop; rm -rf "$DIR" ;;
    *) echo "usage: $0 install|start|stop|kill|restart|url|wipe" >&2; exit 2 ;;
esac
