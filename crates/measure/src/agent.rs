//! Agent traffic (issue 13): phase timings (first reasoning, answer and tool-call token; how
//! long the tool-call arguments streamed), reasoning tokens, and the validity of each tool call
//! against the function's JSON Schema in the request's `tools`.
//!
//! Cost: ordinary streams pay two substring searches per output event (`"reasoning` and
//! `"tool_calls"`, memchr's SIMD memmem, precompiled). Only events that contain one of them are
//! parsed for their deltas (a borrowed serde parse of that one event); the arguments are
//! assembled per (choice, tool-call index) and parsed and validated once, at the end.
//!
//! Shapes (vLLM 0.32 captures `stream-chat-tool-*.txt`, `stream-chat-reasoning.txt`): a call
//! opens with `{"id", "type", "index", "function": {"name"}}`, then `function.arguments`
//! fragments by `index`; reasoning is `delta.reasoning` (older vLLM: `reasoning_content`).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use memchr::memmem::Finder;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::time::Instant;

/// Tool calls assembled per request (further ones are counted, not kept).
pub const MAX_CALLS: usize = 16;
/// Argument bytes kept per call: past it the call is judged `invalid_json` (cut short).
pub const MAX_ARGUMENT_BYTES: usize = 64 * 1024;
/// Bytes of the first violation kept in the record.
pub const MAX_VIOLATION_BYTES: usize = 256;

/// How a request's tool calls fared (the worst of its calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallOutcome {
    Valid,
    /// The arguments are not JSON (or were cut past [`MAX_ARGUMENT_BYTES`]).
    InvalidJson,
    /// JSON that breaks the function's `parameters` schema.
    SchemaViolation,
    /// The call names a function the request did not offer.
    UnknownFunction,
}

impl ToolCallOutcome {
    pub const ALL: [ToolCallOutcome; 4] = [
        ToolCallOutcome::Valid,
        ToolCallOutcome::InvalidJson,
        ToolCallOutcome::SchemaViolation,
        ToolCallOutcome::UnknownFunction,
    ];

    /// The metric label (`tool_call_valid`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallOutcome::Valid => "tool_call_valid",
            ToolCallOutcome::InvalidJson => "tool_call_invalid_json",
            ToolCallOutcome::SchemaViolation => "tool_call_schema_violation",
            ToolCallOutcome::UnknownFunction => "tool_call_unknown_function",
        }
    }
}

/// The functions a request offered (`tools[].function`): name and `parameters` schema, the
/// validator compiled on first use (only requests that got a tool call pay for it).
#[derive(Debug, Default)]
pub struct ToolSet {
    functions: Vec<Function>,
}

#[derive(Debug)]
struct Function {
    name: String,
    parameters: Value,
    validator: OnceLock<Option<jsonschema::Validator>>,
}

#[derive(Deserialize)]
struct ToolPeek {
    #[serde(default)]
    function: Option<FunctionPeek>,
}

#[derive(Deserialize)]
struct FunctionPeek {
    name: String,
    #[serde(default)]
    parameters: Option<Value>,
}

impl ToolSet {
    /// The tools of a request body; `None` when it offers none (most requests: a substring
    /// check, no parse).
    pub fn from_request(body: &[u8]) -> Option<Arc<ToolSet>> {
        memchr::memmem::find(body, b"\"tools\"")?;
        // The last `tools` key, as the engine reads a duplicate (`request::object_fields`).
        let [tools] = crate::request::object_fields(body, ["tools"])?;
        let tools: Option<Vec<ToolPeek>> = serde_json::from_str(tools?.get()).ok()?;
        let functions: Vec<Function> = tools?
            .into_iter()
            .filter_map(|t| t.function)
            .map(|f| Function {
                name: f.name,
                parameters: f.parameters.unwrap_or(Value::Object(Default::default())),
                validator: OnceLock::new(),
            })
            .collect();
        (!functions.is_empty()).then(|| Arc::new(ToolSet { functions }))
    }

    /// Judges one call's arguments; the first violation (path and message, bounded).
    pub fn judge(&self, name: &str, arguments: &str) -> (ToolCallOutcome, Option<String>) {
        let Some(f) = self.functions.iter().find(|f| f.name == name) else {
            return (
                ToolCallOutcome::UnknownFunction,
                Some(bounded(format!("unknown function {name:?}"))),
            );
        };
        judge_arguments(f, arguments)
    }
}

