//! Deterministic text: a small vocabulary of byte-level BPE-like pieces (as a random-weight
//! model emits), a seeded generator, and the prompt-token estimate.

use std::sync::OnceLock;

/// SplitMix64: tiny, fast, stable across versions (the bytes a seed produces never change).
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a over bytes, finished with a mixer: a stable hash for ids and seeds.
pub fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(h)
}

/// Pieces the tiny random-weight vLLM model was seen to emit, plus common code and English
/// pieces. Includes a control character and a multi-line whitespace piece so clients meet
/// JSON escapes.
const PIECES: &[&str] = &[
    "SE",
    " will",
    "ra",
    "vered",
    " license",
    "def",
    "sage",
    "strip",
    "{",
    "help",
    " l",
    "ython",
    "ence",
    " Un",
    " ne",
    "ow",
    "test",
    "ial",
    "\u{1e}",
    " automat",
    "char",
    "\n\n           ",
    "ci",
    "mplement",
    " end",
    "gra",
    "ta",
    "A",
    "F",
    " to",
    "ample",
    "lic",
    "yp",
    " the",
    " of",
    " and",
    " a",
    " in",
    " is",
    " for",
    " that",
    " with",
    " as",
    " on",
    " be",
    " by",
    " this",
    " are",
    " or",
    " from",
    " it",
    " not",
    " at",
    " an",
    " if",
    " return",
    " self",
    " None",
    " True",
    " False",
    " import",
    " class",
    "(",
    ")",
    ":",
    ".",
    ",",
    "\n",
    "    ",
    "_",
    "=",
    " =",
    "[",
    "]",
    "'",
    "\"",
    " #",
    "ing",
    "ed",
    "er",
    "es",
    "ion",
    "al",
    "re",
    "on",
    "at",
    "en",
    "or",
    "an",
    "ar",
    "st",
    "ent",
    "ic",
    "le",
    "it",
    "ro",
    "ul",
    "ation",
    "ter",
    "ure",
    "get",
    "set",
    "value",
    "name",
    "path",
    "file",
    "data",
    "list",
    "dict",
    " str",
    " int",
    " len",
    " range",
    " print",
    " raise",
    " except",
    " try",
    " else",
    " elif",
    " while",
    " yield",
    " lambda",
    " with",
    " open",
    "args",
    "kw",
    "arg",
    "obj",
    "key",
    "item",
    "result",
    " Software",
    " Foundation",
    " GNU",
    " General",
    " Public",
    " License",
    " version",
    " any",
    " copy",
    " modify",
    " distribute",
    " warranty",
    " program",
    " free",
    " under",
    " terms",
    " See",
    " You",
    " should",
    " have",
    " received",
    " along",
    " Python",
    " module",
    " function",
    " string",
    " object",
    " error",
    " Error",
    " type",
    " default",
    " format",
    "0",
    "1",
    "2",
    " 0",
    " 1",
    "x",
    "y",
    "z",
    "i",
    "n",
    "s",
    "t",
    "e",
    "d",
    "p",
    "m",
    "b",
    "c",
    "f",
    "g",
    "h",
    " how",
    " are",
    " you",
    " Hello",
    " world",
    "!",
    "?",
    " -",
    "->",
    "==",
    "!=",
    "<",
    ">",
    " <",
    " >",
    "++",
    "--",
    "**",
    " *",
    "/",
    " /",
    "\\",
    "@",
    "%",
    " %",
    "&",
    "|",
    "~",
    "^",
    "é",
    "ü",
    "—",
    "…",
    "→",
    "✓",
    "日本",
    "中文",
];

/// A vocabulary entry, pre-rendered for the hot path.
#[derive(Debug)]
pub struct Piece {
    pub text: &'static str,
    /// JSON string literal, quotes included.
    pub json: String,
    /// `[b0,b1,...]`, the UTF-8 bytes as vLLM's `bytes` logprob field.
    pub bytes_json: String,
    /// Length in characters (Python `len`), for legacy `text_offset`.
    pub chars: u32,
}

pub fn vocab() -> &'static [Piece] {
    static V: OnceLock<Vec<Piece>> = OnceLock::new();
    V.get_or_init(|| {
        PIECES
            .iter()
            .map(|&p| Piece {
                text: p,
                json: json_str(p),
                bytes_json: bytes_json(p.as_bytes()),
                chars: p.chars().count() as u32,
            })
            .collect()
    })
}

