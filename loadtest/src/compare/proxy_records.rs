//! The proxy's per-request records (its JSONL sink), as far as the join needs them.

/// The fields of a proxy record the join needs. The proxy's sink writes
/// `goodput_measure::record::RequestRecord` (`id`, `outcome`, `ttft_s`, `tpot_s`, `e2e_s`);
/// `request_id` / `*_seconds` spellings are accepted too.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyRecord {
    pub id: String,
    pub model: Option<String>,
    pub outcome: Option<String>,
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
    pub e2e: Option<f64>,
    pub completion_tokens: Option<u64>,
}

pub(super) fn num(v: &serde_json::Value, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| v.get(*k)).and_then(|x| x.as_f64())
}
pub(super) fn text(v: &serde_json::Value, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| v.get(*k))
        .and_then(|x| x.as_str())
        .map(str::to_owned)
}

/// Parse the proxy's JSONL sink (or a JSON array of records); lines that do not parse are skipped.
pub fn parse_proxy_records(text_in: &str) -> Vec<ProxyRecord> {
    let values: Vec<serde_json::Value> =
        match serde_json::from_str::<Vec<serde_json::Value>>(text_in) {
            Ok(v) => v,
            Err(_) => text_in
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
        };
    values
        .iter()
        .filter_map(|v| {
            Some(ProxyRecord {
                id: text(v, &["request_id", "id"])?,
                model: text(v, &["model"]),
                outcome: text(v, &["outcome"]),
                ttft: num(v, &["ttft_s", "ttft_seconds", "ttft"]),
                tpot: num(v, &["tpot_s", "tpot_seconds", "tpot"]),
                e2e: num(v, &["e2e_s", "e2e_seconds", "e2e"]),
                completion_tokens: v.get("completion_tokens").and_then(|x| x.as_u64()),
            })
        })
        .collect()
}
