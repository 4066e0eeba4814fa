//! Token-level views of one stream: the logprob summary every request with
//! logprobs gets on its record, and the full trace a traced request keeps (opt-in per request
//! or sampled, see the proxy's `[trace]`): per output event its offset from `t0`, its text
//! length, its phase and its tokens with logprob and top alternatives.
//!
//! Both are fed from the [`TokenLog`] that the one-pass scanner fills ([`crate::inspect`]):
//! nothing here parses JSON. Bounded: a trace keeps at most [`TraceBounds::max_tokens`]
//! tokens (an event without logprobs counts as one), each token's text at most
//! [`MAX_TEXT_BYTES`] bytes and at most [`MAX_ALTERNATIVES`] alternatives; past the bound the
//! trace counts what it left out (`dropped_tokens`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::inspect::{LoggedChoice, Phases, TokenLog};

/// Bytes of a token's (or alternative's) text kept in a trace (cut at a character boundary).
pub const MAX_TEXT_BYTES: usize = 64;
/// Alternatives kept per token (vLLM serves at most 20 `top_logprobs`).
pub const MAX_ALTERNATIVES: usize = 20;
/// Default of [`TraceBounds::max_tokens`].
pub const DEFAULT_MAX_TOKENS: usize = 4096;

/// The phase an output event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Reasoning,
    Answer,
    /// Tool-call name and argument fragments.
    ToolCall,
}

impl Phase {
    /// One phase for an event's delta: a tool call, else reasoning, else the answer; `None`
    /// for an event whose delta carried no output (vLLM sends the logprobs of tokens its
    /// parsers swallowed, `<think>` say, with `"delta":{}`).
    pub fn of(p: Phases) -> Option<Phase> {
        if p.contains(Phases::TOOL_CALL) {
            Some(Phase::ToolCall)
        } else if p.contains(Phases::REASONING) {
            Some(Phase::Reasoning)
        } else if p.contains(Phases::ANSWER) {
            Some(Phase::Answer)
        } else {
            None
        }
    }
}

/// Bounds of one trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceBounds {
    /// Tokens kept (an event without logprobs counts as one).
    pub max_tokens: usize,
}

impl Default for TraceBounds {
    fn default() -> Self {
        Self {
            max_tokens: DEFAULT_MAX_TOKENS,
        }
    }
}

/// One output event of a traced stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// When the client was served the event, seconds after `t0`.
    pub offset_s: f64,
    pub choice: u32,
    /// `None`: the delta carried no output (only logprobs).
    pub phase: Option<Phase>,
    /// Decoded bytes of the event's text (content, reasoning, or tool-call name and
    /// arguments).
    pub text_len: u32,
    /// Its tokens, when the client asked for logprobs (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TraceToken>,
}

/// One token: its text (bounded), logprob and top alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceToken {
    pub token: Option<Box<str>>,
    pub logprob: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<Alternative>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    pub token: Box<str>,
    pub logprob: Option<f64>,
}

/// A traced request's stream, event by event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub events: Vec<TraceEvent>,
    /// Tokens kept (events without tokens count one).
    pub kept_tokens: u64,
    /// Tokens (or events) left out past [`TraceBounds::max_tokens`].
    pub dropped_tokens: u64,
}

impl Trace {
    /// Every kept token in order, with its event.
    pub fn tokens(&self) -> impl Iterator<Item = (&TraceEvent, &TraceToken)> {
        self.events
            .iter()
            .flat_map(|e| e.tokens.iter().map(move |t| (e, t)))
    }
}

