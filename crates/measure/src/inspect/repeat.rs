//! The repeat cache: most events of a stream are the previous event with other output text
//! (same id, model, `created`, keys, `finish_reason: null`; only `delta.content` differs). Such
//! an event says exactly what the last fully scanned one said, so it gets that [`ChunkInfo`]
//! after two `memcmp`s and a look at its new text instead of a scan.
//!
//! Why that is exact: the cache keeps one valid chunk (the template) and the spans of its
//! output strings: the values of `content`, `reasoning_content`, `reasoning` and `text`, which
//! inspection reads only as "empty or not" (and the scanner reads nowhere else as anything
//! but skipped text). An event hits when it equals the template outside one such span, its
//! text in there is non-empty, and is string text to the scanner: bytes that are no quote,
//! backslash or control character, and escapes as `scan::Cursor::escape` takes them (`\n`,
//! `\"`, `\u00e9`, ...: a token that holds a line end or a quote is common in code). Then it
//! tokenizes as the template does, with one string's text changed, and the scan would return
//! the template's answer. Anything else (other text, a new key, a `finish_reason`, a bad
//! escape) is a miss: a full scan, which becomes the new template when it is a valid chunk
//! with output text to vary (else the old template stays). `tests` below and the differential test hold the cache equal to
//! [`inspect_chunk`](super::inspect_chunk) on every event.

use super::counted::{patch, Holes, Values};
use super::{
    scan_event_to, shapes, ChoiceInfo, ChunkInfo, ChunkKind, CountSpans, EventScan, OutputSpans,
    TokenLog,
};
use crate::scan::{escape_len, plain_run, plain_run_in_a_word};
use crate::sse::MAX_LINE_BYTES;

/// Output spans kept per template (a chunk has one per choice; vLLM streams one choice).
const MAX_SPANS: usize = OutputSpans::MAX;
/// Longest event kept as a template: events past it (large logprobs) rarely repeat.
const MAX_TEMPLATE: usize = 4096;

/// How the template is written as an event: `data: ` before its payload, a blank line after.
const LEAD: &[u8] = b"data: ";
const TRAIL: &[u8] = b"\n\n";

/// Values read only as empty-or-not (see the module docs).
const OUTPUT_KEYS: [&[u8]; 4] = [b"content", b"reasoning_content", b"reasoning", b"text"];

/// A valid event and the text spans of its output strings: [`Template::repeats`] tells an event
/// that differs from it only inside one of them (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Template {
    /// The template written as an SSE event, `data: <payload>\n\n` ([`LEAD`], [`TRAIL`]):
    /// the payload for [`Template::repeats`], the whole for [`RepeatCache::repeats_event`]'s
    /// one comparison of the head and one of the tail. Then, past `event_len`, `data: ` and
    /// the payload up to its first span again: from the first span's end on, the bytes
    /// between the texts of two repeats in a row ([`Template::run_one_span`]).
    bytes: Vec<u8>,
    /// The length of the event in `bytes`.
    event_len: usize,
    /// `(start, end)` of each output string's text in the payload (between its quotes).
    spans: [(usize, usize); MAX_SPANS],
    n_spans: usize,
    /// The payload holds no line end (`\n`, `\r`).
    one_line: bool,
    /// The payload holds no line end but in a run at its end that ends with `\n` (an SSE event:
    /// one line and a blank one): [`Template::match_prefix`] may frame by it.
    frames: bool,
    /// The integers of its `usage` that a repeat may hold other digits in (continuous usage:
    /// see [`super::counted`]); empty for a template without usage. A template with counts
    /// has one output span and one line (else it is not kept).
    counts: CountSpans,
    /// The output span and the count spans in order, for a template with counts.
    holes: Holes,
}

