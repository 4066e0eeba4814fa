//! Raw per-request records, the bounded ring that keeps them, and the `/stats` computation.
//!
//! The ring's lock is taken once per finished request (push) and once per `/stats` call
//! (snapshot), never per SSE event. ITL gaps are kept beside their record for exact ITL
//! percentiles, under a separate total cap: past it the oldest records lose their gaps first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::agent::ToolCallOutcome;
use crate::meter::Measurement;
use crate::outcome::Outcome;
use crate::slo::SloVerdict;
use crate::stats::summarize;
use crate::trace::Trace;

/// Records the ring keeps by default.
pub const DEFAULT_RING_CAPACITY: usize = 100_000;
/// ITL gaps the ring keeps in total by default (4 bytes each: 16 MiB).
pub const DEFAULT_GAP_CAPACITY: usize = 4 << 20;
/// Traces the ring keeps by default (`[trace] max_traces`).
pub const DEFAULT_TRACE_CAPACITY: usize = 64;

/// Why the balancer chose a request's replica: the bounded `reason` label of
/// `goodput_proxy_route_decisions_total` and the record's `route_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteReason {
    /// `p2c`: the less loaded of two random candidates.
    P2c,
    /// The replica that recently served this prompt's prefix.
    PrefixHit,
    /// A prefix match whose replicas were all saturated: the least loaded instead.
    PrefixSaturated,
    /// No usable prefix match: the less loaded (in tokens) of two random candidates.
    LeastLoad,
    /// Load weighted by measured SLO attainment.
    Goodput,
    /// The exploration share: a random replica.
    Explore,
    /// Only one candidate.
    Only,
}

impl RouteReason {
    pub const ALL: [RouteReason; 7] = [
        RouteReason::P2c,
        RouteReason::PrefixHit,
        RouteReason::PrefixSaturated,
        RouteReason::LeastLoad,
        RouteReason::Goodput,
        RouteReason::Explore,
        RouteReason::Only,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::P2c => "p2c",
            RouteReason::PrefixHit => "prefix_hit",
            RouteReason::PrefixSaturated => "prefix_saturated",
            RouteReason::LeastLoad => "least_load",
            RouteReason::Goodput => "goodput",
            RouteReason::Explore => "explore",
            RouteReason::Only => "only",
        }
    }
}

/// One finished request: who asked and who answered, the [`Measurement`] itself, and the SLO
/// verdict. This one type is what the `/stats` ring keeps, the JSONL sink writes (one line)
/// and ClickHouse stores (flattened, `sink/row.rs`). The measurement is embedded whole
/// (`serde(flatten)`): its serde names are the record's keys, so a measured field is added
/// once, in `Measurement`, plus its ClickHouse column. Deserializable: the load generator
/// reads the JSONL sink back into this type (its `end` instant is not on disk: read back as
/// now).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Shared with the request (`Arc`): a record costs no copy of its id, model or replica.
    pub id: Arc<str>,
    pub model: Arc<str>,
    pub upstream: Option<Arc<str>>,
    /// Wall-clock start, milliseconds since the Unix epoch (for humans and log joins only).
    pub start_unix_ms: u64,
    /// What was measured (keys `stream`, `status`, `outcome`, ..., `ttft_s`, `agent`, ...).
    #[serde(flatten)]
    pub measured: Measurement,
    /// Which SLOs held (`null`: not applicable), and whether the request was good.
    pub slo: SloVerdict,
    /// The proxy replica that measured it (`server.instance`, default the hostname).
    pub instance: Arc<str>,
    /// The tenant whose API key the request presented (`[auth]`); `null` with auth off or
    /// when auth refused the request. Only configured tenant names.
    #[serde(default)]
    pub tenant: Option<Arc<str>>,
    /// Why the balancer chose `upstream` (the `reason` of
    /// `goodput_proxy_route_decisions_total`); `null` when no replica answered.
    #[serde(default)]
    pub route_reason: Option<RouteReason>,
    /// Replicas tried before `upstream`, in order, that rejected the request at admission
    /// (retried while the client had seen nothing); empty when the first one answered.
    #[serde(default)]
    pub retried_from: Box<[Arc<str>]>,
    /// Monotonic end instant, for `/stats` windows (not serialized).
    #[serde(skip, default = "Instant::now")]
    pub end: Instant,
}

impl RequestRecord {
    /// Build a record from a finished measurement. `end` is when the request finished.
    pub fn new(
        id: Arc<str>,
        model: Arc<str>,
        upstream: Option<Arc<str>>,
        start_unix_ms: u64,
        end: Instant,
        measured: Measurement,
        slo: SloVerdict,
    ) -> Self {
        Self {
            id,
            model,
            upstream,
            start_unix_ms,
            measured,
            slo,
            instance: Arc::from(""),
            tenant: None,
            route_reason: None,
            retried_from: Box::default(),
            end,
        }
    }

