//! Each fault behaves as documented in docs/sim.md, from the header and from configured
//! probabilities.

use std::time::Duration;

use crate::support::prom::sample;
use crate::support::raw_http::*;
use goodput_sim::{SimConfig, FAULT_HEADER};
use tokio::io::AsyncWriteExt;

const CHAT: &str = "/v1/chat/completions";
const BODY: &str = r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":6}"#;

async fn faulted(sim: &goodput_sim::SimHandle, fault: &str, body: &str) -> Resp {
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

/// `finish=abort` / `finish=error`: the choices end with that finish_reason after K steps,
/// then the usage chunk (asked for) and `[DONE]`; counted under that `finished_reason`.
#[tokio::test]
async fn finish_abort_and_error_end_the_choices_then_done() {
    let sim = start(SimConfig::fast()).await;
    let usage = BODY.replace(
        "\"max_tokens\":6",
        "\"max_tokens\":6,\"seed\":1,\"stream_options\":{\"include_usage\":true}",
    );
    for reason in ["abort", "error"] {
        let series = format!(
            "vllm:request_success_total{{engine=\"0\",finished_reason=\"{reason}\",model_name=\"tiny\"}}"
        );
        let before = sample(&sim.metrics_text(), &series);
        let r = faulted(&sim, &format!("finish={reason},finish-after=3"), &usage).await;
        assert_eq!(r.status, 200);
        assert!(r.complete);
        let ev = r.events();
        // role, 3 tokens, the finish event, usage, [DONE]
        assert_eq!(ev.len(), 7, "{ev:?}");
        let j = r.json_events();
        for e in &j[1..4] {
            assert!(e["choices"][0]["finish_reason"].is_null());
        }
        let fin = &j[4]["choices"][0];
        assert_eq!(fin["finish_reason"], reason);
        assert_eq!(fin["stop_reason"], serde_json::Value::Null);
        assert_eq!(fin["delta"]["content"], "", "no token in the finish event");
        assert!(ev[4].contains(&format!(
            "\"delta\":{{\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":\"{reason}\",\"stop_reason\":null,\"token_ids\":null}}]}}"
        )));
        assert_eq!(j[5]["usage"]["completion_tokens"], 3);
        assert_eq!(ev[6], "[DONE]");
        assert_eq!(sample(&sim.metrics_text(), &series), before + 1.0);

        // Without usage: the finish event carries the fingerprint, then [DONE]. K = 0: no token.
        let r = faulted(&sim, &format!("finish={reason}"), BODY).await;
        let ev = r.events();
        assert_eq!(ev.len(), 3, "role, finish, [DONE]: {ev:?}");
        let j = r.json_events();
        assert_eq!(j[1]["choices"][0]["finish_reason"], reason);
        assert_eq!(j[1]["system_fingerprint"], "vllm-0.32.0-f1283a03");

        // n = 2 and completions: every choice ends so.
        let n2 = usage.replace("\"max_tokens\":6", "\"max_tokens\":6,\"n\":2");
        let r = faulted(&sim, &format!("finish={reason},finish-after=2"), &n2).await;
        let j = r.json_events();
        for i in 0..2 {
            let last = j.iter().rfind(|e| e["choices"][0]["index"] == i).unwrap();
            assert_eq!(last["choices"][0]["finish_reason"], reason, "choice {i}");
        }
        assert_eq!(j[j.len() - 1]["usage"]["completion_tokens"], 4);
        let r = send(
            sim.local_addr(),
            "POST",
            "/v1/completions",
            &[(FAULT_HEADER, &format!("finish={reason},finish-after=1"))],
            r#"{"model":"tiny","prompt":"x","stream":true,"max_tokens":6}"#,
        )
        .await;
        let j = r.json_events();
        assert_eq!(j.len(), 2, "{:?}", r.events());
        assert_eq!(j[1]["choices"][0]["text"], "");
        assert_eq!(j[1]["choices"][0]["finish_reason"], reason);
        assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn finish_fault_sends_held_tokens_keeps_natural_ends_and_applies_to_bodies() {
    let sim = start(SimConfig::fast()).await;
    let body = BODY.replace(
        "\"max_tokens\":6",
        "\"max_tokens\":10,\"seed\":1,\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}",
    );
    // With packing: tokens 1..4 in one event, 5..6 ride on the abort event.
    let r = faulted(&sim, "coalesce=4,finish=abort,finish-after=6", &body).await;
    let j = r.json_events();
    let content: Vec<_> = j[1..j.len() - 1].iter().collect();
    assert_eq!(content.len(), 2, "{:?}", r.events());
    assert_eq!(content[0]["usage"]["completion_tokens"], 4);
    assert!(content[0]["choices"][0]["finish_reason"].is_null());
    assert_eq!(content[1]["usage"]["completion_tokens"], 6);
    assert_eq!(content[1]["choices"][0]["finish_reason"], "abort");
    assert_ne!(content[1]["choices"][0]["delta"]["content"], "");
    assert_eq!(j[j.len() - 1]["usage"]["completion_tokens"], 6);
    // A choice that ends before K keeps its own finish.
    let r = faulted(&sim, "finish=abort,finish-after=50", &body).await;
    let j = r.json_events();
    assert_eq!(j[j.len() - 2]["choices"][0]["finish_reason"], "length");
    // Non-streaming: the text of K tokens, that finish_reason, usage of K tokens.
    let seeded = BODY.replace("\"max_tokens\":6", "\"max_tokens\":6,\"seed\":1");
    let ns = seeded.replace("\"stream\":true", "\"stream\":false");
    let r = faulted(&sim, "finish=error,finish-after=3", &ns).await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "error");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let streamed = faulted(&sim, "finish=error,finish-after=3", &seeded).await;
    let text: String = streamed.json_events()[1..4]
        .iter()
        .map(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(v["choices"][0]["message"]["content"], text.as_str());
    // Bad forms are a 400.
    for bad in [
        "finish=stop",
        "finish-after=2",
        "finish=abort,finish-after=x",
    ] {
        assert_eq!(faulted(&sim, bad, BODY).await.status, 400, "{bad}");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn finish_and_coalesce_work_as_configured_probabilities() {
    let cfg = SimConfig {
        faults: vec![
            "1.0:finish=abort,finish-after=2".parse().unwrap(),
            "1.0:coalesce=2".parse().unwrap(),
        ],
        ..SimConfig::fast()
    };
    let sim = start(cfg).await;
    for _ in 0..3 {
        let r = post(sim.local_addr(), CHAT, BODY).await;
        let j = r.json_events();
        // role, one event of 2 tokens, the abort event (no token), [DONE]
        assert_eq!(j.len(), 3, "{:?}", r.events());
        assert!(j[1]["choices"][0]["finish_reason"].is_null());
        assert_eq!(j[2]["choices"][0]["finish_reason"], "abort");
    }
    let m = sim.metrics_text();
    assert_eq!(
        sample(
            &m,
            "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"tiny\"}"
        ),
        3.0
    );
    sim.shutdown().await;
}
