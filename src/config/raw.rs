//! The configuration file as written: serde structs, unknown fields are errors, every field has
//! a default. Nothing here is checked beyond its type; [`super::check`] turns a [`RawConfig`]
//! into the checked [`super::Config`]. Every field is documented in config/goodput-proxy.toml.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub server: RawServer,
    /// Connection, head and body-read limits of the listeners (`[limits]`).
    pub limits: RawLimits,
    pub upstream: RawUpstream,
    /// API keys and tenants (`[auth]`); off unless a tenant or a keys file is configured.
    pub auth: RawAuth,
    /// What the admin listener serves, and to whom (`[admin]`).
    pub admin: RawAdmin,
    pub log: LogConfig,
    pub measure: RawMeasure,
    /// Token-level traces (`[trace]`): which requests are traced, and how much is kept.
    pub trace: RawTrace,
    pub slo: RawSlo,
    pub engine: RawEngine,
    /// The autoscaling signals (`[scale]`, docs/autoscaling.md).
    pub scale: crate::config::ScaleConfig,
    /// How a replica is chosen for each request (`[balance]`, docs/routing.md).
    pub balance: crate::config::BalanceConfig,
    /// Record sinks besides the JSONL file of `[measure]`: `[sink.clickhouse]`.
    pub sink: RawSink,
    /// The built-in simulated engine used in demo mode (no `upstream.urls`); see the sim's
    /// own documentation for its fields.
    pub sim: Option<goodput_sim::SimConfig>,
}

/// The public listener and the limits applied to every request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    /// Public (proxy) listen address.
    pub listen: SocketAddr,
    /// Admin listen address (/healthz, /readyz, /metrics, /stats). Never served on `listen`.
    pub admin_listen: SocketAddr,
    /// PEM certificate chain; with `tls_key`, the public listener speaks TLS (ALPN h2, http/1.1).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// A client must deliver the request head within this time (slowloris guard), ms.
    pub header_read_timeout_ms: u64,
    /// Largest request body accepted; larger gets 413. Bodies are read up front.
    pub max_body_bytes: u64,
    /// Requests in flight (until their response body ends) beyond which new ones get 503.
    pub max_in_flight: usize,
    /// Seconds advertised in `Retry-After` on an in-flight 503.
    pub retry_after_s: u64,
    /// Path prefixes forwarded upstream; anything else gets 404 without touching the upstream.
    /// An entry ending in `/` matches by prefix, any other entry matches exactly.
    pub paths: Vec<String>,
    /// After SIGTERM/SIGINT, keep accepting for this long while /readyz says 503 (lets
    /// Kubernetes remove the endpoint before connections are refused), ms.
    pub drain_delay_ms: u64,
    /// After the drain delay, in-flight requests get this long to finish before they are cut, ms.
    pub grace_period_ms: u64,
    /// This replica's name, written into every record (`instance`) so a fleet's records say
    /// where they were measured. Default: the hostname (a pod's name in Kubernetes).
    pub instance: Option<String>,
    /// Proxies in front of this one whose `X-Forwarded-For` entries are kept (the last this
    /// many of the incoming chain); the rest, written by the client, is dropped. 0: the peer
    /// is the client and every `X-Forwarded-*` it sent is replaced.
    pub trusted_proxies: usize,
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            tls_cert: None,
            tls_key: None,
            header_read_timeout_ms: 10_000,
            max_body_bytes: 32 * 1024 * 1024,
            max_in_flight: 1024,
            retry_after_s: 1,
            paths: default_paths(),
            drain_delay_ms: 5_000,
            grace_period_ms: 30_000,
            instance: None,
            trusted_proxies: 0,
        }
    }
}

