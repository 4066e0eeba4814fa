//! Client vs proxy vs engine.
//!
//! At each phase start and end the runner snapshots the proxy's admin `/metrics` and `/stats`
//! and each engine's own `/metrics`. Per phase and model, for TTFT, TPOT and E2E we then set
//! side by side: the client's exact percentiles, the proxy's exact ones (from its per-request
//! records joined by `x-request-id` when `--proxy-records` is given, else `/stats` over the phase
//! window), the proxy's histogram estimate and each engine's histogram estimate (bucket deltas
//! between the two snapshots, interpolated like PromQL `histogram_quantile`).

mod prom;
mod proxy_records;
mod render;
mod rows;
mod tokens;
mod ttft_split;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;
use crate::report::summary::{PhaseWindow, Stats};

pub use prom::{delta, histogram, quantile, series_sum, Buckets};
pub use proxy_records::{parse_proxy_records, ProxyRecord};
pub use render::{render_html, render_text};
use rows::rows_for;
use tokens::{counters_of, token_check};
pub use tokens::{CounterSnapshot, TokenCheck};

/// What was captured at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// When it was taken: seconds since the run started.
    pub t_s: f64,
    /// A proxy admin URL was given (so a missing `proxy_metrics` is a failure worth a note).
    pub proxy_asked: bool,
    pub proxy_metrics: Option<String>,
    /// `/stats?window=..&model=..` bodies per model (only taken at phase end).
    pub proxy_stats: BTreeMap<String, serde_json::Value>,
    /// Engine URL and its `/metrics` text.
    pub engines: Vec<(String, Option<String>)>,
}

/// Snapshots around one phase.
#[derive(Debug, Clone, Default)]
pub struct PhaseSnapshots {
    pub phase: String,
    pub start: Snapshot,
    pub end: Snapshot,
    /// The last phase only: taken `settle_s` after every request finished.
    pub settled: Option<Snapshot>,
}

// ---------- the comparison ----------

/// p50 / p95 / p99 of one source, and its difference from the client's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub phase: String,
    pub model: String,
    /// `ttft`, `tpot` or `e2e`.
    pub metric: String,
    /// `client exact`, `proxy exact`, `proxy histogram`, `engine histogram (URL)`.
    pub source: String,
    pub count: Option<f64>,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    /// This source minus the client, per quantile (seconds).
    pub diff_p50: Option<f64>,
    pub diff_p95: Option<f64>,
    pub diff_p99: Option<f64>,
}

/// Signed differences (proxy minus client) over joined requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffStats {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

/// One request whose outcome the client and the proxy do not agree on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Disagreement {
    pub request_id: String,
    pub client: String,
    /// The proxy's outcome; `null` when the proxy's record has none.
    pub proxy: Option<String>,
}

/// One successful request whose completion-token counts differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenDisagreement {
    pub request_id: String,
    pub client: u64,
    pub proxy: u64,
    /// The client's count came from `usage`.
    pub client_usage: bool,
}

/// Client and proxy records joined by request id, over one phase or `overall`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Join {
    pub phase: String,
    pub client_requests: u64,
    pub matched: u64,
    pub outcomes_agree: u64,
    pub outcomes_disagree: u64,
    /// Client-outcome -> proxy-outcome counts where they differ.
    pub disagreements: BTreeMap<String, u64>,
    /// Every request whose outcomes differ.
    #[serde(default)]
    pub disagreeing: Vec<Disagreement>,
    /// Client requests with no proxy record (first 100 ids; `client_requests - matched` is the
    /// count).
    #[serde(default)]
    pub unmatched_ids: Vec<String>,
    /// Completion tokens of the requests both sides call `success` and both counted: how many
    /// were compared, how many agree, and the ones that do not.
    #[serde(default)]
    pub tokens_compared: u64,
    #[serde(default)]
    pub tokens_agree: u64,
    #[serde(default)]
    pub tokens_disagreeing: Vec<TokenDisagreement>,
    pub ttft_proxy_minus_client: Option<DiffStats>,
    pub e2e_proxy_minus_client: Option<DiffStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// Per phase, then one named `overall`.
    pub joins: Vec<Join>,
    /// Proxy and engine counters at every phase start and end.
    #[serde(default)]
    pub counters: Vec<CounterSnapshot>,
    /// Per phase, then `overall`: client completion tokens vs proxy and engine counters.
    #[serde(default)]
    pub tokens: Vec<TokenCheck>,
    /// Where TTFT goes over the whole run (from the proxy's records), when engines reported
    /// their per-request timings.
    #[serde(default)]
    pub ttft_split: Option<ttft_split::TtftWhere>,
    pub notes: Vec<String>,
}

fn diff_stats(mut d: Vec<f64>) -> Option<DiffStats> {
    let min = d.iter().copied().fold(f64::INFINITY, f64::min);
    let s = Stats::of(std::mem::take(&mut d))?;
    Some(DiffStats {
        count: s.count,
        p50: s.p50,
        p99: s.p99,
        min,
        max: s.max,
    })
}