impl Template {
    /// Room for a template event of `bytes` (its payload and the 8 bytes of `data: ` and the
    /// blank line; taken up front, so that learning one of that size allocates nothing on
    /// the event path).
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            ..Self::default()
        }
    }

    /// Keeps `bytes` as the template when it has an output span (and is not too long); else
    /// keeps the old one (a template stays true: an event without output text must not make
    /// the ones after it miss). `bytes` must be a valid JSON text, or one whose only
    /// bytes outside it hold no quote (an SSE `data:` line and its line end).
    pub fn learn(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() > MAX_TEMPLATE {
            return false;
        }
        let mut spans = [(0, 0); MAX_SPANS];
        let n = output_spans(bytes, &mut spans);
        self.keep(bytes, spans, n, &CountSpans::default())
    }

    /// [`Template::learn`] with the spans a scan of `bytes` noted (what it read only as empty
    /// or not: [`EventScan::output_spans`]), without a pass of its own to find them. Any
    /// other non-empty text in one of them reads the same, so a repeat is as exact; an output
    /// key the scan does not read (in an unknown object) has no span here, so such an event
    /// may hit less often than with [`Template::learn`]'s. On every real capture both find the
    /// same spans (`tests` below).
    pub fn learn_spans(&mut self, bytes: &[u8], spans: &OutputSpans) -> bool {
        if bytes.len() > MAX_TEMPLATE {
            return false;
        }
        self.learn_counted(bytes, spans, &CountSpans::default())
    }

    /// [`Template::learn_spans`] of a chunk with `usage` whose integers the scan noted as
    /// `counts` ([`EventScan::counts`]): a repeat may have other digits there too, and its
    /// answer has the counts it reads there ([`RepeatCache::repeats`]). Kept only with one
    /// output span and on one line (continuous usage of a one-choice stream); with `counts`
    /// empty, [`Template::learn_spans`].
    pub(super) fn learn_counted(
        &mut self,
        bytes: &[u8],
        spans: &OutputSpans,
        counts: &CountSpans,
    ) -> bool {
        if bytes.len() > MAX_TEMPLATE {
            return false;
        }
        let noted = spans.as_slice();
        let mut kept = [(0, 0); MAX_SPANS];
        kept[..noted.len()].copy_from_slice(noted);
        self.keep(bytes, kept, noted.len(), counts)
    }

    fn keep(
        &mut self,
        bytes: &[u8],
        spans: [(usize, usize); MAX_SPANS],
        n: usize,
        counts: &CountSpans,
    ) -> bool {
        let body_end = bytes
            .iter()
            .rposition(|c| !matches!(c, b'\n' | b'\r'))
            .map_or(0, |i| i + 1);
        let inner = memchr::memchr2(b'\n', b'\r', &bytes[..body_end]).is_some();
        let one_line = !inner && body_end == bytes.len();
        // Counts only with one span on one line (what `RepeatCache::repeats_event` frames).
        let counts_fit = counts.is_empty() || (n == 1 && one_line);
        if !counts_fit {
            return false;
        }
        if n > 0 {
            self.spans = spans;
            self.n_spans = n;
            self.bytes.clear();
            self.bytes.extend_from_slice(LEAD);
            self.bytes.extend_from_slice(bytes);
            self.bytes.extend_from_slice(TRAIL);
            self.event_len = self.bytes.len();
            self.bytes.extend_from_slice(LEAD);
            self.bytes
                .extend_from_slice(bytes.get(..spans[0].0).unwrap_or_default());
            self.one_line = one_line;
            self.frames = !inner && (self.one_line || bytes.last() == Some(&b'\n'));
            self.counts = *counts;
            self.holes = Holes::new(spans[0], counts);
        }
        n > 0
    }

    /// The template has count spans (see [`Template::learn_counted`]).
    #[inline]
    fn counted(&self) -> bool {
        !self.counts.is_empty()
    }

    /// [`match_counted`] of `buf` against the payload: the bytes, the text's range and the
    /// counts' values of a repeat at `buf`'s start.
    #[inline]
    fn match_counted(&self, buf: &[u8]) -> Option<(usize, std::ops::Range<usize>, Values)> {
        self.holes.match_at(self.payload(), buf)
    }

    /// Framing and the template check in one: `buf` starts with bytes `b` for which
    /// [`Template::repeats`]`(b)` holds; returns `b.len()` and what `repeats` returns. `buf` may
    /// go on past `b` (the rest of a frame); the text's end is its first byte that is not plain
    /// text, which must open the template's bytes after the span. `None` when the template
    /// does not [frame](Template::frames): else `b` is where a line-based framer that starts
    /// at `buf[0]` cuts too, because every line end of `b` is the template's own, at the same
    /// place, and the last one (a `\n`) needs no byte after it to be known.
    ///
    /// Why `repeats(b)` holds exactly when this hits: `repeats` takes the first span where `b`
    /// differs from the template only in plain text. For that span the text ends at its first
    /// non-plain byte (the template's closing quote follows the text), so this finds the same
    /// `b`; for a span before it, a hit here would give a `b` where `repeats` hits on that span.
    #[inline]
    pub fn match_prefix(&self, buf: &[u8]) -> Option<(usize, std::ops::Range<usize>)> {
        if !self.frames {
            return None;
        }
        if self.counted() {
            return self.match_counted(buf).map(|(n, text, _)| (n, text));
        }
        let t = self.payload();
        for &(a, b) in &self.spans[..self.n_spans] {
            // Spans are in order: a `buf` too short for this head is too short for the next.
            let (head, rest) = (buf.get(..a)?, &buf[a..]);
            if head != &t[..a] {
                continue;
            }
            let end = a + text_len(rest);
            let tail = &t[b..];
            if end > a && buf.get(end..end + tail.len()) == Some(tail) {
                return Some((end + tail.len(), a..end));
            }
        }
        None
    }

    /// The template as learned (the payload of its event).
    fn payload(&self) -> &[u8] {
        let end = self.event_len.saturating_sub(TRAIL.len());
        self.bytes.get(LEAD.len()..end).unwrap_or_default()
    }

    /// The template's event (`data: <payload>\n\n`).
    fn event(&self) -> &[u8] {
        self.bytes.get(..self.event_len).unwrap_or_default()
    }

    /// [`RepeatCache::repeats_event`] for a template of one span, in two comparisons: `buf`
    /// opens with `data: ` and the template's payload up to its span (one comparison with the
    /// template's event), plain text, then the rest of the payload and a blank line `\n\n`
    /// (one more), or the rest and `\r\n\r\n`. Exactly what the general path
    /// ([`Template::match_prefix`] on the payload after `data: `, then the blank line) finds for
    /// one span; the caller checked [`Template::is_one_line`].
    #[inline(always)]
    fn match_event_one_span(&self, buf: &[u8]) -> Option<(usize, std::ops::Range<usize>)> {
        let w = self.event();
        let (a, b) = self.spans[0];
        let (a, b) = (a + LEAD.len(), b + LEAD.len());
        if buf.get(..a)? != &w[..a] {
            return None;
        }
        let end = a + text_len(&buf[a..]);
        if end == a {
            return None;
        }
        let tail = &w[b..];
        if buf.get(end..end + tail.len()) == Some(tail) {
            let n = end + tail.len();
            return Some((n, LEAD.len()..n - TRAIL.len()));
        }
        let tail = &tail[..tail.len() - TRAIL.len()];
        let n = end + tail.len();
        if buf.get(end..n) == Some(tail) && buf.get(n..n + 4) == Some(&b"\r\n\r\n"[..]) {
            return Some((n + 4, LEAD.len()..n));
        }
        None
    }

    /// [`Template::match_event_one_span`] over and over: how many events at `buf`'s start
    /// repeat this one-span, one-line template, and the bytes they span. Between the texts of
    /// two repeats in a row, `\n\n`-ended, the bytes are the template's own (the rest of its
    /// payload, the blank line, `data: ` and its payload up to the span): one comparison for
    /// both, not one for the first one's tail and one for the next one's head (after an event
    /// ended by `\r\n\r\n`, one each).
    #[inline]
    fn run_one_span(&self, buf: &[u8]) -> (u64, usize) {
        let w = self.bytes.as_slice();
        let (a, b) = self.spans[0];
        let (a, b) = (a + LEAD.len(), b + LEAD.len());
        let (Some(head), Some(tail), Some(joint)) =
            (w.get(..a), w.get(b..self.event_len), w.get(b..))
        else {
            return (0, 0);
        };
        let Some(mut rest) = buf.strip_prefix(head) else {
            return (0, 0);
        };
        // `rest`: what follows the head of an event whose head matched (its text first); the
        // loop keeps only it and the count live, so both stay in registers across the
        // comparison's call.
        let mut n = 0;
        loop {
            let k = text_len(rest);
            if k == 0 {
                break;
            }
            let after = &rest[k..];
            if let Some(next) = after.strip_prefix(joint) {
                n += 1;
                rest = next;
                continue;
            }
            if let Some(r) = after.strip_prefix(tail) {
                return (n + 1, buf.len() - r.len());
            }
            let t = &tail[..tail.len() - TRAIL.len()];
            match after
                .strip_prefix(t)
                .and_then(|r| r.strip_prefix(b"\r\n\r\n"))
            {
                // Ended by `\r\n\r\n`: the next one's head is compared on its own.
                Some(r) => {
                    n += 1;
                    match r.strip_prefix(head) {
                        Some(next) => rest = next,
                        None => return (n, buf.len() - r.len()),
                    }
                }
                None => break,
            }
        }
        // `rest` follows the head of an event that is no repeat: the run ends at that head.
        (n, buf.len() - rest.len() - a)
    }

    /// [`Template::run_one_span`] for a template with counts whose text comes first
    /// ([`Holes::text_first`]): the events at `buf`'s start that repeat it, each ended by
    /// `\n\n`, one after the other, as [`RepeatCache::repeats_event`] finds them; `each` gets
    /// each one's counts as it is found. Returns the bytes they span. Between the last count
    /// of one and the text of the next, the bytes are the template's own (the rest of its
    /// payload, the blank line, `data: ` and its payload up to the text): one comparison for
    /// both. An event ended by `\r\n\r\n` ends the run (`repeats_event` takes it).
    #[inline]
    fn run_counted(&self, buf: &[u8], mut each: impl FnMut(&Values)) -> usize {
        let w = self.bytes.as_slice();
        let t = self.payload();
        let Some((a, b)) = self.holes.text_first() else {
            return 0;
        };
        let (a, b) = (a + LEAD.len(), b + LEAD.len());
        let (Some(head), Some(tail), Some(joint)) =
            (w.get(..a), w.get(b..self.event_len), w.get(b..))
        else {
            return 0;
        };
        let Some(mut rest) = buf.strip_prefix(head) else {
            return 0;
        };
        let mut taken = 0;
        while let Some((after, values)) = self.holes.fill(t, rest) {
            if let Some(next) = after.strip_prefix(joint) {
                each(&values);
                taken = buf.len() - next.len() - head.len();
                rest = next;
                continue;
            }
            if let Some(r) = after.strip_prefix(tail) {
                each(&values);
                taken = buf.len() - r.len();
            }
            break;
        }
        taken
    }

    /// [`Template::match_prefix`] may frame by this template: it holds no line end but in a
    /// run at its end that ends with `\n`.
    pub fn frames(&self) -> bool {
        self.n_spans > 0 && self.frames
    }

    /// The template holds no line end at all (an SSE `data:` payload that was one line).
    pub fn is_one_line(&self) -> bool {
        self.n_spans > 0 && self.one_line
    }

    /// `bytes` is the template with other non-empty plain text in one output span: the range
    /// of that text in `bytes`.
    pub fn repeats(&self, bytes: &[u8]) -> Option<std::ops::Range<usize>> {
        if self.counted() {
            return self
                .match_counted(bytes)
                .and_then(|(n, text, _)| (n == bytes.len()).then_some(text));
        }
        let t = self.payload();
        self.spans[..self.n_spans].iter().find_map(|&(a, b)| {
            let tail = t.len() - b;
            let end = bytes.len().checked_sub(tail)?;
            let hit = end > a
                && bytes[..a] == t[..a]
                && bytes[end..] == t[b..]
                && text_len(&bytes[a..end]) == end - a;
            hit.then_some(a..end)
        })
    }
}

