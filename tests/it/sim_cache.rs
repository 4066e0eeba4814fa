//! The simulator where routing matters, held to real vLLM 0.32: prefix caching seen through
//! `cached_tokens` and the prefix-cache counters (in tokens), its effect on prefill time, the
//! step budget slowing running streams while a long prompt prefills, and admission rejections
//! answered byte for byte as captured.

use std::time::Duration;

use crate::sim_fidelity::{fixed_headers, header_names, load, sim_head, skeleton, stream_shape};
use crate::support::prom::sample;
use crate::support::raw_http::*;
use goodput_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";
const CAPTURED_FINGERPRINT: &str = "vllm-0.32.0-755e1373";
const SIM_FINGERPRINT: &str = "vllm-0.32.0-f1283a03";

fn counter(m: &str, name: &str) -> f64 {
    sample(
        m,
        &format!("vllm:{name}{{engine=\"0\",model_name=\"tiny\"}}"),
    )
}

fn usage_details(r: &Resp) -> serde_json::Value {
    let last = r.json_events().pop().expect("a usage chunk");
    last["usage"]["prompt_tokens_details"].clone()
}

/// The engine that recorded the captures: CPU vLLM (block size 128) with
/// `--enable-prompt-tokens-details`.
fn captured_engine() -> SimConfig {
    SimConfig {
        block_size: 128,
        enable_prompt_tokens_details: true,
        ..SimConfig::fast()
    }
}

#[tokio::test]
async fn a_repeated_prefix_is_reported_cached_as_the_captures_show() {
    let sim = start(captured_engine()).await;
    let a = sim.local_addr();
    let cold = load("stream-chat-prompt-details-cold.txt");
    let cached = load("stream-chat-prompt-details-cached.txt");
    let r1 = post(a, CHAT, &cold.body).await;
    let r2 = post(a, CHAT, &cached.body).await;
    for (cap, r) in [(&cold, &r1), (&cached, &r2)] {
        assert_eq!(header_names(&sim_head(r)), header_names(&cap.head));
        // The captured engine's fingerprint differs from the default one the sim keeps.
        let want = stream_shape(&cap.resp_body.replace(CAPTURED_FINGERPRINT, SIM_FINGERPRINT));
        assert_eq!(stream_shape(&r.text()), want, "{}", cap.path);
    }
    // As captured: the first request creates whole blocks, the second finds them.
    let prompt = r1.json_events().pop().unwrap()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    let full = prompt / 128 * 128;
    assert!(full >= 256, "the system prompt spans blocks: {prompt}");
    assert_eq!(
        usage_details(&r1),
        serde_json::json!({"cached_tokens": 0, "created_cache_tokens": full})
    );
    assert_eq!(
        usage_details(&r2),
        serde_json::json!({"cached_tokens": full, "created_cache_tokens": 0})
    );
    // The counters are in tokens, at admission: every prompt token queried, the hits cached.
    let m = sim.metrics_text();
    let p2 = r2.json_events().pop().unwrap()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        counter(&m, "prefix_cache_queries_total"),
        (prompt + p2) as f64
    );
    assert_eq!(counter(&m, "prefix_cache_hits_total"), full as f64);
    assert_eq!(counter(&m, "prompt_tokens_cached_total"), full as f64);
    let by_source = |s: &str| {
        sample(
            &m,
            &format!(
                "vllm:prompt_tokens_by_source_total{{engine=\"0\",model_name=\"tiny\",source=\"{s}\"}}"
            ),
        )
    };
    assert_eq!(by_source("local_cache_hit"), full as f64);
    assert_eq!(by_source("local_compute"), (prompt + p2 - full) as f64);
    sim.shutdown().await;
}

