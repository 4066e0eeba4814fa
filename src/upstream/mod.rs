//! Upstream: the engine replicas, the pooled client, balancing, forwarding and header hygiene.

pub mod deadline;
pub mod forward;
pub mod goodput;
pub mod headers;
pub mod health;
pub mod hold;
pub mod lane;
pub mod prefix;
pub mod release;
pub mod shape;
pub mod strategy;
pub mod tls;
pub mod usage;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::HeaderValue;
use http::Uri;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tower::util::BoxCloneSyncService;

use crate::config::{EngineKind, UpstreamConfig};
use crate::metrics::Registrar;
use prometheus::Registry;
use usage::Unasked;

pub use forward::Forward;

/// The pooled HTTP/1.1 client shared by every request and the health prober.
pub type UpstreamClient = Client<SharedConnector, Full<Bytes>>;

/// How the pooled client opens a connection: hyper-util's `HttpConnector` (see
/// [`http_connector`]), boxed so that a test can wrap it ([`Upstreams::with_connector`]), e.g.
/// to refuse one connect. One allocation per new connection; pooled requests never touch it.
pub type UpstreamConnector = BoxCloneSyncService<
    Uri,
    TokioIo<tls::UpstreamStream>,
    Box<dyn std::error::Error + Send + Sync>,
>;

/// The client's [`UpstreamConnector`], shared: hyper-util's client clones its connector for
/// every request (once with the client, once for the connect it keeps ready in case the pool
/// has no idle connection), and a boxed service's clone is an allocation; this one's is a
/// reference count. The boxed connector is cloned only to open a connection.
#[derive(Clone, Debug)]
pub struct SharedConnector(Arc<UpstreamConnector>);

impl tower::Service<Uri> for SharedConnector {
    type Response = TokioIo<tls::UpstreamStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // The clone made in `call` waits for the boxed connector's readiness itself.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        use tower::ServiceExt;
        Box::pin(UpstreamConnector::clone(&self.0).oneshot(uri))
    }
}

pub use crate::config::parse_base_url;

/// One engine replica and what the balancer and readiness need to know about it.
#[derive(Debug)]
pub struct Replica {
    /// The configured URL, as written (used in logs and as the `upstream` label).
    pub url: Arc<str>,
    authority: Authority,
    /// `http` or `https`, as configured.
    scheme: Scheme,
    /// Path prefix of the base URL without the trailing `/` ("" for none).
    prefix: String,
    /// The `Host` header the pooled client writes for this replica, made once (see
    /// [`host_header`]).
    pub host: Option<HeaderValue>,
    in_flight: AtomicUsize,
    healthy: AtomicBool,
    /// The engine's canonical signals from its latest `/metrics` scrape; written by the engine
    /// scraper, read by the balancer: a few atomic loads per pick.
    engine: EngineCell,
    /// The engine it runs, configured or told from its `/metrics` (0: not known yet, else the
    /// index in [`EngineKind::ALL`] + 1): what the proxy may change in its requests depends on
    /// how that engine streams (`upstream::usage`).
    kind: AtomicU8,
    /// Whether its engine adds usage unasked (the index in [`Unasked::ALL`]).
    usage_unasked: AtomicU8,
    /// The balancer's view: identity in the prefix index, tokens in flight, what clients got.
    pub route: RouteState,
}

/// What the balancer keeps per replica (see `strategy/`).
#[derive(Debug)]
pub struct RouteState {
    /// Identity in the prefix index: unique in this process.
    pub id: prefix::ReplicaId,
    /// Estimated tokens (prompt + output) of this proxy's requests in flight there.
    tokens: AtomicU64,
    /// Estimated tokens of every request ever sent there (a counter: its rate is the token
    /// load offered to the replica, which keeps rising past saturation, unlike its output).
    sent: AtomicU64,
    /// The work still to do there, by kind: estimated prompt tokens of requests without output
    /// yet (waiting or in prefill), and output tokens still to come (asked for, less those
    /// served). See [`TokenProgress`].
    prefill: AtomicU64,
    decode: AtomicU64,
    /// Recent SLO attainment, TTFT, TPOT of its requests.
    pub stats: goodput::ReplicaStats,
}

