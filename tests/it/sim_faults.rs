//! Each fault behaves as documented in docs/sim.md, from the header and from configured
//! probabilities.

use std::time::Duration;

use crate::support::prom::sample;
use crate::support::raw_http::*;
use goodput_proxy::sim::{SimConfig, FAULT_HEADER};
use tokio::io::AsyncWriteExt;

const CHAT: &str = "/v1/chat/completions";
const BODY: &str = r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":6}"#;

async fn faulted(sim: &goodput_proxy::sim::SimHandle, fault: &str, body: &str) -> Resp {
    send(
        sim.local_addr(),
        "POST",
        CHAT,
        &[(FAULT_HEADER, fault)],
        body,
    )
    .await
}

#[tokio::test]
async fn status_fault_answers_before_any_stream() {
    let sim = start(SimConfig::fast()).await;
    let r = faulted(&sim, "status=503", BODY).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], 503);
    assert_eq!(faulted(&sim, "status=429", BODY).await.status, 429);
    assert_eq!(sim.requests_started(), 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn error_after_sends_the_in_band_error_then_done() {
    let sim = start(SimConfig::fast()).await;
    let r = faulted(&sim, "error-after=2", BODY).await;
    assert_eq!(r.status, 200);
    assert!(r.complete);
    let ev = r.events();
    // role, 2 tokens, error, [DONE]
    assert_eq!(ev.len(), 5, "{ev:?}");
    assert!(ev[3].starts_with("{\"error\": {\"message\": "), "{}", ev[3]);
    let err: serde_json::Value = serde_json::from_str(&ev[3]).unwrap();
    assert_eq!(err["error"]["type"], "InternalServerError");
    assert_eq!(err["error"]["code"], 500);
    assert_eq!(ev[4], "[DONE]");
    let m = sim.metrics_text();
    assert_eq!(sample(&m, "vllm:request_success_total{engine=\"0\",finished_reason=\"error\",model_name=\"tiny\"}"), 1.0);
    // Non-streaming: a 500 error body.
    let r = faulted(
        &sim,
        "error-after=1",
        &BODY.replace("\"stream\":true", "\"stream\":false"),
    )
    .await;
    assert_eq!(r.status, 500);
    sim.shutdown().await;
}

#[tokio::test]
async fn truncate_after_closes_mid_stream_without_done() {
    let sim = start(SimConfig::fast()).await;
    let r = faulted(&sim, "truncate-after=3", BODY).await;
    assert_eq!(r.status, 200);
    assert!(!r.complete, "no terminating chunk");
    let ev = r.events();
    assert_eq!(ev.len(), 4, "role + 3 tokens: {ev:?}");
    assert!(!r.text().contains("[DONE]"));
    assert!(eventually(Duration::from_millis(200), || sim.requests_aborted() == 1).await);
    assert_eq!(sim.running(), 0);
    // Non-streaming: the body is cut short of its content-length.
    let r = faulted(
        &sim,
        "truncate-after=1",
        &BODY.replace("\"stream\":true", "\"stream\":false"),
    )
    .await;
    assert!(!r.complete);
    sim.shutdown().await;
}

#[tokio::test]
async fn stall_first_and_stall_every_delay_tokens() {
    let sim = start(SimConfig::fast()).await;
    let t = tokio::time::Instant::now();
    let r = faulted(&sim, "stall-first=150", BODY).await;
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r.events().len(), 8);
    let t = tokio::time::Instant::now();
    let r = faulted(&sim, "stall-every=40", BODY).await;
    // 5 gaps after the first token.
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    let m = sim.metrics_text();
    let itl_sum = sample(
        &m,
        "vllm:inter_token_latency_seconds_sum{engine=\"0\",model_name=\"tiny\"}",
    );
    assert!(itl_sum >= 0.2, "{itl_sum}");
    sim.shutdown().await;
}

#[tokio::test]
async fn no_done_finishes_without_the_done_event() {
    let sim = start(SimConfig::fast()).await;
    let r = faulted(
        &sim,
        "no-done",
        &BODY.replace(
            "\"max_tokens\":6",
            "\"max_tokens\":6,\"stream_options\":{\"include_usage\":true}",
        ),
    )
    .await;
    assert!(r.complete, "the body ends normally");
    let ev = r.events();
    assert!(!ev.contains(&"[DONE]".to_string()));
    let j = r.json_events();
    assert_eq!(j[j.len() - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(j[j.len() - 1]["usage"]["completion_tokens"], 6);
    sim.shutdown().await;
}

#[tokio::test]
async fn malformed_after_inserts_one_broken_data_line() {
    let sim = start(SimConfig::fast()).await;
    let r = faulted(&sim, "malformed-after=2", BODY).await;
    assert!(r.complete);
    let ev = r.events();
    let broken: Vec<usize> = ev
        .iter()
        .enumerate()
        .filter(|(_, e)| *e != "[DONE]" && serde_json::from_str::<serde_json::Value>(e).is_err())
        .map(|(i, _)| i)
        .collect();
    // role, 2 tokens, then the broken line.
    assert_eq!(broken, vec![3]);
    assert_eq!(ev.len(), 1 + 6 + 1 + 1);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    sim.shutdown().await;
}

#[tokio::test]
async fn hang_never_answers_and_holds_no_slot() {
    let sim = start(SimConfig::fast()).await;
    let mut s = tokio::net::TcpStream::connect(sim.local_addr())
        .await
        .unwrap();
    s.write_all(&request_bytes(
        "POST",
        CHAT,
        &[(FAULT_HEADER, "hang")],
        BODY,
    ))
    .await
    .unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(
        Duration::from_millis(300),
        tokio::io::AsyncReadExt::read(&mut s, &mut buf),
    )
    .await;
    assert!(read.is_err(), "no byte within 300 ms");
    assert_eq!(sim.running(), 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn bad_fault_header_is_a_400() {
    let sim = start(SimConfig::fast()).await;
    let r = faulted(&sim, "explode", BODY).await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("x-sim-fault"));
    sim.shutdown().await;
}

#[tokio::test]
async fn configured_probabilities_mix_faults_and_the_header_overrides() {
    let cfg = SimConfig {
        faults: vec!["0.5:status=503".parse().unwrap()],
        seed: 11,
        ..SimConfig::fast()
    };
    let sim = start(cfg).await;
    let mut codes = Vec::new();
    for _ in 0..200 {
        codes.push(post(sim.local_addr(), CHAT, BODY).await.status);
    }
    let failed = codes.iter().filter(|&&c| c == 503).count();
    assert!((60..140).contains(&failed), "{failed} of 200");
    assert_eq!(codes.iter().filter(|&&c| c == 200).count(), 200 - failed);
    // An explicit header replaces the draw.
    for _ in 0..20 {
        assert_eq!(faulted(&sim, "no-done", BODY).await.status, 200);
    }
    sim.shutdown().await;
    // Same seed, same arrival order: the same sequence of faults.
    let cfg = SimConfig {
        faults: vec!["0.5:status=503".parse().unwrap()],
        seed: 11,
        ..SimConfig::fast()
    };
    let sim = start(cfg).await;
    let mut again = Vec::new();
    for _ in 0..200 {
        again.push(post(sim.local_addr(), CHAT, BODY).await.status);
    }
    assert_eq!(codes, again);
    sim.shutdown().await;
}
