//! The measure layer: every request becomes exactly one [`RequestRecord`] (metrics, `/stats`
//! ring, sinks), never zero, never two. It is the one place that records.
//!
//! It sits inside the error mapping (so it sees typed errors) and outside everything that can
//! answer on its own (auth, limits, route, collect), and finishes the record from whichever
//! comes first:
//! - a typed error from any layer inside it: a rejection (404, 413, 503 shed) is `rejected`, a
//!   forwarding error `upstream_error` or `timeout`, a broken request body `client_abort`;
//! - for generation requests, the response head: the body is wrapped in a [`MeteredBody`]
//!   that finishes the record at the body's end, error or drop;
//! - the drop of its future before the head (the client went away).
//!
//! The end-of-request state is one `Option` ([`MeasureFuture`]'s `open`, then the body's
//! `active`), taken on every exit. What inner layers learn (model, stream, usage injection)
//! comes through the [`RequestContext`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Request, Response};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::ResponseFuture;
use crate::auth::{Tenant, NO_TENANT};
use crate::body::metered::{MeteredBody, OnFinish};
use crate::body::BoxError;
use crate::body::ProxyBody;
use crate::context::{RequestContext, X_GOODPUT_TRACE};
use crate::error::ProxyError;
use crate::metrics::{Metrics, RequestMetrics, OTHER_MODEL};
use crate::sink::Sinks;
use crate::upstream::deadline::DeadlineError;
use crate::upstream::forward::ServedBy;
use goodput_measure::meter::{Measurement, StreamMeter};
use goodput_measure::outcome::{Ending, Outcome};
use goodput_measure::record::{RecordRing, RequestRecord, DEFAULT_GAP_CAPACITY};
use goodput_measure::slo::{judge, Slo, SloTable};
use goodput_measure::trace::TraceBounds;

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
    /// `[measure] enabled`: when false the stack leaves the measure and usage layers out.
    enabled: bool,
    /// Woken when a request names a model that has no label yet: the model learner re-reads
    /// the upstreams' `/v1/models` (see `app.rs`).
    unknown_model: Notify,
    /// `[trace] sample_rate` and `max_tokens`.
    trace_rate: f64,
    trace_bounds: TraceBounds,
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
            trace_rate: 0.0,
            trace_bounds: TraceBounds::default(),
        }
    }

    /// `[trace]`: trace this share of streams besides those that ask (`x-goodput-trace`),
    /// each within `bounds`, and keep at most `max_traces` traces in the ring.
    pub fn with_trace(mut self, sample_rate: f64, bounds: TraceBounds, max_traces: usize) -> Self {
        self.trace_rate = sample_rate;
        self.trace_bounds = bounds;
        self.ring = self.ring.with_trace_capacity(max_traces);
        self
    }

    /// Whether a stream is traced: asked for, or sampled.
    fn traced(&self, asked: bool) -> bool {
        asked || (self.trace_rate > 0.0 && rand::random::<f64>() < self.trace_rate)
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

    /// Starts one request's record: handles resolved once, counted in flight. `tenant`: the
    /// one auth accepted (read when the record starts, after auth ran).
    fn begin(
        self: &Arc<Self>,
        id: Arc<str>,
        model: Option<&str>,
        t0: Instant,
        tenant: Option<Arc<Tenant>>,
    ) -> Pending {
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
            tenant,
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
    tenant: Option<Arc<Tenant>>,
}

impl Pending {
    fn record(self, m: Measurement, upstream: Option<&Arc<str>>) {
        let v = judge(&m, &self.slo);
        let tenant = self.tenant.as_ref().map(|t| t.name.clone());
        let tokens = m.prompt_tokens.unwrap_or(0) + m.completion_tokens.unwrap_or(0);
        if let Some(t) = &self.tenant {
            // The token budget is charged with what the request used (see auth::tenant).
            t.charge(tokens, Instant::now());
        }
        self.meter.metrics.tenant_finished(
            tenant.as_deref().unwrap_or(NO_TENANT),
            m.outcome,
            tokens,
        );
        let rec = Arc::new(
            RequestRecord::new(
                self.id.clone(),
                self.rm.model().clone(),
                upstream.cloned(),
                self.start_unix_ms,
                Instant::now(),
                &m,
                v,
            )
            .with_instance(self.meter.instance.clone())
            .with_tenant(tenant),
        );
        self.rm.finish(&m, &v);
        match m.trace {
            // A traced request: the sinks get the record with its trace, the ring keeps the
            // trace beside the record under its own bound.
            Some(trace) => {
                let trace = Arc::new(trace);
                let mut full = (*rec).clone();
                full.trace = Some(trace.clone());
                self.meter.sinks.send(&Arc::new(full));
                self.meter.ring.push_traced(rec, m.itl_gaps, Some(trace));
            }
            None => {
                self.meter.sinks.send(&rec);
                self.meter.ring.push(rec, m.itl_gaps);
            }
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
        | ProxyError::Unauthorized(_)
        | ProxyError::RateLimited { .. }
        | ProxyError::BodyTooLarge { .. }
        // A stalled upload is the client's doing, answered by the proxy (408).
        | ProxyError::BodyTimeout { .. }
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

/// `x-goodput-trace` asks for a trace: `1`, `true`, `yes` or `on` (any case), as the engine
/// reads a boolean. Forwarding never sends the header upstream (`upstream/forward.rs`).
fn trace_asked(headers: &http::HeaderMap) -> bool {
    headers.get(X_GOODPUT_TRACE).is_some_and(|v| {
        let v = v.as_bytes().trim_ascii();
        ["1", "true", "yes", "on"]
            .iter()
            .any(|t| v.eq_ignore_ascii_case(t.as_bytes()))
    })
}

/// A request the proxy answered itself (as opposed to an error from forwarding it).
fn answered_by_proxy(e: &ProxyError) -> bool {
    !matches!(
        e,
        ProxyError::UpstreamConnect { .. }
            | ProxyError::Upstream { .. }
            | ProxyError::FirstByteTimeout { .. }
    )
}

#[derive(Clone)]
pub struct MeasureLayer {
    meter: Arc<Meter>,
}

impl MeasureLayer {
    pub fn new(meter: Arc<Meter>) -> Self {
        Self { meter }
    }
}

impl<S> Layer<S> for MeasureLayer {
    type Service = Measure<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Measure {
            meter: self.meter.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Measure<S> {
    meter: Arc<Meter>,
    inner: S,
}

impl<S, B> Service<Request<B>> for Measure<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = ProxyError;
    /// Boxed once here (the stage's box): [`MeasureFuture`] itself is a plain struct.
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let ctx = match RequestContext::of(req.extensions()) {
            Some(ctx) => ctx.clone(),
            None => {
                // Only a test calls the stack without the context layer; measure it anyway.
                let ctx = Arc::new(RequestContext::new(Arc::from("-"), Instant::now(), None));
                req.extensions_mut().insert(ctx.clone());
                ctx
            }
        };
        let open = Open {
            meter: self.meter.clone(),
            generation: is_generation(req.uri().path()),
            trace_asked: trace_asked(req.headers()),
            ctx,
            pending: None,
        };
        Box::pin(MeasureFuture {
            inner: self.inner.call(req),
            open: Some(open),
        })
    }
}

pin_project! {
    /// The inner future, plus the request's record until the head or an error arrives. Dropped
    /// while still open: the client went away before the response head.
    pub struct MeasureFuture<F> {
        #[pin]
        inner: F,
        open: Option<Open>,
    }

    impl<F> PinnedDrop for MeasureFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(open) = this.project().open.take() {
                open.client_gone();
            }
        }
    }
}

impl<F> Future for MeasureFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, ProxyError>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let polled = this.inner.poll(cx);
        let result = match polled {
            Poll::Pending => {
                if let Some(open) = this.open.as_mut() {
                    open.begin_once_forwarded();
                }
                return Poll::Pending;
            }
            Poll::Ready(result) => result,
        };
        let Some(open) = this.open.take() else {
            return Poll::Ready(result); // polled after completion: nothing left to record
        };
        Poll::Ready(match result {
            Ok(resp) => Ok(open.on_head(resp)),
            Err(e) => {
                open.on_error(&e);
                Err(e)
            }
        })
    }
}

