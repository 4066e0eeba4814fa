//! What serde cannot check, and the raw config turned into the checked one. Every check runs;
//! each failure is one [`Problem`] naming its field.

use std::time::Duration;

use super::raw::{
    Limit, RawAdmin, RawAuth, RawClickHouse, RawConfig, RawEngine, RawLimits, RawMeasure,
    RawServer, RawSlo, RawTrace, RawUpstream,
};
use super::{
    AdminConfig, AuthConfig, BaseUrl, ClickHouseConfig, Config, DnsTarget, EngineConfig,
    EngineKind, JsonlSink, MeasureConfig, Origin, Problem, ServerConfig, TenantConfig, TlsFiles,
    TraceConfig, UpstreamConfig,
};
use goodput_measure::slo::{Slo, SloTable};

/// `raw` checked; `origin` tells where a field's value came from (for the messages).
pub fn check(raw: &RawConfig, origin: &dyn Fn(&str) -> Origin) -> Result<Config, Vec<Problem>> {
    let mut c = Checker {
        origin,
        problems: Vec::new(),
    };
    let e = &raw.engine;
    let config = Config {
        server: c.server(&raw.server),
        limits: c.limits(&raw.limits),
        upstream: c.upstream(&raw.upstream, &raw.balance),
        auth: c.auth(&raw.auth, raw.measure.enabled),
        admin: c.admin(&raw.admin),
        log: raw.log.clone(),
        measure: c.measure(&raw.measure),
        trace: c.trace(&raw.trace),
        slo: c.slo(&raw.slo),
        engine: EngineConfig {
            scrape: e.scrape,
            path: c.path("engine.path", &e.path),
            scrape_interval: c.positive_ms("engine.scrape_interval_ms", e.scrape_interval_ms),
            scrape_timeout: c.positive_ms("engine.scrape_timeout_ms", e.scrape_timeout_ms),
            max_bytes: c.positive("engine.max_bytes", e.max_bytes),
            upstream_label: e.upstream_label,
            balance_on_queue: e.balance_on_queue,
            kind: c.engine_kind(e),
            kinds: c.engine_kinds(e, &raw.upstream),
            usage_unasked: c.usage_unasked(e, &raw.upstream),
        },
        clickhouse: raw.sink.clickhouse.as_ref().and_then(|ch| c.clickhouse(ch)),
        sim: raw.sim.clone(),
        scale: raw.scale.clone(),
    };
    for (field, message) in raw.scale.problems() {
        c.bad(field, message);
    }
    if let Some(sim) = &raw.sim {
        if let Err(e) = sim.validate() {
            c.bad(&format!("sim.{}", e.field), &e.reason);
        }
    }
    if c.problems.is_empty() {
        Ok(config)
    } else {
        Err(c.problems)
    }
}

fn kind_choices(got: &str) -> String {
    let names: Vec<&str> = EngineKind::ALL.iter().map(|k| k.as_str()).collect();
    format!("`{got}`: expected `auto` or one of {}", names.join(", "))
}

struct Checker<'a> {
    origin: &'a dyn Fn(&str) -> Origin,
    problems: Vec<Problem>,
}