/// Two tool sets are equal when they offer the same functions (the validators are caches).
impl PartialEq for ToolSet {
    fn eq(&self, other: &Self) -> bool {
        self.functions.len() == other.functions.len()
            && self
                .functions
                .iter()
                .zip(&other.functions)
                .all(|(a, b)| a.name == b.name && a.parameters == b.parameters)
    }
}

fn judge_arguments(f: &Function, arguments: &str) -> (ToolCallOutcome, Option<String>) {
    // The grammar first: serde_json refuses a number past f64's range (`6e40223000012`, as
    // the tiny model wrote in a real capture) although it is JSON (Python reads it as inf);
    // such arguments are JSON that no schema of finite numbers accepts.
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(arguments) {
        return (ToolCallOutcome::InvalidJson, Some(bounded(e.to_string())));
    }
    let args: Value = match serde_json::from_str(arguments) {
        Ok(v) => v,
        Err(e) => {
            return (
                ToolCallOutcome::SchemaViolation,
                Some(bounded(format!("/: {e}"))),
            )
        }
    };
    // A schema that does not compile cannot be broken: the call is judged on its JSON.
    let v = f
        .validator
        .get_or_init(|| jsonschema::validator_for(&f.parameters).ok());
    let Some(v) = v else {
        return (ToolCallOutcome::Valid, None);
    };
    let first = v.iter_errors(&args).next().map(|e| {
        let path = e.instance_path().to_string();
        let path = if path.is_empty() {
            "/".to_string()
        } else {
            path
        };
        bounded(format!("{path}: {e}"))
    });
    match first {
        None => (ToolCallOutcome::Valid, None),
        Some(why) => (ToolCallOutcome::SchemaViolation, Some(why)),
    }
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_VIOLATION_BYTES {
        let mut at = MAX_VIOLATION_BYTES;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// What agent traffic showed in one request (a part of its measurement).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentSummary {
    /// First reasoning token - t0.
    pub ttf_reasoning: Option<Duration>,
    /// First answer token (output that is neither reasoning nor a tool call) - t0.
    pub ttf_answer: Option<Duration>,
    /// First tool-call token - t0.
    pub ttf_tool_call: Option<Duration>,
    /// Last tool-call event - first tool-call event: how long the arguments streamed.
    pub tool_call_duration: Option<Duration>,
    /// Reasoning tokens: the larger of usage `completion_tokens_details.reasoning_tokens` and
    /// the reasoning events counted.
    pub reasoning_tokens: Option<u64>,
    /// Tool calls seen (all of them, also past [`MAX_CALLS`]).
    pub tool_calls: u32,
    /// The worst outcome over the calls (`None` without calls). Without the request's tools
    /// only the JSON is judged.
    pub tool_call_outcome: Option<ToolCallOutcome>,
    /// The first violation (JSON error, schema path and message, unknown name), bounded.
    pub tool_call_violation: Option<String>,
}

impl AgentSummary {
    /// A tool call was judged and is not valid.
    pub fn tool_call_failed(&self) -> bool {
        self.tool_call_outcome
            .is_some_and(|o| o != ToolCallOutcome::Valid)
    }
}

#[derive(Debug, Default)]
struct CallBuf {
    choice: u32,
    index: u32,
    name: String,
    arguments: String,
    cut: bool,
}

/// The precompiled searches of the prefilter.
struct Finders {
    reasoning: Finder<'static>,
    tool_calls: Finder<'static>,
    reasoning_tokens: Finder<'static>,
}

fn finders() -> &'static Finders {
    static F: OnceLock<Finders> = OnceLock::new();
    F.get_or_init(|| Finders {
        reasoning: Finder::new(b"\"reasoning"),
        tool_calls: Finder::new(b"\"tool_calls\""),
        reasoning_tokens: Finder::new(b"\"reasoning_tokens\""),
    })
}

/// `rest` (what follows a key) is `: []` or `: null`, JSON whitespace allowed between.
fn empty_value_follows(rest: &[u8]) -> bool {
    let ws = |b: &[u8]| b.trim_ascii_start().len();
    let rest = &rest[rest.len() - ws(rest)..];
    let Some(rest) = rest.strip_prefix(b":") else {
        return false;
    };
    let rest = &rest[rest.len() - ws(rest)..];
    if rest.starts_with(b"null") {
        return true;
    }
    rest.strip_prefix(b"[")
        .is_some_and(|r| r.trim_ascii_start().starts_with(b"]"))
}

