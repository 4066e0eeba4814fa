//! Where TTFT goes, from the proxy's per-request records joined with the client's: for every
//! request whose engine reported its own timings (vLLM `--enable-per-request-metrics`), the
//! parts of the proxy's TTFT split (proxy, engine queue, engine prefill, rest), the client's
//! TTFT beside them (how many saw it below the engine's queue + prefill: none should), and
//! for decode the client's TPOT beside the engine's mean ITL.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::ProxyRecord;
use crate::record::RequestRecord;
use goodput_measure::stats::percentile;

/// p50 and p99 of one quantity, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct P50P99 {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

impl P50P99 {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let at = |q| (!v.is_empty()).then(|| percentile(&v, q));
        P50P99 {
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TtftWhere {
    /// Requests with a client TTFT whose proxy record has the split.
    pub requests: u64,
    /// Of them, the engine's parts were cut to fit (clock skew).
    pub clamped: u64,
    /// Of them, the client's TTFT was below the engine's queue + prefill.
    pub client_below_engine: u64,
    pub client_ttft: P50P99,
    pub proxy: P50P99,
    pub engine_queue: P50P99,
    pub engine_prefill: P50P99,
    pub rest: P50P99,
    pub client_tpot: P50P99,
    pub engine_mean_itl: P50P99,
}

/// `None` when no joined request has a split.
pub fn ttft_where(
    records: &[RequestRecord],
    by_id: &HashMap<&str, &ProxyRecord>,
) -> Option<TtftWhere> {
    let mut w = TtftWhere::default();
    let mut parts: [Vec<f64>; 4] = Default::default();
    let (mut client_ttft, mut tpot, mut itl) = (Vec::new(), Vec::new(), Vec::new());
    for r in records {
        let (Some(p), Some(ttft)) = (by_id.get(r.request_id.as_str()), r.ttft_seconds) else {
            continue;
        };
        let Some(split) = p.ttft_split else { continue };
        w.requests += 1;
        w.clamped += u64::from(p.split_clamped);
        w.client_below_engine += u64::from(ttft < split[1] + split[2]);
        client_ttft.push(ttft);
        for (into, v) in parts.iter_mut().zip(split) {
            into.push(v);
        }
        tpot.extend(r.tpot_seconds);
        itl.extend(p.engine_mean_itl);
    }
    if w.requests == 0 {
        return None;
    }
    let [proxy, queue, prefill, rest] = parts;
    w.client_ttft = P50P99::of(client_ttft);
    w.proxy = P50P99::of(proxy);
    w.engine_queue = P50P99::of(queue);
    w.engine_prefill = P50P99::of(prefill);
    w.rest = P50P99::of(rest);
    w.client_tpot = P50P99::of(tpot);
    w.engine_mean_itl = P50P99::of(itl);
    Some(w)
}

/// The section as text (times in ms).
pub fn text(w: &TtftWhere) -> String {
    let ms = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{:.2}", v * 1e3));
    let pq = |p: &P50P99| format!("{}/{}", ms(p.p50), ms(p.p99));
    format!(
        "\nwhere TTFT goes (p50/p99 ms; {} requests whose engine reported its timings, {} clamped, {} with a client TTFT below the engine's queue + prefill)\n  client TTFT {}: proxy {} + engine queue {} + engine prefill {} + rest {}\n  decode: client TPOT {}, engine mean ITL {}\n",
        w.requests,
        w.clamped,
        w.client_below_engine,
        pq(&w.client_ttft),
        pq(&w.proxy),
        pq(&w.engine_queue),
        pq(&w.engine_prefill),
        pq(&w.rest),
        pq(&w.client_tpot),
        pq(&w.engine_mean_itl),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(id: &str, split: Option<[f64; 4]>, clamped: bool) -> ProxyRecord {
        ProxyRecord {
            id: id.into(),
            model: Some("tiny".into()),
            outcome: Some("success".into()),
            ttft: Some(0.1),
            tpot: None,
            e2e: Some(1.0),
            completion_tokens: None,
            ttft_split: split,
            split_clamped: clamped,
            engine_mean_itl: split.map(|_| 0.01),
        }
    }

    #[test]
    fn parts_come_from_the_joined_proxy_records() {
        let mut a = crate::record::sample("p", 0.0, 1.0, Some(0.100), "success");
        a.request_id = "r1".into();
        a.tpot_seconds = Some(0.02);
        let mut b = crate::record::sample("p", 0.0, 1.0, Some(0.050), "success");
        b.request_id = "r2".into();
        let mut c = crate::record::sample("p", 0.0, 1.0, Some(0.070), "success");
        c.request_id = "r3".into();
        let proxies = [
            proxy("r1", Some([0.001, 0.01, 0.05, 0.039]), false),
            // Its client saw the first token before the engine's queue + prefill ended.
            proxy("r2", Some([0.001, 0.02, 0.04, 0.0]), true),
            proxy("r3", None, false),
        ];
        let by_id: HashMap<&str, &ProxyRecord> =
            proxies.iter().map(|p| (p.id.as_str(), p)).collect();
        let w = ttft_where(&[a, b, c], &by_id).expect("split");
        assert_eq!((w.requests, w.clamped, w.client_below_engine), (2, 1, 1));
        assert!((w.engine_queue.p50.unwrap() - 0.015).abs() < 1e-12);
        assert_eq!(w.client_tpot.p50, Some(0.02));
        assert!(
            text(&w)
                .contains("client TTFT 75.00/99.50: proxy 1.00/1.00 + engine queue 15.00/19.90"),
            "{}",
            text(&w)
        );
        assert!(ttft_where(&[], &by_id).is_none());
    }
}