/// The smallest `upstream.read_buffer_bytes` (a vLLM response head is about 200 bytes).
const MIN_UPSTREAM_READ_BUFFER: usize = 1024;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Checker<'_> {
    fn bad(&mut self, field: &str, message: &str) {
        let origin = (self.origin)(field);
        self.problems.push(Problem::new(field, origin, message));
    }

    fn positive_ms(&mut self, field: &str, v: u64) -> Duration {
        if v == 0 {
            self.bad(field, "must be positive");
        }
        ms(v)
    }

    fn positive<T: Copy + Default + PartialEq>(&mut self, field: &str, v: T) -> T {
        if v == T::default() {
            self.bad(field, "must be positive");
        }
        v
    }

    /// `upstream.read_buffer_bytes`: 0 is hyper's adaptive buffer; else room for a response
    /// head.
    fn read_buffer(&mut self, bytes: usize) -> Option<usize> {
        if bytes != 0 && bytes < MIN_UPSTREAM_READ_BUFFER {
            self.bad(
                "upstream.read_buffer_bytes",
                &format!("must be 0 (adaptive) or at least {MIN_UPSTREAM_READ_BUFFER}"),
            );
        }
        (bytes != 0).then_some(bytes)
    }

    /// A limit: milliseconds or none; 0 is neither.
    fn limit(&mut self, field: &str, l: Limit) -> Option<Duration> {
        match l {
            Limit::Ms(0) => {
                self.bad(field, "0 is not a limit: write \"none\" for none");
                None
            }
            Limit::Ms(v) => Some(ms(v)),
            Limit::None => None,
        }
    }

    fn path(&mut self, field: &str, p: &str) -> String {
        if !p.starts_with('/') {
            self.bad(field, &format!("`{p}` must start with `/`"));
        }
        p.to_string()
    }

    /// `engine.kind`: `auto` is `None` (detected per replica).
    fn engine_kind(&mut self, e: &RawEngine) -> Option<EngineKind> {
        if e.kind == "auto" {
            return None;
        }
        let kind = EngineKind::parse(&e.kind);
        if kind.is_none() {
            self.bad("engine.kind", &kind_choices(&e.kind));
        }
        kind
    }

    /// `engine.kinds`: each key one of `upstream.urls`, each value an engine.
    fn engine_kinds(&mut self, e: &RawEngine, u: &RawUpstream) -> Vec<(String, EngineKind)> {
        let mut out = Vec::new();
        for (url, kind) in &e.kinds {
            let field = format!("engine.kinds.\"{url}\"");
            let url = url.trim_end_matches('/');
            if !u.urls.iter().any(|c| c.trim_end_matches('/') == url) {
                self.bad(&field, &format!("`{url}` is not one of upstream.urls"));
                continue;
            }
            match EngineKind::parse(kind) {
                Some(k) => out.push((url.to_string(), k)),
                None => self.bad(&field, &kind_choices(kind)),
            }
        }
        out
    }

    /// `engine.usage_unasked`: each one of `upstream.urls`.
    fn usage_unasked(&mut self, e: &RawEngine, u: &RawUpstream) -> Vec<String> {
        let mut out = Vec::new();
        for url in &e.usage_unasked {
            let url = url.trim_end_matches('/');
            if u.urls.iter().any(|c| c.trim_end_matches('/') == url) {
                out.push(url.to_string());
            } else {
                self.bad(
                    "engine.usage_unasked",
                    &format!("`{url}` is not one of upstream.urls"),
                );
            }
        }
        out
    }

    fn base_url(&mut self, field: &str, url: &str) -> Option<BaseUrl> {
        BaseUrl::parse(url)
            .map_err(|m| self.bad(field, &format!("`{url}`: {m}")))
            .ok()
    }

    fn server(&mut self, s: &RawServer) -> ServerConfig {
        let tls = match (&s.tls_cert, &s.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => None,
            (Some(_), None) => {
                self.bad("server.tls_cert", "set without server.tls_key");
                None
            }
            (None, Some(_)) => {
                self.bad("server.tls_key", "set without server.tls_cert");
                None
            }
        };
        if s.listen == s.admin_listen && s.listen.port() != 0 {
            self.bad("server.admin_listen", "must differ from server.listen");
        }
        if s.paths.is_empty() {
            self.bad("server.paths", "must list at least one path");
        }
        for p in &s.paths {
            self.path("server.paths", p);
        }
        if let Some(i) = &s.instance {
            if i.is_empty() || i.len() > 256 {
                self.bad("server.instance", "1 to 256 characters");
            }
        }
        ServerConfig {
            listen: s.listen,
            admin_listen: s.admin_listen,
            tls,
            header_read_timeout: self
                .positive_ms("server.header_read_timeout_ms", s.header_read_timeout_ms),
            max_body_bytes: s.max_body_bytes,
            max_in_flight: self.positive("server.max_in_flight", s.max_in_flight),
            retry_after: Duration::from_secs(s.retry_after_s),
            paths: s.paths.clone(),
            drain_delay: ms(s.drain_delay_ms),
            grace_period: ms(s.grace_period_ms),
            instance: s.instance.clone().unwrap_or_else(hostname),
            trusted_proxies: s.trusted_proxies,
        }
    }

    fn limits(&mut self, l: &RawLimits) -> crate::limits::Limits {
        let limits = l.to_limits();
        for (field, message) in limits.check() {
            self.bad(&format!("limits.{field}"), &message);
        }
        limits
    }

    fn upstream(&mut self, u: &RawUpstream, balance: &super::BalanceConfig) -> UpstreamConfig {
        for (field, message) in balance.problems() {
            self.bad(field, message);
        }
        let urls = u
            .urls
            .iter()
            .filter_map(|url| self.base_url("upstream.urls", url))
            .collect();
        let discover = u
            .discover
            .iter()
            .filter_map(|d| {
                DnsTarget::parse(d)
                    .map_err(|m| self.bad("upstream.discover", &format!("`{d}`: {m}")))
                    .ok()
            })
            .collect();
        UpstreamConfig {
            urls,
            discover,
            discover_interval: self
                .positive_ms("upstream.discover_interval_ms", u.discover_interval_ms),
            discover_hosts_file: u.discover_hosts_file.clone(),
            connect_timeout: self.positive_ms("upstream.connect_timeout_ms", u.connect_timeout_ms),
            first_byte_timeout: self
                .positive_ms("upstream.first_byte_timeout_ms", u.first_byte_timeout_ms),
            stream_idle_timeout: self
                .positive_ms("upstream.stream_idle_timeout_ms", u.stream_idle_timeout_ms),
            total_timeout: self.limit("upstream.total_timeout_ms", u.total_timeout_ms),
            pool_idle_timeout: ms(u.pool_idle_timeout_ms),
            pool_max_idle_per_host: u.pool_max_idle_per_host,
            read_buffer: self.read_buffer(u.read_buffer_bytes),
            health_path: self.path("upstream.health_path", &u.health_path),
            health_interval: self.positive_ms("upstream.health_interval_ms", u.health_interval_ms),
            authorization: u.api_key.as_deref().and_then(|k| self.upstream_key(k)),
            tls: self.upstream_tls(u),
            balance: balance.clone(),
        }
    }

    fn upstream_tls(&mut self, u: &RawUpstream) -> Option<super::UpstreamTls> {
        let client = match (&u.tls_client_cert, &u.tls_client_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            (Some(_), None) => {
                self.bad(
                    "upstream.tls_client_cert",
                    "set without upstream.tls_client_key",
                );
                None
            }
            (None, Some(_)) => {
                self.bad(
                    "upstream.tls_client_key",
                    "set without upstream.tls_client_cert",
                );
                None
            }
        };
        let https = u.urls.iter().any(|url| url.starts_with("https://"));
        match &u.tls_ca {
            Some(ca) => Some(super::UpstreamTls {
                ca: ca.clone(),
                client,
            }),
            None => {
                if https {
                    self.bad(
                        "upstream.tls_ca",
                        "https:// replicas need the CA bundle to verify them",
                    );
                }
                if client.is_some() {
                    self.bad("upstream.tls_client_cert", "needs upstream.tls_ca");
                }
                None
            }
        }
    }

    /// `upstream.api_key` as a header value; never echoed in a problem.
    fn upstream_key(&mut self, key: &str) -> Option<http::HeaderValue> {
        let visible = !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic());
        let value = visible
            .then(|| http::HeaderValue::from_str(&format!("Bearer {key}")).ok())
            .flatten();
        match value {
            Some(mut v) => {
                v.set_sensitive(true);
                Some(v)
            }
            None => {
                self.bad(
                    "upstream.api_key",
                    "must be visible ASCII without spaces (the value is not shown)",
                );
                None
            }
        }
    }

    fn admin(&mut self, a: &RawAdmin) -> AdminConfig {
        let token = a
            .token_sha256
            .as_deref()
            .and_then(|t| match crate::auth::parse_digest(t) {
                Ok(d) => Some(d),
                Err(m) => {
                    self.bad("admin.token_sha256", &m);
                    None
                }
            });
        AdminConfig {
            token,
            metrics_public: a.metrics_public,
            trace: a.trace,
            records: a.records,
        }
    }

    fn auth(&mut self, a: &RawAuth, measured: bool) -> AuthConfig {
        let mut tenants = Vec::new();
        for (name, t) in &a.tenants {
            let field = format!("auth.tenants.{name}");
            if let Err(m) = crate::auth::check_tenant_name(name) {
                self.bad(&field, &m);
            }
            let mut keys = Vec::new();
            for k in &t.keys {
                match crate::auth::parse_digest(k) {
                    Ok(d) => keys.push(d),
                    Err(m) => self.bad(&format!("{field}.keys"), &m),
                }
            }
            if t.keys.is_empty() && a.keys_file.is_none() {
                self.bad(
                    &format!("{field}.keys"),
                    "a tenant needs a key (here or in auth.keys_file)",
                );
            }
            if t.max_in_flight == Some(0) {
                self.bad(&format!("{field}.max_in_flight"), "must be positive");
            }
            if t.tokens_per_minute == Some(0) {
                self.bad(&format!("{field}.tokens_per_minute"), "must be positive");
            }
            if t.tokens_per_minute.is_some() && !measured {
                self.bad(
                    &format!("{field}.tokens_per_minute"),
                    "needs measure.enabled (requests are charged with the usage their record counts)",
                );
            }
            tenants.push(TenantConfig {
                name: name.clone(),
                keys,
                limits: crate::auth::TenantLimits {
                    max_in_flight: t.max_in_flight,
                    tokens_per_minute: t.tokens_per_minute,
                },
            });
        }
        let file_tenants = match &a.keys_file {
            Some(path) => match crate::auth::file::load(path, &tenants) {
                Ok(t) => t,
                Err(problems) => {
                    for p in problems {
                        self.bad("auth.keys_file", &p);
                    }
                    Vec::new()
                }
            },
            None => {
                let all: Vec<&TenantConfig> = tenants.iter().collect();
                for p in crate::auth::file::conflicts(&all) {
                    self.bad("auth.tenants", &p);
                }
                Vec::new()
            }
        };
        AuthConfig {
            keys_file: a.keys_file.clone(),
            tenants,
            file_tenants,
        }
    }

    fn measure(&mut self, m: &RawMeasure) -> MeasureConfig {
        let jsonl = m.sink_path.as_ref().map(|path| JsonlSink {
            path: path.clone(),
            max_bytes: self.positive("measure.sink_max_bytes", m.sink_max_bytes),
            keep: m.sink_keep,
            queue: self.positive("measure.sink_queue", m.sink_queue),
        });
        MeasureConfig {
            enabled: m.enabled,
            usage_injection: m.usage_injection,
            models: m.models.clone(),
            models_refresh: self.positive_ms("measure.models_refresh_ms", m.models_refresh_ms),
            records: self.positive("measure.records", m.records),
            jsonl,
            goodput_window: Duration::from_secs(
                self.positive("measure.goodput_window_s", m.goodput_window_s),
            ),
            stall: Duration::from_millis(self.positive("measure.stall_ms", m.stall_ms)),
        }
    }

    fn trace(&mut self, t: &RawTrace) -> TraceConfig {
        if !(0.0..=1.0).contains(&t.sample_rate) {
            self.bad("trace.sample_rate", "must be between 0 and 1");
        }
        TraceConfig {
            sample_rate: t.sample_rate,
            bounds: goodput_measure::trace::TraceBounds {
                max_tokens: self.positive("trace.max_tokens", t.max_tokens),
            },
            max_traces: t.max_traces,
        }
    }

    fn slo(&mut self, s: &RawSlo) -> SloTable {
        let default = Slo {
            ttft: self.limit("slo.ttft_ms", s.ttft_ms),
            tpot: self.limit("slo.tpot_ms", s.tpot_ms),
            e2e: self.limit("slo.e2e_ms", s.e2e_ms),
            max_stall: self.limit("slo.max_stall_ms", s.max_stall_ms),
            valid_tool_calls: s.valid_tool_calls,
        };
        let mut per_model = std::collections::HashMap::new();
        for (name, o) in &s.models {
            if name.is_empty() {
                self.bad("slo.models", "empty model name");
            }
            let mut one = |field: &str, v: Option<Limit>, global: Option<Duration>| match v {
                Some(l) => self.limit(&format!("slo.models.{name}.{field}"), l),
                None => global,
            };
            let slo = Slo {
                ttft: one("ttft_ms", o.ttft_ms, default.ttft),
                tpot: one("tpot_ms", o.tpot_ms, default.tpot),
                e2e: one("e2e_ms", o.e2e_ms, default.e2e),
                max_stall: one("max_stall_ms", o.max_stall_ms, default.max_stall),
                valid_tool_calls: default.valid_tool_calls,
            };
            per_model.insert(name.clone(), slo);
        }
        SloTable { default, per_model }
    }

    /// `None` only with a problem pushed (a bad URL).
    fn clickhouse(&mut self, ch: &RawClickHouse) -> Option<ClickHouseConfig> {
        let ident =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        for (field, v) in [
            ("sink.clickhouse.database", &ch.database),
            ("sink.clickhouse.table", &ch.table),
        ] {
            if !ident(v) {
                self.bad(field, &format!("`{v}`: letters, digits and _ only"));
            }
        }
        if ch.retry_max_ms < ch.retry_initial_ms {
            self.bad(
                "sink.clickhouse.retry_max_ms",
                "must be at least retry_initial_ms",
            );
        }
        if ch.url.starts_with("https://") {
            self.bad("sink.clickhouse.url", "http:// only (the sink has no TLS)");
        }
        let url = self
            .base_url("sink.clickhouse.url", &ch.url)
            .filter(|u| !u.as_str().starts_with("https://"));
        // Fields are evaluated in the order written: `url?` last, after every check ran.
        Some(ClickHouseConfig {
            database: ch.database.clone(),
            table: ch.table.clone(),
            user: ch.user.clone(),
            password: ch
                .password
                .clone()
                .or_else(|| std::env::var(&ch.password_env).ok())
                .unwrap_or_default(),
            batch_size: self.positive("sink.clickhouse.batch_size", ch.batch_size),
            flush_interval: self
                .positive_ms("sink.clickhouse.flush_interval_ms", ch.flush_interval_ms),
            queue: self.positive("sink.clickhouse.queue", ch.queue),
            timeout: self.positive_ms("sink.clickhouse.timeout_ms", ch.timeout_ms),
            retry_initial: self
                .positive_ms("sink.clickhouse.retry_initial_ms", ch.retry_initial_ms),
            retry_max: ms(ch.retry_max_ms),
            max_attempts: self.positive("sink.clickhouse.max_attempts", ch.max_attempts),
            gzip: ch.gzip,
            url: url?,
        })
    }
}

/// The hostname (`/proc/sys/kernel/hostname`, then `$HOSTNAME`), else `unknown`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
