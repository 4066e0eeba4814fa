//! Prometheus registry and metric families, registered in one place ([`Metrics::register`]).
//! Histograms use vLLM's bucket grids so proxy and engine quantiles line up bucket by bucket.
//! The `model` label only takes values from [`ModelLabels`] (configured + learned, else
//! `other`); `upstream` only from [`UpstreamLabels`] (configured or discovered replicas,
//! capped; `none` before a replica answered); `outcome`, `finish_reason` and `slo` come from
//! closed enums.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry,
};
use tokio::time::Instant;

use goodput_measure::outcome::Outcome;
use goodput_measure::window::RatioWindow;
use request::HandleCache;
pub use request::{ItlBuffer, RequestMetrics, ITL_FLUSH_GAPS};

mod request;

mod agent;
pub use agent::AgentMetrics;
mod engine_view;
pub use engine_view::EngineViewMetrics;

pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
pub const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// The proxy's own time before the request leaves: microseconds to tens of milliseconds.
pub const OVERHEAD_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,
];

/// The label for any model not in the set.
pub const OTHER_MODEL: &str = "other";

/// The `sink` label's values.
pub const SINKS: [&str; 2] = ["jsonl", "clickhouse"];
/// Most models the label set learns (configured models always count): bounds series growth
/// even if an upstream's `/v1/models` lists thousands.
pub const MAX_LEARNED_MODELS: usize = 256;

/// The bounded set of `model` label values: configured models plus those learned from the
/// upstreams' `/v1/models`; everything else maps to `other`. Resolved once per request.
#[derive(Debug, Clone)]
pub struct ModelLabels {
    inner: Arc<RwLock<Labels>>,
    other: Arc<str>,
}

impl Default for ModelLabels {
    fn default() -> Self {
        Self::new(std::iter::empty::<&str>())
    }
}

#[derive(Debug, Default)]
struct Labels {
    configured: HashSet<Arc<str>>,
    learned: HashSet<Arc<str>>,
}

impl ModelLabels {
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(configured: I) -> Self {
        let configured = configured
            .into_iter()
            .map(|s| Arc::from(s.as_ref()))
            .collect();
        Self {
            inner: Arc::new(RwLock::new(Labels {
                configured,
                learned: HashSet::new(),
            })),
            other: Arc::from(OTHER_MODEL),
        }
    }

    /// Replace the learned models (from discovery); at most [`MAX_LEARNED_MODELS`] are kept.
    pub fn set_learned<I: IntoIterator<Item = S>, S: AsRef<str>>(&self, models: I) {
        let learned: HashSet<Arc<str>> = models
            .into_iter()
            .take(MAX_LEARNED_MODELS)
            .map(|s| Arc::from(s.as_ref()))
            .collect();
        if let Ok(mut l) = self.inner.write() {
            l.learned = learned;
        }
    }

    /// Add learned models (from discovery) without forgetting earlier ones, so a replica that
    /// is briefly down does not move its model's series to `other`; bounded by
    /// [`MAX_LEARNED_MODELS`]. Returns how many were new.
    pub fn add_learned<I: IntoIterator<Item = S>, S: AsRef<str>>(&self, models: I) -> usize {
        let Ok(mut l) = self.inner.write() else {
            return 0;
        };
        let mut added = 0;
        for m in models {
            let m = m.as_ref();
            if l.learned.len() >= MAX_LEARNED_MODELS {
                break;
            }
            if !l.configured.contains(m) && !l.learned.contains(m) {
                l.learned.insert(Arc::from(m));
                added += 1;
            }
        }
        added
    }

    /// The label value for a request's model name.
    pub fn resolve(&self, model: &str) -> Arc<str> {
        if let Ok(l) = self.inner.read() {
            if let Some(m) = l.configured.get(model).or_else(|| l.learned.get(model)) {
                return m.clone();
            }
        }
        self.other.clone()
    }

