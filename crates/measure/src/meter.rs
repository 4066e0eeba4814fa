//! The one measurement driver used by the proxy's metering body and by the load generator's
//! client, so both measure by the definitions of DESIGN.md. Pure: instants and bytes in,
//! a [`Measurement`] out; it never reads a clock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::agent::{response_agent, AgentMeter, AgentSummary, ToolSet};
use crate::engine::{EngineReport, EngineView, TtftSplit};
use crate::engine_timings::TimingsReport;
use crate::inspect::{
    inspect_response_logged, scan_event_to, ChoiceInfo, ChunkInfo, ChunkKind, EventScan,
    RepeatCache, Seen, TokenLog, Usage, TEMPLATE_ROOM,
};
use crate::outcome::{Ending, FinishReason, Outcome};
use crate::sse::{SseEvent, SseParser};
use crate::trace::{LogprobAcc, LogprobSummary, Trace, TraceBounds, TraceBuilder};

/// Largest non-streaming JSON body the meter buffers to judge it. A bigger body is passed
/// through untouched and judged by its ending alone (complete => success), without tokens.
pub const MAX_JSON_BODY: usize = 16 << 20;

/// A gap between output events longer than this is a stall, unless set otherwise
/// ([`StreamMeter::stall_threshold`]; the proxy's `measure.stall_ms`).
pub const DEFAULT_STALL: Duration = Duration::from_secs(1);

/// Highest choice index timed on its own; larger indices are folded onto it (bounded memory on
/// hostile input: at most this many small per-choice timelines per request).
const MAX_CHOICE_INDEX: u32 = 4095;

/// Everything measured about one request: plain data, and the measured part of the stored
/// record ([`crate::record::RequestRecord`] embeds it whole). The serde names are the record's
/// JSON keys (and, flattened, the ClickHouse columns): durations are seconds (`*_s`); fields
/// marked `skip` feed metrics only and are not stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    #[serde(rename = "stream")]
    pub streaming: bool,
    pub status: Option<u16>,
    pub outcome: Outcome,
    /// The finish reason label: the last one seen, except that a choice the engine gave up on
    /// (`abort`, `error`) names the request.
    pub finish_reason: Option<FinishReason>,
    /// `t_first_token - t0`: the first output event of any choice. None when no output token
    /// arrived (never E2E as a fallback).
    #[serde(rename = "ttft_s", with = "crate::seconds::opt")]
    pub ttft: Option<Duration>,
    /// `t_first_chunk - t0`: first data event carrying a `choices` entry (role chunk counts).
    #[serde(rename = "ttfc_s", with = "crate::seconds::opt")]
    pub ttfc: Option<Duration>,
    /// TPOT as the SLO judges it: the request's one choice's TPOT; with several choices the
    /// largest of theirs (the SLO holds when every choice's holds). None when undefined.
    #[serde(rename = "tpot_s", with = "crate::seconds::opt")]
    pub tpot: Option<Duration>,
    /// With several choices, every choice's defined TPOT (one histogram observation each, as
    /// vLLM records one per child request); empty (and absent from the JSON) with one choice.
    #[serde(
        rename = "choice_tpot_s",
        with = "crate::seconds::list",
        default,
        skip_serializing_if = "<[Duration]>::is_empty"
    )]
    pub choice_tpots: Box<[Duration]>,
    /// `t_end - t0`.
    #[serde(rename = "e2e_s", with = "crate::seconds::one")]
    pub e2e: Duration,
    /// Number of ITL gaps (output events after the first, per choice).
    pub itl_count: u64,
    #[serde(rename = "itl_max_s", with = "crate::seconds::opt")]
    pub itl_max: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `completion_tokens` came from the engine's `usage` (exact), not from counting events
    /// (a lower bound when the engine packs several tokens into one event).
    pub tokens_exact: bool,
    /// The proxy injected `stream_options.include_usage` into the request...
    pub usage_injected: bool,
    /// ...and removed the usage chunk again (false when the stripper gave up at its memory
    /// bound and the client's stream passed unchanged, usage chunk included).
    pub usage_stripped: bool,
    /// What the engine reported of the request itself (its queue, TTFT, decode, mean ITL,
    /// cached prompt tokens) and where the client's TTFT went (proxy + engine queue + engine
    /// prefill + rest), when it reported anything, and the stream's stalls (gaps between output
    /// events, any choice, longer than `measure.stall_ms`; SSE comments and chunks without
    /// output are no events, so they never end a gap); see [`Measurement::engine_view`].
    #[serde(flatten, default)]
    pub engine: Option<Box<EngineReport>>,
    /// Reasoning and tool-call phases and validity, when the response carried reasoning or a
    /// tool call (boxed: most records have none, and the ring keeps 100,000 records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Box<AgentSummary>>,
    /// The logprob summary (min, mean, largest drop, minimum inside tool-call arguments), when
    /// the response carried logprobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Box<LogprobSummary>>,
    /// The token-level trace of a traced stream ([`StreamMeter::trace`]). On the record the
    /// sinks get; the `/stats` ring keeps it beside the record instead, under its own bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Arc<Trace>>,
    /// `t_headers - t0`, when the response head arrived.
    #[serde(skip)]
    pub ttfb: Option<Duration>,
    /// Output events seen (streams).
    #[serde(skip)]
    pub output_events: u64,
    /// Choice indices seen (streams).
    #[serde(skip)]
    pub choices: u32,
    /// SSE lines or events the parser dropped (over its line limit): an engine misbehaving.
    #[serde(skip)]
    pub sse_discarded: u64,
    /// Every ITL gap in seconds, in order, when [`StreamMeter::keep_gaps`] asked for them
    /// (the proxy keeps them beside the record for exact `/stats` ITL percentiles); empty
    /// otherwise.
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
            choice_tpots: Box::default(),
            e2e,
            itl_count: 0,
            itl_max: None,
            prompt_tokens: None,
            completion_tokens: None,
            tokens_exact: false,
            ttfb: None,
            output_events: 0,
            choices: 0,
            sse_discarded: 0,
            usage_injected: false,
            usage_stripped: false,
            engine: None,
            itl_gaps: Vec::new(),
            agent: None,
            logprobs: None,
            trace: None,
        }
    }

    /// What the engine reported (empty when nothing).
    pub fn engine_view(&self) -> EngineView {
        self.engine.as_ref().map(|e| e.view).unwrap_or_default()
    }

    /// Where TTFT went (all `None` when it could not be split).
    pub fn ttft_split(&self) -> TtftSplit {
        self.engine.as_ref().map(|e| e.split).unwrap_or_default()
    }

    /// The stream's stalls.
    pub fn stalls(&self) -> u32 {
        self.engine.as_ref().map_or(0, |e| e.stalls)
    }

    /// Keeps what the engine reported, the split it allows and the stalls (nothing boxed when
    /// the engine said nothing and the stream never stalled).
    pub fn set_engine(&mut self, view: EngineView, split: TtftSplit, stalls: u32) {
        self.engine = (!view.is_empty() || stalls > 0).then(|| {
            Box::new(EngineReport {
                view,
                split,
                stalls,
            })
        });
    }

    /// The TPOT histogram's observations: one per choice with a defined TPOT.
    pub fn tpot_observations(&self) -> impl Iterator<Item = Duration> + '_ {
        let single = self.choice_tpots.is_empty().then_some(self.tpot).flatten();
        single.into_iter().chain(self.choice_tpots.iter().copied())
    }
}

