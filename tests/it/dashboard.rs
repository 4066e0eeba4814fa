//! The admin port's dashboard: `/` serves the page, `/dashboard.json` its data, after live
//! traffic through two simulated engines (streams, traced streams, tool calls, truncations).
//! The headless-Chromium test loads the page from the running proxy and checks every panel's
//! DOM (needs a `chromium` binary, hence `#[ignore]`; CI runs it with the report's Chromium
//! test):
//!   cargo test --workspace --test it chromium -- --ignored
//! Set `DASHBOARD_SCREENSHOT=path.png` to keep its screenshot (the README's).

use std::path::Path;
use std::time::Duration;

use crate::support::meter::*;
use crate::support::prom::try_metric;
use crate::support::proxy::*;
use goodput_sim::{Jitter, SimConfig};
use http_body_util::BodyExt;
use serde_json::Value;

const TOOLS: &str = r#","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}}"#;

/// Plain streams sent, 4 at a time.
const STREAMS: usize = 24;
/// Each kind of request beside the plain streams: (request id, fault, body extra, max_tokens,
/// traced). The traced ones are the longest, so they top the slowest list.
const SPECIAL: [(&str, &str, &str, u32, bool); 5] = [
    ("slow-traced-0", "", "", 60, true),
    ("slow-traced-1", "", "", 50, true),
    ("tool-valid", "tool-call=valid", TOOLS, 40, false),
    ("tool-bad-json", "tool-call=invalid-json", TOOLS, 40, false),
    ("cut-short", "truncate-after=2", "", 20, false),
];

