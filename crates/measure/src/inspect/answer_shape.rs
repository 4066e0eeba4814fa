//! The shapes of the last JSON answers read on a thread: an answer that repeats one of them but
//! for values whose reading is known without the scan is answered by a comparison.
//!
//! An engine writes its non-streaming answers alike: vLLM's `{"id":"chatcmpl-<hex>","object":
//! "chat.completion","created":<secs>,"model":"<name>","choices":[{"index":0,"message":{"role":
//! "assistant","content":"<text>","refusal":null,...},"logprobs":null,"finish_reason":
//! "<reason>",...}],...,"usage":{"prompt_tokens":<n>,"total_tokens":<n>,"completion_tokens":<n>,
//! ...},...}`. Read member by member (key, lookup, dispatch, value) such an answer costs about
//! two hundred instructions a member; against the last answer's bytes, the bytes that are the
//! same cost a comparison and the values that differ a read of their own.
//!
//! Why that is exact. The scan ([`super::inspect_response_logged`]) is a function of the bytes
//! it reads. A shape is an answer's bytes with holes; an answer that is the same bytes outside
//! the holes, with a value of the hole's kind in each, takes the scan down the same path, and
//! its reading differs from the shape's only by what the holes' values say:
//! - text: a string the scan only skips (an unknown key's value, or one inside such a value:
//!   `id`, `model`, `system_fingerprint`, the message's `content`), or reads as empty or not
//!   where only the choice's output hangs on that (a choice's `text`; output is not part of an
//!   answer's reading, and untraced it logs nothing): any string text (`repeat::text_len`)
//!   reads the same;
//! - digits: a number the scan only skips (`created`, `usage.total_tokens`): any run of digits
//!   that is one JSON number (`0`, or `1`-`9` and digits) is skipped the same;
//! - a count: `usage.prompt_tokens` / `usage.completion_tokens`, read as integers: a run of 1
//!   to 19 digits (no overflow) that is one JSON number is that count;
//! - a finish reason: a choice's `finish_reason` string, read by the scan's own reader.
//!
//! Everything else is compared as it is: keys, structure, whitespace, and every value the scan
//! reads otherwise (an `index`, `null`s, a `metrics` or `logprobs` object, the `tool_calls` of
//! a message). A key the scan reads that appears twice in its object (its last value counts)
//! is not learned, so each hole is read once and its reading replaces the shape's.
//!
//! Kept: answers that parsed and logged nothing (no logprobs, no tool call: what is logged is
//! the scan's to note each time), of at most [`MAX_CHOICES_PER_CHUNK`] choices, [`MAX_ANSWER`]
//! bytes and [`MAX_HOLES`] holes, read with an empty untraced log; [`SLOTS`] per thread, the
//! least recently used replaced. A run of answers that no shape answers learns ever more
//! rarely (the 1st, 2nd, 4th, 8th, ... miss since the last answer), so answers that never
//! repeat (llama.cpp's `timings`, vLLM's per-request `metrics`) pay for few learns.

use std::cell::RefCell;
use std::ops::Range;

use super::{
    finish_reason, scan_response, ChunkInfo, ChunkKind, ResponseInfo, TokenLog, BODY_KEYS,
    CHOICE_KEYS, MAX_CHOICES_PER_CHUNK, USAGE_KEYS,
};
use crate::outcome::FinishReason;
use crate::scan::{escape_len, plain_run, stop_in_a_block, Cursor, Malformed, Scan};

/// Shapes kept per thread (an engine writes a few: chat, completions, tool calls).
pub(crate) const SLOTS: usize = 4;
/// Longest answer kept.
pub(crate) const MAX_ANSWER: usize = 16 * 1024;
/// Most holes in a shape (vLLM's chat answer has ten).
pub(crate) const MAX_HOLES: usize = 64;

/// What a hole of a shape holds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hole {
    Text,
    Digits,
    Prompt,
    Completion,
    /// The finish reason of the choice at this position of `choices`.
    Finish(u8),
}

#[derive(Debug)]
struct Shape {
    /// The answer (trimmed of whitespace around it).
    bytes: Vec<u8>,
    /// Ranges of `bytes`, in order, none touching the next.
    holes: Vec<(u32, u32, Hole)>,
    /// The scan's reading of `bytes`.
    info: ResponseInfo,
    /// Each choice's finish reason, in order (the first `info.choice_count`).
    finishes: [Option<FinishReason>; MAX_CHOICES_PER_CHUNK],
    /// The answer count when it last answered or was learned (the least is replaced).
    used: u64,
}

