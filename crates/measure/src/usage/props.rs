//! The request rewriter's properties ([`inject_include_usage`]), shared by the proptest below
//! (in CI) and the fuzz target `fuzz/fuzz_targets/rewrite.rs` (which includes this file by path;
//! so only public items, named through `super::`, which the includer brings into scope).
//!
//! For any bytes: a rewritten body is a JSON object equal to the original with
//! `stream_options.include_usage` set to `true` and nothing else changed (same facts for the
//! proxy: model, stream); rewriting it again changes nothing (it now asks for usage); a body the
//! rules surely inject into (a plain `"stream": true` object without `n` or `stream_options`)
//! is rewritten, and a body that does not stream never is.

use serde_json::Value;

use super::{inject_include_usage, injection, peek_request, RequestFields, RequestPeek, ToolSet};

/// `Err` names the first property the body breaks.
pub fn check(body: &[u8]) -> Result<(), String> {
    one_pass(body)?;
    let before: Option<Value> = match serde_json::from_slice(body) {
        Ok(v) => Some(v),
        // `1e999` is JSON, and the engine's `json.loads` reads it (as infinity), but no
        // `Value` holds it: the oracle cannot judge such a body (found by the fuzz target).
        Err(e) if e.to_string().starts_with("number out of range") => return Ok(()),
        Err(_) => None,
    };
    let Some(out) = inject_include_usage(body) else {
        if let Some(Value::Object(m)) = &before {
            let plain_stream = m.get("stream") == Some(&Value::Bool(true))
                && !m.contains_key("n")
                && !m.contains_key("stream_options")
                && peek_request(body).stream;
            if plain_stream {
                return Err("a plain streaming request was not rewritten".into());
            }
        }
        return Ok(());
    };
    let Some(Value::Object(mut want)) = before else {
        return Err("rewrote a body that is not a JSON object".into());
    };
    if !peek_request(body).stream {
        return Err("rewrote a request that does not stream".into());
    }
    let after: Value =
        serde_json::from_slice(&out).map_err(|e| format!("the rewritten body is not JSON: {e}"))?;
    match want.get_mut("stream_options") {
        Some(Value::Object(o)) => {
            o.insert("include_usage".into(), Value::Bool(true));
        }
        Some(v) if v.is_null() => {
            *v = serde_json::json!({"include_usage": true});
        }
        Some(other) => return Err(format!("rewrote stream_options {other}")),
        None => {
            want.insert(
                "stream_options".into(),
                serde_json::json!({"include_usage": true}),
            );
        }
    }
    if after != Value::Object(want) {
        return Err(format!(
            "the rewrite changed more than include_usage: {}",
            String::from_utf8_lossy(&out)
        ));
    }
    if peek_request(&out) != peek_request(body) {
        return Err("the rewrite changed model or stream as the proxy reads them".into());
    }
    if inject_include_usage(&out).is_some() {
        return Err("rewriting the rewritten body changed it again".into());
    }
    Ok(())
}

/// The proxy's one pass over a body that is valid UTF-8 ([`RequestFields`]) reads what the
/// passes of each reader read: the same facts, the same rewrite, the same tools.
fn one_pass(body: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(body) else {
        return Ok(()); // read by the separate passes
    };
    let fields = RequestFields::read(text);
    let peek = fields
        .as_ref()
        .map_or(RequestPeek::NOT_AN_OBJECT, RequestFields::peek);
    if peek != peek_request(body) {
        return Err(format!(
            "one pass peeks {peek:?}, peek_request {:?}",
            peek_request(body)
        ));
    }
    let rewrite = fields.as_ref().and_then(|f| injection(text, f));
    if rewrite.map(|i| i.apply(body)) != inject_include_usage(body) {
        return Err("the one pass rewrites otherwise".into());
    }
    let tools = fields.and_then(|f| f.tools).and_then(ToolSet::from_raw);
    if tools != ToolSet::from_request(body) {
        return Err("the one pass reads other tools".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// Values the engine reads leniently, and some it refuses.
    fn lax() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("true"),
            Just("false"),
            Just("1"),
            Just("0"),
            Just("1.0"),
            Just("2"),
            Just("null"),
            Just("\"true\""),
            Just("\"yes\""),
            Just("\"Off\""),
            Just("\"maybe\""),
            Just("[]"),
            Just("{}"),
        ]
    }

    fn ws() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just(""), Just(" "), Just("\n\t "), Just("\r\n")]
    }

    fn stream_options() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("null".to_string()),
            Just("{}".to_string()),
            Just("1".to_string()),
            (lax(), ws()).prop_map(|(v, w)| format!("{{{w}\"include_usage\"{w}:{w}{v}{w}}}")),
            (lax(), lax()).prop_map(|(v, c)| format!(
                "{{\"continuous_usage_stats\":{c},\"include_usage\":{v},\"x\":[1]}}"
            )),
        ]
    }

    /// An object of some of these members in any order, with whitespace anywhere it may be.
    fn body() -> impl Strategy<Value = String> {
        let member = prop_oneof![
            Just(("model", "\"m\"".to_string())),
            lax().prop_map(|v| ("stream", v.to_string())),
            prop_oneof![
                Just("1"),
                Just("2"),
                Just("\"1\""),
                Just("null"),
                Just("1.0")
            ]
            .prop_map(|v| ("n", v.to_string())),
            stream_options().prop_map(|v| ("stream_options", v)),
            Just((
                "messages",
                r#"[{"role":"user","content":"\"stream_options\":{}}"}]"#.to_string()
            )),
        ];
        (proptest::collection::vec((member, ws()), 0..6), ws(), ws()).prop_map(|(ms, a, b)| {
            let mut seen = std::collections::HashSet::new();
            let parts: Vec<String> = ms
                .into_iter()
                .filter(|((k, _), _)| seen.insert(*k))
                .map(|((k, v), w)| format!("{w}\"{k}\"{w}:{w}{v}{w}"))
                .collect();
            format!("{a}{{{}}}{b}", parts.join(","))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn rewritten_bodies_differ_only_in_include_usage(b in body()) {
            if let Err(e) = super::check(b.as_bytes()) {
                prop_assert!(false, "{e}\nbody {b}");
            }
        }

        #[test]
        fn any_bytes_keep_the_properties(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(super::check(&b), Ok(()));
        }

        #[test]
        fn cut_or_mangled_bodies_keep_the_properties(b in body(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut bytes = b.into_bytes();
            let i = at.index(bytes.len());
            prop_assert_eq!(super::check(&bytes[..i]), Ok(()));
            bytes[i] = byte;
            prop_assert_eq!(super::check(&bytes), Ok(()));
        }
    }
}
