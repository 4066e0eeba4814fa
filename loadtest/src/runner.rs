//! The run: phases in order, open-loop arrivals that never wait for responses, a cap on
//! requests in flight that counts the arrivals it holds back, closed-loop workers for
//! `concurrency` phases, snapshots for the comparison, and the records at the end.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goodput_measure::{judge, Slo};
use http::Uri;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{self, HttpClient, Outgoing};
use crate::metrics::LoadMetrics;
use crate::progress::{Progress, Tick};
use crate::record::RequestRecord;
use crate::report::compare::{self, PhaseSnapshots, Snapshot};
use crate::report::summary::{self, PhaseWindow, Summary};
use crate::request::{self, Mixer};
use crate::scenario::{Api, Mix, Phase, Scenario};
use crate::schedule::{self, Arrivals};

/// Where to look for the comparison's other witnesses.
#[derive(Debug, Clone, Default)]
pub struct CompareTargets {
    /// Proxy admin base URL (`/metrics`, `/stats`).
    pub proxy_admin: Option<String>,
    /// Engines' own `/metrics` URLs.
    pub engine_metrics: Vec<String>,
    /// The proxy's JSONL record sink, read after the run to join by request id.
    pub proxy_records: Option<PathBuf>,
    /// One more snapshot this long after every request finished (`settled` in the counters),
    /// e.g. to see the engine's running requests back at 0 after hang-ups. Default 1 s; 0: none.
    pub settle_s: Option<f64>,
}

impl CompareTargets {
    pub fn any(&self) -> bool {
        self.proxy_admin.is_some()
            || !self.engine_metrics.is_empty()
            || self.proxy_records.is_some()
    }
}

