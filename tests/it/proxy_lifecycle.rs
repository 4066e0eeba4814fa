//! Admin port, readiness, slowloris protection, drain and graceful shutdown.

use std::process::Command;
use std::time::Duration;

use crate::support::binary::{spawn, Binary};
use crate::support::proxy::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn status_of(url: &str) -> u16 {
    send(&client(), get(url)).await.0.status.as_u16()
}

#[tokio::test]
async fn admin_routes() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    assert_eq!(status_of(&proxy.admin_url("/healthz")).await, 200);
    let mut ready = false;
    for _ in 0..200 {
        if status_of(&proxy.admin_url("/readyz")).await == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "/readyz never turned 200 with a healthy upstream");
    let (parts, _) = send(&client(), get(&proxy.admin_url("/metrics"))).await;
    assert_eq!(parts.status, 200);
    assert!(parts.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    assert_eq!(status_of(&proxy.admin_url("/stats")).await, 200);
    assert_eq!(status_of(&proxy.admin_url("/v1/models")).await, 404);
}

#[tokio::test]
async fn not_ready_while_no_upstream_answers() {
    let fake = start_fake().await;
    let mut config = test_config(&[fake.url()]);
    config.upstream.health_path = "/unhealthy".into();
    let proxy = start_proxy(config).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_of(&proxy.admin_url("/readyz")).await, 503);
    assert_eq!(status_of(&proxy.admin_url("/healthz")).await, 200);
}

/// Reads until the server closes the connection; returns the bytes it sent.
async fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    out
}

