//! Shapes: what the streams of one engine share past their plain prefix, kept per thread.
//!
//! After its plain prefix (`{"id":...,"object":...,"created":...,"model":...,`, different in
//! every stream: see [`EventScan::plain_prefix`]) an engine's events come in a few shapes that
//! every stream repeats but for their output text: vLLM's first output chunk
//! (`"choices":[{"index":0,"delta":{"content":"<text>"},"logprobs":null,"finish_reason":null,
//! "token_ids":null}]}`) and its finish chunk (`..."finish_reason":"length","stop_reason":null,
//! ...`). A stream's own template ([`super::RepeatCache`]) only answers the events after its
//! first output chunk, and never its finish chunk; a shape seen in an earlier stream answers
//! both without a scan.
//!
//! Why that is exact: a scan resumed after a plain prefix reads only the bytes after it
//! (`scan::Cursor::resume_object`), so its answer is a function of that remainder; and a
//! remainder that differs from a scanned one only inside one of the spans the scan read as
//! "empty or not" ([`EventScan::output_spans`]), with other non-empty string text, reads the
//! same (the argument of [`super::repeat`]'s template). The answer's offsets are the only thing
//! that moves: by the prefix's length, and by the text's change of length after the span.
//!
//! The usage chunk (`"choices":[],"usage":{"prompt_tokens":15,"total_tokens":19,
//! "completion_tokens":4},...`) differs in every request, but only in the digits of its
//! counts: a shape without output spans is kept with the integer spans of its usage
//! ([`EventScan::counts`]), and a remainder that differs from it only in those digits (each a
//! run that [`CountSpans`] says reads by one path) is answered with the counts read from its
//! own digits.
//!
//! Kept: remainders of chunks with at least one output span or usage count that logged
//! nothing (no logprobs, no tool call: what is logged is the scan's to note each time), up to
//! [`MAX_REMAINDER`] bytes, [`SLOTS`] of them per thread, the least recently used replaced. The memory
//! of a slot is taken once and reused: once warm, answering and learning allocate nothing.
//! `meter/repeat_differential.rs` and `meter/strip_tests.rs` hold every meter that uses them
//! to the reference that scans every event.

use std::cell::RefCell;

use super::repeat::text_len;
use super::{ChunkKind, Count, CountSpans, EventScan, TokenLog};

/// Shapes kept per thread.
pub const SLOTS: usize = 8;
/// Longest remainder kept (a vLLM chunk's is about 130 bytes).
pub const MAX_REMAINDER: usize = 1024;

#[derive(Debug)]
struct Shape {
    /// The remainder: a payload from the end of its plain prefix to its last byte.
    bytes: Vec<u8>,
    /// Its scan, every offset taken from the remainder's start.
    scan: EventScan,
    /// The answer count when it last answered or was learned (the least is replaced).
    used: u64,
    /// The slot that answered right after this one last time: tried first after it (a
    /// stream's events come in their engine's order: role, first output, finish, usage).
    next: usize,
    /// `bytes` hold no line end (`\n`, `\r`): the shape may frame an event ([`answer_framed`]).
    one_line: bool,
}

#[derive(Debug)]
struct Shapes {
    slots: Vec<Shape>,
    clock: u64,
    /// The slot that answered last.
    last: usize,
}

thread_local! {
    static SHAPES: RefCell<Shapes> = const {
        RefCell::new(Shapes {
            slots: Vec::new(),
            clock: 0,
            last: 0,
        })
    };
}

/// Where `rem` repeats `bytes` but for other non-empty string text in one of `spans`: that
/// span's index, where its text ends in `rem`, and the length of the remainder that repeats:
/// all of `rem`, or with `framed`, `rem` up to where the shape's bytes end in it (`rem` goes
/// on past them; the text ends at its first byte that is not string text, which must open the
/// shape's bytes after the span, as in `Template::match_prefix`).
#[inline(always)]
fn repeat_span(
    bytes: &[u8],
    spans: &[(usize, usize)],
    rem: &[u8],
    framed: bool,
) -> Option<(usize, usize, usize)> {
    spans.iter().enumerate().find_map(|(k, &(a, b))| {
        if framed {
            let tail = bytes.get(b..)?;
            if rem.get(..a) != bytes.get(..a) {
                return None;
            }
            let end = a + text_len(rem.get(a..)?);
            let hit = end > a && rem.get(end..end + tail.len()) == Some(tail);
            return hit.then_some((k, end, end + tail.len()));
        }
        let tail = bytes.len().checked_sub(b)?;
        let end = rem.len().checked_sub(tail)?;
        let hit = end > a
            && rem.get(..a) == bytes.get(..a)
            && rem.get(end..) == bytes.get(b..)
            && text_len(rem.get(a..end)?) == end - a;
        hit.then_some((k, end, rem.len()))
    })
}

