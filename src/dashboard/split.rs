//! The "where TTFT goes" panel: for the requests whose engine reported its own timings, the
//! client's TTFT cut into the proxy's time, the engine's queue, the engine's prefill and the
//! rest (network, the engine's HTTP front end, tokenization, the way back: what no engine
//! histogram shows), beside the engine's own TTFT histogram.
//!
//! Two views: the means of the parts over the last [`RECENT`] (the page charts them over time,
//! stacked: per request the parts add up to its TTFT, so their means add up to the mean TTFT of
//! the same requests, exactly), and per model and upstream the p50 and p99 of each part over
//! the window (percentiles do not add up; they say how each part is spread), with the client's
//! exact TTFT and the engine histogram's estimate of the same quantiles from `compare`'s table.

use serde_json::{json, Value};

use super::panels::{Inputs, RECENT};
use crate::compare::{Group, TtftWhere, P50P99};

/// The parts in the order they add up, as named on `/metrics` (`part` label) and in `compare`.
const PARTS: [&str; 4] = ["proxy", "engine_queue", "engine_prefill", "rest"];

pub fn ttft_split(i: &Inputs) -> Value {
    let recent = RECENT.min(i.uptime);
    let from = i.now.checked_sub(recent);
    let (mut n, mut sums) = (0u64, [0f64; 4]);
    for e in i
        .entries
        .iter()
        .rev()
        .take_while(|e| from.is_none_or(|f| e.record.end >= f))
    {
        if let Some(parts) = e.record.measured.ttft_split().parts() {
            n += 1;
            for (sum, d) in sums.iter_mut().zip(parts) {
                *sum += d.as_secs_f64();
            }
        }
    }
    let mut means = serde_json::Map::new();
    for (name, sum) in PARTS.iter().zip(sums) {
        means.insert((*name).into(), json!((n > 0).then(|| sum / n as f64)));
    }
    let groups: Vec<Value> = i
        .table
        .iter()
        .flat_map(|t| &t.groups)
        .filter_map(|g| g.ttft_split.as_ref().map(|s| group(g, s)))
        .collect();
    json!({
        "recent_seconds": recent.as_secs_f64(),
        "recent_requests": n,
        "recent_means": means,
        "parts": PARTS,
        "groups": groups,
        "starting": i.table.is_none(),
    })
}

/// One group's row: each part's p50 and p99, the client's exact TTFT and the engine
/// histogram's estimate at the same quantiles.
fn group(g: &Group, s: &TtftWhere) -> Value {
    let ttft = g.rows.iter().find(|r| r.quantity == "ttft");
    let at = |q: f64, engine: bool| {
        ttft.and_then(|r| r.cells.iter().find(|c| c.quantile == q))
            .and_then(|c| if engine { c.engine_hist } else { c.exact })
    };
    let pq = |p: &P50P99| json!({ "p50": p.p50, "p99": p.p99 });
    json!({
        "model": g.model,
        "upstream": g.upstream,
        "requests": s.requests,
        "clamped": s.clamped,
        "client_ttft": { "p50": at(0.5, false), "p99": at(0.99, false) },
        "engine_hist_ttft": { "p50": at(0.5, true), "p99": at(0.99, true) },
        "proxy": pq(&s.proxy),
        "engine_queue": pq(&s.engine_queue),
        "engine_prefill": pq(&s.engine_prefill),
        "rest": pq(&s.rest),
    })
}
