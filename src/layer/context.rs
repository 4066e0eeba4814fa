//! The request context: one per request, created by the outermost layer and carried as ONE
//! request extension (`Arc<RequestContext>`). It holds what is known at arrival (id, `t0`,
//! peer) and write-once cells for what inner layers learn on the way down (collect: the
//! body's facts; usage injection: the strip report; the moment the request is forwarded).
//! Readers: the access log, the measure layer, forwarding (the id), later auth and tenants.
//!
//! Outermost layer: `t0` must be taken before anything else spends time, and every response,
//! including the proxy's own errors, must carry the id.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::header::HeaderName;
use http::{Extensions, HeaderValue, Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};

use super::BoxFuture;
use crate::body::strip::StripReport;
use crate::listener::ConnInfo;
use goodput_measure::agent::ToolSet;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What collect reads from the request body (see `measure::request`).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFacts {
    /// The body's `model`, when the body is JSON and has one.
    pub model: Option<String>,
    /// The body's `stream` flag as the engine reads it (lax boolean; `false` when absent, not
    /// JSON, or not a boolean to the engine).
    pub stream: bool,
    /// Choices asked for (`n` as the engine reads it; 1 when absent).
    pub n: u32,
    /// The functions the body offers (`tools`), to judge tool calls by; `None` without.
    pub tools: Option<Arc<ToolSet>>,
}

/// One request's context. Fields known at arrival are plain; the rest are set once by the
/// layer that learns them and read by the layers outside it after their inner call.
#[derive(Debug)]
pub struct RequestContext {
    /// `x-request-id`: the client's when it sent a sane one, else generated.
    pub id: Arc<str>,
    /// When hyper handed the request over (DESIGN.md `t0`).
    pub t0: Instant,
    /// The client connection (absent when a test calls the stack without a listener).
    pub peer: Option<ConnInfo>,
    facts: OnceLock<RequestFacts>,
    forwarded: OnceLock<Instant>,
    strip: OnceLock<Arc<StripReport>>,
}

impl RequestContext {
    pub fn new(id: Arc<str>, t0: Instant, peer: Option<ConnInfo>) -> Self {
        Self {
            id,
            t0,
            peer,
            facts: OnceLock::new(),
            forwarded: OnceLock::new(),
            strip: OnceLock::new(),
        }
    }

    /// The context of a request (the one extension every layer reads).
    pub fn of(ext: &Extensions) -> Option<&Arc<RequestContext>> {
        ext.get::<Arc<RequestContext>>()
    }

    /// The body's facts, once collect has read it.
    pub fn facts(&self) -> Option<&RequestFacts> {
        self.facts.get()
    }

    /// Collect: the body was read (a second call is ignored: the first reader wins).
    pub fn set_facts(&self, facts: RequestFacts) {
        let _ = self.facts.set(facts);
    }

    /// When the request was handed to forwarding (the proxy's own overhead ends here).
    pub fn forwarded_at(&self) -> Option<Instant> {
        self.forwarded.get().copied()
    }

    /// The innermost layer, just before it calls forwarding.
    pub fn mark_forwarded(&self, at: Instant) {
        let _ = self.forwarded.set(at);
    }

    /// Usage was injected and the response body is stripped: what the strip body reports.
    pub fn strip_report(&self) -> Option<&Arc<StripReport>> {
        self.strip.get()
    }

    /// Usage injection, when it wraps the response body in a strip body.
    pub fn set_strip_report(&self, report: Arc<StripReport>) {
        let _ = self.strip.set(report);
    }
}

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
        let peer = req.extensions().get::<ConnInfo>().copied();
        // A client id passed `client_id`, a generated one is hex: both are valid header values.
        let header = HeaderValue::from_str(&id).ok();
        let ctx = Arc::new(RequestContext::new(id, t0, peer));
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

    #[test]
    fn cells_are_write_once() {
        let ctx = RequestContext::new(Arc::from("id"), Instant::now(), None);
        assert_eq!(ctx.facts(), None);
        let facts = RequestFacts {
            model: Some("m".into()),
            stream: true,
            n: 1,
            tools: None,
        };
        ctx.set_facts(facts.clone());
        ctx.set_facts(RequestFacts {
            model: None,
            stream: false,
            n: 2,
            tools: None,
        });
        assert_eq!(ctx.facts(), Some(&facts), "the first write wins");
    }
}
