//! The `model` label is bounded: configured models, models the upstreams list at
//! `/v1/models`, and `other` for everything else.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_sim::SimConfig;

/// Every distinct `model` label value on the page.
fn model_labels(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with("goodput_proxy_"))
        .filter_map(|l| {
            let rest = &l[l.find("model=\"")? + 7..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_model_names_share_one_other_series() {
    // CPU-heavy: not alongside the timing-sensitive tests.
    let _serial = crate::support::serial().await;
    // 2,048 names through HTTP (8x the learned-model cap, 1.5 ms each on 2 cores); the
    // 10,000-name case of the label set itself is the unit test in src/metrics/mod.rs.
    const REQUESTS: usize = 2_048;
    const TASKS: usize = 64;
    let sim = start_sim(SimConfig::fast()).await;
    let proxy = start_proxy(meter_config(&sim.base_url())).await;
    let c = client();
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let c = c.clone();
            let url = proxy.url(CHAT);
            tokio::spawn(async move {
                for i in (t..REQUESTS).step_by(TASKS) {
                    let name = format!("random-{:016x}", rand::random::<u64>() ^ i as u64);
                    let body = format!(r#"{{"model":"{name}","messages":[],"max_tokens":1}}"#);
                    let (parts, _) = send(&c, post_json(&url, &body)).await;
                    // The engine does not know the model: its 404 is passed through.
                    assert_eq!(parts.status, 404);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    eprintln!("{REQUESTS} requests in {:?}", started.elapsed());
    let s = wait_requests(&proxy, REQUESTS as u64).await;
    assert_eq!(s["outcomes"]["rejected"], REQUESTS as u64, "{s}");
    let m = metrics(&proxy).await;
    assert_eq!(
        model_labels(&m),
        BTreeSet::from(["other".to_string()]),
        "one `other` series and nothing else"
    );
    let series: Vec<_> = series(&m, "goodput_proxy_requests_total").collect();
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(
        metric(
            &m,
            "goodput_proxy_requests_total",
            &[("model", "other"), ("outcome", "rejected")]
        ),
        REQUESTS as f64
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_the_upstream_serves_are_learned() {
    let sim = start_sim(SimConfig {
        models: vec!["tiny".into(), "big".into()],
        ..SimConfig::fast()
    })
    .await;
    // No configured models: `big` must be learned from the sim's /v1/models.
    let proxy = start_proxy(test_config(&[sim.base_url()])).await;
    let c = client();
    let body = r#"{"model":"big","messages":[],"max_tokens":2}"#;
    let learned = async {
        loop {
            let (parts, _) = send(&c, post_json(&proxy.url(CHAT), body)).await;
            assert_eq!(parts.status, 200);
            let m = metrics(&proxy).await;
            if try_metric(&m, "goodput_proxy_requests_total", &[("model", "big")])
                .is_some_and(|n| n > 0.0)
            {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let m = tokio::time::timeout(SLOW, learned)
        .await
        .expect("`big` learned from /v1/models");
    // Learned too, though never requested; unknown names still go to `other`.
    assert!(model_labels(&m).is_subset(&BTreeSet::from(["big".to_string(), "other".to_string()])));
    let (parts, _) = send(
        &c,
        post_json(
            &proxy.url(CHAT),
            r#"{"model":"tiny","messages":[],"max_tokens":2}"#,
        ),
    )
    .await;
    assert_eq!(parts.status, 200);
    let m = metrics(&proxy).await;
    assert_eq!(
        metric(&m, "goodput_proxy_requests_total", &[("model", "tiny")]),
        1.0
    );
    sim.shutdown().await;
}
