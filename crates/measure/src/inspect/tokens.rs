//! What the one pass of [`super::scan_event_logged`] notes per output token besides the
//! counts of [`super::ChunkInfo`]: each token's logprob (chat `logprobs.content[].logprob`,
//! completions `logprobs.token_logprobs[]`), and for a traced request its text, its top
//! alternatives and each output choice's text length; and, traced or not, each tool-call entry
//! (`super::calls`). Nothing is copied or decoded: texts are byte spans of the payload, decoded
//! only by whoever keeps them ([`Span::decode`], [`Span::text`]).
//!
//! The log is a reused buffer (no allocation per event once warm). The scanner fills it while
//! it reads a payload; the caller takes what it needs when the payload was a chunk
//! ([`super::ChunkKind::Chunk`]) and clears it, whatever the kind (a payload the scanner
//! refused may have left partial entries).
//!
//! Readings, as for the counts (the last of a repeated key wins): a chat `content` that is an
//! array (even empty) gives the tokens; otherwise the completions arrays: one token per
//! `tokens` entry, its logprob the `token_logprobs` entry at the same position, its
//! alternatives the `top_logprobs` object there (`{token: logprob}`). A logprob that is not a
//! number is absent; an entry that is not an object gives a token without logprob.

use std::borrow::Cow;
use std::ops::Range;

use crate::scan::{Cursor, Scan, Str};

use super::calls::LoggedCall;

/// Which kind of output a choice's delta carried (bits; an event can carry several).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases(u8);

impl Phases {
    /// `delta.reasoning` / `delta.reasoning_content`.
    pub const REASONING: Phases = Phases(1);
    /// `delta.content` or `text` (completions): the answer.
    pub const ANSWER: Phases = Phases(2);
    /// `delta.tool_calls`.
    pub const TOOL_CALL: Phases = Phases(4);

    pub fn contains(self, p: Phases) -> bool {
        self.0 & p.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn with(self, p: Phases, on: bool) -> Phases {
        if on {
            Phases(self.0 | p.0)
        } else {
            self
        }
    }
}

/// A string of the payload: its bytes between the quotes, escapes as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    start: u32,
    end: u32,
    escaped: bool,
}

impl Span {
    pub(super) fn of(c: &Cursor<'_>, s: Str<'_>, lead: usize) -> Span {
        let r = c.span(s);
        Span {
            start: (r.start + lead) as u32,
            end: (r.end + lead) as u32,
            escaped: s.escaped(),
        }
    }

    fn range(&self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    /// The string's value (escapes decoded; invalid UTF-8 replaced), from the payload given
    /// to the scanner.
    pub fn decode(&self, payload: &[u8]) -> String {
        self.text(payload).into_owned()
    }

    /// [`Span::decode`], borrowed from the payload when the string holds no escape (and is
    /// valid UTF-8).
    pub fn text<'p>(&self, payload: &'p [u8]) -> Cow<'p, str> {
        let raw = self.raw(payload);
        if !self.escaped {
            return String::from_utf8_lossy(raw);
        }
        let mut out = String::with_capacity(raw.len());
        unescape_into(raw, &mut out);
        Cow::Owned(out)
    }

    /// Appends the string's value to `out` (as [`Span::decode`] decodes it), allocating
    /// nothing but `out`'s growth.
    pub fn push_to(&self, payload: &[u8], out: &mut String) {
        let raw = self.raw(payload);
        if self.escaped {
            unescape_into(raw, out);
        } else {
            out.push_str(&String::from_utf8_lossy(raw));
        }
    }

    /// The UTF-8 length of the string's value (invalid UTF-8 counted as its bytes).
    pub fn decoded_len(&self, payload: &[u8]) -> usize {
        let raw = self.raw(payload);
        if self.escaped {
            decoded_len(raw)
        } else {
            raw.len()
        }
    }

    fn raw<'p>(&self, payload: &'p [u8]) -> &'p [u8] {
        payload.get(self.range()).unwrap_or_default()
    }
}

/// Appends the value of a validated JSON string's raw bytes to `out`: escapes decoded, a
/// surrogate pair as its character, a lone surrogate and invalid UTF-8 as U+FFFD.
fn unescape_into(raw: &[u8], out: &mut String) {
    let hex = |h: Option<&[u8]>| {
        std::str::from_utf8(h?)
            .ok()
            .and_then(|h| u32::from_str_radix(h, 16).ok())
    };
    let mut i = 0;
    while i < raw.len() {
        let run = memchr::memchr(b'\\', &raw[i..]).unwrap_or(raw.len() - i);
        out.push_str(&String::from_utf8_lossy(&raw[i..i + run]));
        i += run;
        let Some(&e) = raw.get(i + 1) else { break };
        if e != b'u' {
            out.push(match e {
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                other => char::from(other), // `"`, `\`, `/`
            });
            i += 2;
            continue;
        }
        let hi = hex(raw.get(i + 2..i + 6)).unwrap_or(0xFFFD);
        i += 6;
        let lo = (raw.get(i..i + 2) == Some(b"\\u"))
            .then(|| hex(raw.get(i + 2..i + 6)))
            .flatten()
            .filter(|lo| (0xD800..0xDC00).contains(&hi) && (0xDC00..0xE000).contains(lo));
        let c = match lo {
            Some(lo) => {
                i += 6;
                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
            }
            None => char::from_u32(hi),
        };
        out.push(c.unwrap_or('\u{FFFD}'));
    }
}

