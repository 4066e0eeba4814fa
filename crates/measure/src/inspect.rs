//! Chunk inspection: what one SSE data payload (or one non-streaming JSON body) says about
//! output, finish and usage, read in one pass over its bytes by the cursor of
//! [`crate::scan`]: no tree, no copy, nothing unescaped or allocated per chunk.

use std::ops::Range;

use serde::Deserialize;

use crate::engine::{from_ms, EngineView};
use crate::engine_timings::{read_llamacpp_timings, TimingsReport};
use crate::outcome::FinishReason;
use crate::scan::{Cursor, Malformed, Scan, Str};

mod answer_shape;
mod calls;
pub use calls::LoggedCall;
mod counted;
mod prefix;
use prefix::PrefixNotes;
mod repeat;
pub use repeat::{RepeatCache, Seen, Template, TEMPLATE_ROOM};
mod shapes;
mod tokens;
pub use tokens::{LoggedAlt, LoggedChoice, LoggedToken, Phases, Span, TokenLog};

/// Choices kept per chunk. vLLM and OpenAI send one choice per streamed chunk; a chunk with
/// more keeps the first ones here and counts all of them in [`ChunkInfo::choice_count`].
pub const MAX_CHOICES_PER_CHUNK: usize = 16;

/// What one choice entry of a chunk carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoiceInfo {
    pub index: u32,
    /// Non-empty `delta.content` / `delta.reasoning_content` / `delta.reasoning` /
    /// `delta.tool_calls`, or `text` (completions).
    pub output: bool,
    /// Tokens this choice carries: `logprobs.content` (or legacy `logprobs.tokens`) entries when
    /// present, else 1 when it carries output.
    pub tokens: u32,
    pub finish: Option<FinishReason>,
    /// Which kinds of output its delta carried (reasoning, answer, tool call).
    pub phases: Phases,
}

/// What kind of payload an SSE data event was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkKind {
    /// `[DONE]`.
    Done,
    /// A completion chunk (chat or text).
    Chunk,
    /// An in-band error object (`{"error":{...}}` or `{"object":"error",...}`).
    Error,
    /// Not JSON, or JSON of no known shape.
    Unknown,
}

/// `usage` as reported by the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// `completion_tokens_details.reasoning_tokens`, when that is an integer (anything else
    /// there, or a `completion_tokens_details` that is not an object, reads as none).
    #[serde(default, skip_deserializing)]
    pub reasoning_tokens: Option<u64>,
    /// What the engine said of the request beside this usage: `prompt_tokens_details.
    /// cached_tokens` (an integer, else none) and the chunk's or body's top-level `metrics`
    /// (vLLM's per-request timings; each field a non-negative number of milliseconds, else
    /// none; a `metrics` that is not an object says nothing).
    #[serde(default, skip_deserializing)]
    pub engine: EngineView,
}

/// The summary of one SSE data payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub kind: ChunkKind,
    /// Number of entries in `choices` (all of them, even past [`MAX_CHOICES_PER_CHUNK`]).
    pub choice_count: u32,
    /// Number of choices with a non-null `finish_reason`.
    pub finished_count: u32,
    /// Any choice carries output.
    pub output: bool,
    /// Sum of [`ChoiceInfo::tokens`] over the choices.
    pub tokens: u32,
    pub usage: Option<Usage>,
    /// llama.cpp's top-level `timings` (an object with at least one known field), whether or
    /// not the chunk carries usage.
    pub timings: Option<TimingsReport>,
    choices: [ChoiceInfo; MAX_CHOICES_PER_CHUNK],
    kept: u8,
}

impl ChunkInfo {
    fn of_kind(kind: ChunkKind) -> Self {
        Self {
            kind,
            choice_count: 0,
            finished_count: 0,
            output: false,
            tokens: 0,
            usage: None,
            timings: None,
            choices: [ChoiceInfo::default(); MAX_CHOICES_PER_CHUNK],
            kept: 0,
        }
    }

    /// `*self = *other`, copying the choices only as far as either keeps any: past its
    /// `kept`, every `ChunkInfo` holds default choices (a scan writes the next one and clears
    /// the kept ones, nothing else writes them), so the rest is equal already. A shape's
    /// answer copies about a tenth of the inline array this way (one choice in a stream).
    #[inline]
    pub(crate) fn assign(&mut self, other: &ChunkInfo) {
        let n = usize::from(self.kept.max(other.kept)).min(MAX_CHOICES_PER_CHUNK);
        self.choices[..n].copy_from_slice(&other.choices[..n]);
        self.kind = other.kind;
        self.choice_count = other.choice_count;
        self.finished_count = other.finished_count;
        self.output = other.output;
        self.tokens = other.tokens;
        self.usage = other.usage;
        self.timings = other.timings;
        self.kept = other.kept;
    }

    /// The choice entries (at most [`MAX_CHOICES_PER_CHUNK`]).
    pub fn choices(&self) -> &[ChoiceInfo] {
        &self.choices[..self.kept as usize]
    }

    /// The first finish reason in this chunk, if any.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.choices().iter().find_map(|c| c.finish)
    }
}

/// The summary of a non-streaming JSON response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseInfo {
    /// The body was a JSON object.
    pub parsed: bool,
    /// It carried an `error` object.
    pub error: bool,
    pub choice_count: u32,
    pub finished_count: u32,
    /// Choices that finished with `abort` or `error` (the engine gave up on them).
    pub failed_count: u32,
    /// The first choice's finish reason, or the first `abort` / `error` one when a choice has it.
    pub finish_reason: Option<FinishReason>,
    pub usage: Option<Usage>,
    /// llama.cpp's `timings` (see [`ChunkInfo::timings`]).
    pub timings: Option<TimingsReport>,
}

