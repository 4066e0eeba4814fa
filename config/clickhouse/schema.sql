-- goodput-proxy records in ClickHouse: the table every proxy replica's [sink.clickhouse]
-- inserts into, and a per-minute, per-model rollup.
--
-- Works on ClickHouse 18.16 (Debian's clickhouse-server package) and later; nothing here needs
-- a newer server. Features of newer servers are at the end, commented out.
-- Apply with: scripts/clickhouse.sh (the test server), or one statement at a time over HTTP:
--   curl 'http://clickhouse:8123/' --data-binary 'CREATE DATABASE ...'
-- The names goodput.records / goodput.records_1m match the sink's defaults
-- ([sink.clickhouse] database = "goodput", table = "records"); change both together.

CREATE DATABASE IF NOT EXISTS goodput;

-- One row per finished request, as the proxy's RequestRecord (docs/measure.md), flattened:
-- `slo.good` is `slo_good`; durations arrive as whole nanoseconds (`*_ns`, exact: 18.16 parses
-- decimal floats up to 1 ULP off) and read back in seconds through the `*_s` ALIAS columns.
--
-- Duplicates: `uid` is unique per record (the replica's random boot id and a sequence
-- number), and a batch that is retried after an unclear failure (the insert may have landed)
-- is sent again with the same uids. ReplacingMergeTree keeps one row per sorting key, which
-- ends with uid, once parts merge; exact queries read `FROM goodput.records FINAL` (see
-- queries.sql), which collapses duplicates at read time too.
CREATE TABLE IF NOT EXISTS goodput.records
(
    uid String,
    instance String,
    -- The API key's tenant ([auth]); NULL with auth off or for a request auth refused (401).
    -- On a table made before it: ALTER TABLE goodput.records ADD COLUMN tenant Nullable(String)
    tenant Nullable(String),
    id String,
    model String,
    upstream String,
    -- Why the balancer chose `upstream` ([balance]); replicas that rejected it first.
    -- On a table made before them: ALTER TABLE goodput.records ADD COLUMN route_reason
    -- Nullable(String), ADD COLUMN retried_from Array(String)
    route_reason Nullable(String),
    retried_from Array(String),
    stream UInt8,
    status Nullable(UInt16),
    outcome String,
    finish_reason Nullable(String),
    start_unix_ms UInt64,
    ttft_ns Nullable(UInt64),
    ttfc_ns Nullable(UInt64),
    tpot_ns Nullable(UInt64),
    choice_tpot_ns Array(UInt64),
    e2e_ns UInt64,
    itl_count UInt64,
    itl_max_ns Nullable(UInt64),
    prompt_tokens Nullable(UInt64),
    completion_tokens Nullable(UInt64),
    tokens_exact UInt8,
    usage_injected UInt8,
    usage_stripped UInt8,
    -- Stalls, the engine's own view of the request and where its TTFT went (issue 24; NULL
    -- when the engine reported no per-request timings). On a table made before them:
    -- ALTER TABLE goodput.records ADD COLUMN <name> <type> for each, and their _s aliases.
    stalls UInt64,
    engine_queue_ns Nullable(UInt64),
    engine_ttft_ns Nullable(UInt64),
    engine_decode_ns Nullable(UInt64),
    engine_mean_itl_ns Nullable(UInt64),
    cached_prompt_tokens Nullable(UInt64),
    ttft_proxy_ns Nullable(UInt64),
    ttft_queue_ns Nullable(UInt64),
    ttft_prefill_ns Nullable(UInt64),
    ttft_rest_ns Nullable(UInt64),
    ttft_split_clamped UInt8,
    slo_ttft_ok Nullable(UInt8),
    slo_tpot_ok Nullable(UInt8),
    slo_e2e_ok Nullable(UInt8),
    slo_tool_calls_ok Nullable(UInt8),
    slo_stall_ok Nullable(UInt8),
    slo_good UInt8,
    -- Agent traffic (NULL without reasoning or tool calls): phase times, reasoning
    -- tokens, tool calls and the worst call's outcome (valid, invalid_json, schema_violation,
    -- unknown_function) with its first violation. On a table made before them:
    -- ALTER TABLE goodput.records ADD COLUMN <name> <type> for each agent_*, logprobs_*,
    -- slo_tool_calls_ok and slo_stall_ok column (and the agent_*_s aliases).
    agent_ttf_reasoning_ns Nullable(UInt64),
    agent_ttf_answer_ns Nullable(UInt64),
    agent_ttf_tool_call_ns Nullable(UInt64),
    agent_tool_call_ns Nullable(UInt64),
    agent_reasoning_tokens Nullable(UInt64),
    agent_tool_calls Nullable(UInt32),
    agent_tool_call_outcome Nullable(String),
    agent_tool_call_violation Nullable(String),
    -- The logprob summary (NULL without logprobs); traces are not stored here (JSONL only).
    logprobs_tokens Nullable(UInt64),
    logprobs_mean Nullable(Float64),
    logprobs_min Nullable(Float64),
    logprobs_min_at Nullable(UInt64),
    logprobs_largest_drop Nullable(Float64),
    logprobs_largest_drop_at Nullable(UInt64),
    logprobs_tool_call_min Nullable(Float64),
    time DateTime MATERIALIZED toDateTime(intDiv(start_unix_ms, 1000)),
    ttft_s ALIAS ttft_ns / 1e9,
    ttfc_s ALIAS ttfc_ns / 1e9,
    tpot_s ALIAS tpot_ns / 1e9,
    choice_tpot_s ALIAS arrayMap(v -> v / 1e9, choice_tpot_ns),
    -- The TPOT observations a record adds to statistics (DESIGN.md): one per choice with n > 1
    -- (choice_tpot_ns), else the request's own when defined.
    tpot_values_s ALIAS arrayMap(v -> v / 1e9, if(empty(choice_tpot_ns), if(isNull(tpot_ns), emptyArrayUInt64(), [assumeNotNull(tpot_ns)]), choice_tpot_ns)),
    e2e_s ALIAS e2e_ns / 1e9,
    itl_max_s ALIAS itl_max_ns / 1e9,
    engine_queue_s ALIAS engine_queue_ns / 1e9,
    engine_ttft_s ALIAS engine_ttft_ns / 1e9,
    engine_decode_s ALIAS engine_decode_ns / 1e9,
    engine_mean_itl_s ALIAS engine_mean_itl_ns / 1e9,
    ttft_proxy_s ALIAS ttft_proxy_ns / 1e9,
    ttft_queue_s ALIAS ttft_queue_ns / 1e9,
    ttft_prefill_s ALIAS ttft_prefill_ns / 1e9,
    ttft_rest_s ALIAS ttft_rest_ns / 1e9,
    agent_ttf_reasoning_s ALIAS agent_ttf_reasoning_ns / 1e9,
    agent_ttf_answer_s ALIAS agent_ttf_answer_ns / 1e9,
    agent_ttf_tool_call_s ALIAS agent_ttf_tool_call_ns / 1e9,
    agent_tool_call_s ALIAS agent_tool_call_ns / 1e9,
    rejected_by_client ALIAS outcome = 'rejected' AND ifNull(status, 0) >= 400 AND ifNull(status, 0) < 500 AND ifNull(status, 0) != 429
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMMDD(time)
ORDER BY (model, upstream, time, uid);

