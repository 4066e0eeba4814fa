//! The request context: one per request, created by the outermost layer and carried as ONE
//! request extension (`Arc<RequestContext>`). It holds what is known at arrival (id, `t0`,
//! peer) and write-once cells for what inner layers learn on the way down (collect: the
//! body's facts; auth: the tenant). What forwarding learns (the replica, when the request went
//! to it) comes back up with the response instead (`upstream::forward::Routed`).
//! Readers: the access log, the measure layer, forwarding (the id, the peer), tenant limits
//! (the tenant auth accepted).
//!
//! The layer that creates it is `layer::context` (outermost: `t0` is taken before anything
//! else spends time, and every response, including the proxy's own errors, carries the id).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use http::header::{HeaderName, HeaderValue};
use http::Extensions;
use tokio::time::Instant;

use crate::auth::Tenant;
use goodput_measure::agent::ToolSet;
use goodput_measure::usage::Injection;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The client asks the proxy for a token-level trace of its stream (`1`); addressed to the
/// proxy alone: forwarding drops it.
pub const X_GOODPUT_TRACE: HeaderName = HeaderName::from_static("x-goodput-trace");

/// The client connection a request came on (the listener inserts it as an extension; the
/// context layer moves it into the [`RequestContext`]).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    pub tls: bool,
    /// The peer's IP as this hop's `X-Forwarded-For` entry: formatted once a connection, not
    /// once a request (a request's clone is a reference count).
    pub peer_ip: HeaderValue,
}

impl ConnInfo {
    pub fn new(remote: SocketAddr, tls: bool) -> Self {
        let ip = remote.ip().to_string();
        Self {
            remote,
            tls,
            peer_ip: HeaderValue::from_maybe_shared(bytes::Bytes::from(ip))
                .unwrap_or(HeaderValue::from_static("unknown")),
        }
    }
}

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
    /// The rewrite usage injection makes of this body when it applies
    /// (`measure::usage::injection`, from the same pass over the body); the usage layer
    /// applies it when injection is on.
    pub usage_injection: Option<Injection>,
}

/// One request's context. Fields known at arrival are plain; the rest are set once by the
/// layer that learns them and read by the layers outside it after their inner call.
#[derive(Debug)]
pub struct RequestContext {
    /// `x-request-id`: the client's when it sent a sane one, else generated.
    pub id: Arc<str>,
    /// The id as a header value that shares `id`'s text: the response's and the replica's
    /// `x-request-id` are clones of it (a reference count each, where making a value from
    /// the text is an allocation and a copy). `None` when the text is no header value (the
    /// context layer only makes ids that are).
    pub id_header: Option<HeaderValue>,
    /// When hyper handed the request over (DESIGN.md `t0`).
    pub t0: Instant,
    /// The client connection (absent when a test calls the stack without a listener).
    pub peer: Option<ConnInfo>,
    facts: OnceLock<RequestFacts>,
    tenant: OnceLock<Arc<Tenant>>,
}

impl RequestContext {
    pub fn new(id: Arc<str>, t0: Instant, peer: Option<ConnInfo>) -> Self {
        Self {
            id_header: id_header(&id),
            id,
            t0,
            peer,
            facts: OnceLock::new(),
            tenant: OnceLock::new(),
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

    /// The tenant whose key the request presented (auth on and the key valid).
    pub fn tenant(&self) -> Option<&Arc<Tenant>> {
        self.tenant.get()
    }

    /// Auth, once the key is accepted.
    pub fn set_tenant(&self, tenant: Arc<Tenant>) {
        let _ = self.tenant.set(tenant);
    }
}

/// `id` as a header value over the same text (one allocation for the owner, none for clones).
fn id_header(id: &Arc<str>) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(IdText(id.clone()))).ok()
}

/// A request id's text as bytes, for [`bytes::Bytes::from_owner`].
struct IdText(Arc<str>);

impl AsRef<[u8]> for IdText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_header_is_the_id_when_it_is_a_header_value() {
        for (id, header) in [("abc-123", Some("abc-123")), ("a\nb", None), ("", Some(""))] {
            let ctx = RequestContext::new(Arc::from(id), Instant::now(), None);
            assert_eq!(ctx.id_header.as_ref().map(|v| v.to_str().unwrap()), header);
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
            usage_injection: None,
        };
        ctx.set_facts(facts.clone());
        ctx.set_facts(RequestFacts {
            model: None,
            stream: false,
            n: 2,
            tools: None,
            usage_injection: None,
        });
        assert_eq!(ctx.facts(), Some(&facts), "the first write wins");
    }
}