/// Two simulated engines behind a proxy that scrapes them every 100 ms, and traffic through it;
/// returns once the engines' pages after the traffic have been scraped.
async fn proxy_with_traffic() -> (Proxy, [goodput_sim::SimHandle; 2]) {
    let sim = |seed| SimConfig {
        seed,
        jitter: Jitter::Lognormal,
        jitter_cv: 0.3,
        // Engine timings per request: the TTFT split panel has data.
        enable_per_request_metrics: true,
        ..SimConfig::with_timing(20.0, 4.0)
    };
    let (a, b) = (start_sim(sim(1)).await, start_sim(sim(2)).await);
    let mut cfg = test_config(&[a.base_url(), b.base_url()]);
    cfg.measure.models = vec!["tiny".into()];
    cfg.engine.scrape_interval_ms = 100;
    let proxy = start_proxy(cfg).await;
    let c = client();
    let deadline = tokio::time::Instant::now() + SLOW;
    loop {
        let m = metrics(&proxy).await;
        if try_metric(&m, "goodput_proxy_upstream_healthy", &[]) == Some(2.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replicas not healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for chunk in (0..STREAMS).collect::<Vec<_>>().chunks(4) {
        let sends = chunk.iter().map(|i| {
            let c = c.clone();
            let url = proxy.url(CHAT);
            async move {
                let mut req = post_json(&url, &chat_body(8 + (*i as u32 % 8), ""));
                req.headers_mut()
                    .insert("x-request-id", format!("plain-{i}").parse().unwrap());
                send(&c, req).await
            }
        });
        futures_util::future::join_all(sends).await;
    }
    for (id, fault, extra, max_tokens, traced) in SPECIAL {
        let mut req = post_json(&proxy.url(CHAT), &chat_body(max_tokens, extra));
        if !fault.is_empty() {
            req = with_fault(req, fault);
        }
        let h = req.headers_mut();
        h.insert("x-request-id", id.parse().unwrap());
        if traced {
            h.insert("x-goodput-trace", "1".parse().unwrap());
        }
        // The truncated stream's body ends in an error: read what comes.
        let resp = c.request(req).await.expect("response head");
        let _ = resp.into_body().collect().await;
    }
    wait_requests(&proxy, (STREAMS + SPECIAL.len()) as u64).await;
    // The engines' pages after the traffic (scraped every 100 ms).
    tokio::time::sleep(Duration::from_millis(400)).await;
    (proxy, [a, b])
}

async fn document(proxy: &Proxy, query: &str) -> (u16, Value, usize) {
    let (parts, body) = send(
        &client(),
        get(&proxy.admin_url(&format!("/dashboard.json{query}"))),
    )
    .await;
    let doc = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (parts.status.as_u16(), doc, body.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_shows_the_traffic_panel_by_panel() {
    let _serial = crate::support::serial().await;
    let (proxy, _sims) = proxy_with_traffic().await;
    let (status, doc, bytes) = document(&proxy, "?window=60").await;
    assert_eq!(status, 200, "{doc}");
    assert!(bytes < 32 << 10, "the document is {bytes} bytes");
    let p = &doc["panels"];
    let total = (STREAMS + SPECIAL.len()) as u64;

    assert_eq!(p["traffic"]["requests"], total, "{}", p["traffic"]);
    assert!(p["traffic"]["recent_requests_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(p["traffic"]["in_flight"], 0);

    let models = p["goodput"]["models"].as_array().unwrap();
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0]["model"], "tiny");
    assert_eq!(models[0]["requests"], total);
    assert_eq!(models[0]["outcomes"]["truncated"], 1);
    assert_eq!(models[0]["outcomes"]["success"], total - 1);

    let replicas = p["replicas"]["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2);
    for r in replicas {
        assert_eq!(r["healthy"], true, "{r}");
        assert_eq!(r["engine_scraped"], true, "{r}");
        assert_eq!(r["engine_waiting"], 0.0, "{r}");
    }

    // compare's table per upstream: every figure filled for TTFT at p50 on both replicas.
    let groups = p["latency"]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{}", p["latency"]);
    for g in groups {
        assert_eq!(g["model"], "tiny");
        let ttft = &g["rows"][0];
        assert_eq!(ttft["quantity"], "ttft");
        let p50 = &ttft["cells"][0];
        for k in ["exact", "proxy_hist", "engine_hist", "bucket_width"] {
            assert!(p50[k].as_f64().is_some(), "{k} of {g}");
        }
        assert_eq!(
            ttft["exact_count"].as_f64(),
            ttft["proxy_count"].as_f64(),
            "exact and histogram count the same requests: {g}"
        );
    }

    // Every request was routed: why, per replica, beside the balancer's view of each.
    let routing = &p["routing"];
    assert_eq!(routing["strategy"], "auto", "{routing}");
    let routed: u64 = routing["reasons"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(routed, total, "{routing}");
    let routed_replicas = routing["replicas"].as_array().unwrap();
    assert_eq!(routed_replicas.len(), 2, "{routing}");
    for r in routed_replicas {
        assert!(r["load_tokens"].as_u64().is_some(), "{r}");
        assert!(r["attainment"].as_f64().is_some(), "{r}");
        assert!(!r["reasons"].as_object().unwrap().is_empty(), "{r}");
    }

    // Where TTFT went, per upstream: every request that got its usage chunk (all but the
    // truncated one) was split, and the recent means are the parts of the same requests.
    let split = &p["ttft_split"];
    let groups = split["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{split}");
    let requests: u64 = groups.iter().map(|g| g["requests"].as_u64().unwrap()).sum();
    assert_eq!(requests, total - 1, "{split}");
    for g in groups {
        for part in [
            "client_ttft",
            "proxy",
            "engine_queue",
            "engine_prefill",
            "rest",
            "engine_hist_ttft",
        ] {
            for q in ["p50", "p99"] {
                assert!(g[part][q].as_f64().is_some(), "{part} {q} of {g}");
            }
        }
        // The engine's prefill is inside the client's TTFT.
        assert!(
            g["engine_prefill"]["p50"].as_f64() <= g["client_ttft"]["p99"].as_f64(),
            "{g}"
        );
    }
    // The last seconds (RECENT) hold the latest of them at least.
    let recent = split["recent_requests"].as_u64().unwrap();
    assert!((1..total).contains(&recent), "{split}");
    let mean_sum: f64 = ["proxy", "engine_queue", "engine_prefill", "rest"]
        .iter()
        .map(|k| split["recent_means"][k].as_f64().unwrap())
        .sum();
    assert!(mean_sum > 0.0, "{split}");
    assert!(
        p["latency"]["groups"][0].get("ttft_split").is_none(),
        "the split is sent once"
    );

    assert_eq!(p["tools"]["outcomes"]["valid"], 1, "{}", p["tools"]);
    assert_eq!(p["tools"]["outcomes"]["invalid_json"], 1, "{}", p["tools"]);
    assert_eq!(p["tools"]["requests"], 2);

    let slowest = p["slowest"]["requests"].as_array().unwrap();
    assert_eq!(slowest.len(), 10);
    assert_eq!(slowest[0]["id"], "slow-traced-0", "{slowest:?}");
    assert_eq!(slowest[0]["trace"], true);
    assert_eq!(slowest[1]["id"], "slow-traced-1");
    let e2e: Vec<f64> = slowest
        .iter()
        .map(|r| r["e2e_s"].as_f64().unwrap())
        .collect();
    assert!(e2e.windows(2).all(|w| w[0] >= w[1]), "{e2e:?}");
    assert!(slowest[2..].iter().all(|r| r["trace"] == false));
    // The link the page makes answers.
    let trace = get_text(&proxy.admin_url("/trace/slow-traced-0")).await;
    assert!(trace.contains("\"trace\""));

    // Bad queries name the parameter.
    for (q, param) in [("?window=0", "window"), ("?model=tiny", "model")] {
        let (status, doc, _) = document(&proxy, q).await;
        assert_eq!(status, 400, "{q}");
        assert_eq!(doc["error"]["param"], param, "{q}: {doc}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_whole_and_revalidated() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let proxy = start_proxy(meter_config(&sim.base_url())).await;
    let c = client();
    let (parts, body) = send(&c, get(&proxy.admin_url("/"))).await;
    assert_eq!(parts.status, 200);
    assert_eq!(parts.headers["content-type"], "text/html; charset=utf-8");
    assert!(parts.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    assert_eq!(&body[..], goodput_proxy::dashboard::PAGE.as_bytes());
    let etag = parts.headers["etag"].clone();
    let mut again = get(&proxy.admin_url("/"));
    again.headers_mut().insert("if-none-match", etag);
    let (parts, body) = send(&c, again).await;
    assert_eq!(parts.status, 304);
    assert!(body.is_empty());
}

/// What each panel's section must show after the traffic, besides `data-ok="1"` (set when its
/// renderer drew it without an error). A new panel adds its line.
const PANEL_CHECKS: &[(&str, &[&str])] = &[
    ("traffic", &["requests/s", "goodput ratio", "uplot"]),
    ("goodput", &["<td class=\"text\">tiny</td>", ">truncated<"]),
    ("replicas", &[">healthy<", "<td>0</td>"]),
    (
        "latency",
        &["model tiny, upstream", ">p99<", ">ttft<", ">e2e<"],
    ),
    ("tools", &[">valid<", ">invalid_json<"]),
    (
        "routing",
        &[
            "strategy auto",
            "<td class=\"text\">goodput</td>",
            ">load (tokens)<",
            ">chosen because<",
        ],
    ),
    (
        "ttft_split",
        &[
            "<td class=\"text\">tiny @ http://",
            ">engine prefill<",
            "<td class=\"rest\">",
            ">p99<",
            "(means)",
            "uplot",
        ],
    ),
    (
        "headroom",
        &[
            "<td class=\"text\">tiny</td>",
            "limit not seen yet",
            ">desired replicas<",
        ],
    ),
    (
        "slowest",
        &[
            "href=\"trace/slow-traced-0\"",
            "href=\"trace/slow-traced-1\"",
            ">plain-",
        ],
    ),
];

/// The `<section ...>...</section>` of panel `name` in a DOM dump.
pub fn section<'a>(dom: &'a str, name: &str) -> &'a str {
    let open = format!("data-panel=\"{name}\"");
    let at = dom
        .find(&open)
        .unwrap_or_else(|| panic!("no section {name} in the DOM"));
    let start = dom[..at].rfind("<section").unwrap();
    let end = dom[at..].find("</section>").unwrap() + at;
    &dom[start..end]
}

pub fn chromium(args: &[String], profile: &Path) -> std::process::Output {
    let bin = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    std::process::Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ])
        .args(args)
        .arg(format!("--user-data-dir={}", profile.display()))
        .output()
        .expect("chromium runs (install it or set CHROMIUM)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a chromium binary"]
async fn dashboard_in_headless_chromium_shows_every_panel() {
    let _serial = crate::support::serial().await;
    let (proxy, _sims) = proxy_with_traffic().await;
    let dir = crate::support::temp_dir("dashboard-chromium");
    let profile = dir.path().join("profile");
    let url = proxy.admin_url("/");
    // Virtual time runs the page's timers (a refresh every 2 s) without waiting for them, and
    // stands still while a fetch is out: 5 s of it is the first load and two refreshes.
    let args = vec![
        "--virtual-time-budget=5000".to_string(),
        "--dump-dom".to_string(),
        url.clone(),
    ];
    let p = profile.clone();
    let dom = tokio::task::spawn_blocking(move || chromium(&args, &p))
        .await
        .unwrap();
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(
        dom.contains("data-refreshes=\"3\""),
        "three loads of the data:\n{}",
        &dom[dom.len().saturating_sub(3000)..]
    );
    for (name, wants) in PANEL_CHECKS {
        let s = section(&dom, name);
        assert!(s.contains("data-ok=\"1\""), "panel {name} not drawn:\n{s}");
        for want in *wants {
            assert!(s.contains(want), "panel {name} lacks {want:?}:\n{s}");
        }
    }
    assert_eq!(
        dom.matches("data-panel=\"").count(),
        PANEL_CHECKS.len(),
        "every panel has its DOM check"
    );

    // And it paints: a 1400x1700 screenshot of the page with data is far from blank.
    let png = dir.path().join("dashboard.png");
    let args = vec![
        "--virtual-time-budget=5000".to_string(),
        "--hide-scrollbars".to_string(),
        format!("--screenshot={}", png.display()),
        "--window-size=1400,1700".to_string(),
        url,
    ];
    let shot = tokio::task::spawn_blocking(move || chromium(&args, &profile))
        .await
        .unwrap();
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    assert!(
        bytes.len() > 60_000,
        "screenshot is {} bytes: blank?",
        bytes.len()
    );
    if let Ok(keep) = std::env::var("DASHBOARD_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
}
