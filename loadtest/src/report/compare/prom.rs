//! Prometheus exposition text, read by the one reader (`goodput_measure::prom`): histogram
//! buckets and counter sums, with the PromQL-style quantile over bucket deltas (shared with
//! `goodput-proxy compare`). A page the reader refuses reads as absent.

use goodput_measure::prom::engines::{self, Names};
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
/// `model_keys` must equal `model` if given; a family whose series carry none of those labels,
/// as TGI's, is one engine's one model and read whole); `None` when no series matches.
pub fn histogram(
    text: &str,
    family: &str,
    model_keys: &[&str],
    model: Option<&str>,
) -> Option<Buckets> {
    let families = families(text)?;
    let bucket = format!("{family}_bucket");
    let labelled = families
        .iter()
        .flat_map(|f| &f.samples)
        .filter(|s| s.name == bucket)
        .any(|s| model_keys.iter().any(|k| s.label(k).is_some()));
    let keep = |s: &prom::Sample| match model {
        Some(m) if labelled => model_keys.iter().any(|k| s.has_labels(&[(k, m)])),
        _ => true,
    };
    prom::hist::buckets(&families, family, &keep).filter(|b| !b.is_empty())
}

/// The engine whose page this is (the name prefix most of its families carry), vLLM's names
/// when it tells none.
pub fn engine_of(text: &str) -> &'static Names {
    families(text)
        .and_then(|f| engines::by_prefix(f.iter().map(|f| f.name.as_str())))
        .unwrap_or(&engines::VLLM)
}

/// [`series_sum`] of the first of `names` the page has a series of.
pub fn first_sum(text: &str, names: &[&str]) -> Option<f64> {
    let families = families(text)?;
    names.iter().find_map(|n| prom::sum(&families, n, &[]).ok())
}

/// Sum of every series of a counter or gauge `name` (e.g. `vllm:generation_tokens_total`), or
/// `None` when there is none.
pub fn series_sum(text: &str, name: &str) -> Option<f64> {
    prom::sum(&families(text)?, name, &[]).ok()
}
