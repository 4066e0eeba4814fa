//! One record as one ClickHouse `JSONEachRow` line: the record's JSON flattened (nested objects
//! joined with `_`: `slo.good` -> `slo_good`), `null`s left out (the column's default: NULL for
//! `Nullable`, '' or 0 otherwise), and every duration `<name>_s` (seconds, f64) sent as
//! `<name>_ns`, whole nanoseconds (UInt64).
//!
//! Why nanoseconds: ClickHouse 18.16 (Debian's package) parses decimal floats inexactly (1 ULP
//! off on about 0.15 % of values, measured on 20,000 random latencies), so the stored seconds
//! would not be the record's. Integers parse exactly, a record's durations are whole
//! nanoseconds (`Duration::as_secs_f64` of a `Duration`, recovered by rounding `s * 1e9` for
//! any duration under ~10^6 s), and the schema's `<name>_s` ALIAS columns divide by 1e9.
//!
//! The mapping is generic, so a field the record gains reaches ClickHouse without code here;
//! the schema test below fails until `config/clickhouse/schema.sql` has its column.

use serde_json::{Map, Value};

use goodput_measure::record::RequestRecord;

/// Appends `rec` as one JSON line (with `\n`) to `out`; `uid` is its unique key (see
/// `clickhouse.rs`).
pub fn write_row(rec: &RequestRecord, uid: &str, out: &mut Vec<u8>) {
    let mut row = Map::new();
    row.insert("uid".into(), Value::String(uid.into()));
    if let Ok(Value::Object(mut fields)) = serde_json::to_value(rec) {
        // A trace is a list of events, not columns: it goes to the JSONL sink only.
        fields.remove("trace");
        flatten("", fields, &mut row);
    }
    // A map of plain values always serializes.
    let _ = serde_json::to_writer(&mut *out, &Value::Object(row));
    out.push(b'\n');
}

fn flatten(prefix: &str, fields: Map<String, Value>, row: &mut Map<String, Value>) {
    for (k, v) in fields {
        let key = format!("{prefix}{k}");
        match v {
            Value::Null => {}
            Value::Object(inner) => flatten(&format!("{key}_"), inner, row),
            v => match key
                .strip_suffix("_s")
                .and_then(|stem| nanos(&v).map(|n| (stem, n)))
            {
                Some((stem, n)) => {
                    row.insert(format!("{stem}_ns"), n);
                }
                None => {
                    row.insert(key, v);
                }
            },
        }
    }
}

/// Seconds (a number, or an array of numbers) as whole nanoseconds; `None` for anything else.
fn nanos(v: &Value) -> Option<Value> {
    let one = |v: &Value| {
        v.as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Value::from((s * 1e9).round() as u64))
    };
    match v {
        Value::Array(items) => items
            .iter()
            .map(one)
            .collect::<Option<Vec<_>>>()
            .map(Value::Array),
        v => one(v),
    }
}

