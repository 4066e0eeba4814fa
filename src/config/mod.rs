//! Configuration. The file as written ([`raw`], serde, unknown fields are errors) becomes a
//! checked [`Config`] (durations, parsed URLs, `Option` for "none") in one pass that reports
//! every problem at once, each with its field and where its value came from.
//!
//! Precedence, lowest first: built-in defaults, the TOML file, `GOODPUT_PROXY_*` environment
//! variables ([`env`]: named and typed from the schema), command-line flags.
//!
//! - [`raw`]: the schema; every field documented (and in config/goodput-proxy.toml).
//! - [`schema`]: the schema's paths and kinds, read from the serde impl.
//! - [`env`]: environment overrides.
//! - [`layers`]: file + environment + flags in one tree, deserialized with every error.
//! - [`check`]: what serde cannot check; raw -> checked.
//! - [`target`]: base URLs and DNS targets.

pub mod balance;
pub mod check;
pub mod env;
pub mod layers;
pub mod raw;
pub mod scale;
pub mod schema;
pub mod target;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::auth::{AuthConfig, TenantConfig};
pub use balance::{BalanceConfig, Strategy};
pub use env::{ENV_CONFIG_FILE, ENV_PREFIX};
pub use raw::{
    Limit, LogConfig, LogFormat, RawAuth, RawClickHouse, RawConfig, RawEngine, RawLimits,
    RawMeasure, RawServer, RawSink, RawSlo, RawTenant, RawUpstream, SloOverride, UpstreamLabel,
    UsageInjection,
};
pub use scale::ScaleConfig;
pub use target::{parse_base_url, BaseUrl, DnsTarget};

use goodput_measure::slo::SloTable;

/// The checked configuration: what the proxy runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    /// `[limits]`: the listeners' connection, head and body-read limits.
    pub limits: crate::limits::Limits,
    pub upstream: UpstreamConfig,
    /// `[auth]`: keys and tenants (off when it has neither a tenant nor a keys file).
    pub auth: AuthConfig,
    /// `[admin]`: the admin token and what the admin port reveals.
    pub admin: AdminConfig,
    pub log: LogConfig,
    pub measure: MeasureConfig,
    /// `[trace]`: which requests get a token-level trace, and its bounds.
    pub trace: TraceConfig,
    /// The SLOs every request is judged by (per model where configured).
    pub slo: SloTable,
    pub engine: EngineConfig,
    /// `[sink.clickhouse]`, when set.
    pub clickhouse: Option<ClickHouseConfig>,
    /// `[sim]`: the demo engine's settings, when set.
    pub sim: Option<goodput_sim::SimConfig>,
    /// `[scale]`: attainment windows, headroom and desired replicas.
    pub scale: ScaleConfig,
}

/// `[admin]`, checked (see `raw::RawAdmin`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdminConfig {
    /// The token's SHA-256 digest; `None`: no token asked for.
    pub token: Option<crate::auth::Digest>,
    pub metrics_public: bool,
    pub trace: bool,
    pub records: bool,
}