impl RouteState {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        RouteState {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            tokens: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            prefill: AtomicU64::new(0),
            decode: AtomicU64::new(0),
            stats: goodput::ReplicaStats::default(),
        }
    }

    #[inline]
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// Estimated tokens of all requests sent there so far.
    pub fn tokens_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Prompt tokens still to prefill and output tokens still to decode, of this proxy's
    /// requests in flight there.
    pub fn tokens_pending(&self) -> TokensPending {
        TokensPending {
            prefill: self.prefill.load(Ordering::Relaxed),
            decode: self.decode.load(Ordering::Relaxed),
        }
    }
}

/// A replica's work in flight by kind, in estimated tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokensPending {
    /// Prompt tokens of requests that have had no output yet.
    pub prefill: u64,
    /// Output tokens still to come (asked for, less those served).
    pub decode: u64,
}

/// One replica's engine load as the engine itself reports it, the same whatever the engine
/// (`engine::signals` maps each engine's own families onto these). `None`: unknown (no good
/// scrape yet, the last one failed, or the engine has no such family).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests waiting in the engine's queue.
    pub waiting: Option<f64>,
    /// Requests in the engine's running batch.
    pub running: Option<f64>,
    /// KV-cache use, 0..1 (the fullest rank).
    pub kv_cache_usage: Option<f64>,
}

impl EngineLoad {
    /// The queue the balancer adds to in-flight: whole requests, 0 when unknown.
    pub fn queue(&self) -> usize {
        self.waiting.map_or(0, |w| w.max(0.0).round() as usize)
    }
}

/// [`EngineLoad`] in atomics (f64 bits, NaN for `None`): the scraper writes whole loads, the
/// balancer reads them without a lock. A read between two writes may mix fields of two
/// scrapes, which a balancer tolerates (each field is a reading of its own).
#[derive(Debug)]
struct EngineCell([AtomicU64; 3]);

impl EngineCell {
    fn new() -> Self {
        let none = || AtomicU64::new(f64::NAN.to_bits());
        EngineCell([none(), none(), none()])
    }

    #[inline]
    fn get(&self, i: usize) -> Option<f64> {
        let v = f64::from_bits(self.0[i].load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }

    fn load(&self) -> EngineLoad {
        EngineLoad {
            waiting: self.get(0),
            running: self.get(1),
            kv_cache_usage: self.get(2),
        }
    }

    fn store(&self, l: EngineLoad) {
        for (cell, v) in self.0.iter().zip([l.waiting, l.running, l.kv_cache_usage]) {
            cell.store(v.unwrap_or(f64::NAN).to_bits(), Ordering::Relaxed);
        }
    }
}

/// The `Host` header hyper-util's pooled client writes on an HTTP/1 request to `scheme://
/// authority` when the request has none: the host, and `:port` unless the port is the
/// scheme's default (80, or 443 for `https`/`wss`), the port as written. The client formats it
/// for every request; forwarding sets it from here instead (the same bytes, in the same place:
/// last), so the client finds it present.
fn host_header(scheme: &Scheme, authority: &Authority) -> Option<HeaderValue> {
    let secure = matches!(scheme.as_str(), "https" | "wss");
    let default_port = matches!(
        (authority.port_u16(), secure),
        (Some(443), true) | (Some(80), false)
    );
    let host = authority.host();
    let value = match authority.port() {
        Some(port) if !default_port => format!("{host}:{port}"),
        _ => host.to_string(),
    };
    HeaderValue::from_str(&value).ok()
}

impl Replica {
    pub fn new(url: &str) -> Result<Replica, String> {
        let uri = parse_base_url(url)?;
        let authority = uri.authority().cloned().ok_or("missing host")?;
        let prefix = uri.path().trim_end_matches('/').to_string();
        let scheme = uri.scheme().cloned().unwrap_or(Scheme::HTTP);
        Ok(Replica {
            url: Arc::from(url.trim_end_matches('/')),
            host: host_header(&scheme, &authority),
            scheme,
            authority,
            prefix,
            in_flight: AtomicUsize::new(0),
            healthy: AtomicBool::new(false),
            engine: EngineCell::new(),
            kind: AtomicU8::new(0),
            usage_unasked: AtomicU8::new(0),
            route: RouteState::new(),
        })
    }

