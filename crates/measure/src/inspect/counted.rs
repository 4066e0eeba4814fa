//! Counts in a repeat: continuous usage (vLLM's `stream_options.continuous_usage_stats`, or
//! `--enable-force-include-usage`) puts `usage` on every chunk, and its counts grow from one
//! chunk to the next: `..."delta":{"content":"<text>"},...}],"usage":{"prompt_tokens":15,
//! "total_tokens":17,"completion_tokens":2,...}}`. Such a chunk differs from the one before it
//! in its text and in the digits of its counts only.
//!
//! Why a chunk that differs from a scanned one only there reads the same but for its counts:
//! the text span is read as "empty or not" only (see [`super::repeat`]), and each count span
//! is a run of digits the scan reads by one path whatever the digits (see [`CountSpans`]);
//! neither changes how the bytes around it are read. So the scan's answer is the scanned
//! one's with the counts read from the new digits ([`patch`]). The first byte after a text is
//! the template's closing quote and the first after a count is no digit, so where each ends
//! is found without looking past it: a chunk repeats the template in one way only.

use std::ops::Range;

use super::repeat::text_len;
use super::{Count, CountSpans, Usage};

/// The value of each count span of a repeat, in the order of its [`CountSpans`].
pub type Values = [u64; CountSpans::MAX];

/// A run of digits that a count span may hold (see [`CountSpans`]): 1 to 19 digits that open
/// with `1`-`9`, or `0` alone, at `s`'s start, up to its first byte that is no digit. Its
/// length and value (19 digits: no overflow).
#[inline]
pub(super) fn digit_run(s: &[u8]) -> Option<(usize, u64)> {
    let (mut len, mut value) = (0, 0u64);
    while let Some(&d) = s.get(len) {
        if !d.is_ascii_digit() {
            break;
        }
        if len == 19 {
            return None;
        }
        value = value * 10 + u64::from(d - b'0');
        len += 1;
    }
    if len == 0 || (len > 1 && s.first() == Some(&b'0')) {
        return None;
    }
    Some((len, value))
}

/// The counts of `usage` that `counts` says are kept (prompt, completion), from `values`.
#[inline]
pub(super) fn patch(usage: &mut Usage, counts: &CountSpans, values: &Values) {
    for (&(_, _, what), &v) in counts.as_slice().iter().zip(values) {
        match what {
            Count::Prompt => usage.prompt_tokens = Some(v),
            Count::Completion => usage.completion_tokens = Some(v),
            Count::Free => {}
        }
    }
}

/// Where a repeat of a template may differ from it: one text span and the count spans, in
/// the order they come, each `(start, end, which)` in the template (`which`: [`TEXT`], or the
/// count's index in its [`CountSpans`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Holes {
    holes: [(usize, usize, usize); Holes::MAX],
    n: usize,
}

/// [`Holes`]' mark of the text span.
const TEXT: usize = usize::MAX;

impl Holes {
    const MAX: usize = CountSpans::MAX + 1;

    /// The holes of `text` and `counts` (spans of one payload that do not overlap; the
    /// counts in order).
    pub(super) fn new(text: (usize, usize), counts: &CountSpans) -> Self {
        let mut h = Self::default();
        let mut text = Some(text);
        for (k, &(a, b, _)) in counts.as_slice().iter().enumerate() {
            if let Some(t) = text.filter(|t| t.0 < a) {
                h.push((t.0, t.1, TEXT));
                text = None;
            }
            h.push((a, b, k));
        }
        if let Some(t) = text {
            h.push((t.0, t.1, TEXT));
        }
        h
    }

    fn push(&mut self, hole: (usize, usize, usize)) {
        if let Some(slot) = self.holes.get_mut(self.n) {
            *slot = hole;
            self.n += 1;
        }
    }

    /// `buf` opens with bytes that are `t` (the payload the holes are of) but for other
    /// non-empty string text in the text span and other digits in each count span: how many
    /// bytes, where the text is among them, and the value of each count. `buf` may go on past
    /// them (the rest of a frame).
    #[inline]
    pub(super) fn match_at(&self, t: &[u8], buf: &[u8]) -> Option<(usize, Range<usize>, Values)> {
        let mut values = [0; CountSpans::MAX];
        let mut text = 0..0;
        let (mut ta, mut ra) = (0, 0); // where the next run of the template's bytes starts
        for &(a, b, which) in self.holes.get(..self.n)? {
            let same = t.get(ta..a)?;
            let rest = buf.get(ra..)?.strip_prefix(same)?;
            let start = ra + same.len();
            let len = if which == TEXT {
                let len = text_len(rest);
                if len == 0 {
                    return None;
                }
                text = start..start + len;
                len
            } else {
                let (len, value) = digit_run(rest)?;
                *values.get_mut(which)? = value;
                len
            };
            (ta, ra) = (b, start + len);
        }
        let tail = t.get(ta..)?;
        buf.get(ra..)?.strip_prefix(tail)?;
        (!text.is_empty()).then_some((ra + tail.len(), text, values))
    }
}

impl Holes {
    /// The holes of a template whose text comes first (vLLM's: the choices before the
    /// usage): `(start of the text, end of the last hole)` in the payload, `None` otherwise.
    pub(super) fn text_first(&self) -> Option<(usize, usize)> {
        let (&(a, _, which), &(_, b, _)) = (self.holes.first()?, self.holes.get(..self.n)?.last()?);
        (which == TEXT && self.n > 0).then_some((a, b))
    }