/// The reader of JSON answers: the scan, and, when kept, the shapes that answer repeats of
/// earlier answers without it. Off, it scans every answer: the reference the shapes are held
/// to (one type, two configurations).
#[derive(Debug)]
pub(crate) struct AnswerShapes {
    keep: bool,
    slots: Vec<Shape>,
    /// Answers read (a clock for the least recently used).
    clock: u64,
    /// The slot that answered last: tried first.
    last: usize,
    /// Answers read since a shape last answered one.
    misses: u32,
    /// Answers a shape answered.
    answered: u64,
}

thread_local! {
    static SHAPES: RefCell<AnswerShapes> = const { RefCell::new(AnswerShapes::new(true)) };
}

/// [`AnswerShapes::inspect_logged`] by this thread's shapes.
pub(super) fn inspect_logged(body: &[u8], log: &mut TokenLog) -> ResponseInfo {
    SHAPES.with_borrow_mut(|s| s.inspect_logged(body, log))
}

impl AnswerShapes {
    /// `keep`: learn shapes and answer from them; else scan every answer.
    pub(crate) const fn new(keep: bool) -> Self {
        Self {
            keep,
            slots: Vec::new(),
            clock: 0,
            last: 0,
            misses: 0,
            answered: 0,
        }
    }

    /// Answers a shape answered.
    #[cfg(test)]
    pub(crate) fn answered(&self) -> u64 {
        self.answered
    }

    /// What [`super::inspect_response_logged`] says of `body`: the reading of a shape it
    /// repeats, else the scan's.
    pub(crate) fn inspect_logged(&mut self, body: &[u8], log: &mut TokenLog) -> ResponseInfo {
        self.clock += 1;
        let trimmed = body.trim_ascii();
        // A log with entries, or a traced one, is the scan's to fill or clear.
        let usable = self.keep && !log.detail && log.is_empty();
        if usable {
            if let Some(info) = self.answer(trimmed) {
                log.lead = body.len() - body.trim_ascii_start().len();
                log.body = true;
                self.misses = 0;
                self.answered += 1;
                return info;
            }
        }
        let mut chunk = ChunkInfo::of_kind(ChunkKind::Unknown);
        let info = scan_response(body, Some(log), &mut chunk);
        if usable && info.parsed && log.is_empty() {
            self.misses = self.misses.saturating_add(1);
            if self.misses.is_power_of_two() {
                self.learn(trimmed, info, &chunk);
            }
        }
        info
    }

    fn answer(&mut self, data: &[u8]) -> Option<ResponseInfo> {
        let n = self.slots.len();
        (0..n).find_map(|k| {
            let slot = (self.last + k) % n;
            let s = self.slots.get_mut(slot)?;
            let info = s.repeats(data)?;
            s.used = self.clock;
            self.last = slot;
            Some(info)
        })
    }

    fn learn(&mut self, data: &[u8], info: ResponseInfo, chunk: &ChunkInfo) {
        let count = info.choice_count as usize;
        if data.len() > MAX_ANSWER || count > MAX_CHOICES_PER_CHUNK {
            return;
        }
        let mut l = Learner::default();
        let mut c = Cursor::new(data);
        if l.top(&mut c).and_then(|()| c.end()).is_err() || usize::from(l.choices) != count {
            return;
        }
        let mut finishes = [None; MAX_CHOICES_PER_CHUNK];
        for (f, c) in finishes.iter_mut().zip(chunk.choices()) {
            *f = c.finish;
        }
        // The shape's own reading, recomputed as an answer's is: it must be the scan's.
        let counts = l
            .holes
            .iter()
            .any(|h| matches!(h.2, Hole::Prompt | Hole::Completion));
        let (failed, first) = finishes_read(&finishes[..count]);
        if (counts && info.usage.is_none())
            || failed != info.failed_count
            || first != info.finish_reason
        {
            return;
        }
        let slot = if self.slots.len() < SLOTS {
            self.slots.push(Shape {
                bytes: Vec::new(),
                holes: Vec::new(),
                info,
                finishes,
                used: 0,
            });
            self.slots.len() - 1
        } else {
            let oldest = self.slots.iter().enumerate().min_by_key(|(_, s)| s.used);
            oldest.map_or(0, |(k, _)| k)
        };
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.bytes.clear();
        s.bytes.extend_from_slice(data);
        s.holes.clear();
        s.holes.extend_from_slice(&l.holes);
        s.info = info;
        s.finishes = finishes;
        s.used = self.clock;
        self.last = slot;
    }
}

