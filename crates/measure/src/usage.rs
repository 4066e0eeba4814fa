//! Exact token counts for streams whose client did not ask for usage:
//! [`inject_include_usage`] adds `"stream_options":{"include_usage":true}` to the request, and
//! the meter's usage strip (`meter::strip`) removes what that changes from the response, so the
//! client receives byte-for-byte the stream it would have got without injection.
//!
//! Pure: request bytes in, request bytes out.

use serde_json::value::RawValue;

#[cfg(test)]
use crate::agent::ToolSet;
use crate::request::{lax_bool, object_fields, Lax, RequestFields};
#[cfg(test)]
use crate::request::{peek_request, RequestPeek};

const INCLUDE_USAGE: &[u8] = br#""include_usage":true"#;

/// `n` is absent, null, or one (pydantic's lax int also takes `1.0` and `"1"`).
fn single_choice(n: Option<&str>) -> bool {
    let Some(n) = n else { return true };
    let text = n.trim();
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    text == "null" || text.parse::<f64>().is_ok_and(|v| v == 1.0)
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
/// is injected, `None` to leave the request alone. The rule is "the client gets what its engine
/// would have sent it": the proxy injects only where it knows the engine would have sent no
/// usage chunk, so that stripping the chunk restores the client's stream exactly.
///
/// Injected, for a stream (`stream` lax-true, see [`crate::request`]) with one choice:
/// - no `stream_options`, or `null`: every vLLM version sends no usage;
/// - `include_usage` lax-false or `null`: the client said no usage; it is set to `true`.
///
/// Left alone:
/// - `include_usage` lax-true: the client asked, the usage chunk is its own;
/// - `stream_options` without `include_usage` (e.g. `{}`): vLLM 0.32 sends no usage, newer
///   vLLM defaults `include_usage` to true; the proxy cannot know which it fronts, so it
///   counts tokens from events (`tokens_exact: false` unless usage arrives anyway);
/// - `continuous_usage_stats` lax-true: usage would ride on every chunk and could not be
///   removed byte-exactly;
/// - `n` above 1: every finish chunk would lose its `system_fingerprint` to the usage chunk,
///   and one that came long before could only be restored by holding it back;
/// - anything the engine would refuse (a `stream_options` or flag that is not a boolean to
///   pydantic, a body that is not a JSON object, invalid UTF-8): the engine answers it,
///   unchanged.
pub fn inject_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    // Invalid UTF-8 is no JSON to the engine (a 400); serde_json skips ignored strings
    // without checking it, so it is checked here (found by the rewriter's proptest).
    let text = std::str::from_utf8(body).ok()?;
    // Of a key given twice the engine reads the last: that is the one read and rewritten.
    let [stream, stream_options, n] =
        object_fields(text.as_bytes(), ["stream", "stream_options", "n"])?;
    let [stream, stream_options, n] = [stream, stream_options, n].map(|v| v.map(RawValue::get));
    Some(plan(text, stream, stream_options, n)?.apply(body))
}

/// [`inject_include_usage`] from the fields of the one pass over the body (`body` is what
/// `fields` were read from): the rewrite it would make, to apply later
/// ([`Injection::apply`]). `usage::props::check` holds the two alike on any bytes.
pub fn injection(body: &str, fields: &RequestFields<'_>) -> Option<Injection> {
    plan(body, fields.stream, fields.stream_options, fields.n)
}

/// Where usage injection rewrites a body: `remove` bytes at `at` replaced by `insert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injection {
    at: usize,
    remove: usize,
    insert: &'static [&'static [u8]],
}

impl Injection {
    /// The rewritten body (`body` is the one this was planned for).
    pub fn apply(&self, body: &[u8]) -> Vec<u8> {
        splice(body, self.at, self.remove, self.insert)
    }
}

