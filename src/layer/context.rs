//! The outermost layer: creates the request's [`RequestContext`] (see `crate::context`).
//! Outermost because `t0` must be taken before anything else spends time, and every response,
//! including the proxy's own errors, must carry the id.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};

use super::BoxFuture;
use crate::context::{ConnInfo, RequestContext, X_REQUEST_ID};

/// Accepts a client id of 1..=128 visible ASCII characters; anything else is replaced.
fn client_id(value: Option<&HeaderValue>) -> Option<&str> {
    let s = value?.to_str().ok()?;
    let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(s)
}

/// 128 random bits, hex: unique enough to find one request in a day of logs. Written into a
/// stack buffer: the `Arc` is the request's one allocation for its id.
fn generate_id() -> Arc<str> {
    hex_id(rand::random::<u128>())
}

/// `bits` as 32 lowercase hex digits (`format!("{bits:032x}")` without the `String`).
fn hex_id(bits: u128) -> Arc<str> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 32];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = HEX[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    match std::str::from_utf8(&buf) {
        Ok(s) => Arc::from(s),
        Err(_) => Arc::from("-"), // unreachable: hex digits are ASCII
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ContextLayer;

impl<S> Layer<S> for ContextLayer {
    type Service = ContextService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ContextService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct ContextService<S> {
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for ContextService<S>
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
            None => generate_id(),
        };
        // Moved into the context, which every later reader looks up anyway (forwarding, for
        // `X-Forwarded-For`): one extension fewer keeps the request's map at its first size
        // (a fourth entry, usage injection's offer, made it grow: a new table a request).
        let peer = req.extensions_mut().remove::<ConnInfo>();
        let ctx = Arc::new(RequestContext::new(id, t0, peer));
        // A client id passed `client_id`, a generated one is hex: both are valid header values.
        let header = ctx.id_header.clone();
        req.extensions_mut().insert(ctx);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            if let Some(v) = header {
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
        for bits in [0, 1, 0xfedc_ba98_7654_3210_0123_4567_89ab_cdef, u128::MAX] {
            assert_eq!(&*hex_id(bits), format!("{bits:032x}"));
        }
    }
}
