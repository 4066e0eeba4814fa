//! The keep-alive race: an upstream that closes idle keep-alive
//! connections at 5 s, as uvicorn (vLLM's server) does by default, and requests spaced so the
//! proxy would take such a connection from its pool just as the upstream closes it. A reused
//! connection closed under a request that was already written is a 502 the client never
//! deserved. Criterion: no 502 (every request 200) in 5 minutes, with at least half of the
//! requests sent after an idle gap within 10 ms of the upstream's 5 s.
//!
//! `cargo test --test it attack::keepalive -- --ignored --nocapture` (5 min; set
//! `GOODPUT_KEEPALIVE_SECS` for another duration, `GOODPUT_KEEPALIVE_POOL_IDLE_MS` to try the
//! proxy with another pool idle timeout, e.g. the 90 s it had before).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::support::proxy::{client, post_json, start_proxy, test_config, SLOW};

/// uvicorn's `--timeout-keep-alive` default, which vLLM keeps.
const UPSTREAM_IDLE: Duration = Duration::from_secs(5);
/// One-way delay between pods that the upstream models in the long test (loopback has none).
const NETWORK_LATENCY: Duration = Duration::from_millis(1);

/// What the upstream saw.
#[derive(Default)]
struct Upstream {
    /// POST requests served (probes and model lists not counted).
    requests: AtomicU64,
    connections: AtomicU64,
    /// Connections it closed because they sat idle for `UPSTREAM_IDLE`.
    closed_idle: AtomicU64,
    /// Connections the peer (the proxy) closed first.
    closed_by_peer: AtomicU64,
    /// Requests that arrived just as the idle deadline came (see `NETWORK_LATENCY`): the
    /// connection closed under them. Each would be a 502 unless the proxy never sends there.
    lost_in_flight: AtomicU64,
}

/// A minimal HTTP/1.1 server with uvicorn's keep-alive behaviour: after each response it waits
/// at most `UPSTREAM_IDLE` for the next request, then closes the connection; a request that
/// arrives within `latency` of that deadline is lost with it (the race as it happens between
/// machines).
async fn upstream(stats: Arc<Upstream>, latency: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            stats.connections.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(serve(s, stats.clone(), latency));
        }
    });
    addr
}

async fn serve(mut s: TcpStream, stats: Arc<Upstream>, latency: Duration) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::with_capacity(4096);
    // When the last response was written: the idle clock starts there.
    let mut idle_since: Option<Instant> = None;
    loop {
        // Wait for the start of the next request: forever on a new connection (the proxy
        // writes at once), until `UPSTREAM_IDLE` after a response.
        let mut chunk = [0u8; 4096];
        let read = match idle_since {
            None => Ok(s.read(&mut chunk).await),
            Some(t) => tokio::time::timeout_at(t + UPSTREAM_IDLE, s.read(&mut chunk)).await,
        };
        let n = match read {
            Err(_) => {
                stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(Ok(0)) | Ok(Err(_)) => {
                stats.closed_by_peer.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(Ok(n)) => n,
        };
        if let Some(t) = idle_since {
            // Loopback has no latency; a real network does. A request that reached us within
            // `latency` of the idle deadline was, between pods, still on the wire when the
            // server closed: it is lost with the connection, unanswered.
            let deadline = t + UPSTREAM_IDLE;
            if Instant::now() + latency >= deadline {
                stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                stats.lost_in_flight.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep_until(deadline).await;
                return;
            }
        }
        buf.extend_from_slice(&chunk[..n]);
        // The rest of the head and the body (Content-Length; the proxy sends no chunked bodies).
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + len);
        if head.starts_with("post ") {
            stats.requests.fetch_add(1, Ordering::Relaxed);
        }
        let body = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        idle_since = Some(Instant::now());
    }
}

/// A proxy in front of `up` whose pool holds only the test's requests: probes, model-list
/// refreshes and scrapes share the pool and would move the race.
fn quiet_config(up: &SocketAddr) -> goodput_proxy::config::RawConfig {
    let mut cfg = test_config(&[format!("http://{up}")]);
    cfg.upstream.health_interval_ms = 3_600_000;
    cfg.measure.models_refresh_ms = 3_600_000;
    cfg.measure.models = vec!["tiny".into()];
    cfg.engine.scrape = false;
    if let Some(ms) = env_u64("GOODPUT_KEEPALIVE_POOL_IDLE_MS") {
        cfg.upstream.pool_idle_timeout_ms = ms;
    }
    cfg
}