/// The rewrite for a body (valid UTF-8, `text`) with these JSON texts of `stream`,
/// `stream_options` and `n` (slices of `text`).
fn plan(
    text: &str,
    stream: Option<&str>,
    stream_options: Option<&str>,
    n: Option<&str>,
) -> Option<Injection> {
    let body = text.as_bytes();
    if !lax_bool(stream).is_true() || !single_choice(n) {
        return None;
    }
    let Some(opts) = stream_options else {
        // No stream_options: add the key before the object's closing brace.
        let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
        if body[end] != b'}' {
            return None;
        }
        return Some(Injection {
            at: end,
            remove: 0,
            insert: &[br#","stream_options":{"#, INCLUDE_USAGE, b"}"],
        });
    };
    let opts_at = offset_in(body, opts);
    let text = opts;
    if text == "null" {
        return Some(Injection {
            at: opts_at,
            remove: text.len(),
            insert: &[b"{", INCLUDE_USAGE, b"}"],
        });
    }
    if !text.starts_with('{') {
        return None;
    }
    let [include_usage, continuous_usage_stats] =
        object_fields(text.as_bytes(), ["include_usage", "continuous_usage_stats"])?;
    let continuous_usage_stats = lax_bool(continuous_usage_stats.map(RawValue::get));
    if continuous_usage_stats == Lax::Invalid || continuous_usage_stats.is_true() {
        return None;
    }
    let v = include_usage?.get(); // absent: the engine's default decides (see above)
    match lax_bool(Some(v)) {
        Lax::Bool(false) | Lax::Unset => Some(Injection {
            at: offset_in(body, v),
            remove: v.len(),
            insert: &[b"true"],
        }),
        Lax::Bool(true) | Lax::Invalid => None,
    }
}

/// The rewriter's properties, shared with the fuzz target `rewrite`.
#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::capture;

    #[test]
    fn injection_table() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"model":"m","stream":true}"#, Some(r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#)),
            ("{\"stream\": true ,\"x\":\"\\u00e9\"}\n", Some("{\"stream\": true ,\"x\":\"\\u00e9\",\"stream_options\":{\"include_usage\":true}}\n")),
            // `{}`: vLLM 0.32 sends no usage, newer vLLM does: the proxy cannot know, so it
            // leaves the request alone.
            (r#"{"stream":true,"stream_options":{}}"#, None),
            (r#"{"stream":true,"stream_options":{"x":1}}"#, None),
            (r#"{"stream":true,"stream_options":null}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":false}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":null,"x":1}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true,"x":1}}"#)),
            (r#"{"stream_options":{"continuous_usage_stats":false,"include_usage":false},"stream":true}"#, Some(r#"{"stream_options":{"continuous_usage_stats":false,"include_usage":true},"stream":true}"#)),
            (r#"{"stream_options":{"continuous_usage_stats":false},"stream":true}"#, None),
            // Lax booleans (pydantic): `stream: 1` streams; lax-false usage flags are a "no".
            (r#"{"stream":1}"#, Some(r#"{"stream":1,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":"true"}"#, Some(r#"{"stream":"true","stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":"yes"}"#, Some(r#"{"stream":"yes","stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":"on","n":"1"}"#, Some(r#"{"stream":"on","n":"1","stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":0}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":"no"}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":1}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":"true"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":"Yes"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":"true"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":1}}"#, None),
            // The engine refuses these: leave them for it to refuse, unchanged.
            (r#"{"stream":true,"stream_options":{"include_usage":"maybe"}}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":"x"}}"#, None),
            (r#"{"stream":"maybe"}"#, None),
            (r#"{"stream":2}"#, None),
            (r#"{"stream":true,"messages":[{"content":"\"stream_options\":{}"}]}"#, Some(r#"{"stream":true,"messages":[{"content":"\"stream_options\":{}"}],"stream_options":{"include_usage":true}}"#)),
            // The client asked for usage: untouched.
            (r#"{"stream":true,"stream_options":{"include_usage":true}}"#, None),
            // Continuous usage would put usage on every chunk: not removable byte-exactly.
            (r#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#, None),
            (r#"{"stream":false}"#, None),
            (r#"{"model":"m"}"#, None),
            (r#"{"stream":"no"}"#, None),
            (r#"{"stream":null}"#, None),
            (r#"{"stream":true,"stream_options":"x"}"#, None),
            // Several choices: the fingerprint cannot be restored on every finish chunk.
            (r#"{"stream":true,"n":2}"#, None),
            (r#"{"stream":true,"n":"2"}"#, None),
            (r#"{"stream":true,"n":1}"#, Some(r#"{"stream":true,"n":1,"stream_options":{"include_usage":true}}"#)),
            // A key given twice: the engine reads the last, so the proxy reads and rewrites it.
            (r#"{"stream":false,"stream":true}"#, Some(r#"{"stream":false,"stream":true,"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream":false}"#, None),
            (r#"{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":false}}"#, Some(r#"{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":true}}"#)),
            (r#"{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}"#, None),
            (r#"{"stream":true,"n":2,"n":1}"#, Some(r#"{"stream":true,"n":2,"n":1,"stream_options":{"include_usage":true}}"#)),
            // A number no f64 holds is JSON all the same (Python reads `1e999` as infinity).
            (r#"{"stream":true,"x":1e999}"#, Some(r#"{"stream":true,"x":1e999,"stream_options":{"include_usage":true}}"#)),
            (r#"[{"stream":true}]"#, None),
            ("not json", None),
            ("", None),
        ];
        for (input, want) in cases {
            let got = inject_include_usage(input.as_bytes());
            let got = got.as_deref().map(|b| std::str::from_utf8(b).unwrap());
            assert_eq!(got, *want, "{input}");
            if let Some(out) = got {
                match serde_json::from_str::<serde_json::Value>(out) {
                    Ok(v) => assert_eq!(v["stream_options"]["include_usage"], true, "{input}"),
                    // `1e999`: JSON, but no `Value` holds it.
                    Err(e) => assert!(e.to_string().starts_with("number out of range"), "{e}"),
                }
            }
        }
    }

    #[test]
    fn real_requests() {
        let plain = capture("stream-chat.txt").request;
        let injected = inject_include_usage(plain).unwrap();
        let mut want: serde_json::Value = serde_json::from_slice(plain).unwrap();
        want["stream_options"] = serde_json::json!({"include_usage": true});
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&injected).unwrap(),
            want
        );
        assert_eq!(
            inject_include_usage(capture("stream-chat-usage.txt").request),
            None
        );
        assert_eq!(
            inject_include_usage(capture("nonstream-chat.txt").request),
            None
        );
    }
}
