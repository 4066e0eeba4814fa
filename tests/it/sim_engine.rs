//! The engine: disconnects free slots at once, queueing beyond max_num_seqs, KV usage, and
//! /metrics agreeing with the requests served.

use std::time::Duration;

use crate::support::prom::sample;
use crate::support::raw_http::*;
use goodput_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";

fn long_stream(max_tokens: u32) -> String {
    format!(
        r#"{{"model":"tiny","messages":[{{"role":"user","content":"Hello"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    )
}

/// Opens a stream and reads until `events` SSE events have arrived; returns the socket.
async fn open_stream(addr: std::net::SocketAddr, body: &str, events: usize) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request_bytes("POST", CHAT, &[], body))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while memchr::memmem::find_iter(&seen, b"\n\n").count() < events {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

#[tokio::test]
async fn client_disconnect_mid_stream_frees_the_slot_within_100ms() {
    let sim = start(SimConfig::with_timing(0.0, 20.0)).await;
    let s = open_stream(sim.local_addr(), &long_stream(2000), 3).await;
    assert_eq!(sim.running(), 1);
    drop(s);
    let t = tokio::time::Instant::now();
    assert!(
        eventually(Duration::from_millis(100), || sim.running() == 0).await,
        "slot still held after {:?}",
        t.elapsed()
    );
    assert!(eventually(Duration::from_millis(100), || sim.requests_aborted() == 1).await);
    assert_eq!(sim.requests_served(), 0);
    // Like vLLM: no success count and no e2e sample for a client abort, but TTFT was recorded.
    let m = sim.metrics_text();
    assert_eq!(
        sample(
            &m,
            "vllm:e2e_request_latency_seconds_count{engine=\"0\",model_name=\"tiny\"}"
        ),
        0.0
    );
    assert_eq!(
        sample(
            &m,
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"tiny\"}"
        ),
        1.0
    );
    assert_eq!(sample(&m, "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"tiny\"}"), 0.0);
    assert_eq!(
        sample(
            &m,
            "vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"}"
        ),
        0.0
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_of_a_non_streaming_request_frees_the_slot() {
    let sim = start(SimConfig::with_timing(0.0, 20.0)).await;
    let mut s = TcpStream::connect(sim.local_addr()).await.unwrap();
    let body =
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":2000}"#;
    s.write_all(&request_bytes("POST", CHAT, &[], body))
        .await
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || sim.running() == 1).await);
    drop(s);
    assert!(sim.wait_idle(Duration::from_millis(100)).await);
    sim.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_max_num_seqs_wait_fifo_and_a_waiter_can_leave() {
    let cfg = SimConfig {
        max_num_seqs: 2,
        ..SimConfig::with_timing(0.0, 10.0)
    };
    let sim = start(cfg).await;
    let a = sim.local_addr();
    let s1 = open_stream(a, &long_stream(2000), 2).await;
    let s2 = open_stream(a, &long_stream(2000), 2).await;
    assert_eq!((sim.running(), sim.waiting()), (2, 0));
    // The third waits: headers come at once (as from vLLM), tokens only after a slot frees.
    let mut s3 = TcpStream::connect(a).await.unwrap();
    s3.write_all(&request_bytes("POST", CHAT, &[], &long_stream(3)))
        .await
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || sim.waiting() == 1).await);
    assert_eq!(sim.running(), 2);
    let m = sim.metrics_text();
    assert_eq!(
        sample(
            &m,
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"}"
        ),
        1.0
    );
    // A fourth waits behind it and then leaves the queue: the waiting count drops at once.
    let mut s4 = TcpStream::connect(a).await.unwrap();
    s4.write_all(&request_bytes("POST", CHAT, &[], &long_stream(3)))
        .await
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || sim.waiting() == 2).await);
    drop(s4);
    assert!(eventually(Duration::from_millis(100), || sim.waiting() == 1).await);
    // Free one slot: the queued request runs to completion.
    drop(s1);
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s3.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let r = parse(&out);
    assert!(r.complete);
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    assert_eq!(sim.waiting(), 0);
    drop(s2);
    assert!(eventually(Duration::from_millis(200), || sim.running() == 0).await);
    let m = sim.metrics_text();
    let queue_sum = sample(
        &m,
        "vllm:request_queue_time_seconds_sum{engine=\"0\",model_name=\"tiny\"}",
    );
    assert!(queue_sum > 0.0, "queued request shows queue time");
    sim.shutdown().await;
}

