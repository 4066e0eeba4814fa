//! vLLM's error responses: `{"error":{"message","type","param","code"}}`, keys in that order.

use super::text::push_json_str;

/// An error answered before any stream, shaped as vLLM 0.32 shapes it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    /// A semantic 400 (vLLM's `VLLMValidationError`): with a `param`, the message ends in
    /// ` (parameter=X)` as vLLM 0.32 appends it.
    pub fn bad_request(message: String, param: Option<&str>) -> Self {
        let message = match param {
            Some(p) => format!("{message} (parameter={p})"),
            None => message,
        };
        ApiError {
            status: 400,
            kind: "BadRequestError",
            message,
            param: param.map(str::to_string),
        }
    }

    /// A semantic 400 that also names the offending value: ` (parameter=X, value=V)`.
    pub fn bad_value(message: String, param: &str, value: impl std::fmt::Display) -> Self {
        ApiError {
            status: 400,
            kind: "BadRequestError",
            message: format!("{message} (parameter={param}, value={value})"),
            param: Some(param.to_string()),
        }
    }

    /// A request-validation error (FastAPI/pydantic, reshaped by vLLM 0.32):
    /// `1 validation error:\n  {'type': .., 'loc': 'body.x', 'msg': .., 'input': ..}`, type
    /// `Bad Request`, `param` = the dotted `loc`. `input` is already rendered the way vLLM
    /// shows it (`ten`, `None`, `<dict of 2 items>`); `ctx_error` is the JSON decoder's reason.
    pub fn validation(
        kind: &str,
        loc: &str,
        msg: &str,
        input: &str,
        ctx_error: Option<&str>,
    ) -> Self {
        let mut m = format!(
            "1 validation error:\n  {{'type': {}, 'loc': {}, 'msg': {}, 'input': {}",
            py_repr(kind),
            py_repr(loc),
            py_repr(msg),
            py_repr(input)
        );
        if let Some(c) = ctx_error {
            m.push_str(&format!(", 'ctx': {{'error': {}}}", py_repr(c)));
        }
        m.push('}');
        ApiError {
            status: 400,
            kind: "Bad Request",
            message: m,
            param: Some(loc.to_string()),
        }
    }

    pub fn unknown_model(name: &str, models: &[String]) -> Self {
        ApiError {
            status: 404,
            kind: "NotFoundError",
            message: format!(
                "The model `{name}` does not exist. Valid aliases: {}.",
                models.join(", ")
            ),
            param: Some("model".to_string()),
        }
    }

    /// The `status=CODE` fault: any status, with the type vLLM would give it.
    pub fn injected(status: u16) -> Self {
        let kind = match status {
            400 => "BadRequestError",
            401 => "AuthenticationError",
            403 => "PermissionDeniedError",
            404 => "NotFoundError",
            408 => "TimeoutError",
            413 => "RequestEntityTooLarge",
            429 => "RateLimitError",
            503 => "ServiceUnavailableError",
            s if s >= 500 => "InternalServerError",
            _ => "Error",
        };
        ApiError {
            status,
            kind,
            message: format!("Simulated fault: status={status}"),
            param: None,
        }
    }

    /// vLLM 0.32's `QueueOverflowError`: the answer to a request over `max_num_queued_reqs`
    /// (`nonstream-chat-admission-rejected.txt`).
    pub fn queue_overflow() -> Self {
        ApiError {
            status: 503,
            kind: "Service Unavailable",
            message: QUEUE_OVERFLOW.to_string(),
            param: None,
        }
    }

    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(96 + self.message.len());
        s.push_str("{\"error\":{\"message\":");
        push_json_str(&mut s, &self.message);
        s.push_str(",\"type\":");
        push_json_str(&mut s, self.kind);
        s.push_str(",\"param\":");
        match &self.param {
            Some(p) => push_json_str(&mut s, p),
            None => s.push_str("null"),
        }
        s.push_str(&format!(",\"code\":{}}}}}", self.status));
        s
    }
}