/// What [`RepeatCache::inspect`] did with an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// It repeats the template; its output text is this range of the event.
    Repeat(std::ops::Range<usize>),
    /// Scanned, and kept as the new template.
    Learned,
    /// Scanned, not kept (no valid chunk, or no output text to vary): the template stays.
    Scanned,
}

/// One stream's template and what inspection said about it. See the module docs.
#[derive(Debug, Clone)]
pub struct RepeatCache {
    template: Template,
    info: ChunkInfo,
    /// The template's one choice, when it has exactly one ([`RepeatCache::single`]).
    single: Option<ChoiceInfo>,
    /// The template's one choice, when it has exactly one and usage counts beside it
    /// ([`RepeatCache::single_counted`]).
    single_counted: Option<ChoiceInfo>,
    /// The plain prefix ([`EventScan::plain_prefix`]) of the first scanned event that had
    /// one, when it fits in [`PREFIX_ROOM`] bytes: the events the template does not answer
    /// (the role, finish and usage chunks) open with it too, and their scans start after it
    /// ([`RepeatCache::scan_logged`]). Kept in place: the event path allocates nothing.
    prefix: [u8; PREFIX_ROOM],
    prefix_len: usize,
    /// The plain prefix holds no line end ([`RepeatCache::scan_framed`] may frame by it).
    prefix_one_line: bool,
}

impl Default for RepeatCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Longest plain prefix kept: vLLM's `{"id":"chatcmpl-<32 hex>","object":"chat.completion.chunk",
/// "created":<10 digits>,"model":"<name>",` is 115 bytes and the model name.
const PREFIX_ROOM: usize = 192;

/// Room a stream's template takes up front (its event: `data: `, the payload, a blank line;
/// then `data: ` and its payload up to its span again): a vLLM chunk is 200-300 bytes.
pub const TEMPLATE_ROOM: usize = 512;

impl RepeatCache {
    pub fn new() -> Self {
        Self {
            template: Template::default(),
            info: ChunkInfo::of_kind(ChunkKind::Unknown),
            single: None,
            single_counted: None,
            prefix: [0; PREFIX_ROOM],
            prefix_len: 0,
            prefix_one_line: false,
        }
    }

