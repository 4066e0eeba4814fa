//! The proxy's own metric families, each declared once ([`Families::register`]: created and
//! registered in one expression, see `family.rs`), read through typed label sets
//! (`labels.rs`) whose values come only from bounded sets (`bounded.rs`: `model`, `upstream`)
//! and closed enums (`outcome`, `finish_reason`, `slo`, `sink`). Histograms use vLLM's bucket
//! grids so proxy and engine quantiles line up bucket by bucket.

use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{Histogram, IntCounter, Registry};
use tokio::time::Instant;

use goodput_measure::outcome::Outcome;
use request::HandleCache;

mod agent;
mod bounded;
mod by_pointer;
pub mod family;
mod gap_histogram;
pub mod labels;
mod request;
pub mod window;

pub use agent::AgentFamilies;
mod engine_view;
pub use bounded::{
    ModelLabels, UpstreamLabels, MAX_LEARNED_MODELS, MAX_UPSTREAM_LABELS, NO_UPSTREAM, OTHER_MODEL,
    OTHER_UPSTREAM,
};
pub use engine_view::EngineViewFamilies;
pub use family::{Counters, GapHistograms, Gauges, Histograms, IntGauges, LabelSet, Registrar};
pub use request::{ItlBuffer, RequestMetrics, ITL_FLUSH_GAPS};

use labels::{ByModel, ByTenant, Finished, Served, Sink, TenantFinished, Violation};
use window::{KeyedRings, SecondClock};

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

/// The default sliding window of `goodput_proxy_goodput_ratio`.
pub const DEFAULT_GOODPUT_WINDOW: Duration = Duration::from_secs(60);

/// Every family of the proxy's measurement; adding one is a field here and its expression in
/// [`Families::register`].
pub struct Families {
    pub ttft: Histograms<Served<'static>>,
    pub ttfc: Histograms<Served<'static>>,
    pub tpot: Histograms<Served<'static>>,
    /// Zero gaps counted beside each series' histogram (see `gap_histogram`).
    pub itl: GapHistograms<Served<'static>>,
    pub e2e: Histograms<Served<'static>>,
    pub goodput: Counters<Served<'static>>,
    pub requests: Counters<Finished<'static>>,
    pub slo_violations: Counters<Violation<'static>>,
    pub prompt_tokens: Counters<ByModel<'static>>,
    pub generation_tokens: Counters<ByModel<'static>>,
    pub in_flight: IntGauges<ByModel<'static>>,
    pub sse_discarded: IntCounter,
    pub overhead: Histogram,
    /// Records a sink dropped (queue full, or a batch the store kept refusing).
    pub records_dropped: Counters<Sink>,
    /// Records the store acknowledged (`clickhouse`).
    pub records_shipped: Counters<Sink>,
    /// Failed delivery attempts (`clickhouse`; each is retried or counted dropped).
    pub sink_errors: Counters<Sink>,
    /// Good / eligible requests over the sliding window, per model.
    pub goodput_ratio: Gauges<ByModel<'static>>,
    /// The same over every model (absent while the window is empty).
    pub goodput_ratio_overall: Gauges<()>,
    /// By tenant and outcome: a family of its own rather than a label on `requests_total`,
    /// whose series would multiply by the tenant count.
    pub tenant_requests: Counters<TenantFinished<'static>>,
    /// By tenant: prompt + completion tokens (what token limits charge).
    pub tenant_tokens: Counters<ByTenant<'static>>,
    /// Reasoning and tool-call phases and outcomes.
    pub agent: AgentFamilies,
    /// The engine's own view of each request, where TTFT went, stalls.
    pub engine_view: EngineViewFamilies,
}

