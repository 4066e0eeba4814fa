//! The usage strip, in the meter's own pass over a stream whose usage the proxy injected
//! (`usage::inject_include_usage`): the client gets byte for byte the stream it would have got
//! without injection, and the meter watches exactly those bytes.
//!
//! What injection changes in a vLLM 0.32 stream (fixtures `stream-chat.txt` vs
//! `stream-chat-usage.txt`): one extra `"choices":[]` usage chunk before `[DONE]`, and
//! `"system_fingerprint"` moves from the finish chunk to that usage chunk. So each finish chunk
//! is held back until the next event: when that is the usage chunk, `,"system_fingerprint":<v>`
//! is put back before the finish chunk's closing `}` and the usage chunk is dropped (its usage
//! goes to the timeline: exact token counts); anything else releases the held chunk unchanged.
//!
//! One framing pass per event: where an event starts, one that repeats the meter's template
//! is framed, judged (an ordinary output event: it passes) and metered in one look; any other
//! event is framed by the meter's SSE parser, which hands over the event's own bytes, scanned
//! once for both the meter and the strip's decision. Only a held finish chunk is looked at a
//! second time, when it is released (metered then, as the client gets it then).
//!
//! llama.cpp (`llama-server`) does the same with its `timings` object: on the finish chunk
//! without usage, last on the usage chunk with it (captures `llamacpp-0c1e570/stream-chat.txt`
//! vs `stream-chat-usage.txt`); it goes back before the finish chunk's closing `}` too, where
//! the engine asked directly puts it. The proxy does not inject usage for a replica it knows to
//! be llama.cpp (its `timings` count the tokens exactly); this restores the client's bytes for
//! one it does not know yet. A usage chunk with `timings` but no held finish chunk to take them
//! passes whole: what the engine said is never dropped.
//!
//! What the engine sends of its own accord is never removed: an engine that puts `usage` on
//! chunks with choices (vLLM's `--enable-force-include-usage`, which forces continuous usage;
//! the proxy never injects continuous usage) sends the final usage chunk whatever the request
//! says, so once such a chunk passed, the usage chunk passes too. Comment blocks
//! (`: keep-alive`) that arrive while a finish chunk is held stay behind it, in order: the
//! engine asked directly would have sent the finish chunk (with its fingerprint) before them.
//!
//! Bytes that pass unchanged go out as slices of the upstream frame (no copy). Memory is
//! bounded: when an incomplete event and a held finish chunk together pass
//! [`MAX_LINE_BYTES`], both are released unchanged and the rest of the stream passes as it
//! comes (the usage chunk, if any, reaches the client; the record says so).

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use super::{StreamMeter, Timeline};
use crate::inspect::{ChunkInfo, ChunkKind, EventScan, RepeatCache, TokenLog};
use crate::sse::{SseParser, MAX_LINE_BYTES};

/// What happened to the last complete event (for a `\n` that arrives in the next frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Passed,
    Held,
    Dropped,
}

/// What one block of the stream (an event, or comments that dispatch nothing) is to the strip.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Class {
    /// An ordinary event (or a block without data): it passes, releasing a held chunk.
    Other,
    /// A chunk where some choice finishes, without usage; whether it has a fingerprint.
    Finish { has_fingerprint: bool },
    /// A `choices:[]` chunk with usage: the injected one. Dropped; what it carries back to
    /// the finish chunk (its `system_fingerprint` and `timings`) is in the held chunk already
    /// ([`judge`] rewrote it, reading them from the event's own bytes: no copy of them).
    Usage,
    /// A `choices:[]` chunk with usage and `timings` but no finish chunk held to take them:
    /// it passes whole (what the engine said is never dropped).
    UsagePasses,
}

