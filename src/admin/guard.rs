//! Who may read what the admin port reveals. With `admin.token_sha256` set, every path but
//! the probes (`/healthz`, `/readyz`) and, unless `admin.metrics_public = false`, `/metrics`
//! needs the token: `Authorization: Bearer <token>`, or HTTP Basic with the token as the
//! password (any user name), which is what a browser sends after its own sign-in prompt, so
//! the live page works with nothing stored by the page. The presented token is hashed and its
//! digest compared with the configured one in constant time (`subtle`). Pure: headers in,
//! verdict out.

use base64::Engine as _;
use http::{header, HeaderMap};
use subtle::ConstantTimeEq;

use crate::auth::{digest_of, Digest};
use crate::config::AdminConfig;

/// The realm of the 401's challenges (what a browser's prompt shows).
pub const REALM: &str = "goodput-proxy admin";

/// Paths every caller may read: the probes (a kubelet has no token).
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// Whether `path` needs the token under `config` (never without one configured).
pub fn needs_token(config: &AdminConfig, path: &str) -> bool {
    config.token.is_some()
        && !PROBES.contains(&path)
        && !(path == "/metrics" && config.metrics_public)
}

/// Whether the request presents the configured token (true when none is configured).
pub fn allowed(config: &AdminConfig, headers: &HeaderMap) -> bool {
    let Some(want) = &config.token else {
        return true;
    };
    presented(headers).is_some_and(|t| matches(want, &t))
}

fn matches(want: &Digest, token: &[u8]) -> bool {
    bool::from(digest_of(token).ct_eq(want))
}

/// The token of an `Authorization` header: `Bearer <token>`, or `Basic base64(user:token)`.
fn presented(headers: &HeaderMap) -> Option<Vec<u8>> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = split_scheme(value)?;
    if scheme.eq_ignore_ascii_case(b"bearer") {
        Some(rest.to_vec())
    } else if scheme.eq_ignore_ascii_case(b"basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()?;
        let colon = decoded.iter().position(|&b| b == b':')?;
        Some(decoded[colon + 1..].to_vec())
    } else {
        None
    }
}

fn split_scheme(v: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = v.iter().position(|&b| b == b' ')?;
    let rest = v[space..].trim_ascii();
    (!rest.is_empty()).then_some((&v[..space], rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn config(token: Option<&str>, metrics_public: bool) -> AdminConfig {
        AdminConfig {
            token: token.map(|t| digest_of(t.as_bytes())),
            metrics_public,
            ..AdminConfig::default()
        }
    }

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    fn basic(user_and_token: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_and_token)
        )
    }

    #[test]
    fn which_paths_need_the_token() {
        let on = config(Some("s3cret"), true);
        let strict = config(Some("s3cret"), false);
        let off = config(None, false);
        // (path, needs it with a token and public metrics, ... with private metrics)
        let cases = [
            ("/healthz", false, false),
            ("/readyz", false, false),
            ("/metrics", false, true),
            ("/stats", true, true),
            ("/trace/x", true, true),
            ("/", true, true),
            ("/dashboard.json", true, true),
            ("/nope", true, true),
        ];
        for (path, public, private) in cases {
            assert_eq!(needs_token(&on, path), public, "{path}");
            assert_eq!(needs_token(&strict, path), private, "{path}");
            assert!(!needs_token(&off, path), "{path}: no token configured");
        }
    }

    #[test]
    fn tokens_are_read_from_bearer_and_basic() {
        let c = config(Some("s3cret"), true);
        let b = basic("admin:s3cret");
        let any_user = basic(":s3cret");
        let wrong = basic("admin:nope");
        let no_colon = basic("s3cret");
        let cases: [(Option<&str>, bool); 11] = [
            (None, false),
            (Some("Bearer s3cret"), true),
            (Some("bearer s3cret"), true),
            (Some("Bearer  s3cret "), true),
            (Some("Bearer s3cre"), false),
            (Some("Bearer "), false),
            (Some("s3cret"), false),
            (Some(&b), true),
            (Some(&any_user), true),
            (Some(&wrong), false),
            (Some(&no_colon), false),
        ];
        for (auth, ok) in cases {
            assert_eq!(allowed(&c, &headers(auth)), ok, "{auth:?}");
        }
        assert!(allowed(&config(None, true), &headers(None)));
    }
}
