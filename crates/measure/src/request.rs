//! Reading an OpenAI request body the way the engine reads it (DESIGN.md): vLLM validates with
//! pydantic in lax mode, so `"stream": 1` is a stream and `"include_usage": "true"` asks for
//! usage. The proxy must agree, or it times a stream as JSON and strips a usage chunk the
//! client asked for. A value the engine would refuse is reported as [`Lax::Invalid`]: the proxy
//! then leaves the request alone and lets the engine answer it.

use serde::Deserialize;
use serde_json::value::RawValue;

/// A boolean field as pydantic's lax mode reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lax {
    /// Absent, or JSON `null` (pydantic's `Optional[bool]` takes `null` as "not set").
    Unset,
    Bool(bool),
    /// Present, but no boolean to pydantic: the engine answers 400.
    Invalid,
}

impl Lax {
    /// `true` only when the engine reads the field as true.
    pub fn is_true(self) -> bool {
        self == Lax::Bool(true)
    }
}

/// Pydantic v2's lax boolean (its conversion table): JSON booleans; the numbers 0 and 1 (ints
/// or floats); the strings `0 off f false n no` and `1 on t true y yes`, in any case.
pub fn lax_bool(raw: Option<&RawValue>) -> Lax {
    let Some(raw) = raw else {
        return Lax::Unset;
    };
    let text = raw.get().trim();
    match text.as_bytes().first() {
        None => Lax::Invalid,
        Some(b'n') if text == "null" => Lax::Unset,
        Some(b't') if text == "true" => Lax::Bool(true),
        Some(b'f') if text == "false" => Lax::Bool(false),
        Some(b'"') => match serde_json::from_str::<String>(text) {
            Ok(s) => match s.to_ascii_lowercase().as_str() {
                "1" | "on" | "t" | "true" | "y" | "yes" => Lax::Bool(true),
                "0" | "off" | "f" | "false" | "n" | "no" => Lax::Bool(false),
                _ => Lax::Invalid,
            },
            Err(_) => Lax::Invalid,
        },
        Some(c) if c.is_ascii_digit() || *c == b'-' => match text.parse::<f64>() {
            Ok(1.0) => Lax::Bool(true),
            Ok(0.0) => Lax::Bool(false),
            _ => Lax::Invalid,
        },
        Some(_) => Lax::Invalid,
    }
}

/// Present keys keep their raw text even when it is `null`.
pub(crate) fn some_raw<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(default, borrow, deserialize_with = "some_raw")]
    model: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "some_raw")]
    stream: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "some_raw")]
    n: Option<&'a RawValue>,
}

/// What the proxy needs of a request body before it goes upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPeek {
    /// `model`, when it is a JSON string.
    pub model: Option<String>,
    /// The engine will stream the answer (`stream` lax-true).
    pub stream: bool,
    /// Choices asked for (`n`; 1 when absent, `null`, or no count the engine would take).
    pub n: u32,
}

/// `n` as pydantic's lax int reads it: an integer, an integral float (`2.0`) or such a number
/// in a string (`"2"`); absent or `null` is one choice. Anything else the engine refuses (400),
/// so it counts as one here: the request never streams choices.
pub fn lax_n(raw: Option<&RawValue>) -> u32 {
    let Some(raw) = raw else { return 1 };
    let text = raw.get().trim();
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    match text.parse::<f64>() {
        Ok(v) if v.fract() == 0.0 && (1.0..=f64::from(u32::MAX)).contains(&v) => v as u32,
        _ => 1,
    }
}

/// Reads `model`, `stream` and `n` from an OpenAI request body; not a JSON object means none.
pub fn peek_request(body: &[u8]) -> RequestPeek {
    match serde_json::from_slice::<Peek<'_>>(body) {
        Ok(p) => RequestPeek {
            model: p.model.and_then(|m| serde_json::from_str(m.get()).ok()),
            stream: lax_bool(p.stream).is_true(),
            n: lax_n(p.n),
        },
        Err(_) => RequestPeek {
            model: None,
            stream: false,
            n: 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn lax_booleans_as_pydantic_reads_them() {
        use Lax::*;
        let cases = [
            ("true", Bool(true)),
            ("false", Bool(false)),
            ("1", Bool(true)),
            ("0", Bool(false)),
            ("1.0", Bool(true)),
            ("0.0", Bool(false)),
            ("-0", Bool(false)),
            ("1e0", Bool(true)),
            (r#""true""#, Bool(true)),
            (r#""True""#, Bool(true)),
            (r#""TRUE""#, Bool(true)),
            (r#""1""#, Bool(true)),
            (r#""yes""#, Bool(true)),
            (r#""y""#, Bool(true)),
            (r#""on""#, Bool(true)),
            (r#""t""#, Bool(true)),
            (r#""\u0074rue""#, Bool(true)),
            (r#""false""#, Bool(false)),
            (r#""no""#, Bool(false)),
            (r#""off""#, Bool(false)),
            (r#""0""#, Bool(false)),
            (r#""n""#, Bool(false)),
            (r#""f""#, Bool(false)),
            ("null", Unset),
            ("2", Invalid),
            ("0.5", Invalid),
            (r#""""#, Invalid),
            (r#""maybe""#, Invalid),
            (r#"" true""#, Invalid),
            ("[]", Invalid),
            ("{}", Invalid),
            (r#"[true]"#, Invalid),
        ];
        for (text, want) in cases {
            assert_eq!(lax_bool(Some(&raw(text))), want, "{text}");
        }
        assert_eq!(lax_bool(None), Unset);
    }

    #[test]
    fn peek_table() {
        let m = |s: &str| Some(s.to_string());
        for (body, model, stream) in [
            (
                &br#"{"model":"tiny","stream":true,"messages":[]}"#[..],
                m("tiny"),
                true,
            ),
            (br#"{"model":"m"}"#, m("m"), false),
            (br#"{"model":"m","stream":1}"#, m("m"), true),
            (br#"{"model":"m","stream":"true"}"#, m("m"), true),
            (br#"{"model":"m","stream":"yes"}"#, m("m"), true),
            (br#"{"model":"m","stream":"no"}"#, m("m"), false),
            (br#"{"model":"m","stream":null}"#, m("m"), false),
            (br#"{"model":"m","stream":"maybe"}"#, m("m"), false),
            (br#"{"model":"caf\u00e9"}"#, m("caf\u{e9}"), false),
            (br#"{"stream":false}"#, None, false),
            (b"", None, false),
            (b"not json", None, false),
            (br#"{"model":5,"stream":true}"#, None, true),
            (b"[1,2]", None, false),
        ] {
            let got = peek_request(body);
            assert_eq!(
                (got.model, got.stream),
                (model, stream),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn n_as_pydantic_reads_it() {
        for (body, n) in [
            (&br#"{"n":3}"#[..], 3),
            (br#"{"n":2.0}"#, 2),
            (br#"{"n":"4"}"#, 4),
            (br#"{"n":1}"#, 1),
            (br#"{"n":null}"#, 1),
            (br#"{}"#, 1),
            (br#"{"n":2.5}"#, 1),
            (br#"{"n":0}"#, 1),
            (br#"{"n":-2}"#, 1),
            (br#"{"n":"x"}"#, 1),
            (br#"{"n":[2]}"#, 1),
            (b"not json", 1),
        ] {
            assert_eq!(peek_request(body).n, n, "{}", String::from_utf8_lossy(body));
        }
    }
}
