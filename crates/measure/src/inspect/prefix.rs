//! The plain prefix of a stream's first event, found from the previous stream's.
//!
//! A stream's first scanned event has its plain prefix read alone ([`plain_prefix_noted`]:
//! vLLM's `{"id":"chatcmpl-<hex>","object":"chat.completion.chunk","created":<secs>,
//! "model":"<name>",` up to `"choices":`) so that a shape may answer the rest. Streams of one
//! engine write that prefix alike but for the values the read only skips (the id, the time,
//! the model's name): a prefix that differs from the last one read on this thread only inside
//! those values is found without reading its members one by one.
//!
//! Why that is exact: the read is a function of the bytes it reads, and it reads an unknown
//! key's value only to skip it. A string value is skipped by one path whatever its text, as
//! long as that text is string text to the scanner (plain bytes and escapes, what
//! `repeat::text_len` takes whole: the argument of [`super::repeat`]); a run of digits that
//! opens with `1`-`9` (or is `0` alone) is skipped as one number up to the byte after it. The
//! keys, the `object` value (compared with `"error"`), every other value and the key that ends
//! the prefix, through its colon, are compared as they are; only the end moves, by the change
//! of length of the values before it.

use std::cell::RefCell;
use std::ops::Range;

use super::plain_prefix_noted;
use super::repeat::text_len;

/// Values that may differ, kept per prefix (vLLM's has three: id, created, model).
const MAX_VALUES: usize = 4;
/// Longest prefix kept (through the colon after the key that ends it).
const MAX_PREFIX: usize = 256;

/// What [`plain_prefix_noted`] notes as it reads a prefix.
#[derive(Debug, Default)]
pub(crate) struct PrefixNotes {
    /// The values it skipped that may differ: `(start, end, text)`, a string's text (`text`)
    /// or a run of digits, in order (the first [`MAX_VALUES`]).
    values: [(usize, usize, bool); MAX_VALUES],
    n: usize,
    /// Where the colon after the key that ends the prefix ends (when it ended).
    pub(crate) colon_end: usize,
}

impl PrefixNotes {
    /// An unknown key's value was skipped: `value` is its range and whether it was a string
    /// (its text) or digits; `None` for any other value (compared as it is). Offsets are of
    /// the trimmed payload: `lead` moves them to the payload's.
    pub(crate) fn skipped(&mut self, value: Option<(Range<usize>, bool)>, lead: usize) {
        if let (Some((r, text)), Some(slot)) = (value, self.values.get_mut(self.n)) {
            *slot = (r.start + lead, r.end + lead, text);
            self.n += 1;
        }
    }
}

/// The last prefix read on this thread, with the values that may differ.
#[derive(Debug)]
struct PrefixShape {
    bytes: Vec<u8>,
    values: [(usize, usize, bool); MAX_VALUES],
    n: usize,
    /// Where the prefix ends in `bytes` (the quote of the key after it).
    end: usize,
    /// `bytes` hold no line end (`\n`, `\r`): [`prefix_end_framed`] may answer by it.
    one_line: bool,
}

thread_local! {
    static LAST: RefCell<Option<PrefixShape>> = const { RefCell::new(None) };
}

/// Where the plain prefix of `data` ends: what [`plain_prefix_noted`] says, from the last
/// prefix read on this thread when `data` repeats it (see the module docs), else read (and
/// kept for the next stream).
pub(crate) fn prefix_end(data: &[u8]) -> Option<usize> {
    if let Some(end) = LAST.with_borrow(|last| last.as_ref().and_then(|p| p.repeats(data))) {
        return Some(end);
    }
    let mut notes = PrefixNotes::default();
    let end = plain_prefix_noted(data, Some(&mut notes))?;
    let kept = data
        .get(..notes.colon_end)
        .filter(|b| b.len() <= MAX_PREFIX);
    if let Some(bytes) = kept {
        LAST.with_borrow_mut(|last| {
            let p = last.get_or_insert_with(|| PrefixShape {
                bytes: Vec::with_capacity(MAX_PREFIX),
                values: [(0, 0, false); MAX_VALUES],
                n: 0,
                end: 0,
                one_line: false,
            });
            p.bytes.clear();
            p.bytes.extend_from_slice(bytes);
            p.values = notes.values;
            p.n = notes.n;
            p.end = end;
            p.one_line = memchr::memchr2(b'\n', b'\r', bytes).is_none();
        });
    }
    Some(end)
}

