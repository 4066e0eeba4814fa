//! API keys and tenants. Pass criteria:
//! - no key, a wrong key, a non-Bearer `Authorization`, a key in the query string: 401 in
//!   OpenAI's shape (`invalid_request_error` / `invalid_api_key`), the simulator's request
//!   counter unchanged, each recorded `rejected` with no tenant (JSONL record `tenant: null`,
//!   `goodput_proxy_tenant_requests_total{tenant="none",outcome="rejected"}`);
//! - each tenant's key is served and attributed to that tenant, never to another;
//! - the 401 arrives while the client is still uploading a large body;
//! - the client's key never reaches the upstream; `upstream.api_key` replaces it;
//! - SIGHUP re-reads the keys file (a broken file keeps the keys in use); a key sent in the
//!   query string appears in no log line;
//! - tenant limits: 429 with `Retry-After` in OpenAI's rate-limit shape, recorded `rejected`
//!   under the tenant; another tenant is not affected.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::*;
use crate::support::binary;
use crate::support::meter::*;
use crate::support::prom::metric;
use crate::support::proxy::*;
use goodput_proxy::auth::{digest_of, hex};
use goodput_proxy::config::{RawConfig, RawTenant};
use goodput_sim::SimConfig;

const KEY_A: &str = "gp-test-key-of-team-a";
const KEY_B: &str = "gp-test-key-of-team-b";

fn digest(key: &str) -> String {
    hex(&digest_of(key.as_bytes()))
}

fn tenant(key: &str) -> RawTenant {
    RawTenant {
        keys: vec![digest(key)],
        ..RawTenant::default()
    }
}

/// Tenants `team-a` and `team-b`, one key each, records to `records`.
fn auth_config(upstream: &str, records: &std::path::Path) -> RawConfig {
    let mut c = meter_config(upstream);
    c.auth.tenants.insert("team-a".into(), tenant(KEY_A));
    c.auth.tenants.insert("team-b".into(), tenant(KEY_B));
    c.measure.sink_path = Some(records.to_path_buf());
    c
}

fn with_header(
    mut req: http::Request<http_body_util::Full<bytes::Bytes>>,
    k: &str,
    v: &str,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    req.headers_mut().append(
        http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
        v.parse().unwrap(),
    );
    req
}

