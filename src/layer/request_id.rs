//! Request identity: the arrival instant (`t0`) and `x-request-id`, taken from the client when
//! it sent a sane one or generated, then returned on the response.
//!
//! Outermost layer: `t0` must be taken before anything else spends time, and every response,
//! including the proxy's own errors, must carry the id.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::HeaderName;
use http::{HeaderValue, Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};

use super::BoxFuture;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id (a request extension).
#[derive(Debug, Clone)]
pub struct RequestId(pub Arc<str>);

/// `t0`: when hyper handed the request over (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct RequestStart(pub Instant);

/// Accepts a client id of 1..=128 visible ASCII characters; anything else is replaced.
fn client_id(value: Option<&HeaderValue>) -> Option<&str> {
    let s = value?.to_str().ok()?;
    let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(s)
}

/// 128 random bits, hex: unique enough to find one request in a day of logs.
fn generate_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct RequestIdService<S> {
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for RequestIdService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let t0 = Instant::now();
        let id: Arc<str> = match client_id(req.headers().get(&X_REQUEST_ID)) {
            Some(s) => Arc::from(s),
            None => Arc::from(generate_id()),
        };
        req.extensions_mut().insert(RequestId(id.clone()));
        req.extensions_mut().insert(RequestStart(t0));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            if let Ok(v) = HeaderValue::from_str(&id) {
                resp.headers_mut().insert(X_REQUEST_ID, v);
            }
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids() {
        let hv = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(client_id(Some(&hv("abc-123"))), Some("abc-123"));
        assert_eq!(client_id(Some(&hv(""))), None);
        assert_eq!(client_id(Some(&hv("has space"))), None);
        assert_eq!(client_id(Some(&hv(&"x".repeat(129)))), None);
        assert_eq!(client_id(None), None);
        assert_ne!(generate_id(), generate_id());
        assert_eq!(generate_id().len(), 32);
    }
}