/// One choice's own timeline (DESIGN.md: TPOT and ITL are per choice).
#[derive(Debug, Clone, Copy, Default)]
struct ChoiceTimeline {
    seen: bool,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Output events of this choice.
    events: u64,
    /// Its tokens, the sum over its chunks of [`event_tokens`].
    tokens: u64,
    /// The engine's running count of this choice's tokens, from continuous usage (the last
    /// chunk of this choice that carried `usage`).
    running: Option<u64>,
    finish: Option<FinishReason>,
}

impl ChoiceTimeline {
    /// Takes in an output event of this choice at `t`; returns the gap since the choice's
    /// previous output event. That is `stream_gap` when the previous one was the stream's last
    /// output event (`last_token`): one subtraction serves every gap of a one-choice stream.
    #[inline]
    fn on_output(
        &mut self,
        t: Instant,
        last_token: Option<Instant>,
        stream_gap: Option<Duration>,
    ) -> Option<Duration> {
        self.events += 1;
        let gap = match self.last {
            Some(last) if Some(last) == last_token => stream_gap,
            last => last.map(|last| gap(last, t)),
        };
        if self.first.is_none() {
            self.first = Some(t);
        }
        self.last = Some(t);
        gap
    }

    /// `(last - first) / (tokens - 1)`; undefined below 2 tokens or when all the output came
    /// in one event (a packed event tells nothing about the time per token).
    fn tpot(&self, tokens: u64) -> Option<Duration> {
        match (self.first, self.last) {
            (Some(first), Some(last)) if tokens >= 2 && self.events >= 2 => Some(div_duration(
                last.saturating_duration_since(first),
                tokens - 1,
            )),
            _ => None,
        }
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
    /// The counts of llama.cpp's `timings` (exact; usage's win when both came).
    timings_prompt: Option<u64>,
    timings_completion: Option<u64>,
    done: bool,
    inband_error: bool,
    finish_reason: Option<FinishReason>,
    /// Choice 0 inline (no allocation for `n = 1`), the others by index.
    choice0: ChoiceTimeline,
    more: Vec<ChoiceTimeline>,
    /// Gaps between the stream's output events over `stall`.
    stalls: u32,
    stall: Duration,
    /// What the engine reported (the last report of each field wins).
    engine: EngineView,
    /// Kept gaps (seconds) and how many at most.
    gaps: Vec<f32>,
    gap_cap: usize,
    agent: AgentMeter,
    /// What the scanner notes per token (reused: no allocation per event once warm).
    log: TokenLog,
    logprobs: LogprobAcc,
    trace: Option<TraceBuilder>,
    /// The fast paths are taken: the repeat cache, and the usage strip's reuse of the scan that
    /// judged a held finish chunk. Off, every event is framed by the parser and scanned (once
    /// more when a held chunk is released): the reference the differential tests hold the
    /// fast paths to.
    repeat_on: bool,
    /// Events framed and judged by the template in one look (`Timeline::on_repeats_at`).
    one_look: u64,
    /// Events framed and read by a shape (`Timeline::look_framed`).
    shape_framed: u64,
}

impl Timeline {
    fn new(t0: Instant) -> Self {
        Self {
            agent: AgentMeter::new(t0),
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
            timings_prompt: None,
            timings_completion: None,
            done: false,
            inband_error: false,
            finish_reason: None,
            choice0: ChoiceTimeline::default(),
            more: Vec::new(),
            stalls: 0,
            stall: DEFAULT_STALL,
            engine: EngineView::default(),
            gaps: Vec::new(),
            gap_cap: 0,
            log: TokenLog::default(),
            logprobs: LogprobAcc::default(),
            trace: None,
            repeat_on: true,
            one_look: 0,
            shape_framed: 0,
        }
    }

    #[inline]
    fn choice(&mut self, index: u32) -> &mut ChoiceTimeline {
        if index == 0 {
            return &mut self.choice0;
        }
        self.more_choice(index)
    }

    #[inline(never)]
    fn more_choice(&mut self, index: u32) -> &mut ChoiceTimeline {
        let i = index.clamp(1, MAX_CHOICE_INDEX) as usize;
        if self.more.len() < i {
            self.more.resize(i, ChoiceTimeline::default());
        }
        &mut self.more[i - 1]
    }

    fn all_choices(&self) -> impl Iterator<Item = &ChoiceTimeline> {
        std::iter::once(&self.choice0)
            .chain(self.more.iter())
            .filter(|c| c.seen)
    }

    /// An event the parser completed. `missed`: the template is known not to answer it
    /// (see [`Timeline::look`]); `scan`: the caller's [`EventScan::unknown`].
    fn on_event(
        &mut self,
        repeat: &mut RepeatCache,
        t: Instant,
        ev: SseEvent<'_>,
        missed: bool,
        scan: &mut EventScan,
        on_gap: &mut impl FnMut(Duration),
    ) {
        if ev.event == Some(b"error") {
            self.inband_error = true;
            return;
        }
        if self.done_at_once(ev.data) {
            return;
        }
        self.look(repeat, ev.data, missed, scan);
        self.on_info(t, &scan.info, ev.data, on_gap);
    }

    /// The fast paths take a `[DONE]` payload in as a scan's answer (`ChunkKind::Done`) would
    /// be taken in, without the scan (which finds no plain prefix, shape or template in it:
    /// nothing is kept from it). `false`: any other payload, or the reference configuration.
    #[inline]
    fn done_at_once(&mut self, data: &[u8]) -> bool {
        if !(self.repeat_on && data == b"[DONE]") {
            return false;
        }
        self.done = true;
        if !self.log.is_empty() {
            self.log.clear();
        }
        true
    }

    /// What an event's payload says: the template's answer when it repeats it, else a scan's
    /// (which notes the event's tokens in `self.log` and may become the template), with the
    /// ranges of its `system_fingerprint` and `timings` values, what the usage strip moves
    /// from the injected usage chunk back to the finish chunk (scans only; a repeat finishes
    /// nothing and carries no usage, so the usage strip never needs them). Written into
    /// `scan`, the caller's [`EventScan::unknown`]: the answer is about half a kilobyte, not
    /// moved on its way back.
    /// `missed`: the caller knows `data` does not repeat the template (the template's own
    /// check failed on the event's bytes), so it is not tried again.
    fn look(&mut self, repeat: &mut RepeatCache, data: &[u8], missed: bool, scan: &mut EventScan) {
        let repeated = if missed {
            None
        } else {
            self.repeated(repeat, data)
        };
        if let Some((info, _)) = repeated {
            scan.info = info; // `EventScan::of_info(info)`: the rest is as `unknown` made it
            return;
        }
        // The fast paths read past a plain prefix seen before; the reference reads it all.
        if self.cacheable() {
            repeat.scan_logged_to(data, &mut self.log, scan);
        } else {
            scan_event_to(data, 0, Some(&mut self.log), scan);
        }
        // A template must log nothing (no logprobs, no tool calls): its repeats skip the
        // log, so they must have nothing to log.
        if self.log.is_empty() && self.cacheable() {
            repeat.learn_scanned(data, scan);
        }
    }

    /// [`Timeline::look`] of the event at `buf`'s start (an event's start the template
    /// missed) when a shape frames and reads it ([`RepeatCache::scan_framed`]): one pass over
    /// its bytes, not the parser's search for its line end and then the shape's compare.
    /// Returns its length and its payload's range in `buf`; `scan` (the caller's
    /// [`EventScan::unknown`]) untouched on `None`.
    #[inline]
    fn look_framed(
        &mut self,
        repeat: &mut RepeatCache,
        buf: &[u8],
        scan: &mut EventScan,
    ) -> Option<(usize, std::ops::Range<usize>)> {
        if !self.cacheable() {
            return None;
        }
        let (len, data) = repeat.scan_framed(buf, &mut self.log, scan)?;
        // As `look` does after a scan (a shape's answer logs nothing).
        if self.log.is_empty() {
            repeat.learn_scanned(buf.get(data.clone()).unwrap_or_default(), scan);
        }
        self.shape_framed += 1;
        Some((len, data))
    }