/// UTF-8 length of a validated JSON string's value from its raw bytes.
pub(super) fn decoded_len(raw: &[u8]) -> usize {
    let hex = |h: &[u8]| {
        std::str::from_utf8(h)
            .ok()
            .and_then(|h| u32::from_str_radix(h, 16).ok())
    };
    let (mut n, mut i) = (0, 0);
    while i < raw.len() {
        if raw[i] != b'\\' {
            n += 1;
            i += 1;
            continue;
        }
        if raw.get(i + 1) != Some(&b'u') {
            n += 1;
            i += 2;
            continue;
        }
        let v = raw.get(i + 2..i + 6).and_then(hex).unwrap_or(0xFFFD);
        i += 6;
        n += match v {
            0..=0x7F => 1,
            0x80..=0x7FF => 2,
            // A high surrogate followed by a low one is one 4-byte character.
            0xD800..=0xDBFF
                if raw.get(i..i + 2) == Some(b"\\u")
                    && raw
                        .get(i + 2..i + 6)
                        .and_then(hex)
                        .is_some_and(|lo| (0xDC00..=0xDFFF).contains(&lo)) =>
            {
                i += 6;
                4
            }
            _ => 3, // the BMP, or a lone surrogate (U+FFFD)
        };
    }
    n
}

/// One token of one choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoggedToken {
    pub logprob: Option<f64>,
    /// Its text (traced requests only).
    pub text: Option<Span>,
}

/// A top alternative of a token (traced requests only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoggedAlt {
    /// Index of its token in [`TokenLog::tokens`].
    pub token: u32,
    pub text: Span,
    pub logprob: Option<f64>,
}

/// One choice entry of the payload, logged when it carried tokens or (traced) output.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedChoice {
    pub index: u32,
    pub phases: Phases,
    /// Decoded bytes of its `content` / `reasoning` / `text` (traced requests only).
    pub text_len: u32,
    /// Its tokens: a range of [`TokenLog::tokens`].
    pub tokens: Range<u32>,
}

/// The reused per-payload buffer (see the module docs).
#[derive(Debug, Default)]
pub struct TokenLog {
    /// A traced request: also note token texts, alternatives and text lengths.
    pub detail: bool,
    pub choices: Vec<LoggedChoice>,
    pub tokens: Vec<LoggedToken>,
    pub alternatives: Vec<LoggedAlt>,
    /// The payload's tool-call entries, untraced too (see [`super::calls`]).
    pub calls: Vec<LoggedCall>,
    /// Offset of the scanned (trimmed) payload in the one given (spans are of the latter).
    pub(super) lead: usize,
    /// A non-streaming body: calls are read from `message`, not from `delta`.
    pub(super) body: bool,
    /// Completions arrays, staged until the `logprobs` object ends.
    legacy_lp: Vec<Option<f64>>,
    legacy_text: Vec<Option<Span>>,
    legacy_alts: Vec<LoggedAlt>,
}

/// Where a choice's entries start, to drop them when a repeated key replaces them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    tokens: usize,
    alts: usize,
    pub(super) calls: usize,
}

impl TokenLog {
    /// A buffer; `detail`: note texts and alternatives too (a traced request).
    pub fn new(detail: bool) -> Self {
        Self {
            detail,
            ..Self::default()
        }
    }

    /// Forget the last payload's entries (keeps the capacity).
    pub fn clear(&mut self) {
        self.choices.clear();
        self.tokens.clear();
        self.alternatives.clear();
        self.calls.clear();
    }

    /// Nothing logged since the last [`TokenLog::clear`].
    pub fn is_empty(&self) -> bool {
        self.choices.is_empty()
            && self.tokens.is_empty()
            && self.alternatives.is_empty()
            && self.calls.is_empty()
    }

    /// The tokens of a logged choice.
    pub fn tokens_of(&self, c: &LoggedChoice) -> &[LoggedToken] {
        self.tokens
            .get(c.tokens.start as usize..c.tokens.end as usize)
            .unwrap_or_default()
    }

    pub(super) fn mark(&self) -> Mark {
        Mark {
            tokens: self.tokens.len(),
            alts: self.alternatives.len(),
            calls: self.calls.len(),
        }
    }

