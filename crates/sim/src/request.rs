//! A generation request, read from the JSON body and checked the way vLLM checks it.

use serde_json::{Map, Value};

use super::agent::ToolSpec;
use super::errors::ApiError;
use super::text::{estimate_tokens, hash_bytes, mix64, CHAT_BASE_TOKENS, CHAT_PER_MESSAGE_TOKENS};

/// Which OpenAI endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

/// Most choices one request may ask for (vLLM has no fixed cap; this bounds the sim's work).
pub const MAX_N: u64 = 128;
/// Most alternatives per token (OpenAI's cap).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Everything the engine needs from a request, already validated.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub api: Api,
    /// Index into the configured model list (also the metrics label).
    pub model_idx: usize,
    pub stream: bool,
    pub n: u32,
    /// Output tokens to generate per choice (request value, or what the context leaves).
    pub max_tokens: u64,
    /// `max_tokens` exactly as requested, for `request_params_max_tokens`.
    pub max_tokens_param: u64,
    pub prompt_tokens: u64,
    /// The prompt as token ids (one per counted unit; `prompt_ids.len() == prompt_tokens`),
    /// hashed in blocks by the prefix cache.
    pub prompt_ids: Vec<u32>,
    pub include_usage: bool,
    pub continuous_usage: bool,
    /// Chat: `Some(top_logprobs)` when `logprobs: true`. Completions: `Some(logprobs)`.
    pub logprobs: Option<u32>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Seed of the token text (like vLLM: the request's `seed` alone decides the tokens).
    pub text_seed: u64,
    /// Hash of the request for ids: same body, same id.
    pub id_hash: u64,
    /// Chat: the tool a `tool-call` fault calls (from `tools` and `tool_choice`).
    pub tool: Option<ToolSpec>,
}

/// How vLLM 0.32 shows a validation error's `input`: scalars as text, containers by size.
fn shown(v: &Value) -> String {
    match v {
        Value::Null => "None".to_string(),
        Value::Bool(true) => "True".to_string(),
        Value::Bool(false) => "False".to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("<list of {} items>", a.len()),
        Value::Object(o) => format!("<dict of {} items>", o.len()),
    }
}

/// A validation error on the body field at `loc` (dotted, without `body.`).
fn field_err(loc: &str, kind: &str, msg: &str, input: &Value) -> ApiError {
    ApiError::validation(kind, &format!("body.{loc}"), msg, &shown(input), None)
}

/// A required field that is absent: pydantic shows the enclosing object as the input.
fn missing(loc: &str, parent: &Map<String, Value>) -> ApiError {
    ApiError::validation(
        "missing",
        &format!("body.{loc}"),
        "Field required",
        &format!("<dict of {} items>", parent.len()),
        None,
    )
}

/// An integer field, read as pydantic's lax mode reads it (`10`, `10.0`, `"10"`).
fn get_u64(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    let v = match obj.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    let int = match v {
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Some(i),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(f as i64),
            (None, Some(_)) => {
                return Err(field_err(
                    key,
                    "int_from_float",
                    "Input should be a valid integer, got a number with a fractional part",
                    v,
                ))
            }
            _ => None,
        },
        Value::String(s) => Some(s.trim().parse::<i64>().map_err(|_| {
            field_err(
                key,
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
                v,
            )
        })?),
        _ => {
            return Err(field_err(
                key,
                "int_type",
                "Input should be a valid integer",
                v,
            ))
        }
    };
    match int {
        Some(i) if i >= 0 => Ok(Some(i as u64)),
        Some(i) => Err(ApiError::bad_value(
            format!("{key} must be non-negative."),
            key,
            i,
        )),
        None => Err(field_err(
            key,
            "int_type",
            "Input should be a valid integer",
            v,
        )),
    }
}

/// Moves a validation error on a sub-object's field under `parent` (`body.x` ->
/// `body.parent.x`).
fn nested(mut e: ApiError, parent: &str) -> ApiError {
    if let Some(p) = e.param.as_mut() {
        if let Some(rest) = p.strip_prefix("body.") {
            let new = format!("body.{parent}.{rest}");
            e.message = e
                .message
                .replace(&format!("'loc': '{p}'"), &format!("'loc': '{new}'"));
            *p = new;
        }
    }
    e
}