/// [`prefix_end`] of a payload that opens `buf` (and `buf` goes on past it, with its line
/// end), answered by the last prefix read on this thread alone: `None` when that one does not
/// answer (nothing is read or kept then) or holds a line end. Its answer is the payload's:
/// every byte it compares is one of the kept prefix's (no line end) and every value it skips
/// is string text or digits (no line end either), so all it reads lies before the payload's
/// line end, and so does the prefix (the line end is no byte of it).
#[inline]
pub(crate) fn prefix_end_framed(buf: &[u8]) -> Option<usize> {
    LAST.with_borrow(|last| {
        last.as_ref()
            .filter(|p| p.one_line)
            .and_then(|p| p.repeats(buf))
    })
}

impl PrefixShape {
    /// `data` opens with this prefix but for other values in the noted ranges: where its
    /// prefix ends.
    fn repeats(&self, data: &[u8]) -> Option<usize> {
        let (mut t, mut d) = (0, 0);
        for &(a, b, text) in &self.values[..self.n] {
            let same = self.bytes.get(t..a)?;
            let start = d + same.len();
            if data.get(d..start)? != same {
                return None;
            }
            let rest = data.get(start..)?;
            let len = if text {
                text_len(rest)
            } else {
                let len = rest.iter().take_while(|c| c.is_ascii_digit()).count();
                if len == 0 || (len > 1 && rest[0] == b'0') {
                    return None;
                }
                len
            };
            (t, d) = (b, start + len);
        }
        let same = self.bytes.get(t..)?;
        if data.get(d..d + same.len())? != same {
            return None;
        }
        // The end is past every value (it follows the last member read).
        Some(self.end - t + d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::differential::captured_events;
    use crate::inspect::plain_prefix_end;
    use proptest::prelude::*;

    /// Every event of every capture, in order and then again: the kept prefix's answer is
    /// the read's, and most events with a plain prefix are answered by it.
    #[test]
    fn the_kept_prefix_answers_every_captured_event_as_the_read() {
        let events = captured_events();
        let (mut answered, mut with_prefix) = (0, 0);
        for _ in 0..2 {
            for data in events {
                let kept = LAST.with_borrow(|l| l.as_ref().and_then(|p| p.repeats(data)));
                let want = plain_prefix_end(data);
                if let Some(end) = kept {
                    assert_eq!(Some(end), want, "{:?}", String::from_utf8_lossy(data));
                    answered += 1;
                }
                with_prefix += usize::from(want.is_some());
                assert_eq!(prefix_end(data), want);
            }
        }
        assert!(answered * 2 > with_prefix, "{answered} of {with_prefix}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// A captured event's prefix kept, then the event edited: its values replaced (texts
        /// with escapes, quotes, control bytes; digits with leading zeros, signs, fractions)
        /// or a byte changed or a text spliced anywhere: the kept prefix answers as the read.
        #[test]
        fn the_kept_prefix_answers_edited_events_as_the_read(
            pick in any::<prop::sample::Index>(),
            values in proptest::collection::vec(prop_oneof![
                "[a-z0-9-]{0,40}",
                "[0-9]{1,12}",
                prop::sample::select(vec![
                    "", "0", "00", "01", "-1", "1.5", "1e3", "\\\"", "\\n", "\\u00e9", "\\x",
                    "a\"b", "\u{1}", "é", "null", "\\", "\":1,\"choices\":",
                ]).prop_map(str::to_string),
            ], MAX_VALUES),
            edit in proptest::option::of((any::<prop::sample::Index>(), 0usize..8, prop_oneof![
                Just(""), Just("\""), Just(","), Just("x"), Just("\"error\""), Just("1"),
            ])),
        ) {
            let events = captured_events();
            let data = pick.get(events);
            let mut notes = PrefixNotes::default();
            prop_assume!(plain_prefix_noted(data, Some(&mut notes)).is_some());
            prop_assert_eq!(prefix_end(data), plain_prefix_end(data));
            let mut e = data.clone();
            for (&(a, b, _), v) in notes.values[..notes.n].iter().zip(&values).rev() {
                e.splice(a..b, v.bytes());
            }
            if let Some((at, len, text)) = edit {
                let i = at.index(e.len().max(1)).min(e.len());
                let j = (i + len).min(e.len());
                e.splice(i..j, text.bytes());
            }
            let kept = LAST.with_borrow(|l| l.as_ref().and_then(|p| p.repeats(&e)));
            if let Some(end) = kept {
                prop_assert_eq!(Some(end), plain_prefix_end(&e), "{:?}", String::from_utf8_lossy(&e));
            }
        }
    }
}
