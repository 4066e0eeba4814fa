#!/usr/bin/env bash
# Two real vLLM 0.32 replicas (CPU, tiny model, a small KV cache each) behind the proxy, a
# shared-prefix workload, each strategy in turn on the same engines and the same seeded
# requests (STRATEGIES, default "p2c prefix auto"): the engines' own prefix-cache hit rate and
# the client TTFT (docs/routing.md). Loopback only; stops everything it starts.
#
#   scripts/route-real-vllm.sh [REQUESTS] [BLOCKS] [PROMPTS] [CLAUSES]
#       (defaults 120 requests, 24 blocks of 128 tokens per replica, 6 system prompts of
#       120 clauses: about 1,480 prompt tokens with the question, 11 full blocks shared;
#       156 clauses: 1,948 tokens, 15 full blocks, about the most the engines'
#       --max-model-len 2048 leaves room for)
#
# Needs ../shared/real-vllm (serve.sh, stop.sh) and a built proxy (target/debug or
# target/release goodput-proxy). Run it under scripts/slot.sh quiet: the replicas take both cores.
# Ports: PORT_BASE (default 8090) + 1, + 2 for the engines, + 0 and + 3 for the proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-120}"
BLOCKS="${2:-24}"
PROMPTS="${3:-6}"
CLAUSES="${4:-120}"
REAL="${REAL_VLLM:-../shared/real-vllm}"
PROXY="${PROXY_BIN:-target/debug/goodput-proxy}"
BASE="${PORT_BASE:-8090}"
PORTS=($((BASE + 1)) $((BASE + 2)))
LISTEN=$BASE
ADMIN=$((BASE + 3))
OUT="${OUT:-route-real-out}"
read -r -a STRATS <<< "${STRATEGIES:-p2c prefix auto}"
mkdir -p "$OUT"
cleanup() {
  [[ -n "${PPID_PROXY:-}" ]] && kill "$PPID_PROXY" 2>/dev/null || true
  for p in "${PORTS[@]}"; do bash "$REAL/stop.sh" "$p" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
for p in "${PORTS[@]}"; do
  ENGINE_LOG_REQUESTS=0 bash "$REAL/serve.sh" "$p" --num-gpu-blocks-override "$BLOCKS" \
    --enable-prompt-tokens-details > "$OUT/serve-$p.txt" 2>&1 &
done
wait
for p in "${PORTS[@]}"; do
  curl -sf "http://127.0.0.1:$p/v1/models" >/dev/null || { echo "replica $p did not start" >&2; exit 1; }
done
run() {
  local strategy="$1"
  cat > "$OUT/proxy-$strategy.toml" <<TOML
[server]
listen = "127.0.0.1:$LISTEN"
admin_listen = "127.0.0.1:$ADMIN"
[upstream]
urls = ["http://127.0.0.1:${PORTS[0]}", "http://127.0.0.1:${PORTS[1]}"]
health_interval_ms = 500
[engine]
scrape_interval_ms = 1000
[balance]
strategy = "$strategy"
TOML
  "$PROXY" serve --config "$OUT/proxy-$strategy.toml" > "$OUT/proxy-$strategy.log" 2>&1 &
  PPID_PROXY=$!
  for _ in $(seq 1 50); do curl -sf http://127.0.0.1:$ADMIN/readyz >/dev/null && break; sleep 0.2; done
  python3 - "$strategy" "$N" "$LISTEN" "$PROMPTS" "$CLAUSES" "${PORTS[@]}" <<'PY' | tee "$OUT/result-$strategy.txt"
import json, random, sys, threading, time, urllib.request
strategy, n, listen, prompts, clauses, ports = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]
def counters():
    q = h = t = 0.0
    for p in ports:
        for line in urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics").read().decode().splitlines():
            if line.startswith("vllm:prefix_cache_queries_total{"): q += float(line.split()[-1])
            if line.startswith("vllm:prefix_cache_hits_total{"): h += float(line.split()[-1])
            if line.startswith("vllm:prompt_tokens_total{"): t += float(line.split()[-1])
    return q, h, t
rng = random.Random(22)
systems = [f"Policy {k}: " + " ".join(f"clause{k}x{j} applies to the account" for j in range(clauses)) for k in range(prompts)]
q0, h0, pt0 = counters()
ttfts, lock = [], threading.Lock()
def one(i):
    body = {"model": "tiny", "messages": [{"role": "system", "content": systems[rng.randrange(prompts)]},
            {"role": "user", "content": f"question {i} about refunds"}], "stream": True, "max_tokens": 8, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{listen}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            if line.startswith(b'data: {') and b'"content":"' in line and b'"role"' not in line:
                with lock: ttfts.append(time.monotonic() - t0)
                break
        r.read()
conc = 2
for start in range(0, n, conc):
    ts = [threading.Thread(target=one, args=(i,)) for i in range(start, min(n, start + conc))]
    [t.start() for t in ts]; [t.join() for t in ts]
q1, h1, pt1 = counters()
ttfts.sort()
pct = lambda x: ttfts[min(len(ttfts) - 1, int(x * (len(ttfts) - 1) + 0.5))] * 1000
print(f"{strategy}: requests {len(ttfts)}  engine prefix hit rate {100 * (h1 - h0) / max(q1 - q0, 1):.1f} %  "
      f"client TTFT p50 {pct(0.5):.0f} ms  p90 {pct(0.9):.0f} ms  p99 {pct(0.99):.0f} ms  "
      f"prompt tokens per request {(pt1 - pt0) / max(len(ttfts), 1):.0f}")
PY
  curl -s http://127.0.0.1:$ADMIN/metrics | grep -E '^goodput_proxy_route_(decisions|releases)_total' > "$OUT/decisions-$strategy.txt" || true
  kill "$PPID_PROXY"; wait "$PPID_PROXY" 2>/dev/null || true; PPID_PROXY=
}
for s in "${STRATS[@]}"; do run "$s"; done