impl ResponseInfo {
    /// Success by DESIGN.md: `choices` present and every choice has a `finish_reason` other
    /// than `abort` / `error`.
    pub fn is_complete(&self) -> bool {
        self.parsed
            && !self.error
            && self.choice_count > 0
            && self.finished_count == self.choice_count
            && self.failed_count == 0
    }
}

/// What one SSE data payload says, with what the usage stripper needs besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventScan {
    pub info: ChunkInfo,
    /// The raw JSON value of a top-level `system_fingerprint` that is not `null`, as a range
    /// of the payload given to [`scan_event`] (set whenever the payload is a JSON object).
    pub fingerprint: Option<Range<usize>>,
    /// The raw JSON value of a top-level `timings` that is not `null`, likewise: llama.cpp
    /// puts it on its usage chunk when usage was asked for, else on the finish chunk.
    pub timings: Option<Range<usize>>,
    /// How many bytes at the payload's start hold nothing the scan reads: its `{` and the
    /// top-level members before the first that says something (vLLM's `id`, `object`,
    /// `created`, `model`), up to that member's key; 0 when there are none (or the payload is
    /// no JSON object). A payload that opens with the same bytes reads the same up to there:
    /// [`RepeatCache::scan_logged`] scans it from there.
    pub plain_prefix: usize,
    /// The text of each non-empty output string the scan read as "empty or not" only
    /// (`delta.content`, `delta.reasoning_content`, `delta.reasoning`, a choice's `text`),
    /// the first [`OutputSpans::MAX`]: where a repeat of this payload may differ
    /// ([`RepeatCache::learn_scanned`]).
    pub output_spans: OutputSpans,
    /// The integers of a top-level `usage` object that the scan read as numbers only (the
    /// counts it keeps and the ones it skips): where a payload that differs from this one only
    /// in those digits reads the same but for the counts ([`CountSpans`]).
    pub counts: CountSpans,
}

impl EventScan {
    /// What a scan starts from (see [`RepeatCache::scan_logged_to`]): an unknown payload,
    /// nothing noted.
    pub fn unknown() -> Self {
        Self::of_info(ChunkInfo::of_kind(ChunkKind::Unknown))
    }

    /// `info` and nothing else: no range to move, no plain prefix, no output span (the
    /// template's answer for a repeat, which finishes nothing and carries no usage).
    pub fn of_info(info: ChunkInfo) -> Self {
        Self {
            info,
            fingerprint: None,
            timings: None,
            plain_prefix: 0,
            output_spans: OutputSpans::default(),
            counts: CountSpans::default(),
        }
    }
}

/// Ranges of a payload (see [`EventScan::output_spans`]), in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputSpans {
    spans: [(usize, usize); OutputSpans::MAX],
    n: usize,
}

impl OutputSpans {
    /// Spans kept (a chunk has one per choice; vLLM streams one choice).
    pub const MAX: usize = 4;

    /// The spans, `(start, end)` of each text (between its quotes).
    pub fn as_slice(&self) -> &[(usize, usize)] {
        &self.spans[..self.n]
    }

    fn note(&mut self, r: Range<usize>) {
        if let Some(slot) = self.spans.get_mut(self.n) {
            *slot = (r.start, r.end);
            self.n += 1;
        }
    }

    fn shift(self, by: usize) -> Self {
        self.map(|p| p + by)
    }

    /// Every start and end moved by `f`.
    fn map(mut self, f: impl Fn(usize) -> usize) -> Self {
        for s in &mut self.spans[..self.n] {
            *s = (f(s.0), f(s.1));
        }
        self
    }

    /// `*self = from.map(f)` in place, for a `self` with no span (as `default` made it):
    /// only `from`'s spans are written (past them both hold zeros, as `note` leaves them).
    #[inline(always)]
    pub(crate) fn set_mapped(&mut self, from: &Self, f: impl Fn(usize) -> usize) {
        for (d, s) in self.spans.iter_mut().zip(from.as_slice()) {
            *d = (f(s.0), f(s.1));
        }
        self.n = from.n;
    }

    /// [`OutputSpans::map`], `None` when `f` is for some start or end.
    fn try_map(mut self, f: impl Fn(usize) -> Option<usize>) -> Option<Self> {
        for s in &mut self.spans[..self.n] {
            *s = (f(s.0)?, f(s.1)?);
        }
        Some(self)
    }
}

/// What an integer of a top-level `usage` object is to the scan ([`CountSpans`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Count {
    /// Read and dropped: skipped (`total_tokens`), or a count a later key of the same name
    /// replaced. Its digits change nothing.
    #[default]
    Free,
    /// The value of `usage.prompt_tokens`.
    Prompt,
    /// The value of `usage.completion_tokens`.
    Completion,
}

/// The integer values of a top-level `usage` object (the one the answer's usage is), in
/// order, each as `(start, end, what it is)`, the first [`CountSpans::MAX`]. Why a payload
/// that has other digits there reads the same but for the counts: the scan reads such a value
/// by `Cursor::uint` (a count) or `Cursor::skip` (any other key), and both take a run of
/// digits that opens with `1`-`9` (or is `0` alone) and has at most 19 of them (no overflow) by
/// one path, to the first byte that is not a digit; only the count's value depends on which
/// digits they are. A value not noted here (a float, a nested count, past the first
/// [`CountSpans::MAX`]) is compared as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountSpans {
    spans: [(usize, usize, Count); CountSpans::MAX],
    n: usize,
}

impl CountSpans {
    /// Values noted (vLLM's usage has three: prompt, total and completion tokens).
    pub const MAX: usize = 4;

