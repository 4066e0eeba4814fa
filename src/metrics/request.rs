//! One request's metric handles, and the cache they come from.
//!
//! Label values are bounded (`ModelLabels`, `UpstreamLabels`) and the request families' series
//! are never removed, so each `model` value and each (`model`, `upstream`) pair resolves its
//! handles once for the life of the process: a request then costs two map look-ups instead of
//! nine `with_label_values` calls (each one hashes its label values and takes the family's lock).

use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntGauge};
use tokio::time::Instant;

use super::by_pointer::{find_or_make, ByLabel};
use super::gap_histogram::{GapBuffer, GapHistogram};
use super::labels::{ByModel, ByTenant, Finished, Served, SloName, TenantFinished, Violation};
use super::Shared;
use goodput_measure::meter::Measurement;
use goodput_measure::outcome::{rejected_by_client, FinishReason, Outcome};
use goodput_measure::slo::SloVerdict;

/// Resolved handles by label value; entries are only added (bounded by the label sets).
#[derive(Default)]
pub(super) struct HandleCache {
    models: RwLock<ByLabel<ModelHandles>>,
    tenants: RwLock<ByLabel<TenantHandles>>,
}

/// The handles of one `tenant` value (a configured name or `none`).
struct TenantHandles {
    /// `tenant_requests_total` by outcome, each resolved the first time a request of the
    /// tenant ends that way.
    requests: [OnceLock<IntCounter>; Outcome::ALL.len()],
    tokens: IntCounter,
}

/// The handles of one `model` value, and of its pairs with each `upstream` value.
struct ModelHandles {
    in_flight: IntGauge,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    upstreams: RwLock<ByLabel<Handles>>,
}

/// A request's handles of the families labelled `model` and `upstream`.
struct Handles {
    ttft: Histogram,
    ttfc: Histogram,
    tpot: Histogram,
    itl: GapHistogram,
    e2e: Histogram,
    goodput: IntCounter,
    /// `requests_total` of this pair, by outcome and finish reason: each series resolved the
    /// first time a request ends that way (never before, so that no series appears at 0 that
    /// no request made).
    requests: ByEnding<IntCounter>,
}

/// One slot per outcome and finish reason (`none` first): the closed label sets of
/// `requests_total` besides `model` and `upstream`.
pub(super) struct ByEnding<V> {
    slots: [[OnceLock<V>; ENDING_REASONS]; Outcome::ALL.len()],
}

/// `none` and every [`FinishReason`].
const ENDING_REASONS: usize = 10;

fn outcome_slot(o: Outcome) -> usize {
    match o {
        Outcome::Success => 0,
        Outcome::ClientAbort => 1,
        Outcome::UpstreamError => 2,
        Outcome::Truncated => 3,
        Outcome::Timeout => 4,
        Outcome::Rejected => 5,
    }
}

fn reason_slot(r: Option<FinishReason>) -> usize {
    match r {
        None => 0,
        Some(FinishReason::Stop) => 1,
        Some(FinishReason::Length) => 2,
        Some(FinishReason::ToolCalls) => 3,
        Some(FinishReason::ContentFilter) => 4,
        Some(FinishReason::FunctionCall) => 5,
        Some(FinishReason::Abort) => 6,
        Some(FinishReason::Error) => 7,
        Some(FinishReason::Repetition) => 8,
        Some(FinishReason::Other) => 9,
    }
}

impl<V> Default for ByEnding<V> {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())),
        }
    }
}

impl<V> ByEnding<V> {
    /// The value of (`outcome`, `reason`), made by `make` the first time it is asked for.
    pub(super) fn get(
        &self,
        outcome: Outcome,
        reason: Option<FinishReason>,
        make: impl FnOnce() -> V,
    ) -> &V {
        self.slots[outcome_slot(outcome)][reason_slot(reason)].get_or_init(make)
    }
}

/// The cached value of `key` (by its pointer when it is an `Arc` seen before), else
/// `make()`'s, inserted (the first writer wins). A poisoned lock only costs the caching.
fn cached<V>(map: &RwLock<ByLabel<V>>, key: &Arc<str>, make: impl FnOnce() -> V) -> Arc<V> {
    find_or_make(map, key, || Arc::new(make()))
}

impl Shared {
    fn model_handles(&self, model: &Arc<str>) -> Arc<ModelHandles> {
        cached(&self.cache.models, model, || {
            let (f, l) = (&self.families, ByModel { model });
            ModelHandles {
                in_flight: f.in_flight.get(&l),
                prompt_tokens: f.prompt_tokens.get(&l),
                generation_tokens: f.generation_tokens.get(&l),
                upstreams: RwLock::default(),
            }
        })
    }

