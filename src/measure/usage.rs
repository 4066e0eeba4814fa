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
//! Pure: request bytes in, request bytes out; frames in, frames out. Frames holding only whole
//! events that pass are returned as the same `Bytes` (no copy).

use bytes::{Bytes, BytesMut};
use serde::de::{Deserializer, IgnoredAny};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::body::sse::SseParser;
use crate::measure::inspect::{inspect_chunk, ChunkKind};

const INCLUDE_USAGE: &[u8] = br#""include_usage":true"#;

/// Present keys keep their raw text even when it is `null`.
fn some_raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct RequestPeek<'a> {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default, borrow, deserialize_with = "some_raw")]
    stream_options: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StreamOptionsPeek<'a> {
    #[serde(default, borrow, deserialize_with = "some_raw")]
    include_usage: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "some_raw")]
    continuous_usage_stats: Option<&'a RawValue>,
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
/// is injected: only for `"stream": true` requests that did not ask for usage themselves
/// (`stream_options.include_usage` not `true`). The client's other `stream_options` stay.
/// Not injected (returns `None`) when the body is not a JSON object, when the client set
/// `continuous_usage_stats: true` (usage would then ride on every chunk and could not be
/// removed byte-exactly), or when `stream_options` is not an object or null.
pub fn inject_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    let peek: RequestPeek<'_> = serde_json::from_slice(body).ok()?;
    if peek.stream != Some(true) {
        return None;
    }
    let Some(opts) = peek.stream_options else {
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
        return Some(splice(body, opts_at, text.len(), &[b"{", INCLUDE_USAGE, b"}"]));
    }
    if !text.starts_with('{') {
        return None;
    }
    let o: StreamOptionsPeek<'_> = serde_json::from_str(text).ok()?;
    if o.continuous_usage_stats.is_some_and(|c| c.get() == "true") {
        return None;
    }
    match o.include_usage {
        Some(v) if v.get() == "true" => None, // the client asked: leave it alone
        Some(v) => Some(splice(body, offset_in(body, v.get()), v.get().len(), &[b"true"])),
        None => {
            let inner_empty = text[1..text.len() - 1].trim().is_empty();
            let sep: &[u8] = if inner_empty { b"" } else { b"," };
            Some(splice(body, opts_at + 1, 0, &[INCLUDE_USAGE, sep]))
        }
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

/// The output of one `push`: one slice of the frame when possible, else a new buffer.
enum Out {
    Empty,
    Range(usize, usize),
    Buf(BytesMut),
}

impl Out {
    fn range(&mut self, frame: &Bytes, a: usize, b: usize) {
        if a == b {
            return;
        }
        match self {
            Out::Empty => *self = Out::Range(a, b),
            Out::Range(x, y) if *y == a => *self = Out::Range(*x, b),
            _ => self.bytes(frame, &frame[a..b]),
        }
    }
    fn bytes(&mut self, frame: &Bytes, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match self {
            Out::Empty => *self = Out::Buf(BytesMut::from(bytes)),
            Out::Range(x, y) => {
                let mut b = BytesMut::with_capacity(*y - *x + bytes.len());
                b.extend_from_slice(&frame[*x..*y]);
                b.extend_from_slice(bytes);
                *self = Out::Buf(b);
            }
            Out::Buf(b) => b.extend_from_slice(bytes),
        }
    }
    fn into_bytes(self, frame: &Bytes) -> Bytes {
        match self {
            Out::Empty => Bytes::new(),
            Out::Range(a, b) => frame.slice(a..b),
            Out::Buf(b) => b.freeze(),
        }
    }
}

#[derive(Deserialize)]
struct UsagePeek<'a> {
    #[serde(default)]
    usage: Option<IgnoredAny>,
    #[serde(default, borrow)]
    system_fingerprint: Option<&'a RawValue>,
}

enum Class {
    /// A `choices:[]` chunk with `usage`: the injected one. Carries `system_fingerprint`'s raw
    /// JSON text, if any.
    Usage(Option<Bytes>),
    /// A chunk where some choice finishes, without usage; whether it has a fingerprint.
    Finish { has_fingerprint: bool },
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
    /// The last event ended on a `\r` at the end of a frame: a leading `\n` shares its fate.
    trailing_cr: Option<Fate>,
    /// Usage chunks removed.
    stripped: u64,
}

impl UsageStripper {
    pub fn new() -> Self {
        Self::default()
    }

    /// Usage chunks removed so far.
    pub fn stripped(&self) -> u64 {
        self.stripped
    }

    /// Feed one upstream frame; returns the bytes to send to the client now (possibly empty).
    pub fn push(&mut self, frame: Bytes) -> Bytes {
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
        while let Some(end) = self.bounds.next(&frame, start, &mut on_cr) {
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
        out.into_bytes(&frame)
    }

    /// End of stream: whatever is held or incomplete goes out unchanged.
    pub fn finish(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        if let Some(h) = self.held.take() {
            out.extend_from_slice(&h);
        }
        out.extend_from_slice(&self.partial.split());
        out.freeze()
    }

    fn extend_held(&mut self, bytes: &[u8]) {
        if let Some(h) = self.held.take() {
            let mut b = BytesMut::with_capacity(h.len() + bytes.len());
            b.extend_from_slice(&h);
            b.extend_from_slice(bytes);
            self.held = Some(b.freeze());
        }
    }

    fn release_held(&mut self, frame: &Bytes, out: &mut Out) {
        if let Some(h) = self.held.take() {
            out.bytes(frame, &h);
        }
    }

    fn on_event(
        &mut self,
        event: Bytes,
        frame: &Bytes,
        out: &mut Out,
        range: Option<(usize, usize)>,
    ) -> Fate {
        match self.classify(&event) {
            Class::Usage(fingerprint) => {
                self.stripped += 1;
                if let Some(h) = self.held.take() {
                    match fingerprint.filter(|_| !self.held_has_fingerprint) {
                        Some(fp) => out.bytes(frame, &insert_fingerprint(&h, &fp)),
                        None => out.bytes(frame, &h),
                    }
                }
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
                    None => out.bytes(frame, &event),
                }
                Fate::Passed
            }
        }
    }

    fn classify(&mut self, event: &[u8]) -> Class {
        let mut class = Class::Other;
        let mut on_data = |data: &[u8]| {
            let info = inspect_chunk(data);
            if info.kind != ChunkKind::Chunk {
                return;
            }
            let Ok(peek) = serde_json::from_slice::<UsagePeek<'_>>(data) else {
                return;
            };
            if info.choice_count == 0 && peek.usage.is_some() {
                let fp = peek.system_fingerprint.map(|f| Bytes::copy_from_slice(f.get().as_bytes()));
                class = Class::Usage(fp);
            } else if info.finished_count > 0 && peek.usage.is_none() {
                class = Class::Finish {
                    has_fingerprint: peek.system_fingerprint.is_some(),
                };
            }
        };
        self.parser.feed(event, |ev| on_data(ev.data));
        self.parser.finish(|ev| on_data(ev.data));
        class
    }
}

/// `,"system_fingerprint":<fp>` before the last `}` of the event (its JSON object's end).
fn insert_fingerprint(event: &[u8], fp: &[u8]) -> Vec<u8> {
    match event.iter().rposition(|b| *b == b'}') {
        Some(at) => splice(event, at, 0, &[br#","system_fingerprint":"#, fp]),
        None => event.to_vec(),
    }
}
