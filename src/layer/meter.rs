//! The meter: every request becomes exactly one [`RequestRecord`] (metrics, `/stats` ring,
//! optional JSONL sink), never zero, never two.
//!
//! Two layers share one [`Meter`]:
//! - [`MeterLayer`] sits innermost, around forwarding. For generation requests
//!   (`.../completions`) it resolves the metric handles once, injects
//!   `stream_options.include_usage` when configured, and wraps the response body in a
//!   [`MeteredBody`] that finishes the record when the body ends, fails or is dropped. Errors
//!   from forwarding (connect failure, no response head in time) and a future dropped before
//!   the response head (the client left) are recorded here too.
//! - [`RecordRejectionsLayer`] sits just inside the error mapping and records what the layers
//!   outside the meter decided on their own (404 unknown path, 413, 503 shed) as `rejected`,
//!   plus a client that left before its request reached the meter. A [`MeterClaim`] request
//!   extension tells it whether the inner meter took the request over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::collect::RequestFacts;
use super::request_id::{RequestId, RequestStart};
use super::{Around, ResponseFuture, Wrapped};
use crate::body::metered::{MeteredBody, OnFinish};
use crate::error::{BoxError, ProxyError};
use crate::metrics::{Metrics, RequestMetrics, OTHER_MODEL};
use crate::sink::Sinks;
use crate::stack::ProxyBody;
use crate::upstream::deadline::DeadlineError;
use crate::upstream::forward::ServedBy;
use goodput_measure::meter::{Measurement, StreamMeter};
use goodput_measure::outcome::{Ending, Outcome};
use goodput_measure::record::{RecordRing, RequestRecord, DEFAULT_GAP_CAPACITY};
use goodput_measure::slo::{judge, Slo, SloTable};
use goodput_measure::usage::inject_include_usage;

/// ITL gaps kept per request for exact `/stats` percentiles (beyond, the histogram still
/// counts every gap).
const GAPS_KEPT_PER_REQUEST: usize = 16_384;

/// What every metered request shares: metric families, SLOs, the record ring, the sink.
pub struct Meter {
    metrics: Metrics,
    slo: SloTable,
    ring: RecordRing,
    sinks: Sinks,
    /// This replica's name (`server.instance`), written into every record.
    instance: Arc<str>,
    usage_injection: bool,
    /// `[measure] enabled`: when false both layers forward without recording anything.
    enabled: bool,
    /// Woken when a request names a model that has no label yet: the model learner re-reads
    /// the upstreams' `/v1/models` (see `app.rs`).
    unknown_model: Notify,
}

