//! Configuration: serde structs (unknown fields are errors), environment overrides, validation,
//! defaults. Precedence, lowest first: built-in defaults, the TOML file, `GOODPUT_PROXY_*`
//! environment variables, command-line flags (applied by `cli.rs`).
//!
//! Every error names the field and where it came from (the file or the environment variable).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Prefix of environment overrides: `GOODPUT_PROXY_<SECTION>_<FIELD>`, e.g.
/// `GOODPUT_PROXY_SERVER_LISTEN=0.0.0.0:8080` or
/// `GOODPUT_PROXY_UPSTREAM_URLS=http://a:8000,http://b:8000`.
pub const ENV_PREFIX: &str = "GOODPUT_PROXY_";

/// The environment variable naming the config file (read by the CLI, not an override).
pub const ENV_CONFIG_FILE: &str = "GOODPUT_PROXY_CONFIG";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{origin}: field `{field}`: {message}")]
    Invalid {
        origin: String,
        field: String,
        message: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub log: LogConfig,
    pub measure: MeasureConfig,
    pub slo: SloConfig,
    pub engine: EngineConfig,
    /// Record sinks besides the JSONL file of `[measure]`: `[sink.clickhouse]`.
    pub sink: SinkSection,
    /// The built-in simulated engine used in demo mode (no `upstream.urls`); see the sim's
    /// own documentation for its fields. Not overridable from the environment.
    #[serde(skip_serializing)]
    pub sim: Option<goodput_sim::SimConfig>,
}

/// The public listener and the limits applied to every request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
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
}

impl Default for ServerConfig {
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

/// The engines behind the proxy and the deadlines applied to them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Base URLs of the engine replicas (`http://host:port`). Empty (and no `discover`): `serve`
    /// starts the built-in simulated engine on a loopback port (demo mode).
    pub urls: Vec<String>,
    /// Replicas found by DNS: `dns://NAME:PORT` (e.g. a Kubernetes headless Service); every
    /// address NAME resolves to is one replica `http://ADDRESS:PORT`. Re-resolved every
    /// `discover_interval_ms`: a replica that disappears gets no new requests (its streams
    /// finish), a new one gets traffic after its first good health probe.
    pub discover: Vec<String>,
    /// Interval between DNS resolutions of `discover`, ms.
    pub discover_interval_ms: u64,
    /// TCP connect deadline per attempt, ms. A failed connect is retried once on another replica.
    pub connect_timeout_ms: u64,
    /// Deadline for the upstream response head, from sending the request, ms (504 when it fires).
    /// It also bounds the first body frame (a stream's first event follows prefill). Long
    /// prompts are normal, hence the generous default.
    pub first_byte_timeout_ms: u64,
    /// Longest silence between two body frames of a response, ms; the stream is cut when it fires.
    pub stream_idle_timeout_ms: u64,
    /// Total deadline for a response body, ms; 0 = none (the default: streams may be long).
    pub total_timeout_ms: u64,
    /// Idle pooled upstream connections are closed after this long, ms.
    pub pool_idle_timeout_ms: u64,
    /// Most idle pooled connections kept per replica.
    pub pool_max_idle_per_host: usize,
    /// Path probed on each replica for readiness (`/readyz` is ready when one answers 2xx).
    pub health_path: String,
    /// Interval between readiness probes, ms.
    pub health_interval_ms: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            discover: Vec::new(),
            discover_interval_ms: 5_000,
            connect_timeout_ms: 5_000,
            first_byte_timeout_ms: 300_000,
            stream_idle_timeout_ms: 120_000,
            total_timeout_ms: 0,
            pool_idle_timeout_ms: 90_000,
            pool_max_idle_per_host: 256,
            health_path: "/health".into(),
            health_interval_ms: 2_000,
        }
    }
}

/// What the meter does besides watching: usage injection, the model label set, the record
/// ring and the optional JSONL sink.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeasureConfig {
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
}

impl Default for MeasureConfig {
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
        }
    }
}

/// `[sink]`: where records go besides the ring and the JSONL file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkSection {
    /// `[sink.clickhouse]`: ship every record to ClickHouse. Default: unset (off).
    pub clickhouse: Option<ClickHouseConfig>,
}

/// `[sink.clickhouse]`: records batched over ClickHouse's HTTP interface
/// (`INSERT INTO db.table FORMAT JSONEachRow`, gzip), off the request path. See
/// docs/clickhouse.md and config/clickhouse/schema.sql.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClickHouseConfig {
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