/// The strip's state (see the module docs); boxed in the meter, which has one only when
/// usage was injected.
#[derive(Debug, Default)]
pub(super) struct Strip {
    /// The bytes of an event not complete yet.
    pub(super) partial: BytesMut,
    /// A finish chunk waiting to see whether the usage chunk follows.
    held: Option<Bytes>,
    held_has_fingerprint: bool,
    /// What the scan that judged the held chunk said, when it logged nothing (no logprobs,
    /// no tool call, untraced): its bytes are metered on release as they are, so that answer
    /// stands and the chunk is not scanned again (the fast paths only: see
    /// [`StreamMeter::without_repeat_cache`]).
    /// Inline (the strip is boxed already): no allocation per finish chunk.
    held_info: Option<ChunkInfo>,
    /// Comment blocks that came while a finish chunk was held: they go out right after it.
    held_comments: BytesMut,
    /// A chunk with choices carried `usage`: the engine reports usage of its own accord, so
    /// its final usage chunk is the client's too and passes.
    engine_usage: bool,
    /// The last event ended on a `\r` at the end of a frame: a leading `\n` shares its fate.
    trailing_cr: Option<Fate>,
    /// The held and incomplete bytes passed [`MAX_LINE_BYTES`]: the rest passes unchanged.
    pub(super) gave_up: bool,
    /// The scan log of the current event while a released held chunk is metered before it.
    spare_log: TokenLog,
    /// The held chunk as the usage chunk rewrote it (then `held` is `None`), released with it:
    /// set and released in one pass over that event.
    rewritten: Option<BytesMut>,
}

/// The output of one frame: one slice of the frame when possible, else pieces (slices of the
/// frame and the few bytes the strip holds or rewrites) appended to the body's queue as they
/// come. Never a copy of the frame: when the engine packs a whole stream into one frame, the
/// part before a held finish chunk stays a slice of it.
struct Out<'q> {
    /// Where the pieces go, in order (appended to, never read).
    queue: &'q mut VecDeque<Bytes>,
    state: Pieces,
}

enum Pieces {
    Empty,
    /// One slice of the frame, not appended yet: the whole frame goes out as it is.
    Range(usize, usize),
    /// Appended to the queue already (each later range a piece of its own).
    Queued,
    /// A held chunk the strip rewrote (its own bytes), not appended yet: a range after it
    /// that fits in its spare room is copied in, so that both go out as one piece (most
    /// often the `[DONE]` event right after the usage chunk: one write to the client less).
    Owned(BytesMut),
}

impl<'q> Out<'q> {
    fn new(queue: &'q mut VecDeque<Bytes>) -> Self {
        Self {
            queue,
            state: Pieces::Empty,
        }
    }

    #[inline(always)]
    fn range(&mut self, frame: &Bytes, a: usize, b: usize) {
        if a == b {
            return;
        }
        match &mut self.state {
            Pieces::Empty => self.state = Pieces::Range(a, b),
            Pieces::Range(x, y) if *y == a => self.state = Pieces::Range(*x, b),
            Pieces::Owned(own) if b - a <= own.capacity() - own.len() => {
                own.extend_from_slice(frame.get(a..b).unwrap_or_default());
            }
            _ => self.piece(frame, frame.slice(a..b)),
        }
    }

    fn piece(&mut self, frame: &Bytes, piece: Bytes) {
        if piece.is_empty() {
            return;
        }
        self.flush(frame);
        self.queue.push_back(piece);
        self.state = Pieces::Queued;
    }

    /// A rewritten held chunk (see [`Pieces::Owned`]).
    fn owned(&mut self, frame: &Bytes, own: BytesMut) {
        self.flush(frame);
        self.state = Pieces::Owned(own);
    }

    /// What is not appended yet is appended (the state is as if it were `Queued`).
    fn flush(&mut self, frame: &Bytes) {
        match std::mem::replace(&mut self.state, Pieces::Queued) {
            Pieces::Range(x, y) => self.queue.push_back(frame.slice(x..y)),
            Pieces::Owned(own) if !own.is_empty() => self.queue.push_back(own.freeze()),
            Pieces::Empty => self.state = Pieces::Empty,
            _ => {}
        }
    }

