//! `goodput-loadtest autoscale`: the proof that the proxy's autoscaling signals scale a fleet
//! well (docs/autoscaling.md). For each signal, in turn and on the same seeded load: a fresh
//! fleet of simulated engines behind a fresh proxy (in this process, on 127.0.0.1), a load
//! that warms, ramps, holds, spikes and falls, and a scaler loop that reads the proxy's admin
//! `/metrics` like an HPA and adds or removes replicas through the proxy's DNS discovery, each
//! new one serving only after a start delay. The proxy is the real binary (a child process,
//! as in the soak); the engines and the load live in this process.
//!
//! Time is compressed `--compress` times for everything that paces scaling: the load's phases,
//! the start delay, the scaler's period and stabilization window, discovery, engine scrapes,
//! the proxy's estimator tick and windows. Requests themselves run in real time (a short stream
//! at tens of ms per token, judged by SLOs of that scale), so the figures are reported in the
//! model's time: seconds of the run x `compress`.

mod fleet;
pub mod policy;
pub mod profile;
mod report;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use goodput_measure::prom;
use goodput_measure::slo::{judge, Slo};
use goodput_sim::SimConfig;
use http::Uri;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use crate::client::{self, http_client, Outgoing};
use crate::soak::proxy::{default_bin, ProxyProcess};
use fleet::Fleet;
use policy::{Hpa, Signal};
use profile::{Done, Miss};

/// The model every request names.
const MODEL: &str = "sim";
/// Output tokens of every request.
const OUTPUT_TOKENS: u64 = 16;

#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct AutoscaleArgs {
    /// Output directory: summary.json, table.md, report.html.
    #[arg(long, default_value = "autoscale-out")]
    pub out: PathBuf,
    /// The signals to run, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "queue,demand,tokens,pending,desired"
    )]
    pub signals: Vec<Signal>,
    /// Time compression: one second of the run is this many seconds of the model.
    #[arg(long, default_value_t = 20.0)]
    pub compress: f64,
    /// Seed of the arrivals and request sizes (the same for every signal).
    #[arg(long, default_value_t = 27)]
    pub seed: u64,
    /// Requests per second at the start, at the plateau, and the spike's multiple of it.
    #[arg(long, default_value_t = 4.0)]
    pub base_rate: f64,
    /// Requests per second of the opening burst (about twice what one replica carries).
    #[arg(long, default_value_t = 18.0)]
    pub burst_rate: f64,
    #[arg(long, default_value_t = 36.0)]
    pub hold_rate: f64,
    #[arg(long, default_value_t = 1.6)]
    pub spike: f64,
    /// A new replica serves this long (model seconds) after it is asked for.
    #[arg(long, default_value_t = 90.0)]
    pub start_delay_s: f64,
    /// The scaler's period and scale-down stabilization window (model seconds).
    #[arg(long, default_value_t = 15.0)]
    pub period_s: f64,
    #[arg(long, default_value_t = 300.0)]
    pub stabilization_s: f64,
    #[arg(long, default_value_t = 1)]
    pub min_replicas: usize,
    #[arg(long, default_value_t = 10)]
    pub max_replicas: usize,
    /// Per-replica targets of the static signals: waiting requests, demand (requests in
    /// flight + waiting), and demand in tokens as a multiple of a mean request's tokens.
    #[arg(long, default_value_t = 2.0)]
    pub queue_target: f64,
    #[arg(long, default_value_t = 6.0)]
    pub demand_target: f64,
    /// The HPA's per-replica target on the desired-replicas hint (`AverageValue`): below 1
    /// keeps spare replicas (the hint says what the load needs at `[scale] target`; 0.8 runs
    /// a quarter more, room for a burst while new replicas start).
    #[arg(long, default_value_t = 0.8)]
    pub desired_target: f64,
    /// Each replica's cap on unfinished requests, running and waiting (vLLM's
    /// `--max-num-queued-reqs` as the simulator models it): a request over it is rejected at
    /// admission (503), and the proxy retries it on another replica while the client has seen
    /// nothing. No cap when absent.
    #[arg(long)]
    pub max_queued: Option<u64>,
    /// The signals whose fleet gets `--max-queued` (default: all). A queue-length signal
    /// cannot see past the cap (the engines never hold more than it), so a side by side with
    /// bounded queues for the proxy's signals runs `queue` unbounded, its best case.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub capped: Option<Vec<Signal>>,
    /// Loopback ports: every replica listens on this one (each at its own 127.0.0.x), the
    /// proxy on the next two (traffic, admin). 0: any free ports.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// SLO attainment target (`[scale] target`).
    #[arg(long, default_value_t = 0.95)]
    pub target: f64,
    /// The proxy binary (default: `goodput-proxy` beside this executable).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// The proxy's `RUST_LOG` (its log is `proxy.log` in each signal's directory);
    /// `goodput_proxy::scale=debug` adds the desired-replicas hint's inputs at every tick.
    #[arg(long, default_value = "warn,goodput_proxy=info")]
    pub proxy_log: String,
}