pub struct RunConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080`.
    pub target: String,
    pub scenario: Scenario,
    /// Label for reports (file name or `flags`).
    pub scenario_name: String,
    pub show_progress: bool,
    pub metrics: Option<Arc<LoadMetrics>>,
    pub compare: CompareTargets,
    /// Prefix of every `x-request-id`; unique per run so joins never collide.
    pub run_id: String,
}

pub struct RunResult {
    pub records: Vec<RequestRecord>,
    pub windows: Vec<PhaseWindow>,
    pub summary: Summary,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("target {0:?} is not an http:// URL")]
    Target(String),
    #[error(transparent)]
    Dataset(#[from] request::DatasetError),
    #[error(transparent)]
    Scenario(#[from] crate::scenario::ScenarioError),
}

/// State shared by the arrival loop, the request tasks and the progress ticker.
struct Shared {
    start: Instant,
    sent: AtomicU64,
    in_flight: AtomicU64,
    errors: AtomicU64,
    records: Mutex<Vec<RequestRecord>>,
    recent_ttft: Mutex<VecDeque<f64>>,
    metrics: Option<Arc<LoadMetrics>>,
}

impl Shared {
    fn lock_records(&self) -> std::sync::MutexGuard<'_, Vec<RequestRecord>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Everything a request task needs, cheap to clone.
#[derive(Clone)]
struct Ctx {
    shared: Arc<Shared>,
    client: HttpClient,
    chat_uri: Uri,
    completions_uri: Uri,
    timeout: Duration,
    slo: Slo,
    run_id: Arc<str>,
}

pub async fn run(cfg: RunConfig) -> Result<RunResult, RunError> {
    let sc = &cfg.scenario;
    let base = cfg.target.trim_end_matches('/');
    if !base.starts_with("http://") {
        return Err(RunError::Target(cfg.target.clone()));
    }
    let uri = |api: Api| -> Result<Uri, RunError> {
        format!("{base}{}", api.path())
            .parse()
            .map_err(|_| RunError::Target(cfg.target.clone()))
    };
    let (chat_uri, completions_uri) = (uri(Api::Chat)?, uri(Api::Completions)?);
    let mixes = sc.phase_mixes()?;
    let mixer: SharedMixer = Arc::new(Mutex::new(Mixer::new(
        sc,
        schedule::phase_seed(sc.seed, usize::MAX),
    )?));
    let client = client::http_client(sc.max_in_flight.min(4096));
    let shared = Arc::new(Shared {
        start: Instant::now(),
        sent: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        records: Mutex::new(Vec::new()),
        recent_ttft: Mutex::new(VecDeque::new()),
        metrics: cfg.metrics.clone(),
    });
    let ctx = Ctx {
        shared: shared.clone(),
        client: client.clone(),
        chat_uri,
        completions_uri,
        timeout: Duration::from_secs_f64(sc.request_timeout_s),
        slo: Slo {
            ttft: sc.slo.ttft(),
            tpot: sc.slo.tpot(),
            e2e: sc.slo.e2e(),
            max_stall: sc.slo.max_stall(),
            // As the proxy's default: an invalid tool call (judged against the request's own
            // `tools`, or on its JSON when it offered none) makes the request not good.
            valid_tool_calls: true,
        },
        run_id: cfg.run_id.clone().into(),
    };
    let cap = Arc::new(Semaphore::new(sc.max_in_flight));
    let progress = Arc::new(Progress::new(cfg.show_progress));
    let current_phase = Arc::new(Mutex::new(String::new()));
    let planned = sc.planned_duration();
    let ticker = tokio::spawn(tick_loop(
        shared.clone(),
        progress.clone(),
        current_phase.clone(),
        planned,
    ));

    let mut windows = Vec::with_capacity(sc.phases.len());
    let mut snaps = Vec::new();
    let mut tasks = JoinSet::new();
    let mut index: u64 = 0;
    for (pi, phase) in sc.phases.iter().enumerate() {
        if let Ok(mut cur) = current_phase.lock() {
            cur.clone_from(&phase.name);
        }
        if let Some(m) = &cfg.metrics {
            m.set_phase(Some(&phase.name));
        }
        let start_snap = snapshot(&client, &cfg.compare, shared.start, None).await;
        let start_s = shared.start.elapsed().as_secs_f64();
        let mut phase_tasks = JoinSet::new();
        let (held, hold_max) = match phase.arrivals {
            Arrivals::Concurrency { n } => {
                closed_loop(
                    &ctx,
                    phase,
                    n,
                    &cap,
                    &mixer,
                    &mixes[pi],
                    &mut index,
                    &mut phase_tasks,
                )
                .await
            }
            _ => {
                open_loop(
                    &ctx,
                    phase,
                    pi,
                    sc.seed,
                    &cap,
                    &mixer,
                    &mixes[pi],
                    &mut index,
                    &mut phase_tasks,
                )
                .await
            }
        };
        if phase.drain {
            while phase_tasks.join_next().await.is_some() {}
        } else {
            // Keep the stragglers running; they are still this phase's requests.
            let rest = std::mem::take(&mut phase_tasks);
            tasks.spawn(async move {
                let mut rest = rest;
                while rest.join_next().await.is_some() {}
            });
        }
        let end_s = shared.start.elapsed().as_secs_f64();
        let end_snap = snapshot(
            &client,
            &cfg.compare,
            shared.start,
            Some((end_s - start_s, sc.models.as_slice())),
        )
        .await;
        if cfg.compare.any() {
            snaps.push(PhaseSnapshots {
                phase: phase.name.clone(),
                start: start_snap,
                end: end_snap,
                settled: None,
            });
        }
        windows.push(PhaseWindow {
            name: phase.name.clone(),
            arrivals: phase.arrivals.label(),
            start_s,
            end_s,
            held_back: held,
            hold_max_seconds: hold_max,
        });
    }
    // Every request is bounded by its own deadline, so this ends.
    while tasks.join_next().await.is_some() {}
    // The last phase's requests have all finished now: its end snapshot is retaken so the
    // histogram deltas and /stats include them (middle phases: `drain = true` for a clean cut).
    if let (Some(last), Some(win)) = (snaps.last_mut(), windows.last()) {
        let since = shared.start.elapsed().as_secs_f64() - win.start_s;
        last.end = snapshot(
            &client,
            &cfg.compare,
            shared.start,
            Some((since, sc.models.as_slice())),
        )
        .await;
    }
    let settle = cfg.compare.settle_s.unwrap_or(1.0);
    if let Some(last) = snaps.last_mut() {
        if settle > 0.0 && settle.is_finite() {
            tokio::time::sleep(Duration::from_secs_f64(settle)).await;
            last.settled = Some(snapshot(&client, &cfg.compare, shared.start, None).await);
        }
    }
    ticker.abort();
    progress.finish();
    if let Some(m) = &cfg.metrics {
        m.set_phase(None);
    }

    let mut records = std::mem::take(&mut *shared.lock_records());
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let (phases, overall) = summary::build(&windows, &records);
    let proxy = match &cfg.compare.proxy_records {
        Some(p) => Some(read_proxy_records(p, &records).await),
        None => None,
    };
    let comparison = cfg
        .compare
        .any()
        .then(|| compare::build(&windows, &records, &snaps, proxy.as_deref()));
    let summary = Summary {
        target: cfg.target.clone(),
        scenario: cfg.scenario_name.clone(),
        seed: sc.seed,
        max_in_flight: sc.max_in_flight,
        slo: sc.slo.clone(),
        phases,
        overall,
        comparison,
    };
    Ok(RunResult {
        records,
        windows,
        summary,
    })
}

type SharedMixer = Arc<Mutex<Mixer>>;

/// Draw the next plan of a phase.
fn next_plan(mixer: &SharedMixer, mix: &Mix) -> request::RequestPlan {
    mixer
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .next_plan(mix)
}

/// Send at precomputed offsets; never wait for a response. Returns (held back, longest hold).
#[allow(clippy::too_many_arguments)]
async fn open_loop(
    ctx: &Ctx,
    phase: &Phase,
    pi: usize,
    seed: u64,
    cap: &Arc<Semaphore>,
    mixer: &SharedMixer,
    mix: &Mix,
    index: &mut u64,
    tasks: &mut JoinSet<()>,
) -> (u64, f64) {
    let offsets = schedule::open_offsets(
        &phase.arrivals,
        phase.duration(),
        phase.requests,
        schedule::phase_seed(seed, pi),
    );
    let t_phase = Instant::now();
    let name: Arc<str> = phase.name.as_str().into();
    let (mut held, mut hold_max) = (0u64, 0.0f64);
    // Arrivals due before this instant were delayed by the cap, even if a slot was free by the
    // time the loop reached them.
    let mut hold_end: Option<Instant> = None;
    for off in offsets {
        let due = t_phase + off;
        tokio::time::sleep_until(due).await;
        let (permit, was_held) = match cap.clone().try_acquire_owned() {
            Ok(p) => (p, hold_end.is_some_and(|h| due < h)),
            Err(_) => {
                let Ok(p) = cap.clone().acquire_owned().await else {
                    break;
                };
                hold_end = Some(Instant::now());
                (p, true)
            }
        };
        if was_held {
            held += 1;
            hold_max = hold_max.max((Instant::now() - due).as_secs_f64());
        }
        let plan = next_plan(mixer, mix);
        let work = one_request(ctx.clone(), name.clone(), *index, plan, due, was_held);
        *index += 1;
        tasks.spawn(async move {
            work.await;
            drop(permit);
        });
    }
    if let Some(d) = phase.duration() {
        tokio::time::sleep_until(t_phase + d).await;
    }
    (held, hold_max)
}

/// `n` workers, each sending its next request when the previous one ends, until the phase's
/// duration passes or its request count is issued. A request still running at the phase end
/// keeps running in `tasks` (it stays this phase's request).
#[allow(clippy::too_many_arguments)]
async fn closed_loop(
    ctx: &Ctx,
    phase: &Phase,
    n: usize,
    cap: &Arc<Semaphore>,
    mixer: &SharedMixer,
    mix: &Mix,
    index: &mut u64,
    tasks: &mut JoinSet<()>,
) -> (u64, f64) {
    let deadline = phase.duration().map(|d| Instant::now() + d);
    let budget = phase.requests.unwrap_or(u64::MAX);
    let issued = Arc::new(AtomicU64::new(0));
    let base_index = *index;
    let name: Arc<str> = phase.name.as_str().into();
    let mut workers = JoinSet::new();
    let mix = Arc::new(mix.clone());
    for _ in 0..n {
        let (ctx, cap, mixer, issued, name, mix) = (
            ctx.clone(),
            cap.clone(),
            mixer.clone(),
            issued.clone(),
            name.clone(),
            mix.clone(),
        );
        workers.spawn(async move {
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return None;
                }
                let k = issued.fetch_add(1, Ordering::Relaxed);
                if k >= budget {
                    return None;
                }
                let Ok(permit) = cap.clone().acquire_owned().await else {
                    return None;
                };
                let plan = next_plan(&mixer, &mix);
                let mut work = Box::pin(one_request(
                    ctx.clone(),
                    name.clone(),
                    base_index + k,
                    plan,
                    Instant::now(),
                    false,
                ));
                match deadline {
                    Some(d) => {
                        if tokio::time::timeout_at(d, &mut work).await.is_err() {
                            return Some(async move {
                                work.await;
                                drop(permit);
                            });
                        }
                    }
                    None => work.await,
                }
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        if let Ok(Some(straggler)) = done {
            tasks.spawn(straggler);
        }
    }
    if let Some(d) = deadline {
        tokio::time::sleep_until(d).await;
    }
    *index = base_index + issued.load(Ordering::Relaxed).min(budget);
    (0, 0.0)
}

async fn one_request(
    ctx: Ctx,
    phase: Arc<str>,
    i: u64,
    plan: request::RequestPlan,
    due: Instant,
    held_back: bool,
) {
    let sh = &ctx.shared;
    let request_id = format!("{}-{i:07}", ctx.run_id);
    sh.sent.fetch_add(1, Ordering::Relaxed);
    sh.in_flight.fetch_add(1, Ordering::Relaxed);
    if let Some(m) = &sh.metrics {
        m.in_flight.inc();
    }
    let sent = client::send(
        &ctx.client,
        Outgoing {
            uri: match plan.api {
                Api::Chat => &ctx.chat_uri,
                Api::Completions => &ctx.completions_uri,
            },
            body: request::body(&plan),
            stream: plan.stream,
            request_id: &request_id,
            extra_header: plan
                .header
                .as_ref()
                .map(|h| (h.name.as_str(), h.value.as_str())),
            timeout: ctx.timeout,
            hangup_after: plan.hangup_after,
        },
    )
    .await;
    sh.in_flight.fetch_sub(1, Ordering::Relaxed);
    let m = &sent.measurement;
    let outcome = m.outcome.as_str();
    if let Some(lm) = &sh.metrics {
        lm.in_flight.dec();
        lm.requests.with_label_values(&[&*phase, outcome]).inc();
    }
    if outcome != "success" {
        sh.errors.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(t) = m.ttft {
        if let Ok(mut q) = sh.recent_ttft.lock() {
            if q.len() >= 256 {
                q.pop_front();
            }
            q.push_back(t.as_secs_f64());
        }
    }
    let verdict = judge(m, &ctx.slo);
    let rec = RequestRecord {
        request_id,
        phase: phase.to_string(),
        model: plan.model,
        api: plan.api.as_str().to_owned(),
        stream: plan.stream,
        max_tokens: plan.max_tokens,
        n: plan.n,
        logprobs: plan.logprobs,
        usage: plan.usage.as_str().to_owned(),
        ignore_eos: plan.ignore_eos,
        hangup: plan.hangup_after,
        hung_up: sent.hung_up,
        tools: plan.tools,
        tag: plan.header.as_ref().map(|h| h.tag().to_owned()),
        scheduled_s: (due - sh.start).as_secs_f64(),
        start_s: (sent.t0 - sh.start).as_secs_f64(),
        held_back,
        status: m.status,
        outcome: outcome.to_owned(),
        finish_reason: m.finish_reason.map(|f| f.as_str().to_owned()),
        ttft_seconds: m.ttft.map(|d| d.as_secs_f64()),
        ttfc_seconds: m.ttfc.map(|d| d.as_secs_f64()),
        tpot_seconds: m.tpot.map(|d| d.as_secs_f64()),
        choice_tpot_seconds: (!m.choice_tpots.is_empty())
            .then(|| m.choice_tpots.iter().map(|d| d.as_secs_f64()).collect()),
        e2e_seconds: m.e2e.as_secs_f64(),
        itl_count: m.itl_count,
        itl_max_seconds: m.itl_max.map(|d| d.as_secs_f64()),
        prompt_tokens: m.prompt_tokens,
        completion_tokens: m.completion_tokens,
        tokens_exact: m.tokens_exact,
        agent: m.agent.as_deref().cloned(),
        good: verdict.good,
        error: sent.error,
        itl_seconds: sent.itl,
    };
    sh.lock_records().push(rec);
}

/// The proxy's JSONL sink. Its writer runs off the request path, so the last records can land a
/// moment after the last response ended: read again (up to 3 s) until every client request id
/// is there.
async fn read_proxy_records(
    path: &std::path::Path,
    records: &[RequestRecord],
) -> Vec<compare::ProxyRecord> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let got = std::fs::read_to_string(path)
            .map(|t| compare::parse_proxy_records(&t))
            .unwrap_or_default();
        let ids: std::collections::HashSet<&str> = got.iter().map(|p| p.id.as_str()).collect();
        let complete = records.iter().all(|r| ids.contains(r.request_id.as_str()));
        if complete || Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Proxy `/metrics` (+ `/stats` per model at a phase end) and each engine's `/metrics`.
async fn snapshot(
    client: &HttpClient,
    t: &CompareTargets,
    run_start: Instant,
    stats_for: Option<(f64, &[String])>,
) -> Snapshot {
    let timeout = Duration::from_secs(5);
    let mut s = Snapshot {
        t_s: run_start.elapsed().as_secs_f64(),
        ..Snapshot::default()
    };
    if let Some(admin) = &t.proxy_admin {
        s.proxy_asked = true;
        let admin = admin.trim_end_matches('/');
        s.proxy_metrics = client::get_text(client, &format!("{admin}/metrics"), timeout)
            .await
            .ok();
        if let Some((window, models)) = stats_for {
            // Millisecond precision (`/stats` takes fractional seconds): whole seconds let
            // the end of the previous phase leak into this phase's figures.
            let window = ((window * 1000.0).ceil() / 1000.0).max(0.001);
            for m in models {
                let url = format!("{admin}/stats?window={window:.3}&model={m}");
                if let Some(v) = client::get_text(client, &url, timeout)
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_str(&b).ok())
                {
                    s.proxy_stats.insert(m.clone(), v);
                }
            }
        }
    }
    for e in &t.engine_metrics {
        s.engines
            .push((e.clone(), client::get_text(client, e, timeout).await.ok()));
    }
    s
}

async fn tick_loop(
    shared: Arc<Shared>,
    progress: Arc<Progress>,
    phase: Arc<Mutex<String>>,
    planned: Option<Duration>,
) {
    let mut every = tokio::time::interval(Duration::from_millis(200));
    loop {
        every.tick().await;
        let elapsed = shared.start.elapsed();
        let ttft_p50 = shared.recent_ttft.lock().ok().and_then(|q| {
            let mut v: Vec<f64> = q.iter().copied().collect();
            goodput_measure::summarize(&mut v).map(|s| s.p50)
        });
        let name = phase.lock().map(|p| p.clone()).unwrap_or_default();
        progress.update(&Tick {
            phase: &name,
            elapsed,
            left: planned.map(|p| p.saturating_sub(elapsed)),
            sent: shared.sent.load(Ordering::Relaxed),
            in_flight: shared.in_flight.load(Ordering::Relaxed),
            errors: shared.errors.load(Ordering::Relaxed),
            ttft_p50,
        });
    }
}
