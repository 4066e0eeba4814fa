//! The one measurement driver used by the proxy's metering body and by the load generator's
//! client, so both measure by the definitions of DESIGN.md. Pure: instants and bytes in,
//! a [`Measurement`] out; it never reads a clock.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::body::sse::{SseEvent, SseParser};
use crate::measure::inspect::{inspect_chunk, inspect_response, ChunkInfo, ChunkKind, Usage};
use crate::measure::outcome::{Ending, FinishReason, Outcome};

/// Largest non-streaming JSON body the meter buffers to judge it. A bigger body is passed
/// through untouched and judged by its ending alone (complete => success), without tokens.
pub const MAX_JSON_BODY: usize = 16 << 20;

/// Highest choice index tracked for "every choice got a finish_reason"; larger indices are
/// folded onto it (bounded memory on hostile input).
const MAX_CHOICE_INDEX: u32 = 4095;

/// Everything measured about one request: plain data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measurement {
    pub status: Option<u16>,
    pub streaming: bool,
    pub outcome: Outcome,
    pub finish_reason: Option<FinishReason>,
    /// `t_first_token - t0`. None when no output token arrived (never E2E as a fallback).
    pub ttft: Option<Duration>,
    /// `t_first_chunk - t0`: first data event carrying a `choices` entry (role chunk counts).
    pub ttfc: Option<Duration>,
    /// `(t_last_token - t_first_token) / (output_tokens - 1)`; None for fewer than 2 tokens.
    pub tpot: Option<Duration>,
    /// `t_end - t0`.
    pub e2e: Duration,
    /// Number of ITL gaps (output events after the first).
    pub itl_count: u64,
    pub itl_max: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `completion_tokens` came from the engine's `usage` (exact), not from counting events.
    pub usage_exact: bool,
    /// `t_headers - t0`, when the response head arrived.
    pub ttfb: Option<Duration>,
    /// Output events seen (streams).
    pub output_events: u64,
    /// Every ITL gap in seconds, in order, when [`StreamMeter::keep_gaps`] asked for them
    /// (the proxy keeps them for exact `/stats` ITL percentiles); empty otherwise.
    #[serde(skip)]
    pub itl_gaps: Vec<f32>,
}

impl Measurement {
    /// For a response the proxy answered itself or that never produced a body
    /// (502/504/413/503...).
    pub fn without_body(outcome: Outcome, status: Option<u16>, e2e: Duration) -> Self {
        Self {
            status,
            streaming: false,
            outcome,
            finish_reason: None,
            ttft: None,
            ttfc: None,
            tpot: None,
            e2e,
            itl_count: 0,
            itl_max: None,
            prompt_tokens: None,
            completion_tokens: None,
            usage_exact: false,
            ttfb: None,
            output_events: 0,
            itl_gaps: Vec::new(),
        }
    }
}

/// A growable bit set of choice indices (one word covers n <= 64; no allocation until used).
#[derive(Debug, Default)]
struct ChoiceSet {
    words: Vec<u64>,
}

impl ChoiceSet {
    fn insert(&mut self, index: u32) {
        let i = index.min(MAX_CHOICE_INDEX) as usize;
        let (w, b) = (i / 64, i % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
    }
    fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }
    /// Every index in `self` is in `other`.
    fn subset_of(&self, other: &ChoiceSet) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }
}

/// The request's timeline and stream facts (everything but the parser, so the parser's
/// callback can borrow it).
#[derive(Debug)]
struct Timeline {
    t0: Instant,
    t_headers: Option<Instant>,
    t_first_chunk: Option<Instant>,
    t_first_token: Option<Instant>,
    t_last_token: Option<Instant>,
    output_events: u64,
    counted_tokens: u64,
    itl_count: u64,
    itl_max: Option<Duration>,
    prompt_tokens: Option<u64>,
    usage_completion: Option<u64>,
    done: bool,
    inband_error: bool,
    finish_reason: Option<FinishReason>,
    seen: ChoiceSet,
    finished: ChoiceSet,
    /// Kept gaps (seconds) and how many at most.
    gaps: Vec<f32>,
    gap_cap: usize,
}