-- Per minute and model: requests, good requests, the goodput ratio's denominator, and
-- ClickHouse's quantilesExact of TTFT, TPOT and E2E (seconds). Read with the -Merge
-- functions (queries.sql). (A view reads the inserted block, where ALIAS columns do not exist:
-- their expressions are spelled out.) Caveats: quantilesExact picks an element (the one at rank
-- floor(q * n)), not numpy's interpolation, so these figures are close to, not equal to, the
-- exact percentiles of queries.sql; and a view sees every insert, so a retried batch that had
-- landed is counted twice here (the raw table collapses it).
CREATE MATERIALIZED VIEW IF NOT EXISTS goodput.records_1m
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, minute)
AS SELECT
    model,
    toStartOfMinute(time) AS minute,
    countState() AS requests,
    sumState(toUInt64(slo_good)) AS good,
    sumState(toUInt64(outcome = 'rejected' AND ifNull(status, 0) >= 400 AND ifNull(status, 0) < 500 AND ifNull(status, 0) != 429)) AS rejected_by_client,
    quantilesExactState(0.5, 0.9, 0.99)(ttft_ns / 1e9) AS ttft_s,
    quantilesExactState(0.5, 0.9, 0.99)(tpot_ns / 1e9) AS tpot_s,
    quantilesExactState(0.5, 0.9, 0.99)(e2e_ns / 1e9) AS e2e_s
FROM goodput.records
GROUP BY model, minute;

-- Newer servers only (not applied by scripts/clickhouse.sh, which targets 18.16 too):
--
-- Retention, ClickHouse 19.6 and later (on 18.16 drop old days by partition instead:
--   ALTER TABLE goodput.records DROP PARTITION 20261101):
--   ALTER TABLE goodput.records MODIFY TTL time + INTERVAL 30 DAY;
--
-- Insert deduplication for non-replicated tables, ClickHouse 20.x and later (replicated
-- tables dedupe identical retried blocks on every version):
--   ALTER TABLE goodput.records MODIFY SETTING non_replicated_deduplication_window = 1000;
--
-- LowCardinality(String) for instance, model, upstream, outcome, finish_reason (19.x and
-- later) saves space; the sink's rows fit either type.
