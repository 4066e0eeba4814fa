//! SLOs and the goodput judgement (DESIGN.md, "Goodput").

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::meter::Measurement;
use crate::outcome::Outcome;

/// Latency objectives; `None` means not configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slo {
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub e2e: Option<Duration>,
    /// The longest a stream's reader may wait between two output events of one choice (the
    /// record's `itl_max`); `None` (the default): stalls are counted, not judged.
    pub max_stall: Option<Duration>,
    /// A tool call that is not valid (not JSON, breaking its function's schema, naming an
    /// unknown function) makes the request not good (default on).
    pub valid_tool_calls: bool,
}

impl Default for Slo {
    /// DESIGN.md defaults: TTFT <= 2 s, TPOT <= 150 ms, E2E <= 30 s.
    fn default() -> Self {
        Self {
            ttft: Some(Duration::from_secs(2)),
            tpot: Some(Duration::from_millis(150)),
            e2e: Some(Duration::from_secs(30)),
            max_stall: None,
            valid_tool_calls: true,
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

/// Which SLOs held. `None`: the SLO is not configured or does not apply (non-streaming TTFT,
/// TPOT and stall; TTFT without any output token; TPOT with fewer than 2 tokens; stall with
/// fewer than 2 output events of one choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SloVerdict {
    pub ttft_ok: Option<bool>,
    pub tpot_ok: Option<bool>,
    pub e2e_ok: Option<bool>,
    /// The request's tool calls were all valid; `None` without tool calls or with
    /// `valid_tool_calls` off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls_ok: Option<bool>,
    /// No choice waited longer than `max_stall` between two output events; `None` when
    /// `max_stall` is not set or there was no gap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_ok: Option<bool>,
    pub good: bool,
}

/// Good iff `success` and every SLO that applies holds. Non-streaming: only E2E applies.
pub fn judge(m: &Measurement, slo: &Slo) -> SloVerdict {
    let check = |limit: Option<Duration>, value: Option<Duration>| match (limit, value) {
        (Some(l), Some(v)) => Some(v <= l),
        _ => None,
    };
    let (ttft_ok, tpot_ok, stall_ok) = if m.streaming {
        (
            check(slo.ttft, m.ttft),
            check(slo.tpot, m.tpot),
            check(slo.max_stall, m.itl_max),
        )
    } else {
        (None, None, None)
    };
    let e2e_ok = check(slo.e2e, Some(m.e2e));
    let tool_calls_ok = match (&m.agent, slo.valid_tool_calls) {
        (Some(a), true) => a.tool_call_outcome.map(|_| !a.tool_call_failed()),
        _ => None,
    };
    let good = m.outcome == Outcome::Success
        && [ttft_ok, tpot_ok, e2e_ok, tool_calls_ok, stall_ok]
            .iter()
            .all(|v| *v != Some(false));
    SloVerdict {
        ttft_ok,
        tpot_ok,
        e2e_ok,
        tool_calls_ok,
        stall_ok,
        good,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn stream(outcome: Outcome, ttft: Option<u64>, tpot: Option<u64>, e2e: u64) -> Measurement {
        let mut m = Measurement::without_body(outcome, Some(200), ms(e2e));
        m.streaming = true;
        m.ttft = ttft.map(ms);
        m.tpot = tpot.map(ms);
        m
    }

    #[test]
    fn defaults_are_the_design_ones() {
        let s = Slo::default();
        assert_eq!(
            (s.ttft, s.tpot, s.e2e),
            (Some(ms(2000)), Some(ms(150)), Some(ms(30_000)))
        );
    }

    #[test]
    fn verdicts() {
        let d = Slo::default();
        use Outcome::*;
        let cases = [
            (
                "all within",
                stream(Success, Some(300), Some(20), 1300),
                (Some(true), Some(true), Some(true), true),
            ),
            (
                "on the limit holds",
                stream(Success, Some(2000), Some(150), 30_000),
                (Some(true), Some(true), Some(true), true),
            ),
            (
                "slow first token: success, not good",
                stream(Success, Some(2001), Some(20), 3000),
                (Some(false), Some(true), Some(true), false),
            ),
            (
                "slow tokens",
                stream(Success, Some(300), Some(151), 3000),
                (Some(true), Some(false), Some(true), false),
            ),
            (
                "slow overall",
                stream(Success, Some(300), Some(20), 30_001),
                (Some(true), Some(true), Some(false), false),
            ),
            (
                "no token: TTFT/TPOT do not apply",
                stream(Success, None, None, 100),
                (None, None, Some(true), true),
            ),
            (
                "fast but truncated",
                stream(Truncated, Some(1), Some(1), 10),
                (Some(true), Some(true), Some(true), false),
            ),
            (
                "fast but aborted",
                stream(ClientAbort, Some(1), None, 10),
                (Some(true), None, Some(true), false),
            ),
        ];
        for (name, m, (ttft, tpot, e2e, good)) in cases {
            let v = judge(&m, &d);
            assert_eq!(
                (v.ttft_ok, v.tpot_ok, v.e2e_ok, v.good),
                (ttft, tpot, e2e, good),
                "{name}"
            );
        }
    }

    #[test]
    fn non_streaming_only_e2e_applies() {
        let mut m = Measurement::without_body(Outcome::Success, Some(200), ms(1000));
        m.tpot = Some(ms(900)); // defined from usage, but not judged
        let v = judge(&m, &Slo::default());
        assert_eq!(
            (v.ttft_ok, v.tpot_ok, v.e2e_ok, v.good),
            (None, None, Some(true), true)
        );
        m.e2e = ms(31_000);
        assert!(!judge(&m, &Slo::default()).good);
    }

    #[test]
    fn unset_slos_and_per_model_overrides() {
        let none = Slo {
            ttft: None,
            tpot: None,
            e2e: None,
            max_stall: None,
            valid_tool_calls: false,
        };
        let m = stream(Outcome::Success, Some(99_000), Some(99_000), 99_000);
        assert!(judge(&m, &none).good);
        let mut t = SloTable::default();
        t.per_model.insert(
            "big".into(),
            Slo {
                ttft: Some(ms(100_000)),
                ..none
            },
        );
        assert!(judge(&m, t.for_model("big")).good);
        assert!(
            !judge(&m, t.for_model("small")).good,
            "falls back to the defaults"
        );
    }

    #[test]
    fn an_invalid_tool_call_is_not_good_unless_switched_off() {
        use crate::agent::{AgentSummary, ToolCallOutcome};
        let mut m = stream(Outcome::Success, Some(100), Some(10), 1_000);
        let with = |o| AgentSummary {
            tool_calls: 1,
            tool_call_outcome: Some(o),
            ..AgentSummary::default()
        };
        let slo = Slo::default();
        assert_eq!(judge(&m, &slo).tool_calls_ok, None);
        m.agent = Some(Box::new(with(ToolCallOutcome::Valid)));
        let v = judge(&m, &slo);
        assert_eq!((v.tool_calls_ok, v.good), (Some(true), true));
        for bad in [
            ToolCallOutcome::InvalidJson,
            ToolCallOutcome::SchemaViolation,
            ToolCallOutcome::UnknownFunction,
        ] {
            m.agent = Some(Box::new(with(bad)));
            let v = judge(&m, &slo);
            assert_eq!((v.tool_calls_ok, v.good), (Some(false), false), "{bad:?}");
            let off = Slo {
                valid_tool_calls: false,
                ..slo
            };
            let v = judge(&m, &off);
            assert_eq!((v.tool_calls_ok, v.good), (None, true), "{bad:?}");
        }
    }

    #[test]
    fn the_stall_slo_judges_the_longest_gap_only_when_set() {
        // (streaming, largest gap between a choice's events in ms, max_stall ms) -> stall_ok
        let cases = [
            (true, Some(900), None, None), // off by default: not judged
            (true, Some(900), Some(1_000), Some(true)), // under the limit
            (true, Some(1_000), Some(1_000), Some(true)), // at it
            (true, Some(1_001), Some(1_000), Some(false)), // over it: not good
            (true, None, Some(1_000), None), // one event: no gap to judge
            (false, Some(5_000), Some(1_000), None), // JSON: nothing streamed
        ];
        for (streaming, gap, max, want) in cases {
            let mut m = stream(Outcome::Success, Some(100), Some(10), 2_000);
            m.streaming = streaming;
            m.itl_max = gap.map(ms);
            let slo = Slo {
                max_stall: max.map(ms),
                ..Slo::default()
            };
            let v = judge(&m, &slo);
            assert_eq!(v.stall_ok, want, "{gap:?} against {max:?}");
            assert_eq!(v.good, want != Some(false), "{gap:?} against {max:?}");
        }
    }
}