impl Default for ClickHouseConfig {
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

impl ClickHouseConfig {
    /// The password: `password`, else the environment variable `password_env`, else empty.
    pub fn resolved_password(&self) -> String {
        self.password
            .clone()
            .or_else(|| std::env::var(&self.password_env).ok())
            .unwrap_or_default()
    }
    pub fn flush_interval(&self) -> Duration {
        ms(self.flush_interval_ms)
    }
    pub fn timeout(&self) -> Duration {
        ms(self.timeout_ms)
    }
    pub fn retry_initial(&self) -> Duration {
        ms(self.retry_initial_ms)
    }
    pub fn retry_max(&self) -> Duration {
        ms(self.retry_max_ms)
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        let ident =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        crate::upstream::parse_base_url(&self.url)
            .map_err(|m| ("sink.clickhouse.url", format!("`{}`: {m}", self.url)))?;
        if !ident(&self.database) {
            return Err((
                "sink.clickhouse.database",
                "letters, digits and _ only".into(),
            ));
        }
        if !ident(&self.table) {
            return Err(("sink.clickhouse.table", "letters, digits and _ only".into()));
        }
        for (field, v) in [
            ("sink.clickhouse.batch_size", self.batch_size as u64),
            ("sink.clickhouse.flush_interval_ms", self.flush_interval_ms),
            ("sink.clickhouse.queue", self.queue as u64),
            ("sink.clickhouse.timeout_ms", self.timeout_ms),
            ("sink.clickhouse.retry_initial_ms", self.retry_initial_ms),
            ("sink.clickhouse.max_attempts", u64::from(self.max_attempts)),
        ] {
            if v == 0 {
                return Err((field, "must be positive".into()));
            }
        }
        if self.retry_max_ms < self.retry_initial_ms {
            return Err((
                "sink.clickhouse.retry_max_ms",
                "must be at least retry_initial_ms".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageInjection {
    Auto,
    Off,
}

/// Service-level objectives a request must meet to count as good (in ms; 0 = not judged).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloConfig {
    pub ttft_ms: u64,
    pub tpot_ms: u64,
    pub e2e_ms: u64,
    /// Per-model overrides (`[slo.models."llama-70b"]`); a field left out keeps the global value.
    pub models: std::collections::BTreeMap<String, SloOverride>,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            ttft_ms: 2_000,
            tpot_ms: 150,
            e2e_ms: 30_000,
            models: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloOverride {
    pub ttft_ms: Option<u64>,
    pub tpot_ms: Option<u64>,
    pub e2e_ms: Option<u64>,
}

impl SloConfig {
    /// The table the meter judges by.
    pub fn table(&self) -> goodput_measure::slo::SloTable {
        use goodput_measure::slo::{Slo, SloTable};
        let limit = |v: u64| (v > 0).then(|| ms(v));
        let default = Slo {
            ttft: limit(self.ttft_ms),
            tpot: limit(self.tpot_ms),
            e2e: limit(self.e2e_ms),
        };
        let per_model = self
            .models
            .iter()
            .map(|(name, o)| {
                let slo = Slo {
                    ttft: o.ttft_ms.map_or(default.ttft, limit),
                    tpot: o.tpot_ms.map_or(default.tpot, limit),
                    e2e: o.e2e_ms.map_or(default.e2e, limit),
                };
                (name.clone(), slo)
            })
            .collect();
        SloTable { default, per_model }
    }
}

impl MeasureConfig {
    pub fn models_refresh(&self) -> Duration {
        ms(self.models_refresh_ms)
    }

    pub fn goodput_window(&self) -> Duration {
        Duration::from_secs(self.goodput_window_s)
    }
}

/// The engine scraper: each replica's Prometheus `/metrics`, served again on the admin
/// `/metrics` (relabelled `upstream`), read by the balancer (queue) and the autoscale gauges.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
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
    /// Add the engine's waiting queue (`vllm:num_requests_waiting`) to a replica's in-flight
    /// count when balancing.
    pub balance_on_queue: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            scrape: true,
            path: "/metrics".into(),
            scrape_interval_ms: 5_000,
            scrape_timeout_ms: 2_000,
            max_bytes: 8 * 1024 * 1024,
            upstream_label: UpstreamLabel::Url,
            balance_on_queue: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamLabel {
    Url,
    Index,
}

impl EngineConfig {
    pub fn scrape_interval(&self) -> Duration {
        ms(self.scrape_interval_ms)
    }
    pub fn scrape_timeout(&self) -> Duration {
        ms(self.scrape_timeout_ms)
    }
}

/// Logs go to stderr.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter (`info`, `goodput_proxy=debug,info`); `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl ServerConfig {
    /// `instance`, else the hostname (`/proc/sys/kernel/hostname`, then `$HOSTNAME`), else
    /// `unknown`.
    pub fn instance_name(&self) -> String {
        if let Some(i) = &self.instance {
            return i.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown".into())
    }
    pub fn header_read_timeout(&self) -> Duration {
        ms(self.header_read_timeout_ms)
    }
    pub fn drain_delay(&self) -> Duration {
        ms(self.drain_delay_ms)
    }
    pub fn grace_period(&self) -> Duration {
        ms(self.grace_period_ms)
    }
}

impl UpstreamConfig {
    pub fn connect_timeout(&self) -> Duration {
        ms(self.connect_timeout_ms)
    }
    pub fn first_byte_timeout(&self) -> Duration {
        ms(self.first_byte_timeout_ms)
    }
    pub fn stream_idle_timeout(&self) -> Duration {
        ms(self.stream_idle_timeout_ms)
    }
    /// `None` when no total deadline is configured.
    pub fn total_timeout(&self) -> Option<Duration> {
        (self.total_timeout_ms > 0).then(|| ms(self.total_timeout_ms))
    }
    pub fn pool_idle_timeout(&self) -> Duration {
        ms(self.pool_idle_timeout_ms)
    }
    pub fn health_interval(&self) -> Duration {
        ms(self.health_interval_ms)
    }

    pub fn discover_interval(&self) -> Duration {
        ms(self.discover_interval_ms)
    }
}

impl Config {
    /// Reads `file` (when given), applies the environment overrides from `env`, validates.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let (mut config, origin) = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    file: path.to_path_buf(),
                    source,
                })?;
                (
                    Config::from_toml(&text, &path.display().to_string())?,
                    path.display().to_string(),
                )
            }
            None => (Config::default(), "defaults".to_string()),
        };
        config = config.with_env(env)?;
        config.validate(&origin)?;
        Ok(config)
    }