    pub fn as_slice(&self) -> &[(usize, usize, Count)] {
        &self.spans[..self.n]
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// A `usage` member's value was read at `r` as `what` (`None`: not as an integer that
    /// counts, so an earlier value of that count no longer does).
    fn note(&mut self, what: Count, r: Option<Range<usize>>) {
        if what != Count::Free {
            for s in &mut self.spans[..self.n] {
                if s.2 == what {
                    s.2 = Count::Free; // replaced by this one: its digits no longer count
                }
            }
        }
        if let (Some(r), Some(slot)) = (r, self.spans.get_mut(self.n)) {
            *slot = (r.start, r.end, what);
            self.n += 1;
        }
    }

    /// Every start and end moved by `f`.
    fn map(mut self, f: impl Fn(usize) -> usize) -> Self {
        for s in &mut self.spans[..self.n] {
            *s = (f(s.0), f(s.1), s.2);
        }
        self
    }

    /// `*self = from.map(f)` in place, for a `self` with no span (as `default` made it):
    /// only `from`'s spans are written (past them both hold zeros, as `note` leaves them).
    #[inline(always)]
    pub(crate) fn set_mapped(&mut self, from: &Self, f: impl Fn(usize) -> usize) {
        for (d, s) in self.spans.iter_mut().zip(from.as_slice()) {
            *d = (f(s.0), f(s.1), s.2);
        }
        self.n = from.n;
    }

    /// [`CountSpans::map`], `None` when `f` is for some start or end.
    fn try_map(mut self, f: impl Fn(usize) -> Option<usize>) -> Option<Self> {
        for s in &mut self.spans[..self.n] {
            *s = (f(s.0)?, f(s.1)?, s.2);
        }
        Some(self)
    }
}

/// Inspect one SSE data payload (the joined `data:` lines, or `[DONE]`).
pub fn inspect_chunk(data: &[u8]) -> ChunkInfo {
    scan_event(data).info
}

/// Inspect one SSE data payload in one pass over its bytes (see [`crate::scan`]).
///
/// The reading, field by field (the differential test beside this file holds it against a
/// `serde_json::Value` of the same payload): a key that appears twice counts once, the last
/// one (as a JSON parser that builds a map reads it); `choices`, `usage`, `delta`, `logprobs`
/// and each choice must be objects (arrays) or `null` where they appear, `index` and the usage
/// counts integers, `finish_reason` a string or `null`, else the payload is
/// [`ChunkKind::Unknown`]; output is a `text` / `delta` field that is not `null`, `""`, `[]` or
/// `{}`.
pub fn scan_event(data: &[u8]) -> EventScan {
    scan_event_into(data, None)
}

/// [`scan_event`], noting each token's logprob (and, for a traced request, texts and
/// alternatives) in `log` in the same pass (see [`TokenLog`]). The caller clears the log.
pub fn scan_event_logged(data: &[u8], log: &mut TokenLog) -> EventScan {
    scan_event_into(data, Some(log))
}

fn scan_event_into(data: &[u8], log: Option<&mut TokenLog>) -> EventScan {
    scan_event_from(data, 0, log)
}

/// [`scan_event_into`] from `from` (a payload offset): `data[..from]` must be a prefix that a
/// scan found plain ([`EventScan::plain_prefix`]), or `from` 0.
pub(crate) fn scan_event_from(data: &[u8], from: usize, log: Option<&mut TokenLog>) -> EventScan {
    let mut scan = EventScan::unknown();
    scan_event_to(data, from, log, &mut scan);
    scan
}

/// [`scan_event_from`] into `scan`, which must be as [`EventScan::unknown`] made it: the
/// caller's, so that the scan (about half a kilobyte) is written where it is read rather than
/// moved there on each return.
pub(crate) fn scan_event_to(
    data: &[u8],
    from: usize,
    mut log: Option<&mut TokenLog>,
    scan: &mut EventScan,
) {
    let lead = data.len() - data.trim_ascii_start().len();
    if let Some(l) = log.as_deref_mut() {
        l.lead = lead;
        l.body = false;
    }
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        scan.info.kind = ChunkKind::Done;
        return;
    }
    let from = from.saturating_sub(lead);
    let mut spans = OutputSpans::default();
    match read_body(data, from, &mut scan.info, log, &mut spans) {
        Ok(body) => {
            scan.info.kind = if body.is_error() {
                ChunkKind::Error
            } else if body.choices || scan.info.usage.is_some() {
                ChunkKind::Chunk
            } else {
                ChunkKind::Unknown
            };
            if scan.info.kind != ChunkKind::Chunk {
                scan.info = ChunkInfo::of_kind(scan.info.kind);
            }
            scan.fingerprint = body.fingerprint.map(|r| r.start + lead..r.end + lead);
            scan.timings = body.timings.map(|r| r.start + lead..r.end + lead);
            scan.plain_prefix = body.plain_end.map_or(0, |end| end + lead);
            scan.output_spans = spans.shift(lead);
            scan.counts = body.counts.map(|p| p + lead);
        }
        Err(Malformed) => scan.info = ChunkInfo::of_kind(ChunkKind::Unknown),
    }
}

/// Inspect a whole non-streaming JSON response body (read as [`scan_event`] reads a chunk).
pub fn inspect_response(body: &[u8]) -> ResponseInfo {
    inspect_response_into(body, None)
}

/// [`inspect_response`], noting the choices' logprobs in `log` (see [`scan_event_logged`]).
/// An answer that repeats an earlier one on this thread but for values whose reading is known
/// without the scan reads as that scan would (`answer_shape`).
pub fn inspect_response_logged(body: &[u8], log: &mut TokenLog) -> ResponseInfo {
    answer_shape::inspect_logged(body, log)
}

fn inspect_response_into(body: &[u8], log: Option<&mut TokenLog>) -> ResponseInfo {
    scan_response(body, log, &mut ChunkInfo::of_kind(ChunkKind::Unknown))
}

