//! SLOs and the goodput judgement (DESIGN.md, "Goodput").

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::measure::meter::Measurement;
use crate::measure::outcome::Outcome;

/// Latency objectives; `None` means not configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slo {
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub e2e: Option<Duration>,
}

impl Default for Slo {
    /// DESIGN.md defaults: TTFT <= 2 s, TPOT <= 150 ms, E2E <= 30 s.
    fn default() -> Self {
        Self {
            ttft: Some(Duration::from_secs(2)),
            tpot: Some(Duration::from_millis(150)),
            e2e: Some(Duration::from_secs(30)),
        }
    }
}

/// Global SLOs with per-model overrides.
#[derive(Debug, Clone, Default)]
pub struct SloTable {
    pub default: Slo,
    pub per_model: HashMap<String, Slo>,
}

impl SloTable {
    pub fn for_model(&self, model: &str) -> &Slo {
        self.per_model.get(model).unwrap_or(&self.default)
    }
}

/// Which SLOs held. `None`: the SLO is not configured or does not apply (non-streaming TTFT and
/// TPOT; TTFT without any output token; TPOT with fewer than 2 tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SloVerdict {
    pub ttft_ok: Option<bool>,
    pub tpot_ok: Option<bool>,
    pub e2e_ok: Option<bool>,
    pub good: bool,
}

/// Good iff `success` and every SLO that applies holds. Non-streaming: only E2E applies.
pub fn judge(m: &Measurement, slo: &Slo) -> SloVerdict {
    let check = |limit: Option<Duration>, value: Option<Duration>| match (limit, value) {
        (Some(l), Some(v)) => Some(v <= l),
        _ => None,
    };
    let (ttft_ok, tpot_ok) = if m.streaming {
        (check(slo.ttft, m.ttft), check(slo.tpot, m.tpot))
    } else {
        (None, None)
    };
    let e2e_ok = check(slo.e2e, Some(m.e2e));
    let good = m.outcome == Outcome::Success
        && [ttft_ok, tpot_ok, e2e_ok].iter().all(|v| *v != Some(false));
    SloVerdict {
        ttft_ok,
        tpot_ok,
        e2e_ok,
        good,
    }
}