    /// The events at `buf`'s start that repeat the template, each framed and checked in one
    /// look (`RepeatCache::repeats_event`; the parser is at an event's start) and measured as
    /// [`Timeline::on_event`] measures it. Returns how many bytes they span (0: `buf` does not
    /// open with a repeat).
    ///
    /// A run of them in one frame shares the frame's instant: after the first, a repeat of a
    /// one-choice output template adds one zero gap and nothing else that depends on the
    /// event, so the run is counted first and taken in at once
    /// ([`Timeline::on_single_output_again`]). An engine packs events into one read whenever
    /// it writes faster than the proxy reads (under load, or a fast decoder).
    fn on_repeats_at(
        &mut self,
        repeat: &mut RepeatCache,
        t: Instant,
        buf: &[u8],
        on_gap: &mut impl FnMut(Duration),
    ) -> usize {
        let Some((mut at, data)) = repeat.repeats_event(buf) else {
            return 0;
        };
        // A one-choice output template (most streams): the event as `on_repeat` takes it in,
        // then the rest of the run, if the frame holds more (an engine that paces its tokens
        // sends one event a frame: then there is nothing after it to count).
        let log_empty = self.log.is_empty();
        if let Some(c) = repeat.single().copied().filter(|c| c.output && log_empty) {
            self.one_look += 1;
            self.on_single_output(t, &c, None, on_gap);
            if at < buf.len() {
                let (again, len) = repeat.repeats_in_a_row(&buf[at..]);
                at += len;
                if again > 0 {
                    self.one_look += again;
                    self.on_single_output_again(t, &c, again, on_gap);
                }
            }
            return at;
        }
        self.on_repeat(t, repeat, &buf[data], on_gap);
        match repeat.single().copied() {
            Some(c) if c.output && self.log.is_empty() => {
                let (again, len) = repeat.repeats_in_a_row(&buf[at..]);
                at += len;
                if again > 0 {
                    self.one_look += again;
                    self.on_single_output_again(t, &c, again, on_gap);
                }
            }
            None if self.log.is_empty() && repeat.single_counted().is_some_and(|c| c.output) => {
                // Continuous usage: each repeat has counts of its own, read as it is framed
                // (by the run, else one at a time: an event the run leaves, `\r\n`-ended).
                let c = repeat.single_counted().copied();
                loop {
                    at += repeat.counted_run(&buf[at..], |info| {
                        if let (Some(c), Some(u)) = (&c, &info.usage) {
                            self.one_look += 1;
                            self.on_counted_again(t, c, u, on_gap);
                        }
                    });
                    let Some((len, _)) = repeat.repeats_event(&buf[at..]) else {
                        break;
                    };
                    at += len;
                    if let (Some(c), Some(u)) = (&c, &repeat.info().usage) {
                        self.one_look += 1;
                        self.on_counted_again(t, c, u, on_gap);
                    }
                }
            }
            _ => {
                while let Some((len, data)) = repeat.repeats_event(&buf[at..]) {
                    let data = &buf[at + data.start..at + data.end];
                    self.on_repeat(t, repeat, data, on_gap);
                    at += len;
                }
            }
        }
        at
    }

    /// One more event like the one [`Timeline::on_single_counted`] just took in at `t` (the
    /// same choice `c`, at the same instant) but with counts `u` of its own, as
    /// [`Timeline::on_single_counted`] would take it: its usage as that one's, and, as
    /// [`Timeline::on_single_output`] takes an event of the choice of the stream's last output
    /// event at that event's instant, one zero gap of the choice and of the stream (so no
    /// stall) and its tokens by its running count. `meter/repeat_differential.rs` holds it to
    /// the parser's path.
    #[inline]
    fn on_counted_again(
        &mut self,
        t: Instant,
        c: &ChoiceInfo,
        u: &Usage,
        on_gap: &mut impl FnMut(Duration),
    ) {
        let running = u.completion_tokens;
        self.on_usage(u, running.is_none());
        let ch = self.choice(c.index);
        let tokens = event_tokens(running, ch.running, c.tokens);
        ch.running = running.or(ch.running);
        ch.tokens = ch.tokens.saturating_add(tokens);
        ch.events += 1;
        self.counted_tokens = self.counted_tokens.saturating_add(tokens);
        self.output_events += 1;
        self.on_itl(Duration::ZERO, on_gap);
        self.agent.on_phases(t, c.phases);
    }

    /// An event (payload `data`) that repeats `repeat`'s template, framed by it: what the
    /// template said goes into the timeline, as [`Timeline::on_info`] takes it in; a template
    /// of one choice with output and nothing else says only that
    /// ([`Timeline::on_single_output`]).
    #[inline]
    fn on_repeat(
        &mut self,
        t: Instant,
        repeat: &RepeatCache,
        data: &[u8],
        on_gap: &mut impl FnMut(Duration),
    ) {
        self.one_look += 1;
        if self.log.is_empty() {
            if let Some(c) = repeat.single().filter(|c| c.output) {
                return self.on_single_output(t, c, None, on_gap);
            }
            if let (Some(c), Some(u)) = (repeat.single_counted(), &repeat.info().usage) {
                if c.output {
                    return self.on_single_counted(t, c, u, on_gap);
                }
            }
        }
        self.on_info(t, repeat.info(), data, on_gap);
    }

    /// [`Timeline::on_info`] for a chunk whose one choice `c` carries output and whose only
    /// other content is `usage` (no finish reason, timings or logged tokens): a repeat of a
    /// one-choice template with counts (continuous usage). `u` on a chunk of one choice is
    /// that choice's running count, as [`Timeline::on_chunk`] reads it; the rest is
    /// [`Timeline::on_single_output`]. `meter/repeat_differential.rs` holds it to the
    /// scanning path.
    #[inline]
    fn on_single_counted(
        &mut self,
        t: Instant,
        c: &ChoiceInfo,
        u: &Usage,
        on_gap: &mut impl FnMut(Duration),
    ) {
        let running = u.completion_tokens;
        self.on_usage(u, running.is_none());
        self.on_single_output(t, c, running, on_gap);
    }

    /// [`Timeline::on_info`] for a chunk whose one choice `c` carries output and that carries
    /// nothing else (no finish reason, usage, timings or logged tokens): a repeat of a
    /// one-choice template. Without the loop over choices and the checks that cannot fire
    /// for it; `meter/repeat_differential.rs` holds it to the scanning path.
    /// `running`: the choice's running count the chunk's usage says
    /// ([`Timeline::on_single_counted`]); without usage there is none, and the event's tokens
    /// are the scanned ones.
    // Always inlined: a repeat without usage passes `running` as the constant `None`, which
    // folds the count's arithmetic away, and the call was a fifth of its cost.
    #[inline(always)]
    fn on_single_output(
        &mut self,
        t: Instant,
        c: &ChoiceInfo,
        running: Option<u64>,
        on_gap: &mut impl FnMut(Duration),
    ) {
        if self.t_first_chunk.is_none() {
            self.t_first_chunk = Some(t);
        }
        let last_token = self.t_last_token;
        let stream_gap = last_token.map(|last| gap(last, t));
        let ch = self.choice(c.index);
        ch.seen = true;
        let tokens = event_tokens(running, ch.running, c.tokens);
        ch.running = running.or(ch.running);
        // Saturating, as everywhere a running count (any u64 an engine sends) may have led.
        ch.tokens = ch.tokens.saturating_add(tokens);
        if let Some(gap) = ch.on_output(t, last_token, stream_gap) {
            self.on_itl(gap, on_gap);
        }
        self.counted_tokens = self.counted_tokens.saturating_add(tokens);
        self.output_events += 1;
        if self.t_first_token.is_none() {
            self.t_first_token = Some(t);
        }
        if let Some(gap) = stream_gap {
            self.stalls = self.stalls.saturating_add(u32::from(gap > self.stall));
        }
        self.t_last_token = Some(t);
        self.agent.on_phases(t, c.phases);
    }

