//! A generation request, read from the JSON body and checked the way vLLM checks it.

use serde_json::{Map, Value};

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
}

fn field_err(loc: &str, kind: &str, msg: &str) -> ApiError {
    ApiError::bad_request(
        format!("[{{'type': '{kind}', 'loc': ('body', '{loc}'), 'msg': '{msg}'}}]"),
        None,
    )
}

fn get_u64(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            field_err(
                key,
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            )
        }),
    }
}

fn get_bool(obj: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(field_err(
            key,
            "bool_parsing",
            "Input should be a valid boolean",
        )),
    }
}

/// Text of a message's `content`: a string, or a list of `{"type":"text","text":...}` parts.
fn content_tokens(content: &Value) -> Result<u64, ApiError> {
    match content {
        Value::Null => Ok(0),
        Value::String(s) => Ok(estimate_tokens(s)),
        Value::Array(parts) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(estimate_tokens)
            .sum()),
        _ => Err(field_err(
            "messages",
            "string_type",
            "Input should be a valid string",
        )),
    }
}

fn chat_prompt_tokens(obj: &Map<String, Value>) -> Result<u64, ApiError> {
    let msgs = match obj.get("messages") {
        None => return Err(field_err("messages", "missing", "Field required")),
        Some(Value::Array(m)) => m,
        Some(_) => {
            return Err(field_err(
                "messages",
                "list_type",
                "Input should be a valid list",
            ))
        }
    };
    let mut total = CHAT_BASE_TOKENS;
    for m in msgs {
        let m = m.as_object().ok_or_else(|| {
            field_err(
                "messages",
                "model_type",
                "Input should be a valid dictionary",
            )
        })?;
        if !m.get("role").is_some_and(Value::is_string) {
            return Err(field_err("messages", "missing", "Field required"));
        }
        total +=
            CHAT_PER_MESSAGE_TOKENS + content_tokens(m.get("content").unwrap_or(&Value::Null))?;
    }
    Ok(total)
}

fn completion_prompt_tokens(obj: &Map<String, Value>) -> Result<u64, ApiError> {
    let err = || {
        ApiError::bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty.".to_string(),
            None,
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
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    field_err("stop", "string_type", "Input should be a valid string")
                })
            })
            .collect(),
        Some(_) => Err(field_err(
            "stop",
            "string_type",
            "Input should be a valid string",
        )),
    }
    .map(|v| v.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Parses and validates a request body for `api` against the served `models`.
pub fn parse(
    api: Api,
    body: &[u8],
    models: &[String],
    max_model_len: u64,
    seed: u64,
) -> Result<GenRequest, ApiError> {
    let mut value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            format!(
                "[{{'type': 'json_invalid', 'loc': ('body', {}), 'msg': 'JSON decode error', 'input': {{}}, 'ctx': {{'error': '{}'}}}}]",
                e.column(),
                e.to_string().replace('\'', "")
            ),
            None,
        )
    })?;
    let obj = value.as_object_mut().ok_or_else(|| {
        ApiError::bad_request(
            "[{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary or object to extract fields from'}]".to_string(),
            None,
        )
    })?;

    let model_idx = match obj.get("model") {
        None | Some(Value::Null) => 0,
        Some(Value::String(name)) => models
            .iter()
            .position(|m| m == name)
            .ok_or_else(|| ApiError::unknown_model(name, models))?,
        Some(_) => {
            return Err(field_err(
                "model",
                "string_type",
                "Input should be a valid string",
            ))
        }
    };
    let prompt_tokens = match api {
        Api::Chat => chat_prompt_tokens(obj)?,
        Api::Completions => completion_prompt_tokens(obj)?,
    };
    let stream = get_bool(obj, "stream")?;
    let n = get_u64(obj, "n")?.unwrap_or(1);
    if n == 0 || n > MAX_N {
        return Err(ApiError::bad_request(
            format!("n must be between 1 and {MAX_N}, got {n}."),
            Some("n"),
        ));
    }
    let requested = match api {
        Api::Chat => get_u64(obj, "max_completion_tokens")?.or(get_u64(obj, "max_tokens")?),
        Api::Completions => get_u64(obj, "max_tokens")?,
    };
    if let Some(mt) = requested {
        if mt == 0 {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1, got 0.".to_string(),
                Some("max_tokens"),
            ));
        }
        if mt > max_model_len {
            return Err(ApiError::bad_request(
                format!(
                    "max_tokens={mt} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens. (parameter=max_tokens, value={mt})"
                ),
                Some("max_tokens"),
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

    let (include_usage, continuous_usage) = match obj.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(so)) => {
            if !stream {
                return Err(ApiError::bad_request(
                    "Stream options can only be defined when `stream=True`.".to_string(),
                    None,
                ));
            }
            (
                get_bool(so, "include_usage")?,
                get_bool(so, "continuous_usage_stats")?,
            )
        }
        Some(_) => {
            return Err(field_err(
                "stream_options",
                "model_type",
                "Input should be a valid dictionary",
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
    if let Some(k) = logprobs {
        if k > MAX_TOP_LOGPROBS {
            return Err(ApiError::bad_request(
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}."),
                Some("top_logprobs"),
            ));
        }
    }
    let stop = stop_strings(obj)?;
    let ignore_eos = get_bool(obj, "ignore_eos")?;
    let req_seed = match obj.get("seed") {
        Some(Value::Number(x)) => x.as_i64().map(|v| v as u64),
        _ => None,
    };

    // Ids ignore stream_options so that a proxy that injects `include_usage` gets the same id
    // as a direct request; serde_json's sorted maps make the bytes canonical.
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
        include_usage,
        continuous_usage,
        logprobs: logprobs.map(|k| k as u32),
        stop,
        ignore_eos,
        text_seed,
        id_hash,
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
            (r#"{"model":"tiny""#, 400, None),
            (r#"{"model":"tiny"}"#, 400, None),
            (r#"[1]"#, 400, None),
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
                None,
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
        assert_eq!(p(r#"{"model":"tiny"}"#).unwrap_err().status, 400);
    }
}