impl AutoscaleArgs {
    /// The engine cap of `signal`'s fleet (`--max-queued`, `--capped`).
    fn cap_for(&self, signal: Signal) -> Option<u64> {
        let capped = self.capped.as_ref().is_none_or(|c| c.contains(&signal));
        self.max_queued.filter(|_| capped)
    }
}

/// The engine replica: 8 decode slots, 20 ms per token plus 2 ms per sequence in the batch,
/// prefill at 0.1 ms per prompt token. A request waits for a slot once 8 run; with
/// `max_queued`, one that finds that many unfinished is rejected.
fn replica(max_queued: Option<u64>) -> SimConfig {
    SimConfig {
        models: vec![MODEL.to_string()],
        ttft_ms: 30.0,
        prefill_ms_per_token: 0.1,
        tpot_ms: 20.0,
        tpot_ms_per_seq: 2.0,
        max_num_seqs: 8,
        max_num_queued_reqs: max_queued,
        ..SimConfig::default()
    }
}

/// The tokens one stream holds pending at a replica of shape `sim` running `max_num_seqs`
/// streams and none waiting, averaged over the stream's life: its `prompt` tokens while
/// in prefill, then its output still to come (half of it on average) while it decodes. The
/// static target of the pending signal is this times the streams a replica should run, as an
/// operator would set it from the engine's profile.
fn pending_per_stream(sim: &SimConfig, prompt: f64) -> f64 {
    let out = OUTPUT_TOKENS as f64;
    let prefill_ms = sim.ttft_ms + sim.prefill_ms_per_token * prompt;
    let step_ms = sim.tpot_ms + sim.tpot_ms_per_seq * sim.max_num_seqs as f64;
    let decode_ms = out * step_ms;
    (prompt * prefill_ms + out / 2.0 * decode_ms) / (prefill_ms + decode_ms)
}

/// The SLOs requests are judged by, on the proxy and here.
fn slo() -> Slo {
    Slo {
        ttft: Some(Duration::from_millis(250)),
        tpot: Some(Duration::from_millis(50)),
        e2e: Some(Duration::from_secs(5)),
        max_stall: None,
        valid_tool_calls: false,
    }
}

/// One planned request: when (run seconds) and its body.
struct Planned {
    at: f64,
    body: Vec<u8>,
    /// Tokens as the balancer estimates them (prompt bytes / 4 + output asked for).
    est_tokens: u64,
}

fn plan(args: &AutoscaleArgs) -> Vec<Planned> {
    let phases = real_phases(args);
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x5ca1e);
    profile::arrivals(&phases, args.seed)
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            let prompt_tokens = rng.random_range(64..=512u64);
            let prompt = crate::request::synth_prompt(prompt_tokens, i as u32);
            let body = serde_json::json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": OUTPUT_TOKENS,
                "stream": true,
            })
            .to_string()
            .into_bytes();
            let est_tokens = (body.len() as u64).div_ceil(4) + OUTPUT_TOKENS;
            Planned {
                at,
                body,
                est_tokens,
            }
        })
        .collect()
}

/// The model's phases with their durations compressed to run time.
fn real_phases(args: &AutoscaleArgs) -> Vec<profile::Phase> {
    model_phases(args)
        .into_iter()
        .map(|mut p| {
            p.seconds /= args.compress;
            p
        })
        .collect()
}

fn model_phases(args: &AutoscaleArgs) -> Vec<profile::Phase> {
    profile::phases(args.base_rate, args.burst_rate, args.hold_rate, args.spike)
}

/// What one signal's run produced (times in model seconds).
#[derive(Debug, Clone, Serialize)]
pub struct SignalRun {
    pub signal: Signal,
    pub metric: &'static str,
    pub target: f64,
    pub done: Vec<Done>,
    /// (time, replicas asked for) and (time, replicas serving), one step per change.
    pub replicas: Vec<(f64, usize)>,
    pub ready: Vec<(f64, usize)>,
    /// (time, signal value) at every scaler decision.
    pub values: Vec<(f64, Option<f64>)>,
    /// Each replica's cap on unfinished requests (`None`: unbounded).
    pub engine_cap: Option<u64>,
}

