//! Reading an OpenAI request body the way the engine reads it (DESIGN.md): vLLM validates with
//! pydantic in lax mode, so `"stream": 1` is a stream and `"include_usage": "true"` asks for
//! usage. The proxy must agree, or it times a stream as JSON and strips a usage chunk the
//! client asked for. A value the engine would refuse is reported as [`Lax::Invalid`]: the proxy
//! then leaves the request alone and lets the engine answer it. A key given twice is read as
//! the engine reads it too: the last one wins ([`object_fields`]).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::scan::Cursor;

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
/// or floats); the strings `0 off f false n no` and `1 on t true y yes`, in any case. `raw`:
/// the value's JSON text (a [`RawValue`]'s, or a field of [`RequestFields`]).
pub fn lax_bool(raw: Option<&str>) -> Lax {
    let Some(raw) = raw else {
        return Lax::Unset;
    };
    let text = raw.trim();
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

/// The raw values of the keys `names` in the JSON object `body` (a `null` value is
/// `Some("null")`), or `None` when `body` is not one JSON object. Of a key given twice the last
/// value wins, as in the engine: vLLM's server reads the body with Python's `json.loads`, which
/// keeps the last duplicate, so `{"stream":false,"stream":true}` streams. (serde's derive
/// refuses a duplicate field: the whole body then read as no JSON, and such a stream was timed
/// as a JSON answer.) One pass, no tree: other keys' values are skipped.
pub fn object_fields<'a, const N: usize>(
    body: &'a [u8],
    names: [&str; N],
) -> Option<[Option<&'a RawValue>; N]> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let fields = de.deserialize_map(Fields { names: &names }).ok()?;
    de.end().ok()?;
    Some(fields)
}

/// [`object_fields`] of a body that is valid UTF-8, as the values' JSON texts (what
/// [`RawValue::get`] says of each), read by the event scanner ([`crate::scan::Cursor`]), which
/// validates the whole body and finds each value's bytes without building anything. For a body
/// the scanner does not read as `serde_json` does, [`object_fields`] decides: one whose scan
/// fails (the scanner refuses nesting past its depth limit, which `serde_json` allows in a
/// skipped value) or that has a key written with an escape (`serde_json` decodes a key and
/// refuses an unpaired surrogate in it; the scanner does not decode keys it compares
/// unescaped). What the scanner accepts otherwise `serde_json` accepts too (its grammar
/// tests), so the fast path answers exactly as [`object_fields`] does (`props` below).
pub fn object_fields_str<'a, const N: usize>(
    body: &'a str,
    names: [&str; N],
) -> Option<[Option<&'a str>; N]> {
    scanned_fields(body, &names).unwrap_or_else(|| {
        object_fields(body.as_bytes(), names).map(|f| f.map(|v| v.map(RawValue::get)))
    })
}

/// The fast path of [`object_fields_str`]: `None` when it cannot answer.
fn scanned_fields<'a, const N: usize>(
    body: &'a str,
    names: &[&str; N],
) -> Option<Option<[Option<&'a str>; N]>> {
    let bytes = body.as_bytes();
    let mut spans: [Option<std::ops::Range<usize>>; N] = std::array::from_fn(|_| None);
    let mut escaped_key = false;
    let mut c = Cursor::new(bytes);
    let read = c.object(|c, key| {
        escaped_key |= key.escaped();
        match names.iter().position(|n| n.as_bytes() == key.raw()) {
            Some(i) => {
                let start = c.next_offset();
                c.skip()?;
                spans[i] = Some(start..c.offset());
            }
            None => c.skip()?,
        }
        Ok(())
    });
    if read.is_err() || c.end().is_err() || escaped_key {
        return None;
    }
    // A value the scan accepted is one `serde_json` takes as a raw value too (the grammar
    // tests): its text is the answer, not parsed again.
    let mut out = [None; N];
    for (slot, span) in out.iter_mut().zip(spans) {
        if let Some(r) = span {
            *slot = Some(body.get(r)?);
        }
    }
    Some(Some(out))
}

/// [`object_fields`]' visitor: fills one slot per name, the last occurrence winning.
struct Fields<'n, const N: usize> {
    names: &'n [&'n str; N],
}