    /// A cache with room for a template of `bytes` (see [`Template::with_capacity`]).
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            template: Template::with_capacity(bytes),
            ..Self::new()
        }
    }

    /// What [`inspect_chunk`](super::inspect_chunk) says about `data`, from the template when
    /// `data` repeats it, else from a scan ([`RepeatCache::scan_logged`]).
    pub fn inspect(&mut self, data: &[u8]) -> (ChunkInfo, Seen) {
        if let Some(hit) = self.repeats(data) {
            return hit;
        }
        let scan = self.scan(data, None);
        let seen = self.learn_scanned(data, &scan);
        (scan.info, seen)
    }

    /// [`scan_event_logged`](super::scan_event_logged) of `data`, from the end of the plain
    /// prefix this cache holds when `data` opens with it (its bytes read as the same plain
    /// members: see [`crate::scan::Cursor::resume_object`]); else from the start, and the
    /// first plain prefix found is kept.
    pub fn scan_logged(&mut self, data: &[u8], log: &mut TokenLog) -> EventScan {
        self.scan(data, Some(log))
    }

    /// [`RepeatCache::scan_logged`] into `scan`, which must be as [`EventScan::unknown`] made
    /// it (the caller's: no move of the scan on its way back).
    pub fn scan_logged_to(&mut self, data: &[u8], log: &mut TokenLog, scan: &mut EventScan) {
        self.scan_to(data, Some(log), scan);
    }

    /// The plain prefix kept (empty before the first scanned event that had one).
    pub fn plain_prefix(&self) -> &[u8] {
        self.prefix.get(..self.prefix_len).unwrap_or_default()
    }

    fn scan(&mut self, data: &[u8], log: Option<&mut TokenLog>) -> EventScan {
        let mut scan = EventScan::unknown();
        self.scan_to(data, log, &mut scan);
        scan
    }

    fn scan_to(&mut self, data: &[u8], mut log: Option<&mut TokenLog>, scan: &mut EventScan) {
        let p = self.prefix_len;
        if p > 0 && data.get(..p) == Some(self.plain_prefix()) {
            // Past the prefix, a shape an earlier stream of this thread showed may answer (a
            // traced request's log notes every text: it scans).
            let shapes = !log.as_deref().is_some_and(|l| l.detail);
            if shapes && shapes::answer(data, p, log.as_deref_mut(), scan) {
                return;
            }
            scan_event_to(data, p, log.as_deref_mut(), scan);
            if shapes && log.as_deref().is_none_or(TokenLog::is_empty) {
                shapes::learn(data, p, scan, false);
            }
            return;
        }
        // The stream's first scanned event (no prefix kept yet): past its own plain prefix,
        // a shape may answer too (vLLM's role chunk is the same in every stream past it).
        let first = p == 0 && !log.as_deref().is_some_and(|l| l.detail);
        match first.then(|| super::prefix::prefix_end(data)).flatten() {
            Some(end) if shapes::answer(data, end, log.as_deref_mut(), scan) => {}
            Some(end) => {
                scan_event_to(data, end, log.as_deref_mut(), scan);
                if log.as_deref().is_none_or(TokenLog::is_empty) {
                    shapes::learn(data, end, scan, true);
                }
            }
            None => scan_event_to(data, 0, log, scan),
        }
        if p == 0 {
            self.keep_prefix(data, scan.plain_prefix);
        }
    }

    /// The stream's first scanned event (payload `data`, its plain prefix `plain` bytes long):
    /// its plain prefix is kept when it fits.
    #[inline]
    fn keep_prefix(&mut self, data: &[u8], plain: usize) {
        if let (Some(slot), Some(bytes)) = (self.prefix.get_mut(..plain), data.get(..plain)) {
            slot.copy_from_slice(bytes);
            self.prefix_len = plain;
            self.prefix_one_line = memchr::memchr2(b'\n', b'\r', bytes).is_none();
        }
    }

    /// The SSE event at `buf`'s start (`buf` from an event's start), framed and read by a
    /// shape this thread kept ([`shapes::answer_framed`]) past the plain prefix this cache
    /// holds (before it holds one, past the prefix of the thread's last stream:
    /// [`RepeatCache::scan_first_framed`]): `data: <payload>\n\n`. Returns its length and the payload's range in `buf`;
    /// the payload's scan is in `scan` (as [`EventScan::unknown`] made it), what
    /// [`RepeatCache::scan_logged_to`] says of the payload. An SSE parser cuts the same event
    /// there and hands over the same payload: it is one line (the prefix holds no line end,
    /// nor does what the shape frames) no longer than the parser keeps, and a blank line
    /// follows. `None`: no shape frames it (nothing changed; a traced request's log notes
    /// every text, so it is never framed here).
    #[inline]
    pub fn scan_framed(
        &mut self,
        buf: &[u8],
        log: &mut TokenLog,
        scan: &mut EventScan,
    ) -> Option<(usize, std::ops::Range<usize>)> {
        let p = self.prefix_len;
        let payload = buf.strip_prefix(LEAD)?;
        let max = MAX_LINE_BYTES - LEAD.len();
        if log.detail {
            return None;
        }
        if p == 0 {
            return self.scan_first_framed(payload, log, scan);
        }
        if !self.prefix_one_line || payload.get(..p) != Some(self.plain_prefix()) {
            return None;
        }
        let n = shapes::answer_framed(payload, p, max, Some(log), scan)?;
        Some((LEAD.len() + n + TRAIL.len(), LEAD.len()..LEAD.len() + n))
    }

    /// [`RepeatCache::scan_framed`] of the stream's first scanned event (no plain prefix kept
    /// yet: vLLM's role chunk), past the prefix the thread's last stream had
    /// ([`super::prefix::prefix_end_framed`], one line) and by a shape: what `scan_to` does
    /// for the parser's payload when both answer (the same prefix end, the same shape's answer,
    /// and its plain prefix kept), without the parser's search for the line end. The payload
    /// is one line: the prefix holds no line end, nor does what the shape frames. `None`:
    /// either does not answer (nothing changed; the parser frames it, and `scan_to` reads it).
    /// Out of line: once a stream, and `scan_framed` stays small for the others.
    #[inline(never)]
    fn scan_first_framed(
        &mut self,
        payload: &[u8],
        log: &mut TokenLog,
        scan: &mut EventScan,
    ) -> Option<(usize, std::ops::Range<usize>)> {
        let max = MAX_LINE_BYTES - LEAD.len();
        let end = super::prefix::prefix_end_framed(payload)?;
        let n = shapes::answer_framed(payload, end, max, Some(log), scan)?;
        self.keep_prefix(payload.get(..n)?, scan.plain_prefix);
        Some((LEAD.len() + n + TRAIL.len(), LEAD.len()..LEAD.len() + n))
    }

    /// The template's answer when `data` repeats it (with a template with counts, the counts
    /// `data` holds).
    pub fn repeats(&self, data: &[u8]) -> Option<(ChunkInfo, Seen)> {
        if self.template.counted() {
            let (n, text, values) = self.template.match_counted(data)?;
            if n != data.len() {
                return None;
            }
            let mut info = self.info;
            if let Some(u) = info.usage.as_mut() {
                patch(u, &self.template.counts, &values);
            }
            return Some((info, Seen::Repeat(text)));
        }
        let text = self.template.repeats(data)?;
        Some((self.info, Seen::Repeat(text)))
    }

    /// The meter's framing and template check in one (see [`Template::match_prefix`]): `buf`,
    /// where an SSE event starts, opens with an event `data: <payload>` and a blank line
    /// (`\n\n` or `\r\n\r\n`) whose payload repeats the template. Returns the event's length,
    /// and the payload's range in `buf`; the template's answer for the payload (what
    /// [`RepeatCache::repeats`] says of it) is [`RepeatCache::info`] then (a template with
    /// counts keeps there the counts of the last event it framed).
    // Always inlined: it runs for nearly every event, and the call was a tenth of its cost.
    #[inline(always)]
    pub fn repeats_event(&mut self, buf: &[u8]) -> Option<(usize, std::ops::Range<usize>)> {
        const DATA: &[u8] = LEAD;
        if !self.template.is_one_line() {
            return None; // a line end in the payload: the lines are the parser's to split
        }
        if self.template.n_spans == 1 {
            if self.template.counted() {
                return self.counted_event(buf);
            }
            return self.template.match_event_one_span(buf);
        }
        let payload = buf.strip_prefix(DATA)?;
        let (n, _) = self.template.match_prefix(payload)?;
        let blank = match &payload[n..] {
            [b'\n', b'\n', ..] => 2,
            [b'\r', b'\n', b'\r', b'\n', ..] => 4,
            _ => return None,
        };
        let at = DATA.len();
        Some((at + n + blank, at..at + n))
    }

    /// [`RepeatCache::repeats_event`] for a template with counts (one span, one line): the
    /// payload as [`RepeatCache::repeats`] matches it, then a blank line; the event's counts
    /// go into [`RepeatCache::info`].
    #[inline(never)]
    fn counted_event(&mut self, buf: &[u8]) -> Option<(usize, std::ops::Range<usize>)> {
        let payload = buf.strip_prefix(LEAD)?;
        let (n, _, values) = self.template.match_counted(payload)?;
        let blank = match payload.get(n..)? {
            [b'\n', b'\n', ..] => 2,
            [b'\r', b'\n', b'\r', b'\n', ..] => 4,
            _ => return None,
        };
        if let Some(u) = self.info.usage.as_mut() {
            patch(u, &self.template.counts, &values);
        }
        let at = LEAD.len();
        Some((at + n + blank, at..at + n))
    }

    /// The events at `buf`'s start that repeat a template with counts, each as
    /// [`RepeatCache::repeats_event`] finds it, one after the other (all of them, or fewer:
    /// see [`Template::run_counted`]; 0 for any other template): `each` gets the answer for
    /// each ([`RepeatCache::info`], its counts the event's) as it is found. Returns the bytes
    /// they span.
    #[inline]
    pub fn counted_run(&mut self, buf: &[u8], mut each: impl FnMut(&ChunkInfo)) -> usize {
        let t = &self.template;
        if !(t.is_one_line() && t.n_spans == 1 && t.counted()) {
            return 0;
        }
        let info = &mut self.info;
        t.run_counted(buf, |values| {
            if let Some(u) = info.usage.as_mut() {
                patch(u, &t.counts, values);
            }
            each(info);
        })
    }

    /// [`RepeatCache::repeats_event`] looks at events: the template holds no line end (else
    /// it leaves every event to the parser).
    #[inline]
    pub fn template_frames_one_line(&self) -> bool {
        self.template.is_one_line()
    }

    /// How many events at `buf`'s start repeat the template (each as
    /// [`RepeatCache::repeats_event`] finds it, one after the other), and the bytes they span.
    #[inline]
    pub fn repeats_in_a_row(&mut self, buf: &[u8]) -> (u64, usize) {
        if self.template.is_one_line() && self.template.n_spans == 1 && !self.template.counted() {
            return self.template.run_one_span(buf);
        }
        let (mut n, mut at) = (0, 0);
        while let Some((len, _)) = self.repeats_event(buf.get(at..).unwrap_or_default()) {
            n += 1;
            at += len;
        }
        (n, at)
    }

    /// What the template said: the answer for every event that repeats it.
    pub fn info(&self) -> &ChunkInfo {
        &self.info
    }

    /// The template's choice when it has exactly one (every vLLM stream with `n = 1`): then
    /// [`RepeatCache::info`] says no more than "this choice carries output" (a template
    /// finishes nothing and carries no usage or timings), and a meter can take a repeat in
    /// from it alone.
    #[inline]
    pub fn single(&self) -> Option<&ChoiceInfo> {
        self.single.as_ref()
    }

    /// The template's choice when it has exactly one and the template has count spans
    /// (continuous usage of a stream with `n = 1`): then [`RepeatCache::info`] says no more
    /// than "this choice carries output" and its usage (the counts of the last event framed),
    /// and a meter can take a repeat in from the two alone. `None` whenever
    /// [`RepeatCache::single`] is `Some`.
    #[inline]
    pub fn single_counted(&self) -> Option<&ChoiceInfo> {
        self.single_counted.as_ref()
    }

    /// `data` was scanned to `info`: keeps it as the template when it can be one and is worth
    /// it (learning is a pass over its bytes): a chunk with output that finishes nothing and
    /// carries no usage, what the events after it repeat.
    pub fn learn(&mut self, data: &[u8], info: &ChunkInfo) -> Seen {
        self.learn_with(info, |t| info.usage.is_none() && t.learn(data))
    }

    /// [`RepeatCache::learn`] from `scan`, the scan of `data`, with the output spans it noted
    /// ([`Template::learn_spans`]); a chunk with usage with the counts it noted too
    /// ([`Template::learn_counted`]: continuous usage).
    pub fn learn_scanned(&mut self, data: &[u8], scan: &EventScan) -> Seen {
        self.learn_with(&scan.info, |t| match scan.info.usage {
            None => t.learn_spans(data, &scan.output_spans),
            Some(_) => {
                !scan.counts.is_empty() && t.learn_counted(data, &scan.output_spans, &scan.counts)
            }
        })
    }

    /// `learn` keeps the template: a chunk with output that finishes nothing and carries no
    /// `timings` (and no usage, unless `learn` kept counts for it).
    fn learn_with(&mut self, info: &ChunkInfo, learn: impl FnOnce(&mut Template) -> bool) -> Seen {
        let worth = info.kind == ChunkKind::Chunk
            && info.output
            && info.finished_count == 0
            && info.timings.is_none();
        if worth && learn(&mut self.template) {
            self.info = *info;
            // A template with usage says more than its choice: no single-choice answer, but
            // one with counts (its usage beside its choice) when the usage is the counts'.
            let one = info
                .choices()
                .first()
                .copied()
                .filter(|_| info.choice_count == 1);
            self.single = one.filter(|_| info.usage.is_none());
            self.single_counted = one.filter(|_| info.usage.is_some() && self.template.counted());
            Seen::Learned
        } else {
            Seen::Scanned
        }
    }
}

