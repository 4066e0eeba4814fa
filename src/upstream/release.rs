//! Why a prefix left the replicas holding it ("sticky until saturated" released): the `cause`
//! label of `goodput_proxy_route_releases_total`. Each release starts a cold prefill elsewhere,
//! so which signal released it is what an operator tunes (`saturation_*`) and what a
//! benchmark must show before it blames the strategy.

use crate::metrics::family::LabelSet;

/// Why the most recent holder of a request's prefix was passed over, the first that applies in
/// this order (the order `decide` tests them in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Release {
    /// No holder could be a candidate: unhealthy (while another replica was healthy).
    Unhealthy,
    /// Every holder was already tried for this request (an admission retry).
    Excluded,
    /// The holder's engine queue reached `saturation_queue`.
    Queue,
    /// The holder's KV-cache use reached `saturation_kv` while requests waited there.
    Kv,
    /// The holder's load in tokens with the request went past `saturation_ratio` x the mean
    /// plus one cold request.
    Load,
    /// `auto`: the holder's SLO attainment more than the gap below the best replica's.
    Attainment,
}

impl Release {
    pub const ALL: [Release; 6] = [
        Release::Unhealthy,
        Release::Excluded,
        Release::Queue,
        Release::Kv,
        Release::Load,
        Release::Attainment,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Release::Unhealthy => "unhealthy",
            Release::Excluded => "excluded",
            Release::Queue => "queue",
            Release::Kv => "kv",
            Release::Load => "load",
            Release::Attainment => "attainment",
        }
    }
}

impl LabelSet for Release {
    const NAMES: &'static [&'static str] = &["cause"];
    type Series<'a> = Release;
    fn with_values<R>(s: &Release, f: impl FnOnce(&[&str]) -> R) -> R {
        f(&[s.as_str()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_a_distinct_label() {
        let mut names: Vec<&str> = Release::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Release::ALL.len());
        for (i, r) in Release::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "ALL is in declaration order: {r:?}");
        }
    }
}
