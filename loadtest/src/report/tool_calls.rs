//! The report's tool-call section: per run phase, requests by their worst tool
//! call's outcome (valid, invalid JSON, schema violation, unknown function), with the agent
//! phase timings of each outcome's requests (first reasoning / answer / tool-call token, how
//! long the arguments streamed). The client measures them with the proxy's `AgentMeter`
//! (`Measurement::agent`), so the figures line up with the proxy's `/stats` and metrics.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use goodput_measure::agent::{ToolCallOutcome, JUDGES_SCHEMAS};
use serde::{Deserialize, Serialize};

use super::html::esc;
use super::summary::Stats;
use crate::record::RequestRecord;

/// Agent phase timings (seconds) over a set of requests; `None` where no request had the phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimings {
    pub requests: u64,
    pub ttf_reasoning_seconds: Option<Stats>,
    pub ttf_answer_seconds: Option<Stats>,
    pub ttf_tool_call_seconds: Option<Stats>,
    /// First to last tool-call event: how long the arguments streamed.
    pub tool_call_seconds: Option<Stats>,
}

/// One phase's tool-call section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallSection {
    /// Requests that offered `tools` (the mix's `tools_share`).
    pub requests_with_tools: u64,
    /// Requests whose response carried reasoning or a tool call.
    pub agent_requests: u64,
    /// Reasoning tokens summed over the requests (usage details or counted events).
    pub reasoning_tokens: u64,
    /// Requests by their worst call's outcome (`valid`, `invalid_json`, `schema_violation`,
    /// `unknown_function`: every key present), with those requests' timings.
    pub by_outcome: BTreeMap<String, PhaseTimings>,
    /// Every request with reasoning or a tool call (also the ones without a call).
    pub all: PhaseTimings,
}

/// Said under the section by a build that does not judge schemas: its `valid` calls include
/// the ones the proxy counts as `schema_violation`.
const UNJUDGED: &str = "schemas not judged by this build (feature tool-schema): \
                        schema violations count as valid";

/// The outcome's key in `by_outcome`: its metric label without the `tool_call_` prefix (as in
/// the proxy's `/stats`).
fn key(o: ToolCallOutcome) -> &'static str {
    o.as_str().trim_start_matches("tool_call_")
}

#[derive(Default)]
struct Acc {
    requests: u64,
    values: [Vec<f64>; 4],
}

impl Acc {
    fn add(&mut self, r: &RequestRecord) {
        self.requests += 1;
        // DESIGN.md: latency statistics leave out `rejected` requests.
        if r.outcome == "rejected" {
            return;
        }
        let Some(a) = &r.agent else { return };
        let v = [
            a.ttf_reasoning,
            a.ttf_answer,
            a.ttf_tool_call,
            a.tool_call_duration,
        ];
        for (into, v) in self.values.iter_mut().zip(v) {
            into.extend(v.map(|d| d.as_secs_f64()));
        }
    }

    fn done(self) -> PhaseTimings {
        let [r, a, t, d] = self.values;
        PhaseTimings {
            requests: self.requests,
            ttf_reasoning_seconds: Stats::of(r),
            ttf_answer_seconds: Stats::of(a),
            ttf_tool_call_seconds: Stats::of(t),
            tool_call_seconds: Stats::of(d),
        }
    }
}

