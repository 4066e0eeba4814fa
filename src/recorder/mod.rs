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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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
pub use recording::Recording;

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
    fn store(&self, rec: Arc<RequestRecord>, gaps: Vec<f32>, trace: Option<Arc<Trace>>) {
        match trace {
            Some(trace) => {
                let mut traced = RequestRecord::clone(&rec);
                traced.measured.trace = Some(trace.clone());
                self.sinks.send(&Arc::new(traced));
                self.ring.push_traced(rec, gaps, Some(trace));
            }
            None => {
                self.sinks.send(&rec);
                self.ring.push(rec, gaps);
            }
        }
    }
}

/// Wall-clock milliseconds at the monotonic instant `t0` (for humans and log joins only).
///
/// Read as the wall clock's offset from the monotonic one, taken again whenever the instant
/// asked about is more than [`WALL_REREAD`] from the last reading: a request then costs one
/// subtraction instead of reading both clocks, and a step of the wall clock (or its slewing)
/// shows within a second.
fn unix_ms_at(t0: Instant) -> u64 {
    WALL.unix_ms_at(t0)
}

/// How far (in the monotonic clock) an instant may be from the last reading of the wall clock.
const WALL_REREAD: Duration = Duration::from_secs(1);

static WALL: WallClock = WallClock {
    origin: OnceLock::new(),
    read_at_ns: AtomicU64::new(0),
    offset_ns: AtomicU64::new(0),
};

/// The wall clock at monotonic instants; see [`unix_ms_at`].
struct WallClock {
    /// The monotonic instants are measured from here (the first one asked about).
    origin: OnceLock<Instant>,
    /// Nanoseconds from `origin` to the last reading.
    read_at_ns: AtomicU64,
    /// Wall-clock nanoseconds (Unix) at `origin`, by the last reading; 0 before the first.
    /// The two are stored apart: either reading's offset is a true one, a second old at most.
    offset_ns: AtomicU64,
}

impl WallClock {
    fn unix_ms_at(&self, t0: Instant) -> u64 {
        let origin = *self.origin.get_or_init(|| t0);
        let Some(since) = t0.checked_duration_since(origin) else {
            // Before the origin (a request that started before the first asked about).
            return read_unix_ms_at(t0);
        };
        let since = since.as_nanos() as u64;
        let mut offset = self.offset_ns.load(Ordering::Relaxed);
        let read_at = self.read_at_ns.load(Ordering::Relaxed);
        if offset == 0 || since.abs_diff(read_at) > WALL_REREAD.as_nanos() as u64 {
            let (now, wall) = (Instant::now(), unix_now());
            let read_at = now.saturating_duration_since(origin).as_nanos() as u64;
            offset = (wall.as_nanos() as u64).saturating_sub(read_at).max(1);
            self.offset_ns.store(offset, Ordering::Relaxed);
            self.read_at_ns.store(read_at, Ordering::Relaxed);
        }
        offset.saturating_add(since) / 1_000_000
    }
}

/// The wall clock now, as a duration since the Unix epoch (0 before it).
fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// [`unix_ms_at`] by reading both clocks.
fn read_unix_ms_at(t0: Instant) -> u64 {
    unix_now().saturating_sub(t0.elapsed()).as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offset's reading is the two clocks read now, within a few milliseconds (the reads
    /// are not at one instant), for instants at, near and far from the last reading, and
    /// before the origin.
    #[test]
    fn wall_clock_at_an_instant_is_both_clocks_read_now() {
        let clock = WallClock {
            origin: OnceLock::new(),
            read_at_ns: AtomicU64::new(0),
            offset_ns: AtomicU64::new(0),
        };
        let now = Instant::now();
        let s = Duration::from_secs;
        for at in [now - s(10), now - s(5), now - s(1), now, now - s(3), now] {
            let (got, want) = (clock.unix_ms_at(at), read_unix_ms_at(at));
            assert!(got.abs_diff(want) <= 5, "{got} vs {want}");
        }
        assert!(clock.origin.get() == Some(&(now - s(10))));
        let earlier = now - s(60);
        assert!(clock.unix_ms_at(earlier).abs_diff(read_unix_ms_at(earlier)) <= 5);
    }
}