fn default_paths() -> Vec<String> {
    [
        "/v1/",
        "/tokenize",
        "/detokenize",
        "/health",
        "/version",
        "/pooling",
        "/classify",
        "/score",
        "/rerank",
        "/invocations",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// `[limits]`: what one client may make the proxy hold. Each field is documented on
/// [`crate::limits::Limits`] (and in config/goodput-proxy.toml, docs/RELIABILITY.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub h2_max_header_list_bytes: u32,
    pub h2_max_concurrent_streams: u32,
    pub h2_stream_window_bytes: u32,
    pub h2_connection_window_bytes: u32,
    pub h2_max_pending_accept_reset_streams: usize,
    pub max_connections: usize,
    pub admin_max_connections: usize,
    pub tls_handshake_timeout_ms: u64,
    pub body_idle_timeout_ms: u64,
}

impl Default for RawLimits {
    fn default() -> Self {
        let l = crate::limits::Limits::default();
        Self {
            max_head_bytes: l.max_head_bytes,
            max_headers: l.max_headers,
            h2_max_header_list_bytes: l.h2_max_header_list_bytes,
            h2_max_concurrent_streams: l.h2_max_concurrent_streams,
            h2_stream_window_bytes: l.h2_stream_window_bytes,
            h2_connection_window_bytes: l.h2_connection_window_bytes,
            h2_max_pending_accept_reset_streams: l.h2_max_pending_accept_reset_streams,
            max_connections: l.max_connections,
            admin_max_connections: l.admin_max_connections,
            tls_handshake_timeout_ms: l.tls_handshake_timeout.as_millis() as u64,
            body_idle_timeout_ms: l.body_idle_timeout.as_millis() as u64,
        }
    }
}

impl RawLimits {
    /// The limits as the listener takes them (checked by [`crate::limits::Limits::check`]).
    pub fn to_limits(&self) -> crate::limits::Limits {
        crate::limits::Limits {
            max_head_bytes: self.max_head_bytes,
            max_headers: self.max_headers,
            h2_max_header_list_bytes: self.h2_max_header_list_bytes,
            h2_max_concurrent_streams: self.h2_max_concurrent_streams,
            h2_stream_window_bytes: self.h2_stream_window_bytes,
            h2_connection_window_bytes: self.h2_connection_window_bytes,
            h2_max_pending_accept_reset_streams: self.h2_max_pending_accept_reset_streams,
            max_connections: self.max_connections,
            admin_max_connections: self.admin_max_connections,
            tls_handshake_timeout: std::time::Duration::from_millis(self.tls_handshake_timeout_ms),
            body_idle_timeout: std::time::Duration::from_millis(self.body_idle_timeout_ms),
        }
    }
}

/// The engines behind the proxy and the deadlines applied to them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawUpstream {
    /// Base URLs of the engine replicas (`http://host:port`, or `https://` with `tls_ca`). Empty (and no `discover`): `serve`
    /// starts the built-in simulated engine on a loopback port (demo mode).
    pub urls: Vec<String>,
    /// Replicas found by DNS: `dns://NAME:PORT` (e.g. a Kubernetes headless Service); every
    /// address NAME resolves to is one replica `http://ADDRESS:PORT`. Re-resolved every
    /// `discover_interval_ms`: a replica that disappears gets no new requests (its streams
    /// finish), a new one gets traffic after its first good health probe.
    pub discover: Vec<String>,
    /// Interval between DNS resolutions of `discover`, ms.
    pub discover_interval_ms: u64,
    /// Resolve `discover` names from this file (hosts format: `ADDRESS NAME...` per line, `#`
    /// comments), re-read every round, instead of the system's resolver: for a fleet published
    /// as a file (e.g. by a sidecar watching the endpoints), and for simulated fleets.
    pub discover_hosts_file: Option<PathBuf>,
    /// TCP connect deadline per attempt, ms. A failed connect is retried once on another replica.
    pub connect_timeout_ms: u64,
    /// Deadline for the upstream response head, from sending the request, ms (504 when it fires).
    /// It also bounds the first body frame (a stream's first event follows prefill). Long
    /// prompts are normal, hence the generous default.
    pub first_byte_timeout_ms: u64,
    /// Longest silence between two body frames of a response, ms; the stream is cut when it fires.
    pub stream_idle_timeout_ms: u64,
    /// Total deadline for a response body, ms, or `"none"` (the default: streams may be long).
    pub total_timeout_ms: Limit,
    /// Idle pooled upstream connections are closed after this long, ms. Keep it below the
    /// engine's keep-alive timeout (vLLM/uvicorn: 5 s) minus a network delay: a connection the
    /// engine closes just as a request goes out on it is a 502 (docs/RELIABILITY.md,
    /// keep-alive race).
    pub pool_idle_timeout_ms: u64,
    /// Most idle pooled connections kept per replica.
    pub pool_max_idle_per_host: usize,
    /// Read buffer of each HTTP/1 connection to a replica, bytes, or 0 for hyper's adaptive
    /// buffer (8 KiB, growing with large reads). A response head must fit in it: a larger one
    /// is a 502, as with nginx's `proxy_buffer_size` (4 KiB, one page). At least 1024.
    pub read_buffer_bytes: usize,
    /// Path probed on each replica for readiness (`/readyz` is ready when one answers 2xx).
    pub health_path: String,
    /// Interval between readiness probes, ms.
    pub health_interval_ms: u64,
    /// Sent to every replica as `Authorization: Bearer <api_key>` (vLLM's `--api-key`),
    /// replacing whatever the client sent. Default: none (with `[auth]` on, the client's
    /// `Authorization` is removed and nothing replaces it; with auth off it is forwarded).
    /// Prefer the environment (`GOODPUT_PROXY_UPSTREAM_API_KEY`) to the file.
    pub api_key: Option<String>,
    /// PEM CA bundle that `https://` replicas are verified against (required for them; there
    /// is no built-in root store). Default: none.
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate chain presented to `https://` replicas (mTLS), with
    /// `tls_client_key`. Default: none.
    pub tls_client_cert: Option<PathBuf>,
    /// PEM private key of `tls_client_cert`.
    pub tls_client_key: Option<PathBuf>,
}