    /// The same record, naming the replica that measured it.
    pub fn with_instance(mut self, instance: impl Into<Arc<str>>) -> Self {
        self.instance = instance.into();
        self
    }

    /// The same record, naming the tenant that sent it.
    pub fn with_tenant(mut self, tenant: Option<Arc<str>>) -> Self {
        self.tenant = tenant;
        self
    }

    /// The same record, saying why its replica was chosen and which replicas were tried first.
    pub fn with_route(mut self, reason: RouteReason, retried_from: Vec<Arc<str>>) -> Self {
        self.route_reason = Some(reason);
        self.retried_from = retried_from.into_boxed_slice();
        self
    }

    /// The TPOT values (seconds) this record adds to statistics: one per choice with a
    /// defined TPOT.
    pub fn tpot_values(&self) -> impl Iterator<Item = f64> + '_ {
        self.measured.tpot_observations().map(|d| d.as_secs_f64())
    }

    /// Rejections caused by the client (4xx other than 429) do not count against goodput.
    pub fn rejected_by_client(&self) -> bool {
        crate::outcome::rejected_by_client(self.measured.outcome, self.measured.status)
    }
}

/// A record with its ITL gaps (seconds), as kept in the ring.
#[derive(Debug, Clone)]
pub struct Entry {
    pub record: Arc<RequestRecord>,
    pub gaps: Option<Arc<[f32]>>,
}

#[derive(Debug)]
struct Ring {
    entries: VecDeque<Entry>,
    gaps_total: usize,
    /// Index in `entries` below which gaps have been shed.
    gaps_shed_upto: usize,
    /// The traces of traced records still in `entries`, oldest first, at most
    /// `trace_capacity` (the oldest trace goes first, its record stays).
    traces: VecDeque<(Arc<RequestRecord>, Arc<Trace>)>,
}

/// The bounded in-memory ring of recent records.
#[derive(Debug)]
pub struct RecordRing {
    capacity: usize,
    gap_capacity: usize,
    trace_capacity: usize,
    started: Instant,
    inner: Mutex<Ring>,
}

impl RecordRing {
    pub fn new(capacity: usize, gap_capacity: usize, started: Instant) -> Self {
        Self {
            capacity: capacity.max(1),
            gap_capacity,
            trace_capacity: DEFAULT_TRACE_CAPACITY,
            started,
            inner: Mutex::new(Ring {
                entries: VecDeque::with_capacity(capacity.clamp(1, 1 << 16)),
                gaps_total: 0,
                gaps_shed_upto: 0,
                traces: VecDeque::new(),
            }),
        }
    }

    /// Keep at most `traces` traces (`[trace] max_traces`); 0 keeps none.
    pub fn with_trace_capacity(mut self, traces: usize) -> Self {
        self.trace_capacity = traces;
        self
    }

    /// When the ring started (the proxy's start): `/stats` rates use the shorter of the
    /// window and the time since then.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Add a record with its gaps; the oldest is dropped when full.
    pub fn push(&self, record: Arc<RequestRecord>, gaps: Vec<f32>) {
        self.push_traced(record, gaps, None);
    }

    /// [`RecordRing::push`], with the request's trace kept beside its record (retrievable by
    /// [`RecordRing::trace`] while both are kept).
    pub fn push_traced(
        &self,
        record: Arc<RequestRecord>,
        gaps: Vec<f32>,
        trace: Option<Arc<Trace>>,
    ) {
        let gaps: Option<Arc<[f32]>> = (!gaps.is_empty()).then(|| gaps.into());
        let trace = trace
            .filter(|_| self.trace_capacity > 0)
            .map(|t| (record.clone(), t));
        let Ok(mut r) = self.inner.lock() else {
            return;
        };
        r.gaps_total += gaps.as_ref().map_or(0, |g| g.len());
        r.entries.push_back(Entry { record, gaps });
        if let Some(t) = trace {
            r.traces.push_back(t);
            if r.traces.len() > self.trace_capacity {
                r.traces.pop_front();
            }
        }
        if r.entries.len() > self.capacity {
            if let Some(old) = r.entries.pop_front() {
                r.gaps_total -= old.gaps.map_or(0, |g| g.len());
                // Traces are pushed in record order: the oldest one may be the leaver's.
                if r.traces
                    .front()
                    .is_some_and(|(rec, _)| Arc::ptr_eq(rec, &old.record))
                {
                    r.traces.pop_front();
                }
            }
            r.gaps_shed_upto = r.gaps_shed_upto.saturating_sub(1);
        }
        while r.gaps_total > self.gap_capacity && r.gaps_shed_upto < r.entries.len() {
            let i = r.gaps_shed_upto;
            let freed = r.entries[i].gaps.take().map_or(0, |g| g.len());
            r.gaps_total -= freed;
            r.gaps_shed_upto += 1;
        }
    }

