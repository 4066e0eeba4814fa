//! Engine metrics: each replica's `/metrics` scraped in the background ([`scrape`]), parsed
//! ([`parse`]), kept as the latest snapshot per replica, and read three ways: the admin
//! `/metrics` serves every engine's families after the proxy's own, relabelled
//! `upstream="<replica>"`; the balancer reads each engine's canonical signals (queue, running
//! batch, KV use: `Replica::engine_load`, set here after each scrape); autoscalers read the
//! `goodput_proxy_upstream_*` and `goodput_proxy_demand` gauges. Whatever the engine (vLLM,
//! SGLang, llama.cpp, TGI, TensorRT-LLM), [`signals`] maps its own families onto these.

pub mod parse;
pub mod scrape;
pub mod signals;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use prometheus::{Gauge, Registry};
use tokio::time::Instant;

use crate::config::{EngineConfig, EngineKind, UpstreamLabel};
use crate::metrics::labels::{ByUpstream, EngineOf};
use crate::metrics::{Counters, Gauges, IntGauges, Registrar};
use crate::upstream::{Replica, Upstreams};
use parse::{Family, Source};
use signals::Signals;

/// One successful scrape of one replica.
#[derive(Debug)]
pub struct Snapshot {
    pub families: Vec<Family>,
    pub signals: Signals,
    pub at: Instant,
}

/// Per replica: its label and what its last scrape left.
struct EngineReplica {
    /// The replica this belongs to (by identity: two configured replicas may share a URL).
    replica: Arc<Replica>,
    upstream: Arc<str>,
    /// The engine configured for it (`engine.kinds`, `engine.kind`); `None`: detected.
    configured: Option<EngineKind>,
    state: RwLock<ReplicaState>,
}

impl EngineReplica {
    fn new(replica: &Arc<Replica>, upstream: Arc<str>, config: &EngineConfig) -> Self {
        let configured = config.kind_of(&replica.url);
        if let Some(kind) = configured {
            // Known before the first scrape (and without scraping).
            replica.set_engine_kind(kind);
        }
        let url = replica.url.trim_end_matches('/');
        if config
            .usage_unasked
            .iter()
            .any(|u| u.trim_end_matches('/') == url)
        {
            replica.set_usage_unasked(crate::upstream::usage::Unasked::Configured);
        }
        Self {
            replica: replica.clone(),
            configured,
            upstream,
            state: RwLock::new(ReplicaState::default()),
        }
    }
}

#[derive(Default)]
struct ReplicaState {
    /// The latest good page; `None` while the last scrape failed (its families are omitted).
    latest: Option<Arc<Snapshot>>,
    last_ok: Option<Instant>,
    /// The last scrape failed (so a failure is logged once, also for a replica never up).
    failing: bool,
}

/// Labels given to discovered URLs, kept when a replica leaves so it gets the same one back;
/// and the next index label.
type DiscoveredLabels = (HashMap<Arc<str>, Arc<str>>, usize);

/// Every replica's engine snapshot and the gauges derived from them. Follows the replica set
/// ([`Engines::sync`] after discovery changed it).
pub struct Engines {
    replicas: RwLock<Arc<[Arc<EngineReplica>]>>,
    discovered_labels: Mutex<DiscoveredLabels>,
    metrics: EngineMetrics,
    config: EngineConfig,
}

struct EngineMetrics {
    scrape_errors: Counters<ByUpstream<'static>>,
    up: IntGauges<ByUpstream<'static>>,
    age: Gauges<ByUpstream<'static>>,
    queue_depth: Gauges<ByUpstream<'static>>,
    running: Gauges<ByUpstream<'static>>,
    kv_cache: Gauges<ByUpstream<'static>>,
    in_flight: IntGauges<ByUpstream<'static>>,
    healthy: IntGauges<ByUpstream<'static>>,
    kind: IntGauges<EngineOf<'static>>,
    demand: Gauge,
}

