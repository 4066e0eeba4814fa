//! Token counters: what the client counted beside the proxy's and engines' counters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::prom::{engine_of, first_sum};
use super::*;
use goodput_measure::prom::engines::{Names, VLLM};

/// Token and running-request counters of one source at one snapshot. For an engine these are
/// its own generated- and prompt-token counters, running batch and waiting queue, by its own
/// names (`goodput_measure::prom::engines`: `vllm:generation_tokens_total`,
/// `sglang:num_queue_reqs`, `llamacpp:tokens_predicted_total`, ...; the engine told from the
/// page); for the proxy `goodput_proxy_generation_tokens_total`,
/// `goodput_proxy_prompt_tokens_total` and `goodput_proxy_requests_in_flight` (summed over
/// series). 0 when the scrape worked but the family has no series yet (a labelled counter
/// appears with its first request); `None` when the scrape failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterSnapshot {
    pub phase: String,
    /// `start` or `end` of the phase; `settled`: the last phase, `settle_s` after its end.
    pub at: String,
    /// Seconds since the run started.
    pub t_s: f64,
    /// Taken after every request of the run had finished (the last phase's end).
    pub after_all_requests: bool,
    /// `proxy` or the engine's metrics URL.
    pub source: String,
    pub generation_tokens_total: Option<f64>,
    pub prompt_tokens_total: Option<f64>,
    pub num_requests_running: Option<f64>,
    pub num_requests_waiting: Option<f64>,
}

/// Completion tokens as the client counted them beside the increase of the proxy's and each
/// engine's generation counter over the same span (a phase, or `overall`: first start to last
/// end, after every request finished).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCheck {
    pub phase: String,
    /// Sum over the client's records (usage when present, else counted output events).
    pub client_completion_tokens: u64,
    /// The part of it that came from `usage`, and how many requests carried usage.
    pub client_completion_from_usage: u64,
    pub client_requests_with_usage: u64,
    pub client_requests: u64,
    /// Increase of `goodput_proxy_generation_tokens_total`.
    pub proxy_generation_tokens: Option<f64>,
    /// Engine metrics URL -> increase of its generated-token counter.
    pub engine_generation_tokens: BTreeMap<String, Option<f64>>,
}

pub(super) fn counters_of(
    phase: &str,
    at: &str,
    after_all: bool,
    snap: &Snapshot,
    out: &mut Vec<CounterSnapshot>,
) {
    if snap.proxy_asked {
        let t = snap.proxy_metrics.as_deref();
        let g = |n: &str| t.map(|t| series_sum(t, n).unwrap_or(0.0));
        out.push(CounterSnapshot {
            phase: phase.into(),
            at: at.into(),
            t_s: snap.t_s,
            after_all_requests: after_all,
            source: "proxy".into(),
            generation_tokens_total: g("goodput_proxy_generation_tokens_total"),
            prompt_tokens_total: g("goodput_proxy_prompt_tokens_total"),
            num_requests_running: g("goodput_proxy_requests_in_flight"),
            num_requests_waiting: None,
        });
    }
    for (url, text) in &snap.engines {
        let g = |names: fn(&'static Names) -> &'static [&'static str]| {
            text.as_deref()
                .map(|t| first_sum(t, names(engine_of(t))).unwrap_or(0.0))
        };
        out.push(CounterSnapshot {
            phase: phase.into(),
            at: at.into(),
            t_s: snap.t_s,
            after_all_requests: after_all,
            source: url.clone(),
            generation_tokens_total: g(|n| n.generation_tokens),
            prompt_tokens_total: g(|n| n.prompt_tokens),
            num_requests_running: g(|n| n.running),
            num_requests_waiting: g(|n| n.waiting),
        });
    }
}

pub(super) fn token_check(
    phase: &str,
    mine: &[&RequestRecord],
    start: Option<&Snapshot>,
    end: Option<&Snapshot>,
) -> TokenCheck {
    let grow = |a: Option<&str>, b: Option<&str>, name: &str| -> Option<f64> {
        Some(series_sum(b?, name).unwrap_or(0.0) - series_sum(a?, name).unwrap_or(0.0))
    };
    let proxy = match (start, end) {
        (Some(s), Some(e)) if e.proxy_asked => grow(
            s.proxy_metrics.as_deref(),
            e.proxy_metrics.as_deref(),
            "goodput_proxy_generation_tokens_total",
        ),
        _ => None,
    };
    let mut engines = BTreeMap::new();
    if let (Some(s), Some(e)) = (start, end) {
        for (i, (url, end_text)) in e.engines.iter().enumerate() {
            let start_text = s.engines.get(i).and_then(|x| x.1.as_deref());
            let names = end_text.as_deref().map_or(&VLLM, engine_of);
            let total = |t: &str| first_sum(t, names.generation_tokens).unwrap_or(0.0);
            let grown = match (start_text, end_text.as_deref()) {
                (Some(a), Some(b)) => Some(total(b) - total(a)),
                _ => None,
            };
            engines.insert(url.clone(), grown);
        }
    }
    TokenCheck {
        phase: phase.into(),
        client_completion_tokens: mine.iter().filter_map(|r| r.completion_tokens).sum(),
        client_completion_from_usage: mine
            .iter()
            .filter(|r| r.tokens_exact)
            .filter_map(|r| r.completion_tokens)
            .sum(),
        client_requests_with_usage: mine.iter().filter(|r| r.tokens_exact).count() as u64,
        client_requests: mine.len() as u64,
        proxy_generation_tokens: proxy,
        engine_generation_tokens: engines,
    }
}
