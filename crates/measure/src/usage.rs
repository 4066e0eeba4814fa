//! Exact token counts for streams whose client did not ask for usage (issue 4 item 4):
//! [`inject_include_usage`] adds `"stream_options":{"include_usage":true}` to the request and
//! [`UsageStripper`] removes what that changes from the response, so the client receives
//! byte-for-byte the stream it would have got without injection.
//!
//! What injection changes in a vLLM 0.32 stream (fixtures `stream-chat.txt` vs
//! `stream-chat-usage.txt`): one extra `"choices":[]` usage chunk before `[DONE]`, and
//! `"system_fingerprint"` moves from the finish chunk to that usage chunk. So the stripper holds
//! back each finish chunk until the next event: when that is the usage chunk, it re-inserts
//! `,"system_fingerprint":<value>` before the finish chunk's closing `}` and drops the usage
//! chunk; anything else releases the held chunk unchanged.
//!
//! What the engine sends of its own accord is never removed: an engine that puts `usage` on
//! chunks with choices (vLLM's `--enable-force-include-usage`, which also forces continuous
//! usage; the proxy never injects continuous usage) sends the final usage chunk whatever the
//! request says, so once such a chunk passed, the usage chunk passes too. SSE comment frames
//! (`: keep-alive`) that arrive while a finish chunk is held stay behind it, in order.
//!
//! Pure: request bytes in, request bytes out; frames in, frames out. Frames holding only whole
//! events that pass are returned as the same `Bytes` (no copy).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use crate::inspect::{scan_event, ChunkKind, Template, Usage, TEMPLATE_ROOM};
#[cfg(test)]
use crate::request::peek_request;
use crate::request::{lax_bool, object_fields, Lax};
use crate::sse::{SseParser, MAX_LINE_BYTES};

const INCLUDE_USAGE: &[u8] = br#""include_usage":true"#;

/// After a long run of events that did not repeat the template, it is learned again every this
/// many (see [`UsageStripper`]'s `misses`).
const RELEARN_EVERY: u32 = 32;

/// `n` is absent, null, or one (pydantic's lax int also takes `1.0` and `"1"`).
fn single_choice(n: Option<&RawValue>) -> bool {
    let Some(n) = n else { return true };
    let text = n.get().trim();
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    text == "null" || text.parse::<f64>().is_ok_and(|v| v == 1.0)
}

/// Byte offset of `inner` (a slice of `outer`) in `outer`.
fn offset_in(outer: &[u8], inner: &str) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

fn splice(body: &[u8], at: usize, remove: usize, insert: &[&[u8]]) -> Vec<u8> {
    let extra: usize = insert.iter().map(|s| s.len()).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    out.extend_from_slice(&body[..at]);
    for s in insert {
        out.extend_from_slice(s);
    }
    out.extend_from_slice(&body[at + remove..]);
    out
}

/// Decide usage injection for a client request body. Returns the rewritten body when usage
/// is injected, `None` to leave the request alone. The rule is "the client gets what its engine
/// would have sent it": the proxy injects only where it knows the engine would have sent no
/// usage chunk, so that stripping the chunk restores the client's stream exactly.
///
/// Injected, for a stream (`stream` lax-true, see [`crate::request`]) with one choice:
/// - no `stream_options`, or `null`: every vLLM version sends no usage;
/// - `include_usage` lax-false or `null`: the client said no usage; it is set to `true`.
///
/// Left alone:
/// - `include_usage` lax-true: the client asked, the usage chunk is its own;
/// - `stream_options` without `include_usage` (e.g. `{}`): vLLM 0.32 sends no usage, newer
///   vLLM defaults `include_usage` to true; the proxy cannot know which it fronts, so it
///   counts tokens from events (`tokens_exact: false` unless usage arrives anyway);
/// - `continuous_usage_stats` lax-true: usage would ride on every chunk and could not be
///   removed byte-exactly;
/// - `n` above 1: every finish chunk would lose its `system_fingerprint` to the usage chunk,
///   and one that came long before could only be restored by holding it back;
/// - anything the engine would refuse (a `stream_options` or flag that is not a boolean to
///   pydantic, a body that is not a JSON object, invalid UTF-8): the engine answers it,
///   unchanged.
pub fn inject_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    // Invalid UTF-8 is no JSON to the engine (a 400); serde_json skips ignored strings
    // without checking it, so it is checked here (found by the rewriter's proptest).
    let text = std::str::from_utf8(body).ok()?;
    // Of a key given twice the engine reads the last: that is the one read and rewritten.
    let [stream, stream_options, n] =
        object_fields(text.as_bytes(), ["stream", "stream_options", "n"])?;
    if !lax_bool(stream).is_true() || !single_choice(n) {
        return None;
    }
    let Some(opts) = stream_options else {
        // No stream_options: add the key before the object's closing brace.
        let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
        if body[end] != b'}' {
            return None;
        }
        return Some(splice(
            body,
            end,
            0,
            &[br#","stream_options":{"#, INCLUDE_USAGE, b"}"],
        ));
    };
    let opts_at = offset_in(body, opts.get());
    let text = opts.get();
    if text == "null" {
        return Some(splice(
            body,
            opts_at,
            text.len(),
            &[b"{", INCLUDE_USAGE, b"}"],
        ));
    }
    if !text.starts_with('{') {
        return None;
    }
    let [include_usage, continuous_usage_stats] =
        object_fields(text.as_bytes(), ["include_usage", "continuous_usage_stats"])?;
    if lax_bool(continuous_usage_stats) == Lax::Invalid
        || lax_bool(continuous_usage_stats).is_true()
    {
        return None;
    }
    let v = include_usage?; // absent: the engine's default decides (see above)
    match lax_bool(Some(v)) {
        Lax::Bool(false) | Lax::Unset => Some(splice(
            body,
            offset_in(body, v.get()),
            v.get().len(),
            &[b"true"],
        )),
        Lax::Bool(true) | Lax::Invalid => None,
    }
}