impl Meter {
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
        }
    }

    /// Names this replica in every record (`server.instance`).
    pub fn with_instance(mut self, instance: &str) -> Self {
        self.instance = Arc::from(instance);
        self
    }

    /// Forward without metering (`[measure] enabled = false`): nothing is recorded.
    pub fn disabled(mut self) -> Self {
        self.enabled = false;
        self
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

    /// Starts one request's record: handles resolved once, counted in flight.
    fn begin(self: &Arc<Self>, id: Arc<str>, model: Option<&str>, t0: Instant) -> Pending {
        let rm = self.metrics.for_request(model.unwrap_or(""));
        if model.is_some_and(|m| !m.is_empty()) && &**rm.model() == OTHER_MODEL {
            self.unknown_model.notify_one();
        }
        let slo = *self.slo.for_model(rm.model());
        Pending {
            meter: self.clone(),
            rm,
            id,
            start_unix_ms: unix_ms_at(t0),
            slo,
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

/// One request on its way to its record. Consumed by [`Pending::record`].
struct Pending {
    meter: Arc<Meter>,
    rm: RequestMetrics,
    id: Arc<str>,
    start_unix_ms: u64,
    slo: Slo,
}

impl Pending {
    fn record(self, m: Measurement, upstream: Option<&str>) {
        let v = judge(&m, &self.slo);
        let rec = Arc::new(
            RequestRecord::new(
                self.id.to_string(),
                self.rm.model().to_string(),
                upstream.map(str::to_string),
                self.start_unix_ms,
                Instant::now(),
                &m,
                v,
            )
            .with_instance(&self.meter.instance),
        );
        self.rm.finish(&m, &v);
        self.meter.sinks.send(&rec);
        self.meter.ring.push(rec, m.itl_gaps);
    }
}

/// Records the request as a client abort when dropped still armed: the future was dropped
/// before the response head (the client left while the upstream was thinking).
struct Armed {
    pending: Option<Pending>,
    t0: Instant,
}

impl Drop for Armed {
    fn drop(&mut self) {
        if let Some(p) = self.pending.take() {
            let m = Measurement::without_body(Outcome::ClientAbort, None, self.t0.elapsed());
            p.record(m, None);
        }
    }
}

/// The outcome of a request the proxy answered with an error itself.
fn error_outcome(e: &ProxyError) -> Outcome {
    match e {
        ProxyError::UpstreamConnect { .. } | ProxyError::Upstream { .. } => Outcome::UpstreamError,
        ProxyError::FirstByteTimeout { .. } => Outcome::Timeout,
        // The request body could not be read: the client went away (or broke its upload).
        ProxyError::ClientBody(_) => Outcome::ClientAbort,
        ProxyError::NotFound { .. }
        | ProxyError::BodyTooLarge { .. }
        | ProxyError::Overloaded { .. } => Outcome::Rejected,
    }
}

/// A body error from the proxy's own stream deadlines is a timeout; any other is a break.
fn body_error_ending(e: &BoxError) -> Ending {
    if e.downcast_ref::<DeadlineError>().is_some() {
        Ending::Timeout
    } else {
        Ending::BodyError
    }
}

/// Requests the meter times: the OpenAI generation endpoints (`/v1/chat/completions`,
/// `/v1/completions`). Other forwarded paths (`/v1/models`, `/health`, `/tokenize`, ...) have
/// no tokens to time and would only dilute the statistics.
pub fn is_generation(path: &str) -> bool {
    path.ends_with("/completions")
}

/// Set by the meter when it takes a request over (a request extension).
#[derive(Debug, Clone, Default)]
pub struct MeterClaim(Arc<AtomicBool>);

impl MeterClaim {
    fn claim(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn claimed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

// ---------------------------------------------------------------------------------------------
// The meter proper, innermost around forwarding.

#[derive(Clone)]
pub struct MeterLayer {
    meter: Arc<Meter>,
}

impl MeterLayer {
    pub fn new(meter: Arc<Meter>) -> Self {
        Self { meter }
    }
}

impl<S> Layer<S> for MeterLayer {
    type Service = MeterService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(self.clone(), inner)
    }
}

pub type MeterService<S> = Wrapped<MeterLayer, S>;

impl<S> Around<S, Bytes> for MeterLayer
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type InnerBody = Bytes;

    fn around(&self, inner: &mut S, mut req: Request<Bytes>) -> ResponseFuture {
        if let Some(c) = req.extensions().get::<MeterClaim>() {
            c.claim();
        }
        if !self.meter.enabled || !is_generation(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        // Read, not taken: forwarding reads the request id from the facts too.
        let facts = req.extensions().get::<RequestFacts>();
        let (t0, stream) = facts.map_or_else(|| (Instant::now(), false), |f| (f.t0, f.stream));
        let id = facts.map_or_else(|| Arc::from("-"), |f| f.request_id.clone());
        let pending = self
            .meter
            .begin(id, facts.and_then(|f| f.model.as_deref()), t0);
        let mut injected = false;
        if stream && self.meter.usage_injection {
            if let Some(body) = inject_include_usage(req.body()) {
                *req.body_mut() = Bytes::from(body);
                injected = true;
            }
        }
        let armed = Armed {
            pending: Some(pending),
            t0,
        };
        let meter = self.meter.clone();
        let fut = inner.call(req);
        Box::pin(async move {
            let mut armed = armed;
            // The request is about to be handed to the upstream client (Forward's future is
            // lazy: it starts on this poll).
            meter.metrics.observe_overhead(t0.elapsed());
            let result = fut.await;
            let Some(mut pending) = armed.pending.take() else {
                return result; // unreachable: only this future disarms
            };
            let resp = match result {
                Ok(resp) => resp,
                Err(e) => {
                    let status = Some(e.status().as_u16());
                    let m = Measurement::without_body(error_outcome(&e), status, t0.elapsed());
                    pending.record(m, None);
                    return Err(e);
                }
            };
            let (parts, body) = resp.into_parts();
            let mut sm = StreamMeter::new(t0, stream).keep_gaps(GAPS_KEPT_PER_REQUEST);
            sm.on_head(Instant::now(), parts.status.as_u16());
            let upstream = parts.extensions.get::<ServedBy>().map(|s| s.0.clone());
            if let Some(u) = &upstream {
                pending.rm.set_upstream(u);
            }
            let itl = pending.rm.itl_histogram();
            let on_finish: OnFinish =
                Box::new(move |m: Measurement| pending.record(m, upstream.as_deref()));
            let mut body = MeteredBody::new(body, sm, on_finish)
                .with_gap_observer(Box::new(move |g: Duration| itl.observe(g.as_secs_f64())))
                .with_error_ending(body_error_ending);
            // An error body (4xx/5xx JSON) carries no usage chunk to strip.
            if injected && parts.status.is_success() {
                body = body.with_usage_strip();
            }
            Ok(Response::from_parts(parts, body.boxed_unsync()))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Rejections: what the layers outside the meter answered themselves.

#[derive(Clone)]
pub struct RecordRejectionsLayer {
    meter: Arc<Meter>,
}

impl RecordRejectionsLayer {
    pub fn new(meter: Arc<Meter>) -> Self {
        Self { meter }
    }
}

impl<S> Layer<S> for RecordRejectionsLayer {
    type Service = RecordRejections<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(self.clone(), inner)
    }
}

pub type RecordRejections<S> = Wrapped<RecordRejectionsLayer, S>;

/// Records a client abort if the request is dropped before the meter claimed it (the client
/// left while its body was being read).
struct Unclaimed {
    claim: MeterClaim,
    meter: Arc<Meter>,
    id: Arc<str>,
    t0: Instant,
    armed: bool,
}

impl Unclaimed {
    fn record(&mut self, outcome: Outcome, status: Option<u16>) {
        self.armed = false;
        let p = self.meter.begin(self.id.clone(), None, self.t0);
        p.record(
            Measurement::without_body(outcome, status, self.t0.elapsed()),
            None,
        );
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if self.armed && !self.claim.claimed() {
            self.record(Outcome::ClientAbort, None);
        }
    }
}

impl<S, B> Around<S, B> for RecordRejectionsLayer
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type InnerBody = B;

    fn around(&self, inner: &mut S, mut req: Request<B>) -> ResponseFuture {
        if !self.meter.enabled {
            return Box::pin(inner.call(req));
        }
        let claim = MeterClaim::default();
        req.extensions_mut().insert(claim.clone());
        let ext = req.extensions();
        let mut guard = Unclaimed {
            claim,
            meter: self.meter.clone(),
            id: ext
                .get::<RequestId>()
                .map_or_else(|| Arc::from("-"), |r| r.0.clone()),
            t0: ext.get::<RequestStart>().map_or_else(Instant::now, |s| s.0),
            armed: true,
        };
        // A generation request the meter will own counts from here; other paths are only
        // recorded when rejected.
        if !is_generation(req.uri().path()) {
            guard.armed = false;
        }
        let fut = inner.call(req);
        Box::pin(async move {
            let mut guard = guard;
            let result = fut.await;
            if let Err(e) = &result {
                if !guard.claim.claimed() {
                    guard.record(error_outcome(e), Some(e.status().as_u16()));
                }
            }
            guard.armed = false;
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_outcomes() {
        for (e, want) in [
            (
                ProxyError::NotFound { path: "/x".into() },
                Outcome::Rejected,
            ),
            (ProxyError::BodyTooLarge { limit: 1 }, Outcome::Rejected),
            (
                ProxyError::Overloaded {
                    limit: 1,
                    retry_after_s: 1,
                },
                Outcome::Rejected,
            ),
            (ProxyError::ClientBody("gone".into()), Outcome::ClientAbort),
            (
                ProxyError::UpstreamConnect {
                    source: "refused".into(),
                },
                Outcome::UpstreamError,
            ),
            (
                ProxyError::Upstream {
                    source: "reset".into(),
                },
                Outcome::UpstreamError,
            ),
            (ProxyError::FirstByteTimeout { ms: 1 }, Outcome::Timeout),
        ] {
            assert_eq!(error_outcome(&e), want, "{e}");
        }
    }

    #[test]
    fn deadline_errors_are_timeouts() {
        let e: BoxError = DeadlineError::Idle(Duration::from_secs(1)).into();
        assert_eq!(body_error_ending(&e), Ending::Timeout);
        let e: BoxError = DeadlineError::FirstByte.into();
        assert_eq!(body_error_ending(&e), Ending::Timeout);
        let e: BoxError = "connection reset".into();
        assert_eq!(body_error_ending(&e), Ending::BodyError);
    }

    #[test]
    fn generation_paths() {
        for (p, want) in [
            ("/v1/chat/completions", true),
            ("/v1/completions", true),
            ("/v1/models", false),
            ("/health", false),
            ("/tokenize", false),
        ] {
            assert_eq!(is_generation(p), want, "{p}");
        }
    }
}
