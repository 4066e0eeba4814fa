//! DNS discovery end to end: three simulated engines behind one proxy whose replicas come from
//! `upstream.discover`, resolved by a fake resolver the test edits. A replica removed mid-run
//! finishes every stream already sent to it and gets no new ones; a replica added gets traffic
//! within one interval. Once more with a real name from /etc/hosts (`localhost`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_proxy::app::App;
use goodput_proxy::discover::{Resolved, Resolver};
use goodput_sim::{SimConfig, SimHandle};

const INTERVAL_MS: u64 = 200;

/// Answers every name with the addresses the test set last.
#[derive(Default)]
struct Fake(Mutex<Vec<SocketAddr>>);

impl Fake {
    fn set(&self, sims: &[&SimHandle]) {
        *self.0.lock().unwrap() = sims.iter().map(|s| addr(s)).collect();
    }
}

impl Resolver for Fake {
    fn resolve<'a>(&'a self, _host: &'a str, _port: u16) -> Resolved<'a> {
        let addrs = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(addrs) })
    }
}

fn addr(s: &SimHandle) -> SocketAddr {
    s.base_url().trim_start_matches("http://").parse().unwrap()
}

async fn start(config: goodput_proxy::config::RawConfig, resolver: Arc<dyn Resolver>) -> Proxy {
    run_app(
        App::bind_with_resolver(config.check().expect("a valid test config"), resolver)
            .await
            .expect("bind"),
    )
}

fn discover_config(target: &str) -> goodput_proxy::config::RawConfig {
    let mut c = test_config(&[]);
    c.upstream.discover = vec![target.to_string()];
    c.upstream.discover_interval_ms = INTERVAL_MS;
    c.upstream.health_interval_ms = 100;
    c.measure.models = vec!["tiny".into()];
    c.engine.scrape_interval_ms = 100;
    c
}

/// Sends one stream and reads it to the end: (status, body).
async fn stream(c: &TestClient, proxy: &Proxy, max_tokens: u32) -> (u16, String) {
    let (parts, body) = send(c, post_json(&proxy.url(CHAT), &chat_body(max_tokens, ""))).await;
    (
        parts.status.as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_replica_finishes_its_streams_and_a_new_one_gets_traffic() {
    let _serial = crate::support::serial().await;
    // 20 ms per token: a 60-token stream takes over a second, many discovery intervals.
    let sim = |seed| SimConfig {
        seed,
        ..SimConfig::with_timing(10.0, 20.0)
    };
    let (a, b, c3) = (
        start_sim(sim(1)).await,
        start_sim(sim(2)).await,
        start_sim(sim(3)).await,
    );
    let fake = Arc::new(Fake::default());
    fake.set(&[&a, &b]);
    let proxy = start(discover_config("dns://engines.test:8000"), fake.clone()).await;
    let client = client();

    // Long streams over a and b; wait until b has some in flight.
    let mut long = Vec::new();
    for _ in 0..6 {
        let (c, p) = (client.clone(), proxy.url(CHAT));
        long.push(tokio::spawn(async move {
            let (parts, body) = send(&c, post_json(&p, &chat_body(60, ""))).await;
            (
                parts.status.as_u16(),
                String::from_utf8_lossy(&body).into_owned(),
            )
        }));
    }
    assert!(
        eventually(SLOW, || b.running() > 0 && a.running() > 0).await,
        "both replicas got streams"
    );
    let sent_to_b = b.requests_started();

    // b leaves the name; after one interval it gets nothing new.
    fake.set(&[&a]);
    tokio::time::sleep(Duration::from_millis(3 * INTERVAL_MS)).await;
    let sent_to_b_at_removal = b.requests_started();
    assert!(sent_to_b_at_removal >= sent_to_b);
    for _ in 0..6 {
        let (status, body) = stream(&client, &proxy, 2).await;
        assert_eq!(status, 200);
        assert!(body.contains("[DONE]"));
    }
    assert_eq!(
        b.requests_started(),
        sent_to_b_at_removal,
        "b got new requests after removal"
    );

    // Every stream sent before the removal, b's included, completed.
    for t in long {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200);
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    }
    assert_eq!(b.requests_aborted(), 0);
    let s = stats(&proxy, "window=60").await;
    assert_eq!(s["outcomes"]["success"], 12, "{s}");
    assert_eq!(s["requests"], 12, "{s}");

    // c joins: traffic after one interval plus its first health probe. On a loaded machine
    // the tick or the probe can be late, so streams keep going (each must succeed) until c
    // has one, within SLOW: the assertion is that it gets traffic, not how fast.
    fake.set(&[&a, &c3]);
    tokio::time::sleep(Duration::from_millis(INTERVAL_MS + 150)).await;
    let deadline = tokio::time::Instant::now() + SLOW;
    let mut sent = 0;
    while sent < 8 || (c3.requests_started() == 0 && tokio::time::Instant::now() < deadline) {
        let (status, _) = stream(&client, &proxy, 2).await;
        assert_eq!(status, 200);
        sent += 1;
    }
    assert!(c3.requests_started() > 0, "the new replica got no traffic");
    // Its engine families are served relabelled with its URL, and the proxy's histograms
    // carry the same upstream value.
    let up = c3.base_url();
    let deadline = tokio::time::Instant::now() + SLOW;
    loop {
        let m = metrics(&proxy).await;
        let count = |name| try_metric(&m, name, &[("upstream", &up)]).unwrap_or(0.0);
        let engine = count("vllm:e2e_request_latency_seconds_count");
        let ours = count("goodput_proxy_e2e_request_latency_seconds_count");
        if engine > 0.0 && ours > 0.0 {
            // b's gauges and engine page left with it.
            let gone = b.base_url();
            let gone = [("upstream", gone.as_str())];
            assert_eq!(
                try_metric(&m, "goodput_proxy_upstream_in_flight", &gone),
                None
            );
            assert!(!m.contains(&format!(
                "vllm:num_requests_running{{engine=\"0\",model_name=\"tiny\",upstream=\"{}\"}}",
                b.base_url()
            )));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_real_name_from_etc_hosts() {
    let sim = start_sim(SimConfig::fast()).await;
    let port = addr(&sim).port();
    let proxy = start(
        discover_config(&format!("dns://localhost:{port}")),
        Arc::new(goodput_proxy::discover::SystemResolver),
    )
    .await;
    let client = client();
    let (status, body) = stream(&client, &proxy, 3).await;
    assert_eq!(status, 200, "{body}");
    assert!(sim.requests_started() >= 1);
    // localhost may resolve to ::1 too, where nothing listens: that replica never turns
    // healthy, so it gets no traffic and every request succeeded.
    for _ in 0..4 {
        assert_eq!(stream(&client, &proxy, 3).await.0, 200);
    }
    let m = metrics(&proxy).await;
    assert!(
        metric(
            &m,
            "goodput_proxy_requests_total",
            &[
                ("upstream", &format!("http://127.0.0.1:{port}")),
                ("outcome", "success")
            ]
        ) == 5.0,
        "{m}"
    );
}
