//! Agent traffic: phase timings (first reasoning, answer and tool-call token; how
//! long the tool-call arguments streamed), reasoning tokens, and the validity of each tool call
//! against the function's JSON Schema in the request's `tools`.
//!
//! Cost: nothing of its own per event. The one-pass scan of each event
//! ([`crate::inspect::scan_event_logged`]) already says which kinds of output each choice
//! carried ([`Phases`]) and logs each `tool_calls` entry (index, name and argument fragment as
//! spans of the event, [`LoggedCall`]); the meter takes those, decoding only the fragments it
//! appends. The arguments are assembled per (choice, tool-call index) and parsed and
//! validated once, at the end.
//!
//! Shapes (vLLM 0.32 captures `stream-chat-tool-*.txt`, `stream-chat-reasoning.txt`): a call
//! opens with `{"id", "type", "index", "function": {"name"}}`, then `function.arguments`
//! fragments by `index`; reasoning is `delta.reasoning` (older vLLM: `reasoning_content`).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::time::Instant;

use crate::inspect::{ChunkInfo, LoggedCall, Phases, Usage};
use schema::Schema;
pub use schema::JUDGES_SCHEMAS;

mod schema;

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
/// validator found on first use (only requests that got a tool call pay for it; see
/// `schema.rs`).
#[derive(Debug, Default)]
pub struct ToolSet {
    functions: Vec<Function>,
}

#[derive(Debug)]
struct Function {
    name: String,
    /// The `parameters` schema as the request wrote it (JSON text); absent: any arguments.
    parameters: Option<Box<RawValue>>,
    schema: Schema,
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
    parameters: Option<Box<RawValue>>,
}

impl ToolSet {
    /// The tools of a request body; `None` when it offers none (most requests: a substring
    /// check, no parse; a key written with escapes, `"\u0074ools"`, is `tools` too).
    pub fn from_request(body: &[u8]) -> Option<Arc<ToolSet>> {
        if memchr::memmem::find(body, b"\"tools\"").is_none() && !body.contains(&b'\\') {
            return None;
        }
        // The last `tools` key, as the engine reads a duplicate (`request::object_fields`).
        let [tools] = crate::request::object_fields(body, ["tools"])?;
        Self::from_raw(tools?.get())
    }