    /// `n` more events like the one [`Timeline::on_single_output`] just took in at `t` (the
    /// same choice `c`, at the same instant), as `n` more calls of it would take them: each
    /// closes a zero gap of its choice and of the stream (so no stall, and the largest gap
    /// stays), counts as an output event with `c`'s tokens, and shows the agent meter its
    /// phases. `meter/repeat_differential.rs` and `meter/strip_tests.rs` hold it to the
    /// parser's path, gap by gap.
    #[inline(never)]
    fn on_single_output_again(
        &mut self,
        t: Instant,
        c: &ChoiceInfo,
        n: u64,
        on_gap: &mut impl FnMut(Duration),
    ) {
        let tokens = u64::from(c.tokens).saturating_mul(n);
        let ch = self.choice(c.index);
        ch.tokens = ch.tokens.saturating_add(tokens);
        ch.events += n;
        self.counted_tokens = self.counted_tokens.saturating_add(tokens);
        self.output_events += n;
        self.itl_count += n;
        self.itl_max = Some(self.itl_max.unwrap_or(Duration::ZERO));
        let kept = self.gap_cap.saturating_sub(self.gaps.len()).min(n as usize);
        self.gaps.resize(self.gaps.len() + kept, 0.0);
        for _ in 0..n {
            on_gap(Duration::ZERO);
        }
        self.agent.on_phases_n(t, c.phases, n);
    }

    /// One gap between two output events of a choice.
    #[inline]
    fn on_itl(&mut self, gap: Duration, on_gap: &mut impl FnMut(Duration)) {
        self.itl_count += 1;
        self.itl_max = Some(self.itl_max.map_or(gap, |m| m.max(gap)));
        if self.gaps.len() < self.gap_cap {
            self.gaps.push(gap.as_secs_f32());
        }
        on_gap(gap);
    }

    /// What an event's payload `data` said (`info`) goes into the timeline.
    fn on_info(
        &mut self,
        t: Instant,
        info: &ChunkInfo,
        data: &[u8],
        on_gap: &mut impl FnMut(Duration),
    ) {
        match info.kind {
            ChunkKind::Done => self.done = true,
            ChunkKind::Error => self.inband_error = true,
            ChunkKind::Unknown => {}
            ChunkKind::Chunk => {
                self.on_chunk(t, info, on_gap);
                self.agent.on_chunk(t, info, &self.log.calls, data);
                if !self.log.choices.is_empty() {
                    self.on_tokens(t, data);
                }
            }
        }
        if !self.log.is_empty() {
            self.log.clear();
        }
    }

    /// The tokens (logprobs) and, traced, the output choices the scanner noted in one event.
    fn on_tokens(&mut self, t: Instant, data: &[u8]) {
        self.logprobs.add(&self.log);
        if let Some(trace) = &mut self.trace {
            trace.add(t.saturating_duration_since(self.t0), &self.log, data);
        }
    }

    /// The repeat cache's answer, when it may answer (see [`RepeatCache`]): not for a traced
    /// request, whose log notes every event's text.
    fn repeated(&self, repeat: &RepeatCache, data: &[u8]) -> Option<(ChunkInfo, Seen)> {
        if self.cacheable() {
            repeat.repeats(data)
        } else {
            None
        }
    }

    fn cacheable(&self) -> bool {
        self.repeat_on && !self.log.detail
    }

    fn on_chunk(&mut self, t: Instant, info: &ChunkInfo, on_gap: &mut impl FnMut(Duration)) {
        // Continuous usage (vLLM `continuous_usage_stats`, `--enable-force-include-usage`):
        // `usage` on a chunk of one choice is that choice's running count (vLLM counts per
        // choice; its final `"choices":[]` chunk has the request's sum).
        let running = match info.choice_count {
            1 => info.usage.and_then(|u| u.completion_tokens),
            _ => None,
        };
        if let Some(u) = &info.usage {
            self.on_usage(u, running.is_none());
        }
        if let Some(r) = info.timings {
            self.on_timings(r);
        }
        let mut counted: u64 = 0;
        if info.choice_count > 0 && self.t_first_chunk.is_none() {
            self.t_first_chunk = Some(t);
        }
        // The gap since the stream's last output event, taken once: it is also the gap of
        // every choice whose last output event was that one (with one choice, every gap).
        let last_token = self.t_last_token;
        let stream_gap = last_token.filter(|_| info.output).map(|last| gap(last, t));
        for c in info.choices() {
            if let Some(f) = c.finish {
                if !self.finish_reason.is_some_and(FinishReason::engine_gave_up) {
                    self.finish_reason = Some(f);
                }
            }
            let ch = self.choice(c.index);
            ch.seen = true;
            if c.finish.is_some() {
                ch.finish = c.finish;
            }
            let tokens = event_tokens(running, ch.running, c.tokens);
            ch.running = running.or(ch.running);
            // Saturating: a running count is the engine's word, and it may be any u64.
            ch.tokens = ch.tokens.saturating_add(tokens);
            counted = counted.saturating_add(tokens);
            if !c.output {
                continue;
            }
            if let Some(gap) = ch.on_output(t, last_token, stream_gap) {
                self.on_itl(gap, on_gap);
            }
        }
        self.counted_tokens = self.counted_tokens.saturating_add(counted);
        if info.output {
            self.output_events += 1;
            if self.t_first_token.is_none() {
                self.t_first_token = Some(t);
            }
            if let Some(gap) = stream_gap {
                self.stalls = self.stalls.saturating_add(u32::from(gap > self.stall));
            }
            self.t_last_token = Some(t);
        }
    }

    /// The last usage seen wins. `of_request`: its `completion_tokens` counts the request's
    /// tokens; else it is one choice's running count (continuous usage on a chunk of one
    /// choice), kept by that choice ([`Timeline::running_total`]).
    fn on_usage(&mut self, u: &Usage, of_request: bool) {
        self.agent.on_usage(u);
        self.engine.update(&u.engine);
        if u.prompt_tokens.is_some() {
            self.prompt_tokens = u.prompt_tokens;
        }
        if of_request && u.completion_tokens.is_some() {
            self.usage_completion = u.completion_tokens;
        }
    }

    /// The request's tokens from the engine's running counts: their sum over the choices,
    /// when every choice seen had one (a stream that ended before its final usage chunk).
    fn running_total(&self) -> Option<u64> {
        let mut total = None;
        for c in self.all_choices() {
            total = Some(total.unwrap_or(0u64).saturating_add(c.running?));
        }
        total
    }

    /// What a chunk the client never gets (the injected usage chunk) reported: its usage and
    /// llama.cpp's `timings`.
    fn on_reported(&mut self, info: &ChunkInfo) {
        if let Some(u) = &info.usage {
            self.on_usage(u, true); // a `"choices":[]` chunk: the request's usage
        }
        if let Some(r) = info.timings {
            self.on_timings(r);
        }
    }