    /// The frame itself when it passes whole (then nothing was appended), else `None` (its
    /// pieces are in the queue).
    fn finish(mut self, frame: Bytes) -> Option<Bytes> {
        match self.state {
            Pieces::Range(0, b) if b == frame.len() => return Some(frame),
            _ => self.flush(&frame),
        }
        None
    }
}

impl Strip {
    fn extend_held(&mut self, bytes: &[u8]) {
        if !self.held_comments.is_empty() {
            self.held_comments.extend_from_slice(bytes);
        } else if let Some(h) = self.held.take() {
            let mut b = BytesMut::with_capacity(h.len() + bytes.len());
            b.extend_from_slice(&h);
            b.extend_from_slice(bytes);
            self.held = Some(b.freeze());
        }
    }
}

/// The held finish chunk (`held`, or the strip's rewrite of it) and the comments held
/// behind it go out.
fn release(strip: &mut Strip, held: Option<Bytes>, frame: &Bytes, acc: &mut Out<'_>) {
    if let Some(own) = strip.rewritten.take() {
        acc.owned(frame, own);
    }
    if let Some(h) = held {
        acc.piece(frame, h);
    }
    if !strip.held_comments.is_empty() {
        acc.piece(frame, strip.held_comments.split().freeze());
    }
}

/// Meters a held finish chunk as the client gets it (at `t`, when it is released). The
/// current event's scan log, if any, is kept aside meanwhile. Asked for every event: the
/// check is inlined, the work (once or twice a stream) is not.
#[inline]
fn meter_held(
    tl: &mut Timeline,
    repeat: &mut RepeatCache,
    strip: &mut Strip,
    t: Instant,
    on_gap: &mut impl FnMut(Duration),
) {
    if strip.held.is_some() {
        meter_held_now(tl, repeat, strip, t, on_gap);
    }
}

#[inline(never)]
fn meter_held_now(
    tl: &mut Timeline,
    repeat: &mut RepeatCache,
    strip: &mut Strip,
    t: Instant,
    on_gap: &mut impl FnMut(Duration),
) {
    let Some(held) = strip.held.as_ref() else {
        return;
    };
    // An empty log (most events log nothing) needs no keeping aside: metering the held chunk
    // leaves the log empty again.
    let aside = !tl.log.is_empty();
    if aside {
        strip.spare_log.detail = tl.log.detail;
        std::mem::swap(&mut tl.log, &mut strip.spare_log);
    }
    if let Some(info) = &strip.held_info {
        // Its log was empty, so nothing reads its payload: the bytes stand in for it.
        tl.on_info(t, info, held, on_gap);
        strip.held_info = None;
    } else {
        let mut parser = SseParser::new();
        parser.feed(held, |ev| {
            tl.on_event(repeat, t, ev, false, &mut EventScan::unknown(), on_gap);
        });
        parser.finish(|ev| {
            tl.on_event(repeat, t, ev, false, &mut EventScan::unknown(), on_gap);
        });
    }
    if aside {
        std::mem::swap(&mut tl.log, &mut strip.spare_log);
    }
}

/// Spare room of a rewritten finish chunk ([`Pieces::Owned`]): the `[DONE]` event, what
/// follows the usage chunk. Exactly its length: a buffer filled to its capacity becomes
/// [`Bytes`] without an allocation of its own.
const REWRITE_ROOM: usize = b"data: [DONE]\n\n".len();

/// `,"<key>":<value>` for each field, in order, before the last `}` of the event (its JSON
/// object's end); `Err`: the event as it is (no field, or no `}`).
fn insert_fields(event: Bytes, fields: &[(&[u8], Option<&[u8]>)]) -> Result<BytesMut, Bytes> {
    let (Some(at), true) = (
        event.iter().rposition(|b| *b == b'}'),
        fields.iter().any(|(_, v)| v.is_some()),
    ) else {
        return Err(event);
    };
    let extra: usize = fields
        .iter()
        .filter_map(|(k, v)| Some(k.len() + (*v)?.len() + 4))
        .sum();
    let mut out = BytesMut::with_capacity(event.len() + extra + REWRITE_ROOM);
    out.extend_from_slice(&event[..at]);
    for (key, value) in fields {
        if let Some(v) = value {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(key);
            out.extend_from_slice(b"\":");
            out.extend_from_slice(v);
        }
    }
    out.extend_from_slice(&event[at..]);
    Ok(out)
}