/// One request on its way to its response head.
struct Open {
    meter: Arc<Meter>,
    ctx: Arc<RequestContext>,
    /// Generation requests are timed from their body; other paths are recorded only when the
    /// proxy answered them itself (404, 413, 503: they never reached an engine).
    generation: bool,
    /// Started once collect has read the model (see [`Open::begin_once_forwarded`]).
    pending: Option<Pending>,
    /// The client sent `x-goodput-trace: 1`.
    trace_asked: bool,
}

impl Open {
    /// A generation request that reached forwarding is counted in flight from there, under
    /// its model's label: collect has just written the model into the context (in the same
    /// poll of the inner future, so no wake-up is missed).
    fn begin_once_forwarded(&mut self) {
        if self.generation && self.pending.is_none() && self.ctx.forwarded_at().is_some() {
            self.pending = Some(self.begin());
        }
    }

    fn begin(&self) -> Pending {
        let model = self.ctx.facts().and_then(|f| f.model.as_deref());
        if let Some(at) = self.ctx.forwarded_at() {
            self.meter
                .metrics
                .observe_overhead(at.saturating_duration_since(self.ctx.t0));
        }
        let tenant = self.ctx.tenant().cloned();
        self.meter
            .begin(self.ctx.id.clone(), model, self.ctx.t0, tenant)
    }

