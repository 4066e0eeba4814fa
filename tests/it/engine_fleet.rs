//! A fleet mixing engines behind one proxy: a simulated vLLM, SGLang, llama.cpp, TGI and
//! TensorRT-LLM replica, each queueing a different number of requests. Each engine's own
//! families are read through one mapping: the balancer's view of every replica, the
//! `goodput_proxy_upstream_queue_depth{upstream}` gauge and the detected kind are right for
//! each, and every engine's families are still served, relabelled.

use std::time::Duration;

use crate::engine_metrics::occupy;
use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_proxy::app::App;
use goodput_proxy::engine::parse::parse;
use goodput_sim::{Personality, SimConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_reads_every_engines_queue_through_one_mapping() {
    // (personality, kind label, requests queued behind the one running)
    let fleet = [
        (Personality::Vllm, "vllm", 1),
        (Personality::Sglang, "sglang", 2),
        (Personality::Llamacpp, "llamacpp", 3),
        (Personality::Tgi, "tgi", 4),
        (Personality::Trtllm, "trtllm", 5),
    ];
    let mut sims = Vec::new();
    for (p, _, _) in fleet {
        sims.push(
            start_sim(SimConfig {
                max_num_seqs: 1,
                personality: p,
                ..SimConfig::with_timing(5.0, 50.0)
            })
            .await,
        );
    }
    let urls: Vec<String> = sims.iter().map(|s| s.base_url()).collect();
    let mut config = test_config(&urls);
    config.engine.scrape_interval_ms = 100;
    // trtllm-serve's Prometheus page is not on /metrics: set its kind, the rest are detected.
    config
        .engine
        .kinds
        .insert(urls[4].clone(), "trtllm".to_string());
    let app = App::bind(config.check().unwrap()).await.unwrap();
    let state = app.state();
    let proxy = run_app(app);
    let mut hogs = Vec::new();
    for (sim, (_, _, queued)) in sims.iter().zip(fleet) {
        hogs.extend(occupy(sim, queued + 1));
    }
    for (sim, (p, _, queued)) in sims.iter().zip(fleet) {
        assert!(
            eventually(SLOW, || sim.running() == 1 && sim.waiting() == queued).await,
            "{p:?}: one running, {queued} waiting"
        );
    }
    let deadline = tokio::time::Instant::now() + SLOW;
    let page = loop {
        let m = metrics(&proxy).await;
        let all = urls.iter().zip(fleet).all(|(u, (_, kind, queued))| {
            try_metric(&m, "goodput_proxy_upstream_queue_depth", &[("upstream", u)])
                == Some(queued as f64)
                && try_metric(
                    &m,
                    "goodput_proxy_engine_kind",
                    &[("upstream", u), ("kind", kind)],
                ) == Some(1.0)
        });
        if all {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "queues scraped:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for (u, (p, _, _)) in urls.iter().zip(fleet) {
        assert_eq!(
            metric(&page, "goodput_proxy_upstream_running", &[("upstream", u)]),
            1.0,
            "{p:?}"
        );
    }
    // KV use where the engine exports it (TGI and llama.cpp do not).
    for (u, (p, _, _)) in urls.iter().zip(fleet) {
        let kv = try_metric(
            &page,
            "goodput_proxy_upstream_kv_cache_usage",
            &[("upstream", u)],
        );
        let exported = !matches!(p, Personality::Tgi | Personality::Llamacpp);
        assert_eq!(kv.is_some(), exported, "{p:?}: {kv:?}");
    }
    assert_eq!(metric(&page, "goodput_proxy_demand", &[]), 15.0);
    // What the balancer compares: each replica's engine queue, whatever the engine.
    let replicas = state.upstreams.replicas();
    for (r, (p, _, queued)) in replicas.iter().zip(fleet) {
        assert_eq!(r.engine_queue(), queued, "{p:?}");
        assert_eq!(r.engine_load().running, Some(1.0), "{p:?}");
    }
    // Every engine's own families are still served, relabelled with its upstream.
    let families = parse(&page).unwrap();
    for (u, name) in urls.iter().zip([
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
        "tgi_queue_size",
        "trtllm_num_requests_waiting",
    ]) {
        let f = families
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} not served"));
        assert!(
            f.samples
                .iter()
                .any(|s| s.labels.iter().any(|(k, v)| k == "upstream" && v == u)),
            "{name} of {u}"
        );
    }
    for h in hogs {
        h.abort();
    }
    for sim in sims {
        assert!(sim.wait_idle(SLOW).await);
        sim.shutdown().await;
    }
}