/// A JSON string literal for `s`, escaped as Python's `json.dumps(ensure_ascii=False)` does.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_str(&mut out, s);
    out
}

pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn bytes_json(b: &[u8]) -> String {
    let parts: Vec<String> = b.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// A logprob near ln(1/2048) as a random-weight model gives, rounded through f32 like vLLM.
pub fn logprob(rng: &mut SplitMix) -> f64 {
    (-7.62462f32 + (rng.next_f64() as f32) * 5e-6) as f64
}

/// Prompt tokens of a text: one per run of letters/digits (with its leading space), one per
/// other visible character. Exact for the captured chat prompts; an estimate otherwise.
pub fn estimate_tokens(s: &str) -> u64 {
    let mut n = 0u64;
    let mut in_word = false;
    for c in s.chars() {
        if c.is_alphanumeric() || c == '_' {
            if !in_word {
                n += 1;
                in_word = true;
            }
        } else {
            in_word = false;
            if !c.is_whitespace() {
                n += 1;
            }
        }
    }
    n
}

/// ChatML framing cost of a chat prompt (`<|im_start|>role\n ... <|im_end|>\n` per message
/// plus the assistant header), fitted to the captures: 15 tokens for one `Hello` message.
pub const CHAT_BASE_TOKENS: u64 = 6;
pub const CHAT_PER_MESSAGE_TOKENS: u64 = 8;

/// A multiplicative jitter factor with mean 1 drawn from `kind`.
pub fn jitter_factor(kind: super::config::Jitter, cv: f64, rng: &mut SplitMix) -> f64 {
    use super::config::Jitter;
    match kind {
        Jitter::Constant => 1.0,
        Jitter::Normal => (1.0 + cv * std_normal(rng)).max(0.0),
        Jitter::Lognormal => {
            if cv == 0.0 {
                return 1.0;
            }
            let s2 = (1.0 + cv * cv).ln();
            (-0.5 * s2 + s2.sqrt() * std_normal(rng)).exp()
        }
        Jitter::Exponential => -(1.0 - rng.next_f64()).ln(),
    }
}

fn std_normal(rng: &mut SplitMix) -> f64 {
    // Box-Muller; u1 in (0, 1] so ln is finite.
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Jitter;

    #[test]
    fn chat_prompt_estimate_matches_captures() {
        // stream-chat.txt 20, nonstream-chat.txt 15, stream-chat-usage.txt 32.
        let chat = |msgs: &[&str]| {
            CHAT_BASE_TOKENS
                + msgs
                    .iter()
                    .map(|m| CHAT_PER_MESSAGE_TOKENS + estimate_tokens(m))
                    .sum::<u64>()
        };
        assert_eq!(chat(&["Hello, how are you?"]), 20);
        assert_eq!(chat(&["Hello"]), 15);
        assert_eq!(chat(&["You are terse.", "Hello, how are you?"]), 32);
    }

    #[test]
    fn json_escaping_is_pythonic() {
        let table = [
            ("a", "\"a\""),
            ("\u{1e}", "\"\\u001e\""),
            ("\n\t\"\\", "\"\\n\\t\\\"\\\\\""),
            ("é", "\"é\""),
        ];
        for (s, want) in table {
            assert_eq!(json_str(s), want);
        }
        for p in vocab() {
            let back: String = serde_json::from_str(&p.json).unwrap();
            assert_eq!(back, p.text);
            let bytes: Vec<u8> = serde_json::from_str(&p.bytes_json).unwrap();
            assert_eq!(bytes, p.text.as_bytes());
        }
    }

    #[test]
    fn logprob_formats_like_the_capture() {
        let mut r = SplitMix::new(1);
        let s = format!("{:?}", logprob(&mut r));
        assert!(s.starts_with("-7.6246"), "{s}");
    }

    #[test]
    fn jitter_means_are_one() {
        for kind in [Jitter::Normal, Jitter::Lognormal, Jitter::Exponential] {
            let mut r = SplitMix::new(3);
            let n = 20_000;
            let mean: f64 = (0..n)
                .map(|_| jitter_factor(kind, 0.3, &mut r))
                .sum::<f64>()
                / n as f64;
            assert!((mean - 1.0).abs() < 0.05, "{kind:?} {mean}");
        }
        assert_eq!(
            jitter_factor(Jitter::Constant, 0.3, &mut SplitMix::new(1)),
            1.0
        );
    }
}