impl EngineMetrics {
    fn register(registry: &Registry) -> Result<EngineMetrics, prometheus::Error> {
        let r = Registrar::new(registry);
        Ok(EngineMetrics {
            scrape_errors: r.counters(
                "goodput_proxy_engine_scrape_errors_total",
                "Failed scrapes of an engine's /metrics (its families are omitted until one succeeds).",
            )?,
            up: r.int_gauges(
                "goodput_proxy_engine_up",
                "1 when the last scrape of the engine's /metrics succeeded, else 0.",
            )?,
            age: r.gauges(
                "goodput_proxy_engine_scrape_age_seconds",
                "Seconds since the engine's /metrics was last scraped successfully.",
            )?,
            queue_depth: r.gauges(
                "goodput_proxy_upstream_queue_depth",
                "Requests waiting in the engine's queue (vllm:num_requests_waiting, sglang:num_queue_reqs, llamacpp:requests_deferred, tgi_queue_size, trtllm_num_requests_waiting), last scrape.",
            )?,
            running: r.gauges(
                "goodput_proxy_upstream_running",
                "Requests in the engine's running batch (vllm:num_requests_running, sglang:num_running_reqs, llamacpp:requests_processing, tgi_batch_current_size, trtllm_num_requests_running), last scrape.",
            )?,
            kv_cache: r.gauges(
                "goodput_proxy_upstream_kv_cache_usage",
                "Engine KV-cache usage, 0..1 (vllm:kv_cache_usage_perc, sglang:token_usage, trtllm_kv_cache_utilization; none from TGI or recent llama.cpp), last scrape.",
            )?,
            in_flight: r.int_gauges(
                "goodput_proxy_upstream_in_flight",
                "Requests this proxy has sent to the replica and not finished.",
            )?,
            healthy: r.int_gauges(
                "goodput_proxy_upstream_healthy",
                "1 when the replica answered its last health probe (upstream.health_path), else 0.",
            )?,
            kind: r.int_gauges(
                "goodput_proxy_engine_kind",
                "1 for the engine a replica runs (configured, or told from the families its /metrics serves), last good scrape.",
            )?,
            demand: r.single(Gauge::new(
                "goodput_proxy_demand",
                "In-flight requests (all replicas) plus every scraped engine's waiting queue: one autoscaling signal.",
            )?)?,
        })
    }
}

/// The `upstream` label value of each replica, from configuration only: the URL (without any
/// `user:password@`) or the index. A repeated URL gets `#<index>` so series stay distinct.
pub fn upstream_labels(urls: &[&str], kind: UpstreamLabel) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(urls.len());
    for (i, url) in urls.iter().enumerate() {
        let label = match kind {
            UpstreamLabel::Index => i.to_string(),
            UpstreamLabel::Url => {
                let url = without_userinfo(url);
                if out.contains(&url) {
                    format!("{url}#{i}")
                } else {
                    url
                }
            }
        };
        out.push(label);
    }
    out
}