pub async fn run(args: AutoscaleArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let planned = Arc::new(plan(&args));
    let mean_tokens =
        planned.iter().map(|p| p.est_tokens).sum::<u64>() as f64 / planned.len().max(1) as f64;
    let mut runs = Vec::new();
    for &signal in &args.signals {
        let target = match signal {
            Signal::Queue => args.queue_target,
            Signal::Demand => args.demand_target,
            Signal::Tokens => args.demand_target * mean_tokens,
            Signal::Pending => {
                args.demand_target
                    * pending_per_stream(
                        &replica(args.max_queued),
                        mean_tokens - OUTPUT_TOKENS as f64,
                    )
            }
            Signal::Desired => args.desired_target,
        };
        eprintln!(
            "autoscale: signal {} ({}), target {target:.1} per replica, {} requests",
            signal.as_str(),
            signal.metric(),
            planned.len()
        );
        let r = run_one(&args, signal, target, planned.clone()).await?;
        runs.push(r);
    }
    report::write(&args, &model_phases(&args), &runs)
}

/// The proxy's configuration file: discovery from the fleet's hosts file, the SLOs, and
/// every interval compressed.
fn proxy_config(args: &AutoscaleArgs, port: u16, hosts: &std::path::Path) -> String {
    let k = args.compress;
    let ms = |model_ms: f64| ((model_ms / k).round() as u64).max(10);
    let s = slo();
    let limit =
        |d: Option<Duration>| d.map_or("\"none\"".to_string(), |d| d.as_millis().to_string());
    let short = ((30.0 / k).ceil() as u64).max(1);
    let long = ((300.0 / k).ceil() as u64).max(short + 1);
    let (listen, admin) = match args.port {
        0 => (0, 0),
        p => (p.saturating_add(1), p.saturating_add(2)),
    };
    format!(
        r#"[server]
listen = "127.0.0.1:{listen}"
admin_listen = "127.0.0.1:{admin}"
drain_delay_ms = 0
grace_period_ms = 2000

[upstream]
discover = ["dns://{name}:{port}"]
discover_hosts_file = "{hosts}"
discover_interval_ms = {discover}
health_interval_ms = {health}

[measure]
models = ["{MODEL}"]

[slo]
ttft_ms = {ttft}
tpot_ms = {tpot}
e2e_ms = {e2e}
valid_tool_calls = false

[engine]
scrape_interval_ms = {scrape}
scrape_timeout_ms = {scrape_timeout}

[log]
access = false

[scale]
target = {target}
short_window_s = {short}
long_window_s = {long}
tick_ms = {tick}
load_window_ms = {load_window}
# The run is short: a load bin counts from 10 requests.
min_requests = 10
"#,
        name = fleet::NAME,
        hosts = hosts.display(),
        discover = ms(5_000.0),
        health = ms(2_000.0),
        ttft = limit(s.ttft),
        tpot = limit(s.tpot),
        e2e = limit(s.e2e),
        scrape = ms(5_000.0),
        scrape_timeout = ms(2_000.0),
        target = args.target,
        tick = ms(1_000.0),
        load_window = ms(10_000.0),
    )
}

