//! One access line per request, written when the response body is finished or dropped, so the
//! duration covers the whole stream: request id, method, path, status, upstream, duration.
//!
//! Sits just inside the context layer: it needs the id and `t0`, and it must see the final
//! response, including the proxy's own errors.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::hold::Hold;
use super::BoxFuture;
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::upstream::forward::ServedBy;

#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLogLayer;

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AccessLog { inner }
    }
}

#[derive(Debug, Clone)]
pub struct AccessLog<S> {
    inner: S,
}

/// Emits the line on drop: the body is dropped when it ended or when the client went away.
struct Line {
    id: Option<Arc<str>>,
    method: Method,
    path: String,
    status: StatusCode,
    upstream: Option<Arc<str>>,
    t0: Instant,
}

impl Drop for Line {
    fn drop(&mut self) {
        let ms = self.t0.elapsed().as_secs_f64() * 1e3;
        tracing::info!(
            target: "goodput_proxy::access",
            request_id = self.id.as_deref().unwrap_or("-"),
            method = %self.method,
            path = %self.path,
            status = self.status.as_u16(),
            upstream = self.upstream.as_deref().unwrap_or("-"),
            duration_ms = format_args!("{ms:.1}"),
            "access"
        );
    }
}

impl<S, B> Service<Request<B>> for AccessLog<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = S::Error;
    type Future = BoxFuture<Response<ProxyBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let ctx = RequestContext::of(req.extensions());
        let id = ctx.map(|c| c.id.clone());
        let t0 = ctx.map_or_else(Instant::now, |c| c.t0);
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            let line = Line {
                id,
                method,
                path,
                status: resp.status(),
                upstream: resp.extensions().get::<ServedBy>().map(|s| s.0.clone()),
                t0,
            };
            Ok(resp.map(|b| Hold::new(b, line).boxed_unsync()))
        })
    }
}