/// The quick part (CI): the race made certain. The upstream models 60 ms in flight, and the
/// second request leaves 4.97 s after the first answer, so it reaches a pooled connection in
/// the last 60 ms before the upstream's 5 s deadline: lost if the proxy reuses that connection
/// (a 502), served if its pool let the connection go first (`upstream.pool_idle_timeout_ms`
/// below the engine's keep-alive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_racing_the_upstreams_idle_close_is_served() {
    let stats = Arc::new(Upstream::default());
    let up = upstream(stats.clone(), Duration::from_millis(60)).await;
    let proxy = start_proxy(quiet_config(&up)).await;
    let c = client();
    let url = proxy.url("/v1/chat/completions");
    let mut statuses = Vec::new();
    for i in 0..2 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(4_970)).await;
        }
        let req = post_json(&url, r#"{"model":"tiny","messages":[],"max_tokens":1}"#);
        let resp = tokio::time::timeout(SLOW, c.request(req))
            .await
            .expect("answered in time")
            .expect("a response");
        statuses.push(resp.status().as_u16());
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
    }
    let lost = stats.lost_in_flight.load(Ordering::Relaxed);
    assert_eq!(
        statuses,
        [200, 200],
        "{lost} request(s) lost under a closing connection"
    );
    assert_eq!((stats.requests.load(Ordering::Relaxed), lost), (2, 0));
    // The proxy let the idle connection go before the upstream's deadline.
    assert!(stats.closed_by_peer.load(Ordering::Relaxed) >= 1);
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: 5 minutes; see docs/RELIABILITY.md"]
async fn an_upstream_closing_idle_connections_at_5s_causes_no_502() {
    let secs = env_u64("GOODPUT_KEEPALIVE_SECS").unwrap_or(300);
    // Independent pairs (proxy + upstream) so each loop owns the one pooled connection it
    // races on; several at once for more tries per minute.
    const PAIRS: usize = 8;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut loops = Vec::new();
    let mut keep = Vec::new();
    for k in 0..PAIRS {
        let stats = Arc::new(Upstream::default());
        let up = upstream(stats.clone(), NETWORK_LATENCY).await;
        let proxy = start_proxy(quiet_config(&up)).await;
        let url = proxy.url("/v1/chat/completions");
        keep.push(proxy);
        loops.push(tokio::spawn(async move {
            let c = client();
            let (mut sent, mut bad, mut gaps_near) = (0u64, Vec::new(), 0u64);
            let mut j = k as u64;
            while Instant::now() < deadline {
                let req = post_json(&url, r#"{"model":"tiny","messages":[],"max_tokens":1}"#);
                let status = match tokio::time::timeout(SLOW, c.request(req)).await {
                    Ok(Ok(resp)) => {
                        let s = resp.status().as_u16();
                        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
                        s
                    }
                    _ => 0,
                };
                sent += 1;
                if status != 200 {
                    bad.push(status);
                }
                // Sweep the gap across the upstream's deadline in 1 ms steps, -3..+4 ms
                // (tokio's timer has millisecond resolution; scheduling adds the rest).
                let offset_ms = (j % 8) as i64 - 3;
                j += 1;
                let gap = Duration::from_millis((5_000 + offset_ms) as u64);
                let answered = Instant::now();
                tokio::time::sleep_until(answered + gap).await;
                if (answered.elapsed().as_secs_f64() - 5.0).abs() < 0.010 {
                    gaps_near += 1;
                }
            }
            (sent, bad, gaps_near, stats)
        }));
    }
    let (mut sent, mut bad, mut near) = (0, Vec::new(), 0);
    let (mut conns, mut idle_closed, mut peer_closed, mut served, mut lost) = (0, 0, 0, 0, 0);
    for l in loops {
        let (s, b, g, st) = l.await.unwrap();
        sent += s;
        bad.extend(b);
        near += g;
        conns += st.connections.load(Ordering::Relaxed);
        idle_closed += st.closed_idle.load(Ordering::Relaxed);
        peer_closed += st.closed_by_peer.load(Ordering::Relaxed);
        served += st.requests.load(Ordering::Relaxed);
        lost += st.lost_in_flight.load(Ordering::Relaxed);
    }
    eprintln!(
        "keep-alive race: {sent} requests over {secs} s ({PAIRS} pairs), not 200: {} {bad:?}; \
         gaps within 10 ms of 5 s: {near}; upstream: {served} requests on {conns} connections, \
         {idle_closed} closed by its idle deadline ({lost} under a request), {peer_closed} closed by \
         the proxy first",
        bad.len()
    );
    // The race was really run: requests kept coming at ~5 s gaps for the whole time.
    let expected = secs * PAIRS as u64 / 6;
    assert!(
        sent >= expected,
        "only {sent} requests (want >= {expected})"
    );
    // Half at least: on a machine at load 14 a sleep overshoots by more than 10 ms now and
    // then (measured: 290 of 480 near); those requests do not race, the others do.
    assert!(near * 2 >= sent, "{near} of {sent} gaps near 5 s");
    assert!(
        bad.is_empty(),
        "{} of {sent} requests were not 200: {bad:?}",
        bad.len()
    );
    drop(keep);
}