    pub(super) fn truncate(&mut self, m: Mark) {
        self.tokens.truncate(m.tokens);
        self.alternatives.truncate(m.alts);
    }

    /// A choice was read whole: log it if it carried tokens, or output in a traced request;
    /// its tool calls learn its index.
    pub(super) fn end_choice(&mut self, m: Mark, index: u32, phases: Phases, text_len: u32) {
        for call in self.calls.get_mut(m.calls..).unwrap_or_default() {
            call.choice = index;
        }
        let tokens = m.tokens as u32..self.tokens.len() as u32;
        if !tokens.is_empty() || (self.detail && !phases.is_empty()) {
            self.choices.push(LoggedChoice {
                index,
                phases,
                text_len,
                tokens,
            });
        }
    }

    /// A repeated `choices` key: everything logged so far belongs to the replaced array.
    pub(super) fn restart(&mut self) {
        self.clear();
    }

    /// Reads one choice's `logprobs` object (not null) into the log from `m`; returns the
    /// tokens it counts, as [`super::read_logprobs`] does (and refuses what it refuses).
    pub(super) fn read_logprobs(&mut self, c: &mut Cursor<'_>, m: Mark) -> Scan<u32> {
        self.truncate(m);
        self.legacy_lp.clear();
        self.legacy_text.clear();
        self.legacy_alts.clear();
        let (mut chat, mut legacy): (Scan<Option<u32>>, Scan<Option<u32>>) = (Ok(None), Ok(None));
        c.object(|c, key| {
            match key.one_of(&[b"content", b"tokens", b"token_logprobs", b"top_logprobs"]) {
                Some(0) => {
                    self.truncate(m);
                    chat = if c.null() {
                        Ok(None)
                    } else {
                        c.read_or_skip(|c| self.read_chat_entries(c))?.map(Some)
                    };
                }
                Some(1) => {
                    self.legacy_text.clear();
                    legacy = if c.null() {
                        Ok(None)
                    } else {
                        c.read_or_skip(|c| self.read_legacy_tokens(c))?.map(Some)
                    };
                }
                Some(2) => {
                    self.legacy_lp.clear();
                    self.read_legacy_logprobs(c)?;
                }
                Some(3) => {
                    self.legacy_alts.clear();
                    if self.detail && c.peek() == Some(b'[') {
                        self.read_legacy_alternatives(c)?;
                    } else {
                        c.skip()?;
                    }
                }
                _ => c.skip()?,
            }
            Ok(())
        })?;
        let (chat, legacy) = (chat?, legacy?);
        if let Some(n) = chat {
            return Ok(n);
        }
        // No chat entries: the completions arrays make the tokens.
        self.truncate(m);
        let n = legacy.unwrap_or(0);
        for j in 0..n as usize {
            self.tokens.push(LoggedToken {
                logprob: self.legacy_lp.get(j).copied().flatten(),
                text: self
                    .legacy_text
                    .get(j)
                    .copied()
                    .flatten()
                    .filter(|_| self.detail),
            });
        }
        for a in &self.legacy_alts {
            if a.token < n {
                self.alternatives.push(LoggedAlt {
                    token: a.token + m.tokens as u32,
                    ..*a
                });
            }
        }
        Ok(n)
    }

    fn read_chat_entries(&mut self, c: &mut Cursor<'_>) -> Scan<u32> {
        let mut n = 0u32;
        c.array(|c| {
            n = n.saturating_add(1);
            if c.peek() == Some(b'{') {
                self.read_chat_entry(c)
            } else {
                self.tokens.push(LoggedToken {
                    logprob: None,
                    text: None,
                });
                c.skip()
            }
        })?;
        Ok(n)
    }

    /// `{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", ...}]}`.
    fn read_chat_entry(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        let at = self.tokens.len() as u32;
        let alts = self.alternatives.len();
        let (mut logprob, mut text) = (None, None);
        let (lead, detail) = (self.lead, self.detail);
        c.object(|c, key| {
            match key.one_of(&[b"logprob", b"token", b"top_logprobs"]) {
                Some(0) => logprob = number(c)?,
                Some(1) if detail => text = string(c, lead)?,
                Some(2) if detail => {
                    self.alternatives.truncate(alts);
                    if c.peek() == Some(b'[') {
                        c.array(|c| self.read_chat_alternative(c, at))?;
                    } else {
                        c.skip()?;
                    }
                }
                _ => c.skip()?,
            }
            Ok(())
        })?;
        self.tokens.push(LoggedToken { logprob, text });
        Ok(())
    }