/// The failed choices and the answer's finish reason from its choices' finish reasons, as
/// [`super::inspect_response_logged`] reads them: the first `abort` / `error`, else the first.
fn finishes_read(finishes: &[Option<FinishReason>]) -> (u32, Option<FinishReason>) {
    let gave_up = |f: &&FinishReason| f.engine_gave_up();
    let failed = finishes.iter().flatten().filter(gave_up).count() as u32;
    let first = finishes.iter().flatten().find(gave_up);
    (failed, first.or(finishes.iter().flatten().next()).copied())
}

impl Shape {
    /// The reading of `data` when it repeats this shape (see the module docs).
    fn repeats(&self, data: &[u8]) -> Option<ResponseInfo> {
        let mut info = self.info;
        let mut finishes = self.finishes;
        let mut finished = false;
        let (mut t, mut d) = (0, 0);
        for &(a, b, hole) in &self.holes {
            let same = self.bytes.get(t..a as usize)?;
            let start = d + same.len();
            if data.get(d..start)? != same {
                return None;
            }
            let rest = data.get(start..)?;
            let len = match hole {
                Hole::Text => long_text_len(rest),
                Hole::Digits => number_len(rest, usize::MAX)?,
                Hole::Prompt | Hole::Completion => {
                    let len = number_len(rest, 19)?;
                    // At most 19 digits: no overflow.
                    let v = rest[..len]
                        .iter()
                        .fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
                    let u = info.usage.as_mut()?;
                    match hole {
                        Hole::Prompt => u.prompt_tokens = Some(v),
                        _ => u.completion_tokens = Some(v),
                    }
                    len
                }
                Hole::Finish(k) => {
                    // From its opening quote (the last byte compared).
                    let mut c = Cursor::new(data.get(start.checked_sub(1)?..)?);
                    let s = c.string().ok()?;
                    *finishes.get_mut(usize::from(k))? = Some(finish_reason(s));
                    finished = true;
                    s.raw().len()
                }
            };
            (t, d) = (b as usize, start + len);
        }
        if data.get(d..)? != self.bytes.get(t..)? {
            return None;
        }
        if finished {
            let count = info.choice_count as usize;
            (info.failed_count, info.finish_reason) = finishes_read(finishes.get(..count)?);
        }
        Some(info)
    }
}

/// [`text_len`](super::repeat::text_len) for texts that may run long (a message's content:
/// hundreds of bytes): the same length for every input (proptest), plain runs read sixteen
/// bytes a step ([`stop_in_a_block`]).
#[inline]
fn long_text_len(s: &[u8]) -> usize {
    // Most texts (a model's name, a role, an object's type) end in their first sixteen bytes:
    // one block, in line.
    let first = s.get(..16).and_then(|b| <&[u8; 16]>::try_from(b).ok());
    match first.map(stop_in_a_block) {
        Some(Some(k)) if s.get(k) != Some(&b'\\') => k,
        Some(Some(k)) => runs_and_escapes_len(s, k),
        Some(None) => runs_and_escapes_len(s, 16),
        None => runs_and_escapes_len(s, 0),
    }
}

/// The length of the plain runs and escapes `s` opens with, its first `i` bytes known plain.
/// Out of line: one call per long text. One loop over blocks and escapes, not a call to a run
/// reader per run: setting up a run's blocks cost as much as reading a few.
#[inline(never)]
fn runs_and_escapes_len(s: &[u8], mut i: usize) -> usize {
    loop {
        let block = s.get(i..i + 16).and_then(|b| <&[u8; 16]>::try_from(b).ok());
        i += match block.map(stop_in_a_block) {
            Some(None) => {
                i += 16;
                continue;
            }
            Some(Some(k)) => k,
            // Fewer than sixteen bytes left.
            None => plain_run(s.get(i..).unwrap_or_default()),
        };
        if s.get(i) != Some(&b'\\') {
            return i;
        }
        // An escape as the scanner takes it, else the text ends.
        match s.get(i..).and_then(escape_len) {
            Some(len) => i += len,
            None => return i,
        }
    }
}

