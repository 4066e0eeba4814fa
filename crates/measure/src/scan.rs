//! A validating, zero-copy JSON cursor over bytes: the one pass under event inspection
//! ([`crate::inspect`]). It walks a JSON text once, hands its caller every object key
//! and array element in order, and skips what the caller does not read. No tree is built, no
//! byte is copied, strings are not unescaped: the few the caller compares (keys, finish
//! reasons) are compared escape-aware ([`Str::is`]).
//!
//! Grammar: RFC 8259. It refuses what `serde_json` refuses, except three checks that
//! `serde_json` itself skips for the values it ignores (`IgnoredAny`), and that the scanner skips
//! everywhere:
//! - invalid UTF-8 inside a string is not detected: the input is bytes and stays bytes, and
//!   every name the scanner compares is ASCII, so such a string can only be unknown text;
//! - a `\u` escape needs four hex digits; surrogates need not be paired;
//! - a number is checked for its grammar, not its magnitude (`1e400` passes), except where the
//!   caller reads an integer ([`Cursor::uint`]).
//!
//! Nesting deeper than [`MAX_DEPTH`] is refused, as `serde_json`'s default recursion limit does
//! for a `Value`.

/// Deepest nesting of arrays and objects accepted (`serde_json::Value`'s limit: 127 levels).
pub const MAX_DEPTH: u32 = 127;

/// The input is not JSON, or not of the shape the caller reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

pub type Scan<T> = Result<T, Malformed>;

/// A JSON string as it appears between its quotes (escapes not decoded).
#[derive(Debug, Clone, Copy)]
pub struct Str<'a> {
    raw: &'a [u8],
    escaped: bool,
}

impl<'a> Str<'a> {
    /// The bytes between the quotes, escapes as written.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// It holds an escape (its raw bytes are not its value).
    pub fn escaped(&self) -> bool {
        self.escaped
    }

    /// `""`.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The string's value (escapes decoded) is `ascii`, which must be ASCII.
    pub fn is(&self, ascii: &[u8]) -> bool {
        debug_assert!(ascii.is_ascii());
        if !self.escaped {
            return self.raw == ascii;
        }
        let mut want = ascii.iter();
        let mut i = 0;
        while i < self.raw.len() {
            let (byte, len) = match decode_one(&self.raw[i..]) {
                Some(d) => d,
                None => return false, // a non-ASCII character: never equal to `ascii`
            };
            if want.next() != Some(&byte) {
                return false;
            }
            i += len;
        }
        want.next().is_none()
    }

    /// The index in `names` (ASCII) of the string's value, if it is one of them.
    pub fn one_of(&self, names: &[&[u8]]) -> Option<usize> {
        if self.escaped {
            names.iter().position(|n| self.is(n))
        } else {
            names.iter().position(|n| *n == self.raw)
        }
    }
}

/// The first character of a validated string's raw bytes as one ASCII byte, and how many raw
/// bytes it took; `None` when it is not ASCII.
fn decode_one(raw: &[u8]) -> Option<(u8, usize)> {
    match raw {
        [b'\\', b'u', a, b, c, d, ..] => {
            let hex = |h: u8| char::from(h).to_digit(16);
            let v = (hex(*a)? << 12) | (hex(*b)? << 8) | (hex(*c)? << 4) | hex(*d)?;
            u8::try_from(v).ok().filter(u8::is_ascii).map(|b| (b, 6))
        }
        [b'\\', e, ..] => {
            let b = match e {
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                other => *other, // `"`, `\`, `/`
            };
            Some((b, 2))
        }
        [b, ..] if b.is_ascii() => Some((*b, 1)),
        _ => None,
    }
}