/// The scan of a whole answer; `chunk` (an unknown chunk when called) is left with its
/// choices.
fn scan_response(
    body: &[u8],
    mut log: Option<&mut TokenLog>,
    chunk: &mut ChunkInfo,
) -> ResponseInfo {
    if let Some(l) = log.as_deref_mut() {
        l.lead = body.len() - body.trim_ascii_start().len();
        l.body = true;
    }
    let mut info = ResponseInfo {
        parsed: false,
        error: false,
        choice_count: 0,
        finished_count: 0,
        failed_count: 0,
        finish_reason: None,
        usage: None,
        timings: None,
    };
    let mut spans = OutputSpans::default();
    let Ok(raw) = read_body(body.trim_ascii(), 0, chunk, log, &mut spans) else {
        return info;
    };
    info.parsed = true;
    info.error = raw.is_error();
    info.usage = chunk.usage;
    info.timings = chunk.timings;
    if raw.choices {
        info.choice_count = chunk.choice_count;
        info.finished_count = chunk.finished_count;
        info.failed_count = raw.failed;
        let kept = chunk.choices();
        info.finish_reason = kept
            .iter()
            .find_map(|c| c.finish.filter(|f| f.engine_gave_up()))
            .or_else(|| kept.iter().find_map(|c| c.finish));
    }
    info
}

/// The top-level fields of a chunk or response body besides what goes into its [`ChunkInfo`].
#[derive(Default)]
struct Body {
    /// `choices` is present and not `null`.
    choices: bool,
    /// Choices that finished with `abort` or `error`.
    failed: u32,
    /// `error` is present and not `null`.
    error: bool,
    /// `object` is `"error"`.
    object_error: bool,
    fingerprint: Option<Range<usize>>,
    timings: Option<Range<usize>>,
    /// Where the key of the first member that is not plain starts, when members before it
    /// are all plain (they leave everything here as it was: see [`EventScan::plain_prefix`]).
    plain_end: Option<usize>,
    /// The integers of the `usage` read ([`EventScan::counts`]).
    counts: CountSpans,
}

impl Body {
    fn is_error(&self) -> bool {
        self.error || self.object_error
    }
}

/// A field read by its last value: `Ok` until a value of the wrong shape comes, which an
/// earlier or later value of the same key replaces (see [`Cursor::read_or_skip`]).
type Field<T> = Scan<T>;

fn nullable<'a, T>(
    c: &mut Cursor<'a>,
    read: impl FnOnce(&mut Cursor<'a>) -> Scan<T>,
) -> Scan<Field<Option<T>>> {
    c.read_or_skip(|c| {
        if c.null() {
            Ok(None)
        } else {
            read(c).map(Some)
        }
    })
}

const BODY_KEYS: &[&[u8]] = &[
    b"choices",
    b"usage",
    b"error",
    b"object",
    b"system_fingerprint",
    b"metrics",
    b"timings",
];

/// [`plain_prefix_noted`] without notes: the reference the kept prefix is held to.
#[cfg(test)]
pub(crate) fn plain_prefix_end(data: &[u8]) -> Option<usize> {
    plain_prefix_noted(data, None)
}

/// Where the plain prefix of the payload `data` ends ([`EventScan::plain_prefix`], as a scan of
/// `data` finds it), read without the rest: the start of the first member (its key's quote)
/// that says something, when plain members come before it and it comes; else `None`. The
/// members before are read as [`read_body`] reads them (unknown keys skipped, `object` read as
/// a string that is not `"error"`), so a scan resumed there is the scan of `data`. With
/// `notes`, what [`prefix`]'s kept prefix needs is noted: the values the read only skipped,
/// and where the colon after the key that ends the prefix ends.
pub(crate) fn plain_prefix_noted(
    data: &[u8],
    mut notes: Option<&mut PrefixNotes>,
) -> Option<usize> {
    let lead = data.len() - data.trim_ascii_start().len();
    let mut c = Cursor::new(data.trim_ascii());
    let (mut read, mut end) = (0, None);
    // The member that is not plain stops the read (as an error: the rest is the scan's).
    let _ = c.object(|c, key| {
        let key_at = c.span(key).start.saturating_sub(1);
        let value_at = c.next_offset();
        let plain = match key.one_of(BODY_KEYS) {
            None => {
                c.skip()?;
                if let Some(n) = notes.as_deref_mut() {
                    n.skipped(c.skipped_value(value_at, c.offset()), lead);
                }
                true
            }
            Some(3) if c.peek() == Some(b'"') => !c.string()?.is(b"error"),
            Some(3) => c.skip().map(|()| true)?,
            Some(_) => false,
        };
        if !plain {
            end = (read > 0).then_some(key_at + lead);
            if let Some(n) = notes.as_deref_mut() {
                n.colon_end = value_at + lead;
            }
            return Err(Malformed);
        }
        read += 1;
        Ok(())
    });
    end
}