/// A boolean field, read as pydantic's lax mode reads it.
fn get_bool(obj: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    let v = match obj.get(key) {
        None | Some(Value::Null) => return Ok(false),
        Some(v) => v,
    };
    let parsed = match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_i64() {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => None,
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
            _ => None,
        },
        _ => {
            return Err(field_err(
                key,
                "bool_type",
                "Input should be a valid boolean",
                v,
            ))
        }
    };
    parsed.ok_or_else(|| {
        field_err(
            key,
            "bool_parsing",
            "Input should be a valid boolean, unable to interpret input",
            v,
        )
    })
}

/// Text of a message's `content`: a string, or a list of `{"type":"text","text":...}` parts.
fn content_tokens(content: &Value, loc: &str) -> Result<u64, ApiError> {
    match content {
        Value::Null => Ok(0),
        Value::String(s) => Ok(estimate_tokens(s)),
        Value::Array(parts) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(estimate_tokens)
            .sum()),
        other => Err(field_err(
            loc,
            "string_type",
            "Input should be a valid string",
            other,
        )),
    }
}

fn chat_prompt_tokens(obj: &Map<String, Value>) -> Result<u64, ApiError> {
    let msgs = match obj.get("messages") {
        None => return Err(missing("messages", obj)),
        Some(Value::Array(m)) => m,
        Some(other) => {
            return Err(field_err(
                "messages",
                "list_type",
                "Input should be a valid list",
                other,
            ))
        }
    };
    let mut total = CHAT_BASE_TOKENS;
    for (i, m) in msgs.iter().enumerate() {
        let loc = format!("messages.{i}");
        let m = m.as_object().ok_or_else(|| {
            field_err(&loc, "model_type", "Input should be a valid dictionary", m)
        })?;
        match m.get("role") {
            None => return Err(missing(&format!("{loc}.role"), m)),
            Some(Value::String(_)) => {}
            Some(other) => {
                return Err(field_err(
                    &format!("{loc}.role"),
                    "string_type",
                    "Input should be a valid string",
                    other,
                ))
            }
        }
        total += CHAT_PER_MESSAGE_TOKENS
            + content_tokens(
                m.get("content").unwrap_or(&Value::Null),
                &format!("{loc}.content"),
            )?;
    }
    Ok(total)
}

fn completion_prompt_tokens(obj: &Map<String, Value>) -> Result<u64, ApiError> {
    let err = || {
        ApiError::bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty.".to_string(),
            Some("prompt"),
        )
    };
    match obj.get("prompt") {
        Some(Value::String(s)) => Ok(estimate_tokens(s)),
        // A list of token ids, or a batch of exactly one string.
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.iter().all(Value::is_u64) {
                Ok(items.len() as u64)
            } else if let [Value::String(s)] = items.as_slice() {
                Ok(estimate_tokens(s))
            } else {
                Err(ApiError::bad_request(
                    "The simulator serves one prompt per request (a string, [string] or [token ids])."
                        .to_string(),
                    Some("prompt"),
                ))
            }
        }
        _ => Err(err()),
    }
}