    pub fn contains(&self, model: &str) -> bool {
        self.inner
            .read()
            .map(|l| l.configured.contains(model) || l.learned.contains(model))
            .unwrap_or(false)
    }
}

/// The `upstream` label of a request no replica answered (connect failure, no head in time,
/// rejected before forwarding).
pub const NO_UPSTREAM: &str = "none";
/// The label for a replica beyond [`MAX_UPSTREAM_LABELS`].
pub const OTHER_UPSTREAM: &str = "other";
/// Most replicas with their own `upstream` label: discovery can add replicas for ever (each
/// rollout brings new pod IPs), the series count must not follow.
pub const MAX_UPSTREAM_LABELS: usize = 64;
/// The default sliding window of `goodput_proxy_goodput_ratio`.
pub const DEFAULT_GOODPUT_WINDOW: Duration = Duration::from_secs(60);

/// The bounded map from a replica's URL (what forwarding reports in `ServedBy`) to its
/// `upstream` label value, the same value the engine families are relabelled with, so proxy
/// and engine series of one replica join on `upstream`. Entries are only added (a replica that
/// leaves keeps its label, so its series stay readable), at most [`MAX_UPSTREAM_LABELS`].
#[derive(Debug, Clone, Default)]
pub struct UpstreamLabels {
    inner: Arc<RwLock<HashMap<Arc<str>, Arc<str>>>>,
}

impl UpstreamLabels {
    /// Adds `(url, label)` pairs; a known URL keeps its first label. Returns how many were new.
    pub fn add<I, U, L>(&self, pairs: I) -> usize
    where
        I: IntoIterator<Item = (U, L)>,
        U: AsRef<str>,
        L: AsRef<str>,
    {
        let Ok(mut m) = self.inner.write() else {
            return 0;
        };
        let mut added = 0;
        for (url, label) in pairs {
            if m.len() >= MAX_UPSTREAM_LABELS {
                break;
            }
            if !m.contains_key(url.as_ref()) {
                m.insert(Arc::from(url.as_ref()), Arc::from(label.as_ref()));
                added += 1;
            }
        }
        added
    }

    /// The replica URLs labelled `label` (a label can only be one URL unless two replicas
    /// were given the same index label; an unknown label is taken as a URL).
    pub fn urls_of(&self, label: &str) -> Vec<String> {
        let Ok(m) = self.inner.read() else {
            return Vec::new();
        };
        let urls: Vec<String> = m
            .iter()
            .filter(|(_, l)| &***l == label)
            .map(|(u, _)| u.to_string())
            .collect();
        if urls.is_empty() && label != NO_UPSTREAM {
            vec![label.to_string()]
        } else {
            urls
        }
    }

    /// The label value for a replica URL: its own, else `other`.
    pub fn resolve(&self, url: &str) -> Arc<str> {
        self.inner
            .read()
            .ok()
            .and_then(|m| m.get(url).cloned())
            .unwrap_or_else(|| Arc::from(OTHER_UPSTREAM))
    }
}

/// What each request needs to resolve its per-upstream handles late (once the replica is
/// known) and to count itself in the goodput window; one per [`Metrics`], shared.
struct Shared {
    ttft: HistogramVec,
    ttfc: HistogramVec,
    tpot: HistogramVec,
    itl: HistogramVec,
    e2e: HistogramVec,
    goodput: IntCounterVec,
    requests: IntCounterVec,
    slo_violations: IntCounterVec,
    prompt_tokens: IntCounterVec,
    generation_tokens: IntCounterVec,
    in_flight: IntGaugeVec,
    sse_discarded: IntCounter,
    agent: AgentMetrics,
    engine_view: EngineViewMetrics,
    upstreams: UpstreamLabels,
    window: Mutex<RatioWindow>,
    /// Every request's handles, resolved once per label value (see `request::HandleCache`).
    cache: HandleCache,
    /// `upstream="none"`, allocated once.
    none: Arc<str>,
}