/// Reads the top level; the choices and usage go straight into `out` (no copy of the choice
/// array per event), the rest is returned. From `from` (an offset of `data`) when that is
/// not 0: `data[..from]` was found plain by an earlier read (see [`EventScan::plain_prefix`]).
fn read_body<'a>(
    data: &'a [u8],
    from: usize,
    out: &mut ChunkInfo,
    mut log: Option<&mut TokenLog>,
    spans: &mut OutputSpans,
) -> Scan<Body> {
    let mut body = Body::default();
    let (mut choices, mut usage) = (Ok(()), Ok(None));
    let mut metrics = EngineView::default();
    // Every member so far was plain, and how many were read (the ones before `from` count).
    let (mut plain, mut read) = (true, usize::from(from > 0));
    let member = |c: &mut Cursor<'a>, key: Str<'a>| {
        let key_at = c.span(key).start.saturating_sub(1);
        if plain && read > 0 {
            body.plain_end = Some(key_at);
        }
        read += 1;
        let k = key.one_of(BODY_KEYS);
        // Members that leave everything as it was: unknown keys, and `object` when not
        // `"error"` (checked after it is read).
        plain &= matches!(k, None | Some(3));
        match k {
            Some(0) => {
                clear_choices(out, &mut body);
                if let Some(l) = log.as_deref_mut() {
                    l.restart();
                }
                body.choices = !c.null();
                choices = if body.choices {
                    c.read_or_skip(|c| read_choices(c, out, &mut body.failed, &mut log, spans))?
                } else {
                    Ok(())
                };
            }
            Some(1) => {
                let mut noted = CountSpans::default();
                usage = nullable(c, |c| read_usage(c, &mut noted))?;
                // The counts of the usage the answer keeps (a later `usage` replaces them).
                body.counts = match usage {
                    Ok(Some(_)) => noted,
                    _ => CountSpans::default(),
                };
            }
            Some(2) => {
                body.error = if c.null() {
                    false
                } else {
                    c.skip()?;
                    true
                }
            }
            Some(3) => {
                body.object_error = match c.peek() {
                    Some(b'"') => c.string()?.is(b"error"),
                    _ => c.skip().map(|()| false)?,
                }
            }
            Some(4) => {
                let start = c.next_offset();
                body.fingerprint = if c.null() {
                    None
                } else {
                    c.skip()?;
                    Some(start..c.offset())
                };
            }
            Some(5) => metrics = c.read_or_skip(read_metrics)?.unwrap_or_default(),
            Some(6) => {
                let start = c.next_offset();
                (out.timings, body.timings) = if c.null() {
                    (None, None)
                } else {
                    let t = read_llamacpp_timings(c)?;
                    (t.report(), Some(start..c.offset()))
                };
            }
            _ => c.skip()?,
        }
        plain &= !body.object_error;
        Ok(())
    };
    if from == 0 {
        let mut c = Cursor::new(data);
        c.object(member)?;
        c.end()?;
    } else {
        Cursor::resume_object(data, from, member)?;
    }
    choices?;
    out.usage = usage?.map(|mut u: Usage| {
        let cached = u.engine.cached_prompt_tokens;
        u.engine = EngineView {
            cached_prompt_tokens: cached,
            ..metrics
        };
        u
    });
    Ok(body)
}

/// Forget an earlier `choices` (a later one replaces it), leaving no stale entry behind.
fn clear_choices(out: &mut ChunkInfo, body: &mut Body) {
    out.choices[..out.kept as usize].fill(ChoiceInfo::default());
    out.choice_count = 0;
    out.finished_count = 0;
    out.output = false;
    out.tokens = 0;
    out.kept = 0;
    body.failed = 0;
}

const USAGE_KEYS: &[&[u8]] = &[
    b"prompt_tokens",
    b"completion_tokens",
    b"completion_tokens_details",
    b"prompt_tokens_details",
];

/// `usage`, its integer members noted in `counts` (see [`CountSpans`]).
fn read_usage(c: &mut Cursor<'_>, counts: &mut CountSpans) -> Scan<Usage> {
    let (mut prompt, mut completion, mut reasoning) = (Ok(None), Ok(None), None);
    let mut cached = None;
    c.object(|c, key| {
        let at = c.next_offset();
        let count = |c: &Cursor<'_>, v: &Field<Option<u64>>| {
            matches!(v, Ok(Some(_))).then(|| at..c.offset())
        };
        match key.one_of(USAGE_KEYS) {
            Some(0) => {
                prompt = nullable(c, Cursor::uint)?;
                counts.note(Count::Prompt, count(c, &prompt));
            }
            Some(1) => {
                completion = nullable(c, Cursor::uint)?;
                counts.note(Count::Completion, count(c, &completion));
            }
            Some(2) => reasoning = c.read_or_skip(read_reasoning_tokens)?.ok().flatten(),
            Some(3) => cached = c.read_or_skip(read_cached_tokens)?.ok().flatten(),
            _ => {
                c.skip()?;
                let digits = c.digits_between(at, c.offset());
                counts.note(Count::Free, digits.then(|| at..c.offset()));
            }
        }
        Ok(())
    })?;
    Ok(Usage {
        prompt_tokens: prompt?,
        completion_tokens: completion?,
        reasoning_tokens: reasoning,
        engine: EngineView {
            cached_prompt_tokens: cached,
            ..EngineView::default()
        },
    })
}

/// `prompt_tokens_details` (an object; else refused): its `cached_tokens` when that is an
/// integer.
fn read_cached_tokens(c: &mut Cursor<'_>) -> Scan<Option<u64>> {
    let mut cached = None;
    c.object(|c, key| {
        if key.is(b"cached_tokens") {
            cached = c.read_or_skip(Cursor::uint)?.ok();
        } else {
            c.skip()?;
        }
        Ok(())
    })?;
    Ok(cached)
}

/// vLLM's per-request `metrics` (an object; else refused): its timings in milliseconds.
fn read_metrics(c: &mut Cursor<'_>) -> Scan<EngineView> {
    let mut v = EngineView::default();
    c.object(|c, key| {
        let slot = match key.one_of(&[
            b"queue_time_ms",
            b"time_to_first_token_ms",
            b"generation_time_ms",
            b"mean_itl_ms",
        ]) {
            Some(0) => &mut v.queue,
            Some(1) => &mut v.ttft,
            Some(2) => &mut v.decode,
            Some(3) => &mut v.mean_itl,
            _ => return c.skip(),
        };
        *slot = c.read_or_skip(Cursor::float)?.ok().and_then(from_ms);
        Ok(())
    })?;
    Ok(v)
}