/// The section of a phase's records; `None` when none offered tools or got reasoning or a
/// tool call (ordinary runs show no section).
pub fn summarize(mine: &[&RequestRecord]) -> Option<ToolCallSection> {
    let with_tools = mine.iter().filter(|r| r.tools).count() as u64;
    let agent: Vec<&RequestRecord> = mine.iter().copied().filter(|r| r.agent.is_some()).collect();
    if with_tools == 0 && agent.is_empty() {
        return None;
    }
    let mut by: BTreeMap<&'static str, Acc> = ToolCallOutcome::ALL
        .iter()
        .map(|o| (key(*o), Acc::default()))
        .collect();
    let mut all = Acc::default();
    let mut reasoning = 0;
    for r in &agent {
        all.add(r);
        let Some(a) = &r.agent else { continue };
        reasoning += a.reasoning_tokens.unwrap_or(0);
        if let Some(acc) = a.tool_call_outcome.and_then(|o| by.get_mut(key(o))) {
            acc.add(r);
        }
    }
    Some(ToolCallSection {
        requests_with_tools: with_tools,
        agent_requests: agent.len() as u64,
        reasoning_tokens: reasoning,
        by_outcome: by
            .into_iter()
            .map(|(k, acc)| (k.to_owned(), acc.done()))
            .collect(),
        all: all.done(),
    })
}

/// The outcomes in the order a reader wants them: valid first, then the failures.
fn rows(s: &ToolCallSection) -> impl Iterator<Item = (&str, &PhaseTimings)> {
    ToolCallOutcome::ALL
        .iter()
        .filter_map(|o| s.by_outcome.get_key_value(key(*o)))
        .map(|(k, t)| (k.as_str(), t))
        .chain(std::iter::once(("all with reasoning or calls", &s.all)))
}

fn ms(s: &Option<Stats>, pick: fn(&Stats) -> f64) -> String {
    s.as_ref()
        .map_or("–".into(), |s| format!("{:.1}", pick(s) * 1000.0))
}

/// The HTML table of one phase's section.
pub fn render_html(name: &str, s: &ToolCallSection) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<h3>{} · tool calls</h3><p class=meta>{} requests offered tools · {} got reasoning or a tool call · {} reasoning tokens</p>\
         <table><tr><th>worst tool call (ms)</th><th>requests</th><th>first tool-call token p50</th><th>p99</th><th>arguments streaming p50</th><th>p99</th><th>first reasoning p50</th><th>first answer p50</th></tr>",
        esc(name),
        s.requests_with_tools,
        s.agent_requests,
        s.reasoning_tokens
    );
    for (k, t) in rows(s) {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(k),
            t.requests,
            ms(&t.ttf_tool_call_seconds, |s| s.p50),
            ms(&t.ttf_tool_call_seconds, |s| s.p99),
            ms(&t.tool_call_seconds, |s| s.p50),
            ms(&t.tool_call_seconds, |s| s.p99),
            ms(&t.ttf_reasoning_seconds, |s| s.p50),
            ms(&t.ttf_answer_seconds, |s| s.p50),
        );
    }
    h.push_str("</table>");
    if !JUDGES_SCHEMAS {
        h.push_str(&format!("<p class=meta>{}</p>", esc(UNJUDGED)));
    }
    h
}

