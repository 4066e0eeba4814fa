//! Usage injection: for a streaming generation request whose client did not ask for usage, the
//! collected body gets `stream_options.include_usage` (see `measure::usage` for when it
//! applies) and a 2xx response body is wrapped in a [`StripBody`] that removes the usage chunk
//! again, so the client gets the stream it asked for and the meter exact token counts. The
//! strip report goes into the request context for the measure layer.
//!
//! Innermost, after collect (it rewrites the collected body) and right before forwarding: it
//! also marks in the context when the request is handed to forwarding (the end of the proxy's
//! own overhead).

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::measure::is_generation;
use super::{Around, ResponseFuture, Wrapped};
use crate::body::strip::{StripBody, StripReport};
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::error::ProxyError;
use goodput_measure::usage::inject_include_usage;

#[derive(Debug, Clone, Copy)]
pub struct UsageLayer {
    /// `[measure] usage_injection = "auto"`.
    inject: bool,
}

impl UsageLayer {
    pub fn new(inject: bool) -> Self {
        Self { inject }
    }
}

impl<S> Layer<S> for UsageLayer {
    type Service = UsageInjection<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(*self, inner)
    }
}

pub type UsageInjection<S> = Wrapped<UsageLayer, S>;

impl<S> Around<S, Bytes> for UsageLayer
where
    S: Service<
        Request<Bytes>,
        Response = Response<ProxyBody>,
        Error = ProxyError,
        Future = ResponseFuture,
    >,
{
    type InnerBody = Bytes;

    fn around(&self, inner: &mut S, mut req: Request<Bytes>) -> ResponseFuture {
        let Some(ctx) = RequestContext::of(req.extensions()).cloned() else {
            return inner.call(req);
        };
        let stream = ctx.facts().is_some_and(|f| f.stream);
        let injected = if self.inject && stream && is_generation(req.uri().path()) {
            inject_include_usage(req.body())
        } else {
            None
        };
        ctx.mark_forwarded(Instant::now());
        let Some(body) = injected else {
            return inner.call(req);
        };
        *req.body_mut() = Bytes::from(body);
        let fut = inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            // An error body (4xx/5xx JSON) carries no usage chunk to strip.
            if !resp.status().is_success() {
                return Ok(resp);
            }
            let report = Arc::new(StripReport::default());
            ctx.set_strip_report(report.clone());
            Ok(resp.map(|b| StripBody::new(b, report).boxed_unsync()))
        })
    }
}