impl StreamMeter {
    /// Strip the usage chunk the proxy injected (see the module docs): frames go through
    /// [`StreamMeter::on_upstream_frame`], not [`StreamMeter::on_frame`].
    #[inline]
    pub fn strip_usage(mut self) -> Self {
        self.set_strip_usage();
        self
    }

    pub(super) fn set_strip_usage(&mut self) {
        if self.streaming {
            self.strip = Some(Box::default());
        }
    }

    /// The meter strips injected usage (and so changes the bytes the client gets).
    pub fn strips(&self) -> bool {
        self.strip.is_some()
    }

    /// An upstream frame arrived at `t`: the bytes the client gets for it are appended to
    /// `out` (pieces in order, possibly none), and metered. Without a strip (or for an error
    /// body), the frame passes whole and is metered as [`StreamMeter::on_frame`] does.
    pub fn on_upstream_frame(
        &mut self,
        t: Instant,
        frame: Bytes,
        out: &mut VecDeque<Bytes>,
        on_gap: impl FnMut(Duration),
    ) {
        if let Some(whole) = self.strip_frame(t, frame, out, on_gap) {
            out.push_back(whole);
        }
    }

    /// [`StreamMeter::on_upstream_frame`], except that a frame that passes whole is returned
    /// rather than appended to `out` (and then nothing was appended): most frames, which the
    /// body hands on as they are.
    pub fn strip_frame(
        &mut self,
        t: Instant,
        frame: Bytes,
        out: &mut VecDeque<Bytes>,
        mut on_gap: impl FnMut(Duration),
    ) -> Option<Bytes> {
        let stripping = self.status_ok() && self.strip.as_ref().is_some_and(|s| !s.gave_up);
        if !stripping {
            self.on_frame(t, &frame, on_gap);
            return (!frame.is_empty()).then_some(frame);
        }
        if frame.is_empty() {
            return None; // keeps a pending `\r`: the `\n` of its line end may open the next frame
        }
        self.last_frame = Some(t);
        let on_gap = &mut on_gap;
        let mut acc = Out::new(out);
        let mut start = 0;
        if let Some(strip) = self.strip.as_deref_mut() {
            if let Some(fate) = strip.trailing_cr.take() {
                if frame.first() == Some(&b'\n') {
                    // The parser takes it as the end of the line it already ended.
                    self.parser.feed(&frame[..1], |_| {});
                    start = 1;
                    match fate {
                        Fate::Passed => acc.range(&frame, 0, 1),
                        Fate::Held => strip.extend_held(b"\n"),
                        Fate::Dropped => {}
                    }
                }
            }
        }
        while start < frame.len() {
            // The frame-level look: a run of events that repeat the template, while nothing
            // is held or partial, passes as one range (a frame of only such events: the frame
            // itself, handed on whole).
            let run = self.pass_repeats(t, &frame[start..], on_gap);
            if let Some(run @ 1..) = run {
                if run == frame.len() {
                    // The whole frame (so `start` is 0 and nothing went out) is such a run,
                    // and nothing is held or partial: it passes as it is, now (most frames;
                    // every one of a stream whose engine paces its tokens).
                    return Some(frame);
                }
                acc.range(&frame, start, start + run);
                start += run;
                continue;
            }
            // `Some(0)`: the template was tried here and missed; nothing changed since.
            start = self.strip_next(t, &frame, start, run == Some(0), &mut acc, on_gap);
        }
        let Some(strip) = self.strip.as_deref_mut() else {
            return acc.finish(frame);
        };
        let held = strip.held.as_ref().map_or(0, Bytes::len) + strip.held_comments.len();
        if strip.partial.len() + held > MAX_LINE_BYTES {
            strip.gave_up = true;
            meter_held(&mut self.tl, &mut self.repeat, strip, t, on_gap);
            let h = strip.held.take();
            release(strip, h, &frame, &mut acc);
            let partial = std::mem::take(&mut strip.partial);
            acc.piece(&frame, partial.freeze());
        }
        acc.finish(frame)
    }

