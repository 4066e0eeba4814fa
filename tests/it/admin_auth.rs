//! The admin token (`[admin] token_sha256`): every admin path with no token, a wrong one and
//! the right one (as a bearer token and as HTTP Basic's password); the probes and, unless
//! `metrics_public = false`, `/metrics` open without it; `/trace` and raw records only when
//! switched on. The Chromium test signs in the way a browser does (Basic) and checks that the
//! live page loads its data.

use base64::Engine as _;
use http::{header, HeaderValue, StatusCode};

use crate::support::meter::*;
use crate::support::proxy::*;
use goodput_proxy::auth::{digest_of, hex};
use goodput_sim::SimConfig;

const TOKEN: &str = "s3cret-admin-token";

fn basic(user_and_token: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_and_token)
    )
}

async fn status(proxy: &Proxy, path: &str, auth: Option<&str>) -> (StatusCode, http::HeaderMap) {
    let mut req = get(&proxy.admin_url(path));
    if let Some(a) = auth {
        req.headers_mut()
            .insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
    }
    let (parts, _) = send(&client(), req).await;
    (parts.status, parts.headers)
}

async fn proxy_with(
    token: bool,
    metrics_public: bool,
    content: bool,
) -> (Proxy, goodput_sim::SimHandle) {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let mut cfg = meter_config(&sim.base_url());
    if token {
        cfg.admin.token_sha256 = Some(format!("sha256:{}", hex(&digest_of(TOKEN.as_bytes()))));
    }
    cfg.admin.metrics_public = metrics_public;
    cfg.admin.trace = content;
    cfg.admin.records = content;
    let proxy = start_proxy(cfg).await;
    // /readyz answers 503 until the first health probe of the upstream has passed (on a busy
    // machine that can take a while): the tests below expect a ready proxy, so wait for it.
    // /readyz is open whatever the token, so the wait itself checks nothing of the guard.
    let mut ready = false;
    for _ in 0..200 {
        if status(&proxy, "/readyz", None).await.0 == StatusCode::OK {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(ready, "/readyz never turned 200 with a healthy upstream");
    (proxy, sim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_path_with_no_token_a_wrong_one_and_the_right_one() {
    let (proxy, _sim) = proxy_with(true, true, true).await;
    let right_basic = basic(&format!("admin:{TOKEN}"));
    let any_user = basic(&format!(":{TOKEN}"));
    let wrong_basic = basic("admin:guess");
    let right_bearer = format!("Bearer {TOKEN}");
    // (path, status with the right token; without or with a wrong one: 401 unless open)
    let paths: [(&str, u16, bool); 9] = [
        ("/healthz", 200, true),
        ("/readyz", 200, true),
        ("/metrics", 200, true),
        ("/", 200, false),
        ("/dashboard.json", 200, false),
        ("/stats", 200, false),
        ("/stats?records=3", 200, false),
        ("/trace/no-such-request", 404, false),
        ("/no-such-path", 404, false),
    ];
    let wrong = [
        None,
        Some("Bearer guess"),
        Some(wrong_basic.as_str()),
        Some(TOKEN),
    ];
    let right = [
        right_bearer.as_str(),
        right_basic.as_str(),
        any_user.as_str(),
    ];
    for (path, ok, open) in paths {
        for auth in wrong {
            let (s, h) = status(&proxy, path, auth).await;
            if open {
                assert_eq!(s.as_u16(), ok, "{path} with {auth:?}: open");
            } else {
                assert_eq!(s, StatusCode::UNAUTHORIZED, "{path} with {auth:?}");
                let challenges: Vec<&str> = h
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .map(|v| v.to_str().unwrap())
                    .collect();
                assert!(
                    challenges.iter().any(|c| c.starts_with("Basic realm="))
                        && challenges.iter().any(|c| c.starts_with("Bearer realm=")),
                    "{path}: {challenges:?}"
                );
            }
        }
        for auth in right {
            let (s, _) = status(&proxy, path, Some(auth)).await;
            assert_eq!(s.as_u16(), ok, "{path} with {auth:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_need_the_token_too() {
    let (proxy, _sim) = proxy_with(true, false, true).await;
    assert_eq!(
        status(&proxy, "/metrics", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        status(&proxy, "/metrics", Some(&bearer)).await.0,
        StatusCode::OK
    );
    assert_eq!(status(&proxy, "/readyz", None).await.0, StatusCode::OK);
}

/// Without a token nothing asks for one; traces and raw records stay off unless switched on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_switches_default_off() {
    let (proxy, _sim) = proxy_with(false, true, false).await;
    let c = client();
    let mut req = post_json(&proxy.url(CHAT), &chat_body(4, ""));
    let h = req.headers_mut();
    h.insert("x-goodput-trace", HeaderValue::from_static("1"));
    h.insert("x-request-id", HeaderValue::from_static("secret-id"));
    send(&c, req).await;
    wait_requests(&proxy, 1).await;
    let (parts, body) = send(&c, get(&proxy.admin_url("/trace/secret-id"))).await;
    assert_eq!(parts.status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&body).contains("admin.trace = false"));
    let (parts, body) = send(&c, get(&proxy.admin_url("/stats?records=1"))).await;
    assert_eq!(parts.status, StatusCode::FORBIDDEN);
    assert!(String::from_utf8_lossy(&body).contains("admin.records = false"));
    assert_eq!(status(&proxy, "/stats", None).await.0, StatusCode::OK);
    let doc = get_text(&proxy.admin_url("/dashboard.json")).await;
    assert!(!doc.contains("secret-id"), "{doc}");
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let slow = &doc["panels"]["slowest"]["requests"][0];
    assert_eq!(slow["id"], serde_json::Value::Null, "{slow}");
    assert_eq!(slow["trace"], false);
}

/// With records on: the latest raw records of the window, bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_records_when_switched_on() {
    let (proxy, _sim) = proxy_with(false, true, true).await;
    let c = client();
    for i in 0..3 {
        let mut req = post_json(&proxy.url(CHAT), &chat_body(4, ""));
        req.headers_mut().insert(
            "x-request-id",
            HeaderValue::from_str(&format!("r{i}")).unwrap(),
        );
        send(&c, req).await;
    }
    wait_requests(&proxy, 3).await;
    let doc = stats(&proxy, "window=60&records=2").await;
    let ids: Vec<&str> = doc["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["r2", "r1"], "the latest first");
    assert_eq!(doc["requests"], 3);
    for bad in ["records=0", "records=1001", "records=x"] {
        let (parts, _) = send(&c, get(&proxy.admin_url(&format!("/stats?{bad}")))).await;
        assert_eq!(parts.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a chromium binary"]
async fn dashboard_in_headless_chromium_signs_in_with_the_admin_token() {
    let (proxy, _sim) = proxy_with(true, true, true).await;
    send(&client(), post_json(&proxy.url(CHAT), &chat_body(4, ""))).await;
    // (`/stats` needs the token here: the record is in the ring once the body has ended.)
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let dir = crate::support::temp_dir("admin-chromium");
    let profile = dir.path().join("profile");
    // What a browser sends after its sign-in prompt: the credentials of the URL, as Basic.
    let url = format!("http://admin:{TOKEN}@{}/", proxy.admin);
    let args = vec![
        "--virtual-time-budget=3000".to_string(),
        "--dump-dom".to_string(),
        url,
    ];
    let dom = tokio::task::spawn_blocking(move || crate::dashboard::chromium(&args, &profile))
        .await
        .unwrap();
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    let s = crate::dashboard::section(&dom, "goodput");
    assert!(s.contains("data-ok=\"1\"") && s.contains(">tiny<"), "{s}");
}