/// How a remainder that repeats a shape lines up with the shape's: for each span that
/// differs, where it ends in the shape and in the remainder (a position of the shape at or
/// past such an end moves with it), and the value of each count span (see [`repeat_counts`]).
#[derive(Debug, Default)]
struct Moves {
    ends: [(usize, usize); CountSpans::MAX],
    n: usize,
    values: [u64; CountSpans::MAX],
}

impl Moves {
    fn push(&mut self, shape_end: usize, rem_end: usize) -> Option<()> {
        *self.ends.get_mut(self.n)? = (shape_end, rem_end);
        self.n += 1;
        Some(())
    }

    /// Where `pos`, a position of the shape's remainder, is in the remainder that repeats it.
    #[inline]
    fn at(&self, pos: usize) -> usize {
        match self.ends[..self.n].iter().rev().find(|(b, _)| pos >= *b) {
            Some(&(b, e)) => pos - b + e,
            None => pos,
        }
    }
}

/// Where `rem` repeats `bytes` but for other digits in each of `counts` (see [`CountSpans`]:
/// each a run of 1 to 19 digits that opens with `1`-`9`, or `0` alone): how the two line up
/// and the value of each run. Outside the runs the bytes are the same. With the length of the
/// remainder that repeats, as [`repeat_span`] says it (`framed`: `rem` goes on past it).
#[inline(always)]
fn repeat_counts(
    bytes: &[u8],
    counts: &CountSpans,
    rem: &[u8],
    framed: bool,
) -> Option<(Moves, usize)> {
    let mut moves = Moves::default();
    let (mut t, mut r) = (0, 0);
    for (k, &(a, b, _)) in counts.as_slice().iter().enumerate() {
        let same = bytes.get(t..a)?;
        let start = r + same.len();
        if rem.get(r..start)? != same {
            return None;
        }
        let digits = rem.get(start..)?;
        let len = digits
            .iter()
            .take(20)
            .take_while(|d| d.is_ascii_digit())
            .count();
        if len == 0 || len > 19 || (len > 1 && digits[0] == b'0') {
            return None;
        }
        // At most 19 digits: no overflow.
        *moves.values.get_mut(k)? = digits[..len]
            .iter()
            .fold(0, |v, d| v * 10 + u64::from(d - b'0'));
        (t, r) = (b, start + len);
        moves.push(b, r)?;
    }
    let tail = bytes.get(t..)?;
    let len = if framed { r + tail.len() } else { rem.len() };
    (rem.get(r..len)? == tail).then_some((moves, len))
}

/// The scan of `data` resumed at `from` (the end of a plain prefix: see
/// [`super::scan_event_to`]), from a shape this thread has kept, into `scan` (as
/// [`EventScan::unknown`] made it); `false` when no shape answers (`scan` untouched).
pub(super) fn answer(
    data: &[u8],
    from: usize,
    log: Option<&mut TokenLog>,
    scan: &mut EventScan,
) -> bool {
    let Some(rem) = data.get(from..) else {
        return false;
    };
    SHAPES.with_borrow_mut(|shapes| {
        let Some((i, lined, _)) = shapes.find(rem, false) else {
            return false;
        };
        shapes.answer_by(i, &lined, data, from, log, scan);
        true
    })
}