/// Waits for `n` whole lines in the JSONL sink and returns the whole ones (ended by their
/// newline: the sink's writer thread may be in the middle of the next).
async fn records(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        eventually(SLOW, || read().matches('\n').count() >= n).await,
        "{}",
        read()
    );
    let text = read();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn assert_401(status: http::StatusCode, body: &[u8]) {
    assert_eq!(status, 401, "{}", String::from_utf8_lossy(body));
    let v: serde_json::Value = serde_json::from_slice(body).expect("JSON error body");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    assert!(v["error"]["param"].is_null(), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_key_get_401_and_never_reach_the_engine() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let dir = crate::support::temp_dir("auth-401");
    let path = dir.path().join("records.jsonl");
    let proxy = start_proxy(auth_config(&sim.base_url(), &path)).await;
    let c = client();
    let chat = || post_json(&proxy.url(CHAT), &chat_body(4, ""));
    let refused = [
        ("no key", chat()),
        (
            "wrong key",
            with_header(chat(), "authorization", "Bearer gp-not-a-key"),
        ),
        (
            "wrong x-api-key",
            with_header(chat(), "x-api-key", "gp-not-a-key"),
        ),
        (
            "basic auth",
            with_header(chat(), "authorization", "Basic Z3A6Z3A="),
        ),
        (
            "key in the query, good header",
            with_header(
                post_json(
                    &proxy.url(&format!("{CHAT}?api_key={KEY_A}")),
                    &chat_body(4, ""),
                ),
                "authorization",
                &format!("Bearer {KEY_A}"),
            ),
        ),
        ("unknown path, no key", get(&proxy.url("/v1/nope"))),
    ];
    let n = refused.len();
    for (what, req) in refused {
        let (parts, body) = send(&c, req).await;
        assert_401(parts.status, &body);
        assert_eq!(parts.headers["www-authenticate"], "Bearer", "{what}");
        assert!(
            !String::from_utf8_lossy(&body).contains(KEY_A),
            "{what}: the key is echoed"
        );
    }
    assert_eq!(
        sim.requests_started(),
        0,
        "a refused request reached the engine"
    );
    let m = metrics(&proxy).await;
    let none_rejected = [("tenant", "none"), ("outcome", "rejected")];
    assert_eq!(
        metric(&m, "goodput_proxy_tenant_requests_total", &none_rejected),
        n as f64
    );
    let lines = records(&path, n).await;
    for r in &lines {
        assert_eq!(r["outcome"], "rejected", "{r}");
        assert_eq!(r["status"], 401, "{r}");
        assert!(r["tenant"].is_null(), "{r}");
    }

    // Each tenant's key is served and attributed to that tenant only.
    let seen = observe(
        &c,
        with_header(chat(), "authorization", &format!("Bearer {KEY_A}")),
        true,
    )
    .await;
    assert_eq!(seen.status, 200);
    let seen = observe(&c, with_header(chat(), "x-api-key", KEY_B), true).await;
    assert_eq!(seen.status, 200);
    let seen = observe(
        &c,
        with_header(chat(), "authorization", &format!("bearer {KEY_B}")),
        true,
    )
    .await;
    assert_eq!(seen.status, 200);
    assert_eq!(sim.requests_started(), 3);
    let lines = records(&path, n + 3).await;
    let tenants: Vec<&str> = lines[n..]
        .iter()
        .map(|r| r["tenant"].as_str().unwrap_or("-"))
        .collect();
    assert_eq!(tenants, ["team-a", "team-b", "team-b"]);
    let m = metrics(&proxy).await;
    let count = |t: &str| {
        metric(
            &m,
            "goodput_proxy_tenant_requests_total",
            &[("tenant", t), ("outcome", "success")],
        )
    };
    assert_eq!((count("team-a"), count("team-b")), (1.0, 2.0));
    // Usage is injected and counted per tenant: 4 completion tokens plus the prompt's.
    let tokens = metric(
        &m,
        "goodput_proxy_tenant_tokens_total",
        &[("tenant", "team-a")],
    );
    assert!(tokens > 4.0, "{tokens}");
    assert_eq!(
        metric(&m, "goodput_proxy_tenant_requests_total", &none_rejected),
        n as f64,
        "nothing more under no tenant"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_401_arrives_while_the_client_is_still_uploading() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let dir = crate::support::temp_dir("auth-upload");
    let proxy = start_proxy(auth_config(&sim.base_url(), &dir.path().join("r.jsonl"))).await;
    // 16 MiB announced (under the 32 MiB body limit), 64 KiB sent, then nothing: a proxy that
    // read the body first would wait for the rest (and the 408 idle timeout) instead.
    let announced = 16 << 20;
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         authorization: Bearer gp-not-a-key\r\ncontent-length: {announced}\r\n\r\n"
    );
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![b' '; 64 << 10]).await.unwrap();
    let t = tokio::time::Instant::now();
    let raw = read_all(&mut s, Duration::from_secs(5)).await;
    assert_eq!(status(&raw), Some(401), "{}", String::from_utf8_lossy(&raw));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the answer waited for the body"
    );
    eprintln!("401 while uploading after {:?}", t.elapsed());
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("invalid_api_key"), "{text}");
    assert_eq!(sim.requests_started(), 0);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_key_is_not_forwarded_and_the_upstream_key_replaces_it() {
    let fake = start_fake().await;
    let dir = crate::support::temp_dir("auth-fwd");
    let echo = |proxy: &Proxy| {
        let req = post_json(&proxy.url("/v1/models"), "{}");
        let req = with_header(req, "authorization", &format!("Bearer {KEY_A}"));
        let req = with_header(req, "x-api-key", KEY_A);
        with_header(req, "x-fake-echo", "1")
    };
    let forwarded = |body: &[u8], name: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h[0] == name)
            .map(|h| h[1].as_str().unwrap().to_string())
            .collect()
    };
    let c = client();
    // Without an upstream key: the client's credentials are removed, nothing replaces them.
    let proxy = start_proxy(auth_config(&fake.url(), &dir.path().join("a.jsonl"))).await;
    let (parts, body) = send(&c, echo(&proxy)).await;
    assert_eq!(parts.status, 200);
    assert!(
        forwarded(&body, "authorization").is_empty(),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(forwarded(&body, "x-api-key").is_empty());
    // With one: it is the only Authorization the upstream sees.
    let mut config = auth_config(&fake.url(), &dir.path().join("b.jsonl"));
    config.upstream.api_key = Some("upstream-secret".into());
    let proxy = start_proxy(config).await;
    let (parts, body) = send(&c, echo(&proxy)).await;
    assert_eq!(parts.status, 200);
    assert_eq!(
        forwarded(&body, "authorization"),
        ["Bearer upstream-secret"]
    );
    assert!(forwarded(&body, "x-api-key").is_empty());
    assert!(!String::from_utf8_lossy(&body).contains(KEY_A));
}