/// Finds event boundaries (a blank line) in a byte stream split anywhere.
#[derive(Debug, Default)]
struct Boundaries {
    /// No byte on the current line yet.
    line_has_bytes: bool,
    /// The previous byte was a `\r` inside an event: a leading `\n` continues that line end.
    after_cr: bool,
}

impl Boundaries {
    /// At a line's start with no line end pending: where an event may start.
    fn at_line_start(&self) -> bool {
        !self.line_has_bytes && !self.after_cr
    }

    /// The end (exclusive) of the next event in `buf[from..]`, if one completes there. When the
    /// event ends with `\r` as the last byte of `buf`, `ended_on_cr` is set: a `\n` opening the
    /// next frame still belongs to this event.
    fn next(&mut self, buf: &[u8], mut i: usize, ended_on_cr: &mut bool) -> Option<usize> {
        *ended_on_cr = false;
        loop {
            if self.after_cr && i < buf.len() {
                self.after_cr = false;
                if buf[i] == b'\n' {
                    i += 1;
                }
            }
            let Some(k) = memchr::memchr2(b'\n', b'\r', &buf[i..]) else {
                if i < buf.len() {
                    self.line_has_bytes = true;
                }
                return None;
            };
            let p = i + k;
            let blank = k == 0 && !self.line_has_bytes;
            self.line_has_bytes = false;
            let mut end = p + 1;
            if buf[p] == b'\r' {
                match buf.get(p + 1) {
                    Some(b'\n') => end += 1,
                    Some(_) => {}
                    None if blank => *ended_on_cr = true,
                    None => self.after_cr = true,
                }
            }
            if blank {
                return Some(end);
            }
            i = end;
        }
    }
}

/// What happened to the last complete event (for a `\n` that arrives in the next frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Passed,
    Held,
    Dropped,
}

/// The output of one `push`: one slice of the frame when possible, else a list of pieces
/// (slices of the frame and the few bytes the stripper itself holds or rewrites). Never a copy
/// of the frame: when the engine packs a whole stream into one frame, the part before a held
/// finish chunk stays a slice of it (copying it made the stripper the proxy's biggest `memcpy`).
enum Out {
    Empty,
    Range(usize, usize),
    Pieces(Vec<Bytes>),
}

impl Out {
    #[inline]
    fn range(&mut self, frame: &Bytes, a: usize, b: usize) {
        if a == b {
            return;
        }
        match self {
            Out::Empty => *self = Out::Range(a, b),
            Out::Range(x, y) if *y == a => *self = Out::Range(*x, b),
            _ => self.piece(frame, frame.slice(a..b)),
        }
    }
    fn piece(&mut self, frame: &Bytes, piece: Bytes) {
        if piece.is_empty() {
            return;
        }
        match self {
            Out::Empty => *self = Out::Pieces(vec![piece]),
            Out::Range(x, y) => *self = Out::Pieces(vec![frame.slice(*x..*y), piece]),
            Out::Pieces(v) => v.push(piece),
        }
    }
    fn into_pieces(self, frame: &Bytes, out: &mut VecDeque<Bytes>) {
        match self {
            Out::Empty => {}
            Out::Range(a, b) => out.push_back(frame.slice(a..b)),
            Out::Pieces(v) => out.extend(v),
        }
    }
}

enum Class {
    /// A `choices:[]` chunk with `usage`: the injected one. Carries `system_fingerprint`'s raw
    /// JSON text, if any, and the usage it reports (the meter never sees this chunk).
    Usage(Option<Bytes>, Option<Usage>),
    /// A chunk where some choice finishes, without usage; whether it has a fingerprint.
    Finish {
        has_fingerprint: bool,
    },
    Other,
}

/// Removes the injected usage chunk from a stream (see the module docs). Call
/// [`UsageStripper::push`] for every frame and [`UsageStripper::finish`] at the end.
#[derive(Debug, Default)]
pub struct UsageStripper {
    bounds: Boundaries,
    parser: SseParser,
    /// The bytes of an event not complete yet.
    partial: BytesMut,
    /// A finish chunk waiting to see whether the usage chunk follows.
    held: Option<Bytes>,
    held_has_fingerprint: bool,
    /// Comment-only events that came while a finish chunk was held: they go out right after
    /// it, whatever happens to the usage chunk.
    held_comments: BytesMut,
    /// A chunk with choices carried `usage`: the engine reports usage of its own accord, so
    /// its final usage chunk is the client's too and passes.
    engine_usage: bool,
    /// The last event ended on a `\r` at the end of a frame: a leading `\n` shares its fate.
    trailing_cr: Option<Fate>,
    /// The held bytes passed [`MAX_LINE_BYTES`]: everything was released and the rest of the
    /// stream passes unchanged (the usage chunk, if any, reaches the client).
    gave_up: bool,
    /// The usage of the last chunk removed, until [`UsageStripper::take_removed_usage`].
    removed: Option<Usage>,
    /// The last event classified [`Class::Other`]: an event that repeats it but for its text
    /// is `Other` too (see `inspect::repeat`), without the prefilter's passes.
    other: Template,
    /// Events classified `Other` since the template last answered for one. A stream whose
    /// events never repeat (logprobs ride on every chunk) would pay a learn (~2,000
    /// instructions) per event: after a miss the template is learned again only at the 1st,
    /// 2nd, 4th, 8th, 16th and then every [`RELEARN_EVERY`]th miss in a row, so such a stream
    /// learns about once in 32 events, a plain stream (a miss is one odd token between
    /// repeats) still learns at once, and one that turns plain after a long run of misses
    /// is framed by a template again within 32 events.
    misses: u32,
    /// Tests: every event cut and classified (the reference the one-look path is held to).
    #[cfg(test)]
    cut_only: bool,
    /// Tests: events passed by the one-look path.
    #[cfg(test)]
    one_look: usize,
    /// Tests: templates learned.
    #[cfg(test)]
    learns: usize,
}

impl UsageStripper {
    pub fn new() -> Self {
        Self {
            other: Template::with_capacity(TEMPLATE_ROOM),
            ..Self::default()
        }
    }

