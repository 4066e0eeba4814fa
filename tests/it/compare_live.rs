//! `goodput-proxy compare --admin` end to end: two simulated engines behind an in-process proxy,
//! a load run during the window, then the table: every column filled, exact and proxy-histogram
//! figures within one bucket width of each other, per model and per upstream; a clear error
//! for an admin URL that does not answer.

use std::time::Duration;

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_proxy::compare::{self, admin::Admin, render, Cell};
use goodput_sim::{Jitter, SimConfig};

/// Requests sent during the window, 4 at a time.
const REQUESTS: usize = 40;
/// The load takes about 2 s on an idle machine; the engine's counters at the window's end come
/// from the last scrape (every 100 ms), so a load that ended just before the end was missed by
/// the engine's side. At 3 s that happened once with the 2 cores shared by three builds.
const WINDOW: Duration = Duration::from_secs(5);

fn sim_config(seed: u64, legacy: bool) -> SimConfig {
    SimConfig {
        seed,
        jitter: Jitter::Lognormal,
        jitter_cv: 0.5,
        legacy_metric_names: legacy,
        ..SimConfig::with_timing(30.0, 5.0)
    }
}

/// An estimate agrees with the exact figure when they are at most one bucket apart: the width
/// of the bucket the exact value is in, or of the one the estimate is in (numpy's percentile can
/// interpolate across a bucket boundary).
fn within_a_bucket(c: &Cell, grid: &[f64], what: &str) {
    let (Some(exact), Some(est)) = (c.exact, c.proxy_hist) else {
        panic!("{what}: p{}: missing figure {c:?}", c.quantile);
    };
    let width = |v: f64| {
        let mut lower = 0.0;
        for &le in grid {
            if v <= le {
                return le - lower;
            }
            lower = le;
        }
        f64::INFINITY
    };
    let allowed = width(exact).max(width(est)) + 1e-9;
    assert!(
        (est - exact).abs() <= allowed,
        "{what} p{}: exact {exact}, histogram {est}, allowed {allowed}",
        c.quantile
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_after_a_load_through_two_simulators() {
    let _serial = crate::support::serial().await;
    let a = start_sim(sim_config(1, false)).await;
    let b = start_sim(sim_config(2, true)).await;
    let mut cfg = test_config(&[a.base_url(), b.base_url()]);
    cfg.measure.models = vec!["tiny".into()];
    cfg.engine.scrape_interval_ms = 100;
    let proxy = start_proxy(cfg).await;
    let c = client();
    // Both replicas healthy and scraped before the window opens.
    let deadline = tokio::time::Instant::now() + SLOW;
    loop {
        let m = metrics(&proxy).await;
        if try_metric(&m, "goodput_proxy_engine_up", &[]) == Some(2.0)
            && try_metric(&m, "goodput_proxy_upstream_healthy", &[]) == Some(2.0)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "engines not up:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let admin_url = proxy.admin_url("");
    let by_model = tokio::spawn(async move {
        // Gauges sampled as often as the proxy scrapes the engines: at the default (1 s), the
        // load (1-2 s) gave one or two samples, and in CI they once found one replica's batch
        // empty.
        let admin = Admin::new(&admin_url)
            .unwrap()
            .with_gauge_interval(Duration::from_millis(100));
        admin.window(WINDOW, true).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let url = proxy.url(CHAT);
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..REQUESTS / 4 {
                let max_tokens = 4 + ((i * 5 + w) % 12) as u32;
                let (parts, _) = send(&c, post_json(&url, &chat_body(max_tokens, ""))).await;
                assert_eq!(parts.status, 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let w = by_model.await.unwrap();
    // Everything the load sent finished inside the window (it ends 5 s after it opened).
    let table = compare::build(&w, true);
    assert_eq!(table.groups.len(), 2, "{}", render::text(&table));
    // The same window per model: one group over both upstreams.
    let per_model = compare::build(&w, false);
    assert_eq!(per_model.groups.len(), 1);
    assert_eq!(per_model.groups[0].rows[2].proxy_count, REQUESTS as f64);

    let served: f64 = table.groups.iter().map(|g| g.rows[2].proxy_count).sum();
    assert_eq!(served, REQUESTS as f64);
    for g in &table.groups {
        let up = g.upstream.clone().unwrap_or_default();
        assert!(up == a.base_url() || up == b.base_url(), "{up}");
        for r in &g.rows {
            let what = format!("{up} {}", r.quantity);
            assert_eq!(r.exact_count as f64, r.proxy_count, "{what}");
            let grid: &[f64] = match r.quantity {
                "ttft" => goodput_proxy::metrics::TTFT_BUCKETS,
                "tpot" => goodput_proxy::metrics::TPOT_BUCKETS,
                _ => goodput_proxy::metrics::E2E_BUCKETS,
            };
            for cell in &r.cells {
                within_a_bucket(cell, grid, &what);
                assert!(cell.engine_hist.is_some(), "{what}: {cell:?}");
                assert!(cell.proxy_minus_engine.is_some() && cell.engine_minus_exact.is_some());
                assert!(cell.bucket_width.is_some(), "{what}: {cell:?}");
            }
        }
        let e = &g.engine;
        assert!(e.requests_per_s > 0.0, "{e:?}");
        assert_eq!(
            e.finished_reason.values().sum::<f64>(),
            g.rows[2].proxy_count,
            "the engine finished what the proxy served: {e:?}"
        );
        assert!(e.max_running.is_some_and(|m| m >= 1.0), "{e:?}");
        assert!(e.max_waiting.is_some(), "{e:?}");
    }
    let text = render::text(&table);
    let columns = render::COLUMNS.iter().filter(|c| !c.is_empty());
    for col in columns.copied().chain([
        "p50",
        "p90",
        "p99",
        "ttft",
        "tpot",
        "e2e",
        "req/s",
        "max running",
    ]) {
        assert!(text.contains(col), "{col}:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&render::json(&table)).unwrap();
    assert_eq!(json["groups"].as_array().unwrap().len(), 2);
}

async fn window_error(url: &str) -> String {
    match Admin::new(url)
        .unwrap()
        .window(Duration::from_millis(10), false)
        .await
    {
        Ok(_) => panic!("{url}: a window from something that is no proxy"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn an_admin_url_that_does_not_answer_or_is_no_proxy_is_a_clear_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let e = window_error(&url).await;
    assert!(e.contains("does not answer") && e.contains(&url), "{e}");
    // A simulator's /metrics has engine families but none of the proxy's.
    let sim = start_sim(SimConfig::fast()).await;
    let e = window_error(&sim.base_url()).await;
    assert!(
        e.contains("goodput_proxy_records_dropped_total") && e.contains("admin port"),
        "{e}"
    );
}
