//! API keys (`[auth]`): a request without a valid key gets 401 at once, before its body is
//! read, before any limit or upstream is touched. A valid key's tenant goes into the request
//! context (records, metrics, tenant limits); the key itself is removed from the request, so
//! it never reaches an upstream (`upstream.api_key`, when set, is sent instead by forwarding).
//!
//! Where a key is taken from: `Authorization: Bearer <key>`, else `x-api-key: <key>`. Never
//! from the query string: a request with a key-like query parameter is refused whatever its
//! headers say (URLs end up in access logs, proxies' logs, browser histories), and the
//! parameter's value is neither logged nor forwarded.
//!
//! Inside measure (a 401 is recorded `rejected`, tenant `none`), outside the limits (a
//! refused request takes no permit) and the route (a client without a key learns nothing of
//! which paths exist).

use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, AUTHORIZATION};
use http::{Request, Response, Uri};
use tower::{Layer, Service};

use super::{reject, Around, ResponseFuture, Wrapped};
use crate::auth::Auth;
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::error::{AuthFailure, ProxyError};

pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Arc<Auth>,
}

impl AuthLayer {
    pub fn new(auth: Arc<Auth>) -> Self {
        Self { auth }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Authenticate<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(self.clone(), inner)
    }
}

pub type Authenticate<S> = Wrapped<AuthLayer, S>;

impl<S, B> Around<S, B> for AuthLayer
where
    S: Service<
        Request<B>,
        Response = Response<ProxyBody>,
        Error = ProxyError,
        Future = ResponseFuture,
    >,
{
    type InnerBody = B;

    fn around(&self, inner: &mut S, mut req: Request<B>) -> ResponseFuture {
        let tenant = match presented_key(req.uri(), req.headers()) {
            Ok(key) => self.auth.lookup(key),
            Err(failure) => return reject(ProxyError::Unauthorized(failure)),
        };
        let Some(tenant) = tenant else {
            return reject(ProxyError::Unauthorized(AuthFailure::Invalid));
        };
        let h = req.headers_mut();
        h.remove(AUTHORIZATION);
        h.remove(X_API_KEY);
        if let Some(ctx) = RequestContext::of(req.extensions()) {
            ctx.set_tenant(tenant);
        }
        inner.call(req)
    }
}

/// The key a request presents, or why it presents none that could be valid. Pure.
pub fn presented_key<'a>(uri: &Uri, headers: &'a HeaderMap) -> Result<&'a [u8], AuthFailure> {
    if uri.query().is_some_and(has_key_param) {
        return Err(AuthFailure::InQuery);
    }
    let mut auth = headers.get_all(AUTHORIZATION).iter();
    if let Some(value) = auth.next() {
        if auth.next().is_some() {
            return Err(AuthFailure::Malformed);
        }
        return bearer(value.as_bytes()).ok_or(AuthFailure::Malformed);
    }
    let mut api = headers.get_all(X_API_KEY).iter();
    match (api.next(), api.next()) {
        (Some(v), None) if !v.is_empty() => Ok(v.as_bytes()),
        (None, _) => Err(AuthFailure::Missing),
        _ => Err(AuthFailure::Malformed),
    }
}

/// The credentials of `Bearer <token>` (scheme case-insensitive, RFC 9110 11.1).
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at(v.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Query parameter names that carry a key in some client or API (compared lowercased,
/// percent-decoded, with `_` and `-` dropped: `api_key`, `API-Key`, `api%5Fkey` all match).
const KEY_PARAMS: [&str; 7] = [
    "apikey",
    "key",
    "xapikey",
    "token",
    "accesstoken",
    "auth",
    "authorization",
];

fn has_key_param(query: &str) -> bool {
    query.split('&').any(|pair| {
        let name = pair.split('=').next().unwrap_or("");
        let norm = normalize(name);
        KEY_PARAMS.contains(&norm.as_str())
    })
}

/// Percent-decodes, lowercases and drops `_`, `-` (and `+`, a space in a form).
fn normalize(name: &str) -> String {
    let b = name.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let mut c = b[i];
        if c == b'%'
            && i + 2 < b.len()
            && b[i + 1].is_ascii_hexdigit()
            && b[i + 2].is_ascii_hexdigit()
        {
            let digit = |d: u8| (d as char).to_digit(16).unwrap_or(0) as u8;
            c = digit(b[i + 1]) << 4 | digit(b[i + 2]);
            i += 2;
        }
        i += 1;
        if !matches!(c, b'_' | b'-' | b'+') {
            out.push(c.to_ascii_lowercase() as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn key(uri: &str, pairs: &[(&str, &str)]) -> Result<String, AuthFailure> {
        let h = headers(pairs);
        presented_key(&uri.parse().unwrap(), &h).map(|k| String::from_utf8_lossy(k).into())
    }

    #[test]
    fn where_a_key_is_taken_from() {
        use AuthFailure::*;
        let chat = "/v1/chat/completions";
        for (uri, pairs, want) in [
            (chat, &[("authorization", "Bearer sk-1")][..], Ok("sk-1")),
            (chat, &[("authorization", "bearer  sk-1 ")], Ok("sk-1")),
            (chat, &[("authorization", "BEARER sk-1")], Ok("sk-1")),
            (chat, &[("x-api-key", "sk-2")], Ok("sk-2")),
            // Authorization wins over x-api-key.
            (
                chat,
                &[("x-api-key", "sk-2"), ("authorization", "Bearer sk-1")],
                Ok("sk-1"),
            ),
            (chat, &[], Err(Missing)),
            (
                chat,
                &[("authorization", "Basic dXNlcjpwdw==")],
                Err(Malformed),
            ),
            (chat, &[("authorization", "Bearer")], Err(Malformed)),
            (chat, &[("authorization", "Bearer ")], Err(Malformed)),
            (chat, &[("authorization", "sk-1")], Err(Malformed)),
            (
                chat,
                &[("authorization", "Bearer a"), ("authorization", "Bearer b")],
                Err(Malformed),
            ),
            (chat, &[("x-api-key", "")], Err(Malformed)),
            (
                chat,
                &[("x-api-key", "a"), ("x-api-key", "b")],
                Err(Malformed),
            ),
            // A key in the query string is refused even beside a good header.
            (
                "/v1/models?api_key=sk-1",
                &[("authorization", "Bearer sk-1")],
                Err(InQuery),
            ),
            ("/v1/models?x=1&API-Key=sk-1", &[], Err(InQuery)),
            ("/v1/models?api%5Fkey=sk-1", &[], Err(InQuery)),
            ("/v1/models?key", &[], Err(InQuery)),
            ("/v1/models?access_token=t", &[], Err(InQuery)),
            // Other parameters are fine.
            (
                "/v1/models?keys_only=1&monkey=2",
                &[("x-api-key", "sk-2")],
                Ok("sk-2"),
            ),
        ] {
            assert_eq!(key(uri, pairs), want.map(String::from), "{uri} {pairs:?}");
        }
    }

    #[test]
    fn normalize_names() {
        for (raw, want) in [
            ("api_key", "apikey"),
            ("API-Key", "apikey"),
            ("api%5Fkey", "apikey"),
            ("api%5fkey", "apikey"),
            ("a%zz", "a%zz"),
            ("%", "%"),
            ("%4", "%4"),
            ("%41", "a"),
        ] {
            assert_eq!(normalize(raw), want, "{raw}");
        }
    }
}
