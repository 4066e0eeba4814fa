//! The prompt as a sequence of token ids, without a tokenizer: one id per unit that
//! [`estimate_tokens`](super::text::estimate_tokens) counts (a run of letters/digits, or one
//! other visible character), plus fixed ids for the chat template's framing. The prefix cache
//! hashes these ids in blocks, so two prompts share cached blocks exactly where their text
//! (and framing) is the same, as on a real engine.

use serde_json::{Map, Value};

use super::request::Api;
use super::text::{hash_bytes, mix64, CHAT_BASE_TOKENS, CHAT_PER_MESSAGE_TOKENS};

/// Ids of a text's units, in order (as many as `estimate_tokens` counts).
pub fn push_text_ids(s: &str, out: &mut Vec<u32>) {
    let mut word_start: Option<usize> = None;
    for (i, c) in s.char_indices() {
        if c.is_alphanumeric() || c == '_' {
            word_start.get_or_insert(i);
            continue;
        }
        if let Some(start) = word_start.take() {
            out.push(unit_id(&s.as_bytes()[start..i]));
        }
        if !c.is_whitespace() {
            let mut b = [0u8; 4];
            out.push(unit_id(c.encode_utf8(&mut b).as_bytes()));
        }
    }
    if let Some(start) = word_start {
        out.push(unit_id(&s.as_bytes()[start..]));
    }
}

fn unit_id(bytes: &[u8]) -> u32 {
    hash_bytes(0x70_6b, bytes) as u32
}

/// Fixed ids of template framing: `kind` tells the role header from the assistant header.
fn frame_ids(kind: u64, n: u64, out: &mut Vec<u32>) {
    out.extend((0..n).map(|j| mix64(kind.wrapping_mul(0x9e37) ^ j) as u32));
}

/// Ids of a validated request's prompt (chat: each message's framing then its text, then the
/// assistant header; completions: the text, or the token ids as given).
pub fn prompt_ids(api: Api, obj: &Map<String, Value>) -> Vec<u32> {
    let mut out = Vec::new();
    match api {
        Api::Chat => {
            let msgs = obj.get("messages").and_then(Value::as_array);
            for m in msgs.into_iter().flatten() {
                let role = m.get("role").and_then(Value::as_str).unwrap_or("");
                frame_ids(
                    hash_bytes(1, role.as_bytes()),
                    CHAT_PER_MESSAGE_TOKENS,
                    &mut out,
                );
                match m.get("content") {
                    Some(Value::String(s)) => push_text_ids(s, &mut out),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .for_each(|t| push_text_ids(t, &mut out)),
                    _ => {}
                }
            }
            frame_ids(2, CHAT_BASE_TOKENS, &mut out);
        }
        Api::Completions => match obj.get("prompt") {
            Some(Value::String(s)) => push_text_ids(s, &mut out),
            Some(Value::Array(items)) => {
                for v in items {
                    match v {
                        Value::String(s) => push_text_ids(s, &mut out),
                        v => out.push(v.as_u64().unwrap_or(0) as u32),
                    }
                }
            }
            _ => {}
        },
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::estimate_tokens;

    #[test]
    fn one_id_per_counted_unit() {
        for s in [
            "",
            "Hello",
            "Hello, how are you?",
            "  a_b  c9 -- é日本 ",
            "x",
            "fn main() { println!(\"hi\"); }",
        ] {
            let mut ids = Vec::new();
            push_text_ids(s, &mut ids);
            assert_eq!(ids.len() as u64, estimate_tokens(s), "{s:?}");
        }
    }

    #[test]
    fn same_text_same_ids_and_a_change_stays_local() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        push_text_ids("alpha beta gamma delta", &mut a);
        push_text_ids("alpha beta gamma epsilon", &mut b);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
    }

    #[test]
    fn chat_ids_count_like_the_prompt_estimate() {
        let v: Value = serde_json::from_str(
            r#"{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":[{"type":"text","text":"Hello, how are you?"}]}]}"#,
        )
        .unwrap();
        let ids = prompt_ids(Api::Chat, v.as_object().unwrap());
        // The capture's count for this prompt (stream-chat-usage.txt).
        assert_eq!(ids.len(), 32);
        let c: Value = serde_json::from_str(r#"{"prompt":[1,2,3]}"#).unwrap();
        assert_eq!(
            prompt_ids(Api::Completions, c.as_object().unwrap()),
            vec![1, 2, 3]
        );
    }
}
