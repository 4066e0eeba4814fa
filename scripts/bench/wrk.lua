-- wrk script of scripts/bench.sh: one chat request, streaming when BENCH_STREAM=1; at the end one
-- JSON line (prefixed "BENCH ") with requests, duration, errors and latency percentiles (us).
local stream = os.getenv("BENCH_STREAM") == "1"
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":64,"ignore_eos":true'
    .. (stream and ',"stream":true}' or '}')

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        'BENCH {"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
        '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
        summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
        latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