/// [`answer`] of the payload that opens `buf` (a payload and what follows it), framed by the
/// shape that answers it: the payload is `buf[..n]`, one line (the plain prefix before `from`
/// holds no line end, the caller checked) followed by a blank line `\n\n`, and `n <= max`;
/// returns `n`. That is where an SSE parser cuts the event: the shape's bytes hold no line
/// end, nor does a text that repeats one of its spans (string text holds no control byte) or
/// a run of digits. And it is [`answer`] of `buf[..n]` to the last bit of the bookkeeping: a
/// shape answers such a payload framed exactly when it answers it whole (its text or digits
/// end where the shape's bytes after them start), and a shape with a line end answers no
/// one-line payload. `None`: no shape frames it (nothing changed).
pub(super) fn answer_framed(
    buf: &[u8],
    from: usize,
    max: usize,
    log: Option<&mut TokenLog>,
    scan: &mut EventScan,
) -> Option<usize> {
    let rest = buf.get(from..)?;
    SHAPES.with_borrow_mut(|shapes| {
        let (i, lined, len) = shapes.find(rest, true)?;
        let n = from + len;
        if n > max || buf.get(n..n + 2) != Some(&b"\n\n"[..]) {
            return None;
        }
        shapes.answer_by(i, &lined, buf.get(..n)?, from, log, scan);
        Some(n)
    })
}

impl Shapes {
    /// The slot that answers `rem` (see [`line_up`]): the successor of the last answer
    /// first, then the others in order.
    #[inline(always)]
    fn find(&self, rem: &[u8], framed: bool) -> Option<(usize, Lined, usize)> {
        let first = self.slots.get(self.last).map_or(0, |s| s.next);
        let n = self.slots.len();
        std::iter::once(first)
            .chain((0..n).filter(|&i| i != first))
            .find_map(|i| {
                let (lined, len) = line_up(self.slots.get(i)?, rem, framed)?;
                Some((i, lined, len))
            })
    }

    /// Slot `i`, lined up with the remainder of `data` from `from` as `lined`, answers it:
    /// its scan, moved, into `scan`.
    #[inline(always)]
    fn answer_by(
        &mut self,
        i: usize,
        lined: &Lined,
        data: &[u8],
        from: usize,
        log: Option<&mut TokenLog>,
        scan: &mut EventScan,
    ) {
        self.clock += 1;
        if let Some(last) = self.slots.get_mut(self.last) {
            last.next = i;
        }
        self.last = i;
        let Some(shape) = self.slots.get_mut(i) else {
            return;
        };
        shape.used = self.clock;
        let at = |pos: usize| {
            from + match lined {
                Lined::Same => pos,
                Lined::Text { b, end } if pos >= *b => pos - b + end,
                Lined::Text { .. } => pos,
                Lined::Counts(m) => m.at(pos),
            }
        };
        let s = &shape.scan;
        scan.info.assign(&s.info);
        scan.fingerprint = s.fingerprint.as_ref().map(|r| at(r.start)..at(r.end));
        scan.timings = s.timings.as_ref().map(|r| at(r.start)..at(r.end));
        scan.plain_prefix = at(s.plain_prefix);
        // In place: `scan` has no span yet (as `EventScan::unknown` made it).
        scan.output_spans.set_mapped(&s.output_spans, at);
        scan.counts.set_mapped(&s.counts, at);
        if let (Lined::Counts(m), Some(u)) = (lined, scan.info.usage.as_mut()) {
            // A count shape: the counts are the remainder's own.
            for (&(_, _, what), &v) in s.counts.as_slice().iter().zip(&m.values) {
                match what {
                    Count::Prompt => u.prompt_tokens = Some(v),
                    Count::Completion => u.completion_tokens = Some(v),
                    Count::Free => {}
                }
            }
        }
        if let Some(l) = log {
            // What the scan sets before it reads (its log stays empty: the shape's did).
            l.lead = data.len() - data.trim_ascii_start().len();
            l.body = false;
        }
    }
}

/// How a remainder lines up with a shape that answers it.
enum Lined {
    /// The same bytes (a shape without spans).
    Same,
    /// Other text in one output span: a position at or past the span's end `b` in the shape
    /// is at `end` in the remainder, or after it by as much.
    Text { b: usize, end: usize },
    /// Other digits in the count spans.
    Counts(Moves),
}

/// How `rem` lines up with `shape` when the shape answers it: other text in one output span
/// (a shape with output spans), other digits in its counts (a shape with counts only), else
/// the same bytes; and the length of the remainder that repeats it (see [`repeat_span`]:
/// `framed`, `rem` goes on past it, and only a shape without line ends frames).
#[inline(always)]
fn line_up(shape: &Shape, rem: &[u8], framed: bool) -> Option<(Lined, usize)> {
    if framed && !shape.one_line {
        return None;
    }
    let spans = shape.scan.output_spans.as_slice();
    if !spans.is_empty() {
        let (k, end, len) = repeat_span(&shape.bytes, spans, rem, framed)?;
        let b = spans.get(k)?.1;
        return Some((Lined::Text { b, end }, len));
    }
    if !shape.scan.counts.is_empty() {
        let (moves, len) = repeat_counts(&shape.bytes, &shape.scan.counts, rem, framed)?;
        return Some((Lined::Counts(moves), len));
    }
    let len = if framed { shape.bytes.len() } else { rem.len() };
    (rem.get(..len) == Some(shape.bytes.as_slice())).then_some((Lined::Same, len))
}

