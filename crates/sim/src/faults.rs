//! Faults on demand: parsed from the `x-sim-fault` header or drawn from configured
//! probabilities, so tests and load runs can produce every failure a real engine shows.

use std::str::FromStr;

use serde::Deserialize;

use super::agent::ToolCallKind;
use super::render::Finish;
use super::text::SplitMix;

/// The header that selects faults for one request (comma-separated list).
pub const FAULT_HEADER: &str = "x-sim-fault";

/// Faults applied to one request. Token counts (`K`) count generation steps: with `n > 1`,
/// one step emits one token for each choice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// `status=CODE`: answer CODE with vLLM's error JSON before any stream.
    pub status: Option<u16>,
    /// `error-after=K`: after K steps, vLLM's in-band `{"error": ...}` event, then `[DONE]`.
    pub error_after: Option<u64>,
    /// `truncate-after=K`: after K steps, close the connection mid-body (no `[DONE]`).
    pub truncate_after: Option<u64>,
    /// `stall-first=MS`: extra delay before the first token.
    pub stall_first_ms: Option<u64>,
    /// `stall-every=MS`: extra delay before every later token.
    pub stall_every_ms: Option<u64>,
    /// `no-done`: the stream ends normally (finish_reason, usage) but without `data: [DONE]`.
    pub no_done: bool,
    /// `malformed-after=K`: after K steps, one data line of broken JSON, then the stream
    /// continues normally.
    pub malformed_after: Option<u64>,
    /// `hang`: never answer, not even headers; the request holds no decode slot.
    pub hang: bool,
    /// `coalesce=K`: K tokens of a choice per stream event (the last event may hold fewer).
    pub coalesce: Option<u64>,
    /// `finish=abort|error` (with `finish-after=K`, default 0): after K steps every unfinished
    /// choice ends with that `finish_reason`, as when the engine gives up on a request.
    pub finish: Option<EarlyFinish>,
    /// `tool-call=valid|invalid-json|schema-violation`: each chat choice answers with one
    /// streamed call to the request's tool (see `agent.rs`); needs `tools` in the request.
    pub tool_call: Option<ToolCallKind>,
    /// `reasoning=N`: each chat choice streams N reasoning tokens before its answer.
    pub reasoning: Option<u64>,
}

/// The engine ends a request's choices early with `finish_reason` `abort` or `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EarlyFinish {
    pub reason: EndReason,
    /// Generation steps before the end (tokens per choice delivered first).
    pub after: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Abort,
    Error,
}

impl EndReason {
    pub fn finish(self) -> Finish {
        match self {
            EndReason::Abort => Finish::Abort,
            EndReason::Error => Finish::Error,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid x-sim-fault `{0}`: expected status=CODE, error-after=K, truncate-after=K, stall-first=MS, stall-every=MS, no-done, malformed-after=K, hang, coalesce=K (K >= 1) finish=abort|error [with finish-after=K], tool-call=valid|invalid-json|schema-violation or reasoning=N")]
pub struct FaultParseError(pub String);

impl Faults {
    pub fn is_none(&self) -> bool {
        *self == Faults::default()
    }

    /// Adds `other`'s faults; set values of `other` win.
    pub fn merge(&mut self, other: &Faults) {
        self.status = other.status.or(self.status);
        self.error_after = other.error_after.or(self.error_after);
        self.truncate_after = other.truncate_after.or(self.truncate_after);
        self.stall_first_ms = other.stall_first_ms.or(self.stall_first_ms);
        self.stall_every_ms = other.stall_every_ms.or(self.stall_every_ms);
        self.no_done |= other.no_done;
        self.malformed_after = other.malformed_after.or(self.malformed_after);
        self.hang |= other.hang;
        self.coalesce = other.coalesce.or(self.coalesce);
        self.finish = other.finish.or(self.finish);
        self.tool_call = other.tool_call.or(self.tool_call);
        self.reasoning = other.reasoning.or(self.reasoning);
    }
}

impl FromStr for Faults {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut f = Faults::default();
        let (mut reason, mut finish_after) = (None, None);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || FaultParseError(part.to_string());
            let (key, val) = match part.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (part, None),
            };
            let num = |v: Option<&str>| -> Result<u64, FaultParseError> {
                v.and_then(|v| v.parse::<u64>().ok()).ok_or_else(bad)
            };
            match key {
                "status" => {
                    let code = num(val)?;
                    if !(100..=599).contains(&code) {
                        return Err(bad());
                    }
                    f.status = Some(code as u16);
                }
                "error-after" => f.error_after = Some(num(val)?),
                "truncate-after" => f.truncate_after = Some(num(val)?),
                "stall-first" => f.stall_first_ms = Some(num(val)?),
                "stall-every" => f.stall_every_ms = Some(num(val)?),
                "malformed-after" => f.malformed_after = Some(num(val)?),
                "coalesce" => {
                    let k = num(val)?;
                    if k == 0 {
                        return Err(bad());
                    }
                    f.coalesce = Some(k);
                }
                "finish" => {
                    reason = Some(match val {
                        Some("abort") => EndReason::Abort,
                        Some("error") => EndReason::Error,
                        _ => return Err(bad()),
                    })
                }
                "finish-after" => finish_after = Some(num(val)?),
                "tool-call" => {
                    f.tool_call = Some(val.and_then(ToolCallKind::parse).ok_or_else(bad)?)
                }
                "reasoning" => f.reasoning = Some(num(val)?),
                "no-done" if val.is_none() => f.no_done = true,
                "hang" if val.is_none() => f.hang = true,
                _ => return Err(bad()),
            }
        }
        match (reason, finish_after) {
            (Some(reason), after) => {
                f.finish = Some(EarlyFinish {
                    reason,
                    after: after.unwrap_or(0),
                })
            }
            (None, Some(_)) => return Err(FaultParseError("finish-after without finish".into())),
            (None, None) => {}
        }
        Ok(f)
    }
}

