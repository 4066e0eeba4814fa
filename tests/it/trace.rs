//! Token-level traces: `x-goodput-trace: 1` or `[trace] sample_rate` traces a
//! stream; admin `GET /trace/<request-id>` returns every token with its offset from t0 and its
//! logprob while the trace is kept (a 404 in the OpenAI error shape otherwise); the JSONL sink
//! gets the record with its trace; the header never reaches the engine and the client's
//! bytes are the engine's.

use serde_json::Value;

use crate::support::meter::*;
use crate::support::proxy::*;
use goodput_measure::record::RequestRecord;
use goodput_sim::SimConfig;

const LOGPROBS: &str =
    r#","logprobs":true,"top_logprobs":2,"seed":7,"stream_options":{"include_usage":true}"#;

fn traced(
    url: &str,
    id: &str,
    max_tokens: u32,
    ask: bool,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut req = post_json(url, &chat_body(max_tokens, LOGPROBS));
    let h = req.headers_mut();
    h.insert("x-request-id", id.parse().unwrap());
    if ask {
        h.insert("x-goodput-trace", "1".parse().unwrap());
    }
    req
}

/// `GET /trace/<id>`: status and JSON body.
async fn trace_of(proxy: &Proxy, id: &str) -> (u16, Value) {
    let (parts, body) = send(&client(), get(&proxy.admin_url(&format!("/trace/{id}")))).await;
    let status = parts.status.as_u16();
    if status != 200 {
        assert_openai_error(status, &body);
    }
    (status, serde_json::from_slice(&body).unwrap())
}

/// The data payloads of an SSE body as JSON, without the per-request `id` and `created`.
fn payloads(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let mut v: Value = serde_json::from_str(d).unwrap();
            if let Some(o) = v.as_object_mut() {
                o.remove("id");
                o.remove("created");
            }
            v
        })
        .collect()
}

