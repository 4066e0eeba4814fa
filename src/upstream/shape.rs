//! What the balancer reads from a request body, without parsing it or a tokenizer: the prompt
//! text cut into fixed-size blocks with a chain hash each (a block's hash covers everything
//! before it, so two requests share block k's hash exactly when their prompts agree up to the
//! end of block k), and the request's size in estimated tokens.
//!
//! The prompt text is the body from its `"messages"` (chat) or `"prompt"` (completions) key
//! on: clients serialize one conversation the same way each time, so the JSON text of a shared
//! system prompt is a shared byte prefix there. Fields after the messages (`max_tokens`, ...)
//! only reach the last, partial, block, which is never hashed.

use std::hash::BuildHasher;
use std::sync::LazyLock;

use foldhash::fast::FixedState;
use memchr::memmem::Finder;

/// Blocks hashed at most (the rest of a very long prompt adds nothing to a routing choice).
pub const MAX_BLOCKS: usize = 64;
/// Output tokens assumed when the request sets no `max_tokens`.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;
/// Bytes of prompt JSON per token, roughly (English text, BPE vocabularies).
pub const BYTES_PER_TOKEN: u64 = 4;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// Chain hashes of the prompt's full blocks, in order.
    pub blocks: Vec<u64>,
    /// Estimated prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens the request may ask for (`max_tokens`, else a default).
    pub output_tokens: u64,
}

// Built once: building a searcher costs more than a search through a request body.
static MESSAGES: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"messages\""));
static PROMPT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"prompt\""));
static MAX_COMPLETION_TOKENS: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"max_completion_tokens\""));
static MAX_TOKENS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"max_tokens\""));

impl Shape {
    /// `block_bytes`: prompt bytes per block (config `balance.prefix_block_bytes`).
    pub fn of(body: &[u8], block_bytes: usize) -> Shape {
        let start = MESSAGES
            .find(body)
            .or_else(|| PROMPT.find(body))
            .unwrap_or(body.len());
        let prompt = &body[start..];
        let hasher = FixedState::with_seed(0x7072_6566_6978);
        let mut parent = 0u64;
        let blocks = prompt
            .chunks_exact(block_bytes.max(1))
            .take(MAX_BLOCKS)
            .map(|b| {
                parent = hasher.hash_one((parent, b));
                parent
            })
            .collect();
        Shape {
            blocks,
            prompt_tokens: (prompt.len() as u64).div_ceil(BYTES_PER_TOKEN),
            output_tokens: max_tokens(body).unwrap_or(DEFAULT_OUTPUT_TOKENS),
        }
    }

    /// Tokens this request brings to a replica: its prompt and the output it may ask for.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens + self.output_tokens
    }

    /// Estimated prompt tokens in its first `blocks` prefix blocks of `block_bytes` each.
    pub fn cached_tokens(&self, blocks: usize, block_bytes: usize) -> u64 {
        let bytes = (blocks as u64).saturating_mul(block_bytes as u64);
        (bytes / BYTES_PER_TOKEN).min(self.prompt_tokens)
    }

    /// Tokens it brings to a replica whose engine holds those blocks: the cached prompt costs
    /// that engine no prefill (and its KV blocks are shared, not taken again), so only the
    /// rest of the prompt and the output count.
    pub fn uncached_tokens(&self, blocks: usize, block_bytes: usize) -> u64 {
        self.tokens() - self.cached_tokens(blocks, block_bytes)
    }
}