    fn read_chat_alternative(&mut self, c: &mut Cursor<'_>, token: u32) -> Scan<()> {
        if c.peek() != Some(b'{') {
            return c.skip();
        }
        let (mut logprob, mut text) = (None, None);
        let lead = self.lead;
        c.object(|c, key| {
            match key.one_of(&[b"logprob", b"token"]) {
                Some(0) => logprob = number(c)?,
                Some(1) => text = string(c, lead)?,
                _ => c.skip()?,
            }
            Ok(())
        })?;
        if let Some(text) = text {
            self.alternatives.push(LoggedAlt {
                token,
                text,
                logprob,
            });
        }
        Ok(())
    }

    /// `tokens`: an array (else [`crate::scan::Malformed`], as the count refuses it); the
    /// entries are read even untraced (cheap: spans), a token's text is kept only traced.
    fn read_legacy_tokens(&mut self, c: &mut Cursor<'_>) -> Scan<u32> {
        let mut n = 0u32;
        let lead = self.lead;
        c.array(|c| {
            n = n.saturating_add(1);
            let s = string(c, lead)?;
            self.legacy_text.push(s);
            Ok(())
        })?;
        Ok(n)
    }

    fn read_legacy_logprobs(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        if c.peek() != Some(b'[') {
            return c.skip();
        }
        c.array(|c| {
            let lp = number(c)?;
            self.legacy_lp.push(lp);
            Ok(())
        })
    }

    /// `top_logprobs`: one `{token: logprob}` object per token position.
    fn read_legacy_alternatives(&mut self, c: &mut Cursor<'_>) -> Scan<()> {
        let mut j = 0u32;
        let lead = self.lead;
        c.array(|c| {
            if c.peek() == Some(b'{') {
                c.object(|c, key| {
                    let text = Span::of(c, key, lead);
                    let logprob = number(c)?;
                    self.legacy_alts.push(LoggedAlt {
                        token: j,
                        text,
                        logprob,
                    });
                    Ok(())
                })?;
            } else {
                c.skip()?;
            }
            j += 1;
            Ok(())
        })
    }
}

/// A number value, or `None` (skipped) for any other value.
fn number(c: &mut Cursor<'_>) -> Scan<Option<f64>> {
    match c.peek() {
        Some(b'-' | b'0'..=b'9') => c.float().map(Some),
        _ => c.skip().map(|()| None),
    }
}

/// A string value, or `None` (skipped) for any other value.
fn string(c: &mut Cursor<'_>, lead: usize) -> Scan<Option<Span>> {
    if c.peek() == Some(b'"') {
        let s = c.string()?;
        Ok(Some(Span::of(c, s, lead)))
    } else {
        c.skip().map(|()| None)
    }
}

/// A text field (`content`, `reasoning`, `text`): whether it carries output (as
/// [`Cursor::non_empty`] says) and, when it is a string, its decoded length (for the trace).
pub(super) fn text_field(c: &mut Cursor<'_>) -> Scan<(bool, u32)> {
    if c.peek() == Some(b'"') {
        let s = c.string()?;
        let len = if s.escaped() {
            decoded_len(s.raw())
        } else {
            s.raw().len()
        };
        Ok((!s.is_empty(), len as u32))
    } else {
        c.non_empty().map(|n| (n, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescaped_values_are_serde_jsons_and_lone_surrogates_are_replaced() {
        for s in [
            "plain",
            r#"a\nb\t\r\b\f\/\\\"c"#,
            r"\u00e9t\u00E9 \u20ac",
            r"\ud83d\ude00!",
            r"x\u0000y\u001f",
            r"日本 \u65e5",
        ] {
            let want: String = serde_json::from_str(&format!("\"{s}\"")).unwrap();
            let mut got = String::from("<");
            unescape_into(s.as_bytes(), &mut got);
            assert_eq!(got, format!("<{want}"), "{s}");
            assert_eq!(decoded_len(s.as_bytes()), want.len(), "{s}");
        }
        for (s, want) in [
            (r"\ud800x", "\u{FFFD}x"),
            (r"\udc00\ud83d", "\u{FFFD}\u{FFFD}"),
            (r"\ud800\u0041", "\u{FFFD}A"),
        ] {
            let mut got = String::new();
            unescape_into(s.as_bytes(), &mut got);
            assert_eq!(got, want, "{s}");
            assert_eq!(decoded_len(s.as_bytes()), want.len(), "{s}");
        }
    }

    #[test]
    fn decoded_lengths() {
        for s in [
            "plain",
            "a\\nb",
            "\\u00e9t\\u00e9",
            "\\ud83d\\ude00!",
            "\\ud800x",
            "\\u20ac",
            "\\\"q\\\"",
        ] {
            let quoted = format!("\"{s}\"");
            let want = serde_json::from_str::<String>(&quoted)
                .map(|v| v.len())
                .unwrap_or(3 + 1); // a lone surrogate: U+FFFD (3 bytes) + "x"
            assert_eq!(decoded_len(s.as_bytes()), want, "{s}");
        }
    }
}