impl Timeline {
    fn on_event(&mut self, t: Instant, ev: SseEvent<'_>, on_gap: &mut impl FnMut(Duration)) {
        if ev.event == Some(b"error") {
            self.inband_error = true;
            return;
        }
        let info = inspect_chunk(ev.data);
        match info.kind {
            ChunkKind::Done => self.done = true,
            ChunkKind::Error => self.inband_error = true,
            ChunkKind::Unknown => {}
            ChunkKind::Chunk => self.on_chunk(t, &info, on_gap),
        }
    }

    fn on_chunk(&mut self, t: Instant, info: &ChunkInfo, on_gap: &mut impl FnMut(Duration)) {
        if let Some(u) = info.usage {
            self.on_usage(u);
        }
        if info.choice_count > 0 && self.t_first_chunk.is_none() {
            self.t_first_chunk = Some(t);
        }
        for c in info.choices() {
            self.seen.insert(c.index);
            if let Some(f) = c.finish {
                self.finished.insert(c.index);
                self.finish_reason = Some(f);
            }
        }
        self.counted_tokens += u64::from(info.tokens);
        if info.output {
            self.output_events += 1;
            match self.t_last_token {
                None => self.t_first_token = Some(t),
                Some(last) => {
                    let gap = t.saturating_duration_since(last);
                    self.itl_count += 1;
                    self.itl_max = Some(self.itl_max.map_or(gap, |m| m.max(gap)));
                    if self.gaps.len() < self.gap_cap {
                        self.gaps.push(gap.as_secs_f32());
                    }
                    on_gap(gap);
                }
            }
            self.t_last_token = Some(t);
        }
    }

    /// The last usage seen wins (with continuous usage stats every chunk carries a running one).
    fn on_usage(&mut self, u: Usage) {
        if u.prompt_tokens.is_some() {
            self.prompt_tokens = u.prompt_tokens;
        }
        if u.completion_tokens.is_some() {
            self.usage_completion = u.completion_tokens;
        }
    }

    /// DESIGN.md: success iff every choice got a finish_reason, `[DONE]` arrived, no error.
    fn stream_complete(&self) -> bool {
        self.done && !self.inband_error && !self.finished.is_empty() && self.seen.subset_of(&self.finished)
    }
}

/// Drives one request's measurement. Call [`StreamMeter::finish`] exactly once.
#[derive(Debug)]
pub struct StreamMeter {
    streaming: bool,
    status: Option<u16>,
    parser: SseParser,
    tl: Timeline,
    /// Non-streaming: the JSON body, buffered to be inspected at the end.
    body: Vec<u8>,
    body_overflow: bool,
}

impl StreamMeter {
    pub fn new(t0: Instant, streaming: bool) -> Self {
        Self {
            streaming,
            status: None,
            parser: SseParser::new(),
            tl: Timeline {
                t0,
                t_headers: None,
                t_first_chunk: None,
                t_first_token: None,
                t_last_token: None,
                output_events: 0,
                counted_tokens: 0,
                itl_count: 0,
                itl_max: None,
                prompt_tokens: None,
                usage_completion: None,
                done: false,
                inband_error: false,
                finish_reason: None,
                seen: ChoiceSet::default(),
                finished: ChoiceSet::default(),
                gaps: Vec::new(),
                gap_cap: 0,
            },
            body: Vec::new(),
            body_overflow: false,
        }
    }

    /// Keep up to `cap` ITL gaps in [`Measurement::itl_gaps`]. The log grows by doubling (a
    /// handful of allocations per request, none per event once warm).
    pub fn keep_gaps(mut self, cap: usize) -> Self {
        self.tl.gap_cap = cap;
        self.tl.gaps = Vec::with_capacity(cap.min(256));
        self
    }

    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// The response head arrived at `t` with `status`.
    pub fn on_head(&mut self, t: Instant, status: u16) {
        self.status = Some(status);
        self.tl.t_headers = Some(t);
    }

    fn status_ok(&self) -> bool {
        self.status.is_none_or(|s| (200..300).contains(&s))
    }