    /// A finished request of `tenant` (a configured name or `none`, never a raw user value):
    /// `tenant_requests_total` and `tenant_tokens_total` (the series made at 0 by a request
    /// without tokens, as every tenant that finished a request has one).
    pub(super) fn tenant_finished(&self, tenant: &Arc<str>, outcome: Outcome, tokens: u64) {
        let f = &self.families;
        let h = cached(&self.cache.tenants, tenant, || TenantHandles {
            requests: std::array::from_fn(|_| OnceLock::new()),
            tokens: f.tenant_tokens.get(&ByTenant { tenant }),
        });
        h.requests[outcome_slot(outcome)]
            .get_or_init(|| f.tenant_requests.get(&TenantFinished { tenant, outcome }))
            .inc();
        if tokens > 0 {
            h.tokens.inc_by(tokens);
        }
    }

    fn handles(&self, per_model: &ModelHandles, model: &str, upstream: &Arc<str>) -> Arc<Handles> {
        cached(&per_model.upstreams, upstream, || {
            let (f, l) = (&self.families, Served { model, upstream });
            Handles {
                ttft: f.ttft.get(&l),
                ttfc: f.ttfc.get(&l),
                tpot: f.tpot.get(&l),
                itl: f.itl.get(&l),
                e2e: f.e2e.get(&l),
                goodput: f.goodput.get(&l),
                requests: ByEnding::default(),
            }
        })
    }
}

/// Gaps an [`ItlBuffer`] holds before it hands them to the shared histogram.
pub const ITL_FLUSH_GAPS: u32 = 32;

/// One request's ITL observations, buffered: a gap costs no shared atomic. Every stream of a
/// model and replica observes the same series, so observing each gap at once made the runtime
/// threads take turns on its cache lines for every event. Flushed once [`ITL_FLUSH_GAPS`] gaps
/// wait (checked at each gap that is not zero and each time a frame has been metered,
/// [`ItlBuffer::settle`]) and when dropped (the metered body drops it at the request's end,
/// before the record), so between frames `/metrics` lags a running stream by fewer than that
/// many gaps and a finished one not at all. A zero gap (events packed into one read) is
/// counted, not observed (see `gap_histogram`): a frame's run of them adds up to one addition.
pub struct ItlBuffer {
    /// The series' handles: the buffer is made at the first gap (a JSON answer has none, and
    /// a local histogram is an allocation and a flush).
    handles: Arc<Handles>,
    gaps: Option<GapBuffer>,
    pending: u64,
}

impl ItlBuffer {
    #[inline]
    pub fn observe(&mut self, gap: Duration) {
        let handles = &self.handles;
        self.gaps
            .get_or_insert_with(|| handles.itl.buffer())
            .observe(gap);
        self.pending += 1;
        if !gap.is_zero() {
            self.settle();
        }
    }

    /// The request's end: every buffered gap reaches the histogram (before its record). The
    /// buffer is dropped (dropping flushes it), so that nothing is flushed twice.
    pub fn finish(&mut self) {
        self.gaps = None;
        self.pending = 0;
    }

    /// A frame has been metered: flush when [`ITL_FLUSH_GAPS`] gaps wait.
    #[inline]
    pub fn settle(&mut self) {
        if self.pending >= u64::from(ITL_FLUSH_GAPS) {
            if let Some(g) = self.gaps.as_mut() {
                g.flush();
            }
            self.pending = 0;
        }
    }
}

/// One request's metric handles, resolved once. Dropping it without [`RequestMetrics::finish`]
/// still takes the request out of `requests_in_flight`.
pub struct RequestMetrics {
    model: Arc<str>,
    upstream: Arc<str>,
    per_model: Arc<ModelHandles>,
    /// Resolved by `set_upstream`, else at the end with `upstream="none"`.
    handles: Option<Arc<Handles>>,
    shared: Arc<Shared>,
    /// Counted in `requests_in_flight` (until finished or dropped).
    in_flight: bool,
}

impl RequestMetrics {
    /// Resolves the per-model handles of `model` (a bounded label value) and counts the
    /// request in flight.
    pub(super) fn begin(model: Arc<str>, shared: Arc<Shared>) -> Self {
        let per_model = shared.model_handles(&model);
        per_model.in_flight.inc();
        Self {
            upstream: shared.none.clone(),
            model,
            per_model,
            handles: None,
            shared,
            in_flight: true,
        }
    }

