//! Agent traffic behind the proxy: the simulator streams tool calls of each kind and
//! reasoning deltas; the proxy's records carry the phases and the tool-call outcome judged
//! against the request's `tools` schema, its metrics count them, and an invalid call makes the
//! request not good.

use crate::support::meter::*;
use crate::support::prom::metric;
use crate::support::proxy::*;
use goodput_sim::SimConfig;

const TOOLS: &str = r#","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_and_reasoning_are_judged_and_timed() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let (config, path) = meter_config_with_sink(&sim.base_url(), "meter-agent");
    let proxy = start_proxy(config).await;
    let c = client();
    let cases = [
        ("tool-call=valid", TOOLS, "valid", true),
        ("tool-call=invalid-json", TOOLS, "invalid_json", false),
        (
            "tool-call=schema-violation",
            TOOLS,
            "schema_violation",
            false,
        ),
        ("reasoning=3", "", "", true),
    ];
    for (i, (fault, extra, _, _)) in cases.iter().enumerate() {
        let mut req = with_fault(post_json(&proxy.url(CHAT), &chat_body(200, extra)), fault);
        req.headers_mut()
            .insert("x-request-id", format!("agent-{i}").parse().unwrap());
        observe(&c, req, true).await;
    }
    wait_requests(&proxy, cases.len() as u64).await;
    let records = sink_records(&path, cases.len()).await;
    for (i, (fault, _, outcome, good)) in cases.iter().enumerate() {
        let r = records
            .iter()
            .find(|r| r["id"] == format!("agent-{i}"))
            .unwrap();
        let a = &r["agent"];
        assert_eq!(r["outcome"], "success", "{fault}: {r}");
        assert_eq!(r["slo"]["good"], *good, "{fault}: {r}");
        if outcome.is_empty() {
            // Reasoning: 3 reasoning events, then the answer.
            assert_eq!(a["reasoning_tokens"], 3, "{r}");
            let (tr, ta) = (a["ttf_reasoning_s"].as_f64(), a["ttf_answer_s"].as_f64());
            assert!(tr.unwrap() < ta.unwrap(), "{r}");
            assert_eq!(a["tool_calls"], 0, "{r}");
            continue;
        }
        assert_eq!(a["tool_calls"], 1, "{fault}: {r}");
        assert_eq!(a["tool_call_outcome"], *outcome, "{fault}: {r}");
        assert!(a["ttf_tool_call_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(a["tool_call_s"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["slo"]["tool_calls_ok"], *good, "{r}");
        if *outcome == "schema_violation" {
            let why = a["tool_call_violation"].as_str().unwrap();
            assert!(why.starts_with("/unit: "), "{why}");
        }
    }
    let m = metrics(&proxy).await;
    for label in [
        "tool_call_valid",
        "tool_call_invalid_json",
        "tool_call_schema_violation",
    ] {
        let n = metric(
            &m,
            "goodput_proxy_tool_calls_total",
            &[("model", "tiny"), ("outcome", label)],
        );
        assert_eq!(n, 1.0, "{label}");
    }
    let n = metric(
        &m,
        "goodput_proxy_reasoning_tokens_total",
        &[("model", "tiny")],
    );
    assert_eq!(n, 3.0);
    let n = metric(
        &m,
        "goodput_proxy_time_to_first_tool_call_token_seconds_count",
        &[("model", "tiny")],
    );
    assert_eq!(n, 3.0);
    let n = metric(
        &m,
        "goodput_proxy_slo_violations_total",
        &[("model", "tiny"), ("slo", "tool_calls")],
    );
    assert_eq!(n, 2.0);
    // /stats: exact phase percentiles and the requests per tool-call outcome.
    let s = stats(&proxy, "window=600").await;
    let calls = &s["tool_calls"];
    for (k, n) in [
        ("valid", 1),
        ("invalid_json", 1),
        ("schema_violation", 1),
        ("unknown_function", 0),
    ] {
        assert_eq!(calls[k], n, "{k}: {s}");
    }
    let count = |k: &str| s[k]["count"].as_u64();
    assert_eq!(
        count("time_to_first_tool_call_token_seconds"),
        Some(3),
        "{s}"
    );
    assert_eq!(count("tool_call_duration_seconds"), Some(3), "{s}");
    assert_eq!(
        count("time_to_first_reasoning_token_seconds"),
        Some(1),
        "{s}"
    );
    let tr = s["time_to_first_reasoning_token_seconds"]["p50"]
        .as_f64()
        .unwrap();
    let ta = s["time_to_first_answer_token_seconds"]["max"]
        .as_f64()
        .unwrap();
    assert!(tr > 0.0 && ta >= tr, "{s}");
    sim.shutdown().await;
}

/// Non-streaming answers: the simulator puts the call into `message.tool_calls` (and
/// reasoning into `message.reasoning`) as vLLM does; the proxy judges each call in the JSON body
/// against the request's `tools`, with no phase timings (nothing the client saw tells when a
/// token came), counts them, and an invalid call makes the request not good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_tool_calls_are_judged() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let (config, path) = meter_config_with_sink(&sim.base_url(), "meter-agent-json");
    let proxy = start_proxy(config).await;
    let c = client();
    let cases = [
        ("tool-call=valid", "valid", true),
        ("tool-call=invalid-json", "invalid_json", false),
        ("tool-call=schema-violation", "schema_violation", false),
        ("reasoning=3,tool-call=valid", "valid", true),
    ];
    let mut bodies = Vec::new();
    for (i, (fault, _, _)) in cases.iter().enumerate() {
        let body = chat_body(200, TOOLS).replace(r#""stream":true"#, r#""stream":false"#);
        let mut req = with_fault(post_json(&proxy.url(CHAT), &body), fault);
        req.headers_mut()
            .insert("x-request-id", format!("json-{i}").parse().unwrap());
        let seen = observe(&c, req, false).await;
        assert_eq!(seen.status, 200, "{fault}");
        bodies.push(serde_json::from_slice::<serde_json::Value>(&seen.body).unwrap());
    }
    wait_requests(&proxy, cases.len() as u64).await;
    let records = sink_records(&path, cases.len()).await;
    for (i, (fault, outcome, good)) in cases.iter().enumerate() {
        // What the client got: vLLM's message shape for a named tool_choice.
        let msg = &bodies[i]["choices"][0]["message"];
        assert_eq!(msg["content"], "", "{fault}: {msg}");
        let call = &msg["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{msg}");
        assert!(call["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
        assert_eq!(bodies[i]["choices"][0]["finish_reason"], "stop");
        let r = records
            .iter()
            .find(|r| r["id"] == format!("json-{i}"))
            .unwrap();
        let a = &r["agent"];
        assert_eq!(r["outcome"], "success", "{fault}: {r}");
        assert_eq!(r["slo"]["good"], *good, "{fault}: {r}");
        assert_eq!(a["tool_calls"], 1, "{fault}: {r}");
        assert_eq!(a["tool_call_outcome"], *outcome, "{fault}: {r}");
        assert!(
            a["ttf_tool_call_s"].is_null() && a["tool_call_s"].is_null(),
            "{r}"
        );
        if fault.starts_with("reasoning=") {
            assert_eq!(
                msg["reasoning"].as_str().map(str::is_empty),
                Some(false),
                "{msg}"
            );
            assert_eq!(a["reasoning_tokens"], 3, "{r}");
        } else {
            assert!(msg["reasoning"].is_null(), "{msg}");
        }
        if *outcome == "schema_violation" {
            let why = a["tool_call_violation"].as_str().unwrap();
            assert!(why.starts_with("/unit: "), "{why}");
        }
    }
    let m = metrics(&proxy).await;
    for (label, want) in [
        ("tool_call_valid", 2.0),
        ("tool_call_invalid_json", 1.0),
        ("tool_call_schema_violation", 1.0),
    ] {
        let n = metric(
            &m,
            "goodput_proxy_tool_calls_total",
            &[("model", "tiny"), ("outcome", label)],
        );
        assert_eq!(n, want, "{label}");
    }
    let s = stats(&proxy, "window=600").await;
    for (k, n) in [("valid", 2), ("invalid_json", 1), ("schema_violation", 1)] {
        assert_eq!(s["tool_calls"][k], n, "{k}: {s}");
    }
    sim.shutdown().await;
}