/// Every family the proxy's measurement exports.
#[derive(Clone)]
pub struct Metrics {
    pub requests: IntCounterVec,
    pub goodput: IntCounterVec,
    pub slo_violations: IntCounterVec,
    pub ttft: HistogramVec,
    pub ttfc: HistogramVec,
    pub tpot: HistogramVec,
    pub itl: HistogramVec,
    pub e2e: HistogramVec,
    pub prompt_tokens: IntCounterVec,
    pub generation_tokens: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub overhead: Histogram,
    /// By `sink` (`jsonl`, `clickhouse`): records a sink dropped (queue full, or a batch the
    /// store kept refusing).
    pub records_dropped: IntCounterVec,
    /// By `sink` (`clickhouse`): records the store acknowledged.
    pub records_shipped: IntCounterVec,
    /// By `sink` (`clickhouse`): failed delivery attempts (each is retried or counted dropped).
    pub sink_errors: IntCounterVec,
    pub sse_discarded: IntCounter,
    /// Good / eligible requests over the sliding window, per model.
    pub goodput_ratio: GaugeVec,
    /// The same over every model (no labels; absent while the window is empty).
    pub goodput_ratio_overall: GaugeVec,
    pub models: ModelLabels,
    pub upstreams: UpstreamLabels,
    /// Reasoning and tool-call phases and outcomes (issue 13).
    pub agent: AgentMetrics,
    /// By `tenant` (configured names, `none`) and `outcome`: a family of its own rather than a
    /// label on `requests_total`, whose series would multiply by the tenant count.
    pub tenant_requests: IntCounterVec,
    /// By `tenant`: prompt + completion tokens (what token limits charge).
    pub tenant_tokens: IntCounterVec,
    shared: Arc<Shared>,
}

fn hist(name: &str, help: &str, buckets: &[f64]) -> Result<HistogramVec, prometheus::Error> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &["model", "upstream"],
    )
}