#[tokio::test]
async fn json_bodies_and_completions_carry_the_details_as_captured() {
    let sim = start(captured_engine()).await;
    let a = sim.local_addr();
    for name in [
        "stream-completions-prompt-details.txt",
        "stream-chat-prompt-details-nousage.txt",
        "stream-chat-prompt-details-continuous.txt",
    ] {
        let cap = load(name);
        let r = post(a, &cap.path, &cap.body).await;
        let want = stream_shape(&cap.resp_body.replace(CAPTURED_FINGERPRINT, SIM_FINGERPRINT));
        assert_eq!(stream_shape(&r.text()), want, "{name}");
    }
    for name in [
        "nonstream-chat-prompt-details-cached.txt",
        "nonstream-completions-prompt-details.txt",
    ] {
        let cap = load(name);
        let r = post(a, &cap.path, &cap.body).await;
        let want = skeleton(&cap.resp_body.replace(CAPTURED_FINGERPRINT, SIM_FINGERPRINT));
        assert_eq!(skeleton(&r.text()), want, "{name}");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn without_details_or_caching_nothing_is_reported_or_hit() {
    let body = &load("stream-chat-prompt-details-cold.txt").body;
    let sim = start(SimConfig::fast()).await;
    let r = post(sim.local_addr(), CHAT, body).await;
    assert!(!r.text().contains("prompt_tokens_details"));
    sim.shutdown().await;
    let sim = start(SimConfig {
        enable_prefix_caching: false,
        ..captured_engine()
    })
    .await;
    post(sim.local_addr(), CHAT, body).await;
    let r = post(sim.local_addr(), CHAT, body).await;
    assert_eq!(usage_details(&r)["cached_tokens"], 0);
    let m = sim.metrics_text();
    assert_eq!(counter(&m, "prefix_cache_queries_total"), 0.0);
    assert_eq!(counter(&m, "prefix_cache_hits_total"), 0.0);
    sim.shutdown().await;
}

fn system_prompt_chat(system: &str, question: &str, max_tokens: u32) -> String {
    format!(
        r#"{{"model":"tiny","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{question}"}}],"stream":true,"max_tokens":{max_tokens},"stream_options":{{"include_usage":true}}}}"#
    )
}

/// Time from sending to the first token's event.
async fn ttft(addr: std::net::SocketAddr, body: &str) -> Duration {
    let t = tokio::time::Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request_bytes("POST", CHAT, &[], body))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    // The first token's chunk (the role chunk has `"role"` before its content).
    while memchr::memmem::find(&seen, b"{\"content\":").is_none() {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    t.elapsed()
}

#[tokio::test]
async fn cached_tokens_skip_their_prefill_cost() {
    let _serial = crate::support::serial();
    // 0.5 ms per prompt token: a 600-token system prompt costs 300 ms cold.
    let sim = start(SimConfig {
        ttft_ms: 5.0,
        prefill_ms_per_token: 0.5,
        ..SimConfig::fast()
    })
    .await;
    let system = "policy words repeat ".repeat(200);
    let cold = ttft(sim.local_addr(), &system_prompt_chat(&system, "first?", 2)).await;
    let warm = ttft(sim.local_addr(), &system_prompt_chat(&system, "second?", 2)).await;
    assert!(cold >= Duration::from_millis(300), "{cold:?}");
    assert!(warm < cold / 3, "cold {cold:?} warm {warm:?}");
    sim.shutdown().await;
}

/// Arrival times of the content events of an open stream, for `window`.
async fn event_times(s: &mut TcpStream, window: Duration) -> Vec<tokio::time::Instant> {
    let end = tokio::time::Instant::now() + window;
    let mut times = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(Ok(n)) = tokio::time::timeout_at(end, s.read(&mut buf)).await {
        assert!(n > 0, "stream ended early");
        let now = tokio::time::Instant::now();
        for _ in memchr::memmem::find_iter(&buf[..n], b"\n\n") {
            times.push(now);
        }
    }
    times
}

#[tokio::test]
async fn a_long_prompt_in_prefill_slows_the_running_streams() {
    let _serial = crate::support::serial();
    // Steps of 5 ms; a chunk of the 64-token budget costs 63 x 0.3 = 19 ms more per step while
    // a 1,000-token prompt prefills (16 chunks, about 0.4 s).
    let sim = start(SimConfig {
        ttft_ms: 0.0,
        tpot_ms: 5.0,
        prefill_ms_per_token: 0.3,
        max_num_batched_tokens: 64,
        ..SimConfig::fast()
    })
    .await;
    let a = sim.local_addr();
    let mut running = TcpStream::connect(a).await.unwrap();
    running
        .write_all(&request_bytes(
            "POST",
            CHAT,
            &[],
            r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":2000}"#,
        ))
        .await
        .unwrap();
    let before = event_times(&mut running, Duration::from_millis(200)).await;
    let long = "word ".repeat(1000);
    let prefill = tokio::spawn(async move { ttft(a, &system_prompt_chat(&long, "q", 2)).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let during = event_times(&mut running, Duration::from_millis(200)).await;
    let ttft_long = prefill.await.unwrap();
    // Events per 200 ms: about 40 alone, about 8 while the long prompt's chunks ride along.
    assert!(before.len() >= 15, "before: {}", before.len());
    assert!(
        during.len() * 2 < before.len(),
        "before {} during {}",
        before.len(),
        during.len()
    );
    assert!(ttft_long >= Duration::from_millis(300), "{ttft_long:?}");
    drop(running);
    sim.shutdown().await;
}

async fn hold_one_stream(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request_bytes(
        "POST",
        CHAT,
        &[],
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":1800,"ignore_eos":true}"#,
    ))
    .await
    .unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    assert!(n > 0);
    s
}

#[tokio::test]
async fn over_the_queue_cap_the_answer_is_vllms_503_byte_for_byte() {
    let sim = start(SimConfig {
        max_num_queued_reqs: Some(1),
        ..SimConfig::with_timing(0.0, 10.0)
    })
    .await;
    let a = sim.local_addr();
    let held = hold_one_stream(a).await;
    for name in [
        "stream-chat-admission-rejected.txt",
        "nonstream-chat-admission-rejected.txt",
        "stream-completions-admission-rejected.txt",
    ] {
        let cap = load(name);
        let r = send(a, &cap.method, &cap.path, &[], &cap.body).await;
        let head = sim_head(&r);
        assert_eq!(head.lines().next(), cap.head.lines().next(), "{name}");
        assert_eq!(header_names(&head), header_names(&cap.head), "{name}");
        assert_eq!(fixed_headers(&head), fixed_headers(&cap.head), "{name}");
        assert_eq!(r.text(), cap.resp_body, "{name}: bytes");
    }
    let m = sim.metrics_text();
    let rejected = |reason: &str| {
        sample(
            &m,
            &format!("vllm:admission_rejections_total{{model_name=\"tiny\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(rejected("max_num_queued_reqs"), 3.0);
    assert_eq!(rejected("max_num_queued_tokens"), 0.0);
    drop(held);
    // Once the held request is gone, the next one is admitted.
    assert!(eventually(Duration::from_millis(500), || sim.running() == 0).await);
    let ok = post(a, CHAT, &load("stream-chat-admission-rejected.txt").body).await;
    assert_eq!(ok.status, 200);
    assert!(ok.text().ends_with("data: [DONE]\n\n"));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_stream_rejected_in_band_matches_the_capture() {
    // Cap 0: every request is over it; probability 1: every stream is rejected in-band.
    let sim = start(SimConfig {
        max_num_queued_reqs: Some(0),
        admission_inband_prob: 1.0,
        ..SimConfig::fast()
    })
    .await;
    let cap = load("stream-chat-admission-rejected-inband.txt");
    let r = send(sim.local_addr(), &cap.method, &cap.path, &[], &cap.body).await;
    let head = sim_head(&r);
    assert_eq!(head.lines().next(), cap.head.lines().next());
    assert_eq!(header_names(&head), header_names(&cap.head));
    assert_eq!(fixed_headers(&head), fixed_headers(&cap.head));
    assert_eq!(r.text(), cap.resp_body);
    // JSON requests have no stream to carry it: the 503 status.
    let json = post(
        sim.local_addr(),
        CHAT,
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}]}"#,
    )
    .await;
    assert_eq!(json.status, 503);
    sim.shutdown().await;
}
