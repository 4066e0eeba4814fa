//! The routing benchmark (docs/routing.md): four simulated replicas behind the proxy, one
//! workload at a time, every `[balance] strategy` on the same seeded arrivals. Reports client
//! TTFT p50/p90/p99, TPOT p50/p99, goodput ratio, throughput and the engines' prefix-cache hit
//! rate, as a Markdown table (stdout) and an HTML table (`OUT/routing.html`).
//!
//! Bounded: each run is `SECONDS` of open-loop arrivals (uniform short chat: at least 32 s, so
//! that its TTFT p99 can resolve 5 %) then a drain; 127.0.0.1 only; every server it starts is
//! stopped at the end.
//!
//!   cargo run --release -p goodput-loadtest --example route_bench -- [SECONDS] [OUT] [WORKLOAD...] [seeds=N]
//!
//! `seeds=N` runs every row on N seeds (22, 23, ...: arrivals, bodies and the simulators'
//! seeds), every strategy on the same arrivals per seed, and reports the spread (median, min,
//! max) beside every run and, per seed, each strategy's figures against p2c's (the targets).
//! `seeds=22,24` runs those seeds only. `strategies=p2c,prefix,auto` runs those strategies only
//! (keep p2c: the targets are against it), in that order; a strategy listed twice runs twice
//! (`strategies=p2c,prefix,goodput,auto,p2c`). `repeat=N` runs the list N times per seed
//! (interleaved). Every run after a strategy's first is judged against p2c's first like any
//! other strategy: what p2c's second run differs from its first by is the noise floor of every
//! figure (the balancer's random choices are unseeded, and the engines run on wall-clock
//! time). Each run also reports why prefixes were released
//! (`goodput_proxy_route_releases_total{cause}`);
//! `RUST_LOG=goodput_proxy::upstream::strategy=debug` logs every release with its holder's
//! figures.
//!
//! Workloads: `shared` (8 long system prompts, short questions), `uniform` (short chat),
//! `mixed` (one replica at half speed), `slow` (one replica drops to 0.3x a third of the way in),
//! `slow-half` (one replica drops to 0.5x an eighth of the way in),
//! `shared-learn` (`shared` on engines that report `cached_tokens`; not in the default set),
//! `shared-slow` (`shared` where one replica drops to 0.5x an eighth of the way in; not in the
//! default set).
//! `hold`: what holding the response head for admission retries costs the client: `shared`
//! and `uniform` under `auto`, `balance.retry_rejections` on and off on the same seeded
//! arrivals, time to the response head beside time to the first event (a second table).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use goodput_measure::stats::percentile;
use goodput_proxy::app::App;
use goodput_proxy::config::{Limit, RawConfig, Strategy};
use goodput_sim::{SimConfig, SimHandle, SimServer};