/// Every `logprobs.content` entry the client got: (token, logprob, alternatives).
fn client_tokens(body: &[u8]) -> Vec<(String, f64, usize)> {
    payloads(body)
        .iter()
        .flat_map(|p| p["choices"].as_array().cloned().unwrap_or_default())
        .flat_map(|c| {
            c["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|e| {
            let top = e["top_logprobs"].as_array().map_or(0, Vec::len);
            (
                e["token"].as_str().unwrap().to_string(),
                e["logprob"].as_f64().unwrap(),
                top,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_logprobs_stream_has_every_token_with_offset_and_logprob() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let (config, path) = meter_config_with_sink(&sim.base_url(), "trace");
    let proxy = start_proxy(config).await;
    let c = client();

    let seen = observe(&c, traced(&proxy.url(CHAT), "trace-1", 12, true), true).await;
    assert_eq!(seen.status, 200);
    // What the engine sends directly: the same events (ids and timestamps aside).
    let direct = observe(
        &c,
        traced(&format!("{}{CHAT}", sim.base_url()), "direct", 12, false),
        true,
    )
    .await;
    assert_eq!(
        payloads(&seen.body),
        payloads(&direct.body),
        "the client's bytes are the engine's"
    );
    wait_requests(&proxy, 1).await;

    let (status, doc) = trace_of(&proxy, "trace-1").await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["id"], "trace-1");
    let record = &doc["record"];
    let e2e = record["e2e_s"].as_f64().unwrap();
    let want = client_tokens(&seen.body);
    assert_eq!(
        want.len() as u64,
        record["completion_tokens"].as_u64().unwrap(),
        "{record}"
    );
    let events = doc["trace"]["events"].as_array().unwrap();
    let mut got = Vec::new();
    let mut last = 0.0;
    for e in events {
        let offset = e["offset_s"].as_f64().unwrap();
        assert!(
            offset >= last && offset <= e2e,
            "offsets from t0, in order: {e}"
        );
        last = offset;
        assert_eq!(e["phase"], "answer", "{e}");
        assert!(e["text_len"].as_u64().unwrap() > 0, "{e}");
        for t in e["tokens"].as_array().unwrap() {
            let top = t["top"].as_array().map_or(0, Vec::len);
            got.push((
                t["token"].as_str().unwrap().to_string(),
                t["logprob"].as_f64().unwrap(),
                top,
            ));
        }
    }
    assert_eq!(got, want, "every token, with its logprob and alternatives");
    assert!(want.iter().all(|t| t.2 == 2));
    assert_eq!(doc["trace"]["dropped_tokens"], 0);
    // The TTFT is the first event's offset (both from t0).
    let first = events[0]["offset_s"].as_f64().unwrap();
    assert_eq!(Some(first), record["ttft_s"].as_f64(), "{record}");

    // The summary on the record.
    let lps: Vec<f64> = want.iter().map(|t| t.1).collect();
    let s = &record["logprobs"];
    let min = lps.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(s["min"].as_f64(), Some(min), "{s}");
    assert_eq!(s["tokens"].as_u64(), Some(lps.len() as u64));
    assert_eq!(lps[s["min_at"].as_u64().unwrap() as usize], min);
    assert!(
        record.get("trace").is_none(),
        "/trace returns the record and its trace apart"
    );

    // The JSONL line carries the trace and reads back as a RequestRecord.
    let line: RequestRecord = serde_json::from_str(&sink_lines(&path, 1).await[0]).unwrap();
    let t = line.measured.trace.expect("the trace in the sink");
    assert_eq!(t.tokens().count(), want.len());
    assert_eq!(line.measured.logprobs.map(|s| s.min), Some(min));
}

#[tokio::test]
async fn the_trace_header_is_not_forwarded() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let mut req = post_json(
        &proxy.url("/v1/completions"),
        r#"{"model":"m","prompt":"hi"}"#,
    );
    req.headers_mut()
        .insert("x-fake-echo", "1".parse().unwrap());
    req.headers_mut()
        .insert("x-goodput-trace", "1".parse().unwrap());
    let (parts, body) = send(&client(), req).await;
    assert_eq!(parts.status, 200);
    let echo: Value = serde_json::from_slice(&body).unwrap();
    let seen: Vec<(String, String)> = serde_json::from_value(echo["headers"].clone()).unwrap();
    assert!(seen.iter().any(|(k, _)| k == "x-fake-echo"), "{seen:?}");
    assert!(
        !seen.iter().any(|(k, _)| k == "x-goodput-trace"),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_at_one_traces_every_stream_and_at_zero_none() {
    let sim = start_sim(SimConfig::with_timing(1.0, 0.2)).await;
    for (rate, kept) in [(1.0, true), (0.0, false)] {
        let mut config = meter_config(&sim.base_url());
        config.trace.sample_rate = rate;
        let proxy = start_proxy(config).await;
        let c = client();
        for i in 0..3 {
            let seen = observe(
                &c,
                traced(&proxy.url(CHAT), &format!("s{i}"), 4, false),
                true,
            )
            .await;
            assert_eq!(seen.status, 200);
        }
        wait_requests(&proxy, 3).await;
        for i in 0..3 {
            let (status, doc) = trace_of(&proxy, &format!("s{i}")).await;
            assert_eq!(status == 200, kept, "rate {rate}: {doc}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_trace_and_traces_kept_are_bounded() {
    let sim = start_sim(SimConfig::with_timing(1.0, 0.2)).await;
    let mut config = meter_config(&sim.base_url());
    config.trace.max_tokens = 5;
    config.trace.max_traces = 2;
    let proxy = start_proxy(config).await;
    let c = client();
    for i in 0..3 {
        observe(
            &c,
            traced(&proxy.url(CHAT), &format!("b{i}"), 12, true),
            true,
        )
        .await;
    }
    wait_requests(&proxy, 3).await;
    let (status, _) = trace_of(&proxy, "b0").await;
    assert_eq!(
        status, 404,
        "the oldest of three traces went (max_traces = 2)"
    );
    for id in ["b1", "b2"] {
        let (status, doc) = trace_of(&proxy, id).await;
        assert_eq!(status, 200, "{doc}");
        let t = &doc["trace"];
        assert_eq!(t["kept_tokens"], 5, "{t}");
        let kept: usize = t["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["tokens"].as_array().unwrap().len())
            .sum();
        assert_eq!(kept, 5);
        assert_eq!(t["dropped_tokens"], 7, "12 tokens, 5 kept: {t}");
        // The summary still covers every token.
        assert_eq!(doc["record"]["logprobs"]["tokens"], 12);
    }
    let (status, doc) = trace_of(&proxy, "never-sent%2Fx").await;
    assert_eq!(status, 404);
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("never-sent/x"),
        "{doc}"
    );
}