/// `completion_tokens_details` (an object; else refused): its `reasoning_tokens` when that is
/// an integer.
fn read_reasoning_tokens(c: &mut Cursor<'_>) -> Scan<Option<u64>> {
    let mut reasoning = None;
    c.object(|c, key| {
        if key.is(b"reasoning_tokens") {
            reasoning = c.read_or_skip(Cursor::uint)?.ok();
        } else {
            c.skip()?;
        }
        Ok(())
    })?;
    Ok(reasoning)
}

fn read_choices(
    c: &mut Cursor<'_>,
    out: &mut ChunkInfo,
    failed: &mut u32,
    log: &mut Option<&mut TokenLog>,
    spans: &mut OutputSpans,
) -> Scan<()> {
    c.array(|c| {
        let s = read_choice(c, log, spans)?;
        out.choice_count = out.choice_count.saturating_add(1);
        out.finished_count += u32::from(s.finish.is_some());
        *failed += u32::from(s.finish.is_some_and(FinishReason::engine_gave_up));
        out.output |= s.output;
        out.tokens = out.tokens.saturating_add(s.tokens);
        if let Some(slot) = out.choices.get_mut(out.kept as usize) {
            *slot = s;
            out.kept += 1;
        }
        Ok(())
    })
}

const CHOICE_KEYS: &[&[u8]] = &[
    b"index",
    b"delta",
    b"text",
    b"finish_reason",
    b"logprobs",
    b"message",
];

fn read_index(c: &mut Cursor<'_>) -> Scan<u32> {
    u32::try_from(c.uint()?).map_err(|_| Malformed)
}

fn read_finish(c: &mut Cursor<'_>) -> Scan<FinishReason> {
    c.string().map(finish_reason)
}

fn read_choice(
    c: &mut Cursor<'_>,
    log: &mut Option<&mut TokenLog>,
    spans: &mut OutputSpans,
) -> Scan<ChoiceInfo> {
    let (mut index, mut delta, mut finish, mut logprobs) = (Ok(0), Ok(None), Ok(None), Ok(None));
    let mut text = (false, 0);
    let mark = log.as_deref().map(TokenLog::mark);
    let detail = log.as_deref().is_some_and(|l| l.detail);
    c.object(|c, key| {
        match key.one_of(CHOICE_KEYS) {
            Some(0) => index = c.read_or_skip(read_index)?,
            Some(1) => {
                // A repeated key replaces the calls an earlier one logged.
                if let (Some(l), Some(m)) = (log.as_deref_mut(), mark) {
                    if !l.body {
                        l.calls.truncate(m.calls);
                    }
                }
                delta = nullable(c, |c| read_delta(c, log.as_deref_mut(), spans))?;
            }
            Some(5) => match (log.as_deref_mut(), mark) {
                (Some(l), Some(m)) if l.body => {
                    l.calls.truncate(m.calls);
                    read_message(c, l)?;
                }
                _ => c.skip()?,
            },
            Some(2) if detail => text = tokens::text_field(c)?,
            Some(2) => text = (non_empty_noted(c, spans)?, 0),
            Some(3) => finish = nullable(c, read_finish)?,
            Some(4) => {
                logprobs = match (log.as_deref_mut(), mark) {
                    // A repeated key replaces what an earlier one logged (also with `null`).
                    (Some(l), Some(m)) => {
                        l.truncate(m);
                        nullable(c, |c| l.read_logprobs(c, m))?
                    }
                    _ => nullable(c, read_logprobs)?,
                }
            }
            _ => c.skip()?,
        }
        Ok(())
    })?;
    let (phases, delta_len) = delta?.unwrap_or_default();
    let phases = phases.with(Phases::ANSWER, text.0);
    let output = !phases.is_empty();
    let logprobs = logprobs?.unwrap_or(0);
    let info = ChoiceInfo {
        index: index?,
        output,
        tokens: if logprobs > 0 {
            logprobs
        } else {
            u32::from(output)
        },
        finish: finish?,
        phases,
    };
    if let (Some(l), Some(m)) = (log.as_deref_mut(), mark) {
        l.end_choice(m, info.index, phases, delta_len.saturating_add(text.1));
    }
    Ok(info)
}

const DELTA_KEYS: &[&[u8]] = &[
    b"content",
    b"reasoning_content",
    b"reasoning",
    b"tool_calls",
];

/// Which kinds of output a `delta` carries; with a log, its tool calls (see [`calls`]); traced
/// (`detail`): and the decoded length of its texts (tool calls: their names and argument
/// fragments).
fn read_delta(
    c: &mut Cursor<'_>,
    mut log: Option<&mut TokenLog>,
    spans: &mut OutputSpans,
) -> Scan<(Phases, u32)> {
    let detail = log.as_deref().is_some_and(|l| l.detail);
    let lead = log.as_deref().map_or(0, |l| l.lead);
    let first_call = log.as_deref().map_or(0, |l| l.calls.len());
    let mut fields = [(false, 0u32); 4];
    c.object(|c, key| {
        match key.one_of(DELTA_KEYS) {
            Some(3) => {
                let calls = log.as_deref_mut().filter(|l| !l.body).map(|l| {
                    l.calls.truncate(first_call); // the last `tool_calls` counts
                    &mut l.calls
                });
                let (any, len) = calls::read_tool_calls(c, lead, calls, false)?;
                fields[3] = (any, if detail { len } else { 0 });
            }
            Some(k) if detail => fields[k] = tokens::text_field(c)?,
            Some(k) => fields[k] = (non_empty_noted(c, spans)?, 0),
            None => c.skip()?,
        }
        Ok(())
    })?;
    let phases = Phases::default()
        .with(Phases::ANSWER, fields[0].0)
        .with(Phases::REASONING, fields[1].0 || fields[2].0)
        .with(Phases::TOOL_CALL, fields[3].0);
    let len = fields.iter().fold(0u32, |n, f| n.saturating_add(f.1));
    Ok((phases, len))
}