impl Metrics {
    /// Create and register every family on `registry`.
    pub fn register(registry: &Registry, models: ModelLabels) -> Result<Self, prometheus::Error> {
        let ttft = hist(
            "goodput_proxy_time_to_first_token_seconds",
            "Time from request head to the first output token served to the client.",
            TTFT_BUCKETS,
        )?;
        let ttfc = hist(
            "goodput_proxy_time_to_first_chunk_seconds",
            "Time from request head to the first chunk carrying a choice (role chunk counts).",
            TTFT_BUCKETS,
        )?;
        let tpot = hist(
            "goodput_proxy_time_per_output_token_seconds",
            "(last token - first token) / (output tokens - 1), one per choice.",
            TPOT_BUCKETS,
        )?;
        let itl = hist(
            "goodput_proxy_inter_token_latency_seconds",
            "Gap between consecutive output events served to the client.",
            TPOT_BUCKETS,
        )?;
        let e2e = hist(
            "goodput_proxy_e2e_request_latency_seconds",
            "Time from request head to the last body byte handed to the client.",
            E2E_BUCKETS,
        )?;
        let goodput = IntCounterVec::new(
            Opts::new(
                "goodput_proxy_goodput_requests_total",
                "Requests that succeeded and met every applicable SLO.",
            ),
            &["model", "upstream"],
        )?;
        let upstreams = UpstreamLabels::default();
        let requests = IntCounterVec::new(
            Opts::new(
                "goodput_proxy_requests_total",
                "Finished requests by outcome.",
            ),
            &["model", "upstream", "outcome", "finish_reason"],
        )?;
        let slo_violations = IntCounterVec::new(
            Opts::new(
                "goodput_proxy_slo_violations_total",
                "Requests that missed an SLO.",
            ),
            &["model", "upstream", "slo"],
        )?;
        let prompt_tokens = IntCounterVec::new(
            Opts::new(
                "goodput_proxy_prompt_tokens_total",
                "Prompt tokens (engine usage).",
            ),
            &["model"],
        )?;
        let generation_tokens = IntCounterVec::new(
            Opts::new(
                "goodput_proxy_generation_tokens_total",
                "Generated tokens (usage when reported, else counted).",
            ),
            &["model"],
        )?;
        let in_flight = IntGaugeVec::new(
            Opts::new("goodput_proxy_requests_in_flight", "Requests being served."),
            &["model"],
        )?;
        let sse_discarded = IntCounter::new(
            "goodput_proxy_sse_discarded_total",
            "SSE lines or events from the engines that the parser dropped (over its 4 MiB line limit).",
        )?;
        let agent = AgentMetrics::register(registry)?;
        let engine_view = EngineViewMetrics::register(registry)?;
        let m = Self {
            requests: requests.clone(),
            goodput: goodput.clone(),
            slo_violations: slo_violations.clone(),
            ttft: ttft.clone(),
            ttfc: ttfc.clone(),
            tpot: tpot.clone(),
            itl: itl.clone(),
            e2e: e2e.clone(),
            prompt_tokens: prompt_tokens.clone(),
            generation_tokens: generation_tokens.clone(),
            in_flight: in_flight.clone(),
            overhead: Histogram::with_opts(
                HistogramOpts::new(
                    "goodput_proxy_overhead_seconds",
                    "Time the proxy spent on a request before it left for the upstream.",
                )
                .buckets(OVERHEAD_BUCKETS.to_vec()),
            )?,
            records_dropped: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_records_dropped_total",
                    "Records a sink dropped: its queue was full, or the store kept refusing a batch.",
                ),
                &["sink"],
            )?,
            records_shipped: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_records_shipped_total",
                    "Records a remote sink's store acknowledged.",
                ),
                &["sink"],
            )?,
            sink_errors: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_sink_errors_total",
                    "Failed deliveries of a batch to a remote sink (retried, or dropped and counted).",
                ),
                &["sink"],
            )?,
            sse_discarded: sse_discarded.clone(),
            goodput_ratio: GaugeVec::new(
                Opts::new(
                    "goodput_proxy_goodput_ratio",
                    "Good / (finished - rejections the client caused) over the sliding window \
                     (measure.goodput_window_s), per model; absent while the window is empty.",
                ),
                &["model"],
            )?,
            goodput_ratio_overall: GaugeVec::new(
                Opts::new(
                    "goodput_proxy_goodput_ratio_overall",
                    "goodput_proxy_goodput_ratio over every model.",
                ),
                &[],
            )?,
            models,
            upstreams: upstreams.clone(),
            agent: agent.clone(),
            tenant_requests: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_tenant_requests_total",
                    "Finished requests by tenant (`none`: auth off or refused) and outcome.",
                ),
                &["tenant", "outcome"],
            )?,
            tenant_tokens: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_tenant_tokens_total",
                    "Prompt + completion tokens of finished requests, by tenant.",
                ),
                &["tenant"],
            )?,
            shared: Arc::new(Shared {
                ttft,
                ttfc,
                tpot,
                itl,
                e2e,
                goodput,
                requests,
                slo_violations,
                prompt_tokens,
                generation_tokens,
                in_flight,
                sse_discarded,
                agent,
                engine_view,
                upstreams,
                window: Mutex::new(RatioWindow::new(DEFAULT_GOODPUT_WINDOW, Instant::now())),
                cache: HandleCache::default(),
                none: Arc::from(NO_UPSTREAM),
            }),
        };
        registry.register(Box::new(m.sse_discarded.clone()))?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.goodput.clone()))?;
        registry.register(Box::new(m.slo_violations.clone()))?;
        registry.register(Box::new(m.ttft.clone()))?;
        registry.register(Box::new(m.ttfc.clone()))?;
        registry.register(Box::new(m.tpot.clone()))?;
        registry.register(Box::new(m.itl.clone()))?;
        registry.register(Box::new(m.e2e.clone()))?;
        registry.register(Box::new(m.prompt_tokens.clone()))?;
        registry.register(Box::new(m.generation_tokens.clone()))?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.overhead.clone()))?;
        registry.register(Box::new(m.records_dropped.clone()))?;
        registry.register(Box::new(m.records_shipped.clone()))?;
        registry.register(Box::new(m.sink_errors.clone()))?;
        // Every sink's series exists from the start (a zero is a signal too).
        for sink in SINKS {
            m.records_dropped.with_label_values(&[sink]);
        }
        m.records_shipped.with_label_values(&["clickhouse"]);
        m.sink_errors.with_label_values(&["clickhouse"]);
        registry.register(Box::new(m.goodput_ratio.clone()))?;
        registry.register(Box::new(m.goodput_ratio_overall.clone()))?;
        registry.register(Box::new(m.tenant_requests.clone()))?;
        registry.register(Box::new(m.tenant_tokens.clone()))?;
        Ok(m)
    }

    /// A finished request of `tenant` (a configured name or `none`, never a raw user value).
    pub fn tenant_finished(&self, tenant: &str, outcome: Outcome, tokens: u64) {
        self.tenant_requests
            .with_label_values(&[tenant, outcome.as_str()])
            .inc();
        let t = self.tenant_tokens.with_label_values(&[tenant]);
        if tokens > 0 {
            t.inc_by(tokens);
        }
    }

    /// Sets the sliding window of `goodput_proxy_goodput_ratio` (before the first request;
    /// counts so far are dropped).
    pub fn set_goodput_window(&self, window: Duration) {
        if let Ok(mut w) = self.shared.window.lock() {
            *w = RatioWindow::new(window, Instant::now());
        }
    }

    /// Sets the goodput-ratio gauges from the window at `now`; called right before the
    /// registry is gathered. A model (or the whole proxy) with no eligible request in the
    /// window has no series: an autoscaler reads "no data", never a made-up 0 or 1.
    pub fn refresh_goodput_ratio(&self, now: Instant) {
        let Ok(w) = self.shared.window.lock() else {
            return;
        };
        for (model, ratio) in w.per_key(now) {
            set_or_remove(&self.goodput_ratio, &[&*model], ratio);
        }
        set_or_remove(&self.goodput_ratio_overall, &[], w.overall(now));
    }

    /// Resolve one request's per-model handles (once, at the request head); counts it in
    /// flight. The per-upstream handles follow once the replica is known
    /// ([`RequestMetrics::set_upstream`]), or at the end (`upstream="none"`).
    pub fn for_request(&self, model: &str) -> RequestMetrics {
        RequestMetrics::begin(self.models.resolve(model), self.shared.clone())
    }

    pub fn observe_overhead(&self, d: Duration) {
        self.overhead.observe(d.as_secs_f64());
    }
}