impl AdminConfig {
    /// A warning when what the admin port reveals is open to whoever reaches `listen`: not
    /// loopback, and no token.
    pub fn exposure_warning(&self, listen: SocketAddr) -> Option<String> {
        (self.token.is_none() && !listen.ip().is_loopback()).then(|| {
            format!(
                "server.admin_listen {listen} is not loopback and admin.token_sha256 is not set: \
                 /stats, the live page (/, /dashboard.json){}{} are open to anyone who reaches \
                 the port (set admin.token_sha256; `goodput-proxy hash-key --generate`)",
                if self.trace { ", /trace" } else { "" },
                if self.records { ", raw records" } else { "" },
            )
        })
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub tls: Option<TlsFiles>,
    pub header_read_timeout: Duration,
    pub max_body_bytes: u64,
    pub max_in_flight: usize,
    pub retry_after: Duration,
    pub paths: Vec<String>,
    pub drain_delay: Duration,
    pub grace_period: Duration,
    /// `server.instance`, else the hostname, else `unknown`.
    pub instance: String,
    /// `server.trusted_proxies`: proxies in front whose `X-Forwarded-For` entries are kept.
    pub trusted_proxies: usize,
}

/// `server.tls_cert` and `server.tls_key`, set together.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub urls: Vec<BaseUrl>,
    pub discover: Vec<DnsTarget>,
    pub discover_interval: Duration,
    /// `upstream.discover_hosts_file`: names resolved from this file instead of the system.
    pub discover_hosts_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub stream_idle_timeout: Duration,
    /// `None`: no total deadline.
    pub total_timeout: Option<Duration>,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// `upstream.read_buffer_bytes`; `None`: hyper's adaptive buffer.
    pub read_buffer: Option<usize>,
    pub health_path: String,
    pub health_interval: Duration,
    /// `upstream.tls_ca` and the optional client certificate, for `https://` replicas.
    pub tls: Option<UpstreamTls>,
    /// `upstream.api_key` as the header value sent (`Bearer <key>`, marked sensitive so it is
    /// never printed).
    pub authorization: Option<http::HeaderValue>,
    /// `[balance]`: how each request's replica is chosen.
    pub balance: BalanceConfig,
}

/// Upstream TLS files (`upstream.tls_ca`, `tls_client_cert` + `tls_client_key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    pub ca: PathBuf,
    /// Client certificate chain and key (mTLS), set together.
    pub client: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, Clone)]
pub struct MeasureConfig {
    pub enabled: bool,
    pub usage_injection: UsageInjection,
    pub models: Vec<String>,
    pub models_refresh: Duration,
    pub records: usize,
    /// `measure.sink_path` and its rotation, when set.
    pub jsonl: Option<JsonlSink>,
    pub goodput_window: Duration,
    /// `measure.stall_ms`.
    pub stall: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceConfig {
    /// Share of generation requests traced without asking (0..=1).
    pub sample_rate: f64,
    /// Each trace's bounds (`max_tokens`).
    pub bounds: goodput_measure::trace::TraceBounds,
    /// Traces kept in the ring (0: none).
    pub max_traces: usize,
}

#[derive(Debug, Clone)]
pub struct JsonlSink {
    pub path: PathBuf,
    pub max_bytes: u64,
    pub keep: usize,
    pub queue: usize,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub scrape: bool,
    pub path: String,
    pub scrape_interval: Duration,
    pub scrape_timeout: Duration,
    pub max_bytes: usize,
    pub upstream_label: UpstreamLabel,
    pub balance_on_queue: bool,
    /// The engine of every replica not in `kinds`; `None`: told from its families.
    pub kind: Option<EngineKind>,
    /// Per configured replica URL (as written, without a trailing `/`): its engine.
    pub kinds: Vec<(String, EngineKind)>,
    /// Replica URLs (as written, without a trailing `/`) whose engine adds usage to every
    /// stream, asked or not: usage is never injected into (nor stripped from) their streams.
    pub usage_unasked: Vec<String>,
}

impl EngineConfig {
    /// The configured engine of the replica at `url`, if any (else it is detected).
    pub fn kind_of(&self, url: &str) -> Option<EngineKind> {
        let url = url.trim_end_matches('/');
        self.kinds
            .iter()
            .find(|(u, _)| u == url)
            .map(|(_, k)| *k)
            .or(self.kind)
    }
}

/// The inference engines whose metric families the proxy reads (`engine::signals` maps each
/// one's names onto the same signals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    Vllm,
    Sglang,
    Llamacpp,
    Tgi,
    Trtllm,
}

impl EngineKind {
    pub const ALL: [EngineKind; 5] = [
        EngineKind::Vllm,
        EngineKind::Sglang,
        EngineKind::Llamacpp,
        EngineKind::Tgi,
        EngineKind::Trtllm,
    ];