/// Waits for a stderr line of the binary containing `what`; every line read is kept in `seen`.
fn wait_line(bin: &binary::Binary, what: &str, seen: &mut Vec<String>) -> bool {
    let deadline = tokio::time::Instant::now() + QUICK;
    while tokio::time::Instant::now() < deadline {
        if let Ok(line) = bin.lines.recv_timeout(Duration::from_millis(100)) {
            let hit = line.contains(what);
            seen.push(line);
            if hit {
                return true;
            }
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_keys_file_and_a_query_key_is_never_logged() {
    let fake = start_fake().await;
    let dir = crate::support::temp_dir("auth-hup");
    let file = dir.path().join("keys.toml");
    let write = |keys: &[&str]| {
        let list: Vec<String> = keys.iter().map(|k| format!("\"{}\"", digest(k))).collect();
        std::fs::write(
            &file,
            format!("[tenants.team-f]\nkeys = [{}]\n", list.join(", ")),
        )
        .unwrap();
    };
    write(&[KEY_A]);
    let bin = binary::spawn(
        &fake.url(),
        &[
            ("GOODPUT_PROXY_AUTH_KEYS_FILE", file.display().to_string()),
            ("RUST_LOG", "goodput_proxy=debug,info".to_string()),
        ],
    );
    let c = client();
    // Not `GET /v1/models`: the fake does not count that one (the proxy's model learning).
    let url = format!("http://{}/v1/keys-probe", bin.addr);
    let status_with = |key: &str| {
        let req = with_header(get(&url), "authorization", &format!("Bearer {key}"));
        let c = c.clone();
        async move { send(&c, req).await.0.status.as_u16() }
    };
    assert_eq!(status_with(KEY_A).await, 200);
    assert_eq!(status_with(KEY_B).await, 401);

    // The file now holds key B only.
    write(&[KEY_B]);
    bin.signal("HUP");
    let mut seen = Vec::new();
    assert!(
        wait_line(&bin, "API keys reloaded", &mut seen),
        "no reload logged"
    );
    assert_eq!(status_with(KEY_B).await, 200);
    assert_eq!(status_with(KEY_A).await, 401);

    // A broken file: the keys in use stay.
    std::fs::write(&file, "[tenants.team-f]\nkeys = [\"not-a-digest\"]\n").unwrap();
    bin.signal("HUP");
    assert!(
        wait_line(&bin, "API keys reload failed", &mut seen),
        "no failure logged"
    );
    assert_eq!(status_with(KEY_B).await, 200);

    // A key in the query string: 401, and the value appears in no log line.
    let secret = "gp-query-secret-7f3a9c";
    let req = with_header(
        get(&format!("{url}?api_key={secret}")),
        "x-request-id",
        "query-key-probe",
    );
    let (parts, _) = send(&c, req).await;
    assert_eq!(parts.status, 401);
    assert_eq!(
        fake.stats
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        3,
        "only the 3 good keys"
    );
    // Its access line (written when the response body ended) proves its logging is done.
    let is_access = |l: &String| l.contains("query-key-probe") && l.contains("access");
    let mut found = false;
    while !found && wait_line(&bin, "query-key-probe", &mut seen) {
        found = seen.last().is_some_and(is_access);
    }
    assert!(found, "no access line");
    let access = seen.last().unwrap();
    assert!(
        access.contains("status=401") && access.contains("/v1/keys-probe"),
        "{access}"
    );
    assert!(seen.iter().all(|l| !l.contains(secret)), "logged: {seen:?}");
    drop(bin);
}

fn assert_429(parts: &http::response::Parts, body: &[u8], kind: &str) -> u64 {
    assert_eq!(parts.status, 429, "{}", String::from_utf8_lossy(body));
    let v: serde_json::Value = serde_json::from_slice(body).expect("JSON error body");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert!(v["error"]["param"].is_null(), "{v}");
    let retry: u64 = parts.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1, "Retry-After {retry}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("try again in {retry}s")),
        "{message}"
    );
    retry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_limits_answer_429_with_retry_after_and_spare_other_tenants() {
    let fake = start_fake().await;
    let dir = crate::support::temp_dir("auth-limits");
    let path = dir.path().join("records.jsonl");
    let mut config = auth_config(&fake.url(), &path);
    let tenants = &mut config.auth.tenants;
    tenants.get_mut("team-a").unwrap().max_in_flight = Some(1);
    tenants.get_mut("team-b").unwrap().tokens_per_minute = Some(10);
    let proxy = start_proxy(config).await;
    let c = client();
    let stream = |key: &str, events: u64, delay_ms: u64| {
        let req = fake_stream_request(&proxy.url(CHAT), events, delay_ms);
        with_header(req, "authorization", &format!("Bearer {key}"))
    };

    // team-a: one stream in flight (30 events at 100 ms) is its limit.
    let held = tokio::time::timeout(SLOW, c.request(stream(KEY_A, 30, 100)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.status(), 200);
    let (parts, body) = send(&c, stream(KEY_A, 1, 0)).await;
    let retry = assert_429(&parts, &body, "requests");
    assert_eq!(retry, 1, "server.retry_after_s");
    // Another tenant is not affected.
    let (parts, _) = send(&c, stream(KEY_B, 3, 0)).await;
    assert_eq!(parts.status, 200);
    // The permit goes with the stream (once the proxy sees the client gone: a few ms; the
    // refusals meanwhile are counted).
    drop(held);
    let mut a_refused = 1;
    let mut freed = false;
    for _ in 0..200 {
        match send(&c, stream(KEY_A, 1, 0)).await.0.status.as_u16() {
            200 => {
                freed = true;
                break;
            }
            429 => a_refused += 1,
            other => panic!("status {other}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "team-a's permit was not released with its stream");

    // team-b: 10 tokens a minute. Its first stream (3 events) left 7; this one (20) is
    // admitted and puts the bucket 13 in debt; the next waits (13 + 1) / (10/60 s) = 84 s.
    let (parts, _) = send(&c, stream(KEY_B, 20, 0)).await;
    assert_eq!(parts.status, 200);
    let before = fake
        .stats
        .requests
        .load(std::sync::atomic::Ordering::SeqCst);
    let (parts, body) = send(&c, stream(KEY_B, 1, 0)).await;
    let retry = assert_429(&parts, &body, "tokens");
    eprintln!("token limit: Retry-After {retry}");
    assert!((80..=84).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        fake.stats
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        before,
        "a refused request reached the upstream"
    );
    // team-a still has its budget (none).
    let (parts, _) = send(&c, stream(KEY_A, 1, 0)).await;
    assert_eq!(parts.status, 200);

    let m = metrics(&proxy).await;
    for (t, n) in [("team-a", a_refused), ("team-b", 1)] {
        let labels = [("tenant", t), ("outcome", "rejected")];
        assert_eq!(
            metric(&m, "goodput_proxy_tenant_requests_total", &labels),
            n as f64,
            "{t}"
        );
    }
    // The sink writes off the request path: wait for both refusals' records.
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    let refusals = || {
        read()
            .lines()
            .filter(|l| l.contains("\"status\":429"))
            .count()
    };
    assert!(
        eventually(SLOW, || refusals() == a_refused + 1).await,
        "{}",
        read()
    );
    let lines: Vec<serde_json::Value> = read()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let limited: Vec<&str> = lines
        .iter()
        .filter(|r| r["status"] == 429)
        .map(|r| {
            assert_eq!(r["outcome"], "rejected", "{r}");
            r["tenant"].as_str().unwrap()
        })
        .collect();
    let mut want = vec!["team-a"; a_refused];
    want.push("team-b");
    assert_eq!(limited, want);
}