fn set_or_remove(g: &GaugeVec, labels: &[&str], v: Option<f64>) {
    match v {
        Some(v) => g.with_label_values(labels).set(v),
        None => {
            let _ = g.remove_label_values(labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use goodput_measure::meter::Measurement;
    use goodput_measure::outcome::FinishReason;
    use goodput_measure::outcome::Outcome;
    use goodput_measure::slo::{judge, Slo};
    use prometheus::proto::MetricFamily;

    fn setup(configured: &[&str]) -> (Registry, Metrics) {
        let r = Registry::new();
        let m = Metrics::register(&r, ModelLabels::new(configured)).unwrap();
        (r, m)
    }

    fn family<'a>(fams: &'a [MetricFamily], name: &str) -> &'a MetricFamily {
        fams.iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("{name}"))
    }

    fn success(ttft_ms: u64, tokens: u64) -> Measurement {
        let mut m = Measurement::without_body(
            Outcome::Success,
            Some(200),
            Duration::from_millis(ttft_ms + 100),
        );
        m.streaming = true;
        m.finish_reason = Some(FinishReason::Stop);
        m.ttft = Some(Duration::from_millis(ttft_ms));
        m.ttfc = m.ttft;
        m.tpot = Some(Duration::from_millis(20));
        m.prompt_tokens = Some(5);
        m.completion_tokens = Some(tokens);
        m
    }

    #[test]
    fn every_family_is_registered_with_the_vllm_grids() {
        let (r, m) = setup(&["tiny"]);
        let mut rm = m.for_request("tiny");
        rm.observe_gap(Duration::from_millis(5));
        let mut meas = success(100, 3);
        let ms = Duration::from_millis;
        meas.engine = goodput_measure::engine::EngineView {
            queue: Some(ms(10)),
            ttft: Some(ms(50)),
            cached_prompt_tokens: Some(16),
            ..Default::default()
        };
        meas.ttft_split =
            goodput_measure::engine::TtftSplit::of(meas.ttft, Some(ms(1)), &meas.engine);
        meas.stalls = 1;
        rm.finish(&meas, &judge(&meas, &Slo::default()));
        m.observe_overhead(Duration::from_micros(30));
        m.refresh_goodput_ratio(Instant::now());
        m.tenant_finished("team-a", Outcome::Success, 5);
        let fams = r.gather();
        let mut names: Vec<&str> = fams.iter().map(|f| f.name()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "goodput_proxy_cached_prompt_tokens_total",
                "goodput_proxy_e2e_request_latency_seconds",
                "goodput_proxy_engine_prefill_seconds",
                "goodput_proxy_engine_queue_seconds",
                "goodput_proxy_generation_tokens_total",
                "goodput_proxy_goodput_ratio",
                "goodput_proxy_goodput_ratio_overall",
                "goodput_proxy_goodput_requests_total",
                "goodput_proxy_inter_token_latency_seconds",
                "goodput_proxy_overhead_seconds",
                "goodput_proxy_prompt_tokens_total",
                "goodput_proxy_records_dropped_total",
                "goodput_proxy_records_shipped_total",
                "goodput_proxy_requests_in_flight",
                "goodput_proxy_requests_total",
                "goodput_proxy_sink_errors_total",
                "goodput_proxy_sse_discarded_total",
                "goodput_proxy_stalls_total",
                "goodput_proxy_tenant_requests_total",
                "goodput_proxy_tenant_tokens_total",
                "goodput_proxy_time_per_output_token_seconds",
                "goodput_proxy_time_to_first_chunk_seconds",
                "goodput_proxy_time_to_first_token_seconds",
                "goodput_proxy_ttft_rest_seconds",
            ]
        );
        let bounds = |name: &str| -> Vec<f64> {
            family(&fams, name).get_metric()[0]
                .get_histogram()
                .get_bucket()
                .iter()
                .map(|b| b.upper_bound())
                .collect()
        };
        assert_eq!(
            bounds("goodput_proxy_time_to_first_token_seconds"),
            TTFT_BUCKETS
        );
        assert_eq!(
            bounds("goodput_proxy_time_to_first_chunk_seconds"),
            TTFT_BUCKETS
        );
        assert_eq!(
            bounds("goodput_proxy_time_per_output_token_seconds"),
            TPOT_BUCKETS
        );
        assert_eq!(
            bounds("goodput_proxy_inter_token_latency_seconds"),
            TPOT_BUCKETS
        );
        assert_eq!(
            bounds("goodput_proxy_e2e_request_latency_seconds"),
            E2E_BUCKETS
        );
        assert_eq!(TTFT_BUCKETS.len(), 22);
        assert_eq!(TPOT_BUCKETS.len(), 19);
        assert_eq!(E2E_BUCKETS.len(), 21);
        // records_dropped_total exists per sink even before a drop (a zero is a signal too).
        let dropped = family(&fams, "goodput_proxy_records_dropped_total").get_metric();
        let mut sinks: Vec<&str> = dropped.iter().map(|m| m.get_label()[0].value()).collect();
        sinks.sort_unstable();
        assert_eq!(sinks, ["clickhouse", "jsonl"]);
        assert!(dropped.iter().all(|m| m.get_counter().get_value() == 0.0));
    }

    #[test]
    fn a_finished_request_counts_once_everywhere() {
        let (_r, m) = setup(&["tiny"]);
        m.upstreams.add([("http://e:1", "http://e:1")]);
        let mut rm = m.for_request("tiny");
        rm.set_upstream("http://e:1");
        assert_eq!(m.in_flight.with_label_values(&["tiny"]).get(), 1);
        let meas = success(3000, 7); // TTFT over the 2 s SLO: success, not good
        let v = judge(&meas, &Slo::default());
        rm.finish(&meas, &v);
        assert_eq!(m.in_flight.with_label_values(&["tiny"]).get(), 0);
        assert_eq!(
            m.requests
                .with_label_values(&["tiny", "http://e:1", "success", "stop"])
                .get(),
            1
        );
        let up = ["tiny", "http://e:1"];
        assert_eq!(m.goodput.with_label_values(&up).get(), 0);
        assert_eq!(
            m.slo_violations
                .with_label_values(&["tiny", "http://e:1", "ttft"])
                .get(),
            1
        );
        assert_eq!(
            m.slo_violations
                .with_label_values(&["tiny", "http://e:1", "tpot"])
                .get(),
            0
        );
        assert_eq!(m.generation_tokens.with_label_values(&["tiny"]).get(), 7);
        assert_eq!(m.prompt_tokens.with_label_values(&["tiny"]).get(), 5);
        assert_eq!(m.ttft.with_label_values(&up).get_sample_count(), 1);
        assert_eq!(m.e2e.with_label_values(&up).get_sample_count(), 1);
        // Dropped without finish (the proxy answered itself): still leaves in-flight.
        drop(m.for_request("tiny"));
        assert_eq!(m.in_flight.with_label_values(&["tiny"]).get(), 0);
        // A rejection is counted but not timed.
        let rej = Measurement::without_body(Outcome::Rejected, Some(429), Duration::from_millis(1));
        m.for_request("tiny")
            .finish(&rej, &judge(&rej, &Slo::default()));
        assert_eq!(
            m.requests
                .with_label_values(&["tiny", NO_UPSTREAM, "rejected", "none"])
                .get(),
            1
        );
        assert_eq!(m.e2e.with_label_values(&up).get_sample_count(), 1);
        let none = ["tiny", NO_UPSTREAM];
        assert_eq!(m.e2e.with_label_values(&none).get_sample_count(), 0);
    }

    #[test]
    fn upstream_labels_are_the_configured_ones_and_bounded() {
        let (r, m) = setup(&["tiny"]);
        assert_eq!(
            m.upstreams.add([("http://a:1", "0"), ("http://b:1", "1")]),
            2
        );
        // A known URL keeps its first label.
        assert_eq!(m.upstreams.add([("http://a:1", "9")]), 0);
        assert_eq!(&*m.upstreams.resolve("http://a:1"), "0");
        assert_eq!(&*m.upstreams.resolve("http://unknown:1"), OTHER_UPSTREAM);
        assert_eq!(m.upstreams.urls_of("1"), ["http://b:1"]);
        assert_eq!(m.upstreams.urls_of("http://x:1"), ["http://x:1"]);
        assert!(m.upstreams.urls_of(NO_UPSTREAM).is_empty());
        let added = m
            .upstreams
            .add((0..1000).map(|i| (format!("http://d{i}:1"), format!("d{i}"))));
        assert_eq!(added, MAX_UPSTREAM_LABELS - 2);
        let meas = success(10, 2);
        let v = judge(&meas, &Slo::default());
        for i in 0..1000 {
            let mut rm = m.for_request("tiny");
            rm.set_upstream(&format!("http://d{i}:1"));
            rm.finish(&meas, &v);
        }
        let fams = r.gather();
        let series = family(&fams, "goodput_proxy_requests_total").get_metric();
        // Every labelled replica, plus one `other` for the rest.
        assert_eq!(series.len(), MAX_UPSTREAM_LABELS - 2 + 1);
    }

    #[test]
    fn goodput_ratio_gauges_follow_the_window() {
        let (r, m) = setup(&["tiny", "big"]);
        let good = success(10, 2);
        let slow = success(3000, 2);
        let client_rejected =
            Measurement::without_body(Outcome::Rejected, Some(413), Duration::from_millis(1));
        let shed =
            Measurement::without_body(Outcome::Rejected, Some(503), Duration::from_millis(1));
        for (model, meas) in [
            ("tiny", &good),
            ("tiny", &good),
            ("tiny", &slow),
            ("tiny", &client_rejected), // not eligible
            ("big", &shed),             // eligible, not good
        ] {
            m.for_request(model)
                .finish(meas, &judge(meas, &Slo::default()));
        }
        m.refresh_goodput_ratio(Instant::now());
        let ratio = |model: &str| m.goodput_ratio.with_label_values(&[model]).get();
        assert_eq!(ratio("tiny"), 2.0 / 3.0);
        assert_eq!(ratio("big"), 0.0);
        assert_eq!(
            m.goodput_ratio_overall
                .with_label_values(&[] as &[&str])
                .get(),
            2.0 / 4.0
        );
        // Past the window nothing is left: the series go away instead of reading 0.
        m.refresh_goodput_ratio(Instant::now() + DEFAULT_GOODPUT_WINDOW + Duration::from_secs(1));
        let fams = r.gather();
        for name in [
            "goodput_proxy_goodput_ratio",
            "goodput_proxy_goodput_ratio_overall",
        ] {
            assert!(fams.iter().all(|f| f.name() != name), "{name}");
        }
    }

    #[test]
    fn random_model_names_share_one_other_series() {
        let (r, m) = setup(&["tiny"]);
        m.models.set_learned(["learned-a"]);
        assert_eq!(&*m.models.resolve("tiny"), "tiny");
        assert_eq!(&*m.models.resolve("learned-a"), "learned-a");
        assert_eq!(&*m.models.resolve("learned-b"), OTHER_MODEL);
        let meas = success(10, 2);
        let v = judge(&meas, &Slo::default());
        for i in 0..10_000u32 {
            m.for_request(&format!("random-{}", i.wrapping_mul(2_654_435_761)))
                .finish(&meas, &v);
        }
        let fams = r.gather();
        let series = family(&fams, "goodput_proxy_requests_total").get_metric();
        assert_eq!(series.len(), 1);
        let labels: Vec<_> = series[0]
            .get_label()
            .iter()
            .map(|l| (l.name(), l.value()))
            .collect();
        assert!(labels.contains(&("model", "other")));
        assert_eq!(series[0].get_counter().get_value(), 10_000.0);
    }

    #[test]
    fn learned_models_are_bounded() {
        let labels = ModelLabels::new(["a"]);
        labels.set_learned((0..10_000).map(|i| format!("m{i}")));
        let known = (0..10_000)
            .filter(|i| labels.contains(&format!("m{i}")))
            .count();
        assert_eq!(known, MAX_LEARNED_MODELS);
        assert!(labels.contains("a"));
        let labels = ModelLabels::new(["a"]);
        assert_eq!(labels.add_learned(["a", "b"]), 1);
        assert_eq!(labels.add_learned(["c"]), 1);
        assert!(labels.contains("b") && labels.contains("c"));
        assert_eq!(
            labels.add_learned((0..1000).map(|i| format!("m{i}"))),
            MAX_LEARNED_MODELS - 2
        );
    }
}
