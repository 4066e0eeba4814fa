//! Engines' streams through the proxy: usage an engine adds unasked (SGLang's
//! `--stream-response-default-include-usage`) reaches the client as it would straight from the
//! engine when the replica is listed in `engine.usage_unasked`, and the record counts it
//! exactly; llama.cpp's `timings` reach the client where the engine puts them, whether the
//! proxy knows the replica is llama.cpp (no injection) or not yet (injected usage stripped,
//! `timings` moved back), and count the tokens exactly. For a replica detected as SGLang the
//! proxy learns from one stream it leaves alone whether the engine adds usage unasked.

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_sim::{Personality, SimConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_the_engine_adds_unasked_is_never_stripped() {
    let sim = start_sim(SimConfig {
        personality: Personality::Sglang,
        stream_response_default_include_usage: true,
        seed: 3,
        ..SimConfig::with_timing(1.0, 0.5)
    })
    .await;
    let mut config = meter_config(&sim.base_url());
    config.engine.usage_unasked = vec![sim.base_url()];
    let proxy = start_proxy(config).await;
    let c = client();
    // No stream_options: the proxy injects include_usage, the engine would have sent it anyway.
    let body = chat_body(12, r#","seed":1"#);
    let direct = observe(
        &c,
        post_json(&format!("{}{CHAT}", sim.base_url()), &body),
        true,
    )
    .await;
    let via = observe(&c, post_json(&proxy.url(CHAT), &body), true).await;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let tail = |s: &str| s[s.len().saturating_sub(700)..].to_string();
    assert!(
        text(&direct.body).contains("\"usage\""),
        "{}",
        text(&direct.body)
    );
    assert!(
        via.body == direct.body,
        "proxy vs engine (ends):\n{}\n---\n{}",
        tail(&text(&via.body)),
        tail(&text(&direct.body))
    );
    let page = metrics(&proxy).await;
    assert_eq!(
        metric(&page, "goodput_proxy_generation_tokens_total", &[]),
        12.0
    );
    sim.shutdown().await;
}

/// Every value inside `"timings":{...}` masked (the engine's clocks differ per response).
fn mask_timings(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::new();
    let mut rest: &str = &text;
    while let Some(at) = rest.find("\"timings\":{") {
        let end = at + rest[at..].find('}').expect("timings close");
        out.push_str(&rest[..at]);
        out.push_str("\"timings\":{T}");
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_timings_reach_the_client_and_count_the_tokens() {
    let sim = start_sim(SimConfig {
        personality: Personality::Llamacpp,
        seed: 5,
        ..SimConfig::with_timing(1.0, 0.5)
    })
    .await;
    let c = client();
    let bodies = [
        chat_body(9, r#","seed":1"#),
        chat_body(9, r#","seed":1,"stream_options":{"include_usage":false}"#),
        chat_body(9, r#","seed":1,"stream_options":{"include_usage":true}"#),
        r#"{"model":"tiny","prompt":"Once upon","stream":true,"max_tokens":9,"seed":5}"#
            .to_string(),
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"seed":6}"#
            .to_string(),
    ];
    // Known (configured; detection sets the same) and not known (no scrape: the proxy injects
    // usage, and the strip moves `timings` back to the finish chunk).
    for known in [true, false] {
        let tag = if known {
            "llamacpp-known"
        } else {
            "llamacpp-unknown"
        };
        let (mut config, sink) = meter_config_with_sink(&sim.base_url(), tag);
        if known {
            config.engine.kind = "llamacpp".into();
        } else {
            config.engine.scrape = false;
        }
        let proxy = start_proxy(config).await;
        for body in &bodies {
            let path = if body.contains("\"prompt\"") {
                COMPL
            } else {
                CHAT
            };
            let stream = body.contains("\"stream\":true");
            let direct = observe(
                &c,
                post_json(&format!("{}{path}", sim.base_url()), body),
                stream,
            )
            .await;
            assert!(
                mask_timings(&direct.body).contains("\"timings\":{T}"),
                "the engine sends timings: {}",
                mask_timings(&direct.body)
            );
            let via = observe(&c, post_json(&proxy.url(path), body), stream).await;
            assert_eq!(via.status, direct.status, "{tag}: {body}");
            assert_eq!(
                mask_timings(&via.body),
                mask_timings(&direct.body),
                "{tag}: {body}"
            );
        }
        let records = sink_records(&sink, bodies.len()).await;
        for (i, r) in records.iter().enumerate() {
            // Streams whose client asked for no usage (all but the one that asked and the
            // JSON one) are injected only while the engine is not known; tokens are exact
            // either way (`timings`, or the injected usage), and the engine's view comes from
            // `timings`.
            let unasked = i != 2 && i != 4;
            assert_eq!(r["usage_injected"], unasked && !known, "{tag} {i}: {r}");
            assert_eq!(r["tokens_exact"], true, "{tag} {i}: {r}");
            assert_eq!(r["outcome"], "success", "{tag} {i}: {r}");
            if i < 3 {
                assert_eq!(r["completion_tokens"], 9, "{tag} {i}: {r}");
            }
            assert!(r["engine_ttft_s"].as_f64().is_some(), "{tag} {i}: {r}");
            assert!(r["engine_decode_s"].as_f64().is_some(), "{tag} {i}: {r}");
            assert!(r["engine_queue_s"].is_null(), "{tag} {i}: {r}");
            if i != 4 {
                // The TTFT split in three (llama.cpp times no queue): the parts add up.
                let part = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
                let sum = part("ttft_proxy_s") + part("ttft_prefill_s") + part("ttft_rest_s");
                assert!((sum - part("ttft_s")).abs() < 1e-6, "{tag} {i}: {r}");
                assert!(r["ttft_queue_s"].is_null(), "{tag} {i}: {r}");
            }
        }
    }
    sim.shutdown().await;
}

/// Waits until the proxy read `kind` from the replica's page.
async fn detected(proxy: &Proxy, url: &str, kind: &str) {
    let deadline = tokio::time::Instant::now() + SLOW;
    loop {
        let m = metrics(proxy).await;
        let labels = [("upstream", url), ("kind", kind)];
        if try_metric(&m, "goodput_proxy_engine_kind", &labels) == Some(1.0) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{kind} not detected:\n{m}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_unasked_usage_is_learned_from_the_stream() {
    let c = client();
    for adds in [true, false] {
        let sim = start_sim(SimConfig {
            personality: Personality::Sglang,
            stream_response_default_include_usage: adds,
            seed: 3,
            ..SimConfig::with_timing(1.0, 0.5)
        })
        .await;
        let tag = if adds { "sglang-adds" } else { "sglang-plain" };
        let (mut config, sink) = meter_config_with_sink(&sim.base_url(), tag);
        config.engine.scrape_interval_ms = 100;
        let proxy = start_proxy(config).await;
        detected(&proxy, &sim.base_url(), "sglang").await;
        let body = chat_body(12, r#","seed":1"#);
        for i in 0..3 {
            let direct = observe(
                &c,
                post_json(&format!("{}{CHAT}", sim.base_url()), &body),
                true,
            )
            .await;
            let via = observe(&c, post_json(&proxy.url(CHAT), &body), true).await;
            assert_eq!(
                String::from_utf8_lossy(&via.body),
                String::from_utf8_lossy(&direct.body),
                "{tag}"
            );
            // Recorded (and so learned from) before the next request goes.
            sink_lines(&sink, i + 1).await;
        }
        let records = sink_records(&sink, 3).await;
        // The first stream is left alone and tells; then an engine that adds usage is never
        // injected (its usage is the client's), one that does not is injected and stripped.
        let injected: Vec<bool> = records
            .iter()
            .map(|r| r["usage_injected"] == true)
            .collect();
        let exact: Vec<bool> = records.iter().map(|r| r["tokens_exact"] == true).collect();
        if adds {
            assert_eq!(injected, [false, false, false], "{tag}");
            assert_eq!(exact, [true, true, true], "{tag}");
        } else {
            assert_eq!(injected, [false, true, true], "{tag}");
            assert_eq!(exact, [false, true, true], "{tag}");
        }
        sim.shutdown().await;
    }
}

/// llama-server started without `--metrics`: its `/metrics` answers 501, so no page tells the
/// engine, but every answer carries `Server: llama.cpp`. The replica is read as llama.cpp (its
/// kind series, no queue series, scrapes counted as failed) and its streams are left as the
/// client wrote them: no usage injected, the engine's bytes reach the client unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_without_metrics_is_known_by_its_server_header() {
    let sim = start_sim(SimConfig {
        personality: Personality::Llamacpp,
        metrics_off: true,
        seed: 5,
        ..SimConfig::with_timing(1.0, 0.5)
    })
    .await;
    let url = sim.base_url();
    let (mut config, sink) = meter_config_with_sink(&url, "llamacpp-no-metrics");
    config.engine.scrape_interval_ms = 100;
    let proxy = start_proxy(config).await;
    detected(&proxy, &url, "llamacpp").await;
    let m = metrics(&proxy).await;
    let up = [("upstream", url.as_str())];
    assert_eq!(metric(&m, "goodput_proxy_engine_up", &up), 0.0, "{m}");
    assert!(metric(&m, "goodput_proxy_engine_scrape_errors_total", &up) >= 1.0);
    assert_eq!(
        try_metric(&m, "goodput_proxy_upstream_queue_depth", &up),
        None,
        "no page, no queue (never a 0 that means unknown)"
    );
    let c = client();
    let body = chat_body(9, r#","seed":1"#);
    let direct = observe(&c, post_json(&format!("{url}{CHAT}"), &body), true).await;
    let via = observe(&c, post_json(&proxy.url(CHAT), &body), true).await;
    assert_eq!(mask_timings(&via.body), mask_timings(&direct.body));
    let records = sink_records(&sink, 1).await;
    let r = &records[0];
    assert_eq!(r["usage_injected"], false, "{r}");
    assert_eq!(r["tokens_exact"], true, "{r}");
    assert_eq!(r["completion_tokens"], 9, "{r}");
    sim.shutdown().await;
}

/// `"time_ms":N` of every `prompt_progress` masked (the slot's clock, in whole milliseconds).
fn mask_progress_time(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("\"time_ms\":") {
        let digits = at + "\"time_ms\":".len();
        let end = digits
            + rest[digits..]
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len() - digits);
        out.push_str(&rest[..digits]);
        out.push('T');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// llama.cpp's `prompt_progress` chunks (`"return_progress": true`): one when the slot takes
/// the task, one per prompt batch of 2048 tokens, all before the first token; each carries a
/// choices entry (a role delta, `content: null`) but no output. Through the proxy they reach
/// the client unchanged; the first of them is the first chunk (TTFC), TTFT starts only at the
/// first token, and none counts as output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_progress_chunks_never_start_ttft() {
    let sim = start_sim(SimConfig {
        personality: Personality::Llamacpp,
        max_model_len: 32_768,
        // Every request decodes its whole prompt (the same chunks direct and through the proxy).
        enable_prefix_caching: false,
        seed: 5,
        ..SimConfig::with_timing(400.0, 2.0)
    })
    .await;
    let url = sim.base_url();
    let (mut config, sink) = meter_config_with_sink(&url, "llamacpp-progress");
    config.engine.kind = "llamacpp".into();
    let proxy = start_proxy(config).await;
    let c = client();
    let prompt = "word ".repeat(5000);
    let body = format!(
        r#"{{"model":"tiny","messages":[{{"role":"user","content":"{prompt}"}}],"stream":true,"max_tokens":6,"seed":1,"return_progress":true}}"#
    );
    let direct = observe(&c, post_json(&format!("{url}{CHAT}"), &body), true).await;
    let via = observe(&c, post_json(&proxy.url(CHAT), &body), true).await;
    let text = String::from_utf8_lossy(&direct.body).into_owned();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let progress: Vec<serde_json::Value> = events
        .iter()
        .filter(|e| e.contains("\"prompt_progress\""))
        .map(|e| serde_json::from_str(e.trim_start_matches("data: ")).unwrap())
        .collect();
    let total = progress[0]["prompt_progress"]["total"].as_u64().unwrap();
    assert!(total > 2 * 2048, "a prompt of three batches: {total}");
    assert_eq!(progress.len() as u64, 1 + total.div_ceil(2048), "{text}");
    for (i, p) in progress.iter().enumerate() {
        let processed = p["prompt_progress"]["processed"].as_u64().unwrap();
        assert_eq!(processed, (i as u64 * 2048).min(total), "{p}");
        assert_eq!(p["choices"][0]["delta"]["content"], serde_json::Value::Null);
        assert_eq!(p["choices"][0]["delta"]["role"], "assistant");
    }
    // All before the first token.
    let first_output = events
        .iter()
        .position(|e| e.contains("\"content\":\"") && !e.contains("\"content\":\"\""))
        .expect("output");
    let last_progress = events
        .iter()
        .rposition(|e| e.contains("\"prompt_progress\""))
        .unwrap();
    assert!(last_progress < first_output, "{text}");
    assert_eq!(
        mask_progress_time(&mask_timings(&via.body)),
        mask_progress_time(&mask_timings(&direct.body))
    );
    let records = sink_records(&sink, 1).await;
    let r = &records[0];
    let (ttft, ttfc) = (r["ttft_s"].as_f64().unwrap(), r["ttfc_s"].as_f64().unwrap());
    // The prefill takes ~400 ms; the first progress chunk comes as the slot takes the task.
    assert!(ttft >= 0.3, "TTFT at the first token: {r}");
    assert!(ttfc < ttft - 0.2, "TTFC at the first progress chunk: {r}");
    assert_eq!(r["completion_tokens"], 6, "{r}");
    assert_eq!(r["tokens_exact"], true, "{r}");
    assert_eq!(r["outcome"], "success", "{r}");
    sim.shutdown().await;
}