/// Bytes that end the plain run of a string: the quote, a backslash, a control character.
const STRING_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Length of the run of `bytes` before the first quote, backslash or control character (all of
/// `bytes` when there is none). Eight bytes at a time: a byte-at-a-time loop was a quarter of
/// the scanner's instructions.
#[inline]
pub(crate) fn plain_run(bytes: &[u8]) -> usize {
    let mut i = 0;
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let hit = stops(u64::from_le_bytes(w));
        if hit != 0 {
            return i + (hit.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    let tail = words.remainder();
    i + tail
        .iter()
        .position(|c| STRING_STOP[usize::from(*c)])
        .unwrap_or(tail.len())
}

/// Where the first quote, backslash or control character of sixteen bytes is ([`plain_run`] of
/// them when it is under sixteen), `None` when there is none: a long text's plain runs read a
/// block a step.
#[inline(always)]
pub(crate) fn stop_in_a_block(block: &[u8; 16]) -> Option<usize> {
    // A byte's lane is zero exactly when it stops a run: the quote and the backslash XOR to
    // zero, bytes below 0x20 saturate to zero. One lane-wise expression folded with `|` (no
    // branch per byte) is what LLVM turns into SSE2, x86-64's baseline: `pxor`, `psubusb`,
    // `pminub`, `pcmpeqb`, `pmovmskb`, about half the instructions of `plain_run`'s two words.
    // Two compares per byte (`b == b'"' | b == b'\\'`) vectorize thirty-two lanes wide, unpacked:
    // a third more.
    let stop = block.iter().fold(false, |a, &b| {
        a | ((b ^ b'"').min(b ^ b'\\').min(b.saturating_sub(0x1f)) == 0)
    });
    if !stop {
        return None;
    }
    // Where: the block's two words as `plain_run` reads them (one has a stop).
    let x = u128::from_le_bytes(*block);
    let lo = stops(x as u64);
    let at = if lo != 0 {
        lo.trailing_zeros()
    } else {
        64 + stops((x >> 64) as u64).trailing_zeros()
    };
    Some((at / 8) as usize)
}

/// The high bit of each byte of `w` (eight bytes, little-endian) that is a quote, a backslash
/// or a control character; the lowest set bit is exact (higher ones may be spurious).
#[inline(always)]
fn stops(w: u64) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    const QUOTE: u64 = ONES * b'"' as u64;
    const BACKSLASH: u64 = ONES * b'\\' as u64;
    const SPACE: u64 = ONES * 0x20;
    // A byte's high bit is set where it is zero after the XOR (quote, backslash) or below
    // 0x20; borrows only spill upwards past a byte that matched, so the lowest is exact.
    let q = w ^ QUOTE;
    let b = w ^ BACKSLASH;
    ((q.wrapping_sub(ONES) & !q) | (b.wrapping_sub(ONES) & !b) | (w.wrapping_sub(SPACE) & !w))
        & HIGH
}

/// The length of the escape sequence `s` opens with (on its backslash): 2, or 6 for
/// `\uXXXX`; `None` when the backslash opens no escape JSON has. The one definition the
/// scanner and the texts read from a template or a kept shape share.
#[inline(always)]
pub(crate) fn escape_len(s: &[u8]) -> Option<usize> {
    match s.get(1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Some(2),
        Some(b'u') => s
            .get(2..6)
            .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit))
            .map(|_| 6),
        _ => None,
    }
}

/// [`plain_run`] of `bytes` in one step when it ends inside their first eight: a token's text
/// and its closing quote, most often. `None` when `bytes` has fewer than eight or no stop
/// among them.
#[inline(always)]
pub(crate) fn plain_run_in_a_word(bytes: &[u8]) -> Option<usize> {
    let w: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    let hit = stops(u64::from_le_bytes(w));
    (hit != 0).then(|| (hit.trailing_zeros() / 8) as usize)
}