    /// The upstream URI for a client request's path and query.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.prefix, path_and_query))
            .build()
    }

    /// [`Replica::uri_for`] a client request's path and query: without a path prefix the
    /// client's is taken as it is (a reference count), not formatted and parsed again.
    pub fn request_uri(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        match path_and_query {
            Some(pq) if self.prefix.is_empty() => {
                let mut parts = http::uri::Parts::default();
                parts.scheme = Some(self.scheme.clone());
                parts.authority = Some(self.authority.clone());
                parts.path_and_query = Some(pq.clone());
                Ok(Uri::from_parts(parts)?)
            }
            _ => self.uri_for(path_and_query.map_or("/", PathAndQuery::as_str)),
        }
    }

    #[inline]
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn set_healthy(&self, v: bool) {
        self.healthy.store(v, Ordering::Relaxed);
    }

    /// The engine's canonical signals as last scraped (all `None` when unknown).
    pub fn engine_load(&self) -> EngineLoad {
        self.engine.load()
    }

    /// Set by the engine scraper after each scrape (`EngineLoad::default()` when it failed).
    pub fn set_engine_load(&self, load: EngineLoad) {
        self.engine.store(load);
    }

    /// The engine this replica runs, when configured or detected.
    pub fn engine_kind(&self) -> Option<EngineKind> {
        let i = self.kind.load(Ordering::Relaxed);
        EngineKind::ALL.get(usize::from(i).checked_sub(1)?).copied()
    }

    /// Set from the configuration, and by the engine scraper from each good page.
    pub fn set_engine_kind(&self, kind: EngineKind) {
        let i = EngineKind::ALL
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| i + 1);
        self.kind.store(i as u8, Ordering::Relaxed);
    }

    /// Whether its engine adds usage to streams unasked, as configured or learned.
    pub fn usage_unasked(&self) -> Unasked {
        let i = usize::from(self.usage_unasked.load(Ordering::Relaxed));
        Unasked::ALL.get(i).copied().unwrap_or(Unasked::Unknown)
    }

    /// Set from the configuration ([`Unasked::Configured`]), or learned from a stream the
    /// proxy left alone; a configured answer is never replaced.
    pub fn set_usage_unasked(&self, v: Unasked) {
        let i = Unasked::ALL.iter().position(|u| *u == v).unwrap_or(0) as u8;
        let configured = Unasked::ALL
            .iter()
            .position(|u| *u == Unasked::Configured)
            .unwrap_or(0) as u8;
        let _ = self
            .usage_unasked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                (old != configured).then_some(i)
            });
    }

    /// Requests waiting in the engine's own queue, as last scraped (0 when unknown).
    pub fn engine_queue(&self) -> usize {
        self.engine_load().queue()
    }

    /// Counts a request against this replica until the returned guard drops (at body end).
    pub fn start(self: &Arc<Self>) -> InFlightGuard {
        self.start_tokens(0, 0)
    }

    /// As [`start`](Self::start), also counting the request's estimated `prompt` tokens and
    /// the `output` tokens it may ask for.
    pub fn start_tokens(self: &Arc<Self>, prompt: u64, output: u64) -> InFlightGuard {
        self.start_cached(prompt, output, 0)
    }

    /// As [`start_tokens`](Self::start_tokens), for a request whose first `cached` prompt
    /// tokens the engine is expected to hold: the balancer's load counts only the rest (what
    /// the engine must compute and store for it); the pending work and the tokens sent, read
    /// for autoscaling, count the whole prompt.
    pub fn start_cached(self: &Arc<Self>, prompt: u64, output: u64, cached: u64) -> InFlightGuard {
        let tokens = prompt.saturating_sub(cached) + output;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.route.tokens.fetch_add(tokens, Ordering::Relaxed);
        self.route
            .sent
            .fetch_add(prompt + output, Ordering::Relaxed);
        self.route.prefill.fetch_add(prompt, Ordering::Relaxed);
        self.route.decode.fetch_add(output, Ordering::Relaxed);
        InFlightGuard(Arc::new(TokenProgress {
            replica: self.clone(),
            tokens,
            output,
            prefill_left: AtomicU64::new(prompt),
            decode_left: AtomicU64::new(output),
            judged: AtomicBool::new(false),
        }))
    }

    /// The replica as the balancer sees it at `now` (taken for every replica on every choice:
    /// only the engine figures the balancer reads).
    #[inline]
    pub fn cand(&self, now: tokio::time::Instant) -> strategy::Cand {
        strategy::Cand {
            id: self.route.id,
            healthy: self.is_healthy(),
            in_flight: self.in_flight(),
            tokens: self.route.tokens(),
            waiting: self.engine.get(0),
            kv: self.engine.get(2),
            attainment: self.route.stats.attainment(now),
        }
    }
}