async fn run_one(
    args: &AutoscaleArgs,
    signal: Signal,
    target: f64,
    planned: Arc<Vec<Planned>>,
) -> anyhow::Result<SignalRun> {
    let k = args.compress;
    let real = |model_s: f64| Duration::from_secs_f64(model_s / k);
    let dir = args.out.join(signal.as_str());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let hosts = std::fs::canonicalize(&dir)?.join("fleet.hosts");
    let mut fleet = Fleet::start(
        replica(args.cap_for(signal)),
        real(args.start_delay_s),
        real(30.0),
        hosts.clone(),
        args.port,
    )
    .await?;
    fleet.scale_to(args.min_replicas.max(1))?;
    let config = dir.join("goodput-proxy.toml");
    std::fs::write(&config, proxy_config(args, fleet.port(), &hosts))
        .with_context(|| format!("writing {}", config.display()))?;
    let bin = args.proxy_bin.clone().unwrap_or_else(default_bin);
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.arg("serve")
        .env("GOODPUT_PROXY_CONFIG", &config)
        .env("RUST_LOG", &args.proxy_log);
    let proxy = ProxyProcess::start(cmd, &dir.join("proxy.log"))
        .await
        .with_context(|| format!("starting {}", bin.display()))?;
    let (addr, admin) = (proxy.addr, proxy.admin);
    let http = http_client(256);
    let uri: Uri = format!("http://{addr}/v1/chat/completions").parse()?;
    let metrics_url = format!("http://{admin}/metrics");
    let done: Arc<Mutex<Vec<Done>>> = Arc::default();
    let t0 = Instant::now();
    let total_real = profile::total(&real_phases(args));
    let driver = {
        let (http, uri, done, planned) = (http.clone(), uri.clone(), done.clone(), planned);
        let slo = slo();
        tokio::spawn(async move {
            let mut tasks = Vec::with_capacity(planned.len());
            for i in 0..planned.len() {
                tokio::time::sleep_until(t0 + Duration::from_secs_f64(planned[i].at)).await;
                let (http, uri, done, planned) =
                    (http.clone(), uri.clone(), done.clone(), planned.clone());
                let slo = slo;
                tasks.push(tokio::spawn(async move {
                    let p = &planned[i];
                    let id = format!("as-{i}");
                    let sent = client::send(
                        &http,
                        Outgoing {
                            uri: &uri,
                            body: p.body.clone(),
                            stream: true,
                            request_id: &id,
                            extra_header: None,
                            timeout: Duration::from_secs(30),
                            hangup_after: None,
                        },
                    )
                    .await;
                    let m = &sent.measurement;
                    let success = m.outcome == goodput_measure::Outcome::Success;
                    let miss = Miss::of(success, &judge(m, &slo));
                    let good = miss.is_none();
                    let ttft_ms = m.ttft.map(|t| t.as_secs_f64() * 1e3);
                    let start = sent.t0.saturating_duration_since(t0).as_secs_f64() * k;
                    let end = start + m.e2e.as_secs_f64() * k;
                    if let Ok(mut d) = done.lock() {
                        d.push(Done {
                            start,
                            end,
                            good,
                            miss,
                            ttft_ms,
                        });
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        })
    };
    let mut hpa = Hpa::new(
        target,
        args.min_replicas,
        args.max_replicas,
        args.stabilization_s,
    );
    let mut replicas = vec![(0.0, fleet.len())];
    let mut ready = vec![(0.0, fleet.ready_count())];
    let mut values = Vec::new();
    let mut next_decision = 0.0;
    let poll = Duration::from_millis(20);
    loop {
        let now_real = t0.elapsed().as_secs_f64();
        if now_real >= total_real {
            break;
        }
        let now = now_real * k;
        fleet.poll().await?;
        if now >= next_decision {
            next_decision = now + args.period_s;
            let value = match client::get_text(&http, &metrics_url, Duration::from_secs(2)).await {
                Ok(page) => prom::parse(&page).ok().and_then(|f| signal.read(&f, MODEL)),
                Err(_) => None,
            };
            values.push((now, value));
            let n = hpa.decide(now, value, fleet.len());
            if n != fleet.len() {
                fleet.scale_to(n)?;
            }
        }
        if replicas.last().is_some_and(|r| r.1 != fleet.len()) {
            replicas.push((now, fleet.len()));
        }
        if ready.last().is_some_and(|r| r.1 != fleet.ready_count()) {
            ready.push((now, fleet.ready_count()));
        }
        tokio::time::sleep(poll).await;
    }
    let end = total_real * k;
    replicas.push((end, fleet.len()));
    ready.push((end, fleet.ready_count()));
    // Requests still in flight finish against the fleet as it stands.
    let _ = tokio::time::timeout(Duration::from_secs(60), driver).await;
    proxy.stop(Duration::from_secs(5)).await;
    fleet.stop().await;
    let mut done = done.lock().map(|d| d.clone()).unwrap_or_default();
    done.sort_by(|a, b| a.start.total_cmp(&b.start));
    Ok(SignalRun {
        signal,
        metric: signal.metric(),
        target,
        done,
        replicas,
        ready,
        values,
        engine_cap: args.cap_for(signal),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AutoscaleArgs,
    }

    #[test]
    fn the_engine_cap_goes_to_the_signals_named() {
        // (arguments, signal, cap)
        let cases: &[(&[&str], Signal, Option<u64>)] = &[
            (&[], Signal::Desired, None),
            (&["--max-queued", "10"], Signal::Queue, Some(10)),
            (&["--max-queued", "10"], Signal::Desired, Some(10)),
            (
                &["--max-queued", "10", "--capped", "desired"],
                Signal::Desired,
                Some(10),
            ),
            (
                &["--max-queued", "10", "--capped", "desired"],
                Signal::Queue,
                None,
            ),
            (&["--capped", "desired"], Signal::Desired, None),
        ];
        for &(argv, signal, want) in cases {
            let cli = Cli::try_parse_from(std::iter::once("x").chain(argv.iter().copied()));
            let Ok(cli) = cli else {
                panic!("{argv:?}: does not parse")
            };
            assert_eq!(cli.args.cap_for(signal), want, "{argv:?} {signal:?}");
        }
    }
}
