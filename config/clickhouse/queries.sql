-- The queries users run over goodput-proxy records (config/clickhouse/schema.sql), on
-- ClickHouse 18.16 (Debian's package) and later. Each statement stands alone; change the
-- window (`INTERVAL 15 MINUTE`) to taste. `goodput-proxy report --clickhouse URL` runs the
-- first one (and its fleet-wide variant) and prints the table.
--
-- Exact percentiles follow DESIGN.md: numpy's linear interpolation between closest ranks over
-- the sorted values x[0..n): h = (n - 1) * q, lo = floor(h), f = h - lo, a = x[lo],
-- b = x[lo + 1] (x[n - 1] at the end); b - (b - a) * (1 - f) when f >= 0.5, else
-- a + (b - a) * f (numpy's _lerp, operation for operation what measure::stats::percentile does,
-- so the figures agree to the last bit). ClickHouse's quantileExact picks an element instead, so on every version
-- the figures below come from arraySort(groupArray(...)); on 20.x and later,
-- quantilesExactInclusive(0.5, 0.9, 0.99)(ttft_s) gives the same numbers (last query).
-- Latencies leave out `rejected` requests (the proxy answered them itself), as the proxy's
-- histograms and /stats do. FINAL collapses rows a retried batch wrote twice.

-- 1. Exact p50/p90/p99 (seconds) of TTFT, TPOT, E2E per model and upstream, with goodput and
--    outcomes, over the last 15 minutes. (Drop `model, upstream` from the inner SELECT and the
--    GROUP BY for the whole fleet in one row.)
SELECT
    model,
    upstream,
    requests,
    good,
    if(requests - rejected_by_client = 0, NULL, good / (requests - rejected_by_client)) AS goodput_ratio,
    -- (18.16 drops a subquery column that only a lambda reads: name each array outside one.)
    length(ttft) AS ttft_count,
    length(tpot) AS tpot_count,
    length(e2e) AS e2e_count,
    arrayMap(q -> if(empty(ttft), NULL, if(((greatest(length(ttft), 1) - 1) * q - least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1))) >= 0.5, ttft[least(least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1)) + 1, (greatest(length(ttft), 1) - 1)) + 1] - (ttft[least(least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1)) + 1, (greatest(length(ttft), 1) - 1)) + 1] - ttft[least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1)) + 1]) * (1 - ((greatest(length(ttft), 1) - 1) * q - least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1)))), ttft[least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1)) + 1] + (ttft[least(least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1)) + 1, (greatest(length(ttft), 1) - 1)) + 1] - ttft[least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1)) + 1]) * ((greatest(length(ttft), 1) - 1) * q - least(toUInt64(floor((greatest(length(ttft), 1) - 1) * q)), (greatest(length(ttft), 1) - 1))))), [0.5, 0.9, 0.99]) AS ttft_p50_p90_p99,
    arrayMap(q -> if(empty(tpot), NULL, if(((greatest(length(tpot), 1) - 1) * q - least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1))) >= 0.5, tpot[least(least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1)) + 1, (greatest(length(tpot), 1) - 1)) + 1] - (tpot[least(least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1)) + 1, (greatest(length(tpot), 1) - 1)) + 1] - tpot[least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1)) + 1]) * (1 - ((greatest(length(tpot), 1) - 1) * q - least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1)))), tpot[least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1)) + 1] + (tpot[least(least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1)) + 1, (greatest(length(tpot), 1) - 1)) + 1] - tpot[least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1)) + 1]) * ((greatest(length(tpot), 1) - 1) * q - least(toUInt64(floor((greatest(length(tpot), 1) - 1) * q)), (greatest(length(tpot), 1) - 1))))), [0.5, 0.9, 0.99]) AS tpot_p50_p90_p99,
    arrayMap(q -> if(empty(e2e), NULL, if(((greatest(length(e2e), 1) - 1) * q - least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1))) >= 0.5, e2e[least(least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1)) + 1, (greatest(length(e2e), 1) - 1)) + 1] - (e2e[least(least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1)) + 1, (greatest(length(e2e), 1) - 1)) + 1] - e2e[least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1)) + 1]) * (1 - ((greatest(length(e2e), 1) - 1) * q - least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1)))), e2e[least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1)) + 1] + (e2e[least(least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1)) + 1, (greatest(length(e2e), 1) - 1)) + 1] - e2e[least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1)) + 1]) * ((greatest(length(e2e), 1) - 1) * q - least(toUInt64(floor((greatest(length(e2e), 1) - 1) * q)), (greatest(length(e2e), 1) - 1))))), [0.5, 0.9, 0.99]) AS e2e_p50_p90_p99
