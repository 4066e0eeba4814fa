//! The measure layer: opens each request's record ([`Recording`]) and hands it what it needs
//! to finish exactly once (the lifecycle itself is the recorder's, `crate::recorder`).
//!
//! It sits inside the error mapping (so it sees typed errors) and outside everything that can
//! answer on its own (auth, limits, route, collect), so the record is finished from whichever
//! comes first:
//! - a typed error from any layer inside it: a rejection (404, 413, 503 shed) is `rejected`, a
//!   forwarding error `upstream_error` or `timeout`, a broken request body `client_abort`
//!   ([`ProxyError::outcome`]);
//! - for generation requests, the response head: the body finishes the record at its end,
//!   error or drop;
//! - the drop of its future before the head (the client went away).
//!
//! What inner layers learn on the way down (model, stream, tenant) comes through the
//! [`RequestContext`]; what forwarding learns (the replica, when the request went to it,
//! whether usage was injected) comes up with the response head, as its extensions
//! ([`Routed`](crate::upstream::forward::Routed),
//! [`Offered`](crate::upstream::forward::Offered)).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::ResponseFuture;
use crate::body::ProxyBody;
use crate::context::{RequestContext, X_GOODPUT_TRACE};
use crate::error::ProxyError;
use crate::recorder::{Recorder, Recording};

/// Requests the meter times: the OpenAI generation endpoints (`/v1/chat/completions`,
/// `/v1/completions`). Other forwarded paths (`/v1/models`, `/health`, `/tokenize`, ...) have
/// no tokens to time and would only dilute the statistics.
pub fn is_generation(path: &str) -> bool {
    path.ends_with("/completions")
}

/// `x-goodput-trace` asks for a trace: `1`, `true`, `yes` or `on` (any case), as the engine
/// reads a boolean. Forwarding never sends the header upstream (`upstream/forward.rs`).
fn trace_asked(headers: &http::HeaderMap) -> bool {
    trace_header(headers).is_some_and(|v| {
        let v = v.as_bytes().trim_ascii();
        ["1", "true", "yes", "on"]
            .iter()
            .any(|t| v.eq_ignore_ascii_case(t.as_bytes()))
    })
}

/// Names a request may carry for [`trace_header`] to look at each of them rather than hash.
const SCANNED_HEADERS: usize = 8;

/// `x-goodput-trace`'s first value: among a few names (most API clients send under ten) by
/// comparing each, which costs less than hashing the name; among more, by the hash.
fn trace_header(headers: &http::HeaderMap) -> Option<&http::HeaderValue> {
    if headers.keys_len() > SCANNED_HEADERS {
        return headers.get(X_GOODPUT_TRACE);
    }
    let name = &X_GOODPUT_TRACE;
    headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
}

#[derive(Clone)]
pub struct MeasureLayer {
    recorder: Arc<Recorder>,
}

impl MeasureLayer {
    pub fn new(recorder: Arc<Recorder>) -> Self {
        Self { recorder }
    }
}

impl<S> Layer<S> for MeasureLayer {
    type Service = Measure<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Measure {
            recorder: self.recorder.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Measure<S> {
    recorder: Arc<Recorder>,
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
        let recording = self.recorder.open(
            ctx,
            is_generation(req.uri().path()),
            trace_asked(req.headers()),
        );
        Box::pin(MeasureFuture {
            inner: self.inner.call(req),
            recording: Some(recording),
        })
    }
}

pin_project! {
    /// The inner future, plus the request's record until the head or an error arrives.
    /// Dropped before that, the recording finishes itself (the client went away).
    pub struct MeasureFuture<F> {
        #[pin]
        inner: F,
        recording: Option<Recording>,
    }
}

impl<F> Future for MeasureFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, ProxyError>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let result = match this.inner.poll(cx) {
            Poll::Pending => {
                if let Some(r) = this.recording.as_mut() {
                    r.poll_pending();
                }
                return Poll::Pending;
            }
            Poll::Ready(result) => result,
        };
        let Some(recording) = this.recording.take() else {
            return Poll::Ready(result); // polled after completion: nothing left to record
        };
        Poll::Ready(match result {
            Ok(resp) => Ok(recording.respond(resp)),
            Err(e) => {
                recording.failed(&e);
                Err(e)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BoxError;
    use crate::context::RequestFacts;
    use crate::metrics::labels::ByModel;
    use crate::metrics::{Metrics, ModelLabels, OTHER_MODEL};
    use crate::sink::Sinks;
    use bytes::Bytes;
    use futures_util::stream;
    use goodput_measure::outcome::Outcome;
    use goodput_measure::slo::SloTable;
    use http_body::Frame;
    use http_body_util::BodyExt;
    use http_body_util::StreamBody;
    use std::time::Duration;
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

    fn meter() -> Arc<Recorder> {
        let metrics = Metrics::register(&prometheus::Registry::new(), ModelLabels::default())
            .expect("metrics");
        Arc::new(Recorder::new(
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

    /// The layers below measure as far as it can tell: collect writes the facts, forwarding
    /// answers per `inner`.
    fn service(
        meter: Arc<Recorder>,
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
                    usage_injection: None,
                });
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

    fn outcomes(meter: &Recorder) -> Vec<Outcome> {
        let entries = meter
            .ring()
            .snapshot(Instant::now(), Duration::from_secs(3600));
        entries.iter().map(|e| e.record.measured.outcome).collect()
    }

    fn in_flight(meter: &Recorder) -> i64 {
        let g = &meter.metrics().in_flight;
        let n = |model| g.get(&ByModel { model }).get();
        n(OTHER_MODEL) + n("tiny")
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
        assert_eq!(
            in_flight(&m),
            1,
            "counted in flight once its model is known"
        );
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
        assert_eq!(got[0].record.measured.outcome, Outcome::ClientAbort);
        assert!(
            got[0].record.measured.ttft.is_some(),
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

    /// The scan finds what the hash finds: the first value, whatever the names around it.
    #[test]
    fn the_trace_header_scanned_is_the_one_hashed() {
        use http::header::{HeaderName, HeaderValue};
        let names = [
            "host",
            "content-type",
            "x-goodput-tracf",
            "x-stainless-lang",
            "authorization",
            "accept",
        ];
        for n in 0..=SCANNED_HEADERS + 3 {
            for trace_at in [None, Some(0), Some(n / 2), Some(n)] {
                let mut h = http::HeaderMap::new();
                for i in 0..=n {
                    let name = if Some(i) == trace_at {
                        X_GOODPUT_TRACE
                    } else {
                        let base = names[i % names.len()];
                        HeaderName::from_bytes(format!("{base}-{i}").as_bytes()).unwrap()
                    };
                    h.append(name, HeaderValue::from_str(&format!("v{i}")).unwrap());
                }
                if trace_at.is_some() {
                    h.append(X_GOODPUT_TRACE, HeaderValue::from_static("second"));
                }
                assert_eq!(trace_header(&h), h.get(X_GOODPUT_TRACE), "{n} {trace_at:?}");
            }
        }
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