    /// The name in the configuration and in the `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Llamacpp => "llamacpp",
            EngineKind::Tgi => "tgi",
            EngineKind::Trtllm => "trtllm",
        }
    }

    pub fn parse(s: &str) -> Option<EngineKind> {
        EngineKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    pub url: BaseUrl,
    pub database: String,
    pub table: String,
    pub user: String,
    /// `password`, else the variable `password_env`, else empty.
    pub password: String,
    pub batch_size: usize,
    pub flush_interval: Duration,
    pub queue: usize,
    pub timeout: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub max_attempts: u32,
    pub gzip: bool,
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Default,
    File(String),
    Env(String),
    Flag(&'static str),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default => f.write_str("defaults"),
            Origin::File(name) => f.write_str(name),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// One thing wrong with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path, `server.max_in_flight`.
    pub field: String,
    pub origin: Origin,
    pub message: String,
}

impl Problem {
    pub fn new(field: &str, origin: Origin, message: &str) -> Problem {
        Problem {
            field: field.to_string(),
            origin,
            message: message.to_string(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: field `{}`: {}",
            self.origin, self.field, self.message
        )
    }
}

/// A value set over the file and the environment (a command-line flag).
#[derive(Debug, Clone)]
pub struct Override {
    pub field: String,
    pub value: toml::Value,
    pub origin: Origin,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    /// TOML syntax: nothing after it can be read.
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    /// Every problem found, in field order.
    #[error("{}", lines(.0))]
    Invalid(Vec<Problem>),
}

fn lines(problems: &[Problem]) -> String {
    let all: Vec<String> = problems.iter().map(Problem::to_string).collect();
    all.join("\n")
}

impl ConfigError {
    /// The problems (one for a read or syntax error).
    pub fn problems(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid(p) => p.iter().map(Problem::to_string).collect(),
            other => vec![other.to_string()],
        }
    }
}

impl Config {
    /// Reads `file` (when given), applies the overrides in `env` (`GOODPUT_PROXY_*`, others
    /// ignored), then `flags`, and checks the result. Every problem is reported.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: Vec<Override>,
    ) -> Result<Config, ConfigError> {
        let mut layers = match file {
            Some(path) => layers::Layers::file(path)?,
            None => layers::Layers::default(),
        };
        let (overrides, problems) = env::overrides(env);
        for p in &problems {
            layers.unset(&p.field, p.origin.clone());
        }
        for o in overrides.into_iter().chain(flags) {
            layers.set(o);
        }
        finish(&layers, problems)
    }

    /// A TOML document alone (no environment, no flags); `name` names it in errors.
    pub fn from_toml(text: &str, name: &str) -> Result<Config, ConfigError> {
        finish(&layers::Layers::text(text, name)?, Vec::new())
    }
}

/// Deserializes and checks `layers`; `problems` are those found before (the environment's).
fn finish(layers: &layers::Layers, mut problems: Vec<Problem>) -> Result<Config, ConfigError> {
    let (raw, more) = layers.deserialize();
    problems.extend(more);
    match check::check(&raw, &|field| layers.origin(field)) {
        Ok(config) if problems.is_empty() => Ok(config),
        Ok(_) => Err(ConfigError::Invalid(problems)),
        Err(more) => {
            problems.extend(more);
            Err(ConfigError::Invalid(problems))
        }
    }
}

impl RawConfig {
    /// Checks a config built in code (tests, embedding); problems name the field, origin
    /// "defaults".
    pub fn check(&self) -> Result<Config, ConfigError> {
        check::check(self, &|_| Origin::Default).map_err(ConfigError::Invalid)
    }
}

impl Default for Config {
    /// The built-in defaults, checked (a unit test pins that they pass).
    fn default() -> Config {
        match RawConfig::default().check() {
            Ok(c) => c,
            Err(e) => panic!("the built-in defaults are invalid: {e}"),
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Config::default().upstream
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Config::default().engine
    }
}

impl Default for ClickHouseConfig {
    /// `[sink.clickhouse]` with nothing set.
    fn default() -> Self {
        let raw = RawConfig {
            sink: RawSink {
                clickhouse: Some(RawClickHouse::default()),
            },
            ..RawConfig::default()
        };
        match raw.check().map(|c| c.clickhouse) {
            Ok(Some(ch)) => ch,
            other => panic!("the built-in [sink.clickhouse] defaults are invalid: {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests;