impl Default for RawUpstream {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            discover: Vec::new(),
            discover_interval_ms: 5_000,
            discover_hosts_file: None,
            connect_timeout_ms: 5_000,
            first_byte_timeout_ms: 300_000,
            stream_idle_timeout_ms: 120_000,
            total_timeout_ms: Limit::None,
            pool_idle_timeout_ms: 4_000,
            pool_max_idle_per_host: 256,
            read_buffer_bytes: 0,
            health_path: "/health".into(),
            health_interval_ms: 2_000,
            api_key: None,
            tls_ca: None,
            tls_client_cert: None,
            tls_client_key: None,
        }
    }
}

/// `[auth]`: API keys, each owned by a tenant. On as soon as a tenant or `keys_file` is
/// configured: then every request on the public port needs a key (`Authorization: Bearer
/// <key>` or `x-api-key: <key>`, never in the query string), else 401 before its body is read.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAuth {
    /// A TOML file of more tenants' key digests (`[tenants.NAME] keys = ["<sha256 hex>"]`),
    /// read at startup and again on SIGHUP (a file with a problem is not used: the keys in use
    /// stay). Default: none.
    pub keys_file: Option<PathBuf>,
    /// `[auth.tenants.NAME]`: a tenant's keys and limits. NAME is the `tenant` label value.
    pub tenants: BTreeMap<String, RawTenant>,
}