    /// The stripper stopped stripping because the bytes it held passed the SSE parser's line
    /// limit (see [`UsageStripper::push`]).
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// The usage the last removed chunk reported, once (the client never sees that chunk, so
    /// whoever meters the stripped stream must be told).
    pub fn take_removed_usage(&mut self) -> Option<Usage> {
        self.removed.take()
    }

    /// Feed one upstream frame; returns the bytes to send to the client now (possibly empty).
    /// Memory is bounded: when an incomplete event and a held finish chunk together pass
    /// [`MAX_LINE_BYTES`] (the SSE parser's own limit), both are released unchanged and the
    /// stripper passes every later frame through as it is.
    pub fn push(&mut self, frame: Bytes) -> Bytes {
        let mut pieces = VecDeque::new();
        self.push_into(frame, &mut pieces);
        match pieces.len() {
            0 => Bytes::new(),
            1 => pieces.pop_front().unwrap_or_default(),
            _ => {
                let mut all = BytesMut::new();
                pieces.iter().for_each(|p| all.extend_from_slice(p));
                all.freeze()
            }
        }
    }

    /// [`UsageStripper::push`] without joining what goes out: the pieces, in order, appended
    /// to `out` (slices of `frame` where the bytes pass unchanged; the proxy's strip body sends
    /// each as a frame).
    pub fn push_into(&mut self, frame: Bytes, pieces: &mut VecDeque<Bytes>) {
        if self.gave_up || frame.is_empty() {
            // Keeps `trailing_cr` for the `\n` that may open the next frame.
            if !frame.is_empty() {
                pieces.push_back(frame);
            }
            return;
        }
        let mut out = Out::Empty;
        let mut start = 0;
        if let Some(fate) = self.trailing_cr.take() {
            if frame.first() == Some(&b'\n') {
                start = 1;
                match fate {
                    Fate::Passed => out.range(&frame, 0, 1),
                    Fate::Held => self.extend_held(b"\n"),
                    Fate::Dropped => {}
                }
            }
        }
        let mut on_cr = false;
        loop {
            if let Some(len) = self.repeat_at(&frame[start..]) {
                // What the loop below does with an `Other` event, without cutting it.
                self.misses = 0;
                #[cfg(test)]
                {
                    self.one_look += 1;
                }
                self.release_held(&frame, &mut out);
                out.range(&frame, start, start + len);
                start += len;
                continue;
            }
            let Some(end) = self.bounds.next(&frame, start, &mut on_cr) else {
                break;
            };
            let (event, from_frame) = if self.partial.is_empty() {
                (frame.slice(start..end), true)
            } else {
                self.partial.extend_from_slice(&frame[start..end]);
                (self.partial.split().freeze(), false)
            };
            let fate = self.on_event(event, &frame, &mut out, from_frame.then_some((start, end)));
            if on_cr {
                self.trailing_cr = Some(fate);
            }
            start = end;
        }
        if start < frame.len() {
            self.partial.extend_from_slice(&frame[start..]);
        }
        let held = self.held.as_ref().map_or(0, Bytes::len) + self.held_comments.len();
        if self.partial.len() + held > MAX_LINE_BYTES {
            self.gave_up = true;
            self.release_held(&frame, &mut out);
            let partial = self.partial.split();
            out.piece(&frame, partial.freeze());
            self.partial = BytesMut::new();
        }
        out.into_pieces(&frame, pieces);
    }

    /// Framing and classification in one look: an event starts at `rest[0]` and repeats the
    /// `Other` template (`Template::match_prefix`, which frames only by a template that is one
    /// `data:` line and its blank line): its length. The bytes it spans are the event
    /// [`Boundaries`] would cut there, and [`UsageStripper::classify`] would find it `Other`
    /// by the same template, so neither is needed (`fast_path_strips_as_the_cut_path_does`).
    fn repeat_at(&self, rest: &[u8]) -> Option<usize> {
        #[cfg(test)]
        if self.cut_only {
            return None;
        }
        if !self.partial.is_empty() || !self.bounds.at_line_start() {
            return None;
        }
        self.other.match_prefix(rest).map(|(len, _)| len)
    }

    /// End of stream: whatever is held or incomplete goes out unchanged.
    pub fn finish(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        if let Some(h) = self.held.take() {
            out.extend_from_slice(&h);
        }
        out.extend_from_slice(&self.held_comments.split());
        out.extend_from_slice(&self.partial.split());
        out.freeze()
    }

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

    fn release_held(&mut self, frame: &Bytes, out: &mut Out) {
        if let Some(h) = self.held.take() {
            out.piece(frame, h);
        }
        self.release_comments(frame, out);
    }

    fn release_comments(&mut self, frame: &Bytes, out: &mut Out) {
        if !self.held_comments.is_empty() {
            out.piece(frame, self.held_comments.split().freeze());
        }
    }

    fn on_event(
        &mut self,
        event: Bytes,
        frame: &Bytes,
        out: &mut Out,
        range: Option<(usize, usize)>,
    ) -> Fate {
        if self.held.is_some() && comment_only(&event) {
            self.held_comments.extend_from_slice(&event);
            return Fate::Held;
        }
        match self.classify(&event) {
            Class::Usage(..) if self.engine_usage => {
                self.release_held(frame, out);
                match range {
                    Some((a, b)) => out.range(frame, a, b),
                    None => out.piece(frame, event),
                }
                Fate::Passed
            }
            Class::Usage(fingerprint, usage) => {
                if usage.is_some() {
                    self.removed = usage;
                }
                if let Some(h) = self.held.take() {
                    match fingerprint.filter(|_| !self.held_has_fingerprint) {
                        Some(fp) => out.piece(frame, Bytes::from(insert_fingerprint(&h, &fp))),
                        None => out.piece(frame, h),
                    }
                }
                self.release_comments(frame, out);
                Fate::Dropped
            }
            Class::Finish { has_fingerprint } => {
                self.release_held(frame, out);
                self.held = Some(event);
                self.held_has_fingerprint = has_fingerprint;
                Fate::Held
            }
            Class::Other => {
                self.release_held(frame, out);
                match range {
                    Some((a, b)) => out.range(frame, a, b),
                    None => out.piece(frame, event),
                }
                Fate::Passed
            }
        }
    }