    /// [`Holes::match_at`] from the start of the text of a template whose text comes first
    /// ([`Holes::text_first`]) to the end of its last hole: `rest` opens with that text (the
    /// payload's bytes before it matched already). What is left of `rest` after the last hole,
    /// and the counts' values.
    #[inline]
    pub(super) fn fill<'a>(&self, t: &[u8], mut rest: &'a [u8]) -> Option<(&'a [u8], Values)> {
        let mut values = [0; CountSpans::MAX];
        let holes = self.holes.get(..self.n)?;
        let mut ta = holes.first()?.0; // the first piece matched already
        for &(a, b, which) in holes {
            rest = rest.strip_prefix(t.get(ta..a)?)?;
            let len = if which == TEXT {
                let len = text_len(rest);
                if len == 0 {
                    return None;
                }
                len
            } else {
                let (len, value) = digit_run(rest)?;
                *values.get_mut(which)? = value;
                len
            };
            rest = rest.get(len..)?;
            ta = b;
        }
        Some((rest, values))
    }
}

/// [`Holes::match_at`] of the holes of `text` and `counts`.
#[cfg(test)]
pub(super) fn match_counted(
    t: &[u8],
    text: (usize, usize),
    counts: &CountSpans,
    buf: &[u8],
) -> Option<(usize, Range<usize>, Values)> {
    Holes::new(text, counts).match_at(t, buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::{scan_event, EventScan};
    use proptest::prelude::*;

    const CHUNK: &str = r#"{"id":"c","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}],"usage":{"prompt_tokens":15,"total_tokens":17,"completion_tokens":2,"completion_tokens_details":null}}"#;

    fn chunk(text: &str, prompt: &str, total: &str, completion: &str) -> String {
        format!(
            r#"{{"id":"c","choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}],"usage":{{"prompt_tokens":{prompt},"total_tokens":{total},"completion_tokens":{completion},"completion_tokens_details":null}}}}"#
        )
    }

    fn template() -> (Vec<u8>, EventScan) {
        let t = CHUNK.as_bytes().to_vec();
        let scan = scan_event(&t);
        assert_eq!(scan.output_spans.as_slice().len(), 1);
        assert_eq!(scan.counts.as_slice().len(), 3);
        (t, scan)
    }

    /// What a match says of `data`: its scan, from the template's answer and the values.
    fn answer(t: &[u8], scan: &EventScan, data: &[u8]) -> Option<super::super::ChunkInfo> {
        let (n, _, values) = match_counted(t, scan.output_spans.as_slice()[0], &scan.counts, data)?;
        if n != data.len() {
            return None; // a payload repeats only when matched whole
        }
        let mut info = scan.info;
        if let Some(u) = info.usage.as_mut() {
            patch(u, &scan.counts, &values);
        }
        Some(info)
    }

    #[test]
    fn digit_runs_are_the_counts_one_read_path_takes() {
        let cases: &[(&str, Option<(usize, u64)>)] = &[
            ("0,", Some((1, 0))),
            ("7}", Some((1, 7))),
            ("1234567890123456789,", Some((19, 1234567890123456789))),
            ("12345678901234567890,", None),
            ("01,", None),
            ("00", None),
            (",", None),
            ("", None),
            ("-1", None),
            ("12.5", Some((2, 12))),
        ];
        for (s, want) in cases {
            assert_eq!(digit_run(s.as_bytes()), *want, "{s:?}");
        }
    }

    #[test]
    fn other_texts_and_counts_repeat_and_anything_else_misses() {
        let (t, scan) = template();
        let hits = [
            chunk("x", "15", "16", "1"),
            chunk("a longer text", "9", "1000", "991"),
            chunk("\\\"q\\u00e9\\n", "0", "0", "0"),
            chunk("y", "1234567890123456789", "1", "2"),
        ];
        for h in &hits {
            assert_eq!(
                answer(&t, &scan, h.as_bytes()),
                Some(scan_event(h.as_bytes()).info),
                "{h}"
            );
        }
        let misses = [
            chunk("", "15", "16", "1"),
            chunk("x", "015", "16", "1"),
            chunk("x", "1.5", "16", "1"),
            chunk("x", "-1", "16", "1"),
            chunk("x", "null", "16", "1"),
            chunk("x", "12345678901234567890", "16", "1"),
            chunk("a\"b", "15", "16", "1"),
            chunk("\\x", "15", "16", "1"),
            chunk("x", "15", "16", "1").replace("null}}", "0}}"),
            chunk("x", "15", "16", "1")
                .replace("\"finish_reason\":null", "\"finish_reason\":\"stop\""),
        ];
        for m in &misses {
            assert_eq!(answer(&t, &scan, m.as_bytes()), None, "{m}");
        }
    }

    proptest! {
        /// Any payload the template's match answers reads, by a scan, as the answer says;
        /// payloads are made of the template's own pieces with other texts and digits.
        #[test]
        fn a_match_is_the_scans_answer(
            text in "[a-z\"\\\\ \u{1}{}:,]{0,5}",
            counts in proptest::collection::vec("(0|[1-9][0-9]{0,20}|0[0-9]|[0-9]\\.[0-9]|-1|null)", 3),
            tail in prop_oneof![Just(""), Just(" "), Just(","), Just("}")],
        ) {
            let (t, scan) = template();
            let data = chunk(&text, &counts[0], &counts[1], &counts[2]) + tail;
            if let Some(info) = answer(&t, &scan, data.as_bytes()) {
                prop_assert_eq!(info, scan_event(data.as_bytes()).info, "{}", data);
            }
        }
    }
}