/// What the admin listener (`server.admin_listen`) reveals and who may read it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    /// SHA-256 digest (64 hex digits, optionally `sha256:` first) of the admin token; make one
    /// with `goodput-proxy hash-key`. With it, every admin path but `/healthz`, `/readyz` and
    /// (see `metrics_public`) `/metrics` answers 401 unless the request carries
    /// `Authorization: Bearer <token>` or HTTP Basic with the token as the password (a
    /// browser's sign-in prompt). Default: none (keep the admin listener on loopback or a
    /// network only operators reach).
    pub token_sha256: Option<String>,
    /// `/metrics` without the token (Prometheus scrapes as before). `false`: it needs the token
    /// too (Prometheus: `authorization.credentials_file`). Default: true.
    pub metrics_public: bool,
    /// `/trace/<request-id>`: a traced request's generated text, token by token. Default:
    /// false (404).
    pub trace: bool,
    /// Per-request data on the admin port: `/stats?records=N` (the N latest raw records:
    /// ids, models, tenants, timings) and the live page's slowest requests by id. Default:
    /// false (aggregates only).
    pub records: bool,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            token_sha256: None,
            metrics_public: true,
            trace: false,
            records: false,
        }
    }
}

/// One tenant of `[auth.tenants]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTenant {
    /// SHA-256 digests (64 hex digits, optionally `sha256:` first) of the tenant's keys; make
    /// one with `goodput-proxy hash-key`. The keys themselves are never stored.
    pub keys: Vec<String>,
    /// The tenant's requests in flight (until their response body ends) beyond which new ones
    /// get 429. Default: no limit (the global `server.max_in_flight` still applies).
    pub max_in_flight: Option<usize>,
    /// Token budget per minute (prompt + completion tokens, as the records count them): a
    /// request is admitted while the budget is not used up and charged after it finished; in
    /// debt, 429 with `Retry-After`. Default: no limit. Needs `measure.enabled`.
    pub tokens_per_minute: Option<u64>,
}

/// What the meter does besides watching: usage injection, the model label set, the record
/// ring and the optional JSONL sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawMeasure {
    /// `false` forwards every request without metering it: no record, no latency metric, no
    /// usage injection (so the cost of measuring can itself be measured).
    pub enabled: bool,
    /// `auto`: a streaming request that did not ask for usage gets
    /// `stream_options.include_usage` injected (exact token counts) and the usage chunk is
    /// removed from what the client receives. `off`: requests are forwarded as sent.
    pub usage_injection: UsageInjection,
    /// Model names that get their own `model` label value; models the upstreams list at
    /// `GET /v1/models` are learned too; any other name is labelled `other`.
    pub models: Vec<String>,
    /// How often the upstreams' `/v1/models` is re-read, ms.
    pub models_refresh_ms: u64,
    /// Finished-request records kept in memory for `/stats`.
    pub records: usize,
    /// JSONL file every record is appended to (off the request path). Default: none.
    pub sink_path: Option<PathBuf>,
    /// Rotate the sink file when it would grow past this many bytes.
    pub sink_max_bytes: u64,
    /// Rotated sink files kept (`path.1` .. `path.N`).
    pub sink_keep: usize,
    /// Records queued for the sink at most; beyond, records are dropped and counted.
    pub sink_queue: usize,
    /// Sliding window of the `goodput_proxy_goodput_ratio` gauges, seconds.
    pub goodput_window_s: u64,
    /// A gap between a stream's output events longer than this is a stall, ms (counted per
    /// request in the record and in `goodput_proxy_stalls_total`; SSE comments such as
    /// keep-alives are no events and never end one).
    pub stall_ms: u64,
}

impl Default for RawMeasure {
    fn default() -> Self {
        Self {
            enabled: true,
            usage_injection: UsageInjection::Auto,
            models: Vec::new(),
            models_refresh_ms: 30_000,
            records: goodput_measure::record::DEFAULT_RING_CAPACITY,
            sink_path: None,
            sink_max_bytes: 100 * 1024 * 1024,
            sink_keep: 3,
            sink_queue: 65_536,
            goodput_window_s: 60,
            stall_ms: 1000,
        }
    }
}