    fn take_pending(&mut self) -> Pending {
        match self.pending.take() {
            Some(p) => p,
            None => self.begin(),
        }
    }

    fn without_body(mut self, outcome: Outcome, status: Option<u16>) {
        let m = Measurement::without_body(outcome, status, self.ctx.t0.elapsed());
        self.take_pending().record(m, None);
    }

    fn on_error(self, e: &ProxyError) {
        if self.generation || answered_by_proxy(e) {
            self.without_body(error_outcome(e), Some(e.status().as_u16()));
        }
    }

    fn client_gone(self) {
        if self.generation {
            self.without_body(Outcome::ClientAbort, None);
        }
    }

    /// The response head: a generation request's record is finished by its body from here.
    fn on_head(mut self, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        if !self.generation {
            return resp;
        }
        let mut pending = self.take_pending();
        let ctx = self.ctx;
        let stream = ctx.facts().is_some_and(|f| f.stream);
        let (parts, body) = resp.into_parts();
        let tools = ctx.facts().and_then(|f| f.tools.clone());
        let mut sm = StreamMeter::new(ctx.t0, stream)
            .keep_gaps(GAPS_KEPT_PER_REQUEST)
            .with_tools(tools);
        // Only streams have events to trace (a JSON body is one moment).
        if stream && self.meter.traced(self.trace_asked) {
            sm = sm.trace(self.meter.trace_bounds);
        }
        sm.on_head(Instant::now(), parts.status.as_u16());
        let upstream = parts.extensions.get::<ServedBy>().map(|s| s.0.clone());
        if let Some(u) = &upstream {
            pending.rm.set_upstream(u);
        }
        let mut itl = pending.rm.itl_buffer();
        let on_finish: OnFinish =
            Box::new(move |m: Measurement| pending.record(m, upstream.as_ref()));
        let mut body = MeteredBody::new(body, sm, on_finish)
            .with_gap_observer(Box::new(move |g: Duration| itl.observe(g)))
            .with_error_ending(body_error_ending);
        if let Some(report) = ctx.strip_report() {
            body = body.with_strip_report(report.clone());
        }
        Response::from_parts(parts, body.boxed_unsync())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::RequestFacts;
    use crate::metrics::ModelLabels;
    use bytes::Bytes;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use tokio::sync::mpsc;
    use tower::ServiceExt;

    /// What the mock below the measure layer does with a request.
    #[derive(Clone, Copy, Debug)]
    enum Inner {
        /// Answers itself before collect (a 503 shed, say).
        Reject,
        /// Reaches forwarding, which fails (connect refused).
        ForwardError,
        /// A complete stream.
        Stream,
        /// A stream whose body breaks after one event.
        BodyError,
        /// Reaches forwarding and never gets a response head.
        NoHead,
        /// A stream whose frames come from the test (one event, then nothing).
        Channel,
    }

    type Item = Result<Frame<Bytes>, BoxError>;

    fn meter() -> Arc<Meter> {
        let metrics = Metrics::register(&prometheus::Registry::new(), ModelLabels::default())
            .expect("metrics");
        Arc::new(Meter::new(
            metrics,
            SloTable::default(),
            16,
            Sinks::default(),
            false,
        ))
    }

    const EVENT: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
    const FINISH: &[u8] =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    fn body(items: Vec<Item>) -> ProxyBody {
        StreamBody::new(stream::iter(items)).boxed_unsync()
    }

    /// The layers below measure as far as it can tell: collect writes the facts, usage
    /// injection marks the hand-over, forwarding answers per `inner`.
    fn service(
        meter: Arc<Meter>,
        inner: Inner,
        frames: Option<mpsc::UnboundedReceiver<Item>>,
    ) -> Measure<
        impl Service<
            Request<()>,
            Response = Response<ProxyBody>,
            Error = ProxyError,
            Future = impl Future + Send,
        >,
    > {
        let frames = std::sync::Mutex::new(frames);
        let mock = tower::service_fn(move |req: Request<()>| {
            let rx = frames.lock().unwrap().take();
            async move {
                if let Inner::Reject = inner {
                    return Err(ProxyError::Overloaded {
                        limit: 1,
                        retry_after_s: 1,
                    });
                }
                let ctx = RequestContext::of(req.extensions()).unwrap();
                ctx.set_facts(RequestFacts {
                    model: Some("tiny".into()),
                    stream: true,
                    n: 1,
                    tools: None,
                });
                ctx.mark_forwarded(Instant::now());
                let b = match inner {
                    Inner::Reject => unreachable!(),
                    Inner::ForwardError => {
                        return Err(ProxyError::UpstreamConnect {
                            source: "refused".into(),
                        })
                    }
                    Inner::NoHead => std::future::pending().await,
                    Inner::Stream => body(vec![
                        Ok(Frame::data(Bytes::from_static(EVENT))),
                        Ok(Frame::data(Bytes::from_static(FINISH))),
                    ]),
                    Inner::BodyError => body(vec![
                        Ok(Frame::data(Bytes::from_static(EVENT))),
                        Err("reset".into()),
                    ]),
                    Inner::Channel => {
                        let mut rx = rx.unwrap();
                        let s = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
                        StreamBody::new(s).boxed_unsync()
                    }
                };
                Ok(Response::new(b))
            }
        });
        MeasureLayer::new(meter).layer(mock)
    }

    fn request(path: &str) -> Request<()> {
        let mut req = Request::new(());
        *req.uri_mut() = path.parse().unwrap();
        req.extensions_mut().insert(Arc::new(RequestContext::new(
            Arc::from("req-1"),
            Instant::now(),
            None,
        )));
        req
    }

    fn outcomes(meter: &Meter) -> Vec<Outcome> {
        let entries = meter
            .ring()
            .snapshot(Instant::now(), Duration::from_secs(3600));
        entries.iter().map(|e| e.record.outcome).collect()
    }

    fn in_flight(meter: &Meter) -> i64 {
        let g = &meter.metrics().in_flight;
        g.with_label_values(&[OTHER_MODEL]).get() + g.with_label_values(&["tiny"]).get()
    }

    #[tokio::test]
    async fn each_exit_finishes_the_record_exactly_once() {
        const CHAT: &str = "/v1/chat/completions";
        for (inner, want) in [
            (Inner::Reject, Outcome::Rejected),
            (Inner::ForwardError, Outcome::UpstreamError),
            (Inner::Stream, Outcome::Success),
            (Inner::BodyError, Outcome::Truncated),
        ] {
            let m = meter();
            let result = service(m.clone(), inner, None).oneshot(request(CHAT)).await;
            if let Ok(resp) = result {
                assert!(
                    outcomes(&m).is_empty(),
                    "{inner:?}: not before the body ends"
                );
                let _ = resp.into_body().collect().await;
            }
            assert_eq!(outcomes(&m), [want], "{inner:?}");
            assert_eq!(in_flight(&m), 0, "{inner:?}");
        }
    }

    #[tokio::test]
    async fn a_drop_before_the_head_is_a_client_abort_once() {
        let m = meter();
        let mut fut =
            Box::pin(service(m.clone(), Inner::NoHead, None).oneshot(request("/v1/completions")));
        assert!(futures_util::FutureExt::now_or_never(&mut fut).is_none());
        assert_eq!(in_flight(&m), 1, "counted in flight once forwarded");
        assert!(outcomes(&m).is_empty());
        drop(fut);
        assert_eq!(outcomes(&m), [Outcome::ClientAbort]);
        assert_eq!(in_flight(&m), 0);
    }

    #[tokio::test]
    async fn a_drop_mid_body_is_a_client_abort_once() {
        let m = meter();
        let (tx, rx) = mpsc::unbounded_channel();
        let svc = service(m.clone(), Inner::Channel, Some(rx));
        let resp = svc.oneshot(request("/v1/chat/completions")).await.unwrap();
        let mut body = resp.into_body();
        tx.send(Ok(Frame::data(Bytes::from_static(EVENT)))).unwrap();
        assert!(body.frame().await.is_some());
        assert!(outcomes(&m).is_empty(), "still streaming");
        drop(body);
        drop(tx);
        let got = m.ring().snapshot(Instant::now(), Duration::from_secs(3600));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].record.outcome, Outcome::ClientAbort);
        assert!(
            got[0].record.ttft_s.is_some(),
            "the event it served was timed"
        );
        assert_eq!(in_flight(&m), 0);
    }

    #[tokio::test]
    async fn other_paths_are_recorded_only_when_the_proxy_answered() {
        let m = meter();
        let r = service(m.clone(), Inner::Reject, None)
            .oneshot(request("/v1/models"))
            .await;
        assert!(r.is_err());
        assert_eq!(outcomes(&m), [Outcome::Rejected], "a shed /v1/models");
        let m = meter();
        let r = service(m.clone(), Inner::ForwardError, None)
            .oneshot(request("/v1/models"))
            .await;
        assert!(r.is_err());
        let resp = service(m.clone(), Inner::Stream, None)
            .oneshot(request("/v1/models"))
            .await
            .unwrap();
        let _ = resp.into_body().collect().await;
        let fut = Box::pin(service(m.clone(), Inner::NoHead, None).oneshot(request("/health")));
        drop(fut);
        assert!(outcomes(&m).is_empty(), "forwarded, not measured");
    }

    #[test]
    fn error_outcomes() {
        for (e, want) in [
            (
                ProxyError::NotFound { path: "/x".into() },
                Outcome::Rejected,
            ),
            (ProxyError::BodyTooLarge { limit: 1 }, Outcome::Rejected),
            (ProxyError::BodyTimeout { ms: 1 }, Outcome::Rejected),
            (
                ProxyError::Overloaded {
                    limit: 1,
                    retry_after_s: 1,
                },
                Outcome::Rejected,
            ),
            (ProxyError::ClientBody("gone".into()), Outcome::ClientAbort),
            (
                ProxyError::Unauthorized(crate::error::AuthFailure::Missing),
                Outcome::Rejected,
            ),
            (
                ProxyError::RateLimited {
                    tenant: "a".into(),
                    refusal: crate::auth::tenant::Refusal::InFlight { limit: 1 },
                    retry_after_s: 1,
                },
                Outcome::Rejected,
            ),
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