/// `scan` is the scan of `data` resumed at `from` (see [`answer`]), which logged nothing:
/// kept as a shape when it is a chunk with an output span (or, `first`: a stream's first
/// event, whose remainder every stream of its engine repeats whole, such as vLLM's role
/// chunk) and not too long.
pub(super) fn learn(data: &[u8], from: usize, scan: &EventScan, first: bool) {
    let Some(rem) = data.get(from..) else {
        return;
    };
    let varies = !scan.output_spans.as_slice().is_empty() || !scan.counts.is_empty();
    if scan.info.kind != ChunkKind::Chunk || !(varies || first) || rem.len() > MAX_REMAINDER {
        return;
    }
    // Every offset of a chunk's scan resumed at `from` is at or past it.
    let rel = |pos: usize| pos.checked_sub(from);
    let (Some(plain_prefix), Some(spans), Some(counts)) = (
        rel(scan.plain_prefix),
        scan.output_spans.try_map(|p| p.checked_sub(from)),
        scan.counts.try_map(|p| p.checked_sub(from)),
    ) else {
        return;
    };
    let range = |r: &Option<std::ops::Range<usize>>| match r {
        None => Some(None),
        Some(r) => Some(Some(rel(r.start)?..rel(r.end)?)),
    };
    let (Some(fingerprint), Some(timings)) = (range(&scan.fingerprint), range(&scan.timings))
    else {
        return;
    };
    let kept = EventScan {
        info: scan.info,
        fingerprint,
        timings,
        plain_prefix,
        output_spans: spans,
        counts,
    };
    SHAPES.with_borrow_mut(|shapes| {
        shapes.clock += 1;
        let used = shapes.clock;
        if shapes.slots.len() < SLOTS {
            shapes.slots.push(Shape {
                bytes: Vec::with_capacity(MAX_REMAINDER),
                scan: EventScan::unknown(),
                used: 0, // the least recently used: filled next
                next: 0,
                one_line: false,
            });
        }
        let Some(slot) = shapes.slots.iter_mut().min_by_key(|s| s.used) else {
            return;
        };
        slot.bytes.clear();
        slot.bytes.extend_from_slice(rem);
        slot.one_line = memchr::memchr2(b'\n', b'\r', rem).is_none();
        slot.scan = kept;
        slot.used = used;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::differential::captured_events;
    use crate::inspect::{plain_prefix_end, scan_event_from};
    use proptest::prelude::*;

    /// What the meter's path does with `data` (see `RepeatCache::scan_to`), with `from` the end
    /// of a plain prefix: the shape's answer, else the scan resumed there (then learned). Checks
    /// the answer against the scan of `data` whole; returns whether a shape answered. Framed
    /// first (`data` followed by a blank line and more, see [`check_framed`]): a shape that
    /// frames the event answers it.
    fn check(data: &[u8], from: usize, first: bool) -> bool {
        let whole = scan_event_from(data, 0, None);
        let resumed = scan_event_from(data, from, None);
        assert_eq!(
            resumed,
            whole,
            "resumed at {from}: {:?}",
            String::from_utf8_lossy(data)
        );
        let framed = [&b""[..], b"\n", b"\r\n", b"data: {}\n\n"]
            .map(|after| check_framed(data, from, after));
        let mut got = EventScan::unknown();
        if answer(data, from, None, &mut got) {
            assert_eq!(got, whole, "{:?}", String::from_utf8_lossy(data));
            FRAMED.with(|f| f.set(f.get() + usize::from(framed[0])));
            return true;
        }
        // A payload with a line end may hold an event a shape frames before it: only a
        // one-line payload is the event framed.
        if memchr::memchr2(b'\n', b'\r', data).is_none() {
            assert_eq!(framed, [false; 4], "{:?}", String::from_utf8_lossy(data));
        }
        assert_eq!(got, EventScan::unknown());
        learn(data, from, &resumed, first);
        false
    }

    std::thread_local! {
        /// Events [`check`] saw framed by a shape on this thread.
        static FRAMED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// `answer_framed` of `data` (a payload with a plain prefix up to `from`) followed by a
    /// blank line and `after`: when a shape frames an event there, it is where an SSE parser
    /// cuts one (a payload without line ends, followed by `\n\n`) and the answer is the whole
    /// scan of that payload; else nothing changed. Returns whether a shape framed it.
    fn check_framed(data: &[u8], from: usize, after: &[u8]) -> bool {
        let buf = [data, b"\n\n", after].concat();
        let mut got = EventScan::unknown();
        let Some(n) = answer_framed(&buf, from, usize::MAX, None, &mut got) else {
            assert_eq!(got, EventScan::unknown());
            return false;
        };
        let lossy = String::from_utf8_lossy(&buf);
        let payload = &buf[..n];
        assert!(
            memchr::memchr2(b'\n', b'\r', &payload[from..]).is_none(),
            "{lossy:?}"
        );
        assert_eq!(buf.get(n..n + 2), Some(&b"\n\n"[..]), "{lossy:?}");
        assert_eq!(got, scan_event_from(payload, 0, None), "{lossy:?}");
        // One line with a blank line after it: `data` itself, where `data` is one line.
        if memchr::memchr2(b'\n', b'\r', data).is_none() {
            assert_eq!(n, data.len(), "{lossy:?}");
        }
        true
    }

    /// On every event of every capture, twice (the second time from the shapes the first
    /// learned): where a plain prefix ends is where a whole scan says it does, and a shape's
    /// answer is the whole scan's.
    #[test]
    fn shapes_answer_every_captured_event_as_a_whole_scan() {
        let events = captured_events();
        let mut hits = 0;
        for round in 0..2 {
            for data in events {
                let Some(end) = plain_prefix_end(data) else {
                    continue;
                };
                assert_eq!(end, scan_event_from(data, 0, None).plain_prefix);
                hits += usize::from(check(data, end, round == 0));
            }
        }
        assert!(hits > 100, "{hits} answers");
        // Not vacuous: most answers were framed too (captures are one line per event).
        let framed = FRAMED.with(std::cell::Cell::get);
        assert!(framed * 10 > hits * 8, "{framed} of {hits} answers framed");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// Captured events edited anywhere (one byte changed, or a text put in place of a
        /// run of bytes), after the original's shape was learned: every answer a shape
        /// gives is the whole scan's, and where a plain prefix is found a scan resumed there
        /// is the whole scan.
        #[test]
        fn shapes_answer_edited_events_as_a_whole_scan(
            pick in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            len in 0usize..12,
            byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b'}'), Just(b','), Just(b'x'), any::<u8>()],
            text in prop_oneof![Just(""), Just("a"), Just("\\n"), Just("\\\""), Just("\\u00e9"), Just("error"), Just("\":1,\"x\":\"")],
        ) {
            let events = captured_events();
            let mut data = pick.get(events).clone();
            if let Some(end) = plain_prefix_end(&data) {
                check(&data, end, true); // its shape kept (or answering already)
            }
            let i = at.index(data.len().max(1)).min(data.len());
            if len == 0 {
                if let Some(b) = data.get_mut(i) {
                    *b = byte;
                }
            } else {
                let j = (i + len).min(data.len());
                data.splice(i..j, text.bytes());
            }
            if let Some(end) = plain_prefix_end(&data) {
                check(&data, end, false);
            }
        }
    }

    /// Every captured event with usage counts, learned, then with other text in place of
    /// each count (digits of any length, leading zeros, past `u64::MAX`, signs, fractions,
    /// exponents, `null`, strings, whitespace): every answer a shape gives is the whole
    /// scan's, its counts the new ones; a usage chunk (no output text) with plain digit runs
    /// is answered.
    #[test]
    fn shapes_answer_usage_chunks_with_other_counts() {
        let with_counts: Vec<&Vec<u8>> = captured_events()
            .iter()
            .filter(|d| {
                let scan = scan_event_from(d, 0, None);
                let kept = plain_prefix_end(d).is_some_and(|end| d.len() - end <= MAX_REMAINDER);
                !scan.counts.is_empty() && scan.info.kind == ChunkKind::Chunk && kept
            })
            .collect();
        assert!(with_counts.len() > 5, "{} usage chunks", with_counts.len());
        let value = prop_oneof![
            4 => "[1-9][0-9]{0,18}",
            1 => Just("0".to_string()),
            1 => "[0-9]{1,22}",
            1 => prop::sample::select(vec![
                "18446744073709551615", "18446744073709551616", "99999999999999999999",
                "-1", "1.5", "1e3", "2E1", "null", "\"7\"", " 7", "7 ", "", "00", "-0",
            ]).prop_map(str::to_string),
        ];
        let (answered, plain) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        proptest!(ProptestConfig::with_cases(2048), |(
            pick in any::<prop::sample::Index>(),
            values in proptest::collection::vec(value, CountSpans::MAX),
        )| {
            let data = pick.get(&with_counts);
            let end = plain_prefix_end(data).expect("a plain prefix");
            check(data, end, false);
            // The counts replaced from the last one back (the earlier offsets stay).
            let mut edited = data.to_vec();
            let scan = scan_event_from(data, 0, None);
            let counts = scan.counts;
            // A chunk with output text is kept by its text (its counts compared as they are).
            let mut all_plain = scan.output_spans.as_slice().is_empty();
            for (&(a, b, _), v) in counts.as_slice().iter().zip(&values).rev() {
                edited.splice(a..b, v.bytes());
                let ok = v.len() <= 19 && v.bytes().all(|d| d.is_ascii_digit())
                    && (v == "0" || v.bytes().next().is_some_and(|d| d != b'0'));
                all_plain &= ok;
            }
            let hit = check(&edited, end, false);
            answered.set(answered.get() + usize::from(hit));
            if all_plain {
                plain.set(plain.get() + 1);
                prop_assert!(hit, "{:?}", String::from_utf8_lossy(&edited));
            }
        });
        assert!(plain.get() > 150, "{answered:?} answered, {plain:?} plain");
    }

    /// Shapes answer as a scan resumed at the same place answers, offsets and all, for texts
    /// of every length, escapes included; a change outside the text is a miss.
    #[test]
    fn a_kept_shape_answers_as_the_scan() {
        let prefix =
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","#;
        let from = prefix.len();
        let event = |text: &str, finish: &str| {
            format!(
                r#"{prefix}"choices":[{{"index":0,"delta":{{"content":"{text}"}},"logprobs":null,"finish_reason":{finish}}}],"system_fingerprint":"fp"}}"#
            )
        };
        let learned = event("first", "null");
        let mut scan = EventScan::unknown();
        crate::inspect::scan_event_to(learned.as_bytes(), from, None, &mut scan);
        learn(learned.as_bytes(), from, &scan, false);
        for text in ["a", "longer text than it was", "x\\n\\u00e9\\\"", "first"] {
            let e = event(text, "null");
            let mut got = EventScan::unknown();
            assert!(answer(e.as_bytes(), from, None, &mut got), "{text}");
            assert_eq!(got, scan_event_from(e.as_bytes(), from, None), "{text}");
            assert_eq!(got.info, scan_event_from(e.as_bytes(), 0, None).info);
            // Framed: the same answer, and no payload longer than the caller allows.
            let framed = format!("{e}\n\ndata: {e}\n\n");
            let mut again = EventScan::unknown();
            let n = answer_framed(framed.as_bytes(), from, e.len(), None, &mut again);
            assert_eq!((n, &again), (Some(e.len()), &got), "{text}");
            let mut short = EventScan::unknown();
            assert_eq!(
                answer_framed(framed.as_bytes(), from, e.len() - 1, None, &mut short),
                None
            );
            assert_eq!(short, EventScan::unknown());
        }
        for miss in [
            event("", "null"),
            event("a", "\"stop\""),
            event("a\\x", "null"),
        ] {
            let mut got = EventScan::unknown();
            assert!(!answer(miss.as_bytes(), from, None, &mut got), "{miss}");
            assert_eq!(got, EventScan::unknown());
        }
        // Another prefix of the same length: the remainder is what counts.
        let other = event("b", "null").replace("chatcmpl-1", "chatcmpl-2");
        let mut got = EventScan::unknown();
        assert!(answer(other.as_bytes(), from, None, &mut got));
        assert_eq!(got, scan_event_from(other.as_bytes(), from, None));
    }
}