    /// Feed a body frame served to the client at `t`. Each ITL gap this frame closes is passed
    /// to `on_gap` (one call per gap, no allocation).
    pub fn on_frame(&mut self, t: Instant, bytes: &[u8], mut on_gap: impl FnMut(Duration)) {
        if !self.status_ok() {
            return; // an error body: the status alone decides the outcome
        }
        if self.streaming {
            let tl = &mut self.tl;
            self.parser.feed(bytes, |ev| tl.on_event(t, ev, &mut on_gap));
        } else if !self.body_overflow {
            if self.body.len() + bytes.len() > MAX_JSON_BODY {
                self.body_overflow = true;
                self.body = Vec::new();
            } else {
                self.body.extend_from_slice(bytes);
            }
        }
    }

    /// The request is over at `t_end` for the reason `ending`.
    pub fn finish(&mut self, t_end: Instant, ending: Ending) -> Measurement {
        let t0 = self.tl.t0;
        let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(t0));
        let e2e = t_end.saturating_duration_since(t0);
        let mut m = Measurement::without_body(Outcome::Truncated, self.status, e2e);
        m.streaming = self.streaming;
        m.ttfb = since(self.tl.t_headers);
        if self.streaming && self.status_ok() {
            let mut noop = |_| {};
            let tl = &mut self.tl;
            self.parser.finish(|ev| tl.on_event(t_end, ev, &mut noop));
        }
        m.outcome = match self.status {
            Some(s) if s >= 500 => Outcome::UpstreamError,
            Some(s) if s >= 400 => Outcome::Rejected,
            _ if self.streaming => self.stream_outcome(ending),
            _ => self.json_outcome(ending, &mut m),
        };
        if self.streaming {
            let tl = &mut self.tl;
            m.finish_reason = tl.finish_reason;
            m.ttft = since(tl.t_first_token);
            m.ttfc = since(tl.t_first_chunk);
            m.itl_count = tl.itl_count;
            m.itl_max = tl.itl_max;
            m.output_events = tl.output_events;
            m.itl_gaps = std::mem::take(&mut tl.gaps);
            m.prompt_tokens = tl.prompt_tokens;
            m.usage_exact = tl.usage_completion.is_some();
            m.completion_tokens = tl.usage_completion.or(Some(tl.counted_tokens));
            m.tpot = match (tl.t_first_token, tl.t_last_token, m.completion_tokens) {
                (Some(first), Some(last), Some(n)) if n >= 2 => {
                    Some(div_duration(last.saturating_duration_since(first), n - 1))
                }
                _ => None,
            };
        }
        m
    }

    fn stream_outcome(&self, ending: Ending) -> Outcome {
        if self.tl.inband_error {
            Outcome::UpstreamError
        } else if self.tl.stream_complete() {
            // The client got the whole stream; how the connection ended after that is moot.
            Outcome::Success
        } else {
            match ending {
                Ending::ClientGone => Outcome::ClientAbort,
                Ending::Timeout => Outcome::Timeout,
                Ending::Complete | Ending::BodyError => Outcome::Truncated,
            }
        }
    }

    fn json_outcome(&mut self, ending: Ending, m: &mut Measurement) -> Outcome {
        match ending {
            Ending::ClientGone => return Outcome::ClientAbort,
            Ending::Timeout => return Outcome::Timeout,
            Ending::BodyError => return Outcome::Truncated,
            Ending::Complete => {}
        }
        if self.body_overflow {
            return Outcome::Success;
        }
        let info = inspect_response(&self.body);
        self.body = Vec::new();
        m.finish_reason = info.finish_reason;
        if let Some(u) = info.usage {
            m.prompt_tokens = u.prompt_tokens;
            m.completion_tokens = u.completion_tokens;
            m.usage_exact = u.completion_tokens.is_some();
        }
        // Non-streaming TPOT: only from usage with a single choice; there is no first-token
        // instant, so it is E2E / completion_tokens (an upper bound including prefill).
        if info.choice_count == 1 {
            if let Some(n) = m.completion_tokens.filter(|n| *n >= 2) {
                m.tpot = Some(div_duration(m.e2e, n));
            }
        }
        if info.error {
            Outcome::UpstreamError
        } else if info.is_complete() {
            Outcome::Success
        } else {
            Outcome::Truncated
        }
    }
}

fn div_duration(d: Duration, n: u64) -> Duration {
    Duration::from_nanos((d.as_nanos() / u128::from(n.max(1))).min(u128::from(u64::MAX)) as u64)
}