    /// llama.cpp's `timings`: its view of the request and exact counts.
    fn on_timings(&mut self, r: TimingsReport) {
        self.engine.update(&r.view);
        if r.prompt_tokens.is_some() {
            self.timings_prompt = r.prompt_tokens;
        }
        if r.completion_tokens.is_some() {
            self.timings_completion = r.completion_tokens;
        }
    }

    /// Output tokens by the engine's own count: usage's, else `timings`'.
    fn engine_completion(&self) -> Option<u64> {
        self.usage_completion.or(self.timings_completion)
    }

    /// A choice finished with `abort` or `error`: the engine gave up on it.
    fn engine_gave_up(&self) -> bool {
        self.all_choices()
            .any(|c| c.finish.is_some_and(FinishReason::engine_gave_up))
    }

    /// DESIGN.md: success iff every choice got a finish_reason (not `abort`/`error`, checked
    /// first), `[DONE]` arrived, no error.
    fn stream_complete(&self) -> bool {
        let mut any = false;
        let all = self.all_choices().all(|c| {
            any = true;
            c.finish.is_some()
        });
        self.done && !self.inband_error && any && all
    }

    /// Per-choice TPOTs: with one choice, its tokens are the request's output tokens (usage
    /// when present); with several, each counts its own (the sum of its events' tokens:
    /// continuous usage growth, else logprobs entries, else 1 per event).
    fn tpots(&self, completion_tokens: Option<u64>) -> (Option<Duration>, Box<[Duration]>) {
        let seen = self.all_choices().count();
        if seen <= 1 {
            let tokens = completion_tokens.unwrap_or(self.choice0.tokens);
            let one = self.all_choices().next().and_then(|c| c.tpot(tokens));
            return (one, Box::default());
        }
        let each: Vec<Duration> = self
            .all_choices()
            .filter_map(|c| c.tpot(c.tokens))
            .collect();
        (each.iter().max().copied(), each.into())
    }
}

/// What [`StreamMeter::setup`] sets, each field as its builder does: [`StreamMeter::keep_gaps`],
/// [`StreamMeter::with_tools`], [`StreamMeter::proxy_time`], [`StreamMeter::stall_threshold`],
/// [`StreamMeter::trace`] (when `Some`) and [`StreamMeter::strip_usage`] (when `true`).
#[derive(Debug, Clone)]
pub struct MeterSetup {
    pub keep_gaps: usize,
    pub tools: Option<Arc<ToolSet>>,
    pub proxy_time: Option<Duration>,
    pub stall: Duration,
    pub trace: Option<TraceBounds>,
    pub strip_usage: bool,
}

impl Default for MeterSetup {
    fn default() -> Self {
        Self {
            keep_gaps: 0,
            tools: None,
            proxy_time: None,
            stall: DEFAULT_STALL,
            trace: None,
            strip_usage: false,
        }
    }
}

/// Drives one request's measurement. Call [`StreamMeter::finish`] exactly once.
#[derive(Debug)]
pub struct StreamMeter {
    streaming: bool,
    status: Option<u16>,
    parser: SseParser,
    tl: Timeline,
    /// Events that repeat the last scanned one but for their text are not scanned again
    /// (untraced requests: a trace notes each event's text). Beside the timeline, not in it:
    /// a repeat's answer is read in place while the timeline takes it in.
    repeat: RepeatCache,
    /// Non-streaming: the JSON body, buffered to be inspected at the end.
    body: JsonBody,
    /// When the last frame was served: a final event flushed by `finish` arrived then.
    last_frame: Option<Instant>,
    /// The request's `tools`, to judge tool calls by.
    tools: Option<Arc<ToolSet>>,
    /// The usage strip, when the proxy injected usage ([`StreamMeter::strip_usage`]).
    strip: Option<Box<strip::Strip>>,
    /// `t0` to the request handed to the upstream connection: the proxy's part of the TTFT
    /// split.
    proxy_time: Option<Duration>,
}

impl StreamMeter {
    #[inline]
    pub fn new(t0: Instant, streaming: bool) -> Self {
        let repeat = if streaming {
            // Taken here, not at the first template: the event path allocates nothing.
            RepeatCache::with_capacity(TEMPLATE_ROOM)
        } else {
            RepeatCache::new()
        };
        Self {
            streaming,
            status: None,
            parser: SseParser::new(),
            tl: Timeline::new(t0),
            repeat,
            body: JsonBody::Empty,
            last_frame: None,
            tools: None,
            strip: None,
            proxy_time: None,
        }
    }

    /// Everything of `setup` at once, on the meter where it lives (the builders below take
    /// and return the meter, about a kilobyte, by value: a copy a step unless inlined away).
    pub fn setup(&mut self, setup: MeterSetup) {
        let MeterSetup {
            keep_gaps,
            tools,
            proxy_time,
            stall,
            trace,
            strip_usage,
        } = setup;
        self.set_keep_gaps(keep_gaps);
        self.tools = tools;
        self.proxy_time = proxy_time;
        self.tl.stall = stall;
        if let Some(bounds) = trace {
            self.set_trace(bounds);
        }
        if strip_usage {
            self.set_strip_usage();
        }
    }

    /// The proxy's own time before it handed the request to the upstream connection (the
    /// first part of [`Measurement::ttft_split`]).
    #[inline]
    pub fn proxy_time(mut self, d: Option<Duration>) -> Self {
        self.proxy_time = d;
        self
    }

    /// Gaps between output events longer than `d` count as stalls ([`Measurement::stalls`]).
    #[inline]
    pub fn stall_threshold(mut self, d: Duration) -> Self {
        self.tl.stall = d;
        self
    }

    /// Every event framed by the SSE parser and scanned: no repeat cache, and a held finish
    /// chunk scanned again when released (the reference the differential tests hold the fast
    /// paths to).
    pub fn without_repeat_cache(mut self) -> Self {
        self.tl.repeat_on = false;
        self
    }

    /// Judge tool calls against the request's `tools` (their JSON Schemas).
    #[inline]
    pub fn with_tools(mut self, tools: Option<Arc<ToolSet>>) -> Self {
        self.tools = tools;
        self
    }

    /// Keep up to `cap` ITL gaps in [`Measurement::itl_gaps`]. The log starts with room for
    /// 64 gaps (256 bytes: a held stream keeps no more) and grows by doubling (a handful of
    /// allocations per long request, none per event once warm).
    #[inline]
    pub fn keep_gaps(mut self, cap: usize) -> Self {
        self.set_keep_gaps(cap);
        self
    }

    fn set_keep_gaps(&mut self, cap: usize) {
        self.tl.gap_cap = cap;
        self.tl.gaps = Vec::with_capacity(cap.min(64));
    }

    /// Keep a token-level trace of this stream within `bounds` ([`Measurement::trace`]).
    #[inline]
    pub fn trace(mut self, bounds: TraceBounds) -> Self {
        self.set_trace(bounds);
        self
    }

    fn set_trace(&mut self, bounds: TraceBounds) {
        self.tl.trace = Some(TraceBuilder::new(bounds));
        self.tl.log.detail = true;
    }

    /// The response head arrived at `t` with `status`.
    pub fn on_head(&mut self, t: Instant, status: u16) {
        self.status = Some(status);
        self.tl.t_headers = Some(t);
    }

    #[inline]
    fn status_ok(&self) -> bool {
        self.status.is_none_or(|s| (200..300).contains(&s))
    }

