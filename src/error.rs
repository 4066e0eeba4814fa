//! Typed errors and their one mapping to status + OpenAI-style JSON.
//!
//! Every response the proxy makes up itself (as opposed to forwarding) comes out of
//! [`ProxyError::into_response`], so clients see the same shape as a vLLM error:
//! `{"error":{"message","type","param","code"}}`.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::auth::tenant::Refusal;
use crate::body::{BoxError, ProxyBody};
use goodput_measure::outcome::Outcome;

/// Why a request's API key was not accepted. The messages never include the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// Neither `Authorization` nor `x-api-key`.
    Missing,
    /// `Authorization` without the Bearer scheme, or sent twice.
    Malformed,
    /// A key that is not configured.
    Invalid,
    /// A key-like query parameter: refused whatever the headers say (URLs end up in logs).
    InQuery,
}

impl AuthFailure {
    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => {
                "You didn't provide an API key. Send it in an Authorization header using \
                 Bearer auth (Authorization: Bearer YOUR_KEY) or in an x-api-key header."
            }
            AuthFailure::Malformed => {
                "The Authorization header must be Bearer auth (Authorization: Bearer YOUR_KEY)."
            }
            AuthFailure::Invalid => "Incorrect API key provided.",
            AuthFailure::InQuery => {
                "API keys are not accepted in the query string; send the key in an \
                 Authorization header using Bearer auth."
            }
        }
    }

    /// For logs and the `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Invalid => "invalid",
            AuthFailure::InQuery => "in_query",
        }
    }
}

/// Why the proxy answered a request itself. The variant says which side failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Path not among the forwarded ones; the upstream was not touched.
    #[error("no route for {path}")]
    NotFound { path: String },
    /// Request body over `server.max_body_bytes`.
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    /// The client paused its upload longer than the body idle timeout.
    #[error("request body not received: no data for {ms} ms")]
    BodyTimeout { ms: u64 },
    /// The client's body could not be read (it went away or sent garbage).
    #[error("reading the request body failed: {0}")]
    ClientBody(#[source] BoxError),
    /// No valid API key while `[auth]` is on; answered before the body is read.
    #[error("{}", .0.message())]
    Unauthorized(AuthFailure),
    /// Over one of the tenant's limits (`[auth.tenants.NAME]`).
    #[error("{}", rate_limit_message(tenant, refusal, *retry_after_s))]
    RateLimited {
        tenant: std::sync::Arc<str>,
        refusal: Refusal,
        retry_after_s: u64,
    },
    /// Over `server.max_in_flight`.
    #[error("too many requests in flight (limit {limit})")]
    Overloaded { limit: usize, retry_after_s: u64 },
    /// No replica is configured or every attempt failed to connect.
    #[error("upstream unreachable: {source}")]
    UpstreamConnect {
        #[source]
        source: BoxError,
    },
    /// The upstream failed after the request was sent (reset, protocol error).
    #[error("upstream request failed: {source}")]
    Upstream {
        #[source]
        source: BoxError,
    },
    /// No response head within `upstream.first_byte_timeout_ms`.
    #[error("upstream sent no response within {ms} ms")]
    FirstByteTimeout { ms: u64 },
}

impl ProxyError {
    /// The outcome of a request that ended in this error (DESIGN.md "Outcome"): the one
    /// classification of the proxy's own errors.
    pub fn outcome(&self) -> Outcome {
        match self {
            ProxyError::UpstreamConnect { .. } | ProxyError::Upstream { .. } => {
                Outcome::UpstreamError
            }
            ProxyError::FirstByteTimeout { .. } => Outcome::Timeout,
            // The request body could not be read: the client went away (or broke its upload).
            ProxyError::ClientBody(_) => Outcome::ClientAbort,
            ProxyError::NotFound { .. }
            | ProxyError::Unauthorized(_)
            | ProxyError::RateLimited { .. }
            | ProxyError::BodyTooLarge { .. }
            // A stalled upload is the client's doing, answered by the proxy (408).
            | ProxyError::BodyTimeout { .. }
            | ProxyError::Overloaded { .. } => Outcome::Rejected,
        }
    }

    /// The proxy answered the request itself, as opposed to an error from forwarding it (a
    /// non-generation path is recorded only then: it never reached an engine).
    pub fn answered_by_proxy(&self) -> bool {
        !matches!(
            self,
            ProxyError::UpstreamConnect { .. }
                | ProxyError::Upstream { .. }
                | ProxyError::FirstByteTimeout { .. }
        )
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NotFound { .. } => StatusCode::NOT_FOUND,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::ClientBody(_) => StatusCode::BAD_REQUEST,
            ProxyError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ProxyError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::UpstreamConnect { .. } | ProxyError::Upstream { .. } => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::FirstByteTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The OpenAI error `type` string: vLLM's names, except for 401 and 429, which take
    /// OpenAI's own (`invalid_request_error`; `requests` / `tokens`), as OpenAI clients match
    /// on them.
    fn error_type(&self) -> &'static str {
        match self {
            ProxyError::Unauthorized(_) => "invalid_request_error",
            ProxyError::RateLimited { refusal, .. } => match refusal {
                Refusal::InFlight { .. } => "requests",
                Refusal::Tokens { .. } => "tokens",
            },
            ProxyError::NotFound { .. } => "NotFoundError",
            ProxyError::BodyTooLarge { .. }
            | ProxyError::BodyTimeout { .. }
            | ProxyError::ClientBody(_) => "BadRequestError",
            ProxyError::Overloaded { .. } => "ServiceUnavailableError",
            ProxyError::UpstreamConnect { .. } | ProxyError::Upstream { .. } => "BadGatewayError",
            ProxyError::FirstByteTimeout { .. } => "GatewayTimeoutError",
        }
    }

