//! The fleet table as plain data, read from ClickHouse's JSONEachRow answer, and its text
//! rendering. Kept apart from the fetching so another front end (`compare`) can reuse both.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use goodput_measure::outcome::Outcome;

/// One `(model, upstream)` row, or the fleet total (`model` and `upstream` are `*`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetRow {
    pub model: String,
    pub upstream: String,
    pub requests: u64,
    pub good: u64,
    /// good / (requests - rejections caused by the client); `None` when that is 0.
    pub goodput_ratio: Option<f64>,
    /// By outcome name, every outcome present (zeros included).
    pub outcomes: BTreeMap<String, u64>,
    /// p50, p90, p99 in seconds (`None`: no value in the window).
    pub ttft: [Option<f64>; 3],
    pub tpot: [Option<f64>; 3],
    pub e2e: [Option<f64>; 3],
}

/// ClickHouse quotes 64-bit integers in JSON by default; accept both.
#[derive(Deserialize)]
#[serde(untagged)]
enum Count {
    N(u64),
    S(String),
}

impl Count {
    fn get(&self) -> Result<u64, String> {
        match self {
            Count::N(n) => Ok(*n),
            Count::S(s) => s.parse().map_err(|_| format!("not a count: {s:?}")),
        }
    }
}

#[derive(Deserialize)]
struct Raw {
    model: String,
    upstream: String,
    requests: Count,
    good: Count,
    rejected_by_client: Count,
    ttft_p: Vec<Option<f64>>,
    tpot_p: Vec<Option<f64>>,
    e2e_p: Vec<Option<f64>>,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

fn three(v: &[Option<f64>]) -> [Option<f64>; 3] {
    [0, 1, 2].map(|i| v.get(i).copied().flatten())
}

/// Parses the answer of [`super::sql::report_query`].
pub fn parse_rows(answer: &str) -> Result<Vec<FleetRow>, String> {
    answer
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let raw: Raw = serde_json::from_str(l).map_err(|e| format!("{e}: {l}"))?;
            let requests = raw.requests.get()?;
            let good = raw.good.get()?;
            let denominator = requests.saturating_sub(raw.rejected_by_client.get()?);
            let mut outcomes = BTreeMap::new();
            for o in Outcome::ALL {
                let n = match raw.rest.get(o.as_str()) {
                    Some(serde_json::Value::Number(n)) => n.as_u64().unwrap_or(0),
                    Some(serde_json::Value::String(s)) => s.parse().unwrap_or(0),
                    _ => 0,
                };
                outcomes.insert(o.as_str().to_string(), n);
            }
            Ok(FleetRow {
                model: raw.model,
                upstream: raw.upstream,
                requests,
                good,
                goodput_ratio: (denominator > 0).then(|| good as f64 / denominator as f64),
                outcomes,
                ttft: three(&raw.ttft_p),
                tpot: three(&raw.tpot_p),
                e2e: three(&raw.e2e_p),
            })
        })
        .collect()
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.1}", s * 1e3))
}

/// A fixed-width text table: one line per row, latencies in ms.
pub fn render(rows: &[FleetRow], window_s: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fleet over the last {window_s} s (exact, numpy linear interpolation; latencies in ms)"
    );
    let head = [
        "model", "upstream", "requests", "good", "ratio", "ttft p50", "p90", "p99", "tpot p50",
        "p90", "p99", "e2e p50", "p90", "p99", "outcomes",
    ];
    let mut lines: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let mut l = vec![
            r.model.clone(),
            if r.upstream.is_empty() {
                "-".into()
            } else {
                r.upstream.clone()
            },
            r.requests.to_string(),
            r.good.to_string(),
            r.goodput_ratio.map_or("-".into(), |v| format!("{v:.3}")),
        ];
        for arr in [&r.ttft, &r.tpot, &r.e2e] {
            l.extend(arr.iter().map(|v| ms(*v)));
        }
        let outs: Vec<String> = r
            .outcomes
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        l.push(outs.join(" "));
        lines.push(l);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < 2 || i + 1 == l.len() {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quoted_counts_nulls_and_renders() {
        let answer = concat!(
            r#"{"model":"tiny","upstream":"http://a:1","requests":"10","good":"7","rejected_by_client":"2","success":"8","client_abort":"0","upstream_error":"1","truncated":"0","timeout":"0","rejected":"1","ttft_p":[0.1,0.2,0.3],"tpot_p":[null,null,null],"e2e_p":[1,2,3]}"#,
            "\n",
            r#"{"model":"*","upstream":"*","requests":0,"good":0,"rejected_by_client":0,"ttft_p":[null,null,null],"tpot_p":[],"e2e_p":[null,null,null]}"#,
            "\n"
        );
        let rows = parse_rows(answer).unwrap();
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!(
            (r.requests, r.good, r.goodput_ratio),
            (10, 7, Some(7.0 / 8.0))
        );
        assert_eq!(r.outcomes["upstream_error"], 1);
        assert_eq!(r.outcomes.len(), 6);
        assert_eq!(r.ttft, [Some(0.1), Some(0.2), Some(0.3)]);
        assert_eq!(r.tpot, [None, None, None]);
        assert_eq!(rows[1].goodput_ratio, None);
        let text = render(&rows, 300);
        assert!(text.contains("last 300 s"), "{text}");
        assert!(text.contains("upstream_error=1"), "{text}");
        assert!(
            text.lines().nth(2).unwrap().contains("100.0  200.0  300.0"),
            "{text}"
        );
        assert!(parse_rows("{}").is_err());
    }
}
