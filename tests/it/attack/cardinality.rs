//! Cardinality: 10,000 requests with random models, paths and `user` values. Pass: the number
//! of `goodput_proxy_*` series after 10,000 is what it was after the first 1,000 (random values
//! never become labels), and `/metrics` stays under 256 KiB.

use std::sync::Arc;

use goodput_sim::SimConfig;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::support::meter::*;
use crate::support::proxy::*;

fn own_series(page: &str) -> usize {
    page.lines()
        .filter(|l| l.starts_with("goodput_proxy_"))
        .count()
}

fn random_request(
    proxy: &Proxy,
    rng: &mut impl Rng,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let model = if rng.random_bool(0.5) {
        "tiny".to_string()
    } else {
        format!("model-{}", rng.random::<u32>())
    };
    let path = match rng.random_range(0..4) {
        0 => CHAT.to_string(),
        1 => COMPL.to_string(),
        2 => format!("/v1/{}", rng.random::<u32>()),
        _ => format!("/x{}/completions", rng.random::<u32>()),
    };
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"prompt":"hi","max_tokens":1,"stream":{},"user":"u{}"}}"#,
        rng.random_bool(0.5),
        rng.random::<u64>()
    );
    post_json(&proxy.url(&path), &body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_requests_keep_series_bounded_and_metrics_small() {
    let _serial = crate::support::serial().await;
    let sim = start_sim(SimConfig::with_timing(0.0, 0.0)).await;
    let proxy = Arc::new(start_proxy(meter_config(&sim.base_url())).await);
    let c = client();
    let run = |n: usize, seed: u64| {
        let (proxy, c) = (proxy.clone(), c.clone());
        async move {
            let tasks: Vec<_> = (0..16)
                .map(|t| {
                    let (proxy, c) = (proxy.clone(), c.clone());
                    tokio::spawn(async move {
                        let mut rng = SmallRng::seed_from_u64(seed * 100 + t);
                        for _ in 0..n / 16 {
                            let req = random_request(&proxy, &mut rng);
                            let _ = send(&c, req).await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        }
    };
    run(1_000, 1).await;
    let after_1k = own_series(&metrics(&proxy).await);
    run(9_000, 2).await;
    let page = metrics(&proxy).await;
    let after_10k = own_series(&page);
    eprintln!(
        "series: {after_1k} after 1,000, {after_10k} after 10,000; /metrics {} bytes",
        page.len()
    );
    assert_eq!(after_10k, after_1k, "series grew with random input");
    assert!(page.len() < 256 * 1024, "/metrics is {} bytes", page.len());
}