#[tokio::test]
async fn slowloris_is_dropped_at_the_header_deadline_while_others_are_served() {
    let fake = start_fake().await;
    let mut config = test_config(&[fake.url()]);
    config.server.header_read_timeout_ms = 500;
    let proxy = start_proxy(config).await;

    // Trickles a header byte every 100 ms: it would take 20 s to finish.
    let mut slow = TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let trickle = async {
        for _ in 0..200 {
            if slow.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let mut normal_ok = false;
    let normal = async {
        let (parts, _) = send(&client(), post_json(&proxy.url("/v1/completions"), "{}")).await;
        normal_ok = parts.status == 200;
    };
    tokio::join!(trickle, normal);
    let elapsed = started.elapsed();
    assert!(normal_ok, "a normal request must succeed meanwhile");
    assert!(
        elapsed < Duration::from_secs(15),
        "slow client was not dropped ({elapsed:?})"
    );
    assert!(
        elapsed >= Duration::from_millis(500),
        "dropped before the deadline ({elapsed:?})"
    );
    // A client that connects and sends nothing is dropped too.
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let closed = tokio::time::timeout(SLOW, read_until_closed(&mut silent)).await;
    assert!(closed.is_ok(), "silent connection was never closed");
}

#[tokio::test]
async fn streams_past_the_grace_period_are_cut_not_completed() {
    let fake = start_fake().await;
    let mut config = test_config(&[fake.url()]);
    config.server.grace_period_ms = 300;
    let mut proxy = start_proxy(config).await;
    let resp = client()
        .request(fake_stream_request(
            &proxy.url("/v1/chat/completions"),
            100,
            100,
        ))
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut seen = read_events(&mut body, 1).await;
    drop(proxy.stop.take());
    // The rest: whatever arrives before the cut, then an error, never `[DONE]`.
    let end = loop {
        match tokio::time::timeout(SLOW, body.frame())
            .await
            .expect("cut in time")
        {
            Some(Ok(f)) => seen.extend_from_slice(&f.into_data().unwrap_or_default()),
            Some(Err(e)) => break Some(e),
            None => break None,
        }
    };
    assert!(end.is_some(), "a cut stream must end in an error");
    assert!(
        !seen.windows(6).any(|w| w == b"[DONE]"),
        "fake [DONE] after cut"
    );
    let exit = tokio::time::timeout(SLOW, &mut proxy.task)
        .await
        .expect("proxy stops");
    assert!(exit.unwrap().is_ok());
}

fn spawn_binary(upstream: &str, drain_ms: u64, grace_ms: u64) -> Binary {
    spawn(
        upstream,
        &[
            ("GOODPUT_PROXY_SERVER_DRAIN_DELAY_MS", drain_ms.to_string()),
            ("GOODPUT_PROXY_SERVER_GRACE_PERIOD_MS", grace_ms.to_string()),
        ],
    )
}

#[tokio::test]
async fn sigterm_drains_streams_refuses_new_connections_and_exits_0() {
    let fake = start_fake().await;
    let mut bin = spawn_binary(&fake.url(), 2_000, 20_000);
    let url = format!("http://{}/v1/chat/completions", bin.addr);
    let admin = format!("http://{}/readyz", bin.admin);

    // Ready first, so the 503 below is the drain's doing.
    assert!(
        {
            let mut ok = false;
            for _ in 0..200 {
                if status_of(&admin).await == 200 {
                    ok = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ok
        },
        "never ready"
    );

    // Two streams of ~4 s each, in flight when the signal arrives.
    let c = client();
    let mut streams = Vec::new();
    for _ in 0..2 {
        let resp = c.request(fake_stream_request(&url, 20, 200)).await.unwrap();
        let mut body = resp.into_body();
        let first = read_events(&mut body, 1).await;
        streams.push(tokio::spawn(async move {
            let rest = body.collect().await.map(|c| c.to_bytes());
            (first, rest)
        }));
    }
    let status = Command::new("kill")
        .args(["-TERM", &bin.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    // During the drain delay, new connections are still served.
    let (parts, _) = send(
        &client(),
        post_json(&format!("http://{}/v1/completions", bin.addr), "{}"),
    )
    .await;
    assert_eq!(
        parts.status, 200,
        "a new connection during the drain delay must be served"
    );

    // /readyz turns 503 at once (well before the drain delay ends).
    let t = tokio::time::Instant::now();
    let mut not_ready = false;
    while t.elapsed() < Duration::from_secs(5) {
        if send(&client(), get(&admin)).await.0.status == 503 {
            not_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(not_ready, "/readyz did not turn 503 after SIGTERM");

    // After the drain delay, new connections are refused.
    let mut refused = false;
    for _ in 0..200 {
        if TcpStream::connect(bin.addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        refused,
        "new connections still accepted after the drain delay"
    );

    // The streams in flight finish, complete.
    for s in streams {
        let (first, rest) = tokio::time::timeout(SLOW, s)
            .await
            .expect("stream finishes")
            .unwrap();
        let rest = rest.expect("stream completes without error");
        assert!(first.starts_with(b"data: "));
        assert!(rest.ends_with(b"data: [DONE]\n\n"));
    }
    // And the process exits 0.
    let deadline = tokio::time::Instant::now() + SLOW;
    let code = loop {
        if let Some(status) = bin.child.try_wait().unwrap() {
            break status;
        }
        assert!(tokio::time::Instant::now() < deadline, "proxy did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code.code(), Some(0));
}

/// One access line per request by default; `[log] access = false` writes none, and the request
/// is still recorded (`/stats`).
#[tokio::test]
async fn access_lines_are_written_unless_switched_off() {
    let fake = start_fake().await;
    for access in [true, false] {
        let proxy = spawn(
            &fake.url(),
            &[("GOODPUT_PROXY_LOG_ACCESS", access.to_string())],
        );
        let url = format!("http://{}/v1/chat/completions", proxy.addr);
        let (parts, _) = send(&client(), post_json(&url, r#"{"model":"m"}"#)).await;
        assert_eq!(parts.status, 200);
        let stats = format!("http://{}/stats", proxy.admin);
        let mut recorded = false;
        for _ in 0..200 {
            let (_, body) = send(&client(), get(&stats)).await;
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            if v["requests"].as_u64() == Some(1) {
                recorded = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(
            recorded,
            "access={access}: /stats never counted the request"
        );
        // The line is written when the response body is dropped, as the record is: by now
        // it is there, or (switched off) it never comes.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        let mut line = None;
        while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
            match proxy.lines.recv_timeout(left) {
                Ok(l) if l.contains("goodput_proxy::access") => {
                    line = Some(l);
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        match (access, line) {
            (true, Some(l)) => assert!(
                l.contains("status=200") && l.contains("path=/v1/chat/completions"),
                "{l}"
            ),
            (true, None) => panic!("no access line"),
            (false, Some(l)) => panic!("access off, yet: {l}"),
            (false, None) => {}
        }
    }
}