/// A position in a JSON text. Every reading method consumes exactly one value (or one token)
/// and leaves the cursor after it, or returns [`Malformed`].
#[derive(Debug)]
pub struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
    depth: u32,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor {
            b: bytes,
            i: 0,
            depth: 0,
        }
    }

    /// Byte offset of the next token (after whitespace).
    pub fn next_offset(&mut self) -> usize {
        self.ws();
        self.i
    }

    /// The byte range of `s` (read by this cursor) in the cursor's input.
    pub fn span(&self, s: Str<'a>) -> std::ops::Range<usize> {
        let start = (s.raw.as_ptr() as usize).saturating_sub(self.b.as_ptr() as usize);
        start..start + s.raw.len()
    }

    /// Byte offset just after what was read last.
    pub fn offset(&self) -> usize {
        self.i
    }

    /// What the value skipped from `a` to `b` is to a reader that only skips it: a string
    /// (the range of its text) or a run of digits (its range), else `None`.
    pub fn skipped_value(&self, a: usize, b: usize) -> Option<(std::ops::Range<usize>, bool)> {
        match self.b.get(a..b)? {
            [b'"', .., b'"'] => Some((a + 1..b - 1, true)),
            _ if self.digits_between(a, b) => Some((a..b, false)),
            _ => None,
        }
    }

    /// The input from `a` to `b` is one or more ASCII digits and nothing else.
    pub fn digits_between(&self, a: usize, b: usize) -> bool {
        self.b
            .get(a..b)
            .is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit))
    }

    #[inline(always)]
    fn ws(&mut self) {
        // Engines write compact JSON: most calls see a byte above the space and stop at once.
        if self.b.get(self.i).is_none_or(|c| *c > b' ') {
            return;
        }
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    #[inline(always)]
    pub fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn eat(&mut self, c: u8) -> Scan<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(Malformed)
        }
    }

    /// Nothing but whitespace is left.
    pub fn end(mut self) -> Scan<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Malformed),
        }
    }

    fn enter(&mut self) -> Scan<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Malformed);
        }
        Ok(())
    }

    /// An object: `member(cursor, key)` for every member in order; it must consume the value.
    #[inline]
    pub fn object(&mut self, member: impl FnMut(&mut Self, Str<'a>) -> Scan<()>) -> Scan<()> {
        self.eat(b'{')?;
        self.enter()?;
        if self.peek() == Some(b'}') {
            self.i += 1;
        } else {
            self.members(member)?;
        }
        self.depth -= 1;
        Ok(())
    }

    /// The members of an object from a key on, through its closing `}`. Inlined as
    /// [`Cursor::object`] was before it shared this loop: out of line it was a call more per
    /// object and its members' closure no longer inlined.
    #[inline(always)]
    fn members(&mut self, mut member: impl FnMut(&mut Self, Str<'a>) -> Scan<()>) -> Scan<()> {
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Malformed),
            }
        }
    }

    /// [`Cursor::object`] for the top-level object of `bytes`, resumed at `at`: where a cursor
    /// reading that object stands once its `{` and its first members and their commas are read
    /// (the start of a key, or whitespace before one). `member` sees the members from there
    /// on; the ones before are the caller's to have read. Then nothing but whitespace may
    /// follow, as [`Cursor::end`] checks.
    ///
    /// Why that is the same as reading the whole text: a cursor is a function of the bytes it
    /// has read, so a text that opens with the same `at` bytes as one read before puts a
    /// cursor that reads it at `at` in the same place, at depth 1, in the same state.
    pub fn resume_object(
        bytes: &'a [u8],
        at: usize,
        member: impl FnMut(&mut Self, Str<'a>) -> Scan<()>,
    ) -> Scan<()> {
        let mut c = Cursor {
            b: bytes,
            i: at.min(bytes.len()),
            depth: 1,
        };
        c.members(member)?;
        c.end()
    }

    /// An array: `element(cursor)` for every element in order; it must consume the element.
    #[inline]
    pub fn array(&mut self, mut element: impl FnMut(&mut Self) -> Scan<()>) -> Scan<()> {
        self.eat(b'[')?;
        self.enter()?;
        if self.peek() == Some(b']') {
            self.i += 1;
        } else {
            loop {
                element(self)?;
                match self.peek() {
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(Malformed),
                }
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// A string, validated (escapes, no control characters), not decoded. In line wherever it
    /// is read: out of line, each of the forty-odd strings of an answer paid for a call that
    /// saves and restores six registers and returns its `Str` through memory (most of a short
    /// string's cost).
    #[inline(always)]
    pub fn string(&mut self) -> Scan<Str<'a>> {
        self.eat(b'"')?;
        let start = self.i;
        // Most strings (every key, most values) are one plain run and their closing quote:
        // that in line, the rest (escapes, errors) in a call.
        let rest = self.b.get(start..).unwrap_or_default();
        let run = plain_run(rest);
        if let (Some(b'"'), Some(raw)) = (rest.get(run), rest.get(..run)) {
            self.i = start + run + 1;
            return Ok(Str {
                raw,
                escaped: false,
            });
        }
        self.i = start + run;
        self.string_rest(start)
    }

    /// [`Cursor::string`] from the first byte of its text that is not plain (`start`: where
    /// the text began).
    #[inline(never)]
    fn string_rest(&mut self, start: usize) -> Scan<Str<'a>> {
        let mut escaped = false;
        loop {
            let rest = self.b.get(self.i..).unwrap_or_default();
            let run = plain_run(rest);
            self.i += run;
            match rest.get(run).copied().ok_or(Malformed)? {
                b'"' => {
                    let raw = &self.b[start..self.i];
                    self.i += 1;
                    return Ok(Str { raw, escaped });
                }
                b'\\' => {
                    escaped = true;
                    self.escape()?;
                }
                _ => return Err(Malformed), // a raw control character
            }
        }
    }

    /// One escape sequence at the cursor (on its backslash).
    fn escape(&mut self) -> Scan<()> {
        let len = self.b.get(self.i..).and_then(escape_len).ok_or(Malformed)?;
        self.i += len;
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Scan<()> {
        self.ws();
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(Malformed)
        }
    }

    /// Consumes `null` if that is the next value.
    #[inline]
    pub fn null(&mut self) -> bool {
        self.peek() == Some(b'n') && self.literal(b"null").is_ok()
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.b.get(self.i) {
            self.i += 1;
        }
        self.i - start
    }

    /// A number, by its grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Scan<()> {
        self.ws();
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(Malformed),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(Malformed);
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(Malformed);
            }
        }
        Ok(())
    }

    /// A number, as the nearest `f64` (`1e400` is infinite).
    pub fn float(&mut self) -> Scan<f64> {
        self.ws();
        let start = self.i;
        self.number()?;
        std::str::from_utf8(&self.b[start..self.i])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Malformed)
    }

    /// An integer field as `serde_json` reads one into a `u64`: digits only (no sign, fraction
    /// or exponent, which it reads as a float and refuses), and no overflow.
    pub fn uint(&mut self) -> Scan<u64> {
        self.ws();
        let mut v: u64 = 0;
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                while let Some(d @ b'0'..=b'9') = self.b.get(self.i) {
                    v = v
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(d - b'0')))
                        .ok_or(Malformed)?;
                    self.i += 1;
                }
            }
            _ => return Err(Malformed),
        }
        match self.b.get(self.i) {
            Some(b'.' | b'e' | b'E' | b'0'..=b'9') => Err(Malformed),
            _ => Ok(v),
        }
    }

    /// `read` one value; when it refuses the value's shape (or the value is not JSON), go
    /// back and skip the value instead. `Ok(Err(Malformed))`: valid JSON of another shape.
    /// Lets a key that appears twice count by its last value only, whatever the first was.
    pub fn read_or_skip<T>(&mut self, read: impl FnOnce(&mut Self) -> Scan<T>) -> Scan<Scan<T>> {
        let (i, depth) = (self.i, self.depth);
        match read(self) {
            Ok(v) => Ok(Ok(v)),
            Err(Malformed) => {
                self.i = i;
                self.depth = depth;
                self.skip().map(|()| Err(Malformed))
            }
        }
    }

    /// Any one value, validated and skipped.
    pub fn skip(&mut self) -> Scan<()> {
        match self.peek() {
            Some(b'{') => self.object(|c, _| c.skip()),
            Some(b'[') => self.array(Self::skip),
            Some(b'"') => self.string().map(drop),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(Malformed),
        }
    }

    /// Skips a value; true unless it is `null`, `""`, `[]` or `{}`.
    pub fn non_empty(&mut self) -> Scan<bool> {
        match self.peek() {
            Some(b'"') => Ok(!self.string()?.is_empty()),
            Some(b'n') => self.literal(b"null").map(|()| false),
            Some(b'[') => Ok(self.count()? > 0),
            Some(b'{') => {
                let mut any = false;
                self.object(|c, _| {
                    any = true;
                    c.skip()
                })?;
                Ok(any)
            }
            _ => self.skip().map(|()| true),
        }
    }

    /// An array, skipped; its number of elements.
    pub fn count(&mut self) -> Scan<u32> {
        let mut n = 0u32;
        self.array(|c| {
            n = n.saturating_add(1);
            c.skip()
        })?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::de::IgnoredAny;

    fn valid(text: &[u8]) -> bool {
        let mut c = Cursor::new(text);
        c.skip().is_ok() && c.end().is_ok()
    }

    /// `serde_json`'s own grammar for values it ignores: the reference for [`valid`] (it has
    /// no depth limit; the inputs here nest far less than [`MAX_DEPTH`]).
    fn serde_valid(text: &[u8]) -> bool {
        serde_json::from_slice::<IgnoredAny>(text).is_ok()
    }

    #[test]
    fn grammar_table() {
        let cases: &[&[u8]] = &[
            b"{}",
            b" { } ",
            b"[]",
            b"[1,2,3]",
            b"[1,]",
            b"[,1]",
            b"{\"a\":1,}",
            b"{\"a\" 1}",
            b"{a:1}",
            b"{\"a\":1 \"b\":2}",
            b"\"\\u00e9\\ud800\\\"\\/\\b\\f\\n\\r\\t\"",
            b"\"\\x\"",
            b"\"\\u12\"",
            b"\"\\u12g4\"",
            b"\"a\x01\"",
            b"\"a\x7f\xff\xfe\"",
            b"\"unterminated",
            b"0",
            b"-0",
            b"01",
            b"-",
            b"1.",
            b".5",
            b"1.5e",
            b"1.5e+",
            b"1e400",
            b"-1.25E-7",
            b"+1",
            b"true",
            b"tru",
            b"nul",
            b"nullx",
            b"null null",
            b"[true,false,null]",
            b"\xef\xbb\xbf{}",
            b"{}\x0c",
            b"",
            b" ",
        ];
        for text in cases {
            assert_eq!(
                valid(text),
                serde_valid(text),
                "{:?}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn plain_runs_end_at_the_first_quote_backslash_or_control_byte() {
        let naive = |b: &[u8]| {
            b.iter()
                .position(|c| STRING_STOP[usize::from(*c)])
                .unwrap_or(b.len())
        };
        let mut cases: Vec<Vec<u8>> = vec![b"".to_vec(), b"abcdefghijklmnopq".to_vec()];
        // Every length to 120 bytes, with no stop.
        cases.extend((0..120).map(|n| vec![b'z'; n]));
        for stop in [b'"', b'\\', 0x00, 0x01, 0x1f] {
            for (len, at) in (0..20)
                .map(|at| (24, at))
                .chain((0..118).map(|at| (120, at)))
            {
                let mut v: Vec<u8> = (0..len)
                    .map(|i| [b'a', 0x20, 0x7f, 0x80, 0xff, b'!', b'#', b']'][i % 8])
                    .collect();
                v[at] = stop;
                if at + 2 < v.len() {
                    v[at + 2] = b'"'; // a later stop never wins
                }
                cases.push(v);
            }
        }
        for v in cases {
            let run = plain_run(&v);
            assert_eq!(run, naive(&v), "{v:?}");
            let in_a_word = (v.len() >= 8 && run < 8).then_some(run);
            assert_eq!(plain_run_in_a_word(&v), in_a_word, "{v:?}");
        }
    }

    #[test]
    fn nesting_is_refused_where_serde_json_refuses_a_value() {
        for depth in [1usize, 126, 127, 128, 129, 500] {
            let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let serde_ok = serde_json::from_str::<serde_json::Value>(&text).is_ok();
            assert_eq!(valid(text.as_bytes()), serde_ok, "depth {depth}");
            assert_eq!(serde_ok, depth <= MAX_DEPTH as usize, "depth {depth}");
        }
    }

    #[test]
    fn strings_compare_with_escapes_decoded() {
        let s = |text: &'static [u8]| Cursor::new(text).string().unwrap();
        assert!(s(br#""stop""#).is(b"stop"));
        assert!(s(br#""st\u006fp""#).is(b"stop"));
        assert!(s(br#""\u0073\u0054op""#).is(b"sTop"));
        assert!(!s(br#""stop\n""#).is(b"stop"));
        assert!(s(br#""a\nb\/""#).is(b"a\nb/"));
        assert!(!s(br#""sto""#).is(b"stop"));
        assert!(!s(br#""\u00e9""#).is(b"e"));
        assert!(!s("\"é\"".as_bytes()).is(b"e"));
        assert_eq!(
            s(br#""reas\u006fning""#).one_of(&[b"content", b"reasoning"]),
            Some(1)
        );
        assert_eq!(s(br#""x""#).one_of(&[b"content"]), None);
    }

    #[test]
    fn integers_are_read_as_serde_json_reads_a_u64() {
        for (text, want) in [
            ("0", Some(0)),
            ("42", Some(42)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("-1", None),
            ("-0", None),
            ("1.0", None),
            ("1e2", None),
            ("01", None),
            ("null", None),
            ("\"1\"", None),
        ] {
            let got = Cursor::new(text.as_bytes()).uint().ok();
            let serde = serde_json::from_str::<u64>(text).ok();
            assert_eq!(got, want, "{text}");
            assert_eq!(got, serde, "{text}");
        }
    }

    #[test]
    fn emptiness_ignores_inner_whitespace() {
        for (text, want) in [
            ("null", false),
            ("\"\"", false),
            ("[ ]", false),
            ("{\n}", false),
            ("\" \"", true),
            ("[null]", true),
            ("{\"a\":null}", true),
            ("0", true),
            ("false", true),
        ] {
            assert_eq!(Cursor::new(text.as_bytes()).non_empty(), Ok(want), "{text}");
        }
    }

    /// [`Cursor::string`] byte by byte: the reference its word-at-a-time paths are held to.
    /// `Ok((raw, escaped))` and where the cursor stands after the string.
    fn string_byte_by_byte(text: &[u8]) -> (Scan<(&[u8], bool)>, usize) {
        let mut i = text
            .iter()
            .take_while(|c| matches!(c, b' ' | b'\n' | b'\r' | b'\t'))
            .count();
        if text.get(i) != Some(&b'"') {
            return (Err(Malformed), i);
        }
        i += 1;
        let (start, mut escaped) = (i, false);
        loop {
            match text.get(i) {
                Some(b'"') => return (Ok((&text[start..i], escaped)), i + 1),
                Some(b'\\') => {
                    escaped = true;
                    match text.get(i + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                        Some(b'u')
                            if text
                                .get(i + 2..i + 6)
                                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                        {
                            i += 6
                        }
                        _ => return (Err(Malformed), i),
                    }
                }
                Some(c) if *c >= 0x20 => i += 1,
                _ => return (Err(Malformed), i),
            }
        }
    }

    /// Bytes from a JSON-heavy alphabet, so that most inputs are nearly JSON.
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => prop::sample::select(b"{}[]:,\"\\ 0123456789.eE+-tfnrualsu".to_vec()),
            1 => any::<u8>(),
        ];
        prop::collection::vec(byte, 0..40)
    }

    /// Bytes that do not stop a plain run, next to those that do: around the quote, the
    /// backslash and 0x20, and the stops with their high bit set.
    const NEIGHBOURS: [u8; 11] = [
        b'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff,
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn validity_matches_serde_json_on_near_json(text in jsonish()) {
            prop_assert_eq!(valid(&text), serde_valid(&text));
        }

        /// Runs of any length with a stop anywhere (or none): as byte by byte.
        #[test]
        fn plain_runs_are_found_as_byte_by_byte(
            len in 0usize..200, at in any::<prop::sample::Index>(), stop in prop::sample::select(
                vec![None, Some(b'"'), Some(b'\\'), Some(0x00), Some(0x1f)]),
            later in any::<prop::sample::Index>(),
        ) {
            let mut v: Vec<u8> = (0..len).map(|i| [b'a', 0x20, 0x7f, 0x80, 0xff, b'!', b'#', b']'][i % 8]).collect();
            if let (Some(stop), false) = (stop, v.is_empty()) {
                let at = at.index(v.len());
                v[at] = stop;
                let later = at + later.index(v.len() - at);
                v[later] = b'"'; // a later stop never wins
            }
            let naive = v.iter().position(|c| STRING_STOP[usize::from(*c)]).unwrap_or(v.len());
            prop_assert_eq!(plain_run(&v), naive, "{:?}", v);
        }

        /// Blocks of bytes of every kind (stops and their neighbours), with a stop or not: the
        /// first stop where a byte-by-byte reading finds it.
        #[test]
        fn stops_in_a_block_are_found_as_byte_by_byte(
            v in proptest::collection::vec(prop_oneof![
                8 => 0x20u8..=0xff,
                4 => prop::sample::select(NEIGHBOURS.to_vec()),
                1 => Just(b'"'),
                1 => Just(b'\\'),
                1 => 0u8..0x20,
            ], 16),
            plain in 0usize..=16,
        ) {
            // A plain stretch first, so that the first stop falls anywhere in the block.
            let mut block = [0u8; 16];
            for (i, (b, &v)) in block.iter_mut().zip(&v).enumerate() {
                *b = if i < plain { NEIGHBOURS[i % NEIGHBOURS.len()] } else { v };
            }
            let naive = block.iter().position(|c| STRING_STOP[usize::from(*c)]);
            prop_assert_eq!(stop_in_a_block(&block), naive, "{:?}", block);
        }

        /// Strings of every length around the word boundaries (the stop anywhere in the
        /// first two words, after them, none before the end of the input), with escapes,
        /// control and non-ASCII bytes: read as byte by byte. The offset of a refused string
        /// is not compared (a refused text is refused whole).
        #[test]
        fn strings_are_read_as_byte_by_byte(
            lead in "[ \t]{0,2}",
            body in prop::collection::vec(prop_oneof![
                6 => prop::sample::select(b"abz09 ~\x7f".to_vec()),
                1 => prop::sample::select(vec![b'"', b'\\', 0x00, 0x1f, 0x80, 0xe9, 0xff]),
            ], 0..48),
            escapes in prop::collection::vec((0usize..48, prop::sample::select(vec![
                &b"\\n"[..], b"\\\"", b"\\u00e9", b"\\u12g4", b"\\x", b"\\", b"\\u12",
            ])), 0..3),
            end in prop::sample::select(vec![&b""[..], b"\"", b"\",1]", b"\"}\"0123456789abcdef"]),
        ) {
            let mut text: Vec<u8> = lead.into_bytes();
            text.push(b'"');
            let mut body = body;
            for (at, e) in escapes {
                let at = at.min(body.len());
                body.splice(at..at, e.iter().copied());
            }
            text.extend_from_slice(&body);
            text.extend_from_slice(end);
            let mut c = Cursor::new(&text);
            let got = c.string().map(|s| (s.raw(), s.escaped()));
            let (want, at) = string_byte_by_byte(&text);
            prop_assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&text));
            if want.is_ok() {
                prop_assert_eq!(c.offset(), at);
            }
        }

        #[test]
        fn validity_matches_serde_json_on_values_with_one_byte_changed(
            v in any::<u16>(), at in any::<usize>(), b in any::<u8>(),
        ) {
            let mut text = format!(r#"{{"a":[1,-2.5e3,"x\u00e9\n",{{"b":null}},true],"c":"{v}"}}"#).into_bytes();
            let at = at % text.len();
            text[at] = b;
            prop_assert_eq!(valid(&text), serde_valid(&text));
        }
    }
}
