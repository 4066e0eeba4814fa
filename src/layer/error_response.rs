//! Turns a [`ProxyError`] from any inner layer into the client's response, through the one
//! mapping in `error.rs`. Everything outside this layer sees only responses.

use std::convert::Infallible;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use super::BoxFuture;
use crate::error::ProxyError;
use crate::stack::ProxyBody;

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
        let path = req.uri().path().to_string();
        let fut = self.inner.call(req);
        Box::pin(async move {
            Ok(fut.await.unwrap_or_else(|err| {
                tracing::debug!(%path, error = %err, "proxy answered with an error");
                err.into_response()
            }))
        })
    }
}