/// `[trace]`: token-level traces of streams. A request is traced when it sends
/// `x-goodput-trace: 1` (the header is the proxy's: it is not forwarded) or when it is
/// sampled; its trace is kept beside its record in the `/stats` ring (admin
/// `GET /trace/<request-id>`) and written with its record to the JSONL sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTrace {
    /// Share of generation requests traced without asking, 0 to 1. Default 0.
    pub sample_rate: f64,
    /// Tokens kept per trace (an output event without logprobs counts as one); the rest are
    /// counted, not kept.
    pub max_tokens: usize,
    /// Traces kept in memory for `GET /trace/<id>` (the oldest goes first); 0 keeps none
    /// (the JSONL sink still gets them).
    pub max_traces: usize,
}

impl Default for RawTrace {
    fn default() -> Self {
        Self {
            sample_rate: 0.0,
            max_tokens: goodput_measure::trace::DEFAULT_MAX_TOKENS,
            max_traces: goodput_measure::record::DEFAULT_TRACE_CAPACITY,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageInjection {
    Auto,
    Off,
}

/// `[sink]`: where records go besides the ring and the JSONL file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSink {
    /// `[sink.clickhouse]`: ship every record to ClickHouse. Default: unset (off).
    pub clickhouse: Option<RawClickHouse>,
}

/// `[sink.clickhouse]`: records batched over ClickHouse's HTTP interface
/// (`INSERT INTO db.table FORMAT JSONEachRow`, gzip), off the request path. See
/// docs/clickhouse.md and config/clickhouse/schema.sql.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawClickHouse {
    /// HTTP interface base URL, `http://host:8123` (http only).
    pub url: String,
    pub database: String,
    pub table: String,
    pub user: String,
    /// Password; when unset it is read from the environment variable `password_env` (empty
    /// when that is unset too).
    pub password: Option<String>,
    pub password_env: String,
    /// Records per INSERT at most.
    pub batch_size: usize,
    /// A batch is sent at the latest this long after its first record, ms.
    pub flush_interval_ms: u64,
    /// Records waiting to be shipped at most (besides the batch being sent); beyond, new
    /// records are dropped and counted in `goodput_proxy_records_dropped_total{sink="clickhouse"}`.
    pub queue: usize,
    /// Deadline for one INSERT (connect, send, answer), ms.
    pub timeout_ms: u64,
    /// First retry delay after a failed INSERT, ms; doubled per failure up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// A batch the server answered with an error this many times in a row is dropped (and
    /// counted): the data or the schema is wrong, not the network. A store that does not
    /// answer at all is retried for as long as it takes (the queue bounds what waits).
    pub max_attempts: u32,
    /// Send the body gzip-compressed (`Content-Encoding: gzip`).
    pub gzip: bool,
}

impl Default for RawClickHouse {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8123".into(),
            database: "goodput".into(),
            table: "records".into(),
            user: "default".into(),
            password: None,
            password_env: "CLICKHOUSE_PASSWORD".into(),
            batch_size: 10_000,
            flush_interval_ms: 1_000,
            queue: 100_000,
            timeout_ms: 10_000,
            retry_initial_ms: 100,
            retry_max_ms: 5_000,
            max_attempts: 5,
            gzip: true,
        }
    }
}

/// Service-level objectives a request must meet to count as good: ms, or `"none"` (not judged).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSlo {
    pub ttft_ms: Limit,
    pub tpot_ms: Limit,
    pub e2e_ms: Limit,
    /// The longest a stream's reader may wait between two output events of one choice (the
    /// record's `itl_max_s`), ms; a longer stall makes the request not good. Default `"none"`:
    /// stalls are counted (`measure.stall_ms`, `goodput_proxy_stalls_total`), not judged.
    pub max_stall_ms: Limit,
    /// A tool call that is not valid JSON, breaks its function's schema in the request's
    /// `tools`, or names an unknown function makes the request not good.
    pub valid_tool_calls: bool,
    /// Per-model overrides (`[slo.models."llama-70b"]`); a field left out keeps the global value.
    pub models: BTreeMap<String, SloOverride>,
}