    /// The events at the start of `rest` (a frame from an event's start) that repeat the
    /// template, framed, judged (ordinary output events: they pass) and metered in one look
    /// each, as [`StreamMeter::strip_next`] takes them, when nothing is held, partial or
    /// pending (no `\r` of a line end): returns how many bytes they span, `None` when the
    /// template was not tried (so `Some(0)`: [`RepeatCache::repeats_event`] missed on `rest`).
    #[inline]
    fn pass_repeats(
        &mut self,
        t: Instant,
        rest: &[u8],
        on_gap: &mut impl FnMut(Duration),
    ) -> Option<usize> {
        let strip = self.strip.as_deref()?;
        let quiet = strip.trailing_cr.is_none()
            && strip.partial.is_empty()
            && strip.held.is_none()
            && strip.held_comments.is_empty();
        if !(quiet && self.tl.cacheable() && self.parser.at_event_start()) {
            return None;
        }
        Some(self.tl.on_repeats_at(&mut self.repeat, t, rest, on_gap))
    }

    /// The next event of `frame` from `start`: framed, metered and judged; returns where the
    /// rest begins. `known_miss`: [`StreamMeter::pass_repeats`] just tried the template at
    /// `start` and it missed (a miss changes nothing, so trying again would miss again).
    fn strip_next(
        &mut self,
        t: Instant,
        frame: &Bytes,
        start: usize,
        known_miss: bool,
        acc: &mut Out<'_>,
        on_gap: &mut impl FnMut(Duration),
    ) -> usize {
        let Some(strip) = self.strip.as_deref_mut() else {
            return frame.len();
        };
        let (tl, repeat) = (&mut self.tl, &mut self.repeat);
        let rest = &frame[start..];
        // At the stream's start the parser is at no event's start until a first byte settles
        // its BOM check: settled here (an event the template did not frame), the first event
        // takes the one-look paths too.
        self.parser.past_bom(rest);
        // The template's check failed on `rest` (an event's start): see `missed_at`.
        let mut tried = false;
        // What the event is (untouched until a shape or a scan says).
        let mut scan = EventScan::unknown();
        // `None`: the block dispatched no event (comments, fields without data).
        let mut class = None;
        let mut framed = None;
        if strip.partial.is_empty() && tl.cacheable() && self.parser.at_event_start() {
            tried = repeat.template_frames_one_line();
            let hit = if known_miss {
                None
            } else {
                repeat.repeats_event(rest)
            };
            if let Some((len, data)) = hit {
                // An ordinary output event: what the template said, and it passes.
                if strip.held.is_some() || !strip.held_comments.is_empty() {
                    meter_held(tl, repeat, strip, t, on_gap);
                    let h = strip.held.take();
                    release(strip, h, frame, acc);
                }
                tl.on_repeat(t, repeat, &rest[data], on_gap);
                acc.range(frame, start, start + len);
                return start + len;
            }
            // Not a repeat: `[DONE]`, or a shape, may frame and read it, without the parser
            // (which stays at an event's start, as it would after this one).
            if let Some(len) = super::done_event(rest) {
                // As `judge` takes the parser's `[DONE]`: it passes, releasing a held chunk.
                meter_held(tl, repeat, strip, t, on_gap);
                tl.done_at_once(super::DONE);
                class = Some(Class::Other);
                framed = Some(start + len);
            } else if let Some((len, data)) = tl.look_framed(repeat, rest, &mut scan) {
                let data = rest.get(data).unwrap_or_default();
                class = Some(judge_scanned(tl, repeat, strip, t, data, &scan, on_gap));
                framed = Some(start + len);
            }
        }
        let end = match framed {
            Some(end) => end,
            None => {
                let blocks = self.parser.blocks();
                let took = self.parser.feed_one(rest, |ev| {
                    let missed = tried && missed_at(rest, ev.data);
                    class = Some(judge(tl, repeat, strip, t, ev, missed, &mut scan, on_gap));
                });
                let end = start + took;
                if self.parser.blocks() == blocks {
                    // No event ends in this frame: its bytes wait for the rest of it.
                    strip.partial.extend_from_slice(&frame[start..end]);
                    return end;
                }
                end
            }
        };
        let event = if strip.partial.is_empty() {
            None
        } else {
            strip.partial.extend_from_slice(&frame[start..end]);
            Some(strip.partial.split().freeze())
        };
        let fate = match class {
            // A block without an event (comments) behind a held finish chunk waits with it.
            None if strip.held.is_some() => {
                let bytes = event.unwrap_or_else(|| frame.slice(start..end));
                strip.held_comments.extend_from_slice(&bytes);
                Fate::Held
            }
            None | Some(Class::Other) => {
                let h = strip.held.take();
                release(strip, h, frame, acc);
                match event {
                    Some(e) => acc.piece(frame, e),
                    None => acc.range(frame, start, end),
                }
                Fate::Passed
            }
            Some(Class::Finish { has_fingerprint }) => {
                let h = strip.held.take();
                release(strip, h, frame, acc);
                strip.held = Some(event.unwrap_or_else(|| frame.slice(start..end)));
                strip.held_has_fingerprint = has_fingerprint;
                Fate::Held
            }
            Some(Class::UsagePasses) => {
                // Timings with no finish chunk to take them: the chunk passes whole.
                match event {
                    Some(e) => acc.piece(frame, e),
                    None => acc.range(frame, start, end),
                }
                Fate::Passed
            }
            Some(Class::Usage) => {
                let h = strip.held.take();
                release(strip, h, frame, acc);
                Fate::Dropped
            }
        };
        if end == frame.len() && self.parser.pending_cr() {
            strip.trailing_cr = Some(fate);
        }
        end
    }