    /// Parses a TOML document; `file` names it in errors.
    pub fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_string(),
            message: e.to_string().trim_end().to_string(),
        })
    }

    /// Applies `GOODPUT_PROXY_<SECTION>_<FIELD>` overrides. Values are typed by the field they
    /// replace: lists are comma-separated, numbers and booleans parsed, the rest taken as strings.
    pub fn with_env(
        self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut overrides: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k != ENV_CONFIG_FILE)
            .collect();
        if overrides.is_empty() {
            return Ok(self);
        }
        overrides.sort();
        let sim = self.sim.clone();
        let mut root = toml::Table::try_from(&self).map_err(|e| ConfigError::Parse {
            file: "environment".into(),
            message: e.to_string(),
        })?;
        for (key, raw) in &overrides {
            let rest = key[ENV_PREFIX.len()..].to_ascii_lowercase();
            let invalid = |message: String| ConfigError::Invalid {
                origin: format!("environment variable {key}"),
                field: rest.replacen('_', ".", 1),
                message,
            };
            let (section, field) = rest
                .split_once('_')
                .ok_or_else(|| invalid("expected GOODPUT_PROXY_<SECTION>_<FIELD>".into()))?;
            let table = root
                .get_mut(section)
                .and_then(|v| v.as_table_mut())
                .ok_or_else(|| invalid(format!("unknown section `{section}`")))?;
            let value = match table.get(field) {
                Some(current) => typed_like(current, raw).map_err(invalid)?,
                // Optional fields are absent from the serialized defaults; they are all paths.
                None if is_optional_field(section, field) => toml::Value::String(raw.clone()),
                None => return Err(invalid("unknown field".into())),
            };
            table.insert(field.to_string(), value);
        }
        let mut config =
            Config::deserialize(toml::Value::Table(root)).map_err(|e| ConfigError::Parse {
                file: "environment".into(),
                message: e.to_string().trim_end().to_string(),
            })?;
        config.sim = sim;
        Ok(config)
    }

    /// Checks what serde cannot; `origin` names the file (or "defaults") in errors.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |field: &str, message: &str| {
            Err(ConfigError::Invalid {
                origin: origin.to_string(),
                field: field.to_string(),
                message: message.to_string(),
            })
        };
        let s = &self.server;
        if s.tls_cert.is_some() != s.tls_key.is_some() {
            return bad(
                "server.tls_cert",
                "tls_cert and tls_key must be set together",
            );
        }
        if s.listen == s.admin_listen && s.listen.port() != 0 {
            return bad("server.admin_listen", "must differ from server.listen");
        }
        if s.max_in_flight == 0 {
            return bad("server.max_in_flight", "must be at least 1");
        }
        if s.header_read_timeout_ms == 0 {
            return bad("server.header_read_timeout_ms", "must be positive");
        }
        if s.paths.is_empty() {
            return bad("server.paths", "must list at least one path");
        }
        if let Some(p) = s.paths.iter().find(|p| !p.starts_with('/')) {
            return bad("server.paths", &format!("`{p}` must start with `/`"));
        }
        let u = &self.upstream;
        for url in &u.urls {
            if let Err(message) = crate::upstream::parse_base_url(url) {
                return bad("upstream.urls", &format!("`{url}`: {message}"));
            }
        }
        for d in &u.discover {
            if let Err(message) = crate::upstream::discover::DnsTarget::parse(d) {
                return bad("upstream.discover", &format!("`{d}`: {message}"));
            }
        }
        if !u.discover.is_empty() && u.discover_interval_ms == 0 {
            return bad("upstream.discover_interval_ms", "must be positive");
        }
        for (field, v) in [
            ("upstream.connect_timeout_ms", u.connect_timeout_ms),
            ("upstream.first_byte_timeout_ms", u.first_byte_timeout_ms),
            ("upstream.stream_idle_timeout_ms", u.stream_idle_timeout_ms),
            ("upstream.health_interval_ms", u.health_interval_ms),
        ] {
            if v == 0 {
                return bad(field, "must be positive");
            }
        }
        if !u.health_path.starts_with('/') {
            return bad("upstream.health_path", "must start with `/`");
        }
        let m = &self.measure;
        if m.records == 0 {
            return bad("measure.records", "must be at least 1");
        }
        if m.models_refresh_ms == 0 {
            return bad("measure.models_refresh_ms", "must be positive");
        }
        if m.goodput_window_s == 0 {
            return bad("measure.goodput_window_s", "must be positive");
        }
        if m.sink_path.is_some() && (m.sink_queue == 0 || m.sink_max_bytes == 0) {
            return bad(
                "measure.sink_queue",
                "sink_queue and sink_max_bytes must be positive",
            );
        }
        if let Some(ch) = &self.sink.clickhouse {
            if let Err((field, message)) = ch.validate() {
                return bad(field, &message);
            }
        }
        if let Some(i) = &s.instance {
            if i.is_empty() || i.len() > 256 {
                return bad("server.instance", "1 to 256 characters");
            }
        }
        let e = &self.engine;
        if e.scrape_interval_ms == 0 || e.scrape_timeout_ms == 0 {
            return bad(
                "engine.scrape_interval_ms",
                "scrape_interval_ms and scrape_timeout_ms must be positive",
            );
        }
        if e.max_bytes == 0 {
            return bad("engine.max_bytes", "must be positive");
        }
        if !e.path.starts_with('/') {
            return bad("engine.path", "must start with `/`");
        }
        if let Some(name) = self.slo.models.keys().find(|n| n.is_empty()) {
            return bad("slo.models", &format!("`{name}`: empty model name"));
        }
        if let Some(sim) = &self.sim {
            if let Err(e) = sim.validate() {
                return bad(&format!("sim.{}", e.field), &e.reason);
            }
        }
        Ok(())
    }
}

