//! The bounded vocabularies of a finished request: how the body ended, the outcome, and the
//! finish reason. Each has `as_str()` for metric labels and records.

use serde::{Deserialize, Serialize};

/// How the response body stopped, as seen by the body wrapper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The body reached its end (`poll_frame` returned `None`).
    Complete,
    /// The upstream body failed mid-way.
    BodyError,
    /// The client went away: the body was dropped before its end.
    ClientGone,
    /// A proxy deadline fired (first byte, idle stream, total).
    Timeout,
}

/// The outcome of a request: exactly one per request (DESIGN.md, "Outcome of every request").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Success,
    ClientAbort,
    UpstreamError,
    Truncated,
    Timeout,
    Rejected,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Success,
        Outcome::ClientAbort,
        Outcome::UpstreamError,
        Outcome::Truncated,
        Outcome::Timeout,
        Outcome::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::ClientAbort => "client_abort",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Truncated => "truncated",
            Outcome::Timeout => "timeout",
            Outcome::Rejected => "rejected",
        }
    }
}

/// A rejection the client caused (4xx other than 429): it does not count against goodput,
/// neither in `/stats` nor in the windowed ratio (DESIGN.md, "Goodput").
pub fn rejected_by_client(outcome: Outcome, status: Option<u16>) -> bool {
    outcome == Outcome::Rejected && status.is_some_and(|s| (400..500).contains(&s) && s != 429)
}

/// A choice's `finish_reason`, folded into a bounded set (anything unknown is `Other`).
// Numbered from 1 so that `None` of `Option<FinishReason>` is the zero byte (rustc puts the
// niche there): a `ChoiceInfo::default()` is then all zeros, and a scan's 16 inline choices
// start as one zeroed block, not a store per field (every non-repeat event starts one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop = 1,
    Length,
    ToolCalls,
    ContentFilter,
    FunctionCall,
    Abort,
    Error,
    Repetition,
    Other,
}

impl FinishReason {
    pub fn parse(s: &[u8]) -> Self {
        match s {
            b"stop" => FinishReason::Stop,
            b"length" => FinishReason::Length,
            b"tool_calls" => FinishReason::ToolCalls,
            b"content_filter" => FinishReason::ContentFilter,
            b"function_call" => FinishReason::FunctionCall,
            b"abort" => FinishReason::Abort,
            b"error" => FinishReason::Error,
            b"repetition" => FinishReason::Repetition,
            _ => FinishReason::Other,
        }
    }

    /// `abort` and `error`: the engine gave up on the choice (vLLM's finish reasons when a
    /// request is aborted or fails inside the engine). Such a stream is not a success.
    pub fn engine_gave_up(self) -> bool {
        matches!(self, FinishReason::Abort | FinishReason::Error)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::FunctionCall => "function_call",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
            FinishReason::Repetition => "repetition",
            FinishReason::Other => "other",
        }
    }
}

/// The `finish_reason` label value for a request without one.
pub const NO_FINISH_REASON: &str = "none";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_json_agree() {
        for o in Outcome::ALL {
            let json = serde_json::to_string(&o).unwrap();
            assert_eq!(json, format!("\"{}\"", o.as_str()));
            assert_eq!(serde_json::from_str::<Outcome>(&json).unwrap(), o);
        }
        for name in [
            "stop",
            "length",
            "tool_calls",
            "content_filter",
            "function_call",
            "abort",
            "error",
            "repetition",
        ] {
            let f = FinishReason::parse(name.as_bytes());
            assert_eq!(f.as_str(), name);
            assert_eq!(serde_json::to_string(&f).unwrap(), format!("\"{name}\""));
        }
        assert_eq!(FinishReason::parse(b"something new"), FinishReason::Other);
    }
}