/// The seconds a stored nanosecond count stands for, computed as ClickHouse's ALIAS columns do
/// (`ns / 1e9`): what queries over the table see.
pub fn stored_seconds(s: f64) -> f64 {
    (s * 1e9).round() / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use goodput_measure::agent::{AgentSummary, ToolCallOutcome};
    use goodput_measure::meter::Measurement;
    use goodput_measure::outcome::{FinishReason, Outcome};
    use goodput_measure::slo::{judge, Slo};
    use goodput_measure::trace::{LogprobSummary, Trace};
    use std::collections::BTreeSet;
    use std::time::Duration;

    /// A record with every optional field set.
    fn full_record() -> RequestRecord {
        let d = Duration::from_nanos;
        let mut m = Measurement::without_body(Outcome::Success, Some(200), d(1_234_567_891));
        m.streaming = true;
        m.finish_reason = Some(FinishReason::Stop);
        m.ttft = Some(d(250_000_001));
        m.ttfc = Some(d(200_000_000));
        m.tpot = Some(d(20_000_003));
        m.itl_count = 9;
        m.itl_max = Some(d(40_000_000));
        m.prompt_tokens = Some(5);
        m.completion_tokens = Some(10);
        m.tokens_exact = true;
        m.choice_tpots = vec![d(10_000_001), d(20_000_003)].into();
        m.usage_injected = true;
        m.usage_stripped = true;
        let view = goodput_measure::engine::EngineView {
            queue: Some(d(20_000_001)),
            ttft: Some(d(30_000_002)),
            decode: Some(d(400_000_003)),
            mean_itl: Some(d(44_444_445)),
            cached_prompt_tokens: Some(128),
        };
        let split = goodput_measure::engine::TtftSplit::of(m.ttft, Some(d(1_000_000)), &view);
        m.set_engine(view, split, 1);
        m.agent = Some(Box::new(AgentSummary {
            ttf_reasoning: Some(d(100_000_001)),
            ttf_answer: Some(d(300_000_000)),
            ttf_tool_call: Some(d(200_000_002)),
            tool_call_duration: Some(d(50_000_003)),
            reasoning_tokens: Some(4),
            tool_calls: 1,
            tool_call_outcome: Some(ToolCallOutcome::SchemaViolation),
            tool_call_violation: Some("/unit: not one of".into()),
        }));
        m.logprobs = Some(Box::new(LogprobSummary {
            tokens: 10,
            mean: -1.25,
            min: -4.5,
            min_at: 3,
            largest_drop: Some(3.0),
            largest_drop_at: Some(3),
            tool_call_min: Some(-2.0),
        }));
        let slo = Slo {
            max_stall: Some(Duration::from_secs(1)),
            ..Slo::default()
        };
        let v = judge(&m, &slo);
        let end = tokio::time::Instant::now();
        RequestRecord::new(
            "req-1".into(),
            "tiny".into(),
            Some("http://u:1".into()),
            1_700_000_000_123,
            end,
            m,
            v,
        )
        .with_instance("proxy-a")
        .with_tenant(Some("team-a".into()))
        .with_route(
            goodput_measure::record::RouteReason::PrefixHit,
            vec!["http://u:2".into()],
        )
    }

    fn row_of(rec: &RequestRecord) -> Map<String, Value> {
        let mut out = Vec::new();
        write_row(rec, "u-1", &mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn flattens_drops_nulls_and_sends_whole_nanoseconds() {
        let r = row_of(&full_record());
        assert_eq!(r["uid"], "u-1");
        assert_eq!(r["instance"], "proxy-a");
        assert_eq!(r["tenant"], "team-a");
        assert_eq!(r["ttft_ns"], 250_000_001u64);
        assert_eq!(r["e2e_ns"], 1_234_567_891u64);
        assert_eq!(r["tpot_ns"], 20_000_003u64);
        // The record's tool call broke its schema: not good ([slo] valid_tool_calls).
        assert_eq!(
            (&r["slo_good"], &r["slo_tool_calls_ok"]),
            (&false.into(), &false.into())
        );
        assert_eq!(r["slo_ttft_ok"], true);
        assert_eq!(r["outcome"], "success");
        assert!(!r.contains_key("ttft_s") && !r.contains_key("slo"));
        assert_eq!(r["agent_ttf_tool_call_ns"], 200_000_002u64);
        assert_eq!(r["agent_tool_call_outcome"], "schema_violation");
        assert_eq!(r["logprobs_min"], -4.5);
        // A trace is not columns: left out of the row.
        let mut traced = full_record();
        traced.measured.trace = Some(std::sync::Arc::new(Trace::default()));
        assert_eq!(row_of(&traced), r);

        let m = Measurement::without_body(Outcome::UpstreamError, None, Duration::from_millis(3));
        let end = tokio::time::Instant::now();
        let bare = RequestRecord::new("r".into(), "m".into(), None, 0, end, m, Default::default());
        let r = row_of(&bare);
        for absent in [
            "upstream",
            "status",
            "ttft_ns",
            "slo_ttft_ok",
            "finish_reason",
        ] {
            assert!(!r.contains_key(absent), "{absent}: nulls are left out");
        }
        assert_eq!(r["e2e_ns"], 3_000_000u64);
    }

    #[test]
    fn nanoseconds_round_trip_every_duration_exactly() {
        for ns in [
            0u64,
            1,
            999,
            1_000_000_007,
            123_456_789_012,
            86_400_000_000_001,
        ] {
            let s = Duration::from_nanos(ns).as_secs_f64();
            assert_eq!(nanos(&Value::from(s)), Some(Value::from(ns)), "{ns}");
            assert_eq!(stored_seconds(s), ns as f64 / 1e9);
        }
        assert_eq!(nanos(&Value::from(-1.0)), None);
        assert_eq!(nanos(&Value::from("x")), None);
        assert_eq!(
            nanos(&serde_json::json!([0.5, 0.25])),
            Some(serde_json::json!([500_000_000u64, 250_000_000u64]))
        );
    }

    /// `(column, kind)` of the records table in schema.sql; kind is `MATERIALIZED`, `ALIAS`
    /// or "" (a column a row fills).
    fn schema_columns() -> Vec<(String, String)> {
        let sql = include_str!("../../config/clickhouse/schema.sql");
        let start = sql
            .find("CREATE TABLE IF NOT EXISTS goodput.records")
            .expect("records table");
        let body = &sql[start..];
        let body = &body[body.find('(').unwrap() + 1..body.find("\n)").unwrap()];
        body.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("--"))
            .map(|l| {
                let mut words = l.split_whitespace();
                let name = words.next().unwrap().to_string();
                let kind = l
                    .split_whitespace()
                    .find(|w| *w == "MATERIALIZED" || *w == "ALIAS")
                    .unwrap_or("")
                    .to_string();
                (name, kind)
            })
            .collect()
    }

    #[test]
    fn schema_has_a_column_for_every_field_and_nothing_else_to_fill() {
        let cols = schema_columns();
        let filled: BTreeSet<String> = cols
            .iter()
            .filter(|(_, k)| k.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        let rec = full_record();
        let mut sent: BTreeSet<String> = row_of(&rec).keys().cloned().collect();
        // Fields that are null even in the fullest record still need their column.
        if let Ok(Value::Object(fields)) = serde_json::to_value(&rec) {
            for (k, v) in fields.iter().filter(|(_, v)| v.is_null()) {
                let _ = v;
                sent.insert(
                    k.strip_suffix("_s")
                        .map_or(k.clone(), |s| format!("{s}_ns")),
                );
            }
        }
        let missing: Vec<_> = sent.difference(&filled).collect();
        assert!(
            missing.is_empty(),
            "schema.sql lacks columns for {missing:?}"
        );
        let unfilled: Vec<_> = filled.difference(&sent).collect();
        assert!(
            unfilled.is_empty(),
            "schema.sql columns no record fills: {unfilled:?}"
        );
        // Every duration has its seconds alias.
        for ns in sent.iter().filter(|k| k.ends_with("_ns")) {
            let alias = format!("{}_s", ns.trim_end_matches("_ns"));
            assert!(
                cols.iter().any(|(n, k)| *n == alias && k == "ALIAS"),
                "no ALIAS column {alias}"
            );
        }
    }

    /// The fullest record as the JSONL sink writes it (a trace included), and as ClickHouse
    /// gets it: every key and value exactly as before the record became one type (taken from
    /// that code). A renamed or lost field fails here; a new field is added to both.
    const GOLDEN_JSONL: &str = r#"{"id":"req-1","model":"tiny","upstream":"http://u:1","stream":true,"status":200,"outcome":"success","finish_reason":"stop","start_unix_ms":1700000000123,"ttft_s":0.250000001,"ttfc_s":0.2,"tpot_s":0.020000003,"choice_tpot_s":[0.010000001,0.020000003],"e2e_s":1.234567891,"itl_count":9,"itl_max_s":0.04,"prompt_tokens":5,"completion_tokens":10,"tokens_exact":true,"usage_injected":true,"usage_stripped":true,"engine_queue_s":0.020000001,"engine_ttft_s":0.030000002,"engine_decode_s":0.400000003,"engine_mean_itl_s":0.044444445,"cached_prompt_tokens":128,"ttft_proxy_s":0.001,"ttft_queue_s":0.020000001,"ttft_prefill_s":0.030000002,"ttft_rest_s":0.198999998,"ttft_split_clamped":false,"stalls":1,"agent":{"ttf_reasoning_s":0.100000001,"ttf_answer_s":0.3,"ttf_tool_call_s":0.200000002,"tool_call_s":0.050000003,"reasoning_tokens":4,"tool_calls":1,"tool_call_outcome":"schema_violation","tool_call_violation":"/unit: not one of"},"logprobs":{"tokens":10,"mean":-1.25,"min":-4.5,"min_at":3,"largest_drop":3.0,"largest_drop_at":3,"tool_call_min":-2.0},"trace":{"events":[],"kept_tokens":0,"dropped_tokens":0},"slo":{"ttft_ok":true,"tpot_ok":true,"e2e_ok":true,"tool_calls_ok":false,"stall_ok":true,"good":false},"instance":"proxy-a","tenant":"team-a","route_reason":"prefix_hit","retried_from":["http://u:2"]}"#;
    const GOLDEN_ROW: &str = r#"{"agent_reasoning_tokens":4,"agent_tool_call_ns":50000003,"agent_tool_call_outcome":"schema_violation","agent_tool_call_violation":"/unit: not one of","agent_tool_calls":1,"agent_ttf_answer_ns":300000000,"agent_ttf_reasoning_ns":100000001,"agent_ttf_tool_call_ns":200000002,"cached_prompt_tokens":128,"choice_tpot_ns":[10000001,20000003],"completion_tokens":10,"e2e_ns":1234567891,"engine_decode_ns":400000003,"engine_mean_itl_ns":44444445,"engine_queue_ns":20000001,"engine_ttft_ns":30000002,"finish_reason":"stop","id":"req-1","instance":"proxy-a","itl_count":9,"itl_max_ns":40000000,"logprobs_largest_drop":3.0,"logprobs_largest_drop_at":3,"logprobs_mean":-1.25,"logprobs_min":-4.5,"logprobs_min_at":3,"logprobs_tokens":10,"logprobs_tool_call_min":-2.0,"model":"tiny","outcome":"success","prompt_tokens":5,"retried_from":["http://u:2"],"route_reason":"prefix_hit","slo_e2e_ok":true,"slo_good":false,"slo_stall_ok":true,"slo_tool_calls_ok":false,"slo_tpot_ok":true,"slo_ttft_ok":true,"stalls":1,"start_unix_ms":1700000000123,"status":200,"stream":true,"tenant":"team-a","tokens_exact":true,"tpot_ns":20000003,"ttfc_ns":200000000,"ttft_ns":250000001,"ttft_prefill_ns":30000002,"ttft_proxy_ns":1000000,"ttft_queue_ns":20000001,"ttft_rest_ns":198999998,"ttft_split_clamped":false,"uid":"u-1","upstream":"http://u:1","usage_injected":true,"usage_stripped":true}"#;

    /// Keys in document order, nested ones as `parent.key`.
    fn keys(v: &Value, prefix: &str, out: &mut Vec<String>) {
        if let Value::Object(m) = v {
            for (k, inner) in m {
                let path = format!("{prefix}{k}");
                keys(inner, &format!("{path}."), out);
                out.push(path);
            }
        }
    }

    #[test]
    fn the_stored_record_is_byte_identical_to_the_golden_one() {
        let mut rec = full_record();
        rec.measured.trace = Some(std::sync::Arc::new(Trace::default()));
        let line = serde_json::to_string(&rec).unwrap();
        let (got, want): (Value, Value) = (
            serde_json::from_str(&line).unwrap(),
            serde_json::from_str(GOLDEN_JSONL).unwrap(),
        );
        assert_eq!(got, want, "{line}");
        let (mut got_keys, mut want_keys) = (Vec::new(), Vec::new());
        keys(&got, "", &mut got_keys);
        keys(&want, "", &mut want_keys);
        got_keys.sort();
        want_keys.sort();
        assert_eq!(got_keys, want_keys);
        // Every value as written (numbers byte for byte, not only as equal floats).
        for (k, v) in want
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| !v.is_object())
        {
            assert!(
                line.contains(&format!("\"{k}\":{v}")),
                "{k}: {v} not written as before in {line}"
            );
        }
        let mut out = Vec::new();
        write_row(&rec, "u-1", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap().trim_end(),
            GOLDEN_ROW,
            "the ClickHouse row"
        );
        // And it reads back as the same record (the load generator reads the JSONL sink).
        let back: RequestRecord = serde_json::from_str(&line).unwrap();
        let mut want_back = rec.clone();
        want_back.end = back.end;
        assert_eq!(back, want_back);
    }
}
