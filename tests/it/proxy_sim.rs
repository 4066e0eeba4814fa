//! The proxy in front of the simulated engine (the default upstream in CI): bodies arrive
//! byte-identical to direct requests, disconnects reach the engine, engine errors pass through.

use std::time::Duration;

use crate::support::meter::{start_sim, CHAT, COMPL};
use crate::support::proxy::*;
use goodput_sim::SimConfig;

#[tokio::test]
async fn bodies_are_byte_identical_to_direct_requests() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let proxy = start_proxy(test_config(&[sim.base_url()])).await;
    let c = client();
    let cases = [
        (
            CHAT,
            r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":40}"#,
        ),
        (
            CHAT,
            r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":40}"#,
        ),
        (
            COMPL,
            r#"{"model":"tiny","prompt":"Once","stream":true,"max_tokens":20,"stream_options":{"include_usage":true}}"#,
        ),
        (COMPL, r#"{"model":"tiny","prompt":"Once","max_tokens":20}"#),
        (
            CHAT,
            r#"{"model":"no-such-model","messages":[],"stream":true}"#,
        ),
    ];
    for (path, body) in cases {
        let (direct, direct_body) =
            send(&c, post_json(&format!("{}{path}", sim.base_url()), body)).await;
        let (via, via_body) = send(&c, post_json(&proxy.url(path), body)).await;
        assert_eq!(via.status, direct.status, "{body}");
        assert_eq!(
            via.headers["content-type"], direct.headers["content-type"],
            "{body}"
        );
        assert_eq!(via_body, direct_body, "{body}");
        assert!(!via_body.is_empty());
    }
    for path in ["/v1/models", "/health", "/version"] {
        let (direct, direct_body) = send(&c, get(&format!("{}{path}", sim.base_url()))).await;
        let (via, via_body) = send(&c, get(&proxy.url(path))).await;
        assert_eq!(
            (via.status, via_body),
            (direct.status, direct_body),
            "{path}"
        );
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_after_3_events_reaches_the_engine_within_1s() {
    let sim = start_sim(SimConfig::with_timing(5.0, 20.0)).await;
    let proxy = start_proxy(test_config(&[sim.base_url()])).await;
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":2000,"ignore_eos":true}"#;
    let resp = client()
        .request(post_json(&proxy.url(CHAT), body))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    read_events(&mut stream, 3).await;
    assert_eq!(sim.running(), 1);
    assert_eq!(sim.requests_aborted(), 0);
    drop(stream);
    // The issue states the number: the engine sees the disconnect within 1 s.
    let seen = eventually(Duration::from_secs(1), || {
        sim.requests_aborted() == 1 && sim.running() == 0
    })
    .await;
    assert!(
        seen,
        "engine still generating 1 s after the client left (running {}, aborted {})",
        sim.running(),
        sim.requests_aborted()
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn client_leaving_before_the_response_head_reaches_the_engine_within_1s() {
    // Non-streaming: the head only comes when generation ends (here after ~40 s).
    let sim = start_sim(SimConfig::with_timing(5.0, 20.0)).await;
    let proxy = start_proxy(test_config(&[sim.base_url()])).await;
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":2000,"ignore_eos":true}"#;
    let c = client();
    let url = proxy.url(CHAT);
    let pending = tokio::spawn(async move { c.request(post_json(&url, body)).await });
    assert!(
        eventually(SLOW, || sim.running() == 1).await,
        "engine never started"
    );
    pending.abort();
    let seen = eventually(Duration::from_secs(1), || sim.running() == 0).await;
    assert!(seen, "engine still generating 1 s after the client left");
    drop(proxy);
    sim.shutdown().await;
}

#[tokio::test]
async fn engine_errors_pass_through_and_a_hung_engine_is_504() {
    let sim = start_sim(SimConfig::fast()).await;
    let mut config = test_config(&[sim.base_url()]);
    config.upstream.first_byte_timeout_ms = 500;
    let proxy = start_proxy(config).await;
    let c = client();
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":5}"#;

    // An engine 503 is the engine's answer, forwarded as is.
    let mut req = post_json(&proxy.url(CHAT), body);
    req.headers_mut()
        .insert("x-sim-fault", "status=503".parse().unwrap());
    let (parts, _) = send(&c, req).await;
    assert_eq!(parts.status, 503);
    assert!(
        parts.headers.get("retry-after").is_none(),
        "not the proxy's own 503"
    );

    let mut req = post_json(&proxy.url(CHAT), body);
    req.headers_mut()
        .insert("x-sim-fault", "hang".parse().unwrap());
    let (parts, err) = send(&c, req).await;
    assert_eq!(parts.status, 504);
    assert_openai_error(504, &err);
    sim.shutdown().await;
}

#[tokio::test]
async fn demo_mode_starts_the_engine_in_process() {
    // No upstream configured: `serve` runs the simulated engine itself.
    let mut config = test_config(&[]);
    config.upstream.urls.clear();
    let app = goodput_proxy::app::App::bind(config.check().unwrap())
        .await
        .unwrap();
    let demo = app.demo().expect("demo engine started");
    assert!(demo.addr.ip().is_loopback());
    let model = demo.model.clone();
    assert!(app.sample_curl(&model).starts_with("curl "));
    let addr = app.local_addr();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"Hi"}}],"stream":true,"max_tokens":4}}"#
    );
    let (parts, bytes) = send(&client(), post_json(&format!("http://{addr}{CHAT}"), &body)).await;
    assert_eq!(parts.status, 200);
    assert!(bytes.ends_with(b"data: [DONE]\n\n"));
    drop(tx);
    tokio::time::timeout(SLOW, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