impl Default for RawSlo {
    fn default() -> Self {
        Self {
            ttft_ms: Limit::Ms(2_000),
            tpot_ms: Limit::Ms(150),
            e2e_ms: Limit::Ms(30_000),
            max_stall_ms: Limit::None,
            valid_tool_calls: true,
            models: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloOverride {
    pub ttft_ms: Option<Limit>,
    pub tpot_ms: Option<Limit>,
    pub e2e_ms: Option<Limit>,
    pub max_stall_ms: Option<Limit>,
}

/// A limit in milliseconds, or none: written `5000` or `"none"` (never `0`, which would read
/// as "instantly" in one field and "never" in another).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Ms(u64),
    None,
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Limit;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of milliseconds or \"none\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Limit, E> {
                Ok(Limit::Ms(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Limit, E> {
                u64::try_from(v)
                    .map(Limit::Ms)
                    .map_err(|_| E::custom("a limit cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Limit, E> {
                match v {
                    "none" => Ok(Limit::None),
                    _ => Err(E::custom(format!(
                        "`{v}`: expected a number of milliseconds or \"none\""
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// The engine scraper: each replica's Prometheus `/metrics`, served again on the admin
/// `/metrics` (relabelled `upstream`), read by the balancer (queue) and the autoscale gauges.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawEngine {
    /// Scrape the replicas at all.
    pub scrape: bool,
    /// Path scraped on each replica (after its URL's path prefix).
    pub path: String,
    /// Interval between scrapes, ms.
    pub scrape_interval_ms: u64,
    /// Deadline for one scrape (connect, head and whole body), ms.
    pub scrape_timeout_ms: u64,
    /// Largest `/metrics` body read; a larger one fails the scrape.
    pub max_bytes: usize,
    /// The `upstream` label value: `url` (the configured URL) or `index` (`0`, `1`, ... in the
    /// order of `upstream.urls`).
    pub upstream_label: UpstreamLabel,
    /// Add the engine's waiting queue (its canonical queue signal, e.g.
    /// `vllm:num_requests_waiting`, `sglang:num_queue_reqs`) to a replica's in-flight count
    /// when balancing.
    pub balance_on_queue: bool,
    /// Which engine the replicas run, for reading their queue, running batch and KV-cache use
    /// from their own metric families: `auto` (told from the families each one serves), or
    /// `vllm`, `sglang`, `llamacpp`, `tgi`, `trtllm`.
    pub kind: String,
    /// Per replica, by its URL as written in `upstream.urls`: the engine it runs (same values
    /// as `kind`, which applies to every replica not listed here).
    pub kinds: BTreeMap<String, String>,
    /// Replicas (URLs as written in `upstream.urls`) that end every stream with a usage
    /// chunk whether the client asked or not (SGLang `--stream-response-default-include-usage`),
    /// whatever their engine: the proxy never injects usage into their requests (so never
    /// strips it), and their clients get it as they would straight from the engine. Replicas
    /// detected as SGLang need not be listed: the proxy learns it from their first stream.
    pub usage_unasked: Vec<String>,
}

impl Default for RawEngine {
    fn default() -> Self {
        Self {
            scrape: true,
            path: "/metrics".into(),
            scrape_interval_ms: 5_000,
            scrape_timeout_ms: 2_000,
            max_bytes: 8 * 1024 * 1024,
            upstream_label: UpstreamLabel::Url,
            balance_on_queue: true,
            kind: "auto".into(),
            kinds: BTreeMap::new(),
            usage_unasked: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamLabel {
    Url,
    Index,
}

/// Logs go to stderr. Nothing to check: this is also the checked form.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter (`info`, `goodput_proxy=debug,info`); `RUST_LOG` wins when set.
    pub level: String,
    /// One access line per request (target `goodput_proxy::access`). `false` leaves the
    /// access-log stage out of the stack: no line formatted, no write per request (nginx's
    /// `access_log off`; the records, `/stats` and the JSONL sink still hold every request).
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
            access: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}
