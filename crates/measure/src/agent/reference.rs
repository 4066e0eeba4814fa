//! The agent meter's reading as it was before the one-pass scan took it over: a
//! substring prefilter (`"reasoning`, `"tool_calls"`) on each chunk, and a borrowed
//! `serde_json` parse of the events that pass it. Kept only as the reference of the
//! differential test beside it (`differential.rs`); it fills the same call buffers
//! ([`AgentMeter::call`]) and summary ([`AgentMeter::finish`]) as the scan does.

use std::borrow::Cow;

use memchr::memmem;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::{AgentMeter, AgentSummary, ToolSet, MAX_ARGUMENT_BYTES};

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

fn on_call(m: &mut AgentMeter, choice: u32, call: CallPeek<'_>) {
    let Some(buf) = m.call(choice, call.index) else {
        return;
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

/// One chunk's payload at `t`, as the old meter read it; `output`: the inspection said the
/// event carried output.
pub fn on_event(m: &mut AgentMeter, t: Instant, data: &[u8], output: bool) {
    let needle = |n: &[u8]| memmem::find(data, n).is_some();
    if !needle(b"\"reasoning") && !needle(b"\"tool_calls\"") {
        if output && m.first_answer.is_none() {
            m.first_answer = Some(t);
        }
        return;
    }
    let Ok(ev) = serde_json::from_slice::<EventPeek<'_>>(data.trim_ascii()) else {
        return;
    };
    if let Some(r) = ev
        .usage
        .and_then(|u| u.completion_tokens_details)
        .and_then(|d| d.reasoning_tokens)
    {
        m.usage_reasoning = Some(r);
    }
    for c in ev.choices.into_iter().flatten() {
        if carries(c.text) && m.first_answer.is_none() {
            m.first_answer = Some(t);
        }
        let Some(d) = c.delta else { continue };
        if carries(d.reasoning) || carries(d.reasoning_content) {
            m.reasoning_events += 1;
            m.first_reasoning.get_or_insert(t);
        }
        if carries(d.content) && m.first_answer.is_none() {
            m.first_answer = Some(t);
        }
        for call in d.tool_calls.into_iter().flatten() {
            m.first_tool.get_or_insert(t);
            m.last_tool = Some(t);
            on_call(m, c.index, call);
        }
    }
}

/// A non-streaming body's agent summary, as the old reading made it (its prefilter left out:
/// it only skipped bodies the parse finds nothing in).
pub fn response_agent(body: &[u8], tools: Option<&ToolSet>) -> Option<AgentSummary> {
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
            on_call(&mut m, c.index, call);
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