    fn classify(&mut self, event: &[u8]) -> Class {
        if self.other.repeats(event).is_some() {
            self.misses = 0;
            return Class::Other;
        }
        let class = if surely_other(event) {
            Class::Other
        } else {
            self.classify_scanned(event)
        };
        if matches!(class, Class::Other) {
            self.misses = self.misses.saturating_add(1);
            let relearn = self.misses.is_power_of_two() || self.misses % RELEARN_EVERY == 0;
            if relearn && one_data_line(event) {
                self.other.learn(event);
                #[cfg(test)]
                {
                    self.learns += 1;
                }
            }
        }
        class
    }

    /// Classifies by one scan of the event's data (no prefilter).
    fn classify_scanned(&mut self, event: &[u8]) -> Class {
        let mut class = Class::Other;
        let mut engine_usage = false;
        let mut on_data = |data: &[u8]| {
            let scan = scan_event(data);
            let info = &scan.info;
            if info.kind != ChunkKind::Chunk {
                return;
            }
            engine_usage |= info.choice_count > 0 && info.usage.is_some();
            if info.choice_count == 0 && info.usage.is_some() {
                let fp = scan
                    .fingerprint
                    .and_then(|r| data.get(r))
                    .map(Bytes::copy_from_slice);
                class = Class::Usage(fp, info.usage);
            } else if info.finished_count > 0 && info.usage.is_none() {
                class = Class::Finish {
                    has_fingerprint: scan.fingerprint.is_some(),
                };
            }
        };
        self.parser.feed(event, |ev| on_data(ev.data));
        self.parser.finish(|ev| on_data(ev.data));
        self.engine_usage |= engine_usage;
        class
    }
}

/// Every line of `event` is an SSE comment (`:` first) or blank: no data, nothing to classify.
fn comment_only(event: &[u8]) -> bool {
    event
        .split(|b| *b == b'\n' || *b == b'\r')
        .all(|line| line.is_empty() || line[0] == b':')
}

/// `event` is one `data:` line and its line ends: no byte outside its JSON holds a quote, so
/// it can be a [`Template`].
fn one_data_line(event: &[u8]) -> bool {
    let body = event.trim_ascii_end();
    body.starts_with(b"data:") && memchr::memchr2(b'\n', b'\r', body).is_none()
}

/// Cheap and conservative: true only when `event` surely classifies as [`Class::Other`], so
/// that an ordinary output event is not scanned by the stripper at all. A usage or finish
/// chunk needs a `usage` key or a `finish_reason` that is not `null`. The key's letters may be
/// written as `\u` escapes (no other escape gives a letter or `_`), so an event is scanned
/// when it holds `\u`, or the bytes `usage` anywhere, or a `finish_reason"` followed by
/// anything but `:` and `null` (JSON whitespace allowed between).
fn surely_other(event: &[u8]) -> bool {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    const KEY: &[u8] = b"finish_reason\"";
    // Built once: building a finder cost more than the search (callgrind, benches/event_cost).
    static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"usage"));
    static FINISH: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY));
    let unicode_escape =
        memchr::memchr_iter(b'\\', event).any(|at| event.get(at + 1) == Some(&b'u'));
    if unicode_escape || USAGE.find(event).is_some() {
        return false;
    }
    FINISH
        .find_iter(event)
        .all(|at| null_follows(&event[at + KEY.len()..]))
}

/// `rest` starts with `: null` (any JSON whitespace around the colon).
fn null_follows(rest: &[u8]) -> bool {
    let skip_ws = |b: &[u8]| -> usize {
        b.iter()
            .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
            .count()
    };
    let rest = &rest[skip_ws(rest)..];
    let Some(rest) = rest.strip_prefix(b":") else {
        return false;
    };
    rest[skip_ws(rest)..].starts_with(b"null")
}