/// Follows one stream's agent phases and assembles its tool calls.
#[derive(Debug)]
pub struct AgentMeter {
    t0: Instant,
    first_reasoning: Option<Instant>,
    first_answer: Option<Instant>,
    first_tool: Option<Instant>,
    last_tool: Option<Instant>,
    reasoning_events: u64,
    usage_reasoning: Option<u64>,
    calls: Vec<CallBuf>,
    calls_seen: u32,
}

#[derive(Deserialize)]
struct EventPeek<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<ChoicePeek<'a>>>,
    #[serde(default)]
    usage: Option<UsagePeek>,
}

#[derive(Deserialize)]
struct UsagePeek {
    #[serde(default)]
    completion_tokens_details: Option<DetailsPeek>,
}

#[derive(Deserialize)]
struct DetailsPeek {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ChoicePeek<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    delta: Option<DeltaPeek<'a>>,
    #[serde(default, borrow)]
    text: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct DeltaPeek<'a> {
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    reasoning: Option<&'a RawValue>,
    #[serde(default, borrow)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<CallPeek<'a>>>,
}

#[derive(Deserialize)]
struct CallPeek<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    function: Option<FunctionDeltaPeek<'a>>,
}

#[derive(Deserialize)]
struct FunctionDeltaPeek<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// A JSON value that carries text: not null, not `""`.
fn carries(v: Option<&RawValue>) -> bool {
    v.is_some_and(|v| !matches!(v.get(), "null" | "\"\""))
}

impl AgentMeter {
    pub fn new(t0: Instant) -> Self {
        Self {
            t0,
            first_reasoning: None,
            first_answer: None,
            first_tool: None,
            last_tool: None,
            reasoning_events: 0,
            usage_reasoning: None,
            calls: Vec::new(),
            calls_seen: 0,
        }
    }

    /// One SSE data payload at `t`; `output`: the event carried output (the inspection said
    /// so). Events without output are looked at only for the usage's reasoning count. True
    /// when the prefilter let the event in (it was parsed); false when it was passed by as
    /// [`AgentMeter::on_plain`] does.
    pub fn on_event(&mut self, t: Instant, data: &[u8], output: bool) -> bool {
        let f = finders();
        let maybe_reasoning = f.reasoning.find(data).is_some();
        if !maybe_reasoning && f.tool_calls.find(data).is_none() {
            self.on_plain(t, output);
            return false;
        }
        self.on_parsed(t, data);
        true
    }

    /// An event the prefilter passes by: it names no reasoning and no tool call.
    pub fn on_plain(&mut self, t: Instant, output: bool) {
        if output && self.first_answer.is_none() {
            self.first_answer = Some(t);
        }
    }

    /// `text` (a string's text, its opening quote right before it) could complete one of the
    /// prefilter's needles with that quote.
    pub fn may_start_a_needle(text: &[u8]) -> bool {
        text.starts_with(b"reasoning") || text.starts_with(b"tool_calls")
    }

