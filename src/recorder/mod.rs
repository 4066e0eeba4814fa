//! The recorder: every request the proxy measures becomes exactly one [`RequestRecord`]
//! (Prometheus metrics, the `/stats` ring, the sinks), never zero, never two.
//!
//! - [`Recorder`]: what every measured request shares (metric families, SLOs, the ring, the
//!   sinks, trace sampling); one per process, built by `app.rs`.
//! - [`Recording`]: one request on its way to its record, opened by the measure layer. It is
//!   finished exactly once, by whichever comes first: a typed error ([`Recording::failed`]),
//!   the response head ([`Recording::respond`], which hands it to the response body), or its
//!   drop (the client went away before the head).
//! - [`MeteredBody`]: the response body the client polls; it feeds the request's
//!   [`StreamMeter`](goodput_measure::meter::StreamMeter) and finishes the record at the
//!   body's end, error or drop.
//!
//! The end-of-request state is one `Option` at each stage, taken on every exit.

pub mod body;
mod recording;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::auth::NO_TENANT;
use crate::context::RequestContext;
use crate::metrics::{Metrics, OTHER_MODEL};
use crate::scale::Scale;
use crate::sink::Sinks;
use goodput_measure::record::{RecordRing, RequestRecord, DEFAULT_GAP_CAPACITY};
use goodput_measure::slo::SloTable;
use goodput_measure::trace::{Trace, TraceBounds};

pub use body::MeteredBody;
pub use recording::{Recording, UsageInjected};

/// ITL gaps kept per request for exact `/stats` percentiles (beyond, the histogram still
/// counts every gap).
const GAPS_KEPT_PER_REQUEST: usize = 16_384;

/// What every measured request shares: metric families, SLOs, the record ring, the sinks.
pub struct Recorder {
    metrics: Metrics,
    slo: SloTable,
    ring: RecordRing,
    sinks: Sinks,
    /// This replica's name (`server.instance`), written into every record.
    instance: Arc<str>,
    usage_injection: bool,
    /// `[measure] enabled`: when false the stack leaves the measure and usage layers out.
    enabled: bool,
    /// Woken when a request names a model that has no label yet: the model learner re-reads
    /// the upstreams' `/v1/models` (see `app.rs`).
    unknown_model: Notify,
    /// `[trace] sample_rate` and `max_tokens`.
    trace_rate: f64,
    trace_bounds: TraceBounds,
    /// `measure.stall_ms`.
    stall: Duration,
    /// The autoscaling signals, when counted (`[scale]`).
    scale: Option<Arc<Scale>>,
    /// The `tenant` label of requests without a tenant ([`NO_TENANT`]): one `Arc` for all,
    /// found by pointer in the metrics' cache.
    no_tenant: Arc<str>,
}

impl Recorder {
    /// `records`: ring capacity. `usage_injection`: inject `include_usage` into streaming
    /// requests that did not ask for it (and strip the usage chunk again).
    pub fn new(
        metrics: Metrics,
        slo: SloTable,
        records: usize,
        sinks: Sinks,
        usage_injection: bool,
    ) -> Self {
        Self {
            metrics,
            slo,
            ring: RecordRing::new(records, DEFAULT_GAP_CAPACITY, Instant::now()),
            sinks,
            instance: Arc::from(""),
            usage_injection,
            enabled: true,
            unknown_model: Notify::new(),
            trace_rate: 0.0,
            trace_bounds: TraceBounds::default(),
            stall: goodput_measure::meter::DEFAULT_STALL,
            scale: None,
            no_tenant: Arc::from(NO_TENANT),
        }
    }

    /// `measure.stall_ms`: gaps between output events longer than `d` are stalls.
    pub fn with_stall(mut self, d: Duration) -> Self {
        self.stall = d;
        self
    }

    /// `[trace]`: trace this share of streams besides those that ask (`x-goodput-trace`),
    /// each within `bounds`, and keep at most `max_traces` traces in the ring.
    pub fn with_trace(mut self, sample_rate: f64, bounds: TraceBounds, max_traces: usize) -> Self {
        self.trace_rate = sample_rate;
        self.trace_bounds = bounds;
        self.ring = self.ring.with_trace_capacity(max_traces);
        self
    }

    /// Names this replica in every record (`server.instance`).
    pub fn with_instance(mut self, instance: &str) -> Self {
        self.instance = Arc::from(instance);
        self
    }

    /// Counts every finished request in the autoscaling signals.
    pub fn with_scale(mut self, scale: Arc<Scale>) -> Self {
        self.scale = Some(scale);
        self
    }

    pub fn scale(&self) -> Option<&Arc<Scale>> {
        self.scale.as_ref()
    }

    /// Forward without metering (`[measure] enabled = false`): nothing is recorded.
    pub fn disabled(mut self) -> Self {
        self.enabled = false;
        self
    }

    /// `[measure] enabled`.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Inject `include_usage` where it applies (see `measure::usage`).
    pub fn usage_injection(&self) -> bool {
        self.usage_injection
    }

    /// Resolves when a request named a model without a label since the last call.
    pub async fn unknown_model_seen(&self) {
        self.unknown_model.notified().await;
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn ring(&self) -> &RecordRing {
        &self.ring
    }

    /// Opens the record of one request. `generation`: a request the meter times (see
    /// `layer::measure::is_generation`); other paths are recorded only when the proxy
    /// answered them itself. `trace_asked`: the client sent `x-goodput-trace: 1`.
    pub fn open(
        self: &Arc<Self>,
        ctx: Arc<RequestContext>,
        generation: bool,
        trace_asked: bool,
    ) -> Recording {
        Recording::new(self.clone(), ctx, generation, trace_asked)
    }

    /// Whether a stream is traced: asked for, or sampled.
    fn traced(&self, asked: bool) -> bool {
        asked || (self.trace_rate > 0.0 && rand::random::<f64>() < self.trace_rate)
    }

    /// Notes a request whose model has no label of its own (the learner looks again).
    fn saw_model(&self, model: Option<&str>, label: &str) {
        if model.is_some_and(|m| !m.is_empty()) && label == OTHER_MODEL {
            self.unknown_model.notify_one();
        }
    }

    /// The finished record goes to the sinks and the ring, its ITL `gaps` beside it in the
    /// ring. A traced request: the sinks get the record with its trace, the ring keeps the
    /// trace beside the record under its own bound.
    fn store(&self, rec: RequestRecord, gaps: Vec<f32>, trace: Option<Arc<Trace>>) {
        match trace {
            Some(trace) => {
                let plain = Arc::new(rec.clone());
                let mut rec = rec;
                rec.measured.trace = Some(trace.clone());
                self.sinks.send(&Arc::new(rec));
                self.ring.push_traced(plain, gaps, Some(trace));
            }
            None => {
                let rec = Arc::new(rec);
                self.sinks.send(&rec);
                self.ring.push(rec, gaps);
            }
        }
    }
}

/// Wall-clock milliseconds at the monotonic instant `t0` (for humans and log joins only).
fn unix_ms_at(t0: Instant) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(t0.elapsed()).as_millis() as u64
}
