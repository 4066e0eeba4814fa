//! One request's metric handles, and the cache they come from.
//!
//! Label values are bounded (`ModelLabels`, `UpstreamLabels`) and the request families' series
//! are never removed, so each `model` value and each (`model`, `upstream`) pair resolves its
//! handles once for the life of the process: a request then costs two map look-ups instead of
//! nine `with_label_values` calls (each one hashes its label values and takes the family's lock).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use foldhash::fast::FixedState;
use prometheus::local::LocalHistogram;
use prometheus::{Histogram, IntCounter, IntGauge};
use tokio::time::Instant;

use super::labels::{ByModel, Finished, Served, SloName, Violation};
use super::Shared;
use goodput_measure::meter::Measurement;
use goodput_measure::outcome::{rejected_by_client, Outcome};
use goodput_measure::slo::SloVerdict;

/// Keyed by label values, from bounded sets and never inserted from a request's own bytes,
/// looked up twice a request: a fixed-seed fast hash is enough.
type ByLabel<V> = HashMap<Arc<str>, Arc<V>, FixedState>;

/// Resolved handles by label value; entries are only added (bounded by the label sets).
#[derive(Default)]
pub(super) struct HandleCache {
    models: RwLock<ByLabel<ModelHandles>>,
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
    itl: Histogram,
    e2e: Histogram,
    goodput: IntCounter,
}

/// The cached value of `key`, else `make()`'s, inserted (the first writer wins). A poisoned
/// lock only costs the caching.
fn cached<V>(map: &RwLock<ByLabel<V>>, key: &Arc<str>, make: impl FnOnce() -> V) -> Arc<V> {
    if let Some(v) = map.read().ok().and_then(|m| m.get(key).cloned()) {
        return v;
    }
    let v = Arc::new(make());
    match map.write() {
        Ok(mut m) => m.entry(key.clone()).or_insert(v).clone(),
        Err(_) => v,
    }
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
            }
        })
    }
}

/// Gaps an [`ItlBuffer`] holds before it hands them to the shared histogram.
pub const ITL_FLUSH_GAPS: u32 = 32;

/// One request's ITL observations, buffered: a gap costs no shared atomic. Every stream of a
/// model and replica observes the same series, so observing each gap at once made the runtime
/// threads take turns on its cache lines for every event. Flushed every [`ITL_FLUSH_GAPS`]
/// gaps and when dropped (the metered body drops it at the request's end, before the record),
/// so `/metrics` lags a running stream by fewer than that many gaps and a finished one not at all.
pub struct ItlBuffer {
    local: LocalHistogram,
    pending: u32,
}

impl ItlBuffer {
    pub fn observe(&mut self, gap: Duration) {
        self.local.observe(gap.as_secs_f64());
        self.pending += 1;
        if self.pending >= ITL_FLUSH_GAPS {
            self.local.flush();
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
    pub fn set_upstream(&mut self, url: &str) {
        self.upstream = self.shared.upstreams.resolve(url);
        self.handles = None;
        self.handles();
    }

    fn handles(&mut self) -> &Handles {
        let (model, upstream, sh, pm) =
            (&self.model, &self.upstream, &self.shared, &self.per_model);
        self.handles
            .get_or_insert_with(|| sh.handles(pm, model, upstream))
    }

    /// The request's ITL observer (fed by the recorder's body): the histogram, buffered
    /// (see [`ItlBuffer`]).
    pub fn itl_buffer(&mut self) -> ItlBuffer {
        ItlBuffer {
            local: self.handles().itl.local(),
            pending: 0,
        }
    }

    pub fn observe_gap(&mut self, gap: Duration) {
        self.handles().itl.observe(gap.as_secs_f64());
    }

    /// Record a finished request. Latency histograms: TTFT / TTFC / TPOT whenever defined (any
    /// outcome, as vLLM does for TTFT); E2E for every outcome except `rejected`. ITL gaps are
    /// observed as they happen (see [`RequestMetrics::itl_buffer`]).
    pub fn finish(mut self, m: &Measurement, v: &SloVerdict) {
        let (model_label, upstream_label) = (self.model.clone(), self.upstream.clone());
        let (model, upstream) = (&*model_label, &*upstream_label);
        let sh = self.shared.clone();
        let f = &sh.families;
        f.requests
            .get(&Finished {
                model,
                upstream,
                outcome: m.outcome,
                finish_reason: m.finish_reason,
            })
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
                w.add(&model_label, v.good, Instant::now());
            }
        }
        let h = self.handles();
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
        // Drop takes it out of flight.
    }
}

impl Drop for RequestMetrics {
    fn drop(&mut self) {
        if std::mem::take(&mut self.in_flight) {
            self.per_model.in_flight.dec();
        }
    }
}
