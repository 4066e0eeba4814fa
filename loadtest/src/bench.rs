//! `goodput-loadtest bench`: the two loads of `scripts/bench.sh` that wrk cannot make. Each
//! prints one JSON object on stdout.
//!
//! - `paced`: `--streams` closed-loop workers for `--warmup` + `--duration` seconds; requests
//!   started in the warm-up (new connections, TCP handshakes) are left out. Client-side exact
//!   TTFT and E2E percentiles, measured by the proxy's own `StreamMeter` (`client::send`).
//! - `burst`: `--streams` requests started at once, each on its own connection (HTTP/1 has one
//!   request in flight per connection). Counts outcomes, statuses and errors, and the most
//!   streams that were open (response head in, body not ended) at one instant; with a slow
//!   engine behind, that is the "held streams" plateau the script reads RSS at.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use goodput_measure::{summarize, Outcome, Summary};
use http::Uri;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{self, HttpClient, Outgoing, Sent};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Mode {
    Paced,
    Burst,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub mode: Mode,
    /// Base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub target: String,
    /// Workers (paced) or requests started at once (burst).
    #[arg(long)]
    pub streams: usize,
    /// Measured seconds (paced), after the warm-up.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Seconds of warm-up whose requests are not counted (paced).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u64,
    /// Stream responses (default) or not: `--stream false`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub stream: bool,
    #[arg(long, default_value = "tiny")]
    pub model: String,
    /// One extra request header, `NAME: VALUE` (e.g. `x-sim-fault: stall-every=10` paces the
    /// simulator's tokens).
    #[arg(long)]
    pub header: Option<String>,
    /// Per-request deadline, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
}

/// What one bench run prints.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub mode: &'static str,
    pub streams: usize,
    /// Requests counted (paced: started after the warm-up).
    pub requests: u64,
    /// Requests completed in all, warm-up included (what a server's CPU time was spent on).
    pub completed: u64,
    pub success: u64,
    /// Requests whose outcome was not `success`.
    pub errors: u64,
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Response statuses other than 200, by code.
    pub statuses: BTreeMap<u16, u64>,
    /// The first few distinct transport errors.
    pub error_samples: Vec<String>,
    pub ttft_ms: Option<Summary>,
    pub e2e_ms: Option<Summary>,
    /// Most streams open at one instant (head received, body not ended).
    pub peak_open: u64,
    pub elapsed_s: f64,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<BenchReport> {
    let base = args.target.trim_end_matches('/');
    let uri: Uri = format!("{base}/v1/chat/completions").parse()?;
    let body = serde_json::to_vec(&serde_json::json!({
        "model": args.model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": args.max_tokens,
        "ignore_eos": true,
        "stream": args.stream,
    }))?;
    let header = match &args.header {
        Some(h) => {
            let (k, v) = h
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("--header wants NAME: VALUE, got {h:?}"))?;
            Some((k.trim().to_string(), v.trim().to_string()))
        }
        None => None,
    };
    // A burst is of new connections: none is reused (a reused keep-alive connection can be
    // closed by the server just as the request goes out, which is the client's race, not the
    // server's error).
    let client = client::http_client(match args.mode {
        Mode::Paced => args.streams,
        Mode::Burst => 0,
    });
    let job = Arc::new(Job {
        client,
        header,
        uri,
        body,
        stream: args.stream,
        timeout: Duration::from_secs_f64(args.timeout),
    });
    let start = Instant::now();
    let (mode, completed, sent) = match args.mode {
        Mode::Paced => {
            let counted_from = start + Duration::from_secs_f64(args.warmup);
            let until = counted_from + Duration::from_secs_f64(args.duration);
            let all = paced(&job, args.streams, until).await;
            let completed = all.len();
            let counted = all.into_iter().filter(|s| s.t0 >= counted_from).collect();
            ("paced", completed, counted)
        }
        Mode::Burst => {
            let all = burst(&job, args.streams).await;
            ("burst", all.len(), all)
        }
    };
    let mut r = report(mode, args.streams, &sent, start.elapsed());
    r.completed = completed as u64;
    Ok(r)
}

struct Job {
    client: HttpClient,
    uri: Uri,
    body: Vec<u8>,
    header: Option<(String, String)>,
    stream: bool,
    timeout: Duration,
}

impl Job {
    async fn send(&self, id: &str) -> Sent {
        client::send(
            &self.client,
            Outgoing {
                uri: &self.uri,
                body: self.body.clone(),
                stream: self.stream,
                request_id: id,
                extra_header: self.header.as_ref().map(|(k, v)| (k.as_str(), v.as_str())),
                timeout: self.timeout,
                hangup_after: None,
            },
        )
        .await
    }
}