    /// The newest kept record with this id that has a trace, and the trace.
    pub fn trace(&self, id: &str) -> Option<(Arc<RequestRecord>, Arc<Trace>)> {
        let r = self.inner.lock().ok()?;
        r.traces
            .iter()
            .rev()
            .find(|(rec, _)| &*rec.id == id)
            .cloned()
    }

    /// Traces kept.
    pub fn traces(&self) -> usize {
        self.inner.lock().map(|r| r.traces.len()).unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map(|r| r.entries.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy out the entries that ended within `window` before `now` (cheap: `Arc` clones).
    pub fn snapshot(&self, now: Instant, window: Duration) -> Vec<Entry> {
        let Ok(r) = self.inner.lock() else {
            return Vec::new();
        };
        let from = now.checked_sub(window);
        let mut out: Vec<Entry> = r
            .entries
            .iter()
            .rev()
            .take_while(|e| from.is_none_or(|f| e.record.end >= f))
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// `/stats` for this ring (see [`compute_stats`]).
    pub fn stats(&self, now: Instant, window: Duration, model: Option<&str>) -> Value {
        self.stats_for(now, window, model, None)
    }

    /// `/stats` for one upstream too: `upstream` keeps the records served by one of those
    /// replica URLs (`Some(&[])`: by none, i.e. the proxy answered or no replica did).
    pub fn stats_for(
        &self,
        now: Instant,
        window: Duration,
        model: Option<&str>,
        upstream: Option<&[&str]>,
    ) -> Value {
        let mut entries = self.snapshot(now, window);
        if let Some(urls) = upstream {
            entries.retain(|e| match &e.record.upstream {
                Some(u) => urls.contains(&&**u),
                None => urls.is_empty(),
            });
        }
        let elapsed = window.min(now.saturating_duration_since(self.started));
        compute_stats(&entries, now, window, elapsed, model)
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn summary_json(values: &mut [f64]) -> Value {
    match summarize(values) {
        Some(s) => json!({
            "count": s.count, "mean": s.mean, "p50": s.p50, "p90": s.p90,
            "p95": s.p95, "p99": s.p99, "max": s.max,
        }),
        None => json!({
            "count": 0, "mean": null, "p50": null, "p90": null,
            "p95": null, "p99": null, "max": null,
        }),
    }
}

/// `/stats` query parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsQuery {
    pub window: Duration,
    pub model: Option<String>,
    /// An `upstream` label value (as on `/metrics`); the admin route maps it to replica URLs.
    pub upstream: Option<String>,
}

/// Window used when `/stats` is asked without one.
pub const DEFAULT_STATS_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StatsQueryError {
    #[error("window must be a positive number of seconds, got {0:?}")]
    BadWindow(String),
    #[error("unknown parameter {0:?} (expected window, model, upstream)")]
    UnknownParam(String),
}

/// Parse `window=SECONDS[&model=NAME]` (the query string without `?`). Values are taken
/// literally except `+` and `%XX` decoding of the model name.
pub fn parse_stats_query(query: Option<&str>) -> Result<StatsQuery, StatsQueryError> {
    let mut q = StatsQuery {
        window: DEFAULT_STATS_WINDOW,
        model: None,
        upstream: None,
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "window" => {
                let secs: f64 = v
                    .parse()
                    .map_err(|_| StatsQueryError::BadWindow(v.into()))?;
                if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
                    return Err(StatsQueryError::BadWindow(v.into()));
                }
                q.window = Duration::from_secs_f64(secs);
            }
            "model" => q.model = Some(percent_decode(v)),
            "upstream" => q.upstream = Some(percent_decode(v)),
            other => return Err(StatsQueryError::UnknownParam(other.into())),
        }
    }
    Ok(q)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `/stats` document over `entries` that ended in `(now - window, now]`, optionally for one
/// model. Percentiles are exact (numpy's linear interpolation over the raw values, see
/// `stats`). `goodput.per_second` is good requests / `elapsed` (the window, or less when the
/// proxy has run for less). `goodput.ratio` is good / (requests - rejections caused by the
/// client); null when 0. Latency summaries leave out `rejected` requests, exactly as the
/// histograms do (DESIGN.md), and cover every other request where the value is defined; TPOT
/// takes one value per choice.
pub fn compute_stats(
    entries: &[Entry],
    now: Instant,
    window: Duration,
    elapsed: Duration,
    model: Option<&str>,
) -> Value {
    let from = now.checked_sub(window);
    let in_window = entries.iter().filter(|e| {
        let r = &e.record;
        from.is_none_or(|f| r.end >= f) && r.end <= now && model.is_none_or(|m| &*r.model == m)
    });
    let mut outcomes = [0u64; Outcome::ALL.len()];
    let (mut requests, mut good, mut client_rejected) = (0u64, 0u64, 0u64);
    let (mut ttft, mut ttfc, mut tpot, mut e2e, mut itl) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Agent phases (first reasoning / answer / tool-call token, tool-call streaming time) and
    // the requests per worst tool-call outcome.
    let mut phases: [Vec<f64>; 4] = Default::default();
    let mut tool_calls = [0u64; ToolCallOutcome::ALL.len()];
    // The engine's view (queue, TTFT, decode, mean ITL, cached prompt tokens), the TTFT split
    // (proxy, queue, prefill, rest), and stalls.
    let mut engine: [Vec<f64>; 5] = Default::default();
    let mut split: [Vec<f64>; 4] = Default::default();
    let (mut clamped, mut stalls, mut stalled) = (0u64, 0u64, 0u64);
    for e in in_window {
        let r = &e.record;
        let m = &r.measured;
        requests += 1;
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == m.outcome) {
            outcomes[i] += 1;
        }
        good += u64::from(r.slo.good);
        client_rejected += u64::from(r.rejected_by_client());
        if m.outcome == Outcome::Rejected {
            continue; // answered by the proxy itself (or refused): not a latency
        }
        ttft.extend(m.ttft.map(secs));
        ttfc.extend(m.ttfc.map(secs));
        tpot.extend(r.tpot_values());
        e2e.push(m.e2e.as_secs_f64());
        let ev = m.engine_view();
        let values = [ev.queue, ev.ttft, ev.decode, ev.mean_itl].map(|d| d.map(secs));
        let cached = ev.cached_prompt_tokens.map(|n| n as f64);
        for (into, v) in engine.iter_mut().zip(values.into_iter().chain([cached])) {
            into.extend(v);
        }
        let s = m.ttft_split();
        // Four parts only (an engine without a queue time, llama.cpp, is left out): the
        // parts of the same requests, as on /metrics and the page.
        if let Some(parts) = s.parts() {
            for (into, d) in split.iter_mut().zip(parts) {
                into.push(secs(d));
            }
            clamped += u64::from(s.clamped);
        }
        stalls += u64::from(m.stalls());
        stalled += u64::from(m.stalls() > 0);
        if let Some(g) = &e.gaps {
            itl.extend(g.iter().map(|v| f64::from(*v)));
        }
        if let Some(a) = &m.agent {
            let values = [
                a.ttf_reasoning,
                a.ttf_answer,
                a.ttf_tool_call,
                a.tool_call_duration,
            ];
            for (into, v) in phases.iter_mut().zip(values) {
                into.extend(v.map(secs));
            }
            if let Some(i) = a
                .tool_call_outcome
                .and_then(|o| ToolCallOutcome::ALL.iter().position(|x| *x == o))
            {
                tool_calls[i] += 1;
            }
        }
    }
    let mut tool_call_map = Map::new();
    for (o, n) in ToolCallOutcome::ALL.iter().zip(tool_calls) {
        let key = o.as_str().trim_start_matches("tool_call_");
        tool_call_map.insert(key.to_owned(), json!(n));
    }
    let [mut ttf_reasoning, mut ttf_answer, mut ttf_tool_call, mut tool_call] = phases;
    let [mut e_queue, mut e_ttft, mut e_decode, mut e_itl, mut e_cached] = engine;
    let split_n = split[0].len();
    let [mut s_proxy, mut s_queue, mut s_prefill, mut s_rest] = split;
    let mut outcome_map = Map::new();
    for (o, n) in Outcome::ALL.iter().zip(outcomes) {
        outcome_map.insert(o.as_str().to_owned(), json!(n));
    }
    let denominator = requests - client_rejected;
    let ratio = (denominator > 0).then(|| good as f64 / denominator as f64);
    let elapsed_s = elapsed.as_secs_f64();
    let per_second = if elapsed_s > 0.0 {
        good as f64 / elapsed_s
    } else {
        0.0
    };
    json!({
        "window_seconds": window.as_secs_f64(),
        "model": model,
        "requests": requests,
        "outcomes": outcome_map,
        "goodput": { "good": good, "ratio": ratio, "per_second": per_second },
        "ttft_seconds": summary_json(&mut ttft),
        "ttfc_seconds": summary_json(&mut ttfc),
        "tpot_seconds": summary_json(&mut tpot),
        "itl_seconds": summary_json(&mut itl),
        "e2e_seconds": summary_json(&mut e2e),
        "time_to_first_reasoning_token_seconds": summary_json(&mut ttf_reasoning),
        "time_to_first_answer_token_seconds": summary_json(&mut ttf_answer),
        "time_to_first_tool_call_token_seconds": summary_json(&mut ttf_tool_call),
        "tool_call_duration_seconds": summary_json(&mut tool_call),
        "tool_calls": tool_call_map,
        "engine": {
            "queue_seconds": summary_json(&mut e_queue),
            "ttft_seconds": summary_json(&mut e_ttft),
            "decode_seconds": summary_json(&mut e_decode),
            "mean_itl_seconds": summary_json(&mut e_itl),
            "cached_prompt_tokens": summary_json(&mut e_cached),
        },
        "ttft_split": {
            "requests": split_n,
            "clamped": clamped,
            "proxy_seconds": summary_json(&mut s_proxy),
            "queue_seconds": summary_json(&mut s_queue),
            "prefill_seconds": summary_json(&mut s_prefill),
            "rest_seconds": summary_json(&mut s_rest),
        },
        "stalls": {
            "total": stalls,
            "requests": stalled,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentSummary;
    use crate::slo::{judge, Slo};
    use crate::trace::LogprobSummary;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn rec(
        model: &str,
        outcome: Outcome,
        status: u16,
        ttft: Option<f64>,
        e2e: f64,
        end: Instant,
    ) -> Arc<RequestRecord> {
        let mut m = Measurement::without_body(outcome, Some(status), secs(e2e));
        m.streaming = true;
        m.ttft = ttft.map(secs);
        m.ttfc = ttft.map(secs);
        let v = judge(&m, &Slo::default());
        Arc::new(RequestRecord::new(
            "id".into(),
            model.into(),
            None,
            0,
            end,
            m,
            v,
        ))
    }

    #[test]
    fn stats_for_one_upstream() {
        let t = Instant::now();
        let ring = RecordRing::new(10, 10, t - secs(100.0));
        for (up, e2e) in [
            (Some("http://a:1"), 1.0),
            (Some("http://b:1"), 2.0),
            (None, 3.0),
        ] {
            let mut r = (*rec("m", Outcome::Success, 200, None, e2e, t)).clone();
            r.upstream = up.map(Arc::from);
            ring.push(Arc::new(r), vec![]);
        }
        let e2e_max = |s: Value| s["e2e_seconds"]["max"].as_f64();
        let w = secs(60.0);
        assert_eq!(
            e2e_max(ring.stats_for(t, w, None, Some(&["http://b:1"]))),
            Some(2.0)
        );
        assert_eq!(e2e_max(ring.stats_for(t, w, None, Some(&[]))), Some(3.0));
        assert_eq!(ring.stats_for(t, w, None, None)["requests"], 3);
    }

    #[test]
    fn stats_query() {
        let q = |s| parse_stats_query(s);
        assert_eq!(
            q(None),
            Ok(StatsQuery {
                window: DEFAULT_STATS_WINDOW,
                model: None,
                upstream: None,
            })
        );
        assert_eq!(q(Some("window=30")).unwrap().window, secs(30.0));
        assert_eq!(
            q(Some("window=0.5&model=tiny")).unwrap(),
            StatsQuery {
                window: secs(0.5),
                model: Some("tiny".into()),
                upstream: None,
            }
        );
        assert_eq!(
            q(Some("model=org%2Fm+1")).unwrap().model.as_deref(),
            Some("org/m 1")
        );
        assert_eq!(
            q(Some("upstream=http%3A%2F%2Fe%3A1"))
                .unwrap()
                .upstream
                .as_deref(),
            Some("http://e:1")
        );
        assert_eq!(
            q(Some("model=%zz%4")).unwrap().model.as_deref(),
            Some("%zz%4")
        );
        for bad in [
            "window=0",
            "window=-1",
            "window=abc",
            "window=inf",
            "window=NaN",
        ] {
            assert!(
                matches!(q(Some(bad)), Err(StatsQueryError::BadWindow(_))),
                "{bad}"
            );
        }
        assert_eq!(
            q(Some("x=1")),
            Err(StatsQueryError::UnknownParam("x".into()))
        );
    }

    #[test]
    fn record_fields_and_json() {
        let now = Instant::now();
        let r = rec("tiny", Outcome::Success, 200, Some(0.25), 1.0, now);
        let v = serde_json::to_value(&*r).unwrap();
        for key in [
            "id",
            "model",
            "upstream",
            "stream",
            "status",
            "outcome",
            "finish_reason",
            "start_unix_ms",
            "ttft_s",
            "ttfc_s",
            "tpot_s",
            "e2e_s",
            "itl_count",
            "itl_max_s",
            "prompt_tokens",
            "completion_tokens",
            "tokens_exact",
            "usage_injected",
            "usage_stripped",
            "slo",
            "instance",
            "tenant",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(v["outcome"], "success");
        assert_eq!(v["ttft_s"], 0.25);
        assert_eq!(v["slo"]["good"], true);
        assert_eq!(v["slo"]["tpot_ok"], serde_json::Value::Null);
        assert!(
            v.get("choice_tpot_s").is_none(),
            "only with several choices"
        );
    }

    fn traced(id: &str, now: Instant) -> (Arc<RequestRecord>, Trace) {
        let m = Measurement::without_body(Outcome::Success, Some(200), secs(1.0));
        let r = RequestRecord::new(id.into(), "m".into(), None, 0, now, m, Default::default());
        let t = Trace {
            kept_tokens: 1,
            ..Trace::default()
        };
        (Arc::new(r), t)
    }

    #[test]
    fn traces_are_kept_beside_their_records_within_both_bounds() {
        let now = Instant::now();
        let ring = RecordRing::new(4, 10, now).with_trace_capacity(2);
        for id in ["a", "b", "c"] {
            let (r, t) = traced(id, now);
            ring.push_traced(r, vec![], Some(Arc::new(t)));
        }
        assert_eq!(ring.traces(), 2, "max traces");
        assert!(ring.trace("a").is_none(), "the oldest trace went first");
        assert_eq!(ring.len(), 3, "its record stays");
        let (rec, t) = ring.trace("c").expect("kept");
        assert_eq!((&*rec.id, t.kept_tokens), ("c", 1));
        // Records leaving the ring take their traces along.
        for _ in 0..3 {
            ring.push(rec_now(now), vec![]);
        }
        assert!(ring.trace("b").is_none(), "b's record left the ring");
        assert!(ring.trace("c").is_some());
        ring.push(rec_now(now), vec![]);
        assert_eq!((ring.trace("c"), ring.traces()), (None, 0));
        let none = RecordRing::new(4, 10, now).with_trace_capacity(0);
        let (r, t) = traced("x", now);
        none.push_traced(r, vec![], Some(Arc::new(t)));
        assert_eq!((none.traces(), none.len()), (0, 1));
    }

    fn rec_now(now: Instant) -> Arc<RequestRecord> {
        rec("m", Outcome::Success, 200, Some(0.1), 1.0, now)
    }

    #[test]
    fn a_record_with_logprobs_and_a_trace_reads_back() {
        let now = Instant::now();
        let (r, t) = traced("t", now);
        let mut r = (*r).clone();
        r.measured.logprobs = Some(Box::new(LogprobSummary {
            tokens: 2,
            mean: -1.5,
            min: -2.0,
            min_at: 1,
            largest_drop: Some(1.0),
            largest_drop_at: Some(1),
            tool_call_min: None,
        }));
        r.measured.trace = Some(Arc::new(t));
        let line = serde_json::to_string(&r).unwrap();
        let back: RequestRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (back.measured.logprobs, back.measured.trace),
            (r.measured.logprobs, r.measured.trace)
        );
        let plain = serde_json::to_value(&*rec_now(now)).unwrap();
        assert!(plain.get("trace").is_none() && plain.get("logprobs").is_none());
    }

    #[test]
    fn stats_have_agent_phase_percentiles_and_tool_call_outcomes() {
        let now = Instant::now();
        let ring = RecordRing::new(10, 10, now);
        let agent = |ttf_tool: Option<f64>, outcome: Option<ToolCallOutcome>| AgentSummary {
            ttf_reasoning: Some(secs(0.1)),
            ttf_answer: None,
            ttf_tool_call: ttf_tool.map(secs),
            tool_call_duration: ttf_tool.map(|t| secs(t / 10.0)),
            reasoning_tokens: Some(3),
            tool_calls: u32::from(outcome.is_some()),
            tool_call_outcome: outcome,
            tool_call_violation: None,
        };
        for a in [
            agent(Some(0.2), Some(ToolCallOutcome::Valid)),
            agent(Some(0.4), Some(ToolCallOutcome::SchemaViolation)),
            agent(Some(0.6), Some(ToolCallOutcome::Valid)),
            agent(None, None),
        ] {
            let mut r = (*rec("m", Outcome::Success, 200, Some(0.1), 1.0, now)).clone();
            r.measured.agent = Some(Box::new(a));
            ring.push(Arc::new(r), vec![]);
        }
        ring.push(rec("m", Outcome::Success, 200, Some(0.1), 1.0, now), vec![]);
        let s = ring.stats(now, secs(60.0), None);
        let t = &s["time_to_first_tool_call_token_seconds"];
        assert_eq!(
            (t["count"].clone(), t["p50"].clone()),
            (json!(3), json!(0.4))
        );
        assert_eq!(s["tool_call_duration_seconds"]["max"], 0.06);
        assert_eq!(s["time_to_first_reasoning_token_seconds"]["count"], 4);
        assert_eq!(s["time_to_first_answer_token_seconds"]["count"], 0);
        assert_eq!(
            s["tool_calls"],
            json!({"valid": 2, "invalid_json": 0, "schema_violation": 1, "unknown_function": 0})
        );
    }

    #[test]
    fn tpot_statistics_take_one_value_per_choice() {
        let now = Instant::now();
        let mut m = Measurement::without_body(Outcome::Success, Some(200), secs(1.0));
        m.streaming = true;
        m.tpot = Some(secs(0.03));
        m.choice_tpots = vec![secs(0.01), secs(0.03)].into();
        let v = judge(&m, &Slo::default());
        let r = RequestRecord::new("id".into(), "m".into(), None, 0, now, m.clone(), v);
        assert_eq!(&*r.measured.choice_tpots, [secs(0.01), secs(0.03)]);
        assert_eq!(r.tpot_values().collect::<Vec<_>>(), [0.01, 0.03]);
        let ring = RecordRing::new(10, 10, now);
        ring.push(Arc::new(r), vec![]);
        ring.push(rec("m", Outcome::Success, 200, Some(0.1), 1.0, now), vec![]);
        let s = ring.stats(now, secs(60.0), None);
        assert_eq!(s["tpot_seconds"]["count"], 2);
        assert_eq!(s["tpot_seconds"]["p50"], 0.02);
        // One choice: the record's TPOT itself.
        m.choice_tpots = Box::default();
        let r = RequestRecord::new("id".into(), "m".into(), None, 0, now, m, v);
        assert_eq!(r.tpot_values().collect::<Vec<_>>(), [0.03]);
        assert!(serde_json::to_value(&r)
            .unwrap()
            .get("choice_tpot_s")
            .is_none());
    }

    /// The ring keeps `DEFAULT_RING_CAPACITY` records: each costs its `Arc<RequestRecord>`
    /// (the size below plus the `Arc`'s 16 bytes, a 384-byte allocator class), its id (`Arc<str>`
    /// shared with the request: ~64 bytes for a 36-character id) and its 24-byte slot: about
    /// 470 bytes, 45 MiB for 100,000 records (before: 456 bytes, a 512-byte class, about 600
    /// bytes and 57 MiB), plus the ITL gaps under their own cap (`DEFAULT_GAP_CAPACITY`, 16
    /// MiB). What only some records carry is boxed: the agent summary (128-byte class), the
    /// logprob summary (96), per-choice TPOTs with `n > 1` (16 bytes a choice).
    #[test]
    fn a_record_stays_small() {
        // The route fields took 24 of the 384-byte class's 40 spare bytes, the engine report's
        // box 8 more.
        assert!(std::mem::size_of::<RequestRecord>() <= 368);
        assert!(std::mem::size_of::<Measurement>() <= 240);
        assert_eq!(std::mem::size_of::<Entry>(), 24);
    }

    #[test]
    fn stats_have_the_engine_view_the_ttft_split_and_stalls() {
        let now = Instant::now();
        let ring = RecordRing::new(10, 10, now);
        for (queue_ms, prefill_ms, client_ms, stalls) in [(10, 20, 100, 0), (30, 40, 60, 2)] {
            let mut m = Measurement::without_body(Outcome::Success, Some(200), secs(1.0));
            m.streaming = true;
            m.ttft = Some(Duration::from_millis(client_ms));
            let view = crate::engine::EngineView {
                queue: Some(Duration::from_millis(queue_ms)),
                ttft: Some(Duration::from_millis(prefill_ms)),
                cached_prompt_tokens: Some(queue_ms),
                ..Default::default()
            };
            let split = crate::engine::TtftSplit::of(m.ttft, Some(Duration::from_millis(5)), &view);
            m.set_engine(view, split, stalls);
            let v = judge(&m, &Slo::default());
            let r = RequestRecord::new("id".into(), "m".into(), None, 0, now, m, v);
            ring.push(Arc::new(r), vec![]);
        }
        // A request the engine said nothing about counts in none of them.
        ring.push(rec("m", Outcome::Success, 200, Some(0.2), 1.0, now), vec![]);
        let s = ring.stats(now, secs(60.0), None);
        assert_eq!(s["engine"]["queue_seconds"]["count"], 2);
        assert_eq!(s["engine"]["queue_seconds"]["p50"], 0.02);
        assert_eq!(s["engine"]["cached_prompt_tokens"]["max"], 30.0);
        assert_eq!(s["ttft_split"]["requests"], 2);
        assert_eq!(s["ttft_split"]["clamped"], 1);
        // (100 - 5 - 10 - 20) and (60 - 5 - 30 - 40 -> cut: 0).
        assert_eq!(s["ttft_split"]["rest_seconds"]["max"], 0.065);
        assert_eq!(s["ttft_split"]["rest_seconds"]["p50"], 0.0325);
        assert_eq!(
            (&s["stalls"]["total"], &s["stalls"]["requests"]),
            (&2.into(), &1.into())
        );
    }

    #[test]
    fn ring_is_bounded_and_sheds_gaps_oldest_first() {
        let now = Instant::now();
        let ring = RecordRing::new(3, 5, now);
        for i in 0..5 {
            ring.push(
                rec(&format!("m{i}"), Outcome::Success, 200, None, 1.0, now),
                vec![0.1, 0.2],
            );
        }
        let snap = ring.snapshot(now, secs(60.0));
        let models: Vec<&str> = snap.iter().map(|e| &*e.record.model).collect();
        assert_eq!(models, ["m2", "m3", "m4"]);
        let with_gaps: Vec<bool> = snap.iter().map(|e| e.gaps.is_some()).collect();
        assert_eq!(
            with_gaps,
            [false, true, true],
            "5 gaps at most: the oldest lost theirs"
        );
    }

    #[test]
    fn stats_shape_windows_filters_and_exact_values() {
        let t = Instant::now() + secs(1000.0);
        let ring = RecordRing::new(100, 1000, t - secs(500.0));
        // Outside a 60 s window.
        ring.push(
            rec("a", Outcome::Success, 200, Some(9.0), 9.0, t - secs(100.0)),
            vec![],
        );
        for (i, ttft) in [0.1, 0.2, 0.3, 0.4].iter().enumerate() {
            ring.push(
                rec(
                    "a",
                    Outcome::Success,
                    200,
                    Some(*ttft),
                    1.0,
                    t - secs(10.0 - i as f64),
                ),
                vec![0.01, 0.03],
            );
        }
        ring.push(
            rec("a", Outcome::Success, 200, Some(5.0), 6.0, t - secs(5.0)),
            vec![],
        ); // slow: not good
        ring.push(
            rec("b", Outcome::UpstreamError, 200, None, 2.0, t - secs(4.0)),
            vec![],
        );
        ring.push(
            rec("b", Outcome::Rejected, 400, None, 0.001, t - secs(3.0)),
            vec![],
        ); // client's fault
        ring.push(
            rec("b", Outcome::Rejected, 429, None, 0.001, t - secs(2.0)),
            vec![],
        ); // shed: counts
        let s = ring.stats(t, secs(60.0), None);
        assert_eq!(s["window_seconds"], 60.0);
        assert_eq!(s["requests"], 8);
        assert_eq!(s["outcomes"]["success"], 5);
        assert_eq!(s["outcomes"]["upstream_error"], 1);
        assert_eq!(s["outcomes"]["rejected"], 2);
        assert_eq!(s["outcomes"]["client_abort"], 0);
        assert_eq!(s["outcomes"].as_object().unwrap().len(), 6);
        assert_eq!(s["goodput"]["good"], 4);
        assert_eq!(s["goodput"]["ratio"], 4.0 / 7.0);
        assert_eq!(s["goodput"]["per_second"], 4.0 / 60.0);
        let ttft = &s["ttft_seconds"];
        assert_eq!(
            (
                ttft["count"].as_u64(),
                ttft["p50"].as_f64(),
                ttft["max"].as_f64()
            ),
            (Some(5), Some(0.3), Some(5.0))
        );
        assert_eq!(s["itl_seconds"]["count"], 8);
        assert_eq!(s["itl_seconds"]["p50"].as_f64().unwrap() as f32, 0.02);
        assert_eq!(
            s["e2e_seconds"]["count"], 6,
            "the two rejected requests are not latencies (as in the histogram)"
        );
        assert_eq!(s["e2e_seconds"]["p50"], 1.0);
        for key in ["ttfc_seconds", "tpot_seconds"] {
            assert!(s[key].get("p99").is_some(), "{key}");
        }
        assert_eq!(s["tpot_seconds"]["count"], 0);
        assert_eq!(s["tpot_seconds"]["p50"], serde_json::Value::Null);

        let b = ring.stats(t, secs(60.0), Some("b"));
        assert_eq!(
            (b["requests"].as_u64(), b["goodput"]["good"].as_u64()),
            (Some(3), Some(0))
        );
        assert_eq!(b["goodput"]["ratio"], 0.0);
        assert_eq!(b["model"], "b");
        // A younger proxy: per-second over its uptime, not the whole window.
        let young = RecordRing::new(10, 10, t - secs(30.0));
        young.push(
            rec("a", Outcome::Success, 200, Some(0.1), 1.0, t - secs(1.0)),
            vec![],
        );
        assert_eq!(
            young.stats(t, secs(60.0), None)["goodput"]["per_second"],
            1.0 / 30.0
        );
        let empty = RecordRing::new(10, 10, t).stats(t, secs(60.0), None);
        assert_eq!(
            (
                empty["requests"].as_u64(),
                empty["goodput"]["ratio"].is_null()
            ),
            (Some(0), true)
        );
    }
}