    /// The upstream body ended (or broke, or sent trailers) at `t`: what the strip still
    /// holds goes out unchanged, and a held chunk is metered as the client gets it now (the
    /// ITL gap it closes passed to `on_gap`, as every other).
    pub fn end_of_upstream(
        &mut self,
        t: Instant,
        out: &mut VecDeque<Bytes>,
        mut on_gap: impl FnMut(Duration),
    ) {
        let Some(strip) = self.strip.as_deref_mut() else {
            return;
        };
        meter_held(&mut self.tl, &mut self.repeat, strip, t, &mut on_gap);
        if let Some(h) = strip.held.take() {
            out.push_back(h);
        }
        if !strip.held_comments.is_empty() {
            out.push_back(strip.held_comments.split().freeze());
        }
        if !strip.partial.is_empty() {
            out.push_back(strip.partial.split().freeze());
        }
    }
}

/// `data`, an event's payload the parser handed over, is the `<payload>` of `rest` opening
/// with `data: <payload>\n\n` (the payload borrowed from `rest` itself). When the template
/// frames one-line events and [`RepeatCache::repeats_event`] missed on `rest`, such a payload
/// does not repeat the template: `repeats_event` on those bytes finds exactly the payloads
/// that [`RepeatCache::repeats`] finds (its docs), so it is not tried again. (Were it tried,
/// a miss would only cost a scan, whose answer is the same: skipping it cannot change one.)
pub(super) fn missed_at(rest: &[u8], data: &[u8]) -> bool {
    const LEAD: &[u8] = b"data: ";
    let (at, len) = (LEAD.len(), data.len());
    rest.starts_with(LEAD)
        && rest
            .get(at..at + len)
            .is_some_and(|p| std::ptr::eq(p, data))
        && rest.get(at + len..at + len + 2) == Some(&b"\n\n"[..])
}