/// The terminal lines of one phase's section.
pub fn render_text(out: &mut String, s: &ToolCallSection) {
    let counts: Vec<String> = rows(s)
        .take(ToolCallOutcome::ALL.len())
        .map(|(k, t)| format!("{k}={}", t.requests))
        .collect();
    let _ = writeln!(
        out,
        "  tool calls (requests by worst call): {}  (with tools {}, reasoning tokens {})",
        counts.join(" "),
        s.requests_with_tools,
        s.reasoning_tokens
    );
    let t = &s.all;
    let _ = writeln!(
        out,
        "  agent ms p50: first tool-call {}  arguments {}  first reasoning {}  first answer {}",
        ms(&t.ttf_tool_call_seconds, |s| s.p50),
        ms(&t.tool_call_seconds, |s| s.p50),
        ms(&t.ttf_reasoning_seconds, |s| s.p50),
        ms(&t.ttf_answer_seconds, |s| s.p50),
    );
    if !JUDGES_SCHEMAS {
        let _ = writeln!(out, "  {UNJUDGED}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample as rec;
    use goodput_measure::agent::AgentSummary;
    use std::time::Duration;

    fn agent(outcome: Option<ToolCallOutcome>, ttf_tool: f64, args: f64) -> AgentSummary {
        let secs = Duration::from_secs_f64;
        AgentSummary {
            ttf_reasoning: None,
            ttf_answer: None,
            ttf_tool_call: outcome.map(|_| secs(ttf_tool)),
            tool_call_duration: outcome.map(|_| secs(args)),
            reasoning_tokens: None,
            tool_calls: u32::from(outcome.is_some()),
            tool_call_outcome: outcome,
            tool_call_violation: None,
        }
    }

    #[test]
    fn requests_count_by_their_worst_call_with_that_outcomes_timings() {
        use ToolCallOutcome::*;
        let mut recs = Vec::new();
        // (outcome, time to first tool-call token, argument streaming), seconds.
        for (o, t, d) in [
            (Valid, 0.10, 0.02),
            (Valid, 0.30, 0.04),
            (InvalidJson, 0.20, 0.05),
            (SchemaViolation, 0.40, 0.07),
            (UnknownFunction, 0.50, 0.01),
        ] {
            let mut r = rec("p", 0.0, 1.0, Some(t), "success");
            r.tools = true;
            r.agent = Some(agent(Some(o), t, d));
            recs.push(r);
        }
        // Reasoning only (no call), and a rejected call: counted, its timings left out.
        let mut r = rec("p", 0.0, 1.0, Some(0.05), "success");
        r.agent = Some(AgentSummary {
            ttf_reasoning: Some(Duration::from_millis(50)),
            ttf_answer: Some(Duration::from_millis(200)),
            reasoning_tokens: Some(7),
            ..agent(None, 0.0, 0.0)
        });
        recs.push(r);
        let mut r = rec("p", 0.0, 1.0, None, "rejected");
        r.tools = true;
        r.agent = Some(agent(Some(Valid), 9.0, 9.0));
        recs.push(r);
        // An ordinary request: no section entry.
        recs.push(rec("p", 0.0, 1.0, Some(0.1), "success"));

        let mine: Vec<&RequestRecord> = recs.iter().collect();
        let s = summarize(&mine).expect("a section");
        assert_eq!(s.requests_with_tools, 6);
        assert_eq!(s.agent_requests, 7);
        assert_eq!(s.reasoning_tokens, 7);
        let valid = &s.by_outcome["valid"];
        assert_eq!(valid.requests, 3, "the rejected one counts");
        let t = valid.ttf_tool_call_seconds.unwrap();
        assert_eq!(
            (t.count, t.p50, t.max),
            (2, 0.2, 0.3),
            "rejected: no latency"
        );
        assert_eq!(valid.tool_call_seconds.unwrap().max, 0.04);
        for (k, want) in [
            ("invalid_json", 0.2),
            ("schema_violation", 0.4),
            ("unknown_function", 0.5),
        ] {
            let row = &s.by_outcome[k];
            assert_eq!(row.requests, 1, "{k}");
            assert_eq!(row.ttf_tool_call_seconds.unwrap().p50, want, "{k}");
        }
        assert_eq!(s.all.requests, 7);
        assert_eq!(s.all.ttf_reasoning_seconds.unwrap().count, 1);
        assert_eq!(s.all.ttf_answer_seconds.unwrap().p50, 0.2);
        assert_eq!(s.all.ttf_tool_call_seconds.unwrap().count, 5);

        let html = render_html("p <1>", &s);
        assert!(html.contains("p &lt;1&gt; · tool calls"));
        for k in [
            "valid",
            "invalid_json",
            "schema_violation",
            "unknown_function",
        ] {
            assert!(html.contains(&format!("<td>{k}</td>")), "{k}");
        }
        let mut text = String::new();
        render_text(&mut text, &s);
        assert!(
            text.contains("valid=3 invalid_json=1 schema_violation=1 unknown_function=1"),
            "{text}"
        );

        // Ordinary traffic: no section.
        let plain = [rec("p", 0.0, 1.0, Some(0.1), "success")];
        assert_eq!(summarize(&plain.iter().collect::<Vec<_>>()), None);
    }
}