impl<'de, const N: usize> Visitor<'de> for Fields<'_, N> {
    type Value = [Option<&'de RawValue>; N];

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = [None; N];
        while let Some(slot) = map.next_key_seed(KeyIndex(self.names))? {
            match slot {
                Some(i) => out[i] = Some(map.next_value::<&'de RawValue>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// A key, as its index in the names looked for (escapes decoded: `"str\u0065am"` is `stream`).
struct KeyIndex<'n>(&'n [&'n str]);

impl<'de> DeserializeSeed<'de> for KeyIndex<'_> {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyIndex<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|n| *n == key))
    }
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
pub fn lax_n(raw: Option<&str>) -> u32 {
    let Some(raw) = raw else { return 1 };
    let text = raw.trim();
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
    match object_fields(body, ["model", "stream", "n"]) {
        Some([model, stream, n]) => RequestPeek::of(
            model.map(RawValue::get),
            stream.map(RawValue::get),
            n.map(RawValue::get),
        ),
        None => RequestPeek::NOT_AN_OBJECT,
    }
}

impl RequestPeek {
    /// What a body that is no JSON object says: no model, no stream, one choice.
    pub const NOT_AN_OBJECT: RequestPeek = RequestPeek {
        model: None,
        stream: false,
        n: 1,
    };

    /// From the JSON texts of `model`, `stream` and `n`.
    fn of(model: Option<&str>, stream: Option<&str>, n: Option<&str>) -> Self {
        RequestPeek {
            model: model.and_then(json_string),
            stream: lax_bool(stream).is_true(),
            n: lax_n(n),
        }
    }
}

/// The value of `text` (one JSON value) when it is a string. Most names have no escape: their
/// value is the text between the quotes, taken as it is (no parse).
fn json_string(text: &str) -> Option<String> {
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) if !inner.contains('\\') => Some(inner.to_owned()),
        _ => serde_json::from_str(text).ok(),
    }
}

/// Every field of a request body the proxy reads, in one pass over it (the JSON text of the
/// last occurrence of each key, as [`object_fields`] reads them): `model`, `stream` and `n`
/// ([`RequestFields::peek`], what [`peek_request`] says), `tools` (`agent::ToolSet::from_raw`)
/// and `stream_options` (`usage::injection`). The body is valid UTF-8 (a `str`): for such a
/// body each of them reads as its own pass would (the property `usage::props::check` holds,
/// also fuzzed). A body that is not UTF-8 is read field by field by those passes.
#[derive(Debug, Clone, Copy)]
pub struct RequestFields<'a> {
    pub model: Option<&'a str>,
    pub stream: Option<&'a str>,
    pub n: Option<&'a str>,
    pub tools: Option<&'a str>,
    pub stream_options: Option<&'a str>,
}

impl<'a> RequestFields<'a> {
    /// `None` when `body` is not one JSON object.
    pub fn read(body: &'a str) -> Option<Self> {
        let [model, stream, n, tools, stream_options] =
            object_fields_str(body, ["model", "stream", "n", "tools", "stream_options"])?;
        Some(Self {
            model,
            stream,
            n,
            tools,
            stream_options,
        })
    }

    /// What [`peek_request`] says of the body.
    pub fn peek(&self) -> RequestPeek {
        RequestPeek::of(self.model, self.stream, self.n)
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
            assert_eq!(lax_bool(Some(raw(text).get())), want, "{text}");
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
    fn a_key_given_twice_is_read_as_the_engine_reads_it_the_last_wins() {
        let m = |s: &str| Some(s.to_string());
        for (body, model, stream, n) in [
            (
                &br#"{"model":"m","stream":false,"stream":true}"#[..],
                m("m"),
                true,
                1,
            ),
            (
                br#"{"stream":true,"model":"m","stream":false}"#,
                m("m"),
                false,
                1,
            ),
            (
                br#"{"model":"a","model":"b","n":2,"n":3}"#,
                m("b"),
                false,
                3,
            ),
            (br#"{"stream":true,"stream":null}"#, None, false, 1),
            (
                br#"{"str\u0065am":true,"stream":"no","str\u0065am":1}"#,
                None,
                true,
                1,
            ),
            // An object after the last key is no JSON object to the engine either.
            (br#"{"stream":true} {"stream":true}"#, None, false, 1),
        ] {
            let got = peek_request(body);
            assert_eq!(
                (got.model, got.stream, got.n),
                (model, stream, n),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;
        use serde_json::Value;

        const NAMES: [&str; 3] = ["model", "stream", "n"];

        /// JSON objects whose keys repeat (some written with an escape), values of every kind.
        fn objects() -> impl Strategy<Value = String> {
            let key = prop_oneof![
                Just(r#""model""#),
                Just(r#""stream""#),
                Just(r#""str\u0065am""#),
                Just(r#""n""#),
                Just(r#""messages""#),
                Just(r#""streams""#),
            ];
            let value = prop_oneof![
                Just("true"),
                Just("false"),
                Just("null"),
                Just("1"),
                Just("2.0"),
                Just(r#""yes""#),
                Just(r#""m\"x""#),
                Just(r#"{"stream":true,"n":[1,{"model":"z"}]}"#),
                Just(r#"[{"role":"user","content":"\"stream\":true"}]"#),
            ];
            let ws = prop_oneof![Just(""), Just(" "), Just("\n\t")];
            proptest::collection::vec((key, value, ws), 0..8).prop_map(|members| {
                let body: Vec<String> = members
                    .into_iter()
                    .map(|(k, v, w)| format!("{w}{k}{w}:{w}{v}{w}"))
                    .collect();
                format!("{{{}}}", body.join(","))
            })
        }

        proptest! {
            /// The one-pass reader equals a full parse (serde_json's map keeps the last
            /// duplicate, as Python's `json.loads` does).
            #[test]
            fn object_fields_equal_a_full_parse(body in objects()) {
                let full: Value = serde_json::from_str(&body).unwrap();
                let got = object_fields(body.as_bytes(), NAMES).unwrap();
                for (name, raw) in NAMES.iter().zip(got) {
                    let raw = raw.map(|r| serde_json::from_str::<Value>(r.get()).unwrap());
                    prop_assert_eq!(raw.as_ref(), full.get(name), "{} in {}", name, body);
                }
            }
        }
    }

    /// The scanner's fast path answers as the `serde_json` reader: on edited request bodies
    /// (any byte of an alphabet of JSON's own, escapes, an unpaired surrogate in a key or a
    /// value, nesting past the scanner's depth limit in a skipped value).
    #[test]
    fn object_fields_str_answers_as_object_fields() {
        use proptest::prelude::*;
        const FIVE: [&str; 5] = ["model", "stream", "n", "tools", "stream_options"];
        let deep = format!("{}{}", "[".repeat(140), "]".repeat(140));
        let bases: Vec<String> = vec![
            r#"{"model":"tiny","messages":[{"role":"user","content":"Hi \"there\" \u00e9"}],"max_tokens":64,"stream":true}"#.into(),
            r#"{"model":"m","stream":1,"stream_options":{"include_usage":"yes"},"n":2.0,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}"#.into(),
            r#" { "str\u0065am" : false , "model":"a","model" :"b" } "#.into(),
            r#"{"\ud800":1,"model":"x"}"#.into(),
            r#"{"model":"\ud800","stream":true,"x":-0.5e+3}"#.into(),
            format!(r#"{{"model":"m","messages":{deep},"stream":true}}"#),
            format!(r#"{{"model":"m","stream":{deep}}}"#),
        ];
        let alphabet: Vec<&str> = vec![
            "\"",
            "\\",
            ":",
            ",",
            "{",
            "}",
            "[",
            "]",
            " ",
            "1",
            "e",
            "-",
            "n",
            "u",
            "null",
            "true",
            "\\u",
            "é",
            "\u{1}",
            "\"stream\"",
            "\"model\"",
        ];
        let (fast, total) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        proptest!(ProptestConfig::with_cases(4000), |(
            which in 0..bases.len(),
            edits in proptest::collection::vec((0usize..400, 0usize..3, proptest::collection::vec(0..alphabet.len(), 0..3)), 0..3),
        )| {
            let mut body = bases[which].clone();
            for (at, cut, insert) in edits {
                let mut at = at % (body.len() + 1);
                while !body.is_char_boundary(at) {
                    at -= 1;
                }
                let mut end = (at + cut).min(body.len());
                while !body.is_char_boundary(end) {
                    end += 1;
                }
                let text: String = insert.iter().map(|&i| alphabet[i]).collect();
                body.replace_range(at..end, &text);
            }
            total.set(total.get() + 1);
            if scanned_fields(&body, &FIVE).is_some() {
                fast.set(fast.get() + 1);
            }
            fn text(f: Option<[Option<&str>; 5]>) -> Option<[Option<String>; 5]> {
                f.map(|v| v.map(|r| r.map(str::to_string)))
            }
            let full = object_fields(body.as_bytes(), FIVE).map(|f| f.map(|v| v.map(RawValue::get)));
            prop_assert_eq!(text(object_fields_str(&body, FIVE)), text(full), "{}", body);
        });
        // Not vacuous: many bodies take the fast path (a fifth: three of the seven bodies are
        // the other path's by design, and an edit often leaves no JSON), some do not.
        assert!(
            fast.get() > total.get() / 10 && fast.get() < total.get(),
            "{fast:?} of {total:?}"
        );
    }

    /// A model's name taken between its quotes is the string `serde_json` decodes, for every
    /// JSON value (escaped or not, not a string at all).
    #[test]
    fn a_name_without_escapes_is_its_text_between_the_quotes() {
        let cases = [
            r#""tiny""#,
            r#""""#,
            r#""caf\u00e9""#,
            "\"caf\u{e9} \u{4e2d}\"",
            r#""a\"b""#,
            r#""a\\""#,
            r#""\ud800""#,
            r#""x/y""#,
            "5",
            "null",
            "[\"m\"]",
            "{\"m\":\"x\"}",
        ];
        for text in cases {
            let serde = serde_json::from_str::<String>(text).ok();
            assert_eq!(json_string(text), serde, "{text}");
        }
        proptest::proptest!(|(name in "\\PC*")| {
            let text = serde_json::to_string(&name).unwrap();
            proptest::prop_assert_eq!(json_string(&text), Some(name));
        });
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