/// Build the comparison tables from the run's records, windows, snapshots and (optionally) the
/// proxy's own per-request records.
pub fn build(
    windows: &[PhaseWindow],
    records: &[RequestRecord],
    snaps: &[PhaseSnapshots],
    proxy_records: Option<&[ProxyRecord]>,
) -> Comparison {
    let mut c = Comparison::default();
    let by_id: HashMap<&str, &ProxyRecord> = proxy_records
        .unwrap_or(&[])
        .iter()
        .map(|p| (p.id.as_str(), p))
        .collect();
    for w in windows {
        let mine: Vec<&RequestRecord> = records.iter().filter(|r| r.phase == w.name).collect();
        let snap = snaps.iter().find(|s| s.phase == w.name);
        rows_for(
            &mut c.rows,
            &w.name,
            &mine,
            snap,
            &by_id,
            proxy_records.is_some(),
        );
        if proxy_records.is_some() {
            c.joins.push(join(&w.name, &mine, &by_id));
        }
        if let Some(s) = snap {
            let last = snaps.last().is_some_and(|l| l.phase == s.phase);
            counters_of(&w.name, "start", false, &s.start, &mut c.counters);
            counters_of(&w.name, "end", last, &s.end, &mut c.counters);
            if let Some(settled) = &s.settled {
                counters_of(&w.name, "settled", true, settled, &mut c.counters);
            }
            c.tokens
                .push(token_check(&w.name, &mine, Some(&s.start), Some(&s.end)));
        }
    }
    let all: Vec<&RequestRecord> = records.iter().collect();
    if windows.len() > 1 {
        // The whole run: first phase start to last phase end (after every request); /stats
        // windows are per phase, so none here.
        let whole = match (snaps.first(), snaps.last()) {
            (Some(first), Some(last)) => {
                let mut end = last.end.clone();
                end.proxy_stats.clear();
                Some(PhaseSnapshots {
                    phase: "overall".into(),
                    start: first.start.clone(),
                    end,
                    settled: None,
                })
            }
            _ => None,
        };
        rows_for(
            &mut c.rows,
            "overall",
            &all,
            whole.as_ref(),
            &by_id,
            proxy_records.is_some(),
        );
    }
    if proxy_records.is_some() {
        c.joins.push(join("overall", &all, &by_id));
        c.ttft_split = ttft_split::ttft_where(records, &by_id);
    }
    if !snaps.is_empty() {
        c.tokens.push(token_check(
            "overall",
            &all,
            snaps.first().map(|s| &s.start),
            snaps.last().map(|s| &s.end),
        ));
    }
    if snaps
        .iter()
        .any(|s| s.end.proxy_asked && s.end.proxy_metrics.is_none())
    {
        c.notes
            .push("some proxy snapshots failed (admin URL unreachable?)".into());
    }
    c.notes.push(
        "histogram deltas between phase start and end include requests of other phases still in flight at the boundaries"
            .into(),
    );
    c
}

fn join(phase: &str, mine: &[&RequestRecord], by_id: &HashMap<&str, &ProxyRecord>) -> Join {
    let (mut matched, mut agree, mut disagree) = (0, 0, 0);
    let mut dis = BTreeMap::new();
    let mut disagreeing = Vec::new();
    let mut unmatched_ids = Vec::new();
    let (mut dt, mut de) = (Vec::new(), Vec::new());
    let (mut tok_n, mut tok_ok, mut tok_bad) = (0, 0, Vec::new());
    for r in mine {
        let Some(p) = by_id.get(r.request_id.as_str()) else {
            if unmatched_ids.len() < 100 {
                unmatched_ids.push(r.request_id.clone());
            }
            continue;
        };
        matched += 1;
        let both_ok = r.outcome == "success" && p.outcome.as_deref() == Some("success");
        if let (true, Some(c), Some(pc)) = (both_ok, r.completion_tokens, p.completion_tokens) {
            tok_n += 1;
            if c == pc {
                tok_ok += 1;
            } else {
                tok_bad.push(TokenDisagreement {
                    request_id: r.request_id.clone(),
                    client: c,
                    proxy: pc,
                    client_usage: r.tokens_exact,
                });
            }
        }
        if p.outcome.as_deref() == Some(r.outcome.as_str()) {
            agree += 1;
        } else {
            disagree += 1;
            disagreeing.push(Disagreement {
                request_id: r.request_id.clone(),
                client: r.outcome.clone(),
                proxy: p.outcome.clone(),
            });
            *dis.entry(format!(
                "{} -> {}",
                r.outcome,
                p.outcome.as_deref().unwrap_or("?")
            ))
            .or_insert(0) += 1;
        }
        if let (Some(pt), Some(ct)) = (p.ttft, r.ttft_seconds) {
            dt.push(pt - ct);
        }
        if let Some(pe) = p.e2e {
            de.push(pe - r.e2e_seconds);
        }
    }
    Join {
        phase: phase.into(),
        client_requests: mine.len() as u64,
        matched,
        outcomes_agree: agree,
        outcomes_disagree: disagree,
        disagreements: dis,
        disagreeing,
        unmatched_ids,
        tokens_compared: tok_n,
        tokens_agree: tok_ok,
        tokens_disagreeing: tok_bad,
        ttft_proxy_minus_client: diff_stats(dt),
        e2e_proxy_minus_client: diff_stats(de),
    }
}