    /// The resolved `model` label value.
    pub fn model(&self) -> &Arc<str> {
        &self.model
    }

    /// The resolved `upstream` label value (`none` until [`RequestMetrics::set_upstream`]).
    pub fn upstream(&self) -> &Arc<str> {
        &self.upstream
    }

    /// The replica that answered (its URL, as in `ServedBy`): resolves the per-upstream
    /// handles once, with the replica's bounded label.
    pub fn set_upstream(&mut self, url: &Arc<str>) {
        self.upstream = self.shared.upstreams.resolve_served(url);
        self.handles = None;
        self.handles();
    }

    fn handles(&mut self) -> &Handles {
        self.shared_handles()
    }

    fn shared_handles(&mut self) -> &Arc<Handles> {
        let (model, upstream, sh, pm) =
            (&self.model, &self.upstream, &self.shared, &self.per_model);
        self.handles
            .get_or_insert_with(|| sh.handles(pm, model, upstream))
    }

    /// The request's ITL observer (fed by the recorder's body): the histogram, buffered
    /// (see [`ItlBuffer`]).
    pub fn itl_buffer(&mut self) -> ItlBuffer {
        ItlBuffer {
            handles: self.shared_handles().clone(),
            gaps: None,
            pending: 0,
        }
    }

    pub fn observe_gap(&mut self, gap: Duration) {
        self.handles().itl.observe(gap);
    }

    /// Record a finished request. Latency histograms: TTFT / TTFC / TPOT whenever defined (any
    /// outcome, as vLLM does for TTFT); E2E for every outcome except `rejected`. ITL gaps are
    /// observed as they happen (see [`RequestMetrics::itl_buffer`]). `end`: when the request
    /// finished (the goodput window counts it there).
    ///
    /// By reference: the recorder finishes the request where its state lives (in the
    /// response body's box), without moving it out first. Called once per request.
    pub fn finish(&mut self, m: &Measurement, v: &SloVerdict, end: Instant) {
        // The handles taken out rather than borrowed through `&mut self`: the labels and the
        // shared state are then read in place, not cloned (three shared reference counts
        // touched by every request of the model).
        let h = match self.handles.take() {
            Some(h) => h,
            None => self
                .shared
                .handles(&self.per_model, &self.model, &self.upstream),
        };
        let (model, upstream, sh) = (&*self.model, &*self.upstream, &*self.shared);
        let f = &sh.families;
        let finished = Finished {
            model,
            upstream,
            outcome: m.outcome,
            finish_reason: m.finish_reason,
        };
        h.requests
            .get(m.outcome, m.finish_reason, || f.requests.get(&finished))
            .inc();
        if let Some(a) = &m.agent {
            f.agent.observe(model, a);
        }
        f.engine_view.observe(model, upstream, m);
        for (slo, ok) in [
            (SloName::Ttft, v.ttft_ok),
            (SloName::Tpot, v.tpot_ok),
            (SloName::E2e, v.e2e_ok),
            (SloName::ToolCalls, v.tool_calls_ok),
            (SloName::Stall, v.stall_ok),
        ] {
            if ok == Some(false) {
                f.slo_violations
                    .get(&Violation {
                        model,
                        upstream,
                        slo,
                    })
                    .inc();
            }
        }
        if !rejected_by_client(m.outcome, m.status) {
            if let Ok(mut w) = sh.window.lock() {
                w.add(&self.model, v.good, end);
            }
        }
        if v.good {
            h.goodput.inc();
        }
        if let Some(d) = m.ttft {
            h.ttft.observe(d.as_secs_f64());
        }
        if let Some(d) = m.ttfc {
            h.ttfc.observe(d.as_secs_f64());
        }
        // One observation per choice (vLLM records one per child request).
        for d in m.tpot_observations() {
            h.tpot.observe(d.as_secs_f64());
        }
        if m.outcome != Outcome::Rejected {
            h.e2e.observe(m.e2e.as_secs_f64());
        }
        if let Some(n) = m.prompt_tokens {
            self.per_model.prompt_tokens.inc_by(n);
        }
        if let Some(n) = m.completion_tokens {
            self.per_model.generation_tokens.inc_by(n);
        }
        if m.sse_discarded > 0 {
            f.sse_discarded.inc_by(m.sse_discarded);
        }
        self.handles = Some(h);
        self.out_of_flight();
    }

    fn out_of_flight(&mut self) {
        if std::mem::take(&mut self.in_flight) {
            self.per_model.in_flight.dec();
        }
    }
}

impl Drop for RequestMetrics {
    fn drop(&mut self) {
        self.out_of_flight();
    }
}
