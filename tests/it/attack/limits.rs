//! Limits: head size and field count (431), HTTP/2 settings as advertised,
//! the stalled-upload deadline (408), the connection limit, the TLS handshake deadline, and
//! the admin port on the same accept loop and drain.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use goodput_proxy::limits::Limits;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::*;
use crate::support::proxy::*;
use crate::support::raw_h2::{self, RawH2};

fn head_with(extra: &str) -> Vec<u8> {
    format!("GET /version HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{extra}\r\n").into_bytes()
}

#[tokio::test]
async fn a_head_over_the_limit_is_431_and_never_forwarded() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let limit = Limits::default().max_head_bytes;
    // Just under the limit: served.
    let fits = head_with(&format!("x-big: {}\r\n", "a".repeat(limit - 200)));
    let raw = exchange(proxy.addr, &fits, QUICK).await;
    assert_eq!(status(&raw), Some(200), "{}", String::from_utf8_lossy(&raw));
    // The 200 KB header the issue found forwarded: refused, upstream untouched.
    let before = fake.stats.requests.load(Ordering::SeqCst);
    let big = head_with(&format!("x-big: {}\r\n", "a".repeat(200_000)));
    let raw = exchange(proxy.addr, &big, QUICK).await;
    assert_eq!(status(&raw), Some(431), "{}", String::from_utf8_lossy(&raw));
    // One byte over, split over many header lines: refused too.
    let many = (0..(limit / 1000) + 1)
        .map(|i| format!("x-h{i}: {}\r\n", "b".repeat(990)))
        .collect::<String>();
    let raw = exchange(proxy.addr, &head_with(&many), QUICK).await;
    assert_eq!(status(&raw), Some(431));
    assert_eq!(fake.stats.requests.load(Ordering::SeqCst), before);
}

#[tokio::test]
async fn more_header_fields_than_the_limit_is_431() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let max = Limits::default().max_headers;
    // head_with sends two fields (host, connection) of its own.
    let fields = |n: usize| (0..n).map(|i| format!("x-f{i}: v\r\n")).collect::<String>();
    let raw = exchange(proxy.addr, &head_with(&fields(max - 2)), QUICK).await;
    assert_eq!(status(&raw), Some(200), "{}", String::from_utf8_lossy(&raw));
    let before = fake.stats.requests.load(Ordering::SeqCst);
    let raw = exchange(proxy.addr, &head_with(&fields(max - 1)), QUICK).await;
    assert_eq!(status(&raw), Some(431), "{}", String::from_utf8_lossy(&raw));
    assert_eq!(fake.stats.requests.load(Ordering::SeqCst), before);
}

#[tokio::test]
async fn h2_settings_advertise_the_limits_and_a_large_header_list_is_refused() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let want = Limits::default();
    let mut h2 = RawH2::connect(proxy.addr).await;
    let settings = h2
        .read_until(QUICK, |f| {
            f.kind == raw_h2::SETTINGS && f.flags & raw_h2::ACK == 0
        })
        .await
        .expect("server SETTINGS");
    let s = settings.settings();
    let setting = |id| s.iter().find(|(k, _)| *k == id).map(|(_, v)| *v);
    assert_eq!(
        setting(raw_h2::SETTINGS_MAX_CONCURRENT_STREAMS),
        Some(want.h2_max_concurrent_streams)
    );
    assert_eq!(
        setting(raw_h2::SETTINGS_INITIAL_WINDOW_SIZE),
        Some(want.h2_stream_window_bytes)
    );
    assert_eq!(
        setting(raw_h2::SETTINGS_MAX_HEADER_LIST_SIZE),
        Some(want.h2_max_header_list_bytes)
    );

    // A header list over the limit never reaches the upstream; one under it does.
    let h2c: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let with_header = |len: usize| {
        let mut r = get(&proxy.url("/version"));
        r.headers_mut()
            .insert("x-big", "a".repeat(len).parse().unwrap());
        r
    };
    let before = fake.stats.requests.load(Ordering::SeqCst);
    let big = tokio::time::timeout(QUICK, h2c.request(with_header(100_000)))
        .await
        .expect("answered in time");
    // h2 answers 431 and resets the stream; the client library may report either.
    if let Ok(resp) = big {
        assert_eq!(resp.status(), 431);
    }
    assert_eq!(fake.stats.requests.load(Ordering::SeqCst), before);
    let (parts, _) = send(&h2c, with_header(30_000)).await;
    assert_eq!(parts.status, 200);
    assert_eq!(fake.stats.requests.load(Ordering::SeqCst), before + 1);
}

