#!/usr/bin/env python3
"""ClickHouse's HTTP interface, as much of it as goodput-proxy speaks, over chdb: a current
ClickHouse engine (chdb embeds it in-process; PyPI) behind the same URL shape as a server, so
the sink, `goodput-proxy report` and the ClickHouse tests run unchanged against it.

    chdb_http.py --port 18133 --dir /tmp/goodput-chdb      (loopback only; stops on SIGTERM)

Understood: `GET /ping`; `POST /` with the query in the body, or in `?query=` with the data in
the body (an INSERT ... FORMAT, gzip `Content-Encoding` too); `?database=`; any other
parameter is a setting of that query (`input_format_skip_unknown_fields=1`). The user headers
are accepted and ignored (one local user). Errors answer 500 with the engine's message, as a
server does. One query at a time (chdb's session is not shared between threads).
"""
import argparse
import gzip
import http.server
import signal
import sys
import threading
import urllib.parse

import chdb.session

SESSION = None
LOCK = threading.Lock()
# What a server answers without a FORMAT clause.
DEFAULT_FORMAT = "TabSeparated"


def run(sql: str, database: str, settings: dict) -> bytes:
    with LOCK:
        if database:
            SESSION.query(f"USE {database}")
        try:
            if settings:
                sets = ", ".join(f"{k} = {v!r}" if not v.isdigit() else f"{k} = {v}"
                                 for k, v in settings.items())
                SESSION.query(f"SET {sets}")
            res = SESSION.query(sql, DEFAULT_FORMAT)
            return res.bytes() if res is not None else b""
        finally:
            if database:
                SESSION.query("USE default")
            for k in settings:
                SESSION.query(f"SET {k} = DEFAULT")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the tests read answers, not logs
        pass

    def answer(self, status: int, body: bytes, ctype="text/plain; charset=UTF-8"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path in ("/ping", "/"):
            if "query" not in urllib.parse.parse_qs(url.query):
                self.answer(200, b"Ok.\n")
                return
        self.handle_query(b"")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
            body = gzip.decompress(body)
        self.handle_query(body)

    def handle_query(self, body: bytes):
        params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query,
                                             keep_blank_values=True))
        query = params.pop("query", "")
        database = params.pop("database", "")
        for k in ("user", "password", "default_format", "compress", "decompress"):
            params.pop(k, None)
        # A server reads the query parameter, then the body: data follows the query text.
        sql = (query + "\n" + body.decode("utf-8")) if query else body.decode("utf-8")
        try:
            out = run(sql, database, params)
        except Exception as e:  # the engine's error, as a server reports it
            self.answer(500, f"Code: 0. DB::Exception: {e}\n".encode())
            return
        self.answer(200, out)


def main() -> int:
    global SESSION
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dir", required=True, help="the engine's data directory")
    args = ap.parse_args()
    SESSION = chdb.session.Session(args.dir)
    server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"chdb_http: ClickHouse {SESSION.query('SELECT version()', 'TSV').bytes().decode().strip()}"
          f" on http://127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    SESSION.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