/// `max_tokens` or `max_completion_tokens` as a plain integer (anything else: unknown).
fn max_tokens(body: &[u8]) -> Option<u64> {
    [&*MAX_COMPLETION_TOKENS, &*MAX_TOKENS]
        .iter()
        .find_map(|key| {
            let at = key.find(body)? + key.needle().len();
            let rest = &body[at..];
            let colon = rest.iter().position(|&c| c == b':')?;
            if !rest[..colon].iter().all(u8::is_ascii_whitespace) {
                return None;
            }
            // The digit run read as `str::parse::<u64>` reads it (none, or too many: no
            // number), without collecting it first.
            let mut digits = rest[colon + 1..]
                .iter()
                .skip_while(|c| c.is_ascii_whitespace())
                .take_while(|c| c.is_ascii_digit())
                .peekable();
            digits.peek()?;
            digits.try_fold(0u64, |n, &d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(system: &str, user: &str, tail: &str) -> Vec<u8> {
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}]{tail}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn the_same_prefix_gives_the_same_hashes() {
        let sys = "You are a careful assistant. ".repeat(40);
        let a = Shape::of(&chat(&sys, "first question", ""), 64);
        let b = Shape::of(&chat(&sys, "another one entirely", ",\"stream\":true"), 64);
        assert!(a.blocks.len() >= 18, "{}", a.blocks.len());
        let shared = sys.len() / 64;
        assert_eq!(a.blocks[..shared], b.blocks[..shared]);
        // A different model name before the messages changes nothing.
        let c = Shape::of(&chat(&sys, "first question", "").replace_model("other"), 64);
        assert_eq!(a.blocks, c.blocks);
    }

    trait ReplaceModel {
        fn replace_model(self, m: &str) -> Vec<u8>;
    }
    impl ReplaceModel for Vec<u8> {
        fn replace_model(self, m: &str) -> Vec<u8> {
            String::from_utf8(self)
                .unwrap()
                .replacen("\"m\"", &format!("\"{m}\""), 1)
                .into_bytes()
        }
    }

    #[test]
    fn one_character_changed_in_block_k_changes_blocks_k_onwards_only() {
        let sys = "abcdefgh".repeat(100);
        let body = chat(&sys, "q", "");
        let a = Shape::of(&body, 64);
        for k in [0usize, 3, 7] {
            let mut changed = body.clone();
            let start = memchr::memmem::find(&body, b"\"messages\"").unwrap();
            changed[start + k * 64 + 40] ^= 1;
            let b = Shape::of(&changed, 64);
            assert_eq!(a.blocks[..k], b.blocks[..k], "k={k}");
            assert!(
                a.blocks[k..]
                    .iter()
                    .zip(&b.blocks[k..])
                    .all(|(x, y)| x != y),
                "k={k}"
            );
        }
    }

    #[test]
    fn sizes_and_limits() {
        let cases: &[(&str, u64, u64)] = &[
            // The prompt is estimated from its key on: 30 bytes, 8 tokens.
            (r#"{"messages":[],"max_tokens":12}"#, 8, 12),
            (
                r#"{"prompt":"abcd","max_completion_tokens": 7,"max_tokens":3}"#,
                15,
                7,
            ),
            (
                r#"{"messages":[],"max_tokens":"12"}"#,
                8,
                DEFAULT_OUTPUT_TOKENS,
            ),
            (r#"{"model":"x"}"#, 0, DEFAULT_OUTPUT_TOKENS),
            ("", 0, DEFAULT_OUTPUT_TOKENS),
        ];
        for &(body, prompt, output) in cases {
            let s = Shape::of(body.as_bytes(), 16);
            assert_eq!(
                (s.prompt_tokens, s.output_tokens),
                (prompt, output),
                "{body}"
            );
        }
        let huge = chat(&"x".repeat(100_000), "q", "");
        assert_eq!(Shape::of(&huge, 64).blocks.len(), MAX_BLOCKS);
    }

    /// `max_tokens` read by collecting the digit run and parsing it: the definition.
    fn max_tokens_parsed(body: &[u8]) -> Option<u64> {
        [&*MAX_COMPLETION_TOKENS, &*MAX_TOKENS]
            .iter()
            .find_map(|key| {
                let at = key.find(body)? + key.needle().len();
                let rest = &body[at..];
                let colon = rest.iter().position(|&c| c == b':')?;
                if !rest[..colon].iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                let digits: Vec<u8> = rest[colon + 1..]
                    .iter()
                    .skip_while(|c| c.is_ascii_whitespace())
                    .take_while(|c| c.is_ascii_digit())
                    .copied()
                    .collect();
                std::str::from_utf8(&digits).ok()?.parse().ok()
            })
    }

    proptest::proptest! {
        #[test]
        fn max_tokens_reads_the_digits_as_parse_does(
            key in proptest::sample::select(vec!["max_tokens", "max_completion_tokens"]),
            before in "[ :]{0,2}",
            after in "[ \t]{0,2}",
            digits in "[0-9]{0,24}",
            tail in "[0-9a-z,}\"]{0,3}",
            second in proptest::option::of("[0-9]{0,21}"),
        ) {
            let mut body = format!(r#"{{"{key}"{before}:{after}{digits}{tail}"#);
            if let Some(d) = second {
                body.push_str(&format!(r#","max_tokens":{d}}}"#));
            }
            proptest::prop_assert_eq!(max_tokens(body.as_bytes()), max_tokens_parsed(body.as_bytes()));
        }

        #[test]
        fn max_tokens_of_any_bytes_is_parse_s(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut with_key = b"\"max_tokens\":".to_vec();
            with_key.extend_from_slice(&body);
            for b in [&body, &with_key] {
                proptest::prop_assert_eq!(max_tokens(b), max_tokens_parsed(b));
            }
        }
    }

    #[test]
    fn a_cached_prefix_leaves_the_rest_of_the_prompt_and_the_output() {
        let s = Shape {
            blocks: vec![1, 2, 3],
            prompt_tokens: 200,
            output_tokens: 30,
        };
        // (cached blocks, block bytes, tokens it brings)
        let cases: &[(usize, usize, u64)] = &[
            (0, 256, 230),
            (1, 256, 166),
            (3, 256, 38),
            // never below the output, however much is said to be cached
            (4, 256, 30),
            (usize::MAX, 65_536, 30),
        ];
        for &(blocks, bytes, want) in cases {
            assert_eq!(s.uncached_tokens(blocks, bytes), want, "{blocks} x {bytes}");
        }
    }
}
