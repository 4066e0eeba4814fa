//! Upstream: the engine replicas, the pooled client, balancing, forwarding and header hygiene.

pub mod balance;
pub mod deadline;
pub mod forward;
pub mod headers;
pub mod health;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::Uri;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::UpstreamConfig;

pub use forward::Forward;

/// The pooled HTTP/1.1 client shared by every request and the health prober.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// Checks an upstream base URL: `http://host:port` with an optional path prefix, no query.
pub fn parse_base_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => {}
        Some(s) if *s == Scheme::HTTPS => {
            return Err("https upstreams are not supported yet; use http://".into())
        }
        _ => return Err("scheme must be http://".into()),
    }
    if uri.authority().is_none() {
        return Err("missing host".into());
    }
    if uri.query().is_some() {
        return Err("a query string is not allowed".into());
    }
    Ok(uri)
}

/// One engine replica and what the balancer and readiness need to know about it.
#[derive(Debug)]
pub struct Replica {
    /// The configured URL, as written (used in logs and as the `upstream` label).
    pub url: Arc<str>,
    authority: Authority,
    /// Path prefix of the base URL without the trailing `/` ("" for none).
    prefix: String,
    in_flight: AtomicUsize,
    healthy: AtomicBool,
    /// The engine's waiting queue from its latest `/metrics` scrape (0 when unknown or stale);
    /// written by the engine scraper, read by the balancer: one atomic load per pick.
    engine_queue: AtomicUsize,
}

impl Replica {
    pub fn new(url: &str) -> Result<Replica, String> {
        let uri = parse_base_url(url)?;
        let authority = uri.authority().cloned().ok_or("missing host")?;
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Replica {
            url: Arc::from(url.trim_end_matches('/')),
            authority,
            prefix,
            in_flight: AtomicUsize::new(0),
            healthy: AtomicBool::new(false),
            engine_queue: AtomicUsize::new(0),
        })
    }

    /// The upstream URI for a client request's path and query.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.prefix, path_and_query))
            .build()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn set_healthy(&self, v: bool) {
        self.healthy.store(v, Ordering::Relaxed);
    }

    /// Requests waiting in the engine's own queue, as last scraped (0 when unknown).
    pub fn engine_queue(&self) -> usize {
        self.engine_queue.load(Ordering::Relaxed)
    }

    pub fn set_engine_queue(&self, waiting: usize) {
        self.engine_queue.store(waiting, Ordering::Relaxed);
    }

    /// What the balancer compares (see `balance::score`).
    pub fn load(&self) -> balance::Load {
        balance::Load {
            in_flight: self.in_flight(),
            engine_queue: self.engine_queue(),
            healthy: self.is_healthy(),
        }
    }

    /// Counts a request against this replica until the returned guard drops (at body end).
    pub fn start(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(self.clone())
    }
}

/// Decrements the replica's in-flight count when dropped.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Replica>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The set of replicas behind the proxy plus the client that reaches them.
#[derive(Debug)]
pub struct Upstreams {
    pub replicas: Vec<Arc<Replica>>,
    pub client: UpstreamClient,
    pub config: UpstreamConfig,
}

impl Upstreams {
    /// Builds replicas from `config.urls` (already validated) and the pooled client.
    pub fn new(config: &UpstreamConfig) -> Result<Upstreams, String> {
        let replicas = config
            .urls
            .iter()
            .map(|u| Replica::new(u).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Upstreams {
            replicas,
            client: build_client(config),
            config: config.clone(),
        })
    }

    /// True when at least one replica answered its last health probe.
    pub fn any_healthy(&self) -> bool {
        self.replicas.iter().any(|r| r.is_healthy())
    }
}

fn build_client(config: &UpstreamConfig) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(config.connect_timeout()));
    connector.set_nodelay(true);
    // Absolute-form URIs carry the scheme; the connector must accept it as-is.
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(config.pool_idle_timeout())
        .pool_max_idle_per_host(config.pool_max_idle_per_host)
        .build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        for (url, ok) in [
            ("http://127.0.0.1:8000", true),
            ("http://engine:8000/", true),
            ("http://engine/prefix", true),
            ("https://engine", false),
            ("engine:8000", false),
            ("http://e/?a=b", false),
        ] {
            assert_eq!(parse_base_url(url).is_ok(), ok, "{url}");
        }
    }

    #[test]
    fn uri_for_keeps_prefix_path_and_query() {
        let r = Replica::new("http://e:1/base/").unwrap();
        assert_eq!(
            r.uri_for("/v1/models?x=1").unwrap().to_string(),
            "http://e:1/base/v1/models?x=1"
        );
        let r = Replica::new("http://e:1").unwrap();
        assert_eq!(
            r.uri_for("/health").unwrap().to_string(),
            "http://e:1/health"
        );
    }

    #[test]
    fn in_flight_guard_counts() {
        let r = Arc::new(Replica::new("http://e:1").unwrap());
        let g1 = r.start();
        let g2 = r.start();
        assert_eq!(r.in_flight(), 2);
        drop(g1);
        drop(g2);
        assert_eq!(r.in_flight(), 0);
    }
}