async fn paced(job: &Arc<Job>, workers: usize, until: Instant) -> Vec<Sent> {
    let mut set = JoinSet::new();
    for w in 0..workers {
        let job = job.clone();
        set.spawn(async move {
            let mut done = Vec::new();
            let mut i = 0u64;
            while Instant::now() < until {
                done.push(job.send(&format!("bench-{w}-{i}")).await);
                i += 1;
            }
            done
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.unwrap_or_default());
    }
    all
}

async fn burst(job: &Arc<Job>, n: usize) -> Vec<Sent> {
    let mut set = JoinSet::new();
    for i in 0..n {
        let job = job.clone();
        set.spawn(async move { job.send(&format!("burst-{i}")).await });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        if let Ok(s) = r {
            all.push(s);
        }
    }
    all
}

fn report(mode: &'static str, streams: usize, sent: &[Sent], elapsed: Duration) -> BenchReport {
    let mut outcomes = BTreeMap::new();
    let mut statuses = BTreeMap::new();
    let mut error_samples: Vec<String> = Vec::new();
    let mut ttft = Vec::new();
    let mut e2e = Vec::new();
    for s in sent {
        let m = &s.measurement;
        *outcomes.entry(m.outcome.as_str()).or_insert(0) += 1;
        match m.status {
            Some(200) => {}
            Some(code) => *statuses.entry(code).or_insert(0) += 1,
            None => {}
        }
        if let Some(e) = &s.error {
            if error_samples.len() < 3 && !error_samples.contains(e) {
                error_samples.push(e.clone());
            }
        }
        if let Some(t) = m.ttft {
            ttft.push(t.as_secs_f64() * 1e3);
        }
        e2e.push(m.e2e.as_secs_f64() * 1e3);
    }
    let success = outcomes
        .get(Outcome::Success.as_str())
        .copied()
        .unwrap_or(0);
    BenchReport {
        mode,
        streams,
        requests: sent.len() as u64,
        completed: sent.len() as u64,
        success,
        errors: sent.len() as u64 - success,
        outcomes,
        statuses,
        error_samples,
        ttft_ms: summarize(&mut ttft),
        e2e_ms: summarize(&mut e2e),
        peak_open: peak_open(sent),
        elapsed_s: elapsed.as_secs_f64(),
    }
}

/// The most intervals [head received, end) that overlap at one instant.
fn peak_open(sent: &[Sent]) -> u64 {
    let mut edges: Vec<(Instant, i64)> = Vec::with_capacity(sent.len() * 2);
    for s in sent {
        if let Some(head) = s.measurement.ttfb {
            edges.push((s.t0 + head, 1));
            edges.push((s.t0 + s.measurement.e2e, -1));
        }
    }
    // Ends sort before starts at the same instant: touching intervals do not overlap.
    edges.sort_unstable();
    let (mut open, mut peak) = (0i64, 0i64);
    for (_, d) in edges {
        open += d;
        peak = peak.max(open);
    }
    peak as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use goodput_measure::Measurement;

    fn sent(t0: Instant, head_ms: u64, end_ms: u64) -> Sent {
        let mut m = Measurement::without_body(Outcome::Success, Some(200), ms(end_ms));
        m.ttfb = Some(ms(head_ms));
        Sent {
            t0,
            measurement: m,
            itl: Vec::new(),
            error: None,
            hung_up: false,
        }
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn peak_open_counts_overlapping_streams_only() {
        let t = Instant::now();
        // [10, 50) and [20, 60) overlap; [60, 90) starts as the second ends; no head: not open.
        let mut none = sent(t, 0, 5);
        none.measurement.ttfb = None;
        let all = [
            sent(t, 10, 50),
            sent(t + ms(10), 10, 50),
            sent(t + ms(50), 10, 40),
            none,
        ];
        assert_eq!(peak_open(&all), 2);
        assert_eq!(peak_open(&all[2..]), 1);
        assert_eq!(peak_open(&[]), 0);
    }

    #[test]
    fn report_counts_outcomes_statuses_and_errors() {
        let t = Instant::now();
        let bad = || {
            let mut s = sent(t, 1, 2);
            s.measurement.outcome = Outcome::UpstreamError;
            s.measurement.status = Some(502);
            s.error = Some("connect refused".into());
            s
        };
        let r = report("burst", 3, &[sent(t, 1, 3), bad(), bad()], ms(5));
        assert_eq!((r.requests, r.success, r.errors), (3, 1, 2));
        assert_eq!(r.statuses.get(&502), Some(&2));
        assert_eq!(r.outcomes.get("upstream_error"), Some(&2));
        assert_eq!(r.error_samples, ["connect refused"]);
    }
}
