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
    pub fn bad_request(message: String, param: Option<&str>) -> Self {
        ApiError {
            status: 400,
            kind: "BadRequestError",
            message,
            param: param.map(str::to_string),
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

    pub fn not_found() -> Self {
        ApiError {
            status: 404,
            kind: "NotFoundError",
            message: "Not Found".to_string(),
            param: None,
        }
    }

    pub fn method_not_allowed() -> Self {
        ApiError {
            status: 405,
            kind: "MethodNotAllowed",
            message: "Method Not Allowed".to_string(),
            param: None,
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
        let e = ApiError::bad_request(
            "max_tokens=100000 cannot be greater than max_model_len=2048. Please request fewer output tokens. (parameter=max_tokens, value=100000)".into(),
            Some("max_tokens"),
        );
        assert_eq!(
            e.to_json(),
            r#"{"error":{"message":"max_tokens=100000 cannot be greater than max_model_len=2048. Please request fewer output tokens. (parameter=max_tokens, value=100000)","type":"BadRequestError","param":"max_tokens","code":400}}"#
        );
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