impl TryFrom<String> for Faults {
    type Error = FaultParseError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// One configured fault and the probability that a request gets it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    pub prob: f64,
    #[serde(deserialize_with = "de_faults")]
    pub fault: Faults,
}

fn de_faults<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Faults, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

impl FromStr for FaultRule {
    type Err = FaultParseError;

    /// `PROB:FAULTS`, e.g. `0.05:status=503` (CLI form of a rule).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (p, f) = s
            .split_once(':')
            .ok_or_else(|| FaultParseError(s.to_string()))?;
        let prob: f64 = p
            .trim()
            .parse()
            .map_err(|_| FaultParseError(s.to_string()))?;
        if !(0.0..=1.0).contains(&prob) {
            return Err(FaultParseError(s.to_string()));
        }
        Ok(FaultRule {
            prob,
            fault: f.parse()?,
        })
    }
}

/// Draws configured faults for the request with arrival number `seq`: deterministic for a
/// seed and an arrival order, independent of the request body (load tests repeat bodies).
pub fn draw(rules: &[FaultRule], seed: u64, seq: u64) -> Faults {
    let mut out = Faults::default();
    if rules.is_empty() {
        return out;
    }
    let mut rng = SplitMix::new(seed ^ 0xfa01_7000_0000_0000 ^ seq.wrapping_mul(0x9e37_79b9));
    for rule in rules {
        if rng.next_f64() < rule.prob {
            out.merge(&rule.fault);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_fault() {
        let f: Faults = "status=503, error-after=3,truncate-after=4,stall-first=100,\
                         stall-every=5,no-done,malformed-after=2,hang,coalesce=3,\
                         finish-after=4,finish=error,tool-call=schema-violation,reasoning=5"
            .parse()
            .unwrap();
        assert_eq!(
            f,
            Faults {
                status: Some(503),
                error_after: Some(3),
                truncate_after: Some(4),
                stall_first_ms: Some(100),
                stall_every_ms: Some(5),
                no_done: true,
                malformed_after: Some(2),
                hang: true,
                coalesce: Some(3),
                finish: Some(EarlyFinish {
                    reason: EndReason::Error,
                    after: 4,
                }),
                tool_call: Some(ToolCallKind::SchemaViolation),
                reasoning: Some(5),
            }
        );
        for (spec, kind) in [
            ("tool-call=valid", ToolCallKind::Valid),
            ("tool-call=invalid-json", ToolCallKind::InvalidJson),
        ] {
            assert_eq!(spec.parse::<Faults>().unwrap().tool_call, Some(kind));
        }
        let f: Faults = "finish=abort".parse().unwrap();
        assert_eq!(
            f.finish,
            Some(EarlyFinish {
                reason: EndReason::Abort,
                after: 0
            })
        );
        assert!("".parse::<Faults>().unwrap().is_none());
    }

    #[test]
    fn rejects_bad_specs() {
        for s in [
            "status",
            "status=99",
            "status=abc",
            "error-after",
            "boom",
            "hang=1",
            "no-done=x",
            "coalesce",
            "coalesce=0",
            "coalesce=x",
            "finish",
            "finish=stop",
            "finish=length",
            "finish-after=3",
            "finish-after=x,finish=abort",
            "tool-call",
            "tool-call=maybe",
            "reasoning",
            "reasoning=x",
        ] {
            assert!(s.parse::<Faults>().is_err(), "{s}");
        }
    }

    #[test]
    fn merge_keeps_coalesce_and_finish_of_either_side() {
        let mut a: Faults = "coalesce=2".parse().unwrap();
        a.merge(&"finish=abort,finish-after=1".parse().unwrap());
        assert_eq!(a.coalesce, Some(2));
        assert_eq!(
            a.finish.map(|f| (f.reason, f.after)),
            Some((EndReason::Abort, 1))
        );
        a.merge(&"coalesce=5".parse().unwrap());
        assert_eq!(a.coalesce, Some(5));
    }

    #[test]
    fn rule_from_cli_form() {
        let r: FaultRule = "0.25:truncate-after=2".parse().unwrap();
        assert_eq!(r.prob, 0.25);
        assert_eq!(r.fault.truncate_after, Some(2));
        assert!("2:hang".parse::<FaultRule>().is_err());
        assert!("hang".parse::<FaultRule>().is_err());
    }

    #[test]
    fn draw_follows_probabilities_and_seed() {
        let rules = vec![FaultRule {
            prob: 0.3,
            fault: "status=503".parse().unwrap(),
        }];
        let hits = (0..10_000)
            .filter(|&i| draw(&rules, 7, i).status.is_some())
            .count();
        assert!((2_500..3_500).contains(&hits), "{hits}");
        let a: Vec<_> = (0..100).map(|i| draw(&rules, 7, i)).collect();
        let b: Vec<_> = (0..100).map(|i| draw(&rules, 7, i)).collect();
        assert_eq!(a, b);
        let never = vec![FaultRule {
            prob: 0.0,
            fault: "hang".parse().unwrap(),
        }];
        assert!((0..1000).all(|i| draw(&never, 1, i).is_none()));
    }
}
