//! The balancer end to end: engines' admission rejections retried on another replica before
//! the client sees anything (the record names both attempts), and prefix affinity seen
//! through the simulated engines' prefix caches.

use std::time::Duration;

use crate::support::prom::{sample, series};
use crate::support::proxy::*;
use crate::support::raw_http::start;
use goodput_proxy::config::{RawConfig, Strategy};
use goodput_sim::SimConfig;

const CHAT: &str = "/v1/chat/completions";

fn stream_body(system: &str, i: usize) -> String {
    format!(
        r#"{{"model":"tiny","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {i}"}}],"stream":true,"max_tokens":4}}"#
    )
}

fn config(upstreams: &[String], strategy: Strategy, sink: &std::path::Path) -> RawConfig {
    let mut c = test_config(upstreams);
    c.balance.strategy = strategy;
    c.measure.sink_path = Some(sink.to_path_buf());
    c
}

fn records(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        // The sink may be writing the last line: a partial line is no record yet.
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn sink_path(name: &str) -> crate::support::TempSink {
    crate::support::TempSink::new(&format!("route-{name}"))
}

/// Waits until the proxy's health probes marked all `n` replicas healthy (polled: the first
/// probes take longer on a loaded machine, and a replica not yet healthy is no candidate).
async fn settle(proxy: &Proxy, n: usize) {
    let client = client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, m) = send(&client, get(&proxy.admin_url("/metrics"))).await;
        let m = String::from_utf8_lossy(&m).into_owned();
        let healthy = series(&m, "goodput_proxy_upstream_healthy")
            .filter(|(_, v)| *v == 1.0)
            .count();
        if healthy >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{healthy} of {n} replicas healthy after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn rejected_then_served(inband: bool) {
    // A: at its cap all the time (cap 0); B: serves.
    let a = start(SimConfig {
        max_num_queued_reqs: Some(0),
        admission_inband_prob: if inband { 1.0 } else { 0.0 },
        ..SimConfig::fast()
    })
    .await;
    let b = start(SimConfig::fast()).await;
    let (ua, ub) = (a.base_url(), b.base_url());
    let sink = sink_path(if inband { "inband" } else { "status" });
    let mut c = config(&[ua.clone(), ub.clone()], Strategy::P2c, &sink);
    c.balance.hold_first_event = inband;
    let proxy = start_proxy(c).await;
    settle(&proxy, 2).await;
    let client = client();
    for i in 0..12 {
        let (parts, body) = send(&client, post_json(&proxy.url(CHAT), &stream_body("s", i))).await;
        assert_eq!(parts.status, 200);
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(!text.contains("\"error\""), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
    let m = a.metrics_text();
    let rejected = sample(
        &m,
        "vllm:admission_rejections_total{model_name=\"tiny\",reason=\"max_num_queued_reqs\"}",
    );
    assert!(
        rejected >= 1.0,
        "p2c tried A at least once in 12: {rejected}"
    );
    assert_eq!(b.requests_served(), 12);
    assert!(
        eventually(Duration::from_secs(2), || records(&sink).len() == 12).await,
        "records"
    );
    let recs = records(&sink);
    let retried: Vec<_> = recs
        .iter()
        .filter(|r| r["retried_from"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    assert_eq!(
        retried.len() as f64,
        rejected,
        "one retried record per rejection"
    );
    for r in &recs {
        assert_eq!(r["upstream"], ub.as_str(), "{r}");
        assert_eq!(r["outcome"], "success", "{r}");
        assert!(r["route_reason"].is_string(), "{r}");
    }
    for r in retried {
        assert_eq!(r["retried_from"], serde_json::json!([ua.as_str()]), "{r}");
    }
    drop(proxy);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn an_in_band_admission_rejection_is_retried_on_another_replica() {
    rejected_then_served(true).await;
}

#[tokio::test]
async fn a_503_admission_rejection_is_retried_on_another_replica() {
    rejected_then_served(false).await;
}

#[tokio::test]
async fn without_retries_or_a_held_head_the_client_gets_an_in_band_rejection() {
    let a = start(SimConfig {
        max_num_queued_reqs: Some(0),
        admission_inband_prob: 1.0,
        ..SimConfig::fast()
    })
    .await;
    // (retry_rejections, hold_first_event): retries off; or on, with the head not held (the
    // default: a 200 head goes to the client at once, so its first event cannot be retried).
    for (retry, hold) in [(false, true), (true, false)] {
        let sink = sink_path(&format!("off-{retry}-{hold}"));
        let mut c = config(&[a.base_url(), a.base_url()], Strategy::P2c, &sink);
        c.balance.retry_rejections = retry;
        c.balance.hold_first_event = hold;
        let proxy = start_proxy(c).await;
        settle(&proxy, 2).await;
        let (parts, body) =
            send(&client(), post_json(&proxy.url(CHAT), &stream_body("s", 0))).await;
        assert_eq!(parts.status, 200);
        assert!(
            String::from_utf8_lossy(&body).contains("\"code\": 503"),
            "{retry} {hold}"
        );
        drop(proxy);
    }
    a.shutdown().await;
}

/// What one run of [`shared_prefixes`] shows: the engines' prefix-cache hit rate, the proxy's
/// `/metrics` page and the records in request order.
struct SharedRun {
    rate: f64,
    metrics: String,
    records: Vec<serde_json::Value>,
}

impl SharedRun {
    fn decisions(&self, reason: &str) -> f64 {
        sample(
            &self.metrics,
            &format!("goodput_proxy_route_decisions_total{{reason=\"{reason}\"}}"),
        )
    }

    /// Everything that shows why a choice went where it did, for a failure message: the
    /// decisions by reason, why prefixes were released, each replica's health now, and per
    /// request the prompt, the replica, the reason and whether it was retried.
    fn why(&self) -> String {
        let nonzero = |family: &str| {
            series(&self.metrics, family)
                .filter(|(_, v)| *v > 0.0)
                .map(|(l, v)| format!("{l:?} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = format!(
            "hit rate {:.3}\ndecisions: {}\nreleases: {}\nhealthy: {}\nrequests:\n",
            self.rate,
            nonzero("goodput_proxy_route_decisions_total"),
            nonzero("goodput_proxy_route_releases_total"),
            series(&self.metrics, "goodput_proxy_upstream_healthy")
                .map(|(l, v)| format!("{l:?} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        for r in &self.records {
            out += &format!(
                "  {} -> {} {} retried_from {} ttft {}\n",
                r["id"], r["upstream"], r["route_reason"], r["retried_from"], r["ttft_s"]
            );
        }
        out
    }
}

/// Sends 24 requests over 3 long system prompts (4 blocks of 128 tokens each on the engine)
/// through `strategy`, one at a time.
async fn shared_prefixes(strategy: Strategy) -> SharedRun {
    // Small caches: each engine holds one of the three prompts (32 blocks of 16 tokens) beside
    // its running request, not two. Under prefix affinity each prompt has its own engine (the
    // three are placed by cache room, one each), so 21 of 24 requests find theirs cached;
    // under p2c an engine serves every prompt in turn and keeps little of the one before.
    let engine = || SimConfig {
        block_size: 16,
        kv_cache_tokens: 800,
        ..SimConfig::fast()
    };
    let sims = [
        start(engine()).await,
        start(engine()).await,
        start(engine()).await,
    ];
    let urls: Vec<String> = sims.iter().map(|s| s.base_url()).collect();
    let sink = sink_path(strategy.as_str());
    let mut c = config(&urls, strategy, &sink);
    c.balance.prefix_min_blocks = 2;
    let proxy = start_proxy(c).await;
    settle(&proxy, 3).await;
    let client = client();
    let systems: Vec<String> = (0..3).map(|k| format!("policy {k} ").repeat(250)).collect();
    for i in 0..24 {
        let body = stream_body(&systems[i % 3], i);
        let (parts, _) = send(&client, post_json(&proxy.url(CHAT), &body)).await;
        assert_eq!(parts.status, 200);
    }
    let (mut q, mut h) = (0.0, 0.0);
    for s in &sims {
        let m = s.metrics_text();
        q += sample(
            &m,
            "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"tiny\"}",
        );
        h += sample(
            &m,
            "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"tiny\"}",
        );
    }
    let (_, metrics) = send(&client, get(&proxy.admin_url("/metrics"))).await;
    // The records, for a failure message (best effort: the sink may lag a little).
    let _ = eventually(Duration::from_secs(2), || records(&sink).len() >= 24).await;
    drop(proxy);
    for s in sims {
        s.shutdown().await;
    }
    SharedRun {
        rate: h / q,
        metrics: String::from_utf8(metrics.to_vec()).unwrap(),
        records: records(&sink),
    }
}

#[tokio::test]
async fn prefix_affinity_shows_in_the_engines_caches_and_the_decisions() {
    let p2c = shared_prefixes(Strategy::P2c).await;
    let prefix = shared_prefixes(Strategy::Prefix).await;
    let why = || format!("prefix run:\n{}\np2c run:\n{}", prefix.why(), p2c.why());
    // Each prompt goes to one engine after its first request: 21 of 24 are hits.
    assert_eq!(prefix.decisions("prefix_hit"), 21.0, "{}", why());
    assert_eq!(prefix.decisions("least_load"), 3.0, "{}", why());
    assert_eq!(p2c.decisions("p2c"), 24.0, "{}", why());
    assert_eq!(p2c.decisions("prefix_hit"), 0.0, "{}", why());
    // 21 of 24 prompts find their ~500 prefix tokens cached (the question differs).
    assert!(prefix.rate > 0.8, "{}", why());
    assert!(prefix.rate > p2c.rate + 0.2, "{}", why());
}

/// The proxy's index learns from the engine's `cached_tokens`: a prompt the index believed a
/// replica held, reported not cached there, means the engine evicted it and everything it
/// served before; an older prompt is then no longer sent there as a prefix hit.
#[tokio::test]
async fn the_prefix_index_learns_what_the_engine_evicted() {
    // Small caches (100 blocks of 16 tokens: three prompts of about 500 tokens), cached
    // tokens reported; slow enough decode that a long stream stays in flight.
    let engine = || SimConfig {
        block_size: 16,
        kv_cache_tokens: 1_600,
        tpot_ms: 10.0,
        enable_prompt_tokens_details: true,
        max_model_len: 8_192,
        ..SimConfig::fast()
    };
    let sims = [start(engine()).await, start(engine()).await];
    let urls: Vec<String> = sims.iter().map(|s| s.base_url()).collect();
    let sink = sink_path("learn");
    let mut c = config(&urls, Strategy::Prefix, &sink);
    c.balance.prefix_min_blocks = 2;
    let proxy = start_proxy(c).await;
    settle(&proxy, 2).await;
    let client = client();
    // A long stream keeps one replica loaded past the saturation bound (6,000 tokens against
    // a bound of 1.5 x the mean plus one request): every later request goes to the other, X.
    let long = r#"{"model":"tiny","messages":[{"role":"user","content":"go on"}],"stream":true,"max_tokens":6000}"#;
    let (long_parts, long_body) = client
        .request(post_json(&proxy.url(CHAT), long))
        .await
        .unwrap()
        .into_parts();
    assert_eq!(long_parts.status, 200);
    let prompt = |k: usize| format!("policy {k} ").repeat(250);
    let mut seen = 0;
    // Sends one request for prompt `k`; returns its record (the index has learned from it).
    let mut ask = |k: usize, i: usize| {
        let client = client.clone();
        let (proxy_url, sink) = (proxy.url(CHAT), sink.to_path_buf());
        seen += 1;
        let want = seen;
        async move {
            let (parts, body) =
                send(&client, post_json(&proxy_url, &stream_body(&prompt(k), i))).await;
            assert_eq!(parts.status, 200);
            assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
            assert!(
                eventually(Duration::from_secs(10), || records(&sink).len() >= want).await,
                "record {want}"
            );
            records(&sink).pop().unwrap()
        }
    };
    let cached = |r: &serde_json::Value| r["cached_prompt_tokens"].as_u64().unwrap_or(0);
    let p1 = ask(1, 0).await;
    let x = p1["upstream"].as_str().unwrap().to_string();
    assert_eq!(p1["route_reason"], "least_load", "{p1}");
    assert_eq!(ask(2, 1).await["upstream"], x.as_str());
    // Both held: prefix hits, served from X's cache (nothing learned).
    for (k, i) in [(1, 2), (2, 3)] {
        let r = ask(k, i).await;
        assert_eq!(
            (r["route_reason"].as_str(), r["upstream"].as_str()),
            (Some("prefix_hit"), Some(x.as_str())),
            "{r}"
        );
        assert!(cached(&r) >= 400, "{r}");
    }
    // X's engine evicts both: four other prompts sent to it directly, past the proxy.
    for k in 10..14 {
        let body = format!(
            r#"{{"model":"tiny","messages":[{{"role":"user","content":"{}"}}],"max_tokens":1}}"#,
            prompt(k)
        );
        let (parts, _) = send(&client, post_json(&format!("{x}{CHAT}"), &body)).await;
        assert_eq!(parts.status, 200);
    }
    // The index still believes X holds prompt 2: a prefix hit, answered with little cached.
    let r = ask(2, 4).await;
    assert_eq!(
        (r["route_reason"].as_str(), r["upstream"].as_str()),
        (Some("prefix_hit"), Some(x.as_str())),
        "{r}"
    );
    assert!(cached(&r) < 200, "{r}");
    // So X evicted prompt 1 (served before prompt 2's last use) too: no longer a hit.
    let r = ask(1, 5).await;
    assert_eq!(r["route_reason"], "least_load", "{r}");
    assert!(cached(&r) < 200, "the engine had indeed evicted it: {r}");
    drop((long_parts, long_body));
    drop(proxy);
    for s in sims {
        s.shutdown().await;
    }
}
