//! The proxy's exact percentiles equal the client's: the simulator
//! at TTFT 300 ms and TPOT 20 ms behind the in-process proxy, 64 streams of 50 tokens from the
//! load generator; the proxy's `/stats` p50 and p99 of TTFT, TPOT and E2E agree with the same
//! percentiles the load generator computes over its own records of the run (one percentile
//! definition, numpy's), and the counts are equal.
//!
//! How they must agree follows from causality, not from a timing budget: the proxy's `t0` comes
//! after the client sent the request, and the proxy hands an event (or the last byte) to the
//! socket before the client reads it, so per request the proxy's TTFT and E2E are at most the
//! client's; percentiles keep that order. The client's excess is loopback plus the client's own
//! scheduling, a few ms on this 2-core machine under load; a wrong `t0` or a frame timestamped
//! at the wrong place shows as the proxy above the client or far below it. TPOT is a
//! difference of two proxy instants over 49 gaps: close to the client's either way.

use std::time::Duration;

use goodput_loadtest::report::compare::Comparison;
use goodput_loadtest::runner::{self, CompareTargets, RunConfig};
use goodput_loadtest::scenario::Scenario;
use goodput_proxy::app::App;
use goodput_proxy::config::RawConfig;
use goodput_sim::{SimConfig, SimServer};
use tokio::sync::oneshot;

/// TPOT: |proxy - client| bound.
const TPOT_TOLERANCE_S: f64 = 0.002;
/// TTFT, E2E: how far the client may lag the proxy (loopback + client scheduling).
const CLIENT_LAG_S: f64 = 0.025;

const SCENARIO: &str = r#"
seed = 9
models = ["tiny"]
[mix]
prompt_tokens = { fixed = 16 }
max_tokens = { fixed = 50 }
ignore_eos = true
stream_share = 1.0

# Opens the client's connections first: the client's TTFT of a request on a new connection
# includes the TCP connect and hyper's handshake, which the proxy (t0 = request head) cannot
# see. vllm bench serve and any pooled client measure on warm connections too.
[[phases]]
name = "warm"
requests = 64
arrivals = { constant = { rate = 400 } }
drain = true

[[phases]]
name = "streams"
requests = 64
arrivals = { constant = { rate = 40 } }
drain = true
"#;

/// The client's exact row and the proxy's `/stats` row of the `streams` phase agree: counts
/// exactly (a hard failure), percentiles as the module docs say (an `Err` naming the miss).
fn check(c: &Comparison, metric: &str) -> Result<(), String> {
    let row = |source: &str| {
        c.rows
            .iter()
            .find(|r| r.phase == "streams" && r.metric == metric && r.source == source)
            .unwrap_or_else(|| panic!("no {source} {metric} row: {:#?}", c.rows))
    };
    let (client, proxy) = (row("client exact"), row("proxy exact (/stats)"));
    assert_eq!(proxy.count, Some(64.0), "{metric}: {proxy:?}");
    assert_eq!(client.count, proxy.count, "{metric}: {client:?} {proxy:?}");
    for (q, cv, pv) in [
        ("p50", client.p50, proxy.p50),
        ("p99", client.p99, proxy.p99),
    ] {
        let (cv, pv) = (cv.unwrap(), pv.unwrap());
        let d = pv - cv;
        eprintln!(
            "{metric} {q}: client {:.3} ms proxy {:.3} ms ({:+.3})",
            cv * 1e3,
            pv * 1e3,
            d * 1e3
        );
        let ok = if metric == "tpot" {
            d.abs() <= TPOT_TOLERANCE_S
        } else {
            // The proxy never after the client; the client at most CLIENT_LAG_S after it.
            pv <= cv && cv - pv <= CLIENT_LAG_S
        };
        if !ok {
            return Err(format!(
                "{metric} {q}: proxy {pv} client {cv} ({:+.3} ms)",
                d * 1e3
            ));
        }
    }
    Ok(())
}

/// A systematic difference (a wrong t0, a frame timestamped at the wrong place, a different
/// percentile definition) shows in every run; a scheduling stall of this 2-core test machine
/// moves one request's timing by a few ms, and a p99 of 64 values is the top one or two. So a
/// run whose percentiles miss is repeated, at most three runs in all, each reported; counts
/// and outcomes must hold in every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_stats_percentiles_equal_the_clients() {
    // Timing-sensitive: never beside another load run of this binary.
    let _serial = crate::support::serial().await;
    let mut misses = Vec::new();
    for attempt in 1..=3 {
        match one_run().await {
            Ok(()) => return,
            Err(e) => {
                eprintln!("run {attempt}: {e}");
                misses.push(e);
            }
        }
    }
    panic!("the proxy's /stats missed the client's percentiles in 3 runs: {misses:?}");
}

async fn one_run() -> Result<(), String> {
    // The engine and the proxy run on their own runtime (as separate processes would), so
    // the client's measurements are not delayed by the proxy's work on the same threads.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop, rx) = oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let sim = SimServer::bind(
                SimConfig {
                    max_num_seqs: 256,
                    ..SimConfig::with_timing(300.0, 20.0)
                },
                "127.0.0.1:0".parse().unwrap(),
            )
            .await
            .unwrap()
            .spawn();
            let mut c = RawConfig::default();
            c.server.listen = "127.0.0.1:0".parse().unwrap();
            c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
            c.server.drain_delay_ms = 0;
            c.upstream.urls = vec![sim.base_url()];
            c.measure.models = vec!["tiny".into()];
            let app = App::bind(c.check().expect("a valid test config"))
                .await
                .expect("bind proxy");
            ready_tx.send((app.local_addr(), app.admin_addr())).unwrap();
            let _ = app
                .run(async move {
                    let _ = rx.await;
                })
                .await;
            sim.shutdown().await;
        });
    });
    let (addr, admin) = ready_rx.recv().unwrap();

    let res = tokio::time::timeout(
        Duration::from_secs(60),
        runner::run(RunConfig {
            target: format!("http://{addr}"),
            scenario: Scenario::parse(SCENARIO).unwrap(),
            scenario_name: "stats-agree".into(),
            show_progress: false,
            metrics: None,
            compare: CompareTargets {
                proxy_admin: Some(format!("http://{admin}")),
                settle_s: Some(0.2),
                ..CompareTargets::default()
            },
            run_id: goodput_loadtest::request::run_id(),
        }),
    )
    .await
    .expect("run is bounded")
    .unwrap();
    let s = &res.summary.phases[1];
    assert_eq!(s.requests, 64);
    assert_eq!(s.outcomes.get("success"), Some(&64), "{:?}", s.outcomes);
    let c = res
        .summary
        .comparison
        .as_ref()
        .expect("comparison asked for");
    let mut verdict = Ok(());
    for metric in ["ttft", "tpot", "e2e"] {
        verdict = verdict.and(check(c, metric));
    }
    // The simulator's timing is what both saw (plus loopback and scheduling noise).
    let ttft = s.ttft_seconds.as_ref().unwrap().p50;
    let tpot = s.tpot_seconds.as_ref().unwrap().p50;
    assert!((0.299..0.340).contains(&ttft), "TTFT p50 {ttft}");
    assert!((0.0195..0.0215).contains(&tpot), "TPOT p50 {tpot}");

    let _ = stop.send(());
    tokio::task::spawn_blocking(move || server.join())
        .await
        .unwrap()
        .unwrap();
    verdict
}