    fn on_parsed(&mut self, t: Instant, data: &[u8]) {
        let Ok(ev) = serde_json::from_slice::<EventPeek<'_>>(data.trim_ascii()) else {
            return;
        };
        if let Some(r) = ev
            .usage
            .and_then(|u| u.completion_tokens_details)
            .and_then(|d| d.reasoning_tokens)
        {
            self.usage_reasoning = Some(r);
        }
        for c in ev.choices.into_iter().flatten() {
            if carries(c.text) && self.first_answer.is_none() {
                self.first_answer = Some(t);
            }
            let Some(d) = c.delta else { continue };
            if carries(d.reasoning) || carries(d.reasoning_content) {
                self.reasoning_events += 1;
                self.first_reasoning.get_or_insert(t);
            }
            if carries(d.content) && self.first_answer.is_none() {
                self.first_answer = Some(t);
            }
            for call in d.tool_calls.into_iter().flatten() {
                self.first_tool.get_or_insert(t);
                self.last_tool = Some(t);
                self.on_call(c.index, call);
            }
        }
    }

    fn on_call(&mut self, choice: u32, call: CallPeek<'_>) {
        let pos = self
            .calls
            .iter()
            .position(|b| b.choice == choice && b.index == call.index);
        let buf = match pos {
            Some(p) => &mut self.calls[p],
            None => {
                self.calls_seen = self.calls_seen.saturating_add(1);
                if self.calls.len() >= MAX_CALLS {
                    return;
                }
                self.calls.push(CallBuf {
                    choice,
                    index: call.index,
                    ..CallBuf::default()
                });
                let last = self.calls.len() - 1;
                &mut self.calls[last]
            }
        };
        let Some(f) = call.function else { return };
        if let Some(n) = f.name {
            buf.name.push_str(&n);
        }
        if let Some(a) = f.arguments {
            if buf.arguments.len() + a.len() > MAX_ARGUMENT_BYTES {
                buf.cut = true;
            } else {
                buf.arguments.push_str(&a);
            }
        }
    }

    /// The summary; `tools`: the request's, to judge the calls by.
    pub fn finish(&self, tools: Option<&ToolSet>) -> AgentSummary {
        let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(self.t0));
        let mut s = AgentSummary {
            ttf_reasoning: since(self.first_reasoning),
            ttf_answer: since(self.first_answer),
            ttf_tool_call: since(self.first_tool),
            tool_call_duration: self
                .first_tool
                .zip(self.last_tool)
                .map(|(a, b)| b.saturating_duration_since(a)),
            // Each reasoning event holds at least one token, so a usage count below the
            // events is wrong (vLLM 0.32 reports 0 when the model never wrote `<think>`):
            // the larger of the two.
            reasoning_tokens: match (self.usage_reasoning, self.reasoning_events) {
                (None, 0) => None,
                (u, e) => Some(u.unwrap_or(0).max(e)),
            },
            tool_calls: self.calls_seen,
            tool_call_outcome: None,
            tool_call_violation: None,
        };
        for c in &self.calls {
            let (outcome, why) = match (tools, c.cut) {
                (_, true) => (
                    ToolCallOutcome::InvalidJson,
                    Some(format!("arguments longer than {MAX_ARGUMENT_BYTES} bytes")),
                ),
                (Some(t), false) => t.judge(&c.name, &c.arguments),
                // No tools to judge by: only the JSON can be checked.
                (None, false) => {
                    match serde_json::from_str::<serde::de::IgnoredAny>(&c.arguments) {
                        Ok(_) => (ToolCallOutcome::Valid, None),
                        Err(e) => (ToolCallOutcome::InvalidJson, Some(bounded(e.to_string()))),
                    }
                }
            };
            if s.tool_call_outcome.is_none_or(|o| outcome > o) {
                s.tool_call_outcome = Some(outcome);
                if why.is_some() {
                    s.tool_call_violation = why;
                }
            }
        }
        s
    }
}

/// The agent summary of a non-streaming JSON body (`message.tool_calls`, `message.reasoning`):
/// no phase timings (nothing the client saw tells when a token came).
pub fn inspect_response_agent(body: &[u8], tools: Option<&ToolSet>) -> Option<AgentSummary> {
    // What is read below: non-empty `tool_calls`, `reasoning_tokens` (vLLM's JSON answers
    // carry `"tool_calls":[]` and `"reasoning":null`, which say nothing: not parsed for them).
    // A key can be written with `\u` escapes: a body with one is parsed.
    let f = finders();
    let key = b"\"tool_calls\"".len();
    if f.reasoning_tokens.find(body).is_none()
        && memchr::memmem::find(body, b"\\u").is_none()
        && f.tool_calls
            .find_iter(body)
            .all(|at| empty_value_follows(&body[at + key..]))
    {
        return None;
    }
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow)]
        choices: Vec<BodyChoice<'a>>,
        #[serde(default)]
        usage: Option<UsagePeek>,
    }
    #[derive(Deserialize)]
    struct BodyChoice<'a> {
        #[serde(default)]
        index: u32,
        #[serde(default, borrow)]
        message: Option<Message<'a>>,
    }
    #[derive(Deserialize)]
    struct Message<'a> {
        #[serde(default, borrow)]
        tool_calls: Option<Vec<CallPeek<'a>>>,
    }
    let b: Body<'_> = serde_json::from_slice(body.trim_ascii()).ok()?;
    let mut m = AgentMeter::new(Instant::now());
    for c in b.choices {
        let calls = c.message.and_then(|m| m.tool_calls).unwrap_or_default();
        for (i, mut call) in calls.into_iter().enumerate() {
            call.index = i as u32; // a message's calls carry no `index`
            m.on_call(c.index, call);
        }
    }
    m.usage_reasoning = b
        .usage
        .and_then(|u| u.completion_tokens_details)
        .and_then(|d| d.reasoning_tokens);
    let s = m.finish(tools);
    (s.tool_calls > 0 || s.reasoning_tokens.is_some()).then_some(AgentSummary {
        ttf_answer: None,
        ..s
    })
}

#[cfg(test)]
mod tests;