    /// The tools of a request's `tools` value, its JSON text (`request::RequestFields::tools`);
    /// `None` when it offers none.
    pub fn from_raw(tools: &str) -> Option<Arc<ToolSet>> {
        let tools: Option<Vec<ToolPeek>> = serde_json::from_str(tools).ok()?;
        let functions: Vec<Function> = tools?
            .into_iter()
            .filter_map(|t| t.function)
            .map(|f| Function {
                name: f.name,
                parameters: f.parameters,
                schema: Schema::new(),
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

/// Two tool sets are equal when they offer the same functions, schemas written alike (the
/// validators are caches).
impl PartialEq for ToolSet {
    fn eq(&self, other: &Self) -> bool {
        self.functions.len() == other.functions.len()
            && self
                .functions
                .iter()
                .zip(&other.functions)
                .all(|(a, b)| a.name == b.name && schema_text(a) == schema_text(b))
    }
}

fn schema_text(f: &Function) -> Option<&str> {
    f.parameters.as_deref().map(RawValue::get)
}

fn judge_arguments(f: &Function, arguments: &str) -> (ToolCallOutcome, Option<String>) {
    // The grammar first: serde_json refuses a number past f64's range (`6e40223000012`, as
    // the tiny model wrote in a real capture) although it is JSON (Python reads it as inf);
    // such arguments are JSON, judged by the schema.
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(arguments) {
        return (ToolCallOutcome::InvalidJson, Some(bounded(e.to_string())));
    }
    match f.schema.violation(f.parameters.as_deref(), arguments) {
        None => (ToolCallOutcome::Valid, None),
        Some(why) => (ToolCallOutcome::SchemaViolation, Some(bounded(why))),
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

/// What agent traffic showed in one request (a part of its measurement, and so of its
/// record: the serde names are the record's `agent.*` keys, durations in seconds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSummary {
    /// First reasoning token - t0.
    #[serde(rename = "ttf_reasoning_s", with = "crate::seconds::opt")]
    pub ttf_reasoning: Option<Duration>,
    /// First answer token (output that is neither reasoning nor a tool call) - t0.
    #[serde(rename = "ttf_answer_s", with = "crate::seconds::opt")]
    pub ttf_answer: Option<Duration>,
    /// First tool-call token - t0.
    #[serde(rename = "ttf_tool_call_s", with = "crate::seconds::opt")]
    pub ttf_tool_call: Option<Duration>,
    /// Last tool-call event - first tool-call event: how long the arguments streamed.
    #[serde(rename = "tool_call_s", with = "crate::seconds::opt")]
    pub tool_call_duration: Option<Duration>,
    /// Reasoning tokens: the larger of usage `completion_tokens_details.reasoning_tokens` and
    /// the reasoning events counted.
    pub reasoning_tokens: Option<u64>,
    /// Tool calls seen (all of them, also past [`MAX_CALLS`]).
    pub tool_calls: u32,
    /// The worst outcome over the calls (`valid`, `invalid_json`, `schema_violation`,
    /// `unknown_function`; `None` without calls). Without the request's tools only the JSON
    /// is judged.
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

    /// One chunk served at `t`: the phases of its choices (`info`, from the scan or the
    /// repeat cache) and the tool-call entries the scan logged (`calls`, spans of `payload`).
    pub fn on_chunk(&mut self, t: Instant, info: &ChunkInfo, calls: &[LoggedCall], payload: &[u8]) {
        for c in info.choices() {
            self.on_phases(t, c.phases);
        }
        if !calls.is_empty() {
            self.on_calls(calls, payload);
        }
    }

    /// The phases of one choice's entry in a chunk served at `t` (the part of
    /// [`AgentMeter::on_chunk`] a chunk without tool-call entries has).
    #[inline]
    pub fn on_phases(&mut self, t: Instant, phases: Phases) {
        self.on_phases_n(t, phases, 1);
    }

    /// [`AgentMeter::on_phases`] for `n` events at `t` with the same `phases`, as `n` calls of
    /// it note them (the first instants are set once, reasoning events counted `n` times).
    #[inline]
    pub fn on_phases_n(&mut self, t: Instant, phases: Phases, n: u64) {
        // Most events: answer text after the first answer token, nothing new to note.
        if phases == Phases::ANSWER && self.first_answer.is_some() {
            return;
        }
        if n == 0 {
            return;
        }
        if phases.contains(Phases::REASONING) {
            self.reasoning_events += n;
            self.first_reasoning.get_or_insert(t);
        }
        if phases.contains(Phases::ANSWER) {
            self.first_answer.get_or_insert(t);
        }
        if phases.contains(Phases::TOOL_CALL) {
            self.first_tool.get_or_insert(t);
            self.last_tool = Some(t);
        }
    }

    /// Tool-call entries logged by a scan of `payload`, each appended to its call (decoded
    /// straight into the call's buffers).
    fn on_calls(&mut self, calls: &[LoggedCall], payload: &[u8]) {
        for c in calls {
            let Some(buf) = self.call(c.choice, c.index) else {
                continue;
            };
            if let Some(name) = c.name {
                name.push_to(payload, &mut buf.name);
            }
            if let Some(args) = c.arguments {
                if buf.arguments.len() + args.decoded_len(payload) > MAX_ARGUMENT_BYTES {
                    buf.cut = true;
                } else {
                    args.push_to(payload, &mut buf.arguments);
                }
            }
        }
    }

    /// Usage seen (in the stream, or removed from it before the client got it): its
    /// reasoning tokens, when it reports them (the last report wins).
    pub fn on_usage(&mut self, u: &Usage) {
        if u.reasoning_tokens.is_some() {
            self.usage_reasoning = u.reasoning_tokens;
        }
    }

    /// The buffer of call `index` of choice `choice`, opened (and counted) when first seen;
    /// `None` past [`MAX_CALLS`] calls kept.
    fn call(&mut self, choice: u32, index: u32) -> Option<&mut CallBuf> {
        let pos = self
            .calls
            .iter()
            .position(|b| b.choice == choice && b.index == index);
        match pos {
            Some(p) => Some(&mut self.calls[p]),
            None => {
                self.calls_seen = self.calls_seen.saturating_add(1);
                if self.calls.len() >= MAX_CALLS {
                    return None;
                }
                self.calls.push(CallBuf {
                    choice,
                    index,
                    ..CallBuf::default()
                });
                self.calls.last_mut()
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

/// The agent summary of a non-streaming JSON body from its one scan
/// ([`crate::inspect::inspect_response_logged`]): the `message.tool_calls` it logged (spans of
/// `body`) and its usage. No phase timings (nothing the client saw tells when a token came).
pub fn response_agent(
    calls: &[LoggedCall],
    usage: Option<&Usage>,
    body: &[u8],
    tools: Option<&ToolSet>,
) -> Option<AgentSummary> {
    let reasoning = usage.and_then(|u| u.reasoning_tokens);
    if calls.is_empty() && reasoning.is_none() {
        return None;
    }
    let mut m = AgentMeter::new(Instant::now());
    m.on_calls(calls, body);
    m.usage_reasoning = reasoning;
    Some(AgentSummary {
        ttf_answer: None,
        ..m.finish(tools)
    })
}

#[cfg(test)]
mod differential;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
