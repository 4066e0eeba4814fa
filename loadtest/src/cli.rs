//! Command line: `goodput-loadtest run --target URL [--scenario FILE] --out DIR [flags]`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

use crate::metrics::LoadMetrics;
use crate::runner::{self, CompareTargets, RunConfig};
use crate::scenario::{Api, QuickSpec, Scenario};

#[derive(Debug, Parser)]
#[command(
    name = "goodput-loadtest",
    version,
    about = "Phased open-loop load with exact client-side percentiles, goodput and an HTML report"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scenario (or a one-phase load from flags) and write the reports.
    Run(Box<RunArgs>),
    /// Re-render report.html (and print the table) from a run's summary.json and requests.jsonl.
    Report {
        /// The run's output directory.
        dir: PathBuf,
    },
    /// The loads of scripts/bench.sh that wrk cannot make: paced streams (client TTFT) and a
    /// burst of streams started at once (errors, peak open); one JSON object on stdout.
    Bench(crate::bench::BenchArgs),
    /// The proxy binary in front of simulators with a mixed fault share for a bounded time:
    /// every request in exactly one outcome on both sides, RSS and fds flat; PASS/FAIL, exit 2
    /// on FAIL (docs/RELIABILITY.md).
    Soak(crate::soak::SoakArgs),
    /// A simulated fleet scaled by a small HPA-like loop on each of the proxy's signals in
    /// turn (engine queue, demand, tokens in flight, desired replicas), on the same seeded
    /// load; a table and a chart per signal (docs/autoscaling.md).
    Autoscale(crate::autoscale::AutoscaleArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ApiArg {
    Chat,
    Completions,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Base URL of the proxy or engine, e.g. http://127.0.0.1:8080 (overrides the scenario's).
    #[arg(long, env = "GOODPUT_LOADTEST_TARGET")]
    pub target: Option<String>,
    /// Scenario TOML; without it, one phase is built from the flags below.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Output directory for requests.jsonl, summary.json and report.html.
    #[arg(long, default_value = "loadtest-out")]
    pub out: PathBuf,
    /// Poisson arrival rate (requests/s) for a flags-only run.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Closed-loop concurrency for a flags-only run.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Phase duration in seconds for a flags-only run.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Number of requests for a flags-only run (default 100 when no duration is given).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Model name (overrides the scenario's models).
    #[arg(long)]
    pub model: Option<String>,
    /// Prompt length in tokens (fixed).
    #[arg(long)]
    pub prompt_tokens: Option<u64>,
    /// max_tokens per request (fixed).
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Stream responses: `--stream` or `--stream true|false`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub stream: Option<bool>,
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, value_enum)]
    pub api: Option<ApiArg>,
    /// Cap on requests in flight; arrivals beyond it are held back and counted.
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// Serve the loadtest's own Prometheus metrics here during the run, e.g. 127.0.0.1:9400.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Proxy admin base URL (its /metrics and /stats are snapshotted at each phase start and end).
    #[arg(long)]
    pub proxy_admin: Option<String>,
    /// An engine's own /metrics URL (repeatable).
    #[arg(long)]
    pub engine_metrics: Vec<String>,
    /// The proxy's JSONL record sink, to join client and proxy records by request id.
    #[arg(long)]
    pub proxy_records: Option<PathBuf>,
    /// Seconds after the last request to take one more proxy/engine snapshot (`settled`
    /// counters: e.g. the engine's running requests back at 0); 0 for none.
    #[arg(long, default_value_t = 1.0)]
    pub settle_s: f64,
    /// Never show the live progress line.
    #[arg(long)]
    pub no_progress: bool,
}

impl RunArgs {
    fn quick(&self) -> QuickSpec {
        QuickSpec {
            rate: self.rate,
            concurrency: self.concurrency,
            duration_s: self.duration,
            requests: self.requests,
            model: self.model.clone(),
            prompt_tokens: self.prompt_tokens,
            max_tokens: self.max_tokens,
            stream: self.stream,
            seed: self.seed,
            api: self.api.map(|a| match a {
                ApiArg::Chat => Api::Chat,
                ApiArg::Completions => Api::Completions,
            }),
            max_in_flight: self.max_in_flight,
        }
    }
}

/// Run to completion: load, write outputs, print the table. Returns the process exit code.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let (scenario, name) = match &args.scenario {
        Some(p) => {
            let mut sc = Scenario::load(p)?;
            if args.rate.is_some()
                || args.concurrency.is_some()
                || args.duration.is_some()
                || args.requests.is_some()
            {
                anyhow::bail!("--rate/--concurrency/--duration/--requests build a scenario; do not combine them with --scenario");
            }
            sc.apply_overrides(&args.quick());
            sc.validate()?;
            (sc, p.display().to_string())
        }
        None => (Scenario::from_quick(&args.quick())?, "flags".to_string()),
    };
    let target = args
        .target
        .clone()
        .or_else(|| scenario.target.clone())
        .ok_or_else(|| {
            anyhow::anyhow!("no target: pass --target URL or set `target` in the scenario")
        })?;
    let metrics = match args.metrics_listen {
        Some(addr) => {
            let names: Vec<String> = scenario.phases.iter().map(|p| p.name.clone()).collect();
            let m = Arc::new(LoadMetrics::new(&names)?);
            let (local, _task) = crate::metrics::serve(addr, m.clone()).await?;
            eprintln!("goodput-loadtest: metrics on http://{local}/metrics");
            Some(m)
        }
        None => None,
    };
    let result = runner::run(RunConfig {
        target,
        scenario,
        scenario_name: name,
        show_progress: !args.no_progress && crate::progress::enabled(),
        metrics,
        compare: CompareTargets {
            proxy_admin: args.proxy_admin.clone(),
            engine_metrics: args.engine_metrics.clone(),
            proxy_records: args.proxy_records.clone(),
            settle_s: Some(args.settle_s),
        },
        run_id: crate::request::run_id(),
    })
    .await?;
    crate::report::write_all(&args.out, &result.summary, &result.windows, &result.records)?;
    print!("{}", crate::report::table::render(&result.summary));
    println!(
        "wrote {}/{{requests.jsonl,summary.json,report.html}}",
        args.out.display()
    );
    Ok(())
}

/// `goodput-loadtest report DIR`: the HTML and the table again, from the files of a run.
pub fn rerender(dir: &std::path::Path) -> anyhow::Result<()> {
    let summary: crate::report::Summary =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json"))?)?;
    let mut records = Vec::new();
    for line in std::fs::read_to_string(dir.join("requests.jsonl"))?.lines() {
        records.push(serde_json::from_str::<crate::record::RequestRecord>(line)?);
    }
    let windows = crate::report::summary::windows_of(&summary);
    std::fs::write(
        dir.join("report.html"),
        crate::report::html::render(&summary, &windows, &records),
    )?;
    print!("{}", crate::report::table::render(&summary));
    println!("wrote {}/report.html", dir.display());
    Ok(())
}
