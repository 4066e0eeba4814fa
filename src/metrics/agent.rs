//! Metrics of agent traffic: time to the first reasoning, answer and tool-call token (vLLM's
//! TTFT buckets, so they line up with `goodput_proxy_time_to_first_token_seconds`), how long
//! tool-call arguments streamed, reasoning tokens, and tool calls by outcome. Observed once per
//! request that carried reasoning or a tool call; labels `model` (configured or learned) and
//! `outcome` (the closed set of `ToolCallOutcome`).

use goodput_measure::agent::AgentSummary;

use super::family::{Counters, Histograms, Registrar};
use super::labels::{ByModel, ToolCalls};
use super::TTFT_BUCKETS;

pub struct AgentFamilies {
    ttf_reasoning: Histograms<ByModel<'static>>,
    ttf_answer: Histograms<ByModel<'static>>,
    ttf_tool_call: Histograms<ByModel<'static>>,
    tool_call_duration: Histograms<ByModel<'static>>,
    reasoning_tokens: Counters<ByModel<'static>>,
    tool_calls: Counters<ToolCalls<'static>>,
}

impl AgentFamilies {
    pub fn register(r: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(AgentFamilies {
            ttf_reasoning: r.histograms(
                "goodput_proxy_time_to_first_reasoning_token_seconds",
                "Request arrival to the first reasoning delta the client was served.",
                TTFT_BUCKETS,
            )?,
            ttf_answer: r.histograms(
                "goodput_proxy_time_to_first_answer_token_seconds",
                "Request arrival to the first answer token (output that is neither reasoning nor a tool call), for requests with reasoning or tool calls.",
                TTFT_BUCKETS,
            )?,
            ttf_tool_call: r.histograms(
                "goodput_proxy_time_to_first_tool_call_token_seconds",
                "Request arrival to the first tool-call delta the client was served.",
                TTFT_BUCKETS,
            )?,
            tool_call_duration: r.histograms(
                "goodput_proxy_tool_call_duration_seconds",
                "First to last tool-call delta of a request: how long the arguments streamed.",
                TTFT_BUCKETS,
            )?,
            reasoning_tokens: r.counters(
                "goodput_proxy_reasoning_tokens_total",
                "Reasoning tokens (usage completion_tokens_details.reasoning_tokens, or reasoning deltas when more).",
            )?,
            tool_calls: r.counters(
                "goodput_proxy_tool_calls_total",
                "Requests with tool calls, by the worst call's outcome: tool_call_valid, tool_call_invalid_json, tool_call_schema_violation, tool_call_unknown_function.",
            )?,
        })
    }

    /// One request's agent summary, `model` already a bounded label value.
    pub fn observe(&self, model: &str, a: &AgentSummary) {
        let l = ByModel { model };
        for (h, v) in [
            (&self.ttf_reasoning, a.ttf_reasoning),
            (&self.ttf_answer, a.ttf_answer),
            (&self.ttf_tool_call, a.ttf_tool_call),
            (&self.tool_call_duration, a.tool_call_duration),
        ] {
            if let Some(d) = v {
                h.get(&l).observe(d.as_secs_f64());
            }
        }
        if let Some(n) = a.reasoning_tokens {
            self.reasoning_tokens.get(&l).inc_by(n);
        }
        if let Some(outcome) = a.tool_call_outcome {
            self.tool_calls.get(&ToolCalls { model, outcome }).inc();
        }
    }
}