    /// Feed a body frame served to the client at `t`. Each ITL gap this frame closes is passed
    /// to `on_gap` (one call per gap, no allocation).
    pub fn on_frame(&mut self, t: Instant, bytes: &[u8], on_gap: impl FnMut(Duration)) {
        self.frame(t, bytes, None, on_gap);
    }

    /// [`StreamMeter::on_frame`] of a frame the caller holds as [`Bytes`]: a non-streaming
    /// body that comes in one frame is kept by reference count, not copied.
    pub fn on_data(&mut self, t: Instant, data: &Bytes, on_gap: impl FnMut(Duration)) {
        self.frame(t, data, Some(data), on_gap);
    }

    #[inline]
    fn frame(
        &mut self,
        t: Instant,
        bytes: &[u8],
        shared: Option<&Bytes>,
        mut on_gap: impl FnMut(Duration),
    ) {
        if !self.status_ok() {
            return; // an error body: the status alone decides the outcome
        }
        self.last_frame = Some(t);
        if self.streaming {
            self.feed(t, bytes, &mut on_gap);
        } else {
            self.body.push(bytes, shared);
        }
    }

    /// The parser's events into the timeline. Where an event starts, one that repeats the
    /// template is framed by the template itself (`Timeline::on_repeats_at`): the bytes it
    /// spans are what the parser would cut there, and its payload what the parser would hand
    /// over, so the parser is not needed for it (`meter/repeat_differential.rs` splits streams
    /// anywhere and holds this against the parser alone).
    fn feed(&mut self, t: Instant, mut bytes: &[u8], on_gap: &mut impl FnMut(Duration)) {
        let (tl, repeat) = (&mut self.tl, &mut self.repeat);
        if !tl.cacheable() {
            self.parser.feed(bytes, |ev| {
                tl.on_event(repeat, t, ev, false, &mut EventScan::unknown(), on_gap);
            });
            return;
        }
        while !bytes.is_empty() {
            if self.parser.at_event_start() {
                let len = tl.on_repeats_at(repeat, t, bytes, on_gap);
                if len > 0 {
                    bytes = &bytes[len..];
                    continue;
                }
                let took = Self::feed_unrepeated(&mut self.parser, tl, repeat, t, bytes, on_gap);
                bytes = &bytes[took..];
                continue;
            }
            let took = Self::feed_inside(&mut self.parser, tl, repeat, t, bytes, on_gap);
            bytes = &bytes[took..];
        }
    }

    /// `bytes` where the parser is at no event's start: the rest of an event an earlier frame
    /// began, framed by the parser, or the stream's first bytes. There the parser is at no
    /// event's start until a first byte settles its BOM check: settled here, the first event
    /// takes the one-look paths too. Returns the bytes taken. Out of line, as
    /// [`StreamMeter::feed_unrepeated`].
    #[inline(never)]
    fn feed_inside(
        parser: &mut SseParser,
        tl: &mut Timeline,
        repeat: &mut RepeatCache,
        t: Instant,
        bytes: &[u8],
        on_gap: &mut impl FnMut(Duration),
    ) -> usize {
        if parser.past_bom(bytes) {
            return 0; // at an event's start now
        }
        parser.feed_one(bytes, |ev| {
            tl.on_event(repeat, t, ev, false, &mut EventScan::unknown(), on_gap);
        })
    }

    /// The event at `bytes`' start (an event's start) that the template missed: framed and
    /// read by a shape in one pass when one does ([`Timeline::look_framed`]), else by the
    /// parser; returns the bytes taken. Out of line: most events of a stream are repeats, and
    /// their loop stays as small without it.
    #[inline(never)]
    fn feed_unrepeated(
        parser: &mut SseParser,
        tl: &mut Timeline,
        repeat: &mut RepeatCache,
        t: Instant,
        bytes: &[u8],
        on_gap: &mut impl FnMut(Duration),
    ) -> usize {
        if let Some(len) = done_event(bytes) {
            // As `Timeline::on_event` takes the parser's `[DONE]`.
            tl.done_at_once(DONE);
            return len;
        }
        // The template's check failed on `bytes`: see `missed_at`.
        let tried = repeat.template_frames_one_line();
        // What the event is (untouched until a shape or a scan says).
        let mut scan = EventScan::unknown();
        // A shape may frame and read it, without the parser (which stays at an event's
        // start, as it would after this one).
        if let Some((len, data)) = tl.look_framed(repeat, bytes, &mut scan) {
            tl.on_info(t, &scan.info, bytes.get(data).unwrap_or_default(), on_gap);
            return len;
        }
        parser.feed_one(bytes, |ev| {
            let missed = tried && strip::missed_at(bytes, ev.data);
            tl.on_event(repeat, t, ev, missed, &mut scan, on_gap);
        })
    }

    /// Output tokens counted so far (per event: continuous usage growth, logprobs entries,
    /// else one): what the stream has shown, before any final usage.
    pub fn output_tokens(&self) -> u64 {
        self.tl.counted_tokens
    }

    /// Usage reported outside the stream this meter saw (a usage chunk removed
    /// before the client, and so this meter, got it: the request's final usage). The last
    /// usage seen wins.
    pub fn on_usage(&mut self, usage: Usage) {
        self.tl.on_usage(&usage, true);
    }

    /// Output tokens served so far: the engine's running `usage.completion_tokens` when it
    /// sends one, else the tokens of the output events (whichever is more); `None` before the
    /// first output token (the request is still waiting or in prefill).
    #[inline]
    pub fn output_so_far(&self) -> Option<u64> {
        self.tl.t_first_token?;
        Some(
            self.tl
                .usage_completion
                .unwrap_or(0)
                .max(self.tl.counted_tokens),
        )
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
            let (tl, repeat) = (&mut self.tl, &mut self.repeat);
            let t = self.last_frame.unwrap_or(t_end);
            self.parser.finish(|ev| {
                tl.on_event(repeat, t, ev, false, &mut EventScan::unknown(), &mut noop)
            });
        }
        m.outcome = match self.status {
            Some(s) if s >= 500 => Outcome::UpstreamError,
            Some(s) if s >= 400 => Outcome::Rejected,
            _ if self.streaming => self.stream_outcome(ending),
            _ => self.json_outcome(ending, &mut m),
        };
        if self.streaming && self.status_ok() {
            let tl = &mut self.tl;
            m.finish_reason = tl.finish_reason;
            m.ttft = since(tl.t_first_token);
            m.ttfc = since(tl.t_first_chunk);
            m.itl_count = tl.itl_count;
            m.itl_max = tl.itl_max;
            m.output_events = tl.output_events;
            m.itl_gaps = std::mem::take(&mut tl.gaps);
            m.logprobs = tl.logprobs.finish().map(Box::new);
            m.trace = tl.trace.take().map(|t| Arc::new(t.finish()));
            let a = tl.agent.finish(self.tools.as_deref());
            if a.tool_calls > 0 || a.reasoning_tokens.is_some() {
                m.agent = Some(Box::new(a));
            }
            m.prompt_tokens = tl.prompt_tokens.or(tl.timings_prompt);
            let exact = tl.engine_completion().or_else(|| tl.running_total());
            m.tokens_exact = exact.is_some();
            m.completion_tokens = exact.or(Some(tl.counted_tokens));
            m.choices = tl.all_choices().count() as u32;
            m.sse_discarded = self.parser.discarded();
            (m.tpot, m.choice_tpots) = tl.tpots(m.completion_tokens);
            let split = TtftSplit::of(m.ttft, self.proxy_time, &tl.engine);
            m.set_engine(tl.engine, split, tl.stalls);
        }
        if let Some(strip) = &self.strip {
            m.usage_injected = true;
            m.usage_stripped = !strip.gave_up;
        }
        m
    }