fn bounded(s: String) -> Box<str> {
    let mut s = s;
    if s.len() > MAX_TEXT_BYTES {
        let mut at = MAX_TEXT_BYTES;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s.into_boxed_str()
}

/// Builds one request's trace from the scanner's logs.
#[derive(Debug)]
pub struct TraceBuilder {
    bounds: TraceBounds,
    trace: Trace,
}

impl TraceBuilder {
    pub fn new(bounds: TraceBounds) -> Self {
        Self {
            bounds,
            trace: Trace::default(),
        }
    }

    /// The choices `log` noted for one payload served at `offset` (`payload`: the bytes the
    /// scanner read, which the log's spans point into).
    pub fn add(&mut self, offset: Duration, log: &TokenLog, payload: &[u8]) {
        let mut alts = log.alternatives.iter().peekable();
        for c in &log.choices {
            let weight = (c.tokens.len() as u64).max(1);
            let room = self.bounds.max_tokens as u64 > self.trace.kept_tokens;
            if !room {
                self.trace.dropped_tokens += weight;
                continue;
            }
            let mut ev = event(offset, c);
            for (i, t) in log.tokens_of(c).iter().enumerate() {
                if self.trace.kept_tokens >= self.bounds.max_tokens as u64 {
                    self.trace.dropped_tokens += 1;
                    continue;
                }
                let at = c.tokens.start + i as u32;
                let mut top = Vec::new();
                while let Some(a) = alts.next_if(|a| a.token <= at) {
                    if a.token == at && top.len() < MAX_ALTERNATIVES {
                        top.push(Alternative {
                            token: bounded(a.text.decode(payload)),
                            logprob: a.logprob,
                        });
                    }
                }
                ev.tokens.push(TraceToken {
                    token: t.text.map(|s| bounded(s.decode(payload))),
                    logprob: t.logprob,
                    top,
                });
                self.trace.kept_tokens += 1;
            }
            if c.tokens.is_empty() {
                self.trace.kept_tokens += 1;
            }
            self.trace.events.push(ev);
        }
    }

    pub fn finish(self) -> Trace {
        self.trace
    }
}

fn event(offset: Duration, c: &LoggedChoice) -> TraceEvent {
    TraceEvent {
        offset_s: offset.as_secs_f64(),
        choice: c.index,
        phase: Phase::of(c.phases),
        text_len: c.text_len,
        tokens: Vec::new(),
    }
}

/// What the logprobs of one request say, on its record whenever the stream carried them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogprobSummary {
    /// Tokens with a logprob.
    pub tokens: u64,
    pub mean: f64,
    pub min: f64,
    /// Position of the least likely token (0-based, over the request's tokens in the order
    /// they were served; with `n > 1` the choices interleave).
    pub min_at: u64,
    /// The largest fall from one token's logprob to the next one's (same choice), and the
    /// position of the token it fell to; absent when it never fell.
    pub largest_drop: Option<f64>,
    pub largest_drop_at: Option<u64>,
    /// The least likely token inside tool-call arguments (and names).
    pub tool_call_min: Option<f64>,
}

/// Accumulates a [`LogprobSummary`] token by token: a few operations per token, no memory.
#[derive(Debug, Default)]
pub struct LogprobAcc {
    position: u64,
    tokens: u64,
    sum: f64,
    min: Option<(f64, u64)>,
    prev: Option<(u32, f64)>,
    drop: Option<(f64, u64)>,
    tool_min: Option<f64>,
}

impl LogprobAcc {
    /// The tokens `log` noted for one payload.
    pub fn add(&mut self, log: &TokenLog) {
        for c in &log.choices {
            let tool = c.phases.contains(Phases::TOOL_CALL);
            for t in log.tokens_of(c) {
                let at = self.position;
                self.position += 1;
                let Some(lp) = t.logprob.filter(|v| !v.is_nan()) else {
                    continue;
                };
                self.tokens += 1;
                self.sum += lp;
                if self.min.is_none_or(|(m, _)| lp < m) {
                    self.min = Some((lp, at));
                }
                if let Some((choice, before)) = self.prev {
                    let fall = before - lp;
                    if choice == c.index && fall > 0.0 && self.drop.is_none_or(|(d, _)| fall > d) {
                        self.drop = Some((fall, at));
                    }
                }
                self.prev = Some((c.index, lp));
                if tool {
                    self.tool_min = Some(self.tool_min.map_or(lp, |m| m.min(lp)));
                }
            }
        }
    }

    /// `None` when no token carried a logprob.
    pub fn finish(&self) -> Option<LogprobSummary> {
        let (min, min_at) = self.min?;
        Some(LogprobSummary {
            tokens: self.tokens,
            mean: self.sum / self.tokens as f64,
            min,
            min_at,
            largest_drop: self.drop.map(|d| d.0),
            largest_drop_at: self.drop.map(|d| d.1),
            tool_call_min: self.tool_min,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_bounded_at_a_character_boundary() {
        let long = "é".repeat(100);
        assert_eq!(bounded(long).len(), MAX_TEXT_BYTES);
        let odd = format!("a{}", "é".repeat(100));
        let b = bounded(odd);
        assert!(b.len() <= MAX_TEXT_BYTES && b.len() >= MAX_TEXT_BYTES - 1);
    }
}