/// A POST announcing `len` bytes of body, of which `sent` go out with the head.
fn post_head(len: usize) -> Vec<u8> {
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test]
async fn a_stalled_upload_is_408_and_closed_a_slow_one_is_served() {
    let fake = start_fake().await;
    let mut config = test_config(&[fake.url()]);
    config.limits.body_idle_timeout_ms = 400;
    let proxy = start_proxy(config).await;
    let body = br#"{"model":"m","prompt":"hello"}"#;

    // Stalled: the head and 3 bytes, then nothing.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(&post_head(body.len())).await.unwrap();
    s.write_all(&body[..3]).await.unwrap();
    let started = Instant::now();
    let raw = read_all(&mut s, QUICK).await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(status(&raw), Some(408), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    // read_all returned before QUICK: the proxy closed the connection.
    assert!(took < QUICK, "connection left open after the 408");
    assert_eq!(fake.stats.requests.load(Ordering::SeqCst), 0);

    // Slow but steady: a byte every 100 ms (a quarter of the idle deadline) is served.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(&post_head(body.len())).await.unwrap();
    for b in body.chunks(3) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(b).await.unwrap();
    }
    let raw = read_all(&mut s, Duration::from_secs(2)).await;
    assert_eq!(status(&raw), Some(200), "{}", String::from_utf8_lossy(&raw));
}

#[tokio::test]
async fn connections_over_the_limit_are_closed_at_once_and_served_again_after() {
    let fake = start_fake().await;
    let mut config = test_config(&[fake.url()]);
    config.limits.max_connections = 4;
    let proxy = start_proxy(config).await;
    // Four idle keep-alive connections, each past its first request.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(QUICK, tokio::io::AsyncReadExt::read(&mut s, &mut buf))
            .await
            .expect("first request answered")
            .unwrap();
        assert_eq!(status(&buf[..n]), Some(200));
        held.push(s);
    }
    // The fifth is accepted and closed: EOF (or reset), nothing served.
    let fifth = head_with("");
    let raw = exchange(proxy.addr, &fifth, QUICK).await;
    assert!(raw.is_empty(), "{}", String::from_utf8_lossy(&raw));
    // One held connection goes away: a new one is served.
    drop(held.pop());
    let mut served = false;
    for _ in 0..100 {
        if status(&exchange(proxy.addr, &fifth, QUICK).await) == Some(200) {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "a freed slot was never reused");
}

#[tokio::test]
async fn admin_answers_through_the_drain_and_stops_after_the_public_port() {
    let fake = start_fake().await;
    let mut config = test_config(&[fake.url()]);
    config.server.drain_delay_ms = 800;
    let mut proxy = start_proxy(config).await;
    let c = client();
    assert_eq!(
        send(&c, get(&proxy.admin_url("/healthz"))).await.0.status,
        200
    );
    // A connection to the admin port held open across the drain is answered and then closed.
    let mut held = TcpStream::connect(proxy.admin).await.unwrap();
    drop(proxy.stop.take());
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Draining: the admin port still answers, /readyz says 503.
    let (parts, _) = send(&c, get(&proxy.admin_url("/readyz"))).await;
    assert_eq!(parts.status, 503);
    held.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let raw = read_all(&mut held, QUICK).await;
    assert_eq!(status(&raw), Some(200));
    tokio::time::timeout(QUICK, &mut proxy.task)
        .await
        .expect("proxy stopped")
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(proxy.admin).await.is_err(),
        "admin port still open"
    );
}

#[tokio::test]
async fn a_stalled_tls_handshake_is_cut_at_its_deadline_not_the_header_deadline() {
    let fake = start_fake().await;
    let tls = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let mut config = test_config(&[fake.url()]);
    config.server.tls_cert = Some(tls.join("cert.pem"));
    config.server.tls_key = Some(tls.join("key.pem"));
    config.server.header_read_timeout_ms = 60_000;
    config.limits.tls_handshake_timeout_ms = 300;
    let proxy = start_proxy(config).await;
    // The first byte of a ClientHello record, then silence.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(&[0x16]).await.unwrap();
    let started = Instant::now();
    let raw = read_all(&mut s, Duration::from_secs(30)).await;
    assert!(raw.is_empty());
    // Well before the 60 s header deadline: the handshake deadline closed it.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}