FROM
(
    SELECT
        model,
        upstream,
        count() AS requests,
        sum(slo_good) AS good,
        sum(rejected_by_client) AS rejected_by_client,
        arraySort(groupArrayIf(ttft_s, outcome != 'rejected' AND isNotNull(ttft_s))) AS ttft,
        arraySort(groupArrayArrayIf(tpot_values_s, outcome != 'rejected')) AS tpot,
        arraySort(groupArrayIf(e2e_s, outcome != 'rejected' AND isNotNull(e2e_s))) AS e2e
    FROM goodput.records FINAL
    WHERE time >= now() - INTERVAL 15 MINUTE
    GROUP BY model, upstream
)
ORDER BY model, upstream;

-- 2. Goodput per model and minute: good requests, the ratio good / (requests - rejections the
--    client caused), and good per second.
SELECT
    model,
    toStartOfMinute(time) AS minute,
    count() AS requests,
    sum(slo_good) AS good,
    if(count() - sum(rejected_by_client) = 0, NULL, sum(slo_good) / (count() - sum(rejected_by_client))) AS goodput_ratio,
    sum(slo_good) / 60 AS good_per_second
FROM goodput.records FINAL
WHERE time >= now() - INTERVAL 1 HOUR
GROUP BY model, minute
ORDER BY model, minute;

-- 3. Outcomes per model and replica (and finish reasons of the successes).
SELECT
    model,
    instance,
    count() AS requests,
    countIf(outcome = 'success') AS success,
    countIf(outcome = 'client_abort') AS client_abort,
    countIf(outcome = 'upstream_error') AS upstream_error,
    countIf(outcome = 'truncated') AS truncated,
    countIf(outcome = 'timeout') AS timeout,
    countIf(outcome = 'rejected') AS rejected,
    countIf(outcome = 'success' AND finish_reason = 'length') AS success_length
FROM goodput.records FINAL
WHERE time >= now() - INTERVAL 15 MINUTE
GROUP BY model, instance
ORDER BY model, instance;

-- 4. The slowest requests (by E2E) with their ids, to look up in the access log or the
--    client's records (`x-request-id`).
SELECT id, instance, model, upstream, outcome, finish_reason, ttft_s, tpot_s, e2e_s, completion_tokens, time
FROM goodput.records FINAL
WHERE time >= now() - INTERVAL 15 MINUTE
ORDER BY e2e_ns DESC
LIMIT 20;

-- 5. The per-minute rollup (schema.sql's materialized view): cheap over long ranges. Its
--    quantiles are ClickHouse's quantilesExact (an element, not interpolated) and a retried
--    batch may be counted twice in it; use query 1 for exact figures.
SELECT
    model,
    minute,
    countMerge(requests) AS requests,
    sumMerge(good) AS good,
    quantilesExactMerge(0.5, 0.9, 0.99)(ttft_s) AS ttft_p50_p90_p99,
    quantilesExactMerge(0.5, 0.9, 0.99)(tpot_s) AS tpot_p50_p90_p99,
    quantilesExactMerge(0.5, 0.9, 0.99)(e2e_s) AS e2e_p50_p90_p99
FROM goodput.records_1m
WHERE minute >= now() - INTERVAL 1 DAY
GROUP BY model, minute
ORDER BY model, minute;

-- 6. Which replica measured what: records and last record per instance (a replica that stops
--    shipping shows up here; its dropped records are in goodput_proxy_records_dropped_total).
SELECT instance, count() AS records, max(time) AS last_record
FROM goodput.records
WHERE time >= now() - INTERVAL 1 HOUR
GROUP BY instance
ORDER BY instance;

-- Newer servers only (20.x and later): query 1's percentiles with a built-in function that
-- interpolates as numpy does.
-- SELECT model, upstream,
--     quantilesExactInclusive(0.5, 0.9, 0.99)(ttft_s) AS ttft_p50_p90_p99,
--     quantilesExactInclusive(0.5, 0.9, 0.99)(e2e_s) AS e2e_p50_p90_p99
-- FROM goodput.records FINAL
-- WHERE time >= now() - INTERVAL 15 MINUTE AND outcome != 'rejected'
-- GROUP BY model, upstream;