const STRATEGIES: [Strategy; 4] = [
    Strategy::P2c,
    Strategy::Prefix,
    Strategy::Goodput,
    Strategy::Auto,
];
const SEED: u64 = 22;
/// The SLOs the goodput ratio counts (the proxy's goodput strategy is judged by the same).
const SLO_TTFT_MS: f64 = 1_000.0;
const SLO_TPOT_MS: f64 = 20.0;
/// The shortest uniform run (`Workload::seconds`: why).
const UNIFORM_MIN_SECONDS: f64 = 32.0;

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Shared,
    Uniform,
    Mixed,
    Slow,
    /// `Shared` on engines that report `cached_tokens` (vLLM `--enable-prompt-tokens-details`),
    /// which the prefix index learns from (last: the others keep their seeds).
    SharedLearn,
    /// One replica drops to half speed (just past the TPOT SLO: the slowdown that costs p2c
    /// most, as in `Mixed`) an eighth of the way in.
    SlowHalf,
    /// `Shared` where one replica, holding its share of the prefixes, drops to half speed an
    /// eighth of the way in: how soon `auto` takes its prefixes away (not in the default set).
    SharedSlow,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Shared => "shared prefixes",
            Workload::SharedLearn => "shared prefixes, cached_tokens reported",
            Workload::Uniform => "uniform short chat",
            Workload::Mixed => "mixed pool (one at 0.5x)",
            Workload::Slow => "sudden slow replica (0.3x at 1/3)",
            Workload::SlowHalf => "sudden slow replica (0.5x at 1/8)",
            Workload::SharedSlow => "shared prefixes, one replica to 0.5x at 1/8",
        }
    }
    /// How long this workload's arrivals last, given the run's `SECONDS`. Uniform short chat
    /// is judged on every figure within 5 % of p2c's, its TTFT p99 among them; over 8 s
    /// (about 380 requests, 4 above the p99) p2c's own p99 moved by more than 5 % between two
    /// runs on the same arrivals (docs/routing.md), so a 5 % difference could not be told
    /// from noise. At least 32 s: about 1,500 requests, 15 above the p99.
    fn seconds(self, base: f64) -> f64 {
        match self {
            Workload::Uniform => base.max(UNIFORM_MIN_SECONDS),
            _ => base,
        }
    }
    fn rate(self) -> f64 {
        match self {
            Workload::Shared | Workload::SharedLearn | Workload::SharedSlow => 24.0,
            _ => 48.0,
        }
    }
}

/// An engine shaped like a small GPU replica: prefill 10k tokens/s, 10 ms decode steps.
fn engine(speed: f64, seed: u64) -> SimConfig {
    SimConfig {
        ttft_ms: 10.0,
        prefill_ms_per_token: 0.1,
        tpot_ms: 10.0,
        tpot_ms_per_seq: 0.25,
        max_num_seqs: 64,
        block_size: 16,
        kv_cache_tokens: 6_000,
        max_num_batched_tokens: 2_048,
        speed,
        seed,
        ..SimConfig::default()
    }
}

struct Sample {
    /// Time to the response head, and to the first data event (the role chunk counts).
    head_ms: Option<f64>,
    first_event_ms: Option<f64>,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    ok: bool,
    tokens: u64,
}

fn body(w: Workload, rng: &mut SmallRng, systems: &[String], i: usize) -> String {
    let (system, max_tokens) = match w {
        Workload::Shared | Workload::SharedLearn | Workload::SharedSlow => {
            (systems[rng.random_range(0..systems.len())].clone(), 32)
        }
        _ => (String::from("You are helpful."), 48),
    };
    let words: Vec<String> = (0..rng.random_range(10..40))
        .map(|_| format!("w{}", rng.random_range(0..5_000)))
        .collect();
    format!(
        r#"{{"model":"tiny","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{} {i}"}}],"stream":true,"max_tokens":{max_tokens},"ignore_eos":true}}"#,
        words.join(" ")
    )
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn one(client: HttpClient, url: String, body: String) -> Sample {
    let t0 = Instant::now();
    let req = http::Request::post(&url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| ());
    let fail = Sample {
        head_ms: None,
        first_event_ms: None,
        ttft_ms: None,
        tpot_ms: None,
        ok: false,
        tokens: 0,
    };
    let Ok(req) = req else { return fail };
    let Ok(resp) = client.request(req).await else {
        return fail;
    };
    if resp.status() != 200 {
        return fail;
    }
    let head = Instant::now();
    let mut first_event = None;
    let mut body = resp.into_body();
    let (mut first, mut last, mut tokens, mut done, mut error) = (None, None, 0u64, false, false);
    let mut buf = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Some(d) = frame.data_ref() else { continue };
        let now = Instant::now();
        buf.extend_from_slice(d);
        while let Some(at) = buf.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = buf.drain(..at + 2).collect();
            if ev.starts_with(b"data:") {
                first_event.get_or_insert(now);
            }
            if ev.starts_with(b"data: [DONE]") {
                done = true;
            } else if ev.windows(8).any(|w| w == b"\"error\":") {
                error = true;
            } else if ev.windows(12).any(|w| w == b"{\"content\":\"") {
                first.get_or_insert(now);
                last = Some(now);
                tokens += 1;
            }
        }
    }
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    let ttft = first.map(|f| ms(t0, f));
    let tpot = match (first, last) {
        (Some(f), Some(l)) if tokens > 1 => Some(ms(f, l) / (tokens - 1) as f64),
        _ => None,
    };
    Sample {
        head_ms: Some(ms(t0, head)),
        first_event_ms: first_event.map(|f| ms(t0, f)),
        ttft_ms: ttft,
        tpot_ms: tpot,
        ok: done && !error && tokens > 0,
        tokens,
    }
}

