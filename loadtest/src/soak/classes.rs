//! The soak's request mix: each class is a kind of request (plain stream, JSON, a simulator
//! fault, a client that hangs up) with its share and the outcome both sides must record for it.
//! Outcomes come from what the simulator is told to do, never from timing, except `hang`
//! (the proxy's first-byte deadline, set far above any normal first byte).

use goodput_measure::Outcome;

use crate::request::{synth_prompt, RequestPlan, UsageAsk};
use crate::scenario::Api;

/// One kind of request in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    /// Short name, used in the report and as the key of the per-class tallies.
    pub name: &'static str,
    /// Share in percent (the shares of [`CLASSES`] sum to 100).
    pub percent: u32,
    pub api: Api,
    pub stream: bool,
    pub max_tokens: u64,
    /// `x-sim-fault` value, if any.
    pub fault: Option<&'static str>,
    /// The client hangs up after this many SSE events.
    pub hangup_after: Option<u64>,
    /// What the client records.
    pub client: Outcome,
    /// What the proxy records (differs from the client's only where the proxy knows more:
    /// its own deadline fired, the client just sees a 504).
    pub proxy: Outcome,
}

const fn class(name: &'static str, percent: u32, outcome: Outcome) -> Class {
    Class {
        name,
        percent,
        api: Api::Chat,
        stream: true,
        max_tokens: 24,
        fault: None,
        hangup_after: None,
        client: outcome,
        proxy: outcome,
    }
}

const fn fault(name: &'static str, percent: u32, f: &'static str, outcome: Outcome) -> Class {
    Class {
        fault: Some(f),
        ..class(name, percent, outcome)
    }
}

/// The mix: 60% plain requests (streams, JSON, completions, a slow first token), 40% failures
/// of every kind the simulator makes plus clients that hang up.
pub const CLASSES: [Class; 13] = [
    class("stream", 45, Outcome::Success),
    Class {
        stream: false,
        ..class("json", 8, Outcome::Success)
    },
    Class {
        api: Api::Completions,
        ..class("completions", 5, Outcome::Success)
    },
    fault("slow-first-token", 2, "stall-first=300", Outcome::Success),
    fault("status-503", 4, "status=503", Outcome::UpstreamError),
    fault("status-429", 3, "status=429", Outcome::Rejected),
    fault("error-after-3", 6, "error-after=3", Outcome::UpstreamError),
    fault(
        "truncate-after-3",
        6,
        "truncate-after=3",
        Outcome::Truncated,
    ),
    fault("no-done", 4, "no-done", Outcome::Truncated),
    fault(
        "finish-abort",
        4,
        "finish=abort,finish-after=2",
        Outcome::UpstreamError,
    ),
    Class {
        stream: false,
        ..fault("json-500", 4, "status=500", Outcome::UpstreamError)
    },
    // Long streams (64 tokens, a decode step apart): the client drops after 3 events, long
    // before the proxy could have handed over the whole body.
    Class {
        max_tokens: 64,
        hangup_after: Some(3),
        ..class("hangup", 7, Outcome::ClientAbort)
    },
    // The simulator never answers: the proxy's first-byte deadline fires (its record says
    // timeout), the client gets the proxy's 504 (an upstream error as far as it can tell).
    Class {
        proxy: Outcome::Timeout,
        ..fault("hang", 2, "hang", Outcome::UpstreamError)
    },
];

/// The class of request number `i` for `seed`: a fixed permutation-free draw (splitmix64 of
/// seed and index), so a run is reproducible and any window of it has the mix's shares.
pub fn class_of(seed: u64, i: u64) -> usize {
    let mut z = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let mut at = (z % 100) as u32;
    for (k, c) in CLASSES.iter().enumerate() {
        if at < c.percent {
            return k;
        }
        at -= c.percent;
    }
    0
}

/// The request a class sends.
pub fn plan(c: &Class, model: &str, i: u64) -> RequestPlan {
    RequestPlan {
        api: c.api,
        model: model.to_owned(),
        prompt: synth_prompt(16, i as u32),
        prompt_tokens: 16,
        max_tokens: c.max_tokens,
        stream: c.stream,
        n: 1,
        logprobs: None,
        // Half the streams ask for usage themselves, half get it injected by the proxy.
        usage: if c.stream && i % 2 == 0 {
            UsageAsk::Final
        } else {
            UsageAsk::Off
        },
        ignore_eos: true,
        hangup_after: c.hangup_after,
        header: None,
        tools: false,
    }
}

/// Index of an outcome in `Outcome::ALL` (the tallies are arrays in that order).
pub fn outcome_index(o: Outcome) -> usize {
    Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_sum_to_100_and_names_are_unique() {
        assert_eq!(CLASSES.iter().map(|c| c.percent).sum::<u32>(), 100);
        let mut names: Vec<_> = CLASSES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CLASSES.len());
    }

    #[test]
    fn draws_follow_the_shares() {
        let mut n = [0u32; CLASSES.len()];
        for i in 0..100_000 {
            n[class_of(7, i)] += 1;
        }
        for (c, got) in CLASSES.iter().zip(n) {
            let want = c.percent * 1000;
            assert!(got.abs_diff(want) < 400, "{}: {got} vs {want}", c.name);
        }
        assert_ne!(
            (0..64).map(|i| class_of(1, i)).collect::<Vec<_>>(),
            (0..64).map(|i| class_of(2, i)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_fault_parses_as_the_simulator_reads_it() {
        for c in CLASSES.iter().filter_map(|c| c.fault) {
            assert!(c.parse::<goodput_sim::faults::Faults>().is_ok(), "{c}");
        }
    }
}