impl Families {
    /// Creates and registers every family on `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let r = Registrar::new(registry);
        let f = Families {
            ttft: r.histograms(
                "goodput_proxy_time_to_first_token_seconds",
                "Time from request head to the first output token served to the client.",
                TTFT_BUCKETS,
            )?,
            ttfc: r.histograms(
                "goodput_proxy_time_to_first_chunk_seconds",
                "Time from request head to the first chunk carrying a choice (role chunk counts).",
                TTFT_BUCKETS,
            )?,
            tpot: r.histograms(
                "goodput_proxy_time_per_output_token_seconds",
                "(last token - first token) / (output tokens - 1), one per choice.",
                TPOT_BUCKETS,
            )?,
            itl: r.gap_histograms(
                "goodput_proxy_inter_token_latency_seconds",
                "Gap between consecutive output events served to the client.",
                TPOT_BUCKETS,
            )?,
            e2e: r.histograms(
                "goodput_proxy_e2e_request_latency_seconds",
                "Time from request head to the last body byte handed to the client.",
                E2E_BUCKETS,
            )?,
            goodput: r.counters(
                "goodput_proxy_goodput_requests_total",
                "Requests that succeeded and met every applicable SLO.",
            )?,
            requests: r.counters(
                "goodput_proxy_requests_total",
                "Finished requests by outcome.",
            )?,
            slo_violations: r.counters(
                "goodput_proxy_slo_violations_total",
                "Requests that missed an SLO.",
            )?,
            prompt_tokens: r.counters(
                "goodput_proxy_prompt_tokens_total",
                "Prompt tokens (engine usage).",
            )?,
            generation_tokens: r.counters(
                "goodput_proxy_generation_tokens_total",
                "Generated tokens (usage when reported, else counted).",
            )?,
            in_flight: r.int_gauges("goodput_proxy_requests_in_flight", "Requests being served.")?,
            sse_discarded: r.single(IntCounter::new(
                "goodput_proxy_sse_discarded_total",
                "SSE lines or events from the engines that the parser dropped (over its 4 MiB line limit).",
            )?)?,
            overhead: r.histogram(
                "goodput_proxy_overhead_seconds",
                "Time the proxy spent on a request before it left for the upstream.",
                OVERHEAD_BUCKETS,
            )?,
            records_dropped: r.counters(
                "goodput_proxy_records_dropped_total",
                "Records a sink dropped: its queue was full, or the store kept refusing a batch.",
            )?,
            records_shipped: r.counters(
                "goodput_proxy_records_shipped_total",
                "Records a remote sink's store acknowledged.",
            )?,
            sink_errors: r.counters(
                "goodput_proxy_sink_errors_total",
                "Failed deliveries of a batch to a remote sink (retried, or dropped and counted).",
            )?,
            goodput_ratio: r.gauges(
                "goodput_proxy_goodput_ratio",
                "Good / (finished - rejections the client caused) over the sliding window \
                 (measure.goodput_window_s), per model; absent while the window is empty.",
            )?,
            goodput_ratio_overall: r.gauges(
                "goodput_proxy_goodput_ratio_overall",
                "goodput_proxy_goodput_ratio over every model.",
            )?,
            tenant_requests: r.counters(
                "goodput_proxy_tenant_requests_total",
                "Finished requests by tenant (`none`: auth off or refused) and outcome.",
            )?,
            tenant_tokens: r.counters(
                "goodput_proxy_tenant_tokens_total",
                "Prompt + completion tokens of finished requests, by tenant.",
            )?,
            agent: AgentFamilies::register(&r)?,
            engine_view: EngineViewFamilies::register(&r)?,
        };
        // Every sink's series exists from the start (a zero is a signal too).
        for sink in Sink::ALL {
            f.records_dropped.get(&sink);
        }
        f.records_shipped.get(&Sink::Clickhouse);
        f.sink_errors.get(&Sink::Clickhouse);
        Ok(f)
    }
}

/// What each request needs to resolve its per-upstream handles late (once the replica is
/// known) and to count itself in the goodput window; one per [`Metrics`], shared.
struct Shared {
    families: Families,
    upstreams: UpstreamLabels,
    window: Mutex<GoodputWindow>,
    /// Every request's handles, resolved once per label value (see `request::HandleCache`).
    cache: HandleCache,
    /// `upstream="none"`, allocated once.
    none: Arc<str>,
}

/// `goodput_proxy_goodput_ratio`'s sliding window, per model and overall.
struct GoodputWindow {
    clock: SecondClock,
    ratios: KeyedRings<1>,
}

impl GoodputWindow {
    fn new(window: Duration, origin: Instant) -> Self {
        Self {
            clock: SecondClock::new(origin),
            ratios: KeyedRings::new([window]).with_overall(),
        }
    }

    /// One eligible finished request of `model` at `end`.
    #[inline]
    fn add(&mut self, model: &Arc<str>, good: bool, end: Instant) {
        let s = self.clock.second(end);
        self.ratios.add(model, good, s);
    }
}

/// The proxy's measurement metrics: the families (read through `Deref`), the bounded label
/// values, and the per-request handles ([`Metrics::for_request`]).
pub struct Metrics {
    pub models: ModelLabels,
    pub upstreams: UpstreamLabels,
    shared: Arc<Shared>,
}

impl Deref for Metrics {
    type Target = Families;
    fn deref(&self) -> &Families {
        &self.shared.families
    }
}

