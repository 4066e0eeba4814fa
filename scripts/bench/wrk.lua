-- wrk script of scripts/bench.sh: one chat request, streaming when BENCH_STREAM=1; at the end one
-- JSON line (prefixed "BENCH ") with requests, duration, errors and latency percentiles (us).
-- BENCH_SHAPE (scripts/bench-instructions.sh): "tool" offers a function with a named
-- tool_choice and asks the simulator for a valid call (it streams one tool call, then stops);
-- "logprobs" asks for logprobs (top 2); "traced" the same with the proxy's x-goodput-trace;
-- "cusage" asks for continuous usage (`stream_options.continuous_usage_stats`).
local stream = os.getenv("BENCH_STREAM") == "1"
local shape = os.getenv("BENCH_SHAPE") or ""
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
local extra = ""
if shape == "tool" then
    wrk.headers["x-sim-fault"] = "tool-call=valid"
    extra = ',"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",'
        .. '"properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},'
        .. '"required":["location"]}}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}}'
elseif shape == "cusage" then
    -- vLLM's continuous usage: usage on every chunk (asked for, so nothing is injected).
    extra = ',"stream_options":{"include_usage":true,"continuous_usage_stats":true}'
elseif shape == "logprobs" or shape == "traced" then
    extra = ',"logprobs":true,"top_logprobs":2'
    if shape == "traced" then wrk.headers["x-goodput-trace"] = "1" end
end
wrk.body = '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":64,"ignore_eos":true'
    .. extra .. (stream and ',"stream":true}' or '}')

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        'BENCH {"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
        '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
        summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
        latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