fn stop_strings(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match obj.get("stop") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    field_err(
                        &format!("stop.{i}"),
                        "string_type",
                        "Input should be a valid string",
                        v,
                    )
                })
            })
            .collect(),
        Some(other) => Err(field_err(
            "stop",
            "string_type",
            "Input should be a valid string",
            other,
        )),
    }
    .map(|v| v.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Python's `json` reason for a decode error, from serde_json's (best effort; the captures
/// pin `Expecting value` at the end of a cut list).
fn json_reason(body: &[u8], e: &serde_json::Error) -> &'static str {
    let text = e.to_string();
    let last = body
        .iter()
        .rev()
        .find(|b| !b.is_ascii_whitespace())
        .copied();
    if e.classify() == serde_json::error::Category::Eof {
        return if text.starts_with("EOF while parsing a string") {
            "Unterminated string starting at"
        } else if text.starts_with("EOF while parsing an object") {
            match last {
                Some(b'{' | b',') => "Expecting property name enclosed in double quotes",
                Some(b':') => "Expecting value",
                _ => "Expecting ',' delimiter",
            }
        } else if text.starts_with("EOF while parsing a list") {
            match last {
                Some(b'[' | b',') => "Expecting value",
                _ => "Expecting ',' delimiter",
            }
        } else {
            "Expecting value"
        };
    }
    if text.starts_with("expected `,` or") {
        "Expecting ',' delimiter"
    } else if text.starts_with("expected `:`") {
        "Expecting ':' delimiter"
    } else if text.starts_with("key must be a string") {
        "Expecting property name enclosed in double quotes"
    } else if text.starts_with("trailing characters") {
        "Extra data"
    } else if text.contains("control character") {
        "Invalid control character at"
    } else if text.starts_with("invalid escape") {
        "Invalid \\escape"
    } else {
        "Expecting value"
    }
}

/// Python's error position (a character index): the end of the text for a body cut short,
/// else the offending character.
fn json_pos(body: &[u8], e: &serde_json::Error) -> usize {
    let chars = |b: &[u8]| String::from_utf8_lossy(b).chars().count();
    if e.classify() == serde_json::error::Category::Eof {
        return chars(body);
    }
    let mut off = 0usize;
    for _ in 1..e.line() {
        match body[off..].iter().position(|&c| c == b'\n') {
            Some(i) => off += i + 1,
            None => break,
        }
    }
    let off = (off + e.column().saturating_sub(1)).min(body.len());
    chars(&body[..off])
}

/// The error vLLM gives a body that is not JSON (or is empty).
fn decode_error(body: &[u8], e: &serde_json::Error) -> ApiError {
    if body.is_empty() {
        // FastAPI reads an empty body as no body at all.
        return ApiError::validation("missing", "body", "Field required", "None", None);
    }
    ApiError::validation(
        "json_invalid",
        &format!("body.{}", json_pos(body, e)),
        "JSON decode error",
        "<dict of 0 items>",
        Some(json_reason(body, e)),
    )
}

/// Parses and validates a request body for `api` against the served `models`, in vLLM's
/// order: field types (pydantic), then the model name, then the semantic checks.
pub fn parse(
    api: Api,
    body: &[u8],
    models: &[String],
    max_model_len: u64,
    seed: u64,
) -> Result<GenRequest, ApiError> {
    let mut value: Value = serde_json::from_slice(body).map_err(|e| decode_error(body, &e))?;
    let not_object = |v: &Value| {
        ApiError::validation(
            "model_attributes_type",
            "body",
            "Input should be a valid dictionary or object to extract fields from",
            &shown(v),
            None,
        )
    };
    if !value.is_object() {
        return Err(not_object(&value));
    }
    let Some(obj) = value.as_object_mut() else {
        return Err(not_object(&Value::Null));
    };

    // Field types first: pydantic rejects the body before vLLM looks at the model.
    let model_name = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(name.clone()),
        Some(other) => {
            return Err(field_err(
                "model",
                "string_type",
                "Input should be a valid string",
                other,
            ))
        }
    };
    let chat_prompt = match api {
        Api::Chat => Some(chat_prompt_tokens(obj)?),
        Api::Completions => None,
    };
    let stream = get_bool(obj, "stream")?;
    let n = get_u64(obj, "n")?.unwrap_or(1);
    let requested = match api {
        Api::Chat => get_u64(obj, "max_completion_tokens")?.or(get_u64(obj, "max_tokens")?),
        Api::Completions => get_u64(obj, "max_tokens")?,
    };
    let (include_usage, continuous_usage, has_stream_options) = match obj.get("stream_options") {
        None | Some(Value::Null) => (false, false, false),
        Some(Value::Object(so)) => (
            get_bool(so, "include_usage").map_err(|e| nested(e, "stream_options"))?,
            get_bool(so, "continuous_usage_stats").map_err(|e| nested(e, "stream_options"))?,
            true,
        ),
        Some(other) => {
            return Err(field_err(
                "stream_options",
                "model_type",
                "Input should be a valid dictionary",
                other,
            ))
        }
    };
    let logprobs = match api {
        Api::Chat => {
            let top = get_u64(obj, "top_logprobs")?.unwrap_or(0);
            if get_bool(obj, "logprobs")? {
                Some(top)
            } else {
                None
            }
        }
        Api::Completions => get_u64(obj, "logprobs")?,
    };
    let stop = stop_strings(obj)?;
    let ignore_eos = get_bool(obj, "ignore_eos")?;
    let tool = match api {
        Api::Chat => ToolSpec::from_request(obj),
        Api::Completions => None,
    };

    let model_idx = match model_name {
        None => 0,
        Some(name) => models
            .iter()
            .position(|m| *m == name)
            .ok_or_else(|| ApiError::unknown_model(&name, models))?,
    };
    let prompt_tokens = match chat_prompt {
        Some(t) => t,
        None => completion_prompt_tokens(obj)?,
    };
    if has_stream_options && !stream {
        return Err(ApiError::bad_request(
            "Stream options can only be defined when `stream=True`.".to_string(),
            Some("stream_options"),
        ));
    }
    if n == 0 || n > MAX_N {
        return Err(ApiError::bad_request(
            format!("n must be between 1 and {MAX_N}, got {n}."),
            Some("n"),
        ));
    }
    if let Some(mt) = requested {
        if mt == 0 {
            return Err(ApiError::bad_value(
                "max_tokens must be at least 1, got 0.".to_string(),
                "max_tokens",
                0,
            ));
        }
        if mt > max_model_len {
            return Err(ApiError::bad_value(
                format!(
                    "max_tokens={mt} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens."
                ),
                "max_tokens",
                mt,
            ));
        }
    }
    if prompt_tokens + requested.unwrap_or(0) > max_model_len || prompt_tokens >= max_model_len {
        return Err(ApiError::bad_request(
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_tokens} input tokens and asks for {} output tokens. Please reduce the length of the input or output.",
                requested.unwrap_or(0)
            ),
            Some("input_tokens"),
        ));
    }
    let max_tokens = requested.unwrap_or(max_model_len - prompt_tokens);
    if let Some(k) = logprobs {
        if k > MAX_TOP_LOGPROBS {
            return Err(ApiError::bad_request(
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}."),
                Some("top_logprobs"),
            ));
        }
    }
    let req_seed = match obj.get("seed") {
        Some(Value::Number(x)) => x.as_i64().map(|v| v as u64),
        _ => None,
    };

    // Ids ignore stream_options so that a proxy that injects `include_usage` gets the same id
    // as a direct request; serde_json's sorted maps make the bytes canonical.
    let prompt_ids = super::prompt::prompt_ids(api, obj);
    obj.remove("stream_options");
    let canonical = serde_json::to_vec(&value).unwrap_or_default();
    let id_hash = hash_bytes(seed, &canonical);
    let text_seed = match req_seed {
        Some(s) => mix64(seed ^ mix64(s ^ 0x5eed)),
        None => id_hash,
    };

    Ok(GenRequest {
        api,
        model_idx,
        stream,
        n: n as u32,
        max_tokens,
        max_tokens_param: max_tokens,
        prompt_tokens,
        prompt_ids,
        include_usage,
        continuous_usage,
        logprobs: logprobs.map(|k| k as u32),
        stop,
        ignore_eos,
        text_seed,
        id_hash,
        tool,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> Vec<String> {
        vec!["tiny".to_string(), "big".to_string()]
    }

    fn chat(body: &str) -> Result<GenRequest, ApiError> {
        parse(Api::Chat, body.as_bytes(), &models(), 2048, 0)
    }

    #[test]
    fn reads_the_captured_request() {
        let r = chat(r#"{"model":"big","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":4,"n":2,"seed":1,"stream_options":{"include_usage":true}}"#).unwrap();
        assert_eq!(r.model_idx, 1);
        assert!(r.stream && r.include_usage && !r.continuous_usage);
        assert_eq!((r.n, r.max_tokens, r.prompt_tokens), (2, 4, 15));
    }

    #[test]
    fn errors_match_vllm() {
        let table: &[(&str, u16, Option<&str>)] = &[
            (r#"{"model":"nope","messages":[]}"#, 404, Some("model")),
            (
                r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":100000}"#,
                400,
                Some("max_tokens"),
            ),
            (r#"{"model":"tiny""#, 400, Some("body.15")),
            (r#"{"model":"tiny"}"#, 400, Some("body.messages")),
            (r#"[1]"#, 400, Some("body")),
            ("", 400, Some("body")),
            (
                r#"{"model":"nope","messages":[],"max_tokens":"ten"}"#,
                400,
                Some("body.max_tokens"),
            ),
            (
                r#"{"messages":[{"content":"x"}]}"#,
                400,
                Some("body.messages.0.role"),
            ),
            (
                r#"{"messages":[],"stream":true,"stream_options":{"include_usage":"maybe"}}"#,
                400,
                Some("body.stream_options.include_usage"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#,
                400,
                Some("n"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                400,
                Some("max_tokens"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#,
                400,
                Some("stream_options"),
            ),
        ];
        for (body, status, param) in table {
            let e = chat(body).unwrap_err();
            assert_eq!(e.status, *status, "{body}");
            assert_eq!(e.param.as_deref(), *param, "{body}");
        }
        let e = chat(r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":100000}"#).unwrap_err();
        assert_eq!(e.message, "max_tokens=100000 cannot be greater than max_model_len=2048. Please request fewer output tokens. (parameter=max_tokens, value=100000)");
    }

    /// The captured request-validation bodies (tests/fixtures/vllm-0.32/error-*.txt).
    #[test]
    fn validation_messages_match_the_captures() {
        let table = [
            (
                r#"{"model":"tiny","messages":["#,
                "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.28', 'msg': 'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}",
            ),
            (
                "",
                "1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}",
            ),
            (
                r#"{"model":"tiny","stream":true}"#,
                "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', 'input': '<dict of 2 items>'}",
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":"ten"}"#,
                "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': 'Input should be a valid integer, unable to parse string as an integer', 'input': 'ten'}",
            ),
        ];
        for (body, want) in table {
            let e = chat(body).unwrap_err();
            assert_eq!((e.status, e.kind), (400, "Bad Request"), "{body}");
            assert_eq!(e.message, want, "{body}");
        }
    }

    #[test]
    fn json_positions_follow_python() {
        // (body, Python's pos, Python's reason)
        for (body, pos, reason) in [
            (r#"{"a":x}"#, 5, "Expecting value"),
            ("{\"a\":1,\n \"b\" 2}", 13, "Expecting ':' delimiter"),
            (r#"{"a":1} x"#, 8, "Extra data"),
            (r#"{"a":1"#, 6, "Expecting ',' delimiter"),
            ("{", 1, "Expecting property name enclosed in double quotes"),
        ] {
            let e = serde_json::from_slice::<Value>(body.as_bytes()).unwrap_err();
            assert_eq!(json_pos(body.as_bytes(), &e), pos, "{body}");
            assert_eq!(json_reason(body.as_bytes(), &e), reason, "{body}");
        }
    }

    #[test]
    fn lax_scalars_are_accepted_like_pydantic() {
        let r = chat(r#"{"messages":[],"max_tokens":"7","stream":"true","n":1.0}"#).unwrap();
        assert_eq!((r.max_tokens, r.stream, r.n), (7, true, 1));
    }

    #[test]
    fn default_max_tokens_fills_the_context_and_ids_ignore_stream_options() {
        let a = chat(r#"{"messages":[{"role":"user","content":"Hello"}],"stream":true}"#).unwrap();
        assert_eq!(a.max_tokens, 2048 - 15);
        let b = chat(r#"{"messages":[{"role":"user","content":"Hello"}],"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert_eq!(a.id_hash, b.id_hash);
        let c = chat(r#"{"messages":[{"role":"user","content":"Hello!"}],"stream":true}"#).unwrap();
        assert_ne!(a.id_hash, c.id_hash);
    }

    #[test]
    fn request_seed_decides_the_text_whatever_the_prompt() {
        let a = chat(r#"{"messages":[{"role":"user","content":"a"}],"seed":5}"#).unwrap();
        let b = chat(r#"{"messages":[{"role":"user","content":"b"}],"seed":5}"#).unwrap();
        assert_eq!(a.text_seed, b.text_seed);
        assert_ne!(a.id_hash, b.id_hash);
    }

    #[test]
    fn completions_prompts() {
        let p = |b: &str| parse(Api::Completions, b.as_bytes(), &models(), 2048, 0);
        assert_eq!(
            p(r#"{"prompt":[1,2,3],"logprobs":2}"#)
                .unwrap()
                .prompt_tokens,
            3
        );
        assert_eq!(p(r#"{"prompt":["a b"]}"#).unwrap().prompt_tokens, 2);
        assert_eq!(
            p(r#"{"prompt":"x","logprobs":2}"#).unwrap().logprobs,
            Some(2)
        );
        assert_eq!(p(r#"{"prompt":["a","b"]}"#).unwrap_err().status, 400);
        let e = p(r#"{"model":"tiny"}"#).unwrap_err();
        assert_eq!(
            e.to_json(),
            r#"{"error":{"message":"Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)","type":"BadRequestError","param":"prompt","code":400}}"#
        );
    }
}