/// The length of the run of digits `s` opens with when it is one JSON number of at most `max`
/// digits (`0`, or `1`-`9` and digits).
#[inline]
fn number_len(s: &[u8], max: usize) -> Option<usize> {
    let len = s.iter().take_while(|c| c.is_ascii_digit()).count();
    let one = len == 1 || s.first().is_some_and(|&c| c != b'0');
    (len > 0 && len <= max && one).then_some(len)
}

/// Finds an answer's holes by reading it as the scan reads it: which key's value is read, and
/// how (see the module docs). Refuses (`Err`) what it does not keep.
#[derive(Debug, Default)]
struct Learner {
    holes: Vec<(u32, u32, Hole)>,
    choices: u8,
}

/// Refuses a key the scan reads (`k`, its index in its object's names) seen before.
fn once(seen: &mut u32, k: Option<usize>) -> Scan<()> {
    if let Some(k) = k {
        let bit = 1u32 << k;
        if *seen & bit != 0 {
            return Err(Malformed);
        }
        *seen |= bit;
    }
    Ok(())
}

impl Learner {
    fn note(&mut self, r: Range<usize>, hole: Hole) -> Scan<()> {
        if self.holes.len() >= MAX_HOLES {
            return Err(Malformed);
        }
        let (a, b) = (u32::try_from(r.start), u32::try_from(r.end));
        self.holes
            .push((a.map_err(|_| Malformed)?, b.map_err(|_| Malformed)?, hole));
        Ok(())
    }

    /// The answer's object (`read_body`).
    fn top(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        let mut seen = 0;
        c.object(|c, key| {
            let k = key.one_of(BODY_KEYS);
            once(&mut seen, k)?;
            match k {
                Some(0) if c.peek() == Some(b'[') => c.array(|c| self.choice(c)),
                Some(1) if c.peek() == Some(b'{') => self.usage(c),
                // `system_fingerprint`: only its range is noted, which an answer does not use.
                Some(4) | None => self.free(c),
                Some(_) => c.skip(),
            }
        })
    }

    /// One entry of `choices` (`read_choice`).
    fn choice(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        if c.peek() != Some(b'{') {
            return c.skip();
        }
        let at = self.choices;
        if usize::from(at) >= MAX_CHOICES_PER_CHUNK {
            return Err(Malformed);
        }
        self.choices += 1;
        let mut seen = 0;
        c.object(|c, key| {
            let k = key.one_of(CHOICE_KEYS);
            once(&mut seen, k)?;
            match k {
                // `message`: its `tool_calls` logged (`read_message`).
                Some(5) if c.peek() == Some(b'{') => self.message(c),
                // `text`: empty or not, which only the choice's output hangs on.
                Some(2) | None => self.free(c),
                Some(3) if c.peek() == Some(b'"') => {
                    let s = c.string()?;
                    self.note(c.span(s), Hole::Finish(at))
                }
                Some(_) => c.skip(),
            }
        })
    }

    /// A choice's `message` object (`read_message`).
    fn message(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        let mut seen = 0;
        c.object(|c, key| {
            if key.is(b"tool_calls") {
                once(&mut seen, Some(0))?;
                c.skip()
            } else {
                self.free(c)
            }
        })
    }

    /// `usage` (`read_usage`).
    fn usage(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        let mut seen = 0;
        c.object(|c, key| {
            let k = key.one_of(USAGE_KEYS);
            once(&mut seen, k)?;
            let hole = match k {
                Some(0) => Hole::Prompt,
                Some(1) => Hole::Completion,
                Some(_) => return c.skip(),
                None => return self.free(c),
            };
            let at = c.next_offset();
            let read = c.read_or_skip(Cursor::uint)?;
            let end = c.offset();
            if read.is_ok() && c.digits_between(at, end) && end - at <= 19 {
                self.note(at..end, hole)?;
            }
            Ok(())
        })
    }

    /// A value the scan only skips: its strings are text holes, its runs of digits digit
    /// holes.
    fn free(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        match c.peek() {
            Some(b'"') => {
                let s = c.string()?;
                self.note(c.span(s), Hole::Text)
            }
            Some(b'{') => c.object(|c, _| self.free(c)),
            Some(b'[') => c.array(|c| self.free(c)),
            Some(b'0'..=b'9') => {
                let at = c.next_offset();
                c.skip()?;
                let end = c.offset();
                if c.digits_between(at, end) {
                    self.note(at..end, Hole::Digits)?;
                }
                Ok(())
            }
            _ => c.skip(),
        }
    }
}

#[cfg(test)]
mod tests;