fn is_optional_field(section: &str, field: &str) -> bool {
    matches!(
        (section, field),
        ("server", "tls_cert" | "tls_key" | "instance") | ("measure", "sink_path")
    )
}

/// Parses an environment value into the TOML type of the value it replaces.
fn typed_like(current: &toml::Value, raw: &str) -> Result<toml::Value, String> {
    use toml::Value;
    Ok(match current {
        Value::Integer(_) => Value::Integer(
            raw.trim()
                .parse()
                .map_err(|_| format!("`{raw}` is not an integer"))?,
        ),
        Value::Float(_) => Value::Float(
            raw.trim()
                .parse()
                .map_err(|_| format!("`{raw}` is not a number"))?,
        ),
        Value::Boolean(_) => Value::Boolean(
            raw.trim()
                .parse()
                .map_err(|_| format!("`{raw}` is not true/false"))?,
        ),
        Value::Array(_) => Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        ),
        _ => Value::String(raw.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shipped_example_parses_and_validates() {
        let text = include_str!("../config/goodput-proxy.toml");
        let c = Config::from_toml(text, "goodput-proxy.toml").unwrap();
        c.validate("goodput-proxy.toml").unwrap();
    }

    #[test]
    fn unknown_field_names_field_and_file() {
        let err = Config::from_toml("[server]\nlisten_addr = \"x\"\n", "my.toml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("my.toml:"), "{msg}");
        assert!(msg.contains("listen_addr"), "{msg}");
    }

    #[test]
    fn bad_type_names_field() {
        let err = Config::from_toml("[upstream]\nconnect_timeout_ms = \"5s\"\n", "a.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("connect_timeout_ms"), "{err}");
    }

    #[test]
    fn env_overrides_are_typed_by_field() {
        let c = Config::default()
            .with_env(env(&[
                ("GOODPUT_PROXY_SERVER_LISTEN", "0.0.0.0:1234"),
                ("GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT", "7"),
                ("GOODPUT_PROXY_UPSTREAM_URLS", "http://a:1, http://b:2"),
                ("GOODPUT_PROXY_LOG_FORMAT", "json"),
                ("GOODPUT_PROXY_SERVER_TLS_CERT", "/c.pem"),
                ("UNRELATED", "x"),
                ("GOODPUT_PROXY_CONFIG", "/etc/goodput-proxy.toml"),
            ]))
            .unwrap();
        assert_eq!(c.server.listen.port(), 1234);
        assert_eq!(c.server.max_in_flight, 7);
        assert_eq!(c.upstream.urls, vec!["http://a:1", "http://b:2"]);
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.server.tls_cert.as_deref(), Some(Path::new("/c.pem")));
    }

    #[test]
    fn env_errors_name_the_variable_and_field() {
        for (k, v, want) in [
            ("GOODPUT_PROXY_SERVER_NOPE", "1", "server.nope"),
            (
                "GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT",
                "many",
                "max_in_flight",
            ),
            ("GOODPUT_PROXY_BOGUS_X", "1", "bogus"),
        ] {
            let msg = Config::default()
                .with_env(env(&[(k, v)]))
                .unwrap_err()
                .to_string();
            assert!(msg.contains(k), "{msg}");
            assert!(msg.contains(want), "{msg}");
        }
    }

    #[test]
    fn measure_and_slo_settings() {
        let c = Config::from_toml(
            "[measure]\nusage_injection = \"off\"\nmodels = [\"a\"]\nrecords = 10\n\
             [slo]\nttft_ms = 500\ne2e_ms = 0\n[slo.models.big]\nttft_ms = 4000\n",
            "m.toml",
        )
        .unwrap();
        c.validate("m.toml").unwrap();
        assert_eq!(c.measure.usage_injection, UsageInjection::Off);
        assert_eq!(c.measure.records, 10);
        let t = c.slo.table();
        assert_eq!(t.default.ttft, Some(Duration::from_millis(500)));
        assert_eq!(t.default.tpot, Some(Duration::from_millis(150)));
        assert_eq!(t.default.e2e, None);
        let big = t.for_model("big");
        assert_eq!(big.ttft, Some(Duration::from_secs(4)));
        assert_eq!(big.tpot, t.default.tpot);
        assert_eq!(t.for_model("small"), &t.default);
        let d = Config::default();
        assert_eq!(d.measure.usage_injection, UsageInjection::Auto);
        assert_eq!(d.measure.records, 100_000);
        let e = Config::default()
            .with_env(env(&[
                ("GOODPUT_PROXY_MEASURE_USAGE_INJECTION", "off"),
                ("GOODPUT_PROXY_MEASURE_SINK_PATH", "/tmp/r.jsonl"),
                ("GOODPUT_PROXY_SLO_TTFT_MS", "700"),
            ]))
            .unwrap();
        assert_eq!(e.measure.usage_injection, UsageInjection::Off);
        assert_eq!(
            e.measure.sink_path.as_deref(),
            Some(Path::new("/tmp/r.jsonl"))
        );
        assert_eq!(e.slo.ttft_ms, 700);
        let err = Config::from_toml("[measure]\nusage_injection = \"on\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("usage_injection"), "{err}");
    }

    #[test]
    fn engine_settings() {
        let d = Config::default();
        assert!(d.engine.scrape);
        assert_eq!(d.engine.scrape_interval(), Duration::from_secs(5));
        let c = Config::from_toml(
            "[engine]\nscrape = false\nscrape_interval_ms = 250\nupstream_label = \"index\"\n",
            "e.toml",
        )
        .unwrap();
        c.validate("e.toml").unwrap();
        assert!(!c.engine.scrape);
        assert_eq!(c.engine.scrape_interval_ms, 250);
        assert_eq!(c.engine.upstream_label, UpstreamLabel::Index);
        let e = Config::default()
            .with_env(env(&[
                ("GOODPUT_PROXY_ENGINE_SCRAPE", "false"),
                ("GOODPUT_PROXY_ENGINE_SCRAPE_INTERVAL_MS", "100"),
            ]))
            .unwrap();
        assert!(!e.engine.scrape);
        assert_eq!(e.engine.scrape_interval_ms, 100);
        let err = Config::from_toml("[engine]\nupstream_label = \"ip\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("upstream_label"), "{err}");
    }

    #[test]
    fn clickhouse_sink_settings() {
        assert!(
            Config::default().sink.clickhouse.is_none(),
            "off by default"
        );
        let c = Config::from_toml(
            "[server]\ninstance = \"p-1\"\n[sink.clickhouse]\nurl = \"http://ch:8123\"\nbatch_size = 500\n",
            "c.toml",
        )
        .unwrap();
        c.validate("c.toml").unwrap();
        let ch = c.sink.clickhouse.as_ref().unwrap();
        assert_eq!(
            (ch.batch_size, ch.flush_interval_ms, ch.queue),
            (500, 1_000, 100_000)
        );
        assert_eq!(
            (ch.database.as_str(), ch.table.as_str()),
            ("goodput", "records")
        );
        assert_eq!(c.server.instance_name(), "p-1");
        assert!(
            !Config::default().server.instance_name().is_empty(),
            "hostname"
        );
        let pw = ClickHouseConfig {
            password: None,
            password_env: "GOODPUT_TEST_SURELY_UNSET_VAR".into(),
            ..Default::default()
        };
        assert_eq!(pw.resolved_password(), "");
        for (toml, field) in [
            ("url = \"https://ch\"", "sink.clickhouse.url"),
            ("table = \"a;drop\"", "sink.clickhouse.table"),
            ("batch_size = 0", "sink.clickhouse.batch_size"),
            ("retry_max_ms = 1", "sink.clickhouse.retry_max_ms"),
        ] {
            let c = Config::from_toml(&format!("[sink.clickhouse]\n{toml}\n"), "c.toml").unwrap();
            let msg = c.validate("c.toml").unwrap_err().to_string();
            assert!(msg.contains(field), "{field}: {msg}");
        }
        let err = Config::from_toml("[sink.clickhouse]\nurls = []\n", "c.toml").unwrap_err();
        assert!(err.to_string().contains("urls"), "{err}");
    }

    #[test]
    fn validation_names_the_field() {
        type Case = (&'static str, fn(&mut Config));
        let cases: Vec<Case> = vec![
            ("server.tls_cert", |c| c.server.tls_cert = Some("x".into())),
            ("server.max_in_flight", |c| c.server.max_in_flight = 0),
            ("upstream.urls", |c| {
                c.upstream.urls = vec!["ftp://x".into()]
            }),
            ("server.paths", |c| c.server.paths = vec!["v1".into()]),
            ("upstream.first_byte_timeout_ms", |c| {
                c.upstream.first_byte_timeout_ms = 0
            }),
            ("measure.records", |c| c.measure.records = 0),
            ("engine.scrape_interval_ms", |c| {
                c.engine.scrape_timeout_ms = 0
            }),
            ("engine.path", |c| c.engine.path = "metrics".into()),
        ];
        for (field, mutate) in cases {
            let mut c = Config::default();
            mutate(&mut c);
            let msg = c.validate("f.toml").unwrap_err().to_string();
            assert!(msg.starts_with("f.toml: field `"), "{msg}");
            assert!(msg.contains(field), "{field}: {msg}");
        }
    }
}
