//! Turns a [`ProxyError`] from any inner layer into the client's response, through the one
//! mapping in `error.rs`. Everything outside this layer sees only responses.

use std::convert::Infallible;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use super::BoxFuture;
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::error::ProxyError;

#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorResponseLayer;

impl<S> Layer<S> for ErrorResponseLayer {
    type Service = ErrorResponse<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ErrorResponse { inner }
    }
}

#[derive(Debug, Clone)]
pub struct ErrorResponse<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for ErrorResponse<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Response<ProxyBody>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Inner layers are always ready; an error here would have nowhere to go but a response.
        match self.inner.poll_ready(cx) {
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The id, not the path: an `Arc` clone instead of a copy per request (the access line
        // has the path under the same id).
        let id = RequestContext::of(req.extensions()).map(|c| c.id.clone());
        let fut = self.inner.call(req);
        Box::pin(async move {
            Ok(fut.await.unwrap_or_else(|err| {
                let request_id = id.as_deref().unwrap_or("-");
                tracing::debug!(request_id, error = %err, "proxy answered with an error");
                err.into_response()
            }))
        })
    }
}