/// [`Cursor::non_empty`], noting the text of a non-empty string in `spans` (its only reader
/// asks whether it is empty: any other non-empty text reads the same).
#[inline]
fn non_empty_noted(c: &mut Cursor<'_>, spans: &mut OutputSpans) -> Scan<bool> {
    if c.peek() != Some(b'"') {
        return c.non_empty();
    }
    let s = c.string()?;
    if s.is_empty() {
        return Ok(false);
    }
    spans.note(c.span(s));
    Ok(true)
}

/// A non-streaming body's `message` (not yet consumed): the calls of its `tool_calls` into
/// the log, indexed by position (a message's calls carry no `index`). Read for the log only:
/// any other value is skipped.
fn read_message(c: &mut Cursor<'_>, log: &mut TokenLog) -> Scan<()> {
    if c.peek() != Some(b'{') {
        return c.skip();
    }
    let first_call = log.calls.len();
    c.object(|c, key| {
        if key.is(b"tool_calls") {
            log.calls.truncate(first_call); // the last `tool_calls` counts
            calls::read_tool_calls(c, log.lead, Some(&mut log.calls), true)?;
        } else {
            c.skip()?;
        }
        Ok(())
    })
}

/// Tokens counted by `logprobs`: `content` (chat) entries when present, else legacy `tokens`.
fn read_logprobs(c: &mut Cursor<'_>) -> Scan<u32> {
    let (mut content, mut tokens) = (Ok(None), Ok(None));
    c.object(|c, key| {
        match key.one_of(&[b"content", b"tokens"]) {
            Some(0) => content = nullable(c, Cursor::count)?,
            Some(1) => tokens = nullable(c, Cursor::count)?,
            _ => c.skip()?,
        }
        Ok(())
    })?;
    Ok(content?.or(tokens?).unwrap_or(0))
}

/// Every reason [`FinishReason::parse`] knows, for names written with escapes.
const REASONS: [FinishReason; 8] = [
    FinishReason::Stop,
    FinishReason::Length,
    FinishReason::ToolCalls,
    FinishReason::ContentFilter,
    FinishReason::FunctionCall,
    FinishReason::Abort,
    FinishReason::Error,
    FinishReason::Repetition,
];

fn finish_reason(s: Str<'_>) -> FinishReason {
    let plain = FinishReason::parse(s.raw());
    if plain != FinishReason::Other {
        return plain;
    }
    REASONS
        .into_iter()
        .find(|r| s.is(r.as_str().as_bytes()))
        .unwrap_or(FinishReason::Other)
}