/// How many bytes at the start of `s` are JSON string text: plain bytes (no quote, backslash
/// or control character: `scan::plain_run`, eight at a time) and escapes as the scanner takes
/// them (`scan::escape_len`). It stops at the first byte that is neither (a closing quote
/// where `s` is a string's text) or at a backslash that opens no escape.
#[inline(always)]
pub(super) fn text_len(s: &[u8]) -> usize {
    // A token's text most often ends at a quote inside the first eight bytes: one step.
    if let Some(k) = plain_run_in_a_word(s) {
        if s.get(k) != Some(&b'\\') {
            return k;
        }
    }
    let mut i = 0;
    loop {
        i += plain_run(s.get(i..).unwrap_or_default());
        if s.get(i) != Some(&b'\\') {
            return i;
        }
        match s.get(i..).and_then(escape_len) {
            Some(len) => i += len,
            None => return i,
        }
    }
}

/// The text spans of the non-empty string values of [`OUTPUT_KEYS`] in `data`, a
/// valid JSON text; returns how many were written into `out`.
fn output_spans(data: &[u8], out: &mut [(usize, usize); MAX_SPANS]) -> usize {
    let mut n = 0;
    let mut at = 0;
    // The previous string: its text span and whether it held an escape.
    let mut prev: Option<(usize, usize, bool)> = None;
    // Byte loops, not `memchr`: between strings there are a few bytes, and a string's text
    // is read eight bytes at a time (`plain_run`); a call per string cost more than the search.
    while let Some(open) = data
        .get(at..)
        .and_then(|r| r.iter().position(|&c| c == b'"'))
    {
        let start = at + open + 1;
        let mut i = start;
        let mut escaped = false;
        let end = loop {
            let Some(rest) = data.get(i..) else {
                return n; // unterminated: not a valid text after all
            };
            i += plain_run(rest);
            match data.get(i) {
                None => return n,
                Some(b'"') => break i,
                Some(b'\\') => {
                    escaped = true;
                    i += 2;
                }
                Some(_) => i += 1, // a control byte: text to this loop (not valid JSON anyway)
            }
        };
        // A value when a colon precedes it; its key is then the string right before the colon.
        let before = data[..start - 1].trim_ascii_end();
        if let (Some(b':'), Some((ka, kb, key_escaped))) = (before.last(), prev) {
            let key_closes = before[..before.len() - 1].trim_ascii_end().len() == kb + 1;
            let output = key_closes && !key_escaped && OUTPUT_KEYS.contains(&&data[ka..kb]);
            if output && end > start && n < MAX_SPANS {
                out[n] = (start, end);
                n += 1;
            }
        }
        prev = Some((start, end, escaped));
        at = end + 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::inspect_chunk;
    use proptest::prelude::*;

    const HEAD: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":0,"delta":{"content":""#;
    const TAIL: &str = r#""},"logprobs":null,"finish_reason":null}]}"#;

    fn tok(text: &str) -> Vec<u8> {
        format!("{HEAD}{text}{TAIL}").into_bytes()
    }

    /// The `memchr` version `output_spans` had: the byte loops must find the same spans.
    fn output_spans_memchr(data: &[u8], out: &mut [(usize, usize); MAX_SPANS]) -> usize {
        let mut n = 0;
        let mut at = 0;
        let mut prev: Option<(usize, usize, bool)> = None;
        while let Some(open) = data.get(at..).and_then(|r| memchr::memchr(b'"', r)) {
            let start = at + open + 1;
            let mut i = start;
            let mut escaped = false;
            let end = loop {
                match data.get(i..).and_then(|r| memchr::memchr2(b'"', b'\\', r)) {
                    None => return n,
                    Some(k) if data[i + k] == b'\\' => {
                        escaped = true;
                        i += k + 2;
                    }
                    Some(k) => break i + k,
                }
            };
            let before = data[..start - 1].trim_ascii_end();
            if let (Some(b':'), Some((ka, kb, key_escaped))) = (before.last(), prev) {
                let key_closes = before[..before.len() - 1].trim_ascii_end().len() == kb + 1;
                let output = key_closes && !key_escaped && OUTPUT_KEYS.contains(&&data[ka..kb]);
                if output && end > start && n < MAX_SPANS {
                    out[n] = (start, end);
                    n += 1;
                }
            }
            prev = Some((start, end, escaped));
            at = end + 1;
        }
        n
    }

    proptest! {
        #[test]
        fn output_spans_are_found_as_memchr_found_them(pieces in proptest::collection::vec(
            prop::sample::select(vec![
                "\"content\"", "\"text\"", "\"reasoning\"", ":", " : ", ",", "{", "}", "[", "]",
                "\"", "\"abcdefghij\"", "\"x\\\"y\"", "\\", "\\\"", "\u{1}", "null", "\"\"",
                "\"conte\\u006et\"", "\"0123456789abcdef\"", "\n",
            ]),
            0..30,
        )) {
            let data = pieces.concat();
            let (mut a, mut b) = ([(0, 0); MAX_SPANS], [(0, 0); MAX_SPANS]);
            let (na, nb) = (output_spans(data.as_bytes(), &mut a), output_spans_memchr(data.as_bytes(), &mut b));
            prop_assert_eq!(&a[..na], &b[..nb], "{:?}", data);
        }
    }

    #[test]
    fn spans_are_the_output_values_only() {
        let data = br#"{"content":"a","x":{"text":"bc","reasoning":"","k":"content"},"reasoning_content":"d\"e","content" : "f"}"#;
        let mut out = [(0, 0); MAX_SPANS];
        let n = output_spans(data, &mut out);
        let texts: Vec<&[u8]> = out[..n].iter().map(|&(a, b)| &data[a..b]).collect();
        assert_eq!(texts, [&b"a"[..], b"bc", br#"d\"e"#, b"f"]);
    }

    #[test]
    fn a_stream_hits_after_its_second_token_and_misses_on_the_finish() {
        let mut c = RepeatCache::new();
        let finish = format!("{HEAD}x\"}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}");
        let events = [
            tok("Hello"),
            tok(" wor"),
            tok("ld"),
            finish.into_bytes(),
            tok(""),
        ];
        let mut hits = Vec::new();
        for e in &events {
            let (info, seen) = c.inspect(e);
            hits.push(matches!(seen, Seen::Repeat(_)));
            assert_eq!(info, inspect_chunk(e), "{}", String::from_utf8_lossy(e));
        }
        assert_eq!(hits, [false, true, true, false, false]);
    }

    /// A token that holds an escape (a line end, a quote, a backslash, `\u00e9`) repeats the
    /// template; a backslash that opens no escape is a miss (the scan finds no chunk).
    #[test]
    fn escaped_texts_repeat_and_bad_escapes_miss() {
        let mut c = RepeatCache::new();
        assert_eq!(c.inspect(&tok("Hello")).1, Seen::Learned);
        for (text, hit) in [
            (r"a\nb", true),
            (r#"\"q\""#, true),
            (r"\\", true),
            (r"\u00e9\/", true),
            (r"\x", false),
            (r"\u00g9", false),
            (r"a\", false),
        ] {
            let e = tok(text);
            let (info, seen) = c.inspect(&e);
            assert_eq!(matches!(seen, Seen::Repeat(_)), hit, "{text}");
            assert_eq!(info, inspect_chunk(&e), "{text}");
            let framed = format!("data: {}\n\n", String::from_utf8(e.clone()).unwrap());
            assert_eq!(c.repeats_event(framed.as_bytes()).is_some(), hit, "{text}");
        }
    }

    /// `match_prefix` on an event followed by anything is `repeats` on the event: the event's
    /// length and its text when it repeats the template, and a hit never names a prefix that
    /// `repeats` would not. Templates with line ends in the middle frame nothing.
    #[test]
    fn match_prefix_is_repeats_on_the_prefix() {
        let alphabet: &[u8] = b"ab \"\\:{}\n\r\x01\xc3\xa9";
        let hits = std::cell::Cell::new(0);
        let template = prop_oneof![
            Just(tok("Hi")),
            Just(format!("data: {}\n\n", String::from_utf8(tok("Hi")).unwrap()).into_bytes()),
            Just(format!("data: {}\r\n\r\n", String::from_utf8(tok("Hi")).unwrap()).into_bytes()),
            Just(br#"{"choices":[{"index":1,"delta":{"reasoning":"r","content":"c"},"finish_reason":null}]}"#.to_vec()),
            Just(b"data: {\"text\":\"a\",\n\"x\":1}\n\n".to_vec()),
        ];
        let edit = (
            any::<bool>(),
            0usize..400,
            0usize..4,
            proptest::collection::vec(0usize..alphabet.len(), 0..4),
        );
        let after = proptest::collection::vec(0usize..alphabet.len(), 0..6);
        proptest!(ProptestConfig::with_cases(3000), |(t in template, (inside, at, cut, insert) in edit, after in after)| {
            let mut tp = Template::default();
            prop_assert!(tp.learn(&t));
            let mut e = t.clone();
            let at = match tp.repeats(&e) {
                Some(text) if inside => text.start + at % (text.len() + 1),
                _ => at % (e.len() + 1),
            };
            let cut = cut.min(e.len() - at);
            e.splice(at..at + cut, insert.iter().map(|&i| alphabet[i]));
            let mut buf = e.clone();
            buf.extend(after.iter().map(|&i| alphabet[i]));
            let got = tp.match_prefix(&buf);
            if let Some((n, text)) = &got {
                hits.set(hits.get() + 1);
                prop_assert!(tp.frames());
                prop_assert_eq!(tp.repeats(&buf[..*n]), Some(text.clone()));
            }
            if tp.frames() {
                if let Some(text) = tp.repeats(&e) {
                    prop_assert_eq!(got, Some((e.len(), text)));
                }
            } else {
                prop_assert_eq!(got, None);
            }
        });
        assert!(hits.get() > 300, "{hits:?} hits");
    }

    /// Events built from a template by editing its bytes anywhere (inside or outside the text,
    /// quotes, escapes, control bytes, emptying it): the cache answers as a scan does.
    #[test]
    fn the_cache_answers_as_a_scan_does() {
        let base = [
            tok("Hi"),
            br#"{"choices":[{"index":0,"text":"ab","logprobs":null,"finish_reason":null}],"model":"m"}"#.to_vec(),
            br#"{"choices":[{"index":1,"delta":{"reasoning":"r","content":"c"},"finish_reason":null}]}"#.to_vec(),
            br#"{"choices":[{"index":0,"delta":{"content":"q"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#.to_vec(),
        ];
        let alphabet: &[u8] = b"ab \"\\:{}[],0nul\x01\xc3\xa9";
        let edit = (
            0usize..4,
            any::<bool>(),
            0usize..400,
            0usize..4,
            proptest::collection::vec(0usize..alphabet.len(), 0..4),
        );
        let (hits, misses) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        proptest!(ProptestConfig::with_cases(3000), |(edits in proptest::collection::vec(edit, 1..6))| {
            let mut c = RepeatCache::new();
            for (which, inside, at, cut, insert) in edits {
                let mut e = base[which].clone();
                let mut t = Template::default();
                t.learn(&e);
                // Half of the edits inside the text the template may vary.
                let at = match t.repeats(&e) {
                    Some(text) if inside => text.start + at % (text.len() + 1),
                    _ => at % (e.len() + 1),
                };
                let cut = cut.min(e.len() - at);
                let ins: Vec<u8> = insert.iter().map(|&i| alphabet[i]).collect();
                e.splice(at..at + cut, ins);
                let (info, seen) = c.inspect(&e);
                let counter = if matches!(seen, Seen::Repeat(_)) { &hits } else { &misses };
                counter.set(counter.get() + 1);
                prop_assert_eq!(info, inspect_chunk(&e), "{}", String::from_utf8_lossy(&e));
                prop_assert_eq!(c.inspect(&base[which]).0, inspect_chunk(&base[which]));
            }
        });
        // Not vacuous: edits inside the text hit, the others miss.
        assert!(
            hits.get() > 100 && misses.get() > 1000,
            "{hits:?} hits, {misses:?} misses"
        );
    }

    /// A scan that starts after the plain prefix the cache kept reads an event as a whole
    /// scan does (its answer, the moved ranges, its own plain prefix and every logged token),
    /// for events edited anywhere: inside the prefix, at its end, after it, with other
    /// members, whitespace, `"object":"error"`, logprobs and tool calls.
    #[test]
    fn a_scan_past_the_plain_prefix_reads_as_a_whole_scan() {
        let head =
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny","#;
        let base: Vec<Vec<u8>> = [
            format!(r#"{head}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}}"#),
            format!(r#"{head}"choices":[{{"index":0,"delta":{{"content":"Hi"}},"logprobs":{{"content":[{{"token":"Hi","logprob":-0.5}}]}},"finish_reason":null}}]}}"#),
            format!(r#"{head}"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"c","function":{{"name":"f","arguments":"{{}}"}}}}]}},"finish_reason":"tool_calls"}}]}}"#),
            format!(r#"{head}"choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":4}},"system_fingerprint":"fp","timings":{{"predicted_n":4}}}}"#),
            format!(r#"  {head} "error":{{"message":"x"}}}}"#),
            r#"{"object":"error","id":"x","choices":[]}"#.to_string(),
            r#"{"id":"x","object":"error","choices":[]}"#.to_string(),
            format!(r#"{head}"x":[1,{{"y":"z"}}],"choices":null}}"#),
        ]
        .map(String::into_bytes)
        .to_vec();
        let alphabet: &[u8] = b"ab \"\\:{}[],0nul\x01\xc3\xa9";
        let edit = (
            0usize..base.len(),
            0usize..120,
            0usize..3,
            proptest::collection::vec(0usize..alphabet.len(), 0..3),
        );
        let resumed = std::cell::Cell::new(0);
        proptest!(ProptestConfig::with_cases(3000), |(first in 0usize..base.len(), detail in any::<bool>(), edits in proptest::collection::vec(edit, 1..6))| {
            let mut c = RepeatCache::new();
            let mut log = TokenLog::new(detail);
            c.scan_logged(&base[first], &mut log);
            for (which, at, cut, insert) in edits {
                let mut e = base[which].clone();
                // Most edits near the end of the kept prefix (the resumed scan's first bytes).
                let at = (c.plain_prefix().len() + at).saturating_sub(60).min(e.len());
                let cut = cut.min(e.len() - at);
                e.splice(at..at + cut, insert.iter().map(|&i| alphabet[i]));
                if !c.plain_prefix().is_empty() && e.starts_with(c.plain_prefix()) {
                    resumed.set(resumed.get() + 1);
                }
                let (mut got_log, mut want_log) = (TokenLog::new(detail), TokenLog::new(detail));
                let got = c.scan_logged(&e, &mut got_log);
                let want = crate::inspect::scan_event_logged(&e, &mut want_log);
                prop_assert_eq!(&got, &want, "{}", String::from_utf8_lossy(&e));
                prop_assert_eq!(format!("{got_log:?}"), format!("{want_log:?}"));
            }
        });
        assert!(resumed.get() > 1000, "{resumed:?} scans resumed");
    }

    /// The spans a scan notes are the ones `output_spans` finds, on every event of every
    /// real capture: learning from the scan loses no hit on a real engine's stream.
    #[test]
    fn a_scan_notes_the_output_spans_output_spans_finds() {
        let mut with_spans = 0;
        for (name, raw) in crate::fixtures::CAPTURES {
            let body = crate::fixtures::parse_capture(raw).body;
            let mut p = crate::sse::SseParser::new();
            let mut check = |data: &[u8]| {
                let scan = crate::inspect::scan_event(data);
                let mut want = [(0, 0); MAX_SPANS];
                let n = output_spans(data, &mut want);
                assert_eq!(scan.output_spans.as_slice(), &want[..n], "{name}");
                with_spans += usize::from(n > 0);
            };
            p.feed(body, |ev| check(ev.data));
            p.finish(|ev| check(ev.data));
        }
        assert!(with_spans > 50, "{with_spans} events with spans");
    }

    /// Repeats in a row, counted at once, are the ones `repeats_event` finds one after the
    /// other: frames of repeats (texts with escapes, `\n\n` or `\r\n\r\n` blank lines)
    /// and other events, edited anywhere, for one-span and two-span templates.
    #[test]
    fn repeats_in_a_row_are_repeats_event_one_after_the_other() {
        let two = br#"{"choices":[{"index":1,"delta":{"reasoning":"r","content":"c"},"finish_reason":null}]}"#;
        let templates: Vec<Vec<u8>> = vec![tok("Hi"), two.to_vec()];
        let piece = prop_oneof![(0usize..6).prop_map(|i| [
            "a",
            " the",
            "x\\ny",
            "\\\"",
            "\\u00e9",
            "0123456789abcdefghij"
        ][i]
            .to_string()),];
        let alphabet: &[u8] = b"ab \"\\:{}\n\r";
        let counted = std::cell::Cell::new(0u64);
        proptest!(ProptestConfig::with_cases(3000), |(
            which in 0usize..2,
            events in proptest::collection::vec((piece, any::<bool>(), 0u8..8), 0..8),
            edit in proptest::option::of((0usize..2000, 0usize..3, proptest::collection::vec(0usize..alphabet.len(), 0..3))),
        )| {
            let mut c = RepeatCache::new();
            let t = &templates[which];
            c.learn(t, &inspect_chunk(t));
            let text = |x: &str| {
                let mut e = t.clone();
                let span = c.template.spans[0];
                e.splice(span.0..span.1, x.bytes());
                e
            };
            let mut buf = Vec::new();
            for (x, crlf, kind) in &events {
                let payload = match kind {
                    0 => br#"{"choices":[]}"#.to_vec(),
                    1 => text(""),
                    _ => text(x),
                };
                buf.extend_from_slice(b"data: ");
                buf.extend_from_slice(&payload);
                buf.extend_from_slice(if *crlf { b"\r\n\r\n" } else { b"\n\n" });
            }
            if let Some((at, cut, insert)) = edit {
                let at = at % (buf.len() + 1);
                let cut = cut.min(buf.len() - at);
                buf.splice(at..at + cut, insert.iter().map(|&i| alphabet[i]));
            }
            let (mut want_n, mut want_at) = (0u64, 0usize);
            while let Some((len, _)) = c.repeats_event(&buf[want_at..]) {
                want_n += 1;
                want_at += len;
            }
            counted.set(counted.get() + want_n);
            prop_assert_eq!(c.repeats_in_a_row(&buf), (want_n, want_at), "{}", String::from_utf8_lossy(&buf));
        });
        assert!(counted.get() > 3000, "{counted:?} repeats");
    }

    /// The one-choice answer of a template with counts is there exactly for a chunk of one
    /// choice with usage counts beside its output (continuous usage), and never beside the
    /// plain one-choice answer: a template without usage, one of two choices, one whose
    /// usage has no count to vary, one that finishes (not kept) have none.
    #[test]
    fn a_one_choice_template_with_counts_answers_by_its_choice() {
        let chunk = |choices: &str, usage: &str| {
            format!(
                r#"{{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{choices}]{usage}}}"#
            )
        };
        let one = r#"{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}"#;
        let two = format!(r#"{one},{{"index":1,"delta":{{"content":"Ho"}},"finish_reason":null}}"#);
        let done = r#"{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}"#;
        let counts = r#","usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}"#;
        // (payload, kept as a template, single, single with counts); counts are kept beside
        // one output span only.
        let cases = [
            (chunk(one, counts), true, false, true),
            (chunk(one, ""), true, true, false),
            (chunk(&two, counts), false, false, false),
            (chunk(&two, ""), true, false, false),
            (
                chunk(one, r#","usage":{"prompt_tokens":1.5}"#),
                false,
                false,
                false,
            ),
            (chunk(done, counts), false, false, false),
        ];
        for (payload, kept, single, counted) in cases {
            let mut c = RepeatCache::new();
            let data = payload.as_bytes();
            let scan = crate::inspect::scan_event(data);
            let seen = c.learn_scanned(data, &scan);
            assert_eq!(seen == Seen::Learned, kept, "{payload}");
            assert_eq!(c.single().is_some(), single, "{payload}");
            assert_eq!(c.single_counted().is_some(), counted, "{payload}");
            if counted {
                assert_eq!(c.single_counted(), scan.info.choices().first());
            }
        }
    }

    /// A template with counts: its run takes events exactly as `repeats_event` takes them one
    /// after the other (a prefix of them: never one it would not take, never another answer),
    /// on runs of repeats with other texts and counts, ended by `\n\n` or `\r\n\r\n`, with
    /// other events between them and bytes edited anywhere.
    #[test]
    fn a_counted_run_is_repeats_event_one_after_the_other() {
        let chunk = |text: &str, p: &str, c: &str| {
            format!(
                r#"{{"id":"c","choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}],"usage":{{"prompt_tokens":{p},"total_tokens":9,"completion_tokens":{c}}}}}"#
            )
            .into_bytes()
        };
        let alphabet: &[u8] = b"ab0 \"\\:{}\n\r";
        let taken = std::cell::Cell::new(0u64);
        proptest!(ProptestConfig::with_cases(3000), |(
            events in proptest::collection::vec((
                prop_oneof![
                    8 => prop_oneof![Just("a"), Just(" the"), Just("x\\ny"), Just("\\u00e9")],
                    1 => prop_oneof![Just(""), Just("q\"")],
                ],
                prop_oneof![
                    8 => prop_oneof![Just("5"), Just("12"), Just("0")],
                    1 => prop_oneof![Just("07"), Just("1.5"), Just("null")],
                ],
                prop_oneof![
                    8 => prop_oneof![Just("1"), Just("30"), Just("1234567890123456789")],
                    1 => Just("12345678901234567890"),
                ],
                prop_oneof![6 => Just(false), 1 => Just(true)],
                0u8..10,
            ), 0..10),
            edit in proptest::option::of((0usize..3000, 0usize..3, proptest::collection::vec(0usize..alphabet.len(), 0..3))),
        )| {
            let data = chunk("Hi", "5", "2");
            let mut c = RepeatCache::new();
            c.learn_scanned(&data, &crate::inspect::scan_event(&data));
            prop_assert!(c.single_counted().is_some());
            let mut buf = Vec::new();
            for (text, p, n, crlf, kind) in &events {
                let payload = match kind {
                    0 => br#"{"choices":[]}"#.to_vec(),
                    _ => chunk(text, p, n),
                };
                buf.extend_from_slice(b"data: ");
                buf.extend_from_slice(&payload);
                buf.extend_from_slice(if *crlf { b"\r\n\r\n" } else { b"\n\n" });
            }
            if let Some((at, cut, insert)) = edit {
                let at = at % (buf.len() + 1);
                let cut = cut.min(buf.len() - at);
                buf.splice(at..at + cut, insert.iter().map(|&i| alphabet[i]));
            }
            let mut want = Vec::new();
            let mut at = 0;
            while let Some((len, _)) = c.repeats_event(&buf[at..]) {
                at += len;
                want.push((at, c.info().usage));
            }
            let mut got = Vec::new();
            let run = c.counted_run(&buf, |info| got.push(info.usage));
            prop_assert!(got.len() <= want.len());
            prop_assert_eq!(run, got.len().checked_sub(1).map_or(0, |k| want[k].0));
            for (k, usage) in got.iter().enumerate() {
                prop_assert_eq!(*usage, want[k].1, "{}", String::from_utf8_lossy(&buf));
            }
            // It stops only where `repeats_event` stops or at a `\r\n`-ended event.
            if got.len() < want.len() {
                let next = got.len().checked_sub(1).map_or(0, |k| want[k].0);
                let end = want[got.len()].0;
                prop_assert!(buf[..end].ends_with(b"\r\n\r\n"), "{}", String::from_utf8_lossy(&buf[next..end]));
            }
            taken.set(taken.get() + got.len() as u64);
        });
        assert!(taken.get() > 2000, "{taken:?} taken by runs");
    }
}
