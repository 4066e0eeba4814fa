//! One record per request: what the client saw, as plain data (one line of `requests.jsonl`).

use serde::{Deserialize, Serialize};

/// The client-side record of one request. Latencies in seconds, `null` where undefined
/// (no output token: no TTFT; fewer than two tokens: no TPOT). Offsets are seconds from the
/// start of the run on the run's monotonic clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Sent as `x-request-id`, so the proxy's record of the same request can be joined.
    pub request_id: String,
    pub phase: String,
    pub model: String,
    /// `chat` or `completions`.
    #[serde(default = "default_api")]
    pub api: String,
    pub stream: bool,
    /// The request's mix options, so a checker can group by them: `max_tokens`, `n` (1 when not
    /// sent), `logprobs` (top N asked for, null when none), `usage` (what `stream_options`
    /// asked: `off`, `final`, `continuous`, `continuous_only`), `ignore_eos`, `hangup` (the
    /// planned hang-up point in SSE events, null when none) and `hung_up` (the client did hang
    /// up before the stream ended).
    #[serde(default)]
    pub max_tokens: u64,
    #[serde(default = "one")]
    pub n: u32,
    #[serde(default)]
    pub logprobs: Option<u32>,
    #[serde(default = "default_usage")]
    pub usage: String,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub hangup: Option<u64>,
    #[serde(default)]
    pub hung_up: bool,
    /// The request offered a function in `tools` (its tool calls were judged against it).
    #[serde(default)]
    pub tools: bool,
    /// Tag of the extra header this request carried (e.g. an injected fault), if any.
    pub tag: Option<String>,
    /// When the schedule wanted the request sent.
    pub scheduled_s: f64,
    /// When it was actually sent (later than `scheduled_s` only if the in-flight cap held it).
    pub start_s: f64,
    /// The in-flight cap held this arrival back.
    pub held_back: bool,
    pub status: Option<u16>,
    pub outcome: String,
    pub finish_reason: Option<String>,
    pub ttft_seconds: Option<f64>,
    pub ttfc_seconds: Option<f64>,
    /// TPOT as judged: the one choice's, or with several choices the largest of theirs.
    pub tpot_seconds: Option<f64>,
    /// With several choices: each choice's defined TPOT (statistics take one value per choice,
    /// as the proxy's `/stats` and histograms do). Absent with one choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice_tpot_seconds: Option<Vec<f64>>,
    pub e2e_seconds: f64,
    pub itl_count: u64,
    pub itl_max_seconds: Option<f64>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub tokens_exact: bool,
    /// Reasoning and tool calls as the client saw them (the proxy's definition and record
    /// shape): phase timings, reasoning tokens, the worst tool call's outcome and violation.
    /// Absent when the response carried neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<goodput_measure::agent::AgentSummary>,
    /// Success and every applicable SLO held.
    pub good: bool,
    /// Transport error text, when the request failed before or while reading the response.
    pub error: Option<String>,
    /// Every inter-token gap (kept in memory for the ITL statistics, not written per line).
    #[serde(skip)]
    pub itl_seconds: Vec<f64>,
}

fn default_api() -> String {
    "chat".into()
}
fn one() -> u32 {
    1
}
fn default_usage() -> String {
    "off".into()
}

impl RequestRecord {
    /// The TPOT values this request adds to statistics: one per choice with a defined TPOT.
    pub fn tpot_values(&self) -> impl Iterator<Item = f64> + '_ {
        let single = self
            .choice_tpot_seconds
            .is_none()
            .then_some(self.tpot_seconds)
            .flatten();
        single
            .into_iter()
            .chain(self.choice_tpot_seconds.iter().flatten().copied())
    }

    pub fn end_s(&self) -> f64 {
        self.start_s + self.e2e_seconds
    }

    /// Rejections the client caused (bad request, auth, too large) do not count against goodput;
    /// load shedding (429, 503) does. DESIGN.md: ratio = good / all except client-caused rejects.
    pub fn counts_for_goodput(&self) -> bool {
        !(self.outcome == "rejected"
            && matches!(self.status, Some(s) if (400..500).contains(&s) && s != 429))
    }
}

#[cfg(test)]
/// A finished record of `phase` for tests (the report's and the comparison's).
pub(crate) fn sample(
    phase: &str,
    start: f64,
    e2e: f64,
    ttft: Option<f64>,
    outcome: &str,
) -> RequestRecord {
    RequestRecord {
        request_id: format!("{phase}-{start}"),
        phase: phase.into(),
        model: "m".into(),
        api: "chat".into(),
        stream: true,
        max_tokens: 16,
        n: 1,
        logprobs: None,
        usage: "final".into(),
        ignore_eos: false,
        hangup: None,
        hung_up: false,
        tools: false,
        tag: None,
        scheduled_s: start,
        start_s: start,
        held_back: false,
        status: Some(200),
        outcome: outcome.into(),
        finish_reason: Some("stop".into()),
        ttft_seconds: ttft,
        ttfc_seconds: ttft,
        tpot_seconds: None,
        choice_tpot_seconds: None,
        e2e_seconds: e2e,
        itl_count: 0,
        itl_max_seconds: None,
        prompt_tokens: Some(10),
        completion_tokens: Some(5),
        tokens_exact: true,
        agent: None,
        good: outcome == "success",
        error: None,
        itl_seconds: vec![],
    }
}