/// Python's `repr()` of a str: single quotes unless the text has a `'` and no `"`.
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

const QUEUE_OVERFLOW: &str = "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.";

/// The whole body of a stream rejected in-band by admission control: the error event, then
/// `[DONE]` (`stream-chat-admission-rejected-inband.txt`).
pub fn queue_overflow_stream() -> String {
    let mut s = String::from("data: {\"error\": {\"message\": ");
    push_json_str(&mut s, QUEUE_OVERFLOW);
    s.push_str(
        ", \"type\": \"Service Unavailable\", \"param\": null, \"code\": 503}}\n\ndata: [DONE]\n\n",
    );
    s
}

/// The in-band error event vLLM sends inside a 200 stream (Python `json.dumps` spacing).
pub fn stream_error_event(message: &str) -> String {
    let mut s = String::from("data: {\"error\": {\"message\": ");
    push_json_str(&mut s, message);
    s.push_str(", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_match_the_captures() {
        let e = ApiError::unknown_model("no-such-model", &["tiny".to_string()]);
        assert_eq!(
            e.to_json(),
            r#"{"error":{"message":"The model `no-such-model` does not exist. Valid aliases: tiny.","type":"NotFoundError","param":"model","code":404}}"#
        );
        let e = ApiError::bad_value(
            "max_tokens=100000 cannot be greater than max_model_len=2048. Please request fewer output tokens.".into(),
            "max_tokens",
            100000,
        );
        assert_eq!(
            e.to_json(),
            r#"{"error":{"message":"max_tokens=100000 cannot be greater than max_model_len=2048. Please request fewer output tokens. (parameter=max_tokens, value=100000)","type":"BadRequestError","param":"max_tokens","code":400}}"#
        );
    }

    #[test]
    fn validation_and_semantic_bytes_match_the_captures() {
        let table = [
            (
                ApiError::validation(
                    "int_parsing",
                    "body.max_tokens",
                    "Input should be a valid integer, unable to parse string as an integer",
                    "ten",
                    None,
                ),
                r#"{"error":{"message":"1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': 'Input should be a valid integer, unable to parse string as an integer', 'input': 'ten'}","type":"Bad Request","param":"body.max_tokens","code":400}}"#,
            ),
            (
                ApiError::validation("missing", "body", "Field required", "None", None),
                r#"{"error":{"message":"1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}","type":"Bad Request","param":"body","code":400}}"#,
            ),
            (
                ApiError::validation(
                    "json_invalid",
                    "body.28",
                    "JSON decode error",
                    "<dict of 0 items>",
                    Some("Expecting value"),
                ),
                r#"{"error":{"message":"1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.28', 'msg': 'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}","type":"Bad Request","param":"body.28","code":400}}"#,
            ),
            (
                ApiError::bad_request(
                    "Stream options can only be defined when `stream=True`.".into(),
                    Some("stream_options"),
                ),
                r#"{"error":{"message":"Stream options can only be defined when `stream=True`. (parameter=stream_options)","type":"BadRequestError","param":"stream_options","code":400}}"#,
            ),
        ];
        for (e, want) in table {
            assert_eq!(e.to_json(), want);
        }
    }

    #[test]
    fn py_repr_quotes_like_python() {
        for (s, want) in [
            ("ten", "'ten'"),
            ("it's", "\"it's\""),
            ("a'b\"c", "'a\\'b\"c'"),
            ("x\ny\\", "'x\\ny\\\\'"),
        ] {
            assert_eq!(py_repr(s), want, "{s}");
        }
    }

    #[test]
    fn stream_error_is_valid_json() {
        let ev = stream_error_event("boom");
        let json = ev.strip_prefix("data: ").unwrap().trim_end();
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["error"]["code"], 500);
        assert!(ev.ends_with("\n\n"));
    }
}