struct Row {
    workload: &'static str,
    seed: u64,
    strategy: &'static str,
    /// Which repetition of this strategy on this seed (0 = the first; `repeat=N`).
    rep: usize,
    retry: bool,
    head: [f64; 3],
    first_event: [f64; 3],
    ttft: [f64; 3],
    tpot: [f64; 2],
    goodput: f64,
    throughput: f64,
    hit_rate: f64,
    n: usize,
    /// The balancer's decisions by reason (`goodput_proxy_route_decisions_total`), non-zero
    /// ones only: how often a prefix was moved (`prefix_saturated`), explored, ...
    decisions: Vec<(String, u64)>,
    /// Why prefixes left their holders (`goodput_proxy_route_releases_total`), non-zero ones.
    releases: Vec<(String, u64)>,
}

/// The proxy's admin `/metrics` page ("" when it cannot be read).
async fn metrics(client: &HttpClient, admin: std::net::SocketAddr) -> String {
    let Ok(req) =
        http::Request::get(format!("http://{admin}/metrics")).body(Full::new(Bytes::new()))
    else {
        return String::new();
    };
    let Ok(resp) = client.request(req).await else {
        return String::new();
    };
    let Ok(body) = resp.into_body().collect().await else {
        return String::new();
    };
    String::from_utf8_lossy(&body.to_bytes()).into_owned()
}

/// The non-zero series of a family with one label (`family{label="value"} n`), as (value, n).
fn nonzero(text: &str, family: &str, label: &str) -> Vec<(String, u64)> {
    let head = format!("{family}{{{label}=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&head)?;
            let (value, n) = rest.split_once("\"} ")?;
            let n: u64 = n.trim().parse().ok()?;
            (n > 0).then(|| (value.to_string(), n))
        })
        .collect()
}