    fn stream_outcome(&self, ending: Ending) -> Outcome {
        if self.tl.inband_error || self.tl.engine_gave_up() {
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
        if self.body.overflowed() {
            return Outcome::Success;
        }
        let mut log = TokenLog::default();
        let body = std::mem::take(&mut self.body);
        let info = inspect_response_logged(body.bytes(), &mut log);
        if info.parsed {
            let mut logprobs = LogprobAcc::default();
            logprobs.add(&log);
            m.logprobs = logprobs.finish().map(Box::new);
            let tools = self.tools.as_deref();
            m.agent =
                response_agent(&log.calls, info.usage.as_ref(), body.bytes(), tools).map(Box::new);
        }
        drop(body);
        m.finish_reason = info.finish_reason;
        let mut view = EngineView::default();
        if let Some(u) = info.usage {
            m.prompt_tokens = u.prompt_tokens;
            m.completion_tokens = u.completion_tokens;
            view = u.engine;
        }
        if let Some(r) = info.timings {
            view.update(&r.view);
            m.prompt_tokens = m.prompt_tokens.or(r.prompt_tokens);
            m.completion_tokens = m.completion_tokens.or(r.completion_tokens);
        }
        m.tokens_exact = m.completion_tokens.is_some();
        m.set_engine(view, TtftSplit::default(), 0);
        // No TPOT for JSON: nothing the client saw tells when the first token came, and
        // E2E / tokens would put prefill into the decode series (DESIGN.md).
        if info.error || info.failed_count > 0 {
            Outcome::UpstreamError
        } else if info.is_complete() {
            Outcome::Success
        } else {
            Outcome::Truncated
        }
    }
}

/// The tokens one choice's entry of a chunk carries (DESIGN.md, "tokens of one event"): the
/// growth of the engine's running count for the choice since its previous chunk with usage
/// (continuous usage: exact, however many tokens the engine packed into the event), else
/// `scanned` (its `logprobs` entries, else 1 for an output event). The first running count of
/// a choice has nothing to grow from (an engine that sends usage only on its last chunk looks
/// the same), and a count that went down is no running count of this choice: both fall back.
/// The payload of the stream's end event.
const DONE: &[u8] = b"[DONE]";

/// `buf`, from an event's start, opens with the event `data: [DONE]` and a blank line `\n\n`:
/// its length. Exactly where the SSE parser cuts there, handing over the payload `[DONE]` and
/// no `event:` field (`SseParser::one_line_event`: a `data: ` line, its first line end a `\n`
/// followed by another), and the parser stays at an event's start, as it would after it.
#[inline]
fn done_event(buf: &[u8]) -> Option<usize> {
    const EVENT: &[u8] = b"data: [DONE]\n\n";
    buf.starts_with(EVENT).then_some(EVENT.len())
}

fn event_tokens(running: Option<u64>, before: Option<u64>, scanned: u32) -> u64 {
    match (running, before) {
        (Some(now), Some(before)) if now >= before => now - before,
        _ => u64::from(scanned),
    }
}

/// `t - last`, at least zero. Events of one frame share its instant: their gaps are zero
/// without the clock arithmetic (a call and about fifty instructions a gap).
#[inline(always)]
fn gap(last: Instant, t: Instant) -> Duration {
    if t == last {
        Duration::ZERO
    } else {
        t.saturating_duration_since(last)
    }
}

fn div_duration(d: Duration, n: u64) -> Duration {
    Duration::from_nanos((d.as_nanos() / u128::from(n.max(1))).min(u128::from(u64::MAX)) as u64)
}

mod json_body;
use json_body::JsonBody;
mod strip;

#[cfg(test)]
mod engine_streams;
#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod repeat_differential;
#[cfg(test)]
mod strip_tests;
#[cfg(test)]
mod tokens_tests;
#[cfg(test)]
mod trace_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::capture;

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
            (m.completion_tokens, m.prompt_tokens, m.tokens_exact),
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
        assert_eq!((m.completion_tokens, m.tokens_exact), (Some(11), false));
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
            (
                "finish abort, then [DONE]",
                vec![
                    (100, role()),
                    (200, tok("a")),
                    (300, fin("", "abort")),
                    (300, DONE.into()),
                ],
                Complete,
                UpstreamError,
            ),
            (
                "finish error, then [DONE]",
                vec![
                    (100, role()),
                    (200, tok("a")),
                    (300, fin("", "error")),
                    (300, DONE.into()),
                ],
                Complete,
                UpstreamError,
            ),
            (
                "finish abort, then client gone",
                vec![(100, role()), (200, tok("a")), (300, fin("", "abort"))],
                ClientGone,
                UpstreamError,
            ),
            (
                "finish stop, content_filter, repetition are successes",
                vec![
                    (100, role()),
                    (200, fin("a", "content_filter")),
                    (300, DONE.into()),
                ],
                Complete,
                Success,
            ),
        ];
        for (name, frames, ending, want) in cases {
            let (m, _) = measure(&frames, 500, ending);
            assert_eq!(m.outcome, want, "{name}");
        }
    }

    /// A chunk of choice `i` with `text` and an optional finish reason.
    fn ctok(i: u32, text: &str, finish: Option<&str>) -> String {
        let f = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
        format!(
            r#"data: {{"choices":[{{"index":{i},"delta":{{"content":"{text}"}},"finish_reason":{f}}}]}}"#
        ) + "\n\n"
    }

    #[test]
    fn finish_reason_label_names_a_choice_the_engine_gave_up_on() {
        let frames = vec![
            (100, ctok(0, "a", None)),
            (110, ctok(1, "a", Some("abort"))),
            (120, ctok(0, "b", Some("stop"))),
            (120, DONE.into()),
        ];
        let (m, _) = measure(&frames, 200, Ending::Complete);
        assert_eq!(
            (m.outcome, m.finish_reason),
            (Outcome::UpstreamError, Some(FinishReason::Abort))
        );
    }

    #[test]
    fn several_choices_are_timed_each_on_its_own() {
        // n = 3 interleaved: each choice emits a token every 30 ms, offset by 10 ms; choice 2
        // has two logprobs entries per event (two tokens each).
        let mut frames = vec![(50, role())];
        let lp2 = |text: &str, finish: &str| {
            format!(
                r#"data: {{"choices":[{{"index":2,"delta":{{"content":"{text}"}},"logprobs":{{"content":[{{}},{{}}]}},"finish_reason":{finish}}}]}}"#
            ) + "\n\n"
        };
        for k in 0..5u64 {
            let last = k == 4;
            let f = last.then_some("length");
            frames.push((100 + k * 30, ctok(0, "x", f)));
            frames.push((110 + k * 30, ctok(1, "y", f)));
            frames.push((
                120 + k * 30,
                lp2("zz", if last { "\"length\"" } else { "null" }),
            ));
        }
        frames.push((300, usage(5, 20)));
        frames.push((300, DONE.into()));
        let (m, gaps) = measure(&frames, 320, Ending::Complete);
        assert_eq!(m.outcome, Outcome::Success);
        assert_eq!(m.choices, 3);
        assert_eq!(m.ttft, Some(ms(100)), "first output of any choice");
        // ITL: gaps within each choice (30 ms), never across choices (10 ms).
        assert_eq!(gaps.len(), 12);
        assert!(gaps.iter().all(|g| *g == ms(30)), "{gaps:?}");
        assert_eq!((m.itl_count, m.itl_max), (12, Some(ms(30))));
        // TPOT per choice: 120 ms over 4 tokens-1 for choices 0 and 1, over 9 for choice 2.
        assert_eq!(&*m.choice_tpots, [ms(30), ms(30), ms(120) / 9]);
        assert_eq!(
            m.tpot,
            Some(ms(30)),
            "the largest: the SLO holds when every choice's holds"
        );
        assert_eq!(
            m.tpot_observations().count(),
            3,
            "one observation per choice"
        );
        assert_eq!((m.completion_tokens, m.tokens_exact), (Some(20), true));
    }

    /// The gaps the meter takes (ITL per choice, stalls between the stream's output events)
    /// against a plain model that takes every gap from its own two instants: events of up to
    /// three choices, with and without output, one or two choices an event, at random times.
    mod gap_model {
        use super::*;
        use proptest::prelude::*;

        fn choice(index: u8, output: bool) -> String {
            let content = if output { "x" } else { "" };
            format!(r#"{{"index":{index},"delta":{{"content":"{content}"}},"finish_reason":null}}"#)
        }

        proptest! {
            #[test]
            fn gaps_and_stalls_are_the_models(
                events in proptest::collection::vec(
                    ((0u8..3, any::<bool>()), proptest::option::of((0u8..3, any::<bool>())), 0u64..40),
                    1..40,
                ),
            ) {
                let t0 = Instant::now();
                let stall = ms(15);
                let mut m = StreamMeter::new(t0, true).keep_gaps(1 << 10).stall_threshold(stall);
                m.on_head(t0, 200);
                let (mut last_of, mut last_output) = ([None::<Instant>; 3], None::<Instant>);
                let (mut want_gaps, mut want_stalls) = (Vec::new(), 0u32);
                let mut t = t0;
                let mut got_gaps = Vec::new();
                for ((i, out), second, dt) in events {
                    t += ms(dt);
                    let mut cs = vec![(i, out)];
                    cs.extend(second.filter(|(j, _)| *j != i));
                    let body = cs.iter().map(|&(i, o)| choice(i, o)).collect::<Vec<_>>().join(",");
                    let frame = format!(r#"data: {{"choices":[{body}]}}"#) + "\n\n";
                    m.on_frame(t, frame.as_bytes(), |g| got_gaps.push(g));
                    for &(i, o) in &cs {
                        if o {
                            if let Some(last) = last_of[i as usize] {
                                want_gaps.push(t.saturating_duration_since(last));
                            }
                            last_of[i as usize] = Some(t);
                        }
                    }
                    if cs.iter().any(|c| c.1) {
                        if let Some(last) = last_output {
                            want_stalls += u32::from(t.saturating_duration_since(last) > stall);
                        }
                        last_output = Some(t);
                    }
                }
                let got = m.finish(t, Ending::Complete);
                prop_assert_eq!(&got_gaps, &want_gaps);
                prop_assert_eq!(got.itl_count, want_gaps.len() as u64);
                prop_assert_eq!(got.stalls(), want_stalls);
            }
        }
    }

    #[test]
    fn lines_the_parser_drops_are_counted() {
        let huge = format!("data: {}\n\n", "x".repeat(crate::sse::MAX_LINE_BYTES + 1));
        let mut frames = stream(3, 10, &[]);
        frames.insert(1, (150, huge));
        frames.push((400, DONE.into()));
        let (m, _) = measure(&frames, 500, Ending::Complete);
        assert_eq!((m.sse_discarded, m.outcome), (1, Outcome::Success));
        let (m, _) = measure(&stream(3, 10, &[DONE.into()]), 500, Ending::Complete);
        assert_eq!(m.sse_discarded, 0);
    }

    #[test]
    fn packed_output_in_one_event_has_no_tpot() {
        // The whole answer in one event (usage says 5 tokens): nothing tells the time per token.
        let frames = vec![
            (100, role()),
            (300, fin("hello world", "stop")),
            (300, usage(3, 5)),
            (300, DONE.into()),
        ];
        let (m, _) = measure(&frames, 310, Ending::Complete);
        assert_eq!(
            (m.outcome, m.ttft, m.tpot, m.completion_tokens),
            (Outcome::Success, Some(ms(300)), None, Some(5))
        );
        // Packed events, several of them: usage decides the tokens (exact TPOT).
        let frames = vec![
            (100, role()),
            (300, tok("abc")),
            (340, tok("def")),
            (380, fin("ghi", "stop")),
            (380, usage(3, 9)),
            (380, DONE.into()),
        ];
        let (m, _) = measure(&frames, 400, Ending::Complete);
        assert_eq!(m.tpot, Some(ms(80) / 8));
        assert_eq!(m.output_events, 3);
        // Without usage the event count is a lower bound on tokens (TPOT an upper bound).
        let no_usage: Vec<(u64, String)> = frames
            .iter()
            .filter(|(_, f)| !f.contains("usage"))
            .cloned()
            .collect();
        let (m, _) = measure(&no_usage, 400, Ending::Complete);
        assert_eq!((m.completion_tokens, m.tokens_exact), (Some(3), false));
        assert_eq!(m.tpot, Some(ms(80) / 2));
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
                assert_eq!(
                    (got.completion_tokens, got.ttfc),
                    (None, None),
                    "an error body is not metered"
                );
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
            (m.prompt_tokens, m.completion_tokens, m.tokens_exact),
            (Some(15), Some(8), true)
        );
        assert_eq!(
            (m.ttft, m.ttfc, m.itl_count),
            (None, None, 0),
            "no TTFT/ITL for JSON"
        );
        assert_eq!(
            (m.tpot, m.tpot_observations().count()),
            (None, 0),
            "no TPOT for JSON: E2E / tokens would include prefill"
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
        for reason in ["abort", "error"] {
            let body = format!(
                r#"{{"choices":[{{"index":0,"finish_reason":"stop"}},{{"index":1,"finish_reason":"{reason}"}}],"usage":{{"prompt_tokens":3,"completion_tokens":9}}}}"#
            );
            let m = json(body.as_bytes(), Ending::Complete);
            assert_eq!(
                (m.outcome, m.finish_reason.map(FinishReason::as_str)),
                (Outcome::UpstreamError, Some(reason)),
                "a choice the engine gave up on ({reason})"
            );
        }
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
    fn an_unterminated_last_event_is_timed_by_its_frame() {
        let frames = vec![
            (100, role()),
            (300, tok("a")),
            (
                400,
                r#"data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}"#
                    .to_string(),
            ),
        ];
        let (m, _) = measure(&frames, 900, Ending::Complete);
        assert_eq!(m.outcome, Outcome::Truncated, "no [DONE]");
        assert_eq!((m.itl_max, m.e2e), (Some(ms(100)), ms(900)));
    }

    #[test]
    fn setup_sets_what_the_builders_set() {
        let t0 = Instant::now();
        let bounds = TraceBounds { max_tokens: 7 };
        let built = StreamMeter::new(t0, true)
            .keep_gaps(5)
            .proxy_time(Some(ms(3)))
            .stall_threshold(ms(9))
            .trace(bounds)
            .strip_usage();
        let mut set = StreamMeter::new(t0, true);
        set.setup(MeterSetup {
            keep_gaps: 5,
            tools: None,
            proxy_time: Some(ms(3)),
            stall: ms(9),
            trace: Some(bounds),
            strip_usage: true,
        });
        assert_eq!(format!("{set:?}"), format!("{built:?}"));
        let mut default = StreamMeter::new(t0, true);
        default.setup(MeterSetup::default());
        assert_eq!(
            format!("{default:?}"),
            format!("{:?}", StreamMeter::new(t0, true))
        );
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
