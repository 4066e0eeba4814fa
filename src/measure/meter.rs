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

/// A bit set of choice indices: one inline word covers n <= 64 (no allocation); larger
/// indices spill into a vector, grown once per request.
#[derive(Debug, Default)]
struct ChoiceSet {
    low: u64,
    high: Vec<u64>,
}

impl ChoiceSet {
    fn insert(&mut self, index: u32) {
        let i = index.min(MAX_CHOICE_INDEX) as usize;
        if i < 64 {
            self.low |= 1 << i;
            return;
        }
        let (w, b) = (i / 64 - 1, i % 64);
        if self.high.len() <= w {
            self.high.resize(w + 1, 0);
        }
        self.high[w] |= 1 << b;
    }
    fn is_empty(&self) -> bool {
        self.low == 0 && self.high.iter().all(|w| *w == 0)
    }
    /// Every index in `self` is in `other`.
    fn subset_of(&self, other: &ChoiceSet) -> bool {
        self.low & !other.low == 0
            && self
                .high
                .iter()
                .enumerate()
                .all(|(i, w)| w & !other.high.get(i).copied().unwrap_or(0) == 0)
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
        self.done
            && !self.inband_error
            && !self.finished.is_empty()
            && self.seen.subset_of(&self.finished)
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
            self.parser
                .feed(bytes, |ev| tl.on_event(t, ev, &mut on_gap));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::fixtures::capture;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const ROLE: &str = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
    const DONE: &str = "data: [DONE]\n\n";

    fn tok(text: &str) -> String {
        format!(
            r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}]}}"#
        ) + "\n\n"
    }
    fn fin(text: &str, reason: &str) -> String {
        format!(
            r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":"{reason}"}}]}}"#
        ) + "\n\n"
    }
    fn usage(prompt: u64, completion: u64) -> String {
        format!(
            r#"data: {{"choices":[],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion}}}}}"#
        ) + "\n\n"
    }
    fn role() -> String {
        format!("{ROLE}\n\n")
    }

    /// Feed `(offset ms, frame)` pairs after a 200 head at `head` ms; finish at `end` ms.
    fn measure(frames: &[(u64, String)], end: u64, ending: Ending) -> (Measurement, Vec<Duration>) {
        let t0 = Instant::now();
        let mut m = StreamMeter::new(t0, true);
        m.on_head(t0 + ms(5), 200);
        let mut gaps = Vec::new();
        for (at, f) in frames {
            m.on_frame(t0 + ms(*at), f.as_bytes(), |g| gaps.push(g));
        }
        (m.finish(t0 + ms(end), ending), gaps)
    }

    /// Role at 100 ms, n tokens from 300 ms every `step` ms (last carries finish), then more.
    fn stream(n: u64, step: u64, tail: &[String]) -> Vec<(u64, String)> {
        let mut v = vec![(100, role())];
        for i in 0..n {
            let f = if i + 1 == n {
                fin("x", "length")
            } else {
                tok("x")
            };
            v.push((300 + i * step, f));
        }
        let last = 300 + (n - 1) * step;
        v.extend(tail.iter().map(|t| (last, t.clone())));
        v
    }

    #[test]
    fn ttft_is_the_first_output_token_and_ttfc_the_role_chunk() {
        let (m, _) = measure(&stream(3, 20, &[DONE.into()]), 400, Ending::Complete);
        assert_eq!(m.outcome, Outcome::Success);
        assert_eq!(m.ttfc, Some(ms(100)), "role chunk counts for TTFC");
        assert_eq!(m.ttft, Some(ms(300)), "role chunk does not count for TTFT");
        assert_eq!(m.ttfb, Some(ms(5)));
        assert_eq!(m.e2e, ms(400));
        assert_eq!(m.finish_reason, Some(FinishReason::Length));
    }

    #[test]
    fn no_output_token_means_no_ttft_never_e2e() {
        let frames = vec![(100, role()), (200, fin("", "stop")), (200, DONE.into())];
        let (m, _) = measure(&frames, 250, Ending::Complete);
        assert_eq!(m.outcome, Outcome::Success);
        assert_eq!((m.ttft, m.tpot), (None, None));
        assert_eq!(m.ttfc, Some(ms(100)));
        assert_eq!(m.e2e, ms(250));
    }

    #[test]
    fn tpot_uses_usage_completion_tokens_when_present() {
        // 50 events 20 ms apart: first at 300, last at 1280.
        let (m, _) = measure(
            &stream(50, 20, &[usage(7, 50), DONE.into()]),
            1300,
            Ending::Complete,
        );
        assert_eq!(m.tpot, Some(ms(980) / 49));
        assert_eq!(
            (m.completion_tokens, m.prompt_tokens, m.usage_exact),
            (Some(50), Some(7), true)
        );
        // Usage says more tokens than events (several tokens per event): usage wins.
        let (m, _) = measure(
            &stream(50, 20, &[usage(7, 99), DONE.into()]),
            1300,
            Ending::Complete,
        );
        assert_eq!(m.tpot, Some(ms(980) / 98));
    }

    #[test]
    fn tpot_without_usage_counts_events_or_logprobs_entries() {
        let (m, _) = measure(&stream(11, 10, &[DONE.into()]), 500, Ending::Complete);
        assert_eq!((m.completion_tokens, m.usage_exact), (Some(11), false));
        assert_eq!(m.tpot, Some(ms(100) / 10));
        // Two logprobs entries per event: 2 tokens each.
        let lp = |r: &str| {
            format!(
                r#"data: {{"choices":[{{"index":0,"delta":{{"content":"ab"}},"logprobs":{{"content":[{{"t":1}},{{"t":2}}]}},"finish_reason":{r}}}]}}"#
            ) + "\n\n"
        };
        let frames = vec![
            (100, role()),
            (300, lp("null")),
            (400, lp("\"stop\"")),
            (400, DONE.into()),
        ];
        let (m, _) = measure(&frames, 450, Ending::Complete);
        assert_eq!(m.completion_tokens, Some(4));
        assert_eq!(m.tpot, Some(ms(100) / 3));
    }

    #[test]
    fn tpot_is_undefined_below_two_tokens() {
        let (m, _) = measure(&stream(1, 20, &[DONE.into()]), 400, Ending::Complete);
        assert_eq!(
            (m.ttft, m.tpot, m.completion_tokens),
            (Some(ms(300)), None, Some(1))
        );
        let (m, _) = measure(
            &stream(3, 20, &[usage(1, 1), DONE.into()]),
            400,
            Ending::Complete,
        );
        assert_eq!(m.tpot, None, "usage of 1 token");
    }

    #[test]
    fn itl_reports_every_gap_between_output_events() {
        let frames = vec![
            (100, role()),
            (300, tok("a")),
            (310, tok("b")),
            (350, tok("c") + &tok("d")), // two events in one frame: a zero gap
            (360, fin("e", "stop")),
            (360, DONE.into()),
        ];
        let (m, gaps) = measure(&frames, 400, Ending::Complete);
        assert_eq!(gaps, vec![ms(10), ms(40), ms(0), ms(10)]);
        assert_eq!(
            (m.itl_count, m.itl_max, m.output_events),
            (4, Some(ms(40)), 5)
        );
        assert!(m.itl_gaps.is_empty(), "gaps are kept only on request");
    }

    #[test]
    fn gaps_are_kept_on_request_up_to_the_cap() {
        let t0 = Instant::now();
        let mut meter = StreamMeter::new(t0, true).keep_gaps(2);
        for (i, f) in stream(4, 10, &[DONE.into()]).iter().enumerate() {
            meter.on_frame(t0 + ms(i as u64 * 10), f.1.as_bytes(), |_| {});
        }
        let m = meter.finish(t0 + ms(100), Ending::Complete);
        assert_eq!(m.itl_gaps, vec![0.01, 0.01]);
        assert_eq!(m.itl_count, 3);
    }

    #[test]
    fn stream_outcomes() {
        let err = r#"data: {"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}"#.to_string() + "\n\n";
        let n2 = |finish_both: bool| {
            let c = |i: u32, r: &str| {
                format!(
                    r#"data: {{"choices":[{{"index":{i},"delta":{{"content":"x"}},"finish_reason":{r}}}]}}"#
                ) + "\n\n"
            };
            let mut v = vec![
                (100, c(0, "null")),
                (110, c(1, "null")),
                (120, c(0, "\"length\"")),
            ];
            v.push((130, c(1, if finish_both { "\"length\"" } else { "null" })));
            v.push((130, DONE.to_string()));
            v
        };
        use Ending::*;
        use Outcome::*;
        type Case = (&'static str, Vec<(u64, String)>, Ending, Outcome);
        let cases: Vec<Case> = vec![
            ("complete", stream(3, 10, &[DONE.into()]), Complete, Success),
            (
                "error then [DONE]",
                stream(3, 10, &[err.clone(), DONE.into()]),
                Complete,
                UpstreamError,
            ),
            (
                "error mid-stream",
                vec![
                    (100, role()),
                    (200, tok("a")),
                    (300, err.clone()),
                    (300, DONE.into()),
                ],
                Complete,
                UpstreamError,
            ),
            (
                "event: error",
                stream(3, 10, &["event: error\ndata: {}\n\n".into(), DONE.into()]),
                Complete,
                UpstreamError,
            ),
            (
                "finish without [DONE]",
                stream(3, 10, &[]),
                Complete,
                Truncated,
            ),
            (
                "[DONE] without finish",
                vec![(100, role()), (200, tok("a")), (200, DONE.into())],
                Complete,
                Truncated,
            ),
            ("only [DONE]", vec![(100, DONE.into())], Complete, Truncated),
            ("empty body", vec![], Complete, Truncated),
            ("n=2, one choice unfinished", n2(false), Complete, Truncated),
            ("n=2, both finished", n2(true), Complete, Success),
            (
                "client gone mid-stream",
                vec![(100, role()), (200, tok("a"))],
                ClientGone,
                ClientAbort,
            ),
            (
                "timeout mid-stream",
                vec![(100, role()), (200, tok("a"))],
                Ending::Timeout,
                Outcome::Timeout,
            ),
            (
                "body error mid-stream",
                vec![(100, role()), (200, tok("a"))],
                BodyError,
                Truncated,
            ),
            (
                "client gone after the whole stream",
                stream(3, 10, &[DONE.into()]),
                ClientGone,
                Success,
            ),
            (
                "error, then client gone",
                vec![(100, err.clone())],
                ClientGone,
                UpstreamError,
            ),
            (
                "final event without blank line",
                stream(3, 10, &["data: [DONE]".into()]),
                Complete,
                Success,
            ),
        ];
        for (name, frames, ending, want) in cases {
            let (m, _) = measure(&frames, 500, ending);
            assert_eq!(m.outcome, want, "{name}");
        }
    }

    #[test]
    fn status_decides_before_the_body() {
        for (status, want) in [
            (500, Outcome::UpstreamError),
            (502, Outcome::UpstreamError),
            (503, Outcome::UpstreamError),
            (400, Outcome::Rejected),
            (404, Outcome::Rejected),
            (429, Outcome::Rejected),
        ] {
            for streaming in [true, false] {
                let t0 = Instant::now();
                let mut m = StreamMeter::new(t0, streaming);
                m.on_head(t0 + ms(3), status);
                m.on_frame(t0 + ms(4), br#"{"error":{"message":"x","code":1}}"#, |_| {});
                let got = m.finish(t0 + ms(5), Ending::Complete);
                assert_eq!((got.outcome, got.status), (want, Some(status)), "{status}");
                assert_eq!(got.e2e, ms(5));
            }
        }
    }

    fn json(body: &[u8], ending: Ending) -> Measurement {
        let t0 = Instant::now();
        let mut m = StreamMeter::new(t0, false);
        m.on_head(t0 + ms(100), 200);
        let (a, b) = body.split_at(body.len() / 2);
        m.on_frame(t0 + ms(150), a, |_| panic!("no gaps for JSON"));
        m.on_frame(t0 + ms(160), b, |_| panic!("no gaps for JSON"));
        m.finish(t0 + ms(800), ending)
    }

    #[test]
    fn non_streaming_rules() {
        let ok = capture("nonstream-chat.txt").body;
        let m = json(ok, Ending::Complete);
        assert_eq!(m.outcome, Outcome::Success);
        assert_eq!(
            (m.prompt_tokens, m.completion_tokens, m.usage_exact),
            (Some(15), Some(8), true)
        );
        assert_eq!(
            (m.ttft, m.ttfc, m.itl_count),
            (None, None, 0),
            "no TTFT/ITL for JSON"
        );
        assert_eq!(
            m.tpot,
            Some(ms(800) / 8),
            "single choice: E2E / usage tokens"
        );
        assert_eq!(m.finish_reason, Some(FinishReason::Length));
        assert!(!m.streaming);

        let n2 = br#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":9}}"#;
        let m = json(n2, Ending::Complete);
        assert_eq!(
            (m.outcome, m.tpot, m.completion_tokens),
            (Outcome::Success, None, Some(9))
        );

        let err =
            br#"{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}"#;
        assert_eq!(json(err, Ending::Complete).outcome, Outcome::UpstreamError);
        assert_eq!(
            json(&ok[..ok.len() - 10], Ending::Complete).outcome,
            Outcome::Truncated
        );
        let unfinished = br#"{"choices":[{"index":0,"finish_reason":null}]}"#;
        assert_eq!(
            json(unfinished, Ending::Complete).outcome,
            Outcome::Truncated
        );
        assert_eq!(json(ok, Ending::ClientGone).outcome, Outcome::ClientAbort);
        assert_eq!(json(ok, Ending::Timeout).outcome, Outcome::Timeout);
        assert_eq!(json(ok, Ending::BodyError).outcome, Outcome::Truncated);
    }

    #[test]
    fn without_body() {
        let m = Measurement::without_body(Outcome::Rejected, Some(429), ms(2));
        assert_eq!(
            (m.outcome, m.status, m.e2e, m.ttft),
            (Outcome::Rejected, Some(429), ms(2), None)
        );
    }

    #[test]
    fn real_captures_measure_alike_whatever_the_framing() {
        for (name, outputs, tokens) in [
            ("stream-chat.txt", 16, 16),
            ("stream-chat-usage.txt", 16, 16),
            ("stream-chat-n2.txt", 7, 8),
            ("stream-chat-logprobs.txt", 8, 8),
            ("stream-completions.txt", 16, 16),
            ("stream-completions-logprobs.txt", 4, 4),
            ("stream-chat-stop.txt", 1, 1),
        ] {
            let body = capture(name).body;
            for split in (0..body.len()).step_by(7) {
                let t0 = Instant::now();
                let mut m = StreamMeter::new(t0, true);
                m.on_head(t0, 200);
                m.on_frame(t0 + ms(1), &body[..split], |_| {});
                m.on_frame(t0 + ms(2), &body[split..], |_| {});
                let got = m.finish(t0 + ms(3), Ending::Complete);
                assert_eq!(got.outcome, Outcome::Success, "{name} @{split}");
                assert_eq!(got.output_events, outputs, "{name}");
                assert_eq!(got.completion_tokens, Some(tokens), "{name}");
            }
        }
    }
}

#[cfg(test)]
mod choice_set_tests {
    use super::ChoiceSet;

    #[test]
    fn subset_across_the_inline_word_and_the_spill() {
        let (mut seen, mut finished) = (ChoiceSet::default(), ChoiceSet::default());
        assert!(finished.is_empty());
        for i in [0, 63, 64, 200, 100_000] {
            seen.insert(i);
        }
        for i in [0, 63, 64, 200] {
            finished.insert(i);
            assert!(!seen.subset_of(&finished), "{i}");
        }
        finished.insert(4095); // indices past the cap fold onto it
        assert!(seen.subset_of(&finished));
        assert!(!finished.is_empty());
    }
}