async fn run(
    w: Workload,
    strategy: Strategy,
    retry: bool,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<Row> {
    let speeds = match w {
        Workload::Mixed => [1.0, 1.0, 1.0, 0.5],
        _ => [1.0; 4],
    };
    let mut sims: Vec<SimHandle> = Vec::new();
    for s in speeds {
        let cfg = SimConfig {
            enable_prompt_tokens_details: w == Workload::SharedLearn,
            ..engine(s, seed)
        };
        sims.push(SimServer::bind(cfg, "127.0.0.1:0".parse()?).await?.spawn());
    }
    let mut c = RawConfig::default();
    c.server.listen = "127.0.0.1:0".parse()?;
    c.server.admin_listen = "127.0.0.1:0".parse()?;
    c.server.drain_delay_ms = 0;
    c.upstream.urls = sims.iter().map(|s| s.base_url()).collect();
    c.upstream.health_interval_ms = 200;
    c.engine.scrape_interval_ms = 500;
    c.slo.ttft_ms = Limit::Ms(SLO_TTFT_MS as u64);
    c.slo.tpot_ms = Limit::Ms(SLO_TPOT_MS as u64);
    c.balance.strategy = strategy;
    c.balance.retry_rejections = retry;
    let app = App::bind(c.check().map_err(|e| anyhow::anyhow!("{e:?}"))?).await?;
    let addr = app.local_addr();
    let admin = app.admin_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = stop_rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(600)).await;

    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let url = format!("http://{addr}/v1/chat/completions");
    // The same seeded arrivals and bodies for every strategy, and for both shared-prefix
    // workloads.
    let seed_of = if matches!(w, Workload::SharedLearn | Workload::SharedSlow) {
        Workload::Shared
    } else {
        w
    };
    let mut rng = SmallRng::seed_from_u64(seed ^ seed_of as u64);
    let systems: Vec<String> = (0..8)
        .map(|k| format!("Policy {k}: ") + &format!("clause{k} applies ").repeat(700))
        .collect();
    let start = Instant::now();
    let mut at = 0.0f64;
    let mut handles = Vec::new();
    let mut i = 0;
    let mut slowed = false;
    while at < seconds {
        let gap = -(1.0 - rng.random::<f64>()).ln() / w.rate();
        at += gap;
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let slowdown = match w {
            Workload::Slow => Some((1.0 / 3.0, 0.3)),
            Workload::SlowHalf | Workload::SharedSlow => Some((1.0 / 8.0, 0.5)),
            _ => None,
        };
        if let Some((when, speed)) = slowdown.filter(|_| !slowed) {
            if at >= seconds * when {
                sims[3].engine().set_speed(speed);
                slowed = true;
            }
        }
        let b = body(w, &mut rng, &systems, i);
        handles.push(tokio::spawn(one(client.clone(), url.clone(), b)));
        i += 1;
    }
    let mut samples = Vec::new();
    for h in handles {
        if let Ok(s) = h.await {
            samples.push(s);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let page = metrics(&client, admin).await;
    let decisions = nonzero(&page, "goodput_proxy_route_decisions_total", "reason");
    let releases = nonzero(&page, "goodput_proxy_route_releases_total", "cause");
    let (mut q, mut hits) = (0u64, 0u64);
    for s in &sims {
        let m = &s.engine().metrics.models[0];
        q += m.prefix_queries.load(std::sync::atomic::Ordering::Relaxed);
        hits += m.prefix_hits.load(std::sync::atomic::Ordering::Relaxed);
    }
    let _ = stop_tx.send(());
    let _ = task.await;
    for s in sims {
        s.shutdown().await;
    }
    let mut ttfts: Vec<f64> = samples.iter().filter_map(|s| s.ttft_ms).collect();
    let mut tpots: Vec<f64> = samples.iter().filter_map(|s| s.tpot_ms).collect();
    let mut heads: Vec<f64> = samples.iter().filter_map(|s| s.head_ms).collect();
    let mut firsts: Vec<f64> = samples.iter().filter_map(|s| s.first_event_ms).collect();
    heads.sort_by(f64::total_cmp);
    firsts.sort_by(f64::total_cmp);
    ttfts.sort_by(f64::total_cmp);
    tpots.sort_by(f64::total_cmp);
    let good = samples
        .iter()
        .filter(|s| {
            s.ok && s.ttft_ms.is_some_and(|t| t <= SLO_TTFT_MS)
                && s.tpot_ms.is_none_or(|t| t <= SLO_TPOT_MS)
        })
        .count();
    let p = |v: &[f64], q: f64| {
        if v.is_empty() {
            f64::NAN
        } else {
            percentile(v, q)
        }
    };
    Ok(Row {
        workload: w.name(),
        seed,
        strategy: strategy.as_str(),
        rep: 0,
        retry,
        head: [p(&heads, 0.5), p(&heads, 0.9), p(&heads, 0.99)],
        first_event: [p(&firsts, 0.5), p(&firsts, 0.9), p(&firsts, 0.99)],
        ttft: [p(&ttfts, 0.5), p(&ttfts, 0.9), p(&ttfts, 0.99)],
        tpot: [p(&tpots, 0.5), p(&tpots, 0.99)],
        goodput: good as f64 / samples.len().max(1) as f64,
        throughput: samples.iter().map(|s| s.tokens).sum::<u64>() as f64 / elapsed,
        hit_rate: if q == 0 { 0.0 } else { hits as f64 / q as f64 },
        n: samples.len(),
        decisions,
        releases,
    })
}

impl Row {
    /// The strategy, and which repetition when it is not the first (`p2c #2`).
    fn label(&self) -> String {
        if self.rep == 0 {
            self.strategy.to_string()
        } else {
            format!("{} #{}", self.strategy, self.rep + 1)
        }
    }
    /// The run every other run of its workload and seed is judged against: p2c's first.
    fn is_baseline(&self) -> bool {
        self.strategy == "p2c" && self.rep == 0
    }
}

/// `reason n, ...` of a row's decisions, then `(released: cause n, ...)` when any prefix was.
fn decisions_text(r: &Row) -> String {
    let list = |v: &[(String, u64)]| {
        v.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if r.releases.is_empty() {
        list(&r.decisions)
    } else {
        format!("{} (released: {})", list(&r.decisions), list(&r.releases))
    }
}

fn markdown(rows: &[Row]) -> String {
    let mut s = String::from("| workload | strategy | seed | requests | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p99 (ms) | goodput ratio | throughput (tok/s) | engine prefix hit rate | decisions |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {:.1} % | {:.0} | {:.1} % | {} |\n",
            r.workload,
            r.label(),
            r.seed,
            r.n,
            r.ttft[0],
            r.ttft[1],
            r.ttft[2],
            r.tpot[0],
            r.tpot[1],
            r.goodput * 100.0,
            r.throughput,
            r.hit_rate * 100.0,
            decisions_text(r)
        ));
    }
    s
}

/// min / median / max of `f` over `rows`.
fn spread(rows: &[&Row], f: impl Fn(&Row) -> f64) -> [f64; 3] {
    let mut v: Vec<f64> = rows.iter().map(|r| f(r)).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    [v[0], v[v.len() / 2], v[v.len() - 1]]
}

/// One row per workload and strategy over the seeds: median (min - max).
fn spread_markdown(rows: &[Row]) -> String {
    let mut s = String::from("| workload | strategy | seeds | TTFT p50 (ms) | TTFT p90 (ms) | TTFT p99 (ms) | TPOT p99 (ms) | goodput ratio (%) | throughput (tok/s) | engine prefix hit rate (%) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    let fmt = |v: [f64; 3], d: usize| format!("{:.d$} ({:.d$}-{:.d$})", v[1], v[0], v[2]);
    let mut keys: Vec<(&str, String)> = Vec::new();
    for r in rows {
        let key = (r.workload, r.label());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for (w, st) in keys {
        let g: Vec<&Row> = rows
            .iter()
            .filter(|r| r.workload == w && r.label() == st)
            .collect();
        s.push_str(&format!(
            "| {w} | {st} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            g.len(),
            fmt(spread(&g, |r| r.ttft[0]), 0),
            fmt(spread(&g, |r| r.ttft[1]), 0),
            fmt(spread(&g, |r| r.ttft[2]), 0),
            fmt(spread(&g, |r| r.tpot[1]), 1),
            fmt(spread(&g, |r| r.goodput * 100.0), 1),
            fmt(spread(&g, |r| r.throughput), 0),
            fmt(spread(&g, |r| r.hit_rate * 100.0), 1),
        ));
    }
    s
}

/// Of every reported figure, the one on which `r` is furthest worse than `p` (relative: a
/// latency above, goodput, throughput or hit rate below), as "figure +x.x %"; "none" when
/// it is worse on none.
fn worst_against(r: &Row, p: &Row) -> String {
    // (figure, strategy's, p2c's, higher is worse)
    let figures = [
        ("TTFT p50", r.ttft[0], p.ttft[0], true),
        ("TTFT p90", r.ttft[1], p.ttft[1], true),
        ("TTFT p99", r.ttft[2], p.ttft[2], true),
        ("TPOT p50", r.tpot[0], p.tpot[0], true),
        ("TPOT p99", r.tpot[1], p.tpot[1], true),
        ("goodput", r.goodput, p.goodput, false),
        ("throughput", r.throughput, p.throughput, false),
        ("hit rate", r.hit_rate, p.hit_rate, false),
    ];
    figures
        .iter()
        .map(|&(name, v, base, up)| {
            let worse = if up { v / base - 1.0 } else { 1.0 - v / base };
            (name, worse)
        })
        .filter(|(_, w)| w.is_finite() && *w > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or_else(
            || "none".into(),
            |(n, w)| format!("{n} {:+.1} %", w * 100.0),
        )
}

/// The issue's targets, per seed, each strategy against p2c on the same arrivals.
fn targets_markdown(rows: &[Row]) -> String {
    let mut s = String::from("| workload | seed | strategy | TTFT p90 / p2c's | hit rate / p2c's | goodput ratio - p2c's (points) | worst figure against p2c's |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for p in rows.iter().filter(|r| r.is_baseline()) {
        for r in rows
            .iter()
            .filter(|r| r.workload == p.workload && r.seed == p.seed && !r.is_baseline())
        {
            s.push_str(&format!(
                "| {} | {} | {} | {:.2} | {:.2} | {:+.1} | {} |\n",
                r.workload,
                r.seed,
                r.label(),
                r.ttft[1] / p.ttft[1],
                r.hit_rate / p.hit_rate,
                (r.goodput - p.goodput) * 100.0,
                worst_against(r, p)
            ));
        }
    }
    s
}

/// The head-holding table: time to the response head and to the first event, retry on/off.
fn hold_markdown(rows: &[Row]) -> String {
    let mut s = String::from("| workload | retry_rejections | requests | time to head p50 / p90 / p99 (ms) | time to first event p50 / p90 / p99 (ms) | TTFT p50 / p99 (ms) |\n| --- | --- | --- | --- | --- | --- |\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} | {:.0} / {:.0} |\n",
            r.workload,
            if r.retry { "on (head held)" } else { "off" },
            r.n,
            r.head[0],
            r.head[1],
            r.head[2],
            r.first_event[0],
            r.first_event[1],
            r.first_event[2],
            r.ttft[0],
            r.ttft[2],
        ));
    }
    s
}

fn html(rows: &[Row], seconds: f64) -> String {
    let mut s = format!("<!doctype html><meta charset=utf-8><title>goodput-proxy routing benchmark</title><style>body{{font:14px sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child,td:nth-child(2){{text-align:left}}</style><h1>Routing benchmark</h1><p>Four simulated replicas, {seconds} s of seeded Poisson arrivals per run (uniform short chat: at least {UNIFORM_MIN_SECONDS} s), SLOs TTFT &le; {SLO_TTFT_MS} ms, TPOT &le; {SLO_TPOT_MS} ms. Every strategy runs on the same arrivals for each seed.</p><h2>Over the seeds: median (min-max)</h2>");
    s.push_str(&md_to_html(&spread_markdown(rows)));
    s.push_str("<h2>Targets per seed</h2>");
    s.push_str(&md_to_html(&targets_markdown(rows)));
    s.push_str("<h2>Every run</h2>");
    s.push_str(&md_to_html(&markdown(rows)));
    s
}

/// A Markdown table of this file's own making as an HTML table.
fn md_to_html(md: &str) -> String {
    let mut s = String::from("<table>");
    for (i, line) in md.lines().enumerate() {
        if i == 1 {
            continue; // the separator
        }
        let tag = if i == 0 { "th" } else { "td" };
        s.push_str("<tr>");
        for cell in line.trim_matches('|').split('|') {
            s.push_str(&format!("<{tag}>{}", cell.trim()));
        }
    }
    s.push_str("</table>\n");
    s
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(10.0);
    let out = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "route-bench-out".into());
    let hold = args.iter().skip(2).any(|a| a == "hold");
    // `seeds=N`: N seeds from SEED; `seeds=22,24`: those.
    let seeds: Vec<u64> = match args.iter().skip(2).find_map(|a| a.strip_prefix("seeds=")) {
        Some(list) if list.contains(',') => {
            list.split(',').filter_map(|v| v.parse().ok()).collect()
        }
        Some(n) => (SEED..SEED + n.parse::<u64>().unwrap_or(1)).collect(),
        None => vec![SEED],
    };
    // `strategies=p2c,prefix,p2c`: in that order, a strategy listed twice runs twice.
    let listed: Vec<Strategy> = match args
        .iter()
        .skip(2)
        .find_map(|a| a.strip_prefix("strategies="))
    {
        Some(list) => list
            .split(',')
            .filter_map(|v| STRATEGIES.into_iter().find(|s| s.as_str() == v))
            .collect(),
        None => STRATEGIES.to_vec(),
    };
    // `repeat=N`: the list N times per seed (the repetitions interleaved). Every run after a
    // strategy's first is judged against p2c's first like any strategy: p2c against p2c is
    // the noise floor.
    let repeat: usize = args
        .iter()
        .skip(2)
        .find_map(|a| a.strip_prefix("repeat=")?.parse().ok())
        .unwrap_or(1)
        .max(1);
    // (strategy, its repetition)
    let mut plan: Vec<(Strategy, usize)> = Vec::new();
    for _ in 0..repeat {
        for &s in &listed {
            let rep = plan.iter().filter(|(t, _)| *t == s).count();
            plan.push((s, rep));
        }
    }
    let mut workloads: Vec<Workload> = args
        .iter()
        .skip(2)
        .filter_map(|a| match a.as_str() {
            "shared" => Some(Workload::Shared),
            "shared-learn" => Some(Workload::SharedLearn),
            "uniform" => Some(Workload::Uniform),
            "mixed" => Some(Workload::Mixed),
            "slow" => Some(Workload::Slow),
            "slow-half" => Some(Workload::SlowHalf),
            "shared-slow" => Some(Workload::SharedSlow),
            _ => None,
        })
        .collect();
    if hold {
        let mut rows = Vec::new();
        for w in [Workload::Shared, Workload::Uniform] {
            for retry in [true, false] {
                let row = run(w, Strategy::Auto, retry, seconds, SEED).await?;
                eprintln!("hold: {} / retry {retry}: {} requests", row.workload, row.n);
                rows.push(row);
            }
        }
        let md = hold_markdown(&rows);
        print!("{md}");
        std::fs::create_dir_all(&out)?;
        std::fs::write(format!("{out}/hold.md"), &md)?;
        if workloads.is_empty() {
            return Ok(());
        }
    }
    if workloads.is_empty() {
        workloads = vec![
            Workload::Shared,
            Workload::Uniform,
            Workload::Mixed,
            Workload::Slow,
            Workload::SlowHalf,
        ];
    }
    let mut rows = Vec::new();
    for w in workloads {
        for &seed in &seeds {
            for &(s, rep) in &plan {
                eprintln!(
                    "run: {} / seed {seed} / {} / {}",
                    w.name(),
                    s.as_str(),
                    rep + 1
                );
                let row = Row {
                    rep,
                    ..run(w, s, true, w.seconds(seconds), seed).await?
                };
                eprintln!(
                    "{} / seed {seed} / {}: {} requests, goodput {:.1} %, TTFT p90 {:.0} ms, hit rate {:.1} %, decisions {}",
                    row.workload,
                    row.label(),
                    row.n,
                    row.goodput * 100.0,
                    row.ttft[1],
                    row.hit_rate * 100.0,
                    decisions_text(&row)
                );
                rows.push(row);
            }
        }
    }
    let md = format!(
        "{}\n{}\n{}",
        spread_markdown(&rows),
        targets_markdown(&rows),
        markdown(&rows)
    );
    print!("{md}");
    std::fs::create_dir_all(&out)?;
    std::fs::write(format!("{out}/routing.md"), &md)?;
    std::fs::write(format!("{out}/routing.html"), html(&rows, seconds))?;
    Ok(())
}
