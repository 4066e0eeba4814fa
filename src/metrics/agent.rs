//! Metrics of agent traffic (issue 13): time to the first reasoning, answer and tool-call
//! token (vLLM's TTFT buckets, so they line up with `goodput_proxy_time_to_first_token_seconds`),
//! how long tool-call arguments streamed, reasoning tokens, and tool calls by outcome. Observed
//! once per request that carried reasoning or a tool call; labels `model` (configured or
//! learned) and `outcome` (the closed set of `ToolCallOutcome`).

use goodput_measure::agent::AgentSummary;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::TTFT_BUCKETS;

#[derive(Clone)]
pub struct AgentMetrics {
    ttf_reasoning: HistogramVec,
    ttf_answer: HistogramVec,
    ttf_tool_call: HistogramVec,
    tool_call_duration: HistogramVec,
    reasoning_tokens: IntCounterVec,
    tool_calls: IntCounterVec,
}

fn hist(name: &str, help: &str) -> Result<HistogramVec, prometheus::Error> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(TTFT_BUCKETS.to_vec()),
        &["model"],
    )
}

impl AgentMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = AgentMetrics {
            ttf_reasoning: hist(
                "goodput_proxy_time_to_first_reasoning_token_seconds",
                "Request arrival to the first reasoning delta the client was served.",
            )?,
            ttf_answer: hist(
                "goodput_proxy_time_to_first_answer_token_seconds",
                "Request arrival to the first answer token (output that is neither reasoning nor a tool call), for requests with reasoning or tool calls.",
            )?,
            ttf_tool_call: hist(
                "goodput_proxy_time_to_first_tool_call_token_seconds",
                "Request arrival to the first tool-call delta the client was served.",
            )?,
            tool_call_duration: hist(
                "goodput_proxy_tool_call_duration_seconds",
                "First to last tool-call delta of a request: how long the arguments streamed.",
            )?,
            reasoning_tokens: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_reasoning_tokens_total",
                    "Reasoning tokens (usage completion_tokens_details.reasoning_tokens, or reasoning deltas when more).",
                ),
                &["model"],
            )?,
            tool_calls: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_tool_calls_total",
                    "Requests with tool calls, by the worst call's outcome: tool_call_valid, tool_call_invalid_json, tool_call_schema_violation, tool_call_unknown_function.",
                ),
                &["model", "outcome"],
            )?,
        };
        for h in [
            &m.ttf_reasoning,
            &m.ttf_answer,
            &m.ttf_tool_call,
            &m.tool_call_duration,
        ] {
            registry.register(Box::new(h.clone()))?;
        }
        registry.register(Box::new(m.reasoning_tokens.clone()))?;
        registry.register(Box::new(m.tool_calls.clone()))?;
        Ok(m)
    }

    /// One request's agent summary, `model` already a bounded label value.
    pub fn observe(&self, model: &str, a: &AgentSummary) {
        let l = [model];
        for (h, v) in [
            (&self.ttf_reasoning, a.ttf_reasoning),
            (&self.ttf_answer, a.ttf_answer),
            (&self.ttf_tool_call, a.ttf_tool_call),
            (&self.tool_call_duration, a.tool_call_duration),
        ] {
            if let Some(d) = v {
                h.with_label_values(&l).observe(d.as_secs_f64());
            }
        }
        if let Some(n) = a.reasoning_tokens {
            self.reasoning_tokens.with_label_values(&l).inc_by(n);
        }
        if let Some(o) = a.tool_call_outcome {
            self.tool_calls
                .with_label_values(&[model, o.as_str()])
                .inc();
        }
    }
}
