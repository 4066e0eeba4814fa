//! Prometheus exposition text, read by the one reader (`goodput_measure::prom`): histogram
//! buckets and counter sums, with the PromQL-style quantile over bucket deltas (shared with
//! `goodput-proxy compare`). A page the reader refuses reads as absent.

use goodput_measure::prom::{self, Family};

// One histogram arithmetic for the proxy's `compare` and this comparison.
pub use goodput_measure::prom::hist::{delta, quantile, Buckets};

fn families(text: &str) -> Option<Vec<Family>> {
    match prom::parse(text) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(error = %e, "unreadable /metrics page");
            None
        }
    }
}

/// Histogram `family` buckets from exposition text, summed over its series (any one label of
/// `model_keys` must equal `model` if given); `None` when no series matches.
pub fn histogram(
    text: &str,
    family: &str,
    model_keys: &[&str],
    model: Option<&str>,
) -> Option<Buckets> {
    let families = families(text)?;
    let keep = |s: &prom::Sample| match model {
        Some(m) => model_keys.iter().any(|k| s.has_labels(&[(k, m)])),
        None => true,
    };
    prom::hist::buckets(&families, family, &keep).filter(|b| !b.is_empty())
}

/// Sum of every series of a counter or gauge `name` (e.g. `vllm:generation_tokens_total`), or
/// `None` when there is none.
pub fn series_sum(text: &str, name: &str) -> Option<f64> {
    prom::sum(&families(text)?, name, &[]).ok()
}