    /// The OpenAI error `code`: the status, as vLLM sends it, except OpenAI's own codes for
    /// 401 (`invalid_api_key`) and 429 (`rate_limit_exceeded`).
    fn error_code(&self) -> serde_json::Value {
        match self {
            ProxyError::Unauthorized(_) => "invalid_api_key".into(),
            ProxyError::RateLimited { .. } => "rate_limit_exceeded".into(),
            _ => self.status().as_u16().into(),
        }
    }

    /// The one mapping from a proxy error to the response the client sees.
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = self.status();
        let body = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.error_type(),
                "param": serde_json::Value::Null,
                "code": self.error_code(),
            }
        });
        let bytes = Bytes::from(body.to_string());
        let mut resp = Response::new(
            Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match self {
            ProxyError::Overloaded { retry_after_s, .. }
            | ProxyError::RateLimited { retry_after_s, .. } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            }
            // Answered before the body was read: the rest of the upload cannot be taken as the
            // next request, so the connection closes (HTTP/1.1; HTTP/2 ends the stream).
            ProxyError::Unauthorized(_) => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            // The rest of the upload may still arrive: the connection cannot be reused.
            // (HTTP/2 drops connection headers; the stream ends with the response there.)
            ProxyError::BodyTimeout { .. } => {
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        resp
    }
}

fn rate_limit_message(tenant: &str, refusal: &Refusal, retry_after_s: u64) -> String {
    match refusal {
        Refusal::InFlight { limit } => format!(
            "Rate limit reached for tenant {tenant} on requests in flight: Limit {limit}. \
             Please try again in {retry_after_s}s."
        ),
        Refusal::Tokens { limit, .. } => format!(
            "Rate limit reached for tenant {tenant} on tokens per min: Limit {limit} / min. \
             Please try again in {retry_after_s}s."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_json(resp: Response<ProxyBody>) -> serde_json::Value {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn every_error_is_an_openai_error_with_matching_code() {
        let cases = [
            (ProxyError::NotFound { path: "/x".into() }, 404),
            (ProxyError::BodyTooLarge { limit: 1 }, 413),
            (ProxyError::BodyTimeout { ms: 1 }, 408),
            (
                ProxyError::Overloaded {
                    limit: 1,
                    retry_after_s: 2,
                },
                503,
            ),
            (
                ProxyError::UpstreamConnect {
                    source: "refused".into(),
                },
                502,
            ),
            (ProxyError::FirstByteTimeout { ms: 5 }, 504),
        ];
        for (err, code) in cases {
            let resp = err.into_response();
            assert_eq!(resp.status().as_u16(), code);
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
            let v = body_json(resp).await;
            let e = &v["error"];
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert!(e["type"].as_str().is_some());
            assert!(e["param"].is_null());
            assert_eq!(e["code"], code);
        }
    }

    #[tokio::test]
    async fn auth_and_rate_limit_errors_take_openai_codes() {
        let resp = ProxyError::Unauthorized(AuthFailure::Invalid).into_response();
        assert_eq!(resp.status(), 401);
        assert_eq!(resp.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let v = body_json(resp).await;
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["message"], "Incorrect API key provided.");
        let resp = ProxyError::RateLimited {
            tenant: "team-a".into(),
            refusal: Refusal::Tokens {
                limit: 600,
                retry_after_s: 7,
            },
            retry_after_s: 7,
        }
        .into_response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "7");
        let v = body_json(resp).await;
        assert_eq!(v["error"]["type"], "tokens");
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.contains("team-a") && m.contains("600 / min") && m.contains("7s"),
            "{m}"
        );
    }

    #[test]
    fn every_error_has_one_outcome() {
        for (e, want, by_proxy) in [
            (
                ProxyError::NotFound { path: "/x".into() },
                Outcome::Rejected,
                true,
            ),
            (
                ProxyError::BodyTooLarge { limit: 1 },
                Outcome::Rejected,
                true,
            ),
            (ProxyError::BodyTimeout { ms: 1 }, Outcome::Rejected, true),
            (
                ProxyError::Overloaded {
                    limit: 1,
                    retry_after_s: 1,
                },
                Outcome::Rejected,
                true,
            ),
            (
                ProxyError::ClientBody("gone".into()),
                Outcome::ClientAbort,
                true,
            ),
            (
                ProxyError::Unauthorized(AuthFailure::Missing),
                Outcome::Rejected,
                true,
            ),
            (
                ProxyError::RateLimited {
                    tenant: "a".into(),
                    refusal: Refusal::InFlight { limit: 1 },
                    retry_after_s: 1,
                },
                Outcome::Rejected,
                true,
            ),
            (
                ProxyError::UpstreamConnect {
                    source: "refused".into(),
                },
                Outcome::UpstreamError,
                false,
            ),
            (
                ProxyError::Upstream {
                    source: "reset".into(),
                },
                Outcome::UpstreamError,
                false,
            ),
            (
                ProxyError::FirstByteTimeout { ms: 1 },
                Outcome::Timeout,
                false,
            ),
        ] {
            assert_eq!(
                (e.outcome(), e.answered_by_proxy()),
                (want, by_proxy),
                "{e}"
            );
        }
    }

    #[test]
    fn overload_sets_retry_after() {
        let resp = ProxyError::Overloaded {
            limit: 1,
            retry_after_s: 3,
        }
        .into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
    }
}
