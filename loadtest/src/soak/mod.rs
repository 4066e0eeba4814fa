//! `goodput-loadtest soak`: the real proxy binary in front of in-process simulators, a mixed
//! fault share at high concurrency for a bounded time, then a machine-checked verdict
//! (criteria and results in docs/RELIABILITY.md):
//! every request in exactly one outcome on both sides (client ledger vs the proxy's JSONL
//! records, `/metrics` and `/stats`), 0 lost, the proxy's RSS and fd count flat.
//!
//! Everything is on 127.0.0.1 and stops with the command: the simulators live in this process,
//! the proxy is a child killed on drop (and on Ctrl-C, which ends the run early as a FAIL).

mod classes;
mod drive;
pub(crate) mod proxy;
mod verdict;

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use goodput_measure::prom;
use goodput_measure::Outcome;
use goodput_sim::{SimConfig, SimServer};
use serde::Serialize;
use tokio::time::Instant;

use drive::{Driver, Stop};
use proxy::{ProxyProcess, ProxySettings, Sample};
use verdict::{check, Check, ClassRow, Flatness, ProxyLedger, Tally, OUTCOMES};

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// How long the load runs: `180s`, `30m`, `1h` or seconds.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub duration: Duration,
    /// Closed-loop workers (requests in flight at once).
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// Simulated engines behind the proxy.
    #[arg(long, default_value_t = 2)]
    pub sims: usize,
    /// Simulated decode step, ms (a 24-token stream lasts about 24 steps).
    #[arg(long, default_value_t = 10.0)]
    pub tpot_ms: f64,
    /// Seconds at the start left out of the flatness figures (pools, ring and allocator
    /// arenas fill). Default: 10% of the duration, at least 20 s, at most 120 s.
    #[arg(long)]
    pub warmup: Option<f64>,
    /// RSS: the last third's median may exceed the first third's by this many percent.
    #[arg(long, default_value_t = 10.0)]
    pub rss_tolerance_pct: f64,
    /// Open fds: the same, in percent (plus 8 fds of slack).
    #[arg(long, default_value_t = 10.0)]
    pub fd_tolerance_pct: f64,
    /// Requests of the audit phase after the load, counted by `/stats`.
    #[arg(long, default_value_t = 400)]
    pub audit: u64,
    /// The proxy binary [default: goodput-proxy beside this executable].
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// Output directory: soak.json, proxy-records.jsonl, proxy.log.
    #[arg(long, default_value = "soak-out")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 14)]
    pub seed: u64,
    /// Seconds between progress lines on stderr [default: 10, or 60 for runs over 10 min].
    #[arg(long)]
    pub progress_every: Option<f64>,
    /// Print the report as JSON on stdout (it is always written to OUT/soak.json).
    #[arg(long)]
    pub json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let mult = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (s, m, h)")),
    };
    let secs = v * mult;
    if !(secs > 0.0 && secs <= 24.0 * 3600.0) {
        return Err(format!("duration {s:?} out of range (0, 24h]"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The machine-readable result (OUT/soak.json).
#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub pass: bool,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub concurrency: usize,
    pub sims: usize,
    pub requests: u64,
    pub audit_requests: u64,
    pub requests_per_second: f64,
    pub client_outcomes: std::collections::BTreeMap<&'static str, u64>,
    pub checks: Vec<Check>,
    pub rss_kib: Option<Flatness>,
    pub fds: Option<Flatness>,
    /// The smallest steady leak the RSS criterion catches in this run: the tolerance in bytes
    /// over the requests served between the centres of the first and last third.
    pub detectable_leak_bytes_per_request: Option<f64>,
    pub classes: Vec<ClassRow>,
    pub samples: Vec<Sample>,
    pub wall_s: f64,
    pub out_dir: String,
}

pub async fn run(args: SoakArgs) -> anyhow::Result<SoakReport> {
    let wall = Instant::now();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let sink = args.out.join("proxy-records.jsonl");
    let _ = std::fs::remove_file(&sink);
    let dur = args.duration.as_secs_f64();
    let warmup = args
        .warmup
        .unwrap_or((dur * 0.1).clamp(20.0, 120.0))
        .min(dur / 2.0);
    let every = args
        .progress_every
        .unwrap_or(if dur > 600.0 { 60.0 } else { 10.0 })
        .max(1.0);

    let mut sims = Vec::new();
    for k in 0..args.sims.max(1) {
        let cfg = SimConfig {
            max_num_seqs: 4096,
            seed: args.seed + k as u64,
            ..SimConfig::with_timing(20.0, args.tpot_ms)
        };
        sims.push(
            SimServer::bind(cfg, "127.0.0.1:0".parse()?)
                .await
                .context("binding a simulator")?
                .spawn(),
        );
    }
    let upstreams: Vec<String> = sims.iter().map(|s| s.base_url()).collect();
    let bin = args.proxy_bin.clone().unwrap_or_else(proxy::default_bin);
    let proxy = ProxyProcess::spawn(&ProxySettings {
        bin: &bin,
        upstreams: &upstreams,
        sink: &sink,
        log: &args.out.join("proxy.log"),
        ring: (args.audit as usize * 2).max(1024),
        first_byte_timeout_ms: 5_000,
    })
    .await?;
    let admin = format!("http://{}", proxy.admin);
    let pid = proxy.pid;
    // For scripts/soak.sh's trap: if this process is killed outright (SIGKILL), no destructor
    // runs, and the script kills the proxy by this pid.
    std::fs::write(args.out.join("proxy.pid"), format!("{pid}\n"))?;
    let client = crate::client::http_client(args.concurrency.max(1) + 8);
    wait_ready(&client, &admin).await?;
    let m0 = metrics_page(&client, &admin).await?;

    let driver = Arc::new(Driver::new(
        client.clone(),
        &format!("http://{}", proxy.addr),
        crate::request::run_id(),
        args.seed,
    )?);
    let start = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler = tokio::spawn(sample_loop(pid, start, samples.clone()));
    let progress = tokio::spawn(progress_loop(
        driver.clone(),
        pid,
        start,
        args.duration,
        every,
    ));
    eprintln!(
        "soak: {} workers for {:.0} s (warm-up {warmup:.0} s), {} simulators, proxy pid {pid}, output in {}",
        args.concurrency,
        dur,
        sims.len(),
        args.out.display()
    );
    let load = driver.phase(args.concurrency.max(1), Stop::At(start + args.duration));
    let interrupted = tokio::select! {
        () = load => false,
        () = stop_signal() => true,
    };
    if interrupted {
        progress.abort();
        sampler.abort();
        let _ = proxy.stop(Duration::from_secs(5)).await;
        anyhow::bail!("interrupted: the proxy and the simulators are stopped; no verdict");
    }
    let load_end_s = start.elapsed().as_secs_f64();
    progress.abort();
    // No record of the load may end inside the audit's /stats window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let audit_from = driver.next_index();
    let audit_start = Instant::now();
    let audit_workers = args.concurrency.clamp(1, 64);
    driver
        .phase(audit_workers, Stop::Below(audit_from + args.audit))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let window = audit_start.elapsed().as_secs_f64() + 0.5;
    let stats = stats_outcomes(&client, &admin, window).await;
    let m1 = metrics_page(&client, &admin).await?;
    sampler.abort();
    let mut idle = true;
    for s in &sims {
        idle &= s.wait_idle(Duration::from_secs(5)).await;
    }
    let clean_exit = proxy.stop(Duration::from_secs(15)).await;
    for s in sims {
        s.shutdown().await;
    }

    let requests = driver.issued();
    let run_id = driver.run_id.clone();
    let ledger = driver.into_ledger();
    let mut proxy_ledger = ProxyLedger::new(ledger.requests.len());
    read_records(&sink, &run_id, &mut proxy_ledger)?;
    let delta = outcome_delta(&m0, &m1);
    let audit_want = drive::audit_expected(&ledger, audit_from);
    let (mut checks, classes) = verdict::accounting(
        &ledger,
        &proxy_ledger,
        &delta,
        stats.as_ref().ok().map(|s| (&audit_want, s)),
    );
    if let Err(e) = &stats {
        checks.push(check(
            "/stats: the audit window counts exactly the audit requests per outcome",
            false,
            e.clone(),
        ));
    }
    checks.extend(left_behind(&m1, idle, clean_exit));
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let series = |f: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        samples.iter().map(|s| (s.t_s, f(s))).collect()
    };
    let rss = verdict::flatness(
        &series(|s| s.rss_kib as f64),
        warmup,
        load_end_s,
        args.rss_tolerance_pct,
        0.0,
    );
    let fds = verdict::flatness(
        &series(|s| s.fds as f64),
        warmup,
        load_end_s,
        args.fd_tolerance_pct,
        8.0,
    );
    checks.push(flat_check("RSS flat (KiB)", rss.as_ref()));
    checks.push(flat_check("open fds flat", fds.as_ref()));
    // Requests between the centres of the first and last third of the measured window.
    let measured = (load_end_s - warmup).max(0.0);
    let rate = requests.saturating_sub(args.audit) as f64 / load_end_s.max(1e-9);
    let detectable = rss.as_ref().map(|f| {
        let bytes = f.first_third_median * 1024.0 * f.tolerance_pct / 100.0;
        bytes / (rate * measured * 2.0 / 3.0).max(1.0)
    });
    let pass = checks.iter().all(|c| c.pass);
    let report = SoakReport {
        pass,
        duration_s: dur,
        warmup_s: warmup,
        concurrency: args.concurrency,
        sims: args.sims.max(1),
        requests,
        audit_requests: requests.saturating_sub(audit_from),
        requests_per_second: rate,
        client_outcomes: verdict::named(&ledger.tally()),
        checks,
        rss_kib: rss,
        fds,
        detectable_leak_bytes_per_request: detectable,
        classes,
        samples,
        wall_s: wall.elapsed().as_secs_f64(),
        out_dir: args.out.display().to_string(),
    };
    std::fs::write(
        args.out.join("soak.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(report)
}

/// Ctrl-C or SIGTERM: stop the proxy and the simulators, then give up.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

fn flat_check(name: &'static str, f: Option<&Flatness>) -> Check {
    match f {
        Some(f) => check(
            name,
            f.pass,
            format!(
                "first-third median {:.0}, last-third median {:.0} ({:+.1}%), limit {:.0} (+{}%), max {:.0}, {} samples",
                f.first_third_median,
                f.last_third_median,
                f.growth_pct,
                f.limit,
                f.tolerance_pct,
                f.max,
                f.samples
            ),
        ),
        None => check(name, false, "fewer than 6 samples after warm-up".into()),
    }
}

/// In-flight gauge back at 0, no record dropped by the sink, simulators idle, a clean exit.
fn left_behind(m1: &str, sims_idle: bool, clean_exit: bool) -> Vec<Check> {
    let fams = prom::parse(m1).unwrap_or_default();
    let in_flight = prom::sum(&fams, "goodput_proxy_requests_in_flight", &[]);
    let dropped = prom::sum(
        &fams,
        "goodput_proxy_records_dropped_total",
        &[("sink", "jsonl")],
    );
    vec![
        check(
            "nothing left: proxy in-flight 0, JSONL sink dropped 0, simulators idle",
            in_flight == Ok(0.0) && dropped == Ok(0.0) && sims_idle,
            format!(
                "in flight {}, sink dropped {}, simulators idle {sims_idle}",
                show(&in_flight),
                show(&dropped)
            ),
        ),
        check(
            "proxy drained and exited 0 on SIGTERM",
            clean_exit,
            format!("clean exit {clean_exit}"),
        ),
    ]
}

fn show(v: &Result<f64, prom::Missing>) -> String {
    match v {
        Ok(v) => format!("{v}"),
        Err(e) => e.to_string(),
    }
}

/// `goodput_proxy_requests_total` growth per outcome between two pages (a series absent from a
/// page counts 0 there: the families are labelled lazily, on a request's first outcome).
fn outcome_delta(m0: &str, m1: &str) -> Tally {
    let (f0, f1) = (
        prom::parse(m0).unwrap_or_default(),
        prom::parse(m1).unwrap_or_default(),
    );
    let mut t = [0; OUTCOMES];
    for (k, o) in Outcome::ALL.iter().enumerate() {
        let at = |f: &[prom::Family]| {
            prom::sum(
                f,
                "goodput_proxy_requests_total",
                &[("outcome", o.as_str())],
            )
            .unwrap_or(0.0)
        };
        t[k] = (at(&f1) - at(&f0)).max(0.0) as u64;
    }
    t
}

async fn metrics_page(client: &crate::client::HttpClient, admin: &str) -> anyhow::Result<String> {
    crate::client::get_text(client, &format!("{admin}/metrics"), Duration::from_secs(10))
        .await
        .map_err(|e| anyhow::anyhow!("proxy /metrics: {e}"))
}

/// `/readyz` 200 within 30 s (the proxy has checked its upstreams).
async fn wait_ready(client: &crate::client::HttpClient, admin: &str) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let url = format!("{admin}/readyz");
        if crate::client::get_text(client, &url, Duration::from_secs(2))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if Instant::now() >= until {
            anyhow::bail!("the proxy was not ready within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `/stats?window=W` outcome counts.
async fn stats_outcomes(
    client: &crate::client::HttpClient,
    admin: &str,
    window: f64,
) -> Result<Tally, String> {
    let url = format!("{admin}/stats?window={window:.3}");
    let body = crate::client::get_text(client, &url, Duration::from_secs(10)).await?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let mut t = [0; OUTCOMES];
    for (k, o) in Outcome::ALL.iter().enumerate() {
        t[k] = v["outcomes"][o.as_str()]
            .as_u64()
            .ok_or_else(|| format!("/stats has no outcomes.{}", o.as_str()))?;
    }
    Ok(t)
}

/// The proxy's JSONL sink, line by line (it can be hundreds of MB after 30 minutes).
fn read_records(
    path: &std::path::Path,
    run_id: &str,
    into: &mut ProxyLedger,
) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    struct Line {
        id: String,
        outcome: String,
    }
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    for line in std::io::BufReader::new(f).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Line>(&line) {
            Ok(l) => into.add(run_id, &l.id, &l.outcome),
            Err(_) => into.unreadable += 1,
        }
    }
    Ok(())
}

async fn sample_loop(pid: u32, start: Instant, out: Arc<Mutex<Vec<Sample>>>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        let Some(s) = proxy::sample(pid, start.elapsed().as_secs_f64()) else {
            return;
        };
        out.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

async fn progress_loop(d: Arc<Driver>, pid: u32, start: Instant, total: Duration, every: f64) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(every));
    tick.tick().await;
    loop {
        tick.tick().await;
        let el = start.elapsed();
        let s = proxy::sample(pid, el.as_secs_f64());
        eprintln!(
            "soak {}/{}: sent {}, in flight {}, proxy RSS {} fds {}, outcomes {:?}",
            hms(el),
            hms(total),
            d.issued(),
            d.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            s.map_or("?".into(), |s| format!(
                "{:.1} MiB",
                s.rss_kib as f64 / 1024.0
            )),
            s.map_or("?".into(), |s| s.fds.to_string()),
            verdict::named(&d.tally())
        );
    }
}

fn hms(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// The human-readable verdict.
pub fn render(r: &SoakReport) -> String {
    let mut out = format!(
        "soak: {} requests ({} audit) in {:.0} s at {} workers, {:.0} req/s, client outcomes {:?}\n",
        r.requests, r.audit_requests, r.duration_s, r.concurrency, r.requests_per_second, r.client_outcomes
    );
    for c in &r.checks {
        out.push_str(&format!(
            "  {} {}: {}\n",
            if c.pass { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        ));
    }
    if let Some(b) = r.detectable_leak_bytes_per_request {
        out.push_str(&format!(
            "  (the RSS criterion catches a steady leak of {b:.0} bytes per request or more in this run)\n"
        ));
    }
    out.push_str(&format!(
        "SOAK {} (wall {:.0} s; {}/soak.json)\n",
        if r.pass { "PASS" } else { "FAIL" },
        r.wall_s,
        r.out_dir
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_seconds_minutes_hours() {
        assert_eq!(parse_duration("180s"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        for bad in ["", "0s", "-3m", "5d", "25h", "xs"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn outcome_delta_is_per_outcome_growth() {
        let m0 = "# TYPE goodput_proxy_requests_total counter\n\
                  goodput_proxy_requests_total{model=\"tiny\",upstream=\"u0\",outcome=\"success\",finish_reason=\"length\"} 5\n";
        let m1 = "# TYPE goodput_proxy_requests_total counter\n\
                  goodput_proxy_requests_total{model=\"tiny\",upstream=\"u0\",outcome=\"success\",finish_reason=\"length\"} 12\n\
                  goodput_proxy_requests_total{model=\"tiny\",upstream=\"u1\",outcome=\"success\",finish_reason=\"length\"} 3\n\
                  goodput_proxy_requests_total{model=\"tiny\",upstream=\"none\",outcome=\"timeout\",finish_reason=\"none\"} 2\n";
        let d = outcome_delta(m0, m1);
        assert_eq!(verdict::named(&d).get("success"), Some(&10));
        assert_eq!(verdict::named(&d).get("timeout"), Some(&2));
        assert_eq!(d.iter().sum::<u64>(), 12);
    }
}