impl Metrics {
    /// Create and register every family on `registry`.
    pub fn register(registry: &Registry, models: ModelLabels) -> Result<Self, prometheus::Error> {
        let upstreams = UpstreamLabels::default();
        Ok(Self {
            models,
            upstreams: upstreams.clone(),
            shared: Arc::new(Shared {
                families: Families::register(registry)?,
                upstreams,
                window: Mutex::new(GoodputWindow::new(DEFAULT_GOODPUT_WINDOW, Instant::now())),
                cache: HandleCache::default(),
                none: Arc::from(NO_UPSTREAM),
            }),
        })
    }

    /// A finished request of `tenant` (a configured name or `none`, never a raw user value).
    pub fn tenant_finished(&self, tenant: &Arc<str>, outcome: Outcome, tokens: u64) {
        self.shared.tenant_finished(tenant, outcome, tokens);
    }

    /// Sets the sliding window of `goodput_proxy_goodput_ratio` (before the first request;
    /// counts so far are dropped).
    pub fn set_goodput_window(&self, window: Duration) {
        if let Ok(mut w) = self.shared.window.lock() {
            *w = GoodputWindow::new(window, Instant::now());
        }
    }

    /// Sets the goodput-ratio gauges from the window at `now`; called right before the
    /// registry is gathered. A model (or the whole proxy) with no eligible request in the
    /// window has no series: an autoscaler reads "no data", never a made-up 0 or 1.
    pub fn refresh_goodput_ratio(&self, now: Instant) {
        let Ok(w) = self.shared.window.lock() else {
            return;
        };
        let s = w.clock.second_at(now);
        for (model, ratio) in w.ratios.per_key(0, s) {
            self.goodput_ratio
                .set_or_remove(&ByModel { model: &model }, ratio);
        }
        self.goodput_ratio_overall
            .set_or_remove(&(), w.ratios.overall(0, s));
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

/// The text exposition of every family in `r`, as a scrape would read it (for tests that pin
/// what a metric looks like from outside).
#[cfg(test)]
pub(crate) fn exposition_text(r: &Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&r.gather(), &mut buf)
        .expect("the text encoder writes into a Vec");
    String::from_utf8(buf).expect("the exposition is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::labels::SloName;
    use super::*;
    use crate::auth::NO_TENANT;
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
        let view = goodput_measure::engine::EngineView {
            queue: Some(ms(10)),
            ttft: Some(ms(50)),
            cached_prompt_tokens: Some(16),
            ..Default::default()
        };
        let split = goodput_measure::engine::TtftSplit::of(meas.ttft, Some(ms(1)), &view);
        meas.set_engine(view, split, 1);
        rm.finish(&meas, &judge(&meas, &Slo::default()), Instant::now());
        m.observe_overhead(Duration::from_micros(30));
        m.refresh_goodput_ratio(Instant::now());
        m.tenant_finished(&Arc::from("team-a"), Outcome::Success, 5);
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
                "goodput_proxy_ttft_split_seconds",
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
        assert_eq!(bounds("goodput_proxy_ttft_split_seconds"), TTFT_BUCKETS);
        // The split: one series per part, observed together, adding up to the client TTFT.
        let split = family(&fams, "goodput_proxy_ttft_split_seconds").get_metric();
        let mut parts: Vec<&str> = split
            .iter()
            .map(|m| {
                let l = m.get_label();
                l.iter().find(|l| l.name() == "part").unwrap().value()
            })
            .collect();
        parts.sort_unstable();
        assert_eq!(parts, ["engine_prefill", "engine_queue", "proxy", "rest"]);
        assert!(split
            .iter()
            .all(|m| m.get_histogram().get_sample_count() == 1));
        let total: f64 = split
            .iter()
            .map(|m| m.get_histogram().get_sample_sum())
            .sum();
        let ttft = meas.ttft.unwrap().as_secs_f64();
        assert!((total - ttft).abs() < 1e-9, "{total} vs {ttft}");
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
        rm.set_upstream(&Arc::from("http://e:1"));
        let tiny = ByModel { model: "tiny" };
        assert_eq!(m.in_flight.get(&tiny).get(), 1);
        let meas = success(3000, 7); // TTFT over the 2 s SLO: success, not good
        let v = judge(&meas, &Slo::default());
        rm.finish(&meas, &v, Instant::now());
        assert_eq!(m.in_flight.get(&tiny).get(), 0);
        let (model, upstream) = ("tiny", "http://e:1");
        let finished = |upstream, outcome, finish_reason| Finished {
            model,
            upstream,
            outcome,
            finish_reason,
        };
        let success = finished(upstream, Outcome::Success, Some(FinishReason::Stop));
        assert_eq!(m.requests.get(&success).get(), 1);
        let up = Served { model, upstream };
        assert_eq!(m.goodput.get(&up).get(), 0);
        let violated = |slo| Violation {
            model,
            upstream,
            slo,
        };
        assert_eq!(m.slo_violations.get(&violated(SloName::Ttft)).get(), 1);
        assert_eq!(m.slo_violations.get(&violated(SloName::Tpot)).get(), 0);
        assert_eq!(m.generation_tokens.get(&tiny).get(), 7);
        assert_eq!(m.prompt_tokens.get(&tiny).get(), 5);
        assert_eq!(m.ttft.get(&up).get_sample_count(), 1);
        assert_eq!(m.e2e.get(&up).get_sample_count(), 1);
        // Dropped without finish (the proxy answered itself): still leaves in-flight.
        drop(m.for_request("tiny"));
        assert_eq!(m.in_flight.get(&tiny).get(), 0);
        // A rejection is counted but not timed.
        let rej = Measurement::without_body(Outcome::Rejected, Some(429), Duration::from_millis(1));
        m.for_request("tiny")
            .finish(&rej, &judge(&rej, &Slo::default()), Instant::now());
        let rejected = finished(NO_UPSTREAM, Outcome::Rejected, None);
        assert_eq!(m.requests.get(&rejected).get(), 1);
        assert_eq!(m.e2e.get(&up).get_sample_count(), 1);
        let none = Served {
            model,
            upstream: NO_UPSTREAM,
        };
        assert_eq!(m.e2e.get(&none).get_sample_count(), 0);
    }

    /// The handles cached per (model, upstream) and per tenant count in the family's series,
    /// one per way a request ended, and make no series no request made.
    #[test]
    fn cached_counter_handles_count_in_the_families_series() {
        let (r, m) = setup(&["tiny"]);
        let ends = [
            (Outcome::Success, Some(FinishReason::Stop)),
            (Outcome::Success, Some(FinishReason::Stop)),
            (Outcome::Truncated, None),
            (Outcome::Success, Some(FinishReason::Length)),
            (Outcome::Success, Some(FinishReason::Stop)),
        ];
        for (outcome, finish_reason) in ends {
            let mut meas = success(10, 2);
            meas.outcome = outcome;
            meas.finish_reason = finish_reason;
            m.for_request("tiny")
                .finish(&meas, &judge(&meas, &Slo::default()), Instant::now());
            m.tenant_finished(&Arc::from("team-a"), outcome, 0);
        }
        m.tenant_finished(&Arc::from(NO_TENANT), Outcome::Timeout, 3);
        let finished = |outcome, finish_reason| Finished {
            model: "tiny",
            upstream: NO_UPSTREAM,
            outcome,
            finish_reason,
        };
        let count = |o, f| m.requests.get(&finished(o, f)).get();
        assert_eq!(count(Outcome::Success, Some(FinishReason::Stop)), 3);
        assert_eq!(count(Outcome::Success, Some(FinishReason::Length)), 1);
        assert_eq!(count(Outcome::Truncated, None), 1);
        let tenant = |tenant, outcome| {
            m.tenant_requests
                .get(&TenantFinished { tenant, outcome })
                .get()
        };
        assert_eq!(tenant("team-a", Outcome::Success), 4);
        assert_eq!(tenant("team-a", Outcome::Truncated), 1);
        assert_eq!(tenant(NO_TENANT, Outcome::Timeout), 1);
        let tokens = |tenant| m.tenant_tokens.get(&ByTenant { tenant }).get();
        assert_eq!((tokens("team-a"), tokens(NO_TENANT)), (0, 3));
        // Series: the ones read above (reading made none new: each existed).
        let series = |name| family(&r.gather(), name).get_metric().len();
        assert_eq!(series("goodput_proxy_requests_total"), 3);
        assert_eq!(series("goodput_proxy_tenant_requests_total"), 3);
        assert_eq!(series("goodput_proxy_tenant_tokens_total"), 2);
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
            rm.set_upstream(&Arc::from(format!("http://d{i}:1")));
            rm.finish(&meas, &v, Instant::now());
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
                .finish(meas, &judge(meas, &Slo::default()), Instant::now());
        }
        m.refresh_goodput_ratio(Instant::now());
        let ratio = |model: &str| m.goodput_ratio.get(&ByModel { model }).get();
        assert_eq!(ratio("tiny"), 2.0 / 3.0);
        assert_eq!(ratio("big"), 0.0);
        assert_eq!(m.goodput_ratio_overall.get(&()).get(), 2.0 / 4.0);
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
                .finish(&meas, &v, Instant::now());
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