/// Decrements the replica's in-flight count (and tokens, and the work still pending) when
/// dropped.
#[derive(Debug)]
pub struct InFlightGuard(Arc<TokenProgress>);

impl InFlightGuard {
    /// The request's progress, for whoever sees its output (the recorder's body).
    pub fn progress(&self) -> Arc<TokenProgress> {
        self.0.clone()
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let p = &self.0;
        let route = &p.replica.route;
        p.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        route.tokens.fetch_sub(p.tokens, Ordering::Relaxed);
        route
            .prefill
            .fetch_sub(p.prefill_left.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        route
            .decode
            .fetch_sub(p.decode_left.swap(0, Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// One request's share of its replica's pending work. Its prompt tokens count as prefill
/// until its first output token; its output tokens count as decode until served (never more
/// than it asked for). What is left goes when the request ends. Each token leaves the
/// replica's counts exactly once: the request's own counts are taken with atomic swaps and
/// minimums, whoever (the body watching the output, or the end) gets there first.
#[derive(Debug)]
pub struct TokenProgress {
    replica: Arc<Replica>,
    /// Prompt + output, as counted in the balancer's `tokens`.
    tokens: u64,
    /// Output tokens asked for.
    output: u64,
    prefill_left: AtomicU64,
    decode_left: AtomicU64,
    /// Its verdict reached the replica's attainment before its end ([`goodput::Judging`]).
    judged: AtomicBool,
}

impl TokenProgress {
    /// What the client got of this stream so far already says it is not good: the replica's
    /// attainment hears it now, and not again at the end.
    pub fn judged_bad(&self, now: tokio::time::Instant) {
        if !self.judged.swap(true, Ordering::Relaxed) {
            self.replica.route.stats.judge(false, now);
        }
    }

    /// Whether its verdict was told early.
    pub fn judged_early(&self) -> bool {
        self.judged.load(Ordering::Relaxed)
    }

    /// The client has been served `output` tokens so far (`None`: no output yet).
    pub fn served(&self, output: Option<u64>) {
        let Some(n) = output else {
            return;
        };
        let route = &self.replica.route;
        let p = self.prefill_left.swap(0, Ordering::Relaxed);
        if p > 0 {
            route.prefill.fetch_sub(p, Ordering::Relaxed);
        }
        let left = self.output.saturating_sub(n);
        let before = self.decode_left.fetch_min(left, Ordering::Relaxed);
        if before > left {
            route.decode.fetch_sub(before - left, Ordering::Relaxed);
        }
    }
}

/// The replicas at one moment: configured ones first (in `upstream.urls` order), then the
/// discovered ones.
pub type ReplicaSet = Arc<[Arc<Replica>]>;

/// The set of replicas behind the proxy plus the client that reaches them. The set changes
/// only through discovery ([`Upstreams::set_discovered`]); readers take a snapshot.
#[derive(Debug)]
pub struct Upstreams {
    replicas: RwLock<ReplicaSet>,
    /// How many of the snapshot's first replicas are configured (never removed).
    configured: usize,
    pub client: UpstreamClient,
    /// How client connections' lanes open their upstream connections (`lane`).
    opener: lane::Opener,
    pub config: UpstreamConfig,
    /// The replica choice (`[balance]`); shared with the responses it routed, which teach its
    /// prefix index what the engines held.
    pub balancer: Arc<strategy::Balancer>,
}

/// What one discovery round changed.
#[derive(Debug, Default)]
pub struct SetChange {
    pub added: Vec<Arc<Replica>>,
    pub removed: Vec<Arc<Replica>>,
}

impl SetChange {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

impl Upstreams {
    /// Builds replicas from `config.urls` (already validated) and the pooled client; the
    /// balancer's families are registered on `registry`.
    pub fn new(config: &UpstreamConfig, registry: &Registry) -> Result<Upstreams, String> {
        let tls = match &config.tls {
            Some(t) => Some(tls::client_config(t)?),
            None => None,
        };
        let connector = tls::Connector::new(http_connector(config), tls, config.connect_timeout);
        Self::with_connector(config, BoxCloneSyncService::new(connector), registry)
    }

    /// As [`Upstreams::new`], connecting through `connector`.
    pub fn with_connector(
        config: &UpstreamConfig,
        connector: UpstreamConnector,
        registry: &Registry,
    ) -> Result<Upstreams, String> {
        let balancer = strategy::Balancer::new(config.balance.clone(), &Registrar::new(registry))
            .map_err(|e| format!("registering the balancer's metrics: {e}"))?;
        let replicas = config
            .urls
            .iter()
            .map(|u| Replica::new(u.as_str()).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let connector = SharedConnector(Arc::new(connector));
        Ok(Upstreams {
            configured: replicas.len(),
            replicas: RwLock::new(replicas.into()),
            opener: lane::Opener::new(connector.clone(), config.read_buffer),
            client: build_client(config, connector),
            balancer: Arc::new(balancer),
            config: config.clone(),
        })
    }

    /// The current replicas (cheap: one `Arc` clone).
    pub fn replicas(&self) -> ReplicaSet {
        match self.replicas.read() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Makes `urls` the discovered replicas: a URL already present keeps its replica (in-flight
    /// count, health), a new one starts unhealthy (the balancer prefers healthy replicas, so it
    /// gets traffic after its first good probe), a missing one leaves the set: it gets no new
    /// requests, and its in-flight requests finish (each holds the replica until its body
    /// ends). Configured replicas are never removed; a URL equal to one is ignored.
    pub fn set_discovered(&self, urls: &[String]) -> SetChange {
        let current = self.replicas();
        let (configured, discovered) = current.split_at(self.configured.min(current.len()));
        let mut next: Vec<Arc<Replica>> = configured.to_vec();
        let mut change = SetChange::default();
        for url in urls {
            let url = url.trim_end_matches('/');
            if next.iter().any(|r| &*r.url == url) {
                continue;
            }
            match discovered.iter().find(|r| &*r.url == url) {
                Some(r) => next.push(r.clone()),
                None => match Replica::new(url) {
                    Ok(r) => {
                        let r = Arc::new(r);
                        change.added.push(r.clone());
                        next.push(r);
                    }
                    Err(e) => tracing::warn!(url, error = %e, "discovered replica ignored"),
                },
            }
        }
        change.removed = discovered
            .iter()
            .filter(|r| !next.iter().any(|n| Arc::ptr_eq(n, r)))
            .cloned()
            .collect();
        if !change.is_empty() {
            let mut w = match self.replicas.write() {
                Ok(w) => w,
                Err(poisoned) => poisoned.into_inner(),
            };
            *w = next.into();
        }
        change
    }

    /// True when at least one replica answered its last health probe.
    pub fn any_healthy(&self) -> bool {
        self.replicas().iter().any(|r| r.is_healthy())
    }
}

/// The production connector: TCP with `connect_timeout_ms` per attempt and TCP_NODELAY.
pub fn http_connector(config: &UpstreamConfig) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(config.connect_timeout));
    connector.set_nodelay(true);
    // Absolute-form URIs carry the scheme; the connector must accept it as-is.
    connector.enforce_http(true);
    connector
}

fn build_client(config: &UpstreamConfig, connector: SharedConnector) -> UpstreamClient {
    let mut b = Client::builder(TokioExecutor::new());
    if let Some(bytes) = config.read_buffer {
        // A fixed buffer instead of hyper's adaptive 8 KiB one: held streams cost less memory.
        b.http1_read_buf_exact_size(bytes);
    }
    b.pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        // Below the engine's keep-alive (see `pool_idle_timeout_ms`): the pool lets an idle
        // connection go before the engine closes it under a request.
        .pool_idle_timeout(config.pool_idle_timeout)
        .pool_max_idle_per_host(config.pool_max_idle_per_host)
        // A request the pool handed to a connection that turned out closed before anything
        // was written is sent again on another (hyper-util's default, relied on: explicit).
        .retry_canceled_requests(true)
        .build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_is_what_the_pooled_client_writes() {
        for (url, want) in [
            ("http://e:1", "e:1"),
            ("http://e", "e"),
            ("http://e:80", "e"),
            ("http://e:080", "e"),
            ("http://e:443", "e:443"),
            ("https://e:443", "e"),
            ("https://e:80", "e:80"),
            ("https://e:8443/base", "e:8443"),
            ("http://10.0.0.1:8000/", "10.0.0.1:8000"),
            ("http://[::1]:8000", "[::1]:8000"),
            ("http://[::1]", "[::1]"),
            ("http://Engine.Example:9", "Engine.Example:9"),
        ] {
            let r = Replica::new(url).unwrap();
            assert_eq!(
                r.host.as_ref().map(|h| h.to_str().unwrap()),
                Some(want),
                "{url}"
            );
        }
    }

    /// The request head the replica reads, sent by the pooled client: once as forwarding sends
    /// it (`Host` set from the replica), once as the client alone would (it formats `Host`).
    #[tokio::test]
    async fn a_preset_host_leaves_the_upstream_request_bytes_unchanged() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        let n = s.read(&mut chunk).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.lock().unwrap().push(buf[..end + 4].to_vec());
                            buf.drain(..end + 4 + 2); // the head and the two-byte body
                            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                                .await
                                .unwrap();
                        }
                    }
                });
            }
        });
        let config = UpstreamConfig {
            urls: vec![crate::config::BaseUrl::parse(&format!("http://{addr}")).unwrap()],
            ..UpstreamConfig::default()
        };
        let up = Upstreams::new(&config, &Registry::new()).unwrap();
        let replica = up.replicas()[0].clone();
        for preset in [true, false] {
            let pq: PathAndQuery = "/v1/chat/completions?x=1".parse().unwrap();
            let mut req = http::Request::post(replica.request_uri(Some(&pq)).unwrap())
                .header("content-type", "application/json")
                .header("x-request-id", "abc")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            if preset {
                let host = replica.host.clone().unwrap();
                req.headers_mut().insert(http::header::HOST, host);
            }
            let resp = up.client.request(req).await.unwrap();
            assert_eq!(resp.status(), 200);
        }
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 2);
        let text = String::from_utf8_lossy(&heads[0]);
        assert!(text.contains(&format!("\r\nhost: {addr}\r\n")), "{text}");
        assert_eq!(heads[0], heads[1], "{text}");
    }

    proptest::proptest! {
        #[test]
        fn a_request_uri_without_prefix_is_uri_for_its_path(path in "/[ -~]{0,40}") {
            let Ok(pq) = path.parse::<PathAndQuery>() else {
                return Ok(());
            };
            for base in ["http://e:1", "https://e", "http://e:1/"] {
                let r = Replica::new(base).unwrap();
                let want = r.uri_for(pq.as_str()).unwrap();
                let got = r.request_uri(Some(&pq)).unwrap();
                proptest::prop_assert_eq!(&got, &want);
                proptest::prop_assert_eq!(got.to_string(), want.to_string());
            }
        }
    }

    #[test]
    fn a_request_uri_with_a_prefix_or_without_a_path() {
        let pq: PathAndQuery = "/v1/models?x=1".parse().unwrap();
        let r = Replica::new("http://e:1/base/").unwrap();
        let got = r.request_uri(Some(&pq)).unwrap().to_string();
        assert_eq!(got, "http://e:1/base/v1/models?x=1");
        let r = Replica::new("http://e:1").unwrap();
        assert_eq!(r.request_uri(None).unwrap().to_string(), "http://e:1/");
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
    fn discovered_replicas_come_and_go_configured_ones_stay() {
        let cfg = UpstreamConfig {
            urls: vec![crate::config::BaseUrl::parse("http://static:1").unwrap()],
            ..UpstreamConfig::default()
        };
        let up = Upstreams::new(&cfg, &Registry::new()).unwrap();
        let urls = |up: &Upstreams| -> Vec<String> {
            up.replicas().iter().map(|r| r.url.to_string()).collect()
        };
        let c = up.set_discovered(&["http://10.0.0.1:8000".into(), "http://static:1".into()]);
        assert_eq!(c.added.len(), 1);
        assert_eq!(urls(&up), ["http://static:1", "http://10.0.0.1:8000"]);
        let a = up.replicas()[1].clone();
        a.set_healthy(true);
        let guard = a.start();
        // Same set again: nothing changes, the replica keeps its state.
        assert!(up
            .set_discovered(&["http://10.0.0.1:8000".into()])
            .is_empty());
        assert!(up.replicas()[1].is_healthy());
        // Replaced: the old one leaves (its in-flight request still holds it), the new one
        // starts unhealthy.
        let c = up.set_discovered(&["http://10.0.0.2:8000".into()]);
        assert_eq!(c.removed.len(), 1);
        assert!(Arc::ptr_eq(&c.removed[0], &a));
        assert_eq!(urls(&up), ["http://static:1", "http://10.0.0.2:8000"]);
        assert!(!up.replicas()[1].is_healthy());
        assert_eq!(a.in_flight(), 1);
        drop(guard);
        assert_eq!(a.in_flight(), 0);
        // Nothing discovered: the configured replica remains.
        up.set_discovered(&[]);
        assert_eq!(urls(&up), ["http://static:1"]);
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

    #[test]
    fn pending_work_moves_from_prefill_to_decode_as_output_is_served() {
        let r = Arc::new(Replica::new("http://e:1").unwrap());
        let pending = |prefill, decode| TokensPending { prefill, decode };
        let a = r.start_tokens(100, 50);
        let pa = a.progress();
        let b = r.start_tokens(30, 20);
        let pb = b.progress();
        // (who, output served so far, pending work after)
        let steps: &[(&Arc<TokenProgress>, Option<u64>, TokensPending)] = &[
            (&pa, None, pending(130, 70)),
            // The first token: a's prompt is done, one of its 50 tokens served.
            (&pa, Some(1), pending(30, 69)),
            (&pa, Some(10), pending(30, 60)),
            // A lower count (events before a running usage) never gives tokens back.
            (&pa, Some(4), pending(30, 60)),
            (&pb, Some(3), pending(0, 57)),
            // More than asked for: nothing left, never below 0.
            (&pa, Some(80), pending(0, 17)),
        ];
        for (i, &(p, served, want)) in steps.iter().enumerate() {
            p.served(served);
            assert_eq!(r.route.tokens_pending(), want, "step {i}");
        }
        assert_eq!(r.route.tokens(), 200);
        drop(a);
        assert_eq!(r.route.tokens_pending(), pending(0, 17));
        // Told after its end: nothing moves twice.
        pa.served(Some(100));
        drop(b);
        assert_eq!(r.route.tokens_pending(), pending(0, 0));
        assert_eq!((r.in_flight(), r.route.tokens()), (0, 0));
        // Ended before any output: its prompt and output leave with it.
        let c = r.start_tokens(8, 4);
        assert_eq!(r.route.tokens_pending(), pending(8, 4));
        drop(c);
        assert_eq!(r.route.tokens_pending(), pending(0, 0));
        assert_eq!(r.route.tokens_sent(), 212);
    }

    #[test]
    fn a_cached_prefix_counts_in_the_balancers_load_at_what_it_lacks_only() {
        let r = Arc::new(Replica::new("http://e:1").unwrap());
        // (prompt, output, cached, balancer's load)
        let cases: &[(u64, u64, u64, u64)] = &[
            (1_000, 30, 0, 1_030),
            (1_000, 30, 900, 130),
            (1_000, 30, 5_000, 30),
        ];
        for &(prompt, output, cached, want) in cases {
            let g = r.start_cached(prompt, output, cached);
            assert_eq!(r.route.tokens(), want, "{prompt} {cached}");
            // The work pending and the tokens sent (autoscaling) count the whole prompt.
            assert_eq!(r.route.tokens_pending().prefill, prompt);
            drop(g);
            assert_eq!(r.route.tokens(), 0);
        }
        assert_eq!(r.route.tokens_sent(), 3 * 1_030);
    }
}
