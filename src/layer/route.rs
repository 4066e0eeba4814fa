//! Only the engine's API paths are forwarded; anything else gets 404 without touching the
//! upstream (the admin routes in particular are never reachable on the public port).

use std::sync::Arc;

use http::{Request, Response};
use tower::{Layer, Service};

use super::{reject, Around, ResponseFuture, Wrapped};
use crate::body::ProxyBody;
use crate::error::ProxyError;

/// Configured path rules: an entry ending in `/` matches by prefix, others exactly.
#[derive(Debug, Clone)]
pub struct RouteLayer {
    paths: Arc<[String]>,
}

impl RouteLayer {
    pub fn new(paths: &[String]) -> Self {
        Self {
            paths: paths.into(),
        }
    }

    pub fn allows(&self, path: &str) -> bool {
        self.paths.iter().any(|p| {
            if p.ends_with('/') {
                path.starts_with(p.as_str())
            } else {
                path == p
            }
        })
    }
}

impl<S> Layer<S> for RouteLayer {
    type Service = Route<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(self.clone(), inner)
    }
}

pub type Route<S> = Wrapped<RouteLayer, S>;

impl<S, B> Around<S, B> for RouteLayer
where
    S: Service<
        Request<B>,
        Response = Response<ProxyBody>,
        Error = ProxyError,
        Future = ResponseFuture,
    >,
{
    type InnerBody = B;

    fn around(&self, inner: &mut S, req: Request<B>) -> ResponseFuture {
        if !self.allows(req.uri().path()) {
            let path = req.uri().path().to_string();
            return reject(ProxyError::NotFound { path });
        }
        inner.call(req) // already the boxed future: passed on, not boxed again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let paths: Vec<String> = ["/v1/", "/health", "/tokenize"]
            .into_iter()
            .map(String::from)
            .collect();
        let r = RouteLayer::new(&paths);
        for (path, ok) in [
            ("/v1/chat/completions", true),
            ("/v1/models", true),
            ("/v1", false),
            ("/health", true),
            ("/healthz", false),
            ("/tokenize", true),
            ("/metrics", false),
            ("/", false),
        ] {
            assert_eq!(r.allows(path), ok, "{path}");
        }
    }
}