/// One event the parser completed: its payload scanned once, for the meter and for the
/// strip's decision (`missed`: the template is known not to answer it, see `missed_at`). An
/// ordinary event is metered now (after a held chunk it releases); a finish chunk waits
/// (metered when released); the usage chunk's usage goes to the timeline.
/// `scan`: the caller's [`EventScan::unknown`].
#[allow(clippy::too_many_arguments)]
fn judge(
    tl: &mut Timeline,
    repeat: &mut RepeatCache,
    strip: &mut Strip,
    t: Instant,
    ev: crate::sse::SseEvent<'_>,
    missed: bool,
    scan: &mut EventScan,
    on_gap: &mut impl FnMut(Duration),
) -> Class {
    if ev.event == Some(b"error") {
        meter_held(tl, repeat, strip, t, on_gap);
        tl.inband_error = true;
        return Class::Other;
    }
    if tl.repeat_on && ev.data == b"[DONE]" {
        // An ordinary event (it passes, releasing a held chunk), taken in without a scan.
        meter_held(tl, repeat, strip, t, on_gap);
        tl.done_at_once(ev.data);
        return Class::Other;
    }
    tl.look(repeat, ev.data, missed, scan);
    judge_scanned(tl, repeat, strip, t, ev.data, scan, on_gap)
}

/// [`judge`] of an event with payload `data` once `scan` says what it is (see
/// [`Timeline::look`]).
fn judge_scanned(
    tl: &mut Timeline,
    repeat: &mut RepeatCache,
    strip: &mut Strip,
    t: Instant,
    data: &[u8],
    scan: &EventScan,
    on_gap: &mut impl FnMut(Duration),
) -> Class {
    let info = &scan.info;
    if info.kind == ChunkKind::Chunk && info.choice_count > 0 && info.usage.is_some() {
        strip.engine_usage = true;
    }
    let class = if info.kind != ChunkKind::Chunk {
        Class::Other
    } else if info.choice_count == 0 && info.usage.is_some() && !strip.engine_usage {
        if scan.timings.is_some() && strip.held.is_none() {
            Class::UsagePasses
        } else {
            Class::Usage
        }
    } else if info.finished_count > 0 && info.usage.is_none() {
        Class::Finish {
            has_fingerprint: scan.fingerprint.is_some(),
        }
    } else {
        Class::Other
    };
    match class {
        Class::Other => {
            meter_held(tl, repeat, strip, t, on_gap);
            tl.on_info(t, info, data, on_gap);
        }
        Class::Finish { .. } | Class::Usage | Class::UsagePasses => {
            // Not metered now: the log is the held chunk's to fill again on release (unless
            // it is empty: then the scan's answer is kept for the release).
            let keep = matches!(class, Class::Finish { .. }) && tl.log.is_empty() && tl.repeat_on;
            tl.log.clear();
            meter_held(tl, repeat, strip, t, on_gap);
            match class {
                Class::Finish { .. } if keep => strip.held_info = Some(scan.info),
                Class::Finish { .. } => strip.held_info = None,
                Class::Usage => {
                    tl.on_reported(info);
                    // The held chunk (metered as it came: the fields change nothing it says)
                    // takes back what injection moved to this chunk.
                    let fp = raw(data, &scan.fingerprint).filter(|_| !strip.held_has_fingerprint);
                    let timings = raw(data, &scan.timings);
                    if let Some(h) = strip.held.take() {
                        let fields = [(&b"system_fingerprint"[..], fp), (b"timings", timings)];
                        match insert_fields(h, &fields) {
                            Ok(own) => strip.rewritten = Some(own),
                            Err(h) => strip.held = Some(h),
                        }
                    }
                }
                _ => tl.on_reported(info),
            }
        }
    }
    class
}

fn raw<'a>(data: &'a [u8], at: &Option<Range<usize>>) -> Option<&'a [u8]> {
    at.clone().and_then(|r| data.get(r))
}