/// `,"system_fingerprint":<fp>` before the last `}` of the event (its JSON object's end).
fn insert_fingerprint(event: &[u8], fp: &[u8]) -> Vec<u8> {
    match event.iter().rposition(|b| *b == b'}') {
        Some(at) => splice(event, at, 0, &[br#","system_fingerprint":"#, fp]),
        None => event.to_vec(),
    }
}

/// The rewriter's properties, shared with the fuzz target `rewrite`.
#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::capture;
    use proptest::prelude::*;

    #[test]
    fn injection_table() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"model":"m","stream":true}"#, Some(r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#)),
            ("{\"stream\": true ,\"x\":\"\\u00e9\"}\n", Some("{\"stream\": true ,\"x\":\"\\u00e9\",\"stream_options\":{\"include_usage\":true}}\n")),
            // `{}`: vLLM 0.32 sends no usage, newer vLLM does: the proxy cannot know, so it
            // leaves the request alone.
            (r#"{"stream":true,"stream_options":{}}"#, None),
            (r#"{"stream":true,"stream_options":{"x":1}}"#, None),
            (r#"{"stream":true,"stream_options":null}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":false}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":null,"x":1}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true,"x":1}}"#)),
            (r#"{"stream_options":{"continuous_usage_stats":false,"include_usage":false},"stream":true}"#, Some(r#"{"stream_options":{"continuous_usage_stats":false,"include_usage":true},"stream":true}"#)),
            (r#"{"stream_options":{"continuous_usage_stats":false},"stream":true}"#, None),
            // Lax booleans (pydantic): `stream: 1` streams; lax-false usage flags are a "no".
            (r#"{"stream":1}"#, Some(r#"{"stream":1,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":"true"}"#, Some(r#"{"stream":"true","stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":"yes"}"#, Some(r#"{"stream":"yes","stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":"on","n":"1"}"#, Some(r#"{"stream":"on","n":"1","stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":0}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":"no"}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":1}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":"true"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":"Yes"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":"true"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":1}}"#, None),
            // The engine refuses these: leave them for it to refuse, unchanged.
            (r#"{"stream":true,"stream_options":{"include_usage":"maybe"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":"x"}}"#, None),
            (r#"{"stream":"maybe"}"#, None),
            (r#"{"stream":2}"#, None),
            (r#"{"stream":true,"messages":[{"content":"\"stream_options\":{}"}]}"#, Some(r#"{"stream":true,"messages":[{"content":"\"stream_options\":{}"}],"stream_options":{"include_usage":true}}"#)),
            // The client asked for usage: untouched.
            (r#"{"stream":true,"stream_options":{"include_usage":true}}"#, None),
            // Continuous usage would put usage on every chunk: not removable byte-exactly.
            (r#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#, None),
            (r#"{"stream":false}"#, None),
            (r#"{"model":"m"}"#, None),
            (r#"{"stream":"no"}"#, None),
            (r#"{"stream":null}"#, None),
            (r#"{"stream":true,"stream_options":"x"}"#, None),
            // Several choices: the fingerprint cannot be restored on every finish chunk.
            (r#"{"stream":true,"n":2}"#, None),
            (r#"{"stream":true,"n":"2"}"#, None),
            (r#"{"stream":true,"n":1}"#, Some(r#"{"stream":true,"n":1,"stream_options":{"include_usage":true}}"#)),
            // A key given twice: the engine reads the last, so the proxy reads and rewrites it.
            (r#"{"stream":false,"stream":true}"#, Some(r#"{"stream":false,"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream":false}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":false}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}"#, None),
            (r#"{"stream":true,"n":2,"n":1}"#, Some(r#"{"stream":true,"n":2,"n":1,"stream_options":{"include_usage":true}}"#)),
            // A number no f64 holds is JSON all the same (Python reads `1e999` as infinity).
            (r#"{"stream":true,"x":1e999}"#, Some(r#"{"stream":true,"x":1e999,"stream_options":{"include_usage":true}}"#)),
            (r#"[{"stream":true}]"#, None),
            ("not json", None),
            ("", None),
        ];
        for (input, want) in cases {
            let got = inject_include_usage(input.as_bytes());
            let got = got.as_deref().map(|b| std::str::from_utf8(b).unwrap());
            assert_eq!(got, *want, "{input}");
            if let Some(out) = got {
                match serde_json::from_str::<serde_json::Value>(out) {
                    Ok(v) => assert_eq!(v["stream_options"]["include_usage"], true, "{input}"),
                    // `1e999`: JSON, but no `Value` holds it.
                    Err(e) => assert!(e.to_string().starts_with("number out of range"), "{e}"),
                }
            }
        }
    }

    #[test]
    fn real_requests() {
        let plain = capture("stream-chat.txt").request;
        let injected = inject_include_usage(plain).unwrap();
        let mut want: serde_json::Value = serde_json::from_slice(plain).unwrap();
        want["stream_options"] = serde_json::json!({"include_usage": true});
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&injected).unwrap(),
            want
        );
        assert_eq!(
            inject_include_usage(capture("stream-chat-usage.txt").request),
            None
        );
        assert_eq!(
            inject_include_usage(capture("nonstream-chat.txt").request),
            None
        );
    }

    fn strip_all(frames: &[&[u8]]) -> Vec<u8> {
        strip_all_usage(frames).0
    }

    /// The stripped bytes and the usage the stripper reported removing (taken after every
    /// frame, as the strip body does).
    fn strip_all_usage(frames: &[&[u8]]) -> (Vec<u8>, Option<Usage>) {
        let (out, usage, _) = strip_by(frames, false);
        (out, usage)
    }

    /// The usage capture with the plain capture's id, so the two differ only by injection.
    fn chat_pair() -> (Vec<u8>, Vec<u8>) {
        let plain = capture("stream-chat.txt").body.to_vec();
        let usage = capture("stream-chat-usage.txt").body;
        let usage = String::from_utf8(usage.to_vec())
            .unwrap()
            .replace("chatcmpl-ba42e38baeaee861", "chatcmpl-a45afd70d01f6372");
        (usage.into_bytes(), plain)
    }

    /// Completions: the same transformation written out by hand (no plain capture exists).
    fn completions_pair() -> (Vec<u8>, Vec<u8>) {
        let usage = capture("stream-completions.txt").body;
        let text = std::str::from_utf8(usage).unwrap();
        let fp = r#","system_fingerprint":"vllm-0.32.0-f1283a03""#;
        let usage_line = text
            .lines()
            .find(|l| l.contains(r#""choices":[]"#))
            .unwrap();
        let plain = text
            .replace(&format!("{usage_line}\n\n"), "")
            .replace(r#""finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}"#,
                &format!(r#""finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}}]{fp}}}"#));
        (usage.to_vec(), plain.into_bytes())
    }

    #[test]
    fn stripping_the_usage_capture_gives_the_plain_capture_byte_for_byte() {
        for (usage, plain) in [chat_pair(), completions_pair()] {
            assert_ne!(usage, plain);
            assert_eq!(strip_all(&[&usage]), plain);
            let frames: Vec<&[u8]> = usage.split_inclusive(|b| *b == b'\n').collect();
            assert_eq!(strip_all(&frames), plain, "line frames");
            let bytes: Vec<&[u8]> = usage.chunks(1).collect();
            assert_eq!(strip_all(&bytes), plain, "byte frames");
        }
    }

    #[test]
    fn crlf_and_cr_framing_strip_alike() {
        let (usage, plain) = chat_pair();
        for eol in ["\r\n", "\r"] {
            let conv = |b: &[u8]| {
                String::from_utf8(b.to_vec())
                    .unwrap()
                    .replace('\n', eol)
                    .into_bytes()
            };
            let (u, p) = (conv(&usage), conv(&plain));
            assert_eq!(strip_all(&[&u]), p, "{eol:?}");
            let bytes: Vec<&[u8]> = u.chunks(1).collect();
            assert_eq!(strip_all(&bytes), p, "{eol:?} byte frames");
            // Empty frames (a body may yield them) between every byte: a `\r` at the end of
            // a frame must still pair with a `\n` that comes after an empty frame.
            let with_empty: Vec<&[u8]> = u.chunks(1).flat_map(|b| [b, &[][..]]).collect();
            assert_eq!(
                strip_all(&with_empty),
                p,
                "{eol:?} byte frames with empty ones"
            );
        }
    }

    #[test]
    fn streams_without_an_injected_usage_chunk_pass_unchanged() {
        for name in ["stream-chat.txt", "stream-completions-logprobs.txt"] {
            let body = capture(name).body;
            assert_eq!(strip_all(&[body]), body, "{name}");
            let frames: Vec<&[u8]> = body.split_inclusive(|b| *b == b'\n').collect();
            assert_eq!(strip_all(&frames), body, "{name}");
        }
        // Cut right after a finish chunk: the held chunk is released at the end, unchanged.
        let (usage, _) = chat_pair();
        let text = std::str::from_utf8(&usage).unwrap();
        let cut = text.find(r#"{"id":"chatcmpl-a45afd70d01f6372","object":"chat.completion.chunk","created":1795964150,"model":"tiny","choices":[],"#).unwrap() - "data: ".len();
        assert_eq!(strip_all(&[&usage[..cut]]), &usage[..cut]);
        // Garbage and half events are never lost either.
        assert_eq!(
            strip_all(&[b"data: {nope\n\n", b"data: half"]),
            b"data: {nope\n\ndata: half"
        );
    }

    /// Every way of cutting `body` into frames the tests use: whole, per line, per byte.
    fn framings(body: &[u8]) -> Vec<Vec<&[u8]>> {
        vec![
            vec![body],
            body.split_inclusive(|b| *b == b'\n').collect(),
            body.chunks(1).collect(),
        ]
    }

    #[test]
    fn an_engine_that_forces_usage_keeps_its_usage_chunk() {
        // `--enable-force-include-usage`: the engine sends usage on every chunk and the final
        // usage chunk whatever the request says, so the injected request gets exactly what the
        // client would have got directly; nothing may be removed.
        for name in [
            "options/force-stream-chat.txt",
            "options/force-stream-chat-options-empty.txt",
            "options/force-stream-completions.txt",
            "options/force-stream-chat-logprobs-usage.txt",
            "options/all-stream-chat.txt",
            "options/all-stream-chat-queued.txt",
        ] {
            let body = capture(name).body;
            for frames in framings(body) {
                let (out, removed) = strip_all_usage(&frames);
                assert_eq!(out, body, "{name}, {} frames", frames.len());
                assert_eq!(removed, None, "{name}");
            }
        }
    }

    #[test]
    fn keep_alive_comments_pass_in_place_around_a_stripped_usage_chunk() {
        let (usage, plain) = chat_pair();
        const KA: &str = ": keep-alive\n\n";
        // Before the first event, between events, and between the finish chunk and the
        // usage chunk (where the finish chunk is held): each comment stays where it was.
        let put = |body: &[u8], before_last: &str| {
            let text = std::str::from_utf8(body).unwrap();
            let first = text.find("data: ").unwrap();
            let second = first + text[first..].find("\n\n").unwrap() + 2;
            let last = text.rfind(before_last).unwrap();
            format!(
                "{KA}{}{KA}{}{KA}{KA}{}",
                &text[..second],
                &text[second..last],
                &text[last..]
            )
            .into_bytes()
        };
        let usage = put(&usage, "data: {\"id\":\"chatcmpl-a45afd70d01f6372\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[],");
        let plain = put(&plain, "data: [DONE]");
        for frames in framings(&usage) {
            assert_eq!(
                String::from_utf8(strip_all(&frames)).unwrap(),
                String::from_utf8(plain.clone()).unwrap(),
                "{} frames",
                frames.len()
            );
        }
        // The real queued stream: comments before the first event, usage asked by the client.
        let body = capture("options/keepalive-stream-chat-queued.txt").body;
        for frames in framings(body) {
            assert_eq!(strip_all(&frames), body);
        }
    }

    #[test]
    fn most_events_of_a_capture_pass_by_the_one_look_path() {
        let (usage, plain) = chat_pair();
        let lines: Vec<&[u8]> = usage.split_inclusive(|b| *b == b'\n').collect();
        for frames in [vec![&usage[..]], lines] {
            let mut s = UsageStripper::new();
            let mut out = Vec::new();
            for f in &frames {
                out.extend_from_slice(&s.push(Bytes::copy_from_slice(f)));
            }
            out.extend_from_slice(&s.finish());
            assert_eq!(out, plain);
            let events = events(&usage).len();
            if frames.len() == 1 {
                assert!(s.one_look * 10 > events * 7, "{} of {events}", s.one_look);
            } else {
                assert_eq!(s.one_look, 0, "a frame that splits the event is cut");
            }
        }
    }

    #[test]
    fn whole_event_frames_pass_without_copy() {
        let mut s = UsageStripper::new();
        let frame = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        );
        let out = s.push(frame.clone());
        assert_eq!(out.as_ptr(), frame.as_ptr());
        assert_eq!(out.len(), frame.len());
    }

    #[test]
    fn events_that_never_repeat_are_learned_from_log2_times() {
        // Logprobs on every chunk: each event differs from the last outside its text.
        let mut s = UsageStripper::new();
        let mut body = Vec::new();
        for i in 0..1000 {
            body.extend_from_slice(
                format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t\"}},\
                     \"logprobs\":{{\"content\":[{{\"token\":\"t\",\"logprob\":-0.{i}}}]}}}}]}}\n\n"
                )
                .as_bytes(),
            );
        }
        let out = s.push(Bytes::from(body.clone()));
        assert_eq!(out, body, "passed unchanged");
        // Misses 1, 2, 4, 8, 16 and then every 32nd (32 to 992): 5 + 31.
        assert_eq!(s.learns, 36, "learns");
        // Plain events after them are framed by a template again within 32 events.
        let plain = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
        let before = (s.learns, s.one_look);
        for _ in 0..40 {
            assert_eq!(s.push(Bytes::from_static(plain)), &plain[..]);
        }
        assert_eq!(s.learns, before.0 + 1);
        assert!(
            s.one_look - before.1 >= 40 - 32,
            "{}",
            s.one_look - before.1
        );
    }

    #[test]
    fn n2_usage_stream_releases_the_earlier_finish_chunk() {
        let body = capture("stream-chat-n2.txt").body;
        let out = strip_all(&[body]);
        let text = std::str::from_utf8(&out).unwrap();
        assert!(!text.contains(r#""choices":[]"#), "usage chunk removed");
        assert_eq!(
            text.matches("system_fingerprint").count(),
            1,
            "on the last finish chunk"
        );
        assert!(
            text.ends_with("\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}\n\ndata: [DONE]\n\n")
        );
    }

    #[test]
    fn held_bytes_are_bounded_by_the_line_limit() {
        let (usage, plain) = chat_pair();
        // An event that never ends: once it passes the limit, everything goes out unchanged.
        let mut s = UsageStripper::new();
        let mut out = Vec::new();
        out.extend_from_slice(&s.push(Bytes::copy_from_slice(&usage[..usage.len() / 2])));
        let piece = Bytes::from(vec![b'x'; 1 << 20]);
        let mut sent = usage[..usage.len() / 2].to_vec();
        for _ in 0..(MAX_LINE_BYTES / piece.len() + 2) {
            out.extend_from_slice(&s.push(piece.clone()));
            sent.extend_from_slice(&piece);
            assert!(s.partial.len() <= MAX_LINE_BYTES, "held bytes bounded");
        }
        assert!(s.gave_up(), "gave up past the limit");
        // After giving up, a usage chunk is no longer removed: the stream passes as it is.
        let tail = Bytes::copy_from_slice(&usage);
        out.extend_from_slice(&s.push(tail.clone()));
        sent.extend_from_slice(&tail);
        out.extend_from_slice(&s.finish());
        assert_eq!(out, sent, "nothing lost, nothing reordered");
        // Below the limit the same stripper strips.
        assert_eq!(strip_all(&[&usage]), plain);
        let mut s = UsageStripper::new();
        s.push(Bytes::copy_from_slice(&usage));
        assert!(!s.gave_up());
    }

    /// The events of an SSE body, each with its blank line.
    fn events(body: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut rest = body;
        while let Some(at) = memchr::memmem::find(rest, b"\n\n") {
            out.push(&rest[..at + 2]);
            rest = &rest[at + 2..];
        }
        out
    }

    fn is_other(s: &mut UsageStripper, event: &[u8]) -> bool {
        matches!(s.classify_scanned(event), Class::Other)
    }

    #[test]
    fn only_usage_and_finish_chunks_of_real_streams_are_scanned() {
        let mut s = UsageStripper::new();
        for name in [
            "stream-chat-usage.txt",
            "stream-chat-n2.txt",
            "stream-chat-logprobs.txt",
            "stream-completions.txt",
            "stream-chat.txt",
        ] {
            let events = events(capture(name).body);
            for e in &events {
                // On vLLM's compact JSON the prefilter lets through exactly the events that
                // are not Other, and those with a `\u` escape (a control character's token).
                let escaped = memchr::memmem::find(e, b"\\u").is_some();
                assert_eq!(
                    surely_other(e),
                    is_other(&mut s, e) && !escaped,
                    "{name}: {:?}",
                    String::from_utf8_lossy(e)
                );
            }
            let scanned = events.iter().filter(|e| !surely_other(e)).count();
            assert!(
                events.len() > 4 && scanned * 2 < events.len(),
                "{name}: {scanned} of {}",
                events.len()
            );
        }
    }

    #[test]
    fn the_prefilter_lets_through_what_it_cannot_rule_out() {
        let scanned: &[&str] = &[
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n",
            "data: {\"choices\":[],\"us\\u0061ge\":{\"prompt_tokens\":1}}\n\n",
            "data: {\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"finish_reason\" :\t \"stop\"}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"finish_reas\\u006fn\":\"stop\"}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"finish_reason\"\ndata: :\"stop\"}]}\n\n",
        ];
        let mut s = UsageStripper::new();
        for e in scanned {
            assert!(!surely_other(e.as_bytes()), "{e}");
            assert!(!is_other(&mut s, e.as_bytes()), "{e}");
        }
        let skipped: &[&str] = &[
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"finish_reason\" : null}]}\n\n",
            "data: [DONE]\n\n",
            ": comment\n\n",
        ];
        for e in skipped {
            assert!(surely_other(e.as_bytes()), "{e}");
        }
    }

    fn event_pieces() -> impl Strategy<Value = Vec<&'static str>> {
        let piece = prop::sample::select(vec![
            "data: ",
            "data:",
            "\n",
            "\r\n",
            "\n\n",
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "null",
            "\"stop\"",
            "\"\"",
            "1",
            "\"choices\"",
            "\"usage\"",
            "\"us\\u0061ge\"",
            "\\u",
            "\"finish_reason\"",
            "finish_reason",
            "\"prompt_tokens\"",
            "\"index\"",
            "0",
            "\"system_fingerprint\"",
            "\"fp\"",
            "\"delta\"",
            "{\"content\":\"x\"}",
            "\\\"",
        ]);
        prop::collection::vec(piece, 0..40)
    }

    /// Whole chunks of members that make usage and finish chunks, written in several ways.
    fn member_chunks() -> impl Strategy<Value = String> {
        let member = prop::sample::select(vec![
            r#""choices":[]"#,
            r#""choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]"#,
            r#""choices":[{"index":0,"finish_reason" : "stop"}]"#,
            r#""choices":[{"index":0,"finish_re\u0061son":"length"}]"#,
            r#""choices":[{"index":0,"finish_reason":null},{"index":1,"finish_reason":"stop"}]"#,
            r#""choices":null"#,
            r#""usage":{"prompt_tokens":1,"completion_tokens":2}"#,
            r#""us\u0061ge":{"prompt_tokens":1}"#,
            r#""usage":null"#,
            r#""system_fingerprint":"fp""#,
            r#""x":"\"finish_reason\":\"stop\" usage""#,
            r#""object":"chat.completion.chunk""#,
        ]);
        prop::collection::vec(member, 0..5).prop_map(|m| format!("data: {{{}}}\n\n", m.join(",")))
    }

    /// The stripper's template: an event that repeats an `Other` one but for its text (or one
    /// edited anywhere else, which must not repeat it) classifies as a scan classifies it.
    #[test]
    fn an_event_that_repeats_an_other_template_is_other() {
        let (hits, checked) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let edit = (
            any::<bool>(),
            0usize..400,
            0usize..4,
            "[a-z \"\\\\:{}\u{1}]{0,4}",
        );
        let token = "[a-z ]{1,6}".prop_map(|t| {
            format!("data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"finish_reason\":null}}]}}\n\n")
        });
        let templates = prop_oneof![member_chunks(), token];
        proptest!(ProptestConfig::with_cases(2000), |(template in templates, (inside, at, cut, insert) in edit)| {
            let mut s = UsageStripper::new();
            let t = template.as_bytes();
            if !matches!(s.classify(t), Class::Other) {
                return Ok(());
            }
            let mut e = t.to_vec();
            let at = match s.other.repeats(t) {
                Some(text) if inside => text.start + at % (text.len() + 1),
                _ => at % (e.len() + 1),
            };
            let cut = cut.min(e.len() - at);
            e.splice(at..at + cut, insert.bytes());
            checked.set(checked.get() + 1);
            if s.other.repeats(&e).is_some() {
                hits.set(hits.get() + 1);
                prop_assert!(is_other(&mut UsageStripper::new(), &e), "{}", String::from_utf8_lossy(&e));
            }
        });
        assert!(
            hits.get() > 50 && checked.get() > hits.get(),
            "{hits:?} of {checked:?}"
        );
    }

    /// The stripped bytes, the pieces' count and the usage removed, every event cut and
    /// classified (`cut_only`) or with the one-look path.
    fn strip_by(frames: &[&[u8]], cut_only: bool) -> (Vec<u8>, Option<Usage>, bool) {
        let mut s = UsageStripper::new();
        s.cut_only = cut_only;
        let mut out = Vec::new();
        let mut removed = None;
        for f in frames {
            out.extend_from_slice(&s.push(Bytes::copy_from_slice(f)));
            removed = s.take_removed_usage().or(removed);
        }
        out.extend_from_slice(&s.finish());
        (out, s.take_removed_usage().or(removed), s.gave_up())
    }

    fn stream_event() -> impl Strategy<Value = String> {
        let text = prop_oneof![
            4 => "[a-z ]{0,6}",
            1 => "[a-z\"\\\\\u{1}\u{e9} ]{0,4}"
                .prop_map(|t| t.replace('"', "\\\"").replace('\u{1}', "\\u0001")),
            1 => "[a-z\"\\\\:{} ]{0,4}",
        ];
        let chunk = |delta: String, finish: &str, tail: &str| {
            format!("data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{delta}\"}},\"finish_reason\":{finish}}}]{tail}}}\n\n")
        };
        prop_oneof![
            8 => text.clone().prop_map(move |t| chunk(t, "null", "")),
            1 => text.clone().prop_map(move |t| chunk(t, "\"stop\"", "")),
            1 => text.prop_map(move |t| chunk(t, "\"length\"", r#","system_fingerprint":"fp""#)),
            1 => Just(r#"data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4},"system_fingerprint":"fp"}"#.to_string() + "\n\n"),
            1 => Just("data: [DONE]\n\n".to_string()),
            1 => Just(": ping\n\n".to_string()),
            1 => Just("\n".to_string()),
        ]
    }

    fn splits() -> impl Strategy<Value = (usize, Vec<usize>)> {
        (0usize..2, proptest::collection::vec(0usize..5000, 0..20))
    }

    proptest! {
        #[test]
        fn any_split_strips_to_the_plain_stream((which, mut cuts) in splits()) {
            let (usage, plain) = if which == 0 { chat_pair() } else { completions_pair() };
            for c in cuts.iter_mut() {
                *c %= usage.len() + 1;
            }
            cuts.sort_unstable();
            let mut frames: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for c in cuts {
                frames.push(&usage[at..c]);
                at = c;
            }
            frames.push(&usage[at..]);
            let (out, removed) = strip_all_usage(&frames);
            prop_assert_eq!(out, plain);
            // The usage chunks of the captures (`stream-chat-usage.txt`, `stream-completions.txt`).
            let (prompt, completion) = if which == 0 { (32, 16) } else { (10, 16) };
            prop_assert_eq!(removed, Some(Usage { prompt_tokens: Some(prompt), completion_tokens: Some(completion), reasoning_tokens: None }));
        }

        /// The one-look path (an event that repeats the `Other` template is framed and passed
        /// by the template) against cutting and classifying every event: the same bytes out,
        /// the same usage removed, on generated streams with any line ends, split anywhere.
        #[test]
        fn fast_path_strips_as_the_cut_path_does(
            evs in proptest::collection::vec(stream_event(), 1..40),
            cuts in proptest::collection::vec(0usize..20_000, 0..12),
            eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        ) {
            let body = evs.concat().replace('\n', eol);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
            cuts.sort_unstable();
            let mut frames: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for c in cuts {
                frames.push(&body.as_bytes()[at..c]);
                at = c;
            }
            frames.push(&body.as_bytes()[at..]);
            let whole: &[&[u8]] = &[body.as_bytes()];
            prop_assert_eq!(strip_by(whole, false), strip_by(whole, true));
            prop_assert_eq!(strip_by(&frames, false), strip_by(&frames, true));
        }

        #[test]
        fn the_prefilter_only_skips_events_that_are_other(
            event in prop_oneof![event_pieces().prop_map(|p| p.concat()), member_chunks()],
        ) {
            let mut s = UsageStripper::new();
            if surely_other(event.as_bytes()) {
                prop_assert!(is_other(&mut s, event.as_bytes()), "{}", event);
            }
        }

        #[test]
        fn arbitrary_bytes_are_never_lost_without_a_usage_chunk(chunks in proptest::collection::vec(proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), any::<u8>()], 0..40), 0..10)) {
            let whole: Vec<u8> = chunks.concat();
            let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(strip_all(&refs), whole);
        }
    }
}
