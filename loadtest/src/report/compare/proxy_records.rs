//! The proxy's per-request records (its JSONL sink), read back as the proxy's own type
//! (`goodput_measure::record::RequestRecord`), reduced to what the join needs.

use goodput_measure::record::RequestRecord as ProxyRequestRecord;

/// The fields of a proxy record the join needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyRecord {
    pub id: String,
    pub model: Option<String>,
    pub outcome: Option<String>,
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
    pub e2e: Option<f64>,
    pub completion_tokens: Option<u64>,
    /// The TTFT split (proxy, engine queue, engine prefill, rest; seconds), when the engine
    /// reported its timings, and whether its parts were cut to fit.
    pub ttft_split: Option<[f64; 4]>,
    pub split_clamped: bool,
    pub engine_mean_itl: Option<f64>,
}

impl From<ProxyRequestRecord> for ProxyRecord {
    fn from(r: ProxyRequestRecord) -> Self {
        ProxyRecord {
            id: r.id.to_string(),
            model: Some(r.model.to_string()),
            outcome: Some(r.measured.outcome.as_str().to_string()),
            ttft: r.measured.ttft.map(|d| d.as_secs_f64()),
            tpot: r.measured.tpot.map(|d| d.as_secs_f64()),
            e2e: Some(r.measured.e2e.as_secs_f64()),
            completion_tokens: r.measured.completion_tokens,
            ttft_split: r
                .measured
                .ttft_split()
                .parts()
                .map(|p| p.map(|d| d.as_secs_f64())),
            split_clamped: r.measured.ttft_split().clamped,
            engine_mean_itl: r.measured.engine_view().mean_itl.map(|d| d.as_secs_f64()),
        }
    }
}

/// Parses the proxy's JSONL sink (or a JSON array of records). A line that is not a proxy
/// record (a torn last line while the sink writes, or another file) is skipped and counted in
/// the warning.
pub fn parse_proxy_records(text_in: &str) -> Vec<ProxyRecord> {
    if let Ok(all) = serde_json::from_str::<Vec<ProxyRequestRecord>>(text_in) {
        return all.into_iter().map(ProxyRecord::from).collect();
    }
    let mut skipped = 0usize;
    let out = text_in
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| match serde_json::from_str::<ProxyRequestRecord>(l) {
            Ok(r) => Some(ProxyRecord::from(r)),
            Err(_) => {
                skipped += 1;
                None
            }
        })
        .collect();
    if skipped > 0 {
        tracing::warn!(skipped, "lines of the proxy's records that are not records");
    }
    out
}