#[tokio::test]
async fn kv_cache_usage_follows_tokens_held() {
    // Usage counts whole blocks, as vLLM's does: small blocks make growth visible.
    let cfg = SimConfig {
        kv_cache_tokens: 100,
        block_size: 4,
        ..SimConfig::with_timing(0.0, 10.0)
    };
    let sim = start(cfg).await;
    let series = "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"}";
    assert_eq!(sample(&sim.metrics_text(), series), 0.0);
    let s = open_stream(sim.local_addr(), &long_stream(2000), 5).await;
    let held = sample(&sim.metrics_text(), series);
    // 15 prompt tokens plus at least 4 generated: at least 5 blocks of 4, of 100 tokens.
    assert!(held >= 0.19, "{held}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        sample(&sim.metrics_text(), series) > held,
        "grows while decoding"
    );
    drop(s);
    assert!(
        eventually(Duration::from_millis(200), || sample(
            &sim.metrics_text(),
            series
        ) == 0.0)
        .await
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn metrics_agree_with_the_requests_served() {
    let sim = start(SimConfig::fast()).await;
    let a = sim.local_addr();
    let mut completion = 0u64;
    let mut prompt = 0u64;
    let mut children = 0u64;
    let mut stops = 0u64;
    let bodies = [
        r#"{"messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":16,"stream_options":{"include_usage":true}}"#,
        r#"{"messages":[{"role":"user","content":"Hello, how are you?"}],"stream":true,"max_tokens":7,"n":3,"stream_options":{"include_usage":true}}"#,
        r#"{"messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":300,"stop":["e"],"stream_options":{"include_usage":true}}"#,
        r#"{"messages":[{"role":"user","content":"Hello"}],"max_tokens":9}"#,
    ];
    for b in bodies {
        let r = post(a, CHAT, b).await;
        assert_eq!(r.status, 200);
        let usage = if b.contains("\"stream\":true") {
            let j = r.json_events();
            for c in &j {
                if let Some(ch) = c["choices"].as_array().and_then(|a| a.first()) {
                    if ch["finish_reason"] == "stop" {
                        stops += 1;
                    }
                }
            }
            j.last().unwrap()["usage"].clone()
        } else {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            v["usage"].clone()
        };
        let n = if b.contains("\"n\":3") { 3 } else { 1 };
        children += n;
        completion += usage["completion_tokens"].as_u64().unwrap();
        prompt += usage["prompt_tokens"].as_u64().unwrap() * n;
    }
    // An error is not counted.
    assert_eq!(
        post(a, CHAT, r#"{"model":"x","messages":[]}"#).await.status,
        404
    );
    let m = get(a, "/metrics").await.text();
    let l = |name: &str| format!("vllm:{name}{{engine=\"0\",model_name=\"tiny\"}}");
    assert_eq!(sample(&m, &l("generation_tokens_total")), completion as f64);
    assert_eq!(sample(&m, &l("prompt_tokens_total")), prompt as f64);
    assert_eq!(
        sample(&m, &l("e2e_request_latency_seconds_count")),
        children as f64
    );
    assert_eq!(
        sample(&m, &l("time_to_first_token_seconds_count")),
        children as f64
    );
    assert_eq!(
        sample(&m, &l("request_generation_tokens_sum")),
        completion as f64
    );
    assert_eq!(
        sample(&m, &l("inter_token_latency_seconds_count")),
        (completion - children) as f64
    );
    assert_eq!(
        sample(&m, &l("request_params_n_count")),
        bodies.len() as f64
    );
    let success = |r: &str| {
        sample(&m, &format!("vllm:request_success_total{{engine=\"0\",finished_reason=\"{r}\",model_name=\"tiny\"}}"))
    };
    assert_eq!(success("stop"), stops as f64);
    assert_eq!(success("length"), (children - stops) as f64);
    assert_eq!(sim.requests_served(), bodies.len() as u64);
    sim.shutdown().await;
}

#[tokio::test]
async fn timing_follows_the_configured_costs() {
    let sim = start(SimConfig::with_timing(60.0, 15.0)).await;
    let t0 = tokio::time::Instant::now();
    let r = post(sim.local_addr(), CHAT, &long_stream(11)).await;
    let e2e = t0.elapsed();
    assert_eq!(r.json_events().len(), 12);
    // 60 ms prefill + 10 decode steps of 15 ms = 210 ms; generous upper bound for load.
    assert!(e2e >= Duration::from_millis(205), "{e2e:?}");
    assert!(e2e < Duration::from_secs(5), "{e2e:?}");
    let m = sim.metrics_text();
    let ttft = sample(
        &m,
        "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"tiny\"}",
    );
    assert!(ttft >= 0.059, "{ttft}");
    let tpot = sample(
        &m,
        "vllm:request_time_per_output_token_seconds_sum{engine=\"0\",model_name=\"tiny\"}",
    );
    assert!(tpot >= 0.0145, "{tpot}");
    sim.shutdown().await;
}

#[tokio::test]
async fn legacy_metric_names() {
    let sim = start(SimConfig {
        legacy_metric_names: true,
        ..SimConfig::fast()
    })
    .await;
    post(sim.local_addr(), CHAT, &long_stream(3)).await;
    let m = get(sim.local_addr(), "/metrics").await.text();
    assert!(m.contains("# TYPE vllm:gpu_cache_usage_perc gauge"));
    assert_eq!(
        sample(
            &m,
            "vllm:time_per_output_token_seconds_count{engine=\"0\",model_name=\"tiny\"}"
        ),
        2.0
    );
    assert!(!m.contains("vllm:kv_cache_usage_perc"));
    assert!(!m.contains("vllm:inter_token_latency_seconds"));
    sim.shutdown().await;
}