#[cfg(test)]
pub(crate) mod differential;
#[cfg(test)]
mod oracle;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::capture;
    use crate::sse::SseParser;
    use FinishReason::*;

    /// (payload, kind, choices, output, tokens, finish, usage (prompt, completion))
    type Case = (
        &'static str,
        ChunkKind,
        u32,
        bool,
        u32,
        Option<FinishReason>,
        Option<(u64, u64)>,
    );

    #[test]
    fn table() {
        use ChunkKind::*;
        let cases: &[Case] = &[
            ("[DONE]", Done, 0, false, 0, None, None),
            (" [DONE]\n", Done, 0, false, 0, None, None),
            (
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
                Chunk,
                1,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"SE"},"finish_reason":null}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":1,"delta":{"content":""},"finish_reason":null}]}"#,
                Chunk,
                1,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"\n"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"think"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}"#,
                Chunk,
                1,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
                Chunk,
                1,
                false,
                0,
                Some(ToolCalls),
                None,
            ),
            (
                r#"{"choices":[{"index":0,"text":"ab","finish_reason":null}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}"#,
                Chunk,
                1,
                false,
                0,
                Some(Stop),
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"abc"},"logprobs":{"content":[{"token":"a"},{"token":"b"},{"token":"c"}]}}]}"#,
                Chunk,
                1,
                true,
                3,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"text":"ab","logprobs":{"text_offset":[0,1],"token_logprobs":[-1,-1],"tokens":["a","b"],"top_logprobs":null}}]}"#,
                Chunk,
                1,
                true,
                2,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"},{"index":1,"delta":{"content":"y"},"finish_reason":"stop"}]}"#,
                Chunk,
                2,
                true,
                2,
                Some(Length),
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"weird"}]}"#,
                Chunk,
                1,
                true,
                1,
                Some(Other),
                None,
            ),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":32,"total_tokens":48,"completion_tokens":16}}"#,
                Chunk,
                0,
                false,
                0,
                None,
                Some((32, 16)),
            ),
            (
                r#"{"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}"#,
                Error,
                0,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}"#,
                Error,
                0,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"object":"error","message":"old style","type":"x","code":500}"#,
                Error,
                0,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"error":null,"choices":[{"index":0,"delta":{"content":"a"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            ("{}", Unknown, 0, false, 0, None, None),
            ("[]", Unknown, 0, false, 0, None, None),
            ("not json", Unknown, 0, false, 0, None, None),
            ("\u{1}\u{2}", Unknown, 0, false, 0, None, None),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"a"}}"#,
                Unknown,
                0,
                false,
                0,
                None,
                None,
            ),
            (r#"{"choices":"nope"}"#, Unknown, 0, false, 0, None, None),
        ];
        for (payload, kind, choices, output, tokens, finish, usage) in cases {
            let i = inspect_chunk(payload.as_bytes());
            let got = (
                i.kind,
                i.choice_count,
                i.output,
                i.tokens,
                i.finish_reason(),
                i.usage
                    .map(|u| (u.prompt_tokens.unwrap(), u.completion_tokens.unwrap())),
            );
            assert_eq!(
                got,
                (*kind, *choices, *output, *tokens, *finish, *usage),
                "{payload}"
            );
        }
        assert_eq!(inspect_chunk(b"\xff\xfe{").kind, ChunkKind::Unknown);
    }

    #[test]
    fn choices_beyond_the_kept_ones_are_still_counted() {
        let one = r#"{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}"#;
        let body = format!(r#"{{"choices":[{}]}}"#, vec![one; 40].join(","));
        let i = inspect_chunk(body.as_bytes());
        assert_eq!((i.choice_count, i.finished_count, i.tokens), (40, 40, 40));
        assert_eq!(i.choices().len(), MAX_CHOICES_PER_CHUNK);
    }

    /// Everything a capture's stream says, chunk by chunk.
    fn chunks(name: &str) -> Vec<ChunkInfo> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(capture(name).body, |e| out.push(inspect_chunk(e.data)));
        p.finish(|e| out.push(inspect_chunk(e.data)));
        out
    }

    /// An independent oracle over serde_json::Value: output events per data payload.
    fn oracle_outputs(name: &str) -> usize {
        let body = capture(name).body;
        body.split(|b| *b == b'\n')
            .filter_map(|l| l.strip_prefix(b"data: "))
            .filter(|d| *d != b"[DONE]")
            .map(|d| serde_json::from_slice::<serde_json::Value>(d).unwrap())
            .filter(|v| {
                v["choices"].as_array().unwrap().iter().any(|c| {
                    let s = |x: &serde_json::Value| x.as_str().is_some_and(|s| !s.is_empty());
                    s(&c["delta"]["content"]) || s(&c["text"])
                })
            })
            .count()
    }

    #[test]
    fn real_captures() {
        // (capture, chunks incl. [DONE], output events, tokens, finish, usage)
        type Case = (
            &'static str,
            usize,
            usize,
            u32,
            FinishReason,
            Option<(u64, u64)>,
        );
        let cases: &[Case] = &[
            ("stream-chat.txt", 18, 16, 16, Length, None),
            ("stream-chat-usage.txt", 19, 16, 16, Length, Some((32, 16))),
            (
                "stream-chat-usage-continuous.txt",
                9,
                6,
                6,
                Length,
                Some((15, 6)),
            ),
            ("stream-chat-logprobs.txt", 11, 8, 8, Length, Some((20, 8))),
            ("stream-chat-stop.txt", 4, 1, 1, Stop, Some((15, 1))),
            ("stream-chat-n2.txt", 12, 7, 7, Length, Some((15, 8))),
            ("stream-completions.txt", 18, 16, 16, Length, Some((10, 16))),
            ("stream-completions-logprobs.txt", 5, 4, 4, Length, None),
        ];
        for (name, n, outputs, tokens, finish, usage) in cases {
            let c = chunks(name);
            assert_eq!(c.len(), *n, "{name}: chunks");
            assert_eq!(c.last().unwrap().kind, ChunkKind::Done, "{name}");
            assert!(
                c[..c.len() - 1].iter().all(|i| i.kind == ChunkKind::Chunk),
                "{name}"
            );
            let out = c.iter().filter(|i| i.output).count();
            assert_eq!(out, *outputs, "{name}: outputs");
            assert_eq!(out, oracle_outputs(name), "{name}: oracle");
            assert_eq!(
                c.iter().map(|i| i.tokens).sum::<u32>(),
                *tokens,
                "{name}: tokens"
            );
            let finishes: Vec<_> = c.iter().filter_map(|i| i.finish_reason()).collect();
            assert!(finishes.iter().all(|f| f == finish), "{name}: finish");
            let last_usage = c.iter().rev().find_map(|i| i.usage);
            let got = last_usage.map(|u| (u.prompt_tokens.unwrap(), u.completion_tokens.unwrap()));
            assert_eq!(got, *usage, "{name}: usage");
        }
        // Chat streams open with a role-only chunk: a choice, no output.
        let first = chunks("stream-chat.txt")[0];
        assert_eq!((first.choice_count, first.output), (1, false));
        // n=2: one role chunk per index, and both indices finish.
        let n2 = chunks("stream-chat-n2.txt");
        let finished: Vec<u32> = n2
            .iter()
            .flat_map(|i| {
                i.choices()
                    .iter()
                    .filter(|c| c.finish.is_some())
                    .map(|c| c.index)
            })
            .collect();
        assert_eq!(finished, vec![0, 1]);
    }

    #[test]
    fn non_streaming_bodies() {
        let ok = inspect_response(capture("nonstream-chat.txt").body);
        assert!(ok.is_complete());
        assert_eq!(
            (ok.choice_count, ok.finished_count, ok.finish_reason),
            (1, 1, Some(Length))
        );
        assert_eq!(
            ok.usage,
            Some(Usage {
                prompt_tokens: Some(15),
                completion_tokens: Some(8),
                reasoning_tokens: None,
                engine: Default::default(),
            })
        );
        for (name, status) in [
            ("error-too-long.txt", 400),
            ("error-unknown-model.txt", 404),
        ] {
            assert_eq!(capture(name).status, status);
            let e = inspect_response(capture(name).body);
            assert!(e.parsed && e.error && !e.is_complete(), "{name}");
        }
        let cut = &capture("nonstream-chat.txt").body[..100];
        assert!(!inspect_response(cut).parsed);
        let unfinished = br#"{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":"stop"},{"index":1,"message":{"content":"b"},"finish_reason":null}]}"#;
        let u = inspect_response(unfinished);
        assert_eq!(
            (u.choice_count, u.finished_count, u.is_complete()),
            (2, 1, false)
        );
        assert!(!inspect_response(br#"{"choices":[]}"#).is_complete());
    }
}