fn without_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let auth_end = rest.find('/').unwrap_or(rest.len());
    match rest[..auth_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

impl Engines {
    /// One entry per replica of `upstreams`; registers the engine families on `registry`.
    pub fn new(
        config: &EngineConfig,
        upstreams: &Upstreams,
        registry: &Registry,
    ) -> Result<Engines, prometheus::Error> {
        let configured = upstreams.replicas();
        let urls: Vec<&str> = configured.iter().map(|r| &*r.url).collect();
        let metrics = EngineMetrics::register(registry)?;
        let replicas: Vec<Arc<EngineReplica>> = upstream_labels(&urls, config.upstream_label)
            .into_iter()
            .zip(configured.iter())
            .map(|(l, r)| Arc::new(EngineReplica::new(r, Arc::from(l), config)))
            .collect();
        let e = Engines {
            discovered_labels: Mutex::new((HashMap::new(), replicas.len())),
            replicas: RwLock::new(replicas.into()),
            metrics,
            config: config.clone(),
        };
        for r in e.all().iter() {
            e.count_from_zero(r);
        }
        Ok(e)
    }

    fn all(&self) -> Arc<[Arc<EngineReplica>]> {
        match self.replicas.read() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Zero is a signal too: the error counter exists before the first failure.
    fn count_from_zero(&self, r: &EngineReplica) {
        if self.config.scrape {
            self.metrics.scrape_errors.get(&ByUpstream {
                upstream: &r.upstream,
            });
        }
    }

    /// Follows the replica set after discovery changed it: a new replica gets its label (the
    /// URL, or the next index; the same one again if it was seen before), a removed one takes
    /// its page and its gauge series with it. Returns `(url, label)` of every replica.
    pub fn sync(&self, replicas: &[Arc<Replica>]) -> Vec<(Arc<str>, Arc<str>)> {
        let old = self.all();
        let Ok(mut labels) = self.discovered_labels.lock() else {
            return Vec::new();
        };
        let next: Vec<Arc<EngineReplica>> = replicas
            .iter()
            .map(|r| match old.iter().find(|e| Arc::ptr_eq(&e.replica, r)) {
                Some(e) => e.clone(),
                None => {
                    let (known, next_index) = &mut *labels;
                    let label = known
                        .entry(r.url.clone())
                        .or_insert_with(|| match self.config.upstream_label {
                            UpstreamLabel::Url => Arc::from(without_userinfo(&r.url)),
                            UpstreamLabel::Index => {
                                *next_index += 1;
                                Arc::from((*next_index - 1).to_string())
                            }
                        })
                        .clone();
                    let e = Arc::new(EngineReplica::new(r, label, &self.config));
                    self.count_from_zero(&e);
                    e
                }
            })
            .collect();
        let m = &self.metrics;
        for gone in old
            .iter()
            .filter(|o| !next.iter().any(|n| Arc::ptr_eq(n, o)))
        {
            let l = ByUpstream {
                upstream: &gone.upstream,
            };
            for g in [&m.age, &m.queue_depth, &m.running, &m.kv_cache] {
                g.remove(&l);
            }
            for g in [&m.up, &m.in_flight, &m.healthy] {
                g.remove(&l);
            }
            m.scrape_errors.remove(&l);
            remove_kind(&m.kind, &gone.upstream);
        }
        let out = next
            .iter()
            .map(|e| (e.replica.url.clone(), e.upstream.clone()))
            .collect();
        if let Ok(mut w) = self.replicas.write() {
            *w = next.into();
        }
        out
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    fn find(&self, replica: &Arc<Replica>) -> Option<Arc<EngineReplica>> {
        self.all()
            .iter()
            .find(|e| Arc::ptr_eq(&e.replica, replica))
            .cloned()
    }

    /// The `upstream` label of a replica.
    pub fn upstream(&self, replica: &Arc<Replica>) -> Option<Arc<str>> {
        self.find(replica).map(|r| r.upstream.clone())
    }

    /// The engine configured for a replica (`None`: detected from its page).
    pub fn configured_kind(&self, replica: &Arc<Replica>) -> Option<EngineKind> {
        self.find(replica).and_then(|r| r.configured)
    }

    /// The path scraped on a replica: `engine.path`, except that TensorRT-LLM's `trtllm-serve`
    /// serves Prometheus text on `/prometheus/metrics` (its `/metrics` is JSON), so a replica
    /// configured as `trtllm` is scraped there while `engine.path` keeps its default.
    pub fn scrape_path(&self, replica: &Arc<Replica>) -> &str {
        match self.configured_kind(replica) {
            Some(EngineKind::Trtllm) if self.config.path == DEFAULT_PATH => TRTLLM_PATH,
            _ => &self.config.path,
        }
    }

    /// A replica's canonical signals from its latest good scrape (`None`: no good scrape).
    pub fn signals(&self, replica: &Arc<Replica>) -> Option<Signals> {
        self.snapshot(replica).map(|s| s.signals)
    }

    /// The latest good snapshot of a replica.
    pub fn snapshot(&self, replica: &Arc<Replica>) -> Option<Arc<Snapshot>> {
        let r = self.find(replica)?;
        let st = r.state.read().ok()?;
        st.latest.clone()
    }

    /// Stores a good scrape of a replica. Returns true when it had no good page before (the
    /// first scrape, or the first after failures).
    pub fn record_success(&self, replica: &Arc<Replica>, snap: Snapshot) -> bool {
        let Some(r) = self.find(replica) else {
            return false;
        };
        let upstream = &*r.upstream;
        let l = ByUpstream { upstream };
        let m = &self.metrics;
        m.up.get(&l).set(1);
        let load = snap.signals.load;
        m.queue_depth.set_or_remove(&l, load.waiting);
        m.running.set_or_remove(&l, load.running);
        m.kv_cache.set_or_remove(&l, load.kv_cache_usage);
        remove_kind(&m.kind, upstream);
        if let Some(kind) = snap.signals.kind {
            m.kind.get(&EngineOf { upstream, kind }).set(1);
            r.replica.set_engine_kind(kind);
        }
        let Ok(mut st) = r.state.write() else {
            return false;
        };
        let was_down = st.latest.is_none();
        st.failing = false;
        st.last_ok = Some(snap.at);
        st.latest = Some(Arc::new(snap));
        was_down
    }

    /// Counts a failed scrape of a replica and forgets its page; `kind` is the engine known
    /// without it (configured, or named by the answer's `Server` header). Returns true when
    /// the scrape before did not fail (the first failure of a run of them).
    pub fn record_failure(&self, replica: &Arc<Replica>, kind: Option<EngineKind>) -> bool {
        let Some(r) = self.find(replica) else {
            return false;
        };
        let l = ByUpstream {
            upstream: &r.upstream,
        };
        let m = &self.metrics;
        m.scrape_errors.get(&l).inc();
        m.up.get(&l).set(0);
        for g in [&m.queue_depth, &m.running, &m.kv_cache] {
            g.remove(&l);
        }
        remove_kind(&m.kind, &r.upstream);
        if let Some(kind) = kind {
            let upstream = &*r.upstream;
            m.kind.get(&EngineOf { upstream, kind }).set(1);
            r.replica.set_engine_kind(kind);
        }
        let Ok(mut st) = r.state.write() else {
            return false;
        };
        st.latest = None;
        !std::mem::replace(&mut st.failing, true)
    }

    /// Sets the gauges that change between scrapes (age, in-flight, health, demand); called right
    /// before the registry is gathered.
    pub fn refresh_gauges(&self, now: Instant) {
        let m = &self.metrics;
        let mut in_flight = 0;
        let engines = self.all();
        let mut queues = Vec::with_capacity(engines.len());
        for r in engines.iter() {
            let replica = &r.replica;
            let l = ByUpstream {
                upstream: &r.upstream,
            };
            let n = replica.in_flight();
            in_flight += n;
            m.in_flight.get(&l).set(n as i64);
            m.healthy.get(&l).set(i64::from(replica.is_healthy()));
            let Ok(st) = r.state.read() else { continue };
            if let Some(ok) = st.last_ok {
                let age = now.saturating_duration_since(ok).as_secs_f64();
                m.age.get(&l).set(age);
            }
            if let Some(w) = st.latest.as_ref().and_then(|s| s.signals.load.waiting) {
                queues.push(w);
            }
        }
        m.demand.set(signals::demand(in_flight, queues));
    }

    /// Appends every engine's latest families (see [`parse::merge_into`]); `reserved` names
    /// the proxy's own families, which engines cannot shadow.
    pub fn render_into(&self, out: &mut String, reserved: &dyn Fn(&str) -> bool) {
        let snaps: Vec<(Arc<str>, Arc<Snapshot>)> = self
            .all()
            .iter()
            .filter_map(|r| {
                let st = r.state.read().ok()?;
                Some((r.upstream.clone(), st.latest.clone()?))
            })
            .collect();
        let sources: Vec<Source> = snaps
            .iter()
            .map(|(u, s)| Source {
                upstream: u,
                families: &s.families,
            })
            .collect();
        parse::merge_into(out, reserved, &sources);
    }
}

/// The default of `engine.path`.
const DEFAULT_PATH: &str = "/metrics";
/// Where `trtllm-serve` serves Prometheus text.
const TRTLLM_PATH: &str = "/prometheus/metrics";

/// Removes every `kind` series of one replica (at most one is set).
fn remove_kind(g: &IntGauges<EngineOf<'static>>, upstream: &str) {
    for kind in EngineKind::ALL {
        g.remove(&EngineOf { upstream, kind });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BaseUrl, UpstreamConfig};

    fn engines(urls: &[&str]) -> (Upstreams, Engines, Registry) {
        let cfg = UpstreamConfig {
            urls: urls.iter().map(|u| BaseUrl::parse(u).unwrap()).collect(),
            ..UpstreamConfig::default()
        };
        let up = Upstreams::new(&cfg, &prometheus::Registry::new()).unwrap();
        let registry = Registry::new();
        let e = Engines::new(&EngineConfig::default(), &up, &registry).unwrap();
        (up, e, registry)
    }

    fn snap(page: &str) -> Snapshot {
        let families = parse::parse(page).unwrap();
        Snapshot {
            signals: Signals::read(&families, None, None),
            families,
            at: Instant::now(),
        }
    }

    /// Each series of family `name` as its label values, comma-separated.
    fn label_sets(registry: &Registry, name: &str) -> Vec<String> {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            .map(|m| {
                let labels: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
                labels.join(",")
            })
            .collect()
    }

    fn render(e: &Engines) -> String {
        let mut out = String::new();
        e.render_into(&mut out, &|n| n.starts_with("goodput_proxy_"));
        out
    }

    #[test]
    fn state_changes_are_reported_once_and_failures_drop_the_page() {
        let (up, e, _r) = engines(&["http://a:1", "http://b:2"]);
        let r = up.replicas();
        // Never up: the first failure is the one to log.
        assert!(e.record_failure(&r[1], None));
        assert!(!e.record_failure(&r[1], None));
        assert!(e.record_success(&r[0], snap("vllm:num_requests_waiting 2\n")));
        assert!(!e.record_success(&r[0], snap("vllm:num_requests_waiting 3\n")));
        assert_eq!(
            render(&e),
            "# TYPE vllm:num_requests_waiting untyped\n\
             vllm:num_requests_waiting{upstream=\"http://a:1\"} 3\n"
        );
        assert!(e.record_failure(&r[0], None));
        assert!(e.snapshot(&r[0]).is_none());
        assert_eq!(render(&e), "");
        assert!(e.record_success(&r[0], snap("x 1\n")));
    }

    #[test]
    fn demand_is_in_flight_plus_fresh_queues() {
        let (up, e, registry) = engines(&["http://a:1", "http://b:2"]);
        let r = up.replicas();
        let _g1 = r[0].start();
        let _g2 = r[1].start();
        e.record_success(&r[0], snap("vllm:num_requests_waiting 4\n"));
        e.record_success(&r[1], snap("vllm:num_requests_waiting 5\n"));
        e.record_failure(&r[1], None);
        e.refresh_gauges(Instant::now());
        let fams = registry.gather();
        let value = |name: &str| {
            let f = fams.iter().find(|f| f.name() == name).unwrap();
            f.get_metric()
                .iter()
                .map(|m| m.get_gauge().get_value())
                .sum::<f64>()
        };
        // 2 in flight + replica 0's queue; replica 1's page is gone with its failure.
        assert_eq!(value("goodput_proxy_demand"), 6.0);
        assert_eq!(value("goodput_proxy_upstream_queue_depth"), 4.0);
        assert_eq!(value("goodput_proxy_upstream_in_flight"), 2.0);
    }

    #[test]
    fn every_engine_feeds_the_same_gauges_and_its_kind() {
        let urls = ["http://a:1", "http://b:2", "http://c:3"];
        let cfg = UpstreamConfig {
            urls: urls.iter().map(|u| BaseUrl::parse(u).unwrap()).collect(),
            ..UpstreamConfig::default()
        };
        let up = Upstreams::new(&cfg, &prometheus::Registry::new()).unwrap();
        let registry = Registry::new();
        let engine_cfg = EngineConfig {
            kinds: vec![("http://c:3".into(), EngineKind::Trtllm)],
            ..EngineConfig::default()
        };
        let e = Engines::new(&engine_cfg, &up, &registry).unwrap();
        let r = up.replicas();
        let read = |i: usize, page: &str| {
            let families = parse::parse(page).unwrap();
            Snapshot {
                signals: Signals::read(&families, e.configured_kind(&r[i]), None),
                families,
                at: Instant::now(),
            }
        };
        e.record_success(&r[0], read(0, "sglang:num_queue_reqs{tp_rank=\"0\"} 4\n"));
        e.record_success(&r[1], read(1, "llamacpp:requests_deferred 2\n"));
        e.record_success(&r[2], read(2, "trtllm_num_requests_waiting 1\n"));
        e.refresh_gauges(Instant::now());
        let fams = registry.gather();
        let series = |name: &str| -> Vec<String> {
            fams.iter()
                .filter(|f| f.name() == name)
                .flat_map(|f| f.get_metric().iter())
                .map(|m| {
                    let labels: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
                    format!("{} {}", labels.join(","), m.get_gauge().get_value())
                })
                .collect()
        };
        assert_eq!(
            series("goodput_proxy_upstream_queue_depth"),
            ["http://a:1 4", "http://b:2 2", "http://c:3 1"]
        );
        assert_eq!(
            series("goodput_proxy_engine_kind"),
            [
                "llamacpp,http://b:2 1",
                "sglang,http://a:1 1",
                "trtllm,http://c:3 1"
            ]
        );
        assert_eq!(series("goodput_proxy_demand"), [" 7"]);
        // trtllm-serve's Prometheus page is not at /metrics.
        assert_eq!(e.scrape_path(&r[0]), "/metrics");
        assert_eq!(e.scrape_path(&r[2]), "/prometheus/metrics");
        e.record_failure(&r[0], None);
        e.refresh_gauges(Instant::now());
        assert_eq!(
            registry
                .gather()
                .iter()
                .filter(|f| f.name() == "goodput_proxy_engine_kind")
                .flat_map(|f| f.get_metric().iter())
                .count(),
            2
        );
    }

    /// llama-server without `--metrics`: every scrape fails (501), but its `Server` header
    /// names it, so its kind is known (usage injection and `goodput_proxy_engine_kind`) while
    /// its load is not (no queue series, never a 0 that means "unknown").
    #[test]
    fn a_failed_scrape_still_tells_the_kind_its_answer_named() {
        let (up, e, registry) = engines(&["http://a:1"]);
        let r = up.replicas();
        assert_eq!(r[0].engine_kind(), None);
        assert!(e.record_failure(&r[0], Some(EngineKind::Llamacpp)));
        e.refresh_gauges(Instant::now());
        let series = |name: &str| label_sets(&registry, name);
        assert_eq!(r[0].engine_kind(), Some(EngineKind::Llamacpp));
        assert_eq!(series("goodput_proxy_engine_kind"), ["llamacpp,http://a:1"]);
        assert!(series("goodput_proxy_upstream_queue_depth").is_empty());
        assert_eq!(series("goodput_proxy_engine_up"), ["http://a:1"]);
        // A failure naming nothing leaves no kind series (the replica keeps what it learned).
        e.record_failure(&r[0], None);
        assert!(series("goodput_proxy_engine_kind").is_empty());
        assert_eq!(r[0].engine_kind(), Some(EngineKind::Llamacpp));
    }

    #[test]
    fn discovered_replicas_get_labels_and_take_their_series_when_they_leave() {
        let cfg = UpstreamConfig {
            urls: vec![BaseUrl::parse("http://a:1").unwrap()],
            ..UpstreamConfig::default()
        };
        let up = Upstreams::new(&cfg, &prometheus::Registry::new()).unwrap();
        let registry = Registry::new();
        let engine_cfg = EngineConfig {
            upstream_label: UpstreamLabel::Index,
            ..EngineConfig::default()
        };
        let e = Engines::new(&engine_cfg, &up, &registry).unwrap();
        up.set_discovered(&["http://10.0.0.1:8000".into(), "http://10.0.0.2:8000".into()]);
        let labels = e.sync(&up.replicas());
        let label = |l: &[(Arc<str>, Arc<str>)]| -> Vec<String> {
            l.iter().map(|(u, l)| format!("{u}={l}")).collect()
        };
        assert_eq!(
            label(&labels),
            [
                "http://a:1=0",
                "http://10.0.0.1:8000=1",
                "http://10.0.0.2:8000=2"
            ]
        );
        let r = up.replicas();
        e.record_success(&r[2], snap("vllm:num_requests_waiting 1\n"));
        e.refresh_gauges(Instant::now());
        // One label (`upstream`) per series of these gauges.
        let series = |name: &str| label_sets(&registry, name);
        assert_eq!(series("goodput_proxy_upstream_queue_depth"), ["2"]);
        // 10.0.0.2 leaves, 10.0.0.3 comes, 10.0.0.2 comes back later: same label as before.
        up.set_discovered(&["http://10.0.0.1:8000".into(), "http://10.0.0.3:8000".into()]);
        let labels = e.sync(&up.replicas());
        assert_eq!(label(&labels)[2], "http://10.0.0.3:8000=3");
        assert!(series("goodput_proxy_upstream_queue_depth").is_empty());
        assert!(!series("goodput_proxy_upstream_in_flight").contains(&"2".to_string()));
        assert!(render(&e).is_empty());
        up.set_discovered(&["http://10.0.0.2:8000".into()]);
        let labels = e.sync(&up.replicas());
        assert_eq!(label(&labels), ["http://a:1=0", "http://10.0.0.2:8000=2"]);
    }

    #[test]
    fn labels_come_from_configuration() {
        let urls = [
            "http://a:1",
            "http://user:pw@b:2/prefix",
            "http://a:1",
            "http://c@d:3",
        ];
        assert_eq!(
            upstream_labels(&urls, UpstreamLabel::Url),
            [
                "http://a:1",
                "http://b:2/prefix",
                "http://a:1#2",
                "http://d:3"
            ]
        );
        assert_eq!(
            upstream_labels(&urls, UpstreamLabel::Index),
            ["0", "1", "2", "3"]
        );
    }
}
