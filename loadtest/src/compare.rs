//! Client vs proxy vs engine (issue 5 item 8).
//!
//! At each phase start and end the runner snapshots the proxy's admin `/metrics` and `/stats`
//! and each engine's own `/metrics`. Per phase and model, for TTFT, TPOT and E2E we then set
//! side by side: the client's exact percentiles, the proxy's exact ones (from its per-request
//! records joined by `x-request-id` when `--proxy-records` is given, else `/stats` over the phase
//! window), the proxy's histogram estimate and each engine's histogram estimate (bucket deltas
//! between the two snapshots, interpolated like PromQL `histogram_quantile`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;
use crate::report::summary::{PhaseWindow, Stats};

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

// ---------- Prometheus text: histograms only ----------

/// Cumulative bucket counts of one histogram series: `(le, count)` ascending, `+Inf` last.
pub type Buckets = Vec<(f64, f64)>;

/// Histogram `family` buckets from exposition text, summed over the series whose labels contain
/// every `(key, value)` in `filter` (any one key of `model_keys` must equal `model` if given).
pub fn histogram(
    text: &str,
    family: &str,
    model_keys: &[&str],
    model: Option<&str>,
) -> Option<Buckets> {
    let prefix = format!("{family}_bucket");
    let mut acc: BTreeMap<u64, (f64, f64)> = BTreeMap::new(); // le bits (ordered) -> (le, sum)
    let mut found = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some(rest) = rest.strip_prefix('{') else {
            continue;
        };
        let Some(close) = rest.rfind('}') else {
            continue;
        };
        let labels = parse_labels(&rest[..close]);
        let value: f64 = match rest[close + 1..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
        {
            Some(v) => v,
            None => continue,
        };
        if let Some(m) = model {
            if !model_keys
                .iter()
                .any(|k| labels.get(*k).is_some_and(|v| v == m))
            {
                continue;
            }
        }
        let Some(le) = labels.get("le").and_then(|v| parse_le(v)) else {
            continue;
        };
        found = true;
        let e = acc.entry(order_key(le)).or_insert((le, 0.0));
        e.1 += value;
    }
    found.then(|| acc.into_values().collect())
}

fn parse_le(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" | "inf" => Some(f64::INFINITY),
        _ => v.parse().ok(),
    }
}

/// Monotone map from non-negative f64 to u64 so a BTreeMap keeps buckets in `le` order.
fn order_key(x: f64) -> u64 {
    x.to_bits()
}

fn parse_labels(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i] != b'=' {
            i += 1;
        }
        let key = s[start..i]
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_string();
        i += 1; // '='
        if i >= b.len() || b[i] != b'"' {
            break;
        }
        i += 1;
        let mut val = String::new();
        while i < b.len() && b[i] != b'"' {
            if b[i] == b'\\' && i + 1 < b.len() {
                i += 1;
                val.push(match b[i] {
                    b'n' => '\n',
                    c => c as char,
                });
            } else {
                val.push(b[i] as char);
            }
            i += 1;
        }
        i += 1; // closing quote
        while i < b.len() && (b[i] == b',' || b[i] == b' ') {
            i += 1;
        }
        out.insert(key, val);
    }
    out
}

/// `end - start` per bucket (a counter reset, e.g. a restarted engine, yields `end`).
pub fn delta(start: Option<&Buckets>, end: &Buckets) -> Buckets {
    let Some(start) = start else {
        return end.clone();
    };
    let reset = end.iter().zip(start).any(|(e, s)| e.1 < s.1);
    end.iter()
        .map(|&(le, c)| {
            let before = if reset {
                0.0
            } else {
                start.iter().find(|s| s.0 == le).map_or(0.0, |s| s.1)
            };
            (le, (c - before).max(0.0))
        })
        .collect()
}

/// PromQL `histogram_quantile` on cumulative buckets: linear interpolation inside the bucket
/// holding rank `q * total` (lower bound 0 for the first bucket); a rank in `+Inf` returns the
/// highest finite bound. `None` for an empty histogram.
pub fn quantile(b: &Buckets, q: f64) -> Option<f64> {
    let total = b.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev_le = 0.0;
    let mut prev_c = 0.0;
    for &(le, c) in b {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev_le);
            }
            if c == prev_c {
                return Some(le);
            }
            return Some(prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c));
        }
        prev_le = le;
        prev_c = c;
    }
    Some(prev_le)
}

/// Sum of every series of a counter or gauge `name` (e.g. `vllm:generation_tokens_total`), or
/// `None` when the family is absent.
pub fn series_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(r) = rest.strip_prefix('{') {
            r.rfind('}').map(|c| &r[c + 1..])
        } else if rest.starts_with(' ') {
            Some(rest)
        } else {
            None // a longer name (`..._created`)
        };
        if let Some(v) = value
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Token and running-request counters of one source at one snapshot. For an engine these are
/// `vllm:generation_tokens_total`, `vllm:prompt_tokens_total`, `vllm:num_requests_running`,
/// `vllm:num_requests_waiting`; for the proxy `goodput_proxy_generation_tokens_total`,
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
    /// Engine metrics URL -> increase of `vllm:generation_tokens_total`.
    pub engine_generation_tokens: BTreeMap<String, Option<f64>>,
}

fn counters_of(
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
        let g = |n: &str| text.as_deref().map(|t| series_sum(t, n).unwrap_or(0.0));
        out.push(CounterSnapshot {
            phase: phase.into(),
            at: at.into(),
            t_s: snap.t_s,
            after_all_requests: after_all,
            source: url.clone(),
            generation_tokens_total: g("vllm:generation_tokens_total"),
            prompt_tokens_total: g("vllm:prompt_tokens_total"),
            num_requests_running: g("vllm:num_requests_running"),
            num_requests_waiting: g("vllm:num_requests_waiting"),
        });
    }
}

fn token_check(
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
            engines.insert(
                url.clone(),
                grow(
                    start_text,
                    end_text.as_deref(),
                    "vllm:generation_tokens_total",
                ),
            );
        }
    }
    TokenCheck {
        phase: phase.into(),
        client_completion_tokens: mine.iter().filter_map(|r| r.completion_tokens).sum(),
        client_completion_from_usage: mine
            .iter()
            .filter(|r| r.usage_exact)
            .filter_map(|r| r.completion_tokens)
            .sum(),
        client_requests_with_usage: mine.iter().filter(|r| r.usage_exact).count() as u64,
        client_requests: mine.len() as u64,
        proxy_generation_tokens: proxy,
        engine_generation_tokens: engines,
    }
}

// ---------- proxy per-request records ----------

/// The fields of a proxy record the join needs. The proxy's sink writes
/// `goodput_proxy::measure::record::RequestRecord` (`id`, `outcome`, `ttft_s`, `tpot_s`, `e2e_s`);
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

fn num(v: &serde_json::Value, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| v.get(*k)).and_then(|x| x.as_f64())
}
fn text(v: &serde_json::Value, keys: &[&str]) -> Option<String> {
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

const METRICS: [&str; 3] = ["ttft", "tpot", "e2e"];

fn proxy_family(metric: &str) -> &'static str {
    match metric {
        "ttft" => "goodput_proxy_time_to_first_token_seconds",
        "tpot" => "goodput_proxy_time_per_output_token_seconds",
        _ => "goodput_proxy_e2e_request_latency_seconds",
    }
}
fn engine_families(metric: &str) -> &'static [&'static str] {
    match metric {
        "ttft" => &["vllm:time_to_first_token_seconds"],
        "tpot" => &[
            "vllm:request_time_per_output_token_seconds",
            "vllm:time_per_output_token_seconds",
        ],
        _ => &["vllm:e2e_request_latency_seconds"],
    }
}
fn client_value(r: &RequestRecord, metric: &str) -> Option<f64> {
    match metric {
        "ttft" => r.ttft_seconds,
        "tpot" => r.tpot_seconds,
        _ => Some(r.e2e_seconds),
    }
}
fn proxy_value(r: &ProxyRecord, metric: &str) -> Option<f64> {
    match metric {
        "ttft" => r.ttft,
        "tpot" => r.tpot,
        _ => r.e2e,
    }
}

fn row(
    phase: &str,
    model: &str,
    metric: &str,
    source: String,
    q: [Option<f64>; 3],
    count: Option<f64>,
    client: [Option<f64>; 3],
) -> Row {
    let d = |i: usize| Some(q[i]? - client[i]?);
    Row {
        phase: phase.into(),
        model: model.into(),
        metric: metric.into(),
        source,
        count,
        p50: q[0],
        p95: q[1],
        p99: q[2],
        diff_p50: d(0),
        diff_p95: d(1),
        diff_p99: d(2),
    }
}

fn hist_q(
    start: Option<&str>,
    end: Option<&str>,
    fam: &str,
    keys: &[&str],
    model: &str,
) -> Option<([Option<f64>; 3], f64)> {
    let e = histogram(end?, fam, keys, Some(model))?;
    let s = start.and_then(|t| histogram(t, fam, keys, Some(model)));
    let d = delta(s.as_ref(), &e);
    let total = d.last().map_or(0.0, |x| x.1);
    (total > 0.0).then(|| {
        (
            [quantile(&d, 0.5), quantile(&d, 0.95), quantile(&d, 0.99)],
            total,
        )
    })
}

/// The rows of one span (a phase, or `overall`) for every model in it.
fn rows_for(
    rows: &mut Vec<Row>,
    name: &str,
    mine: &[&RequestRecord],
    snap: Option<&PhaseSnapshots>,
    by_id: &HashMap<&str, &ProxyRecord>,
    joined: bool,
) {
    let mut models: Vec<&str> = mine.iter().map(|r| r.model.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    for model in &models {
        let of_model: Vec<&&RequestRecord> = mine.iter().filter(|r| r.model == *model).collect();
        for metric in METRICS {
            let cs = Stats::of(
                of_model
                    .iter()
                    .filter_map(|r| client_value(r, metric))
                    .collect(),
            );
            let client = cs.map_or([None; 3], |s| [Some(s.p50), Some(s.p95), Some(s.p99)]);
            rows.push(row(
                name,
                model,
                metric,
                "client exact".into(),
                client,
                cs.map(|s| s.count as f64),
                client,
            ));
            // Proxy exact: the joined records of exactly these requests.
            if joined {
                let vals: Vec<f64> = of_model
                    .iter()
                    .filter_map(|r| {
                        by_id
                            .get(r.request_id.as_str())
                            .and_then(|p| proxy_value(p, metric))
                    })
                    .collect();
                if let Some(s) = Stats::of(vals) {
                    rows.push(row(
                        name,
                        model,
                        metric,
                        "proxy exact".into(),
                        [Some(s.p50), Some(s.p95), Some(s.p99)],
                        Some(s.count as f64),
                        client,
                    ));
                }
            }
            // /stats as well: it is what an operator sees without the sink.
            if let Some(st) = snap.and_then(|s| s.end.proxy_stats.get(*model)) {
                let obj = st.get(format!("{metric}_seconds"));
                let g = |k: &str| obj.and_then(|o| o.get(k)).and_then(|v| v.as_f64());
                if g("p50").is_some() {
                    rows.push(row(
                        name,
                        model,
                        metric,
                        "proxy exact (/stats)".into(),
                        [g("p50"), g("p95"), g("p99")],
                        g("count"),
                        client,
                    ));
                }
            }
            if let Some(s) = snap {
                if let Some((q, n)) = hist_q(
                    s.start.proxy_metrics.as_deref(),
                    s.end.proxy_metrics.as_deref(),
                    proxy_family(metric),
                    &["model"],
                    model,
                ) {
                    rows.push(row(
                        name,
                        model,
                        metric,
                        "proxy histogram".into(),
                        q,
                        Some(n),
                        client,
                    ));
                }
                for (i, (url, end_text)) in s.end.engines.iter().enumerate() {
                    let start_text = s.start.engines.get(i).and_then(|e| e.1.as_deref());
                    let found = engine_families(metric).iter().find_map(|fam| {
                        hist_q(
                            start_text,
                            end_text.as_deref(),
                            fam,
                            &["model_name", "model"],
                            model,
                        )
                    });
                    if let Some((q, n)) = found {
                        rows.push(row(
                            name,
                            model,
                            metric,
                            format!("engine histogram ({url})"),
                            q,
                            Some(n),
                            client,
                        ));
                    }
                }
            }
        }
    }
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
                    client_usage: r.usage_exact,
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

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}", x * 1000.0))
}
fn sms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:+.1}", x * 1000.0))
}

/// Terminal tables.
pub fn render_text(c: &Comparison) -> String {
    let mut o = String::from("\nclient vs proxy vs engine (ms; d = source - client)\n");
    let sw = c
        .rows
        .iter()
        .map(|r| r.source.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let pw = c
        .rows
        .iter()
        .map(|r| r.phase.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mw = c
        .rows
        .iter()
        .map(|r| r.model.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        o,
        "  {:<pw$} {:<mw$} {:<5} {:<sw$} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "phase", "model", "what", "source", "n", "p50", "p95", "p99", "d50", "d95", "d99"
    );
    for r in &c.rows {
        let _ = writeln!(
            o,
            "  {:<pw$} {:<mw$} {:<5} {:<sw$} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            r.phase,
            r.model,
            r.metric,
            r.source,
            r.count.map_or("-".into(), |n| format!("{n:.0}")),
            ms(r.p50),
            ms(r.p95),
            ms(r.p99),
            sms(r.diff_p50),
            sms(r.diff_p95),
            sms(r.diff_p99)
        );
    }
    for j in &c.joins {
        let _ = writeln!(
            o,
            "  join {}: {}/{} matched by request id, outcomes agree {} disagree {} {:?}",
            j.phase,
            j.matched,
            j.client_requests,
            j.outcomes_agree,
            j.outcomes_disagree,
            j.disagreements
        );
        if j.tokens_compared > 0 {
            let _ = writeln!(
                o,
                "    completion tokens of successes: {}/{} agree",
                j.tokens_agree, j.tokens_compared
            );
        }
        for (n, d) in [
            ("TTFT", &j.ttft_proxy_minus_client),
            ("E2E", &j.e2e_proxy_minus_client),
        ] {
            if let Some(d) = d {
                let _ = writeln!(
                    o,
                    "    proxy-client {n}: p50 {} p99 {} min {} max {} ms (n={})",
                    sms(Some(d.p50)),
                    sms(Some(d.p99)),
                    sms(Some(d.min)),
                    sms(Some(d.max)),
                    d.count
                );
            }
        }
    }
    for t in &c.tokens {
        let _ = writeln!(
            o,
            "  tokens {}: client {} ({} from usage in {}/{} requests), proxy +{}, {}",
            t.phase,
            t.client_completion_tokens,
            t.client_completion_from_usage,
            t.client_requests_with_usage,
            t.client_requests,
            t.proxy_generation_tokens
                .map_or("-".into(), |v| format!("{v:.0}")),
            t.engine_generation_tokens
                .iter()
                .map(|(u, v)| format!(
                    "engine {u} +{}",
                    v.map_or("-".into(), |v| format!("{v:.0}"))
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for n in &c.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    o
}

/// HTML tables for the report.
pub fn render_html(c: &Comparison) -> String {
    use crate::report::html::esc;
    let mut h = String::from("<table><tr><th>phase</th><th>model</th><th>latency</th><th>source</th><th>n</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>Δp50</th><th>Δp95</th><th>Δp99</th></tr>");
    for r in &c.rows {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.phase),
            esc(&r.model),
            esc(&r.metric),
            esc(&r.source),
            r.count.map_or("-".into(), |n| format!("{n:.0}")),
            ms(r.p50),
            ms(r.p95),
            ms(r.p99),
            sms(r.diff_p50),
            sms(r.diff_p95),
            sms(r.diff_p99)
        );
    }
    h.push_str("</table>");
    if !c.joins.is_empty() {
        h.push_str("<table><tr><th>phase</th><th>matched</th><th>outcomes agree</th><th>disagree</th><th>success tokens agree</th><th>TTFT proxy−client p50/p99/max ms</th><th>E2E proxy−client p50/p99/max ms</th></tr>");
        let f = |d: &Option<DiffStats>| {
            d.as_ref().map_or("-".into(), |d| {
                format!(
                    "{} / {} / {}",
                    sms(Some(d.p50)),
                    sms(Some(d.p99)),
                    sms(Some(d.max))
                )
            })
        };
        for j in &c.joins {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td></tr>",
                esc(&j.phase),
                j.matched,
                j.client_requests,
                j.outcomes_agree,
                j.outcomes_disagree,
                j.tokens_agree,
                j.tokens_compared,
                f(&j.ttft_proxy_minus_client),
                f(&j.e2e_proxy_minus_client)
            );
        }
        h.push_str("</table>");
    }
    if !c.tokens.is_empty() {
        h.push_str("<table><tr><th>tokens</th><th>client completion</th><th>from usage (requests)</th><th>proxy +</th><th>engines +</th></tr>");
        let n = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        for t in &c.tokens {
            let engines: Vec<String> = t
                .engine_generation_tokens
                .iter()
                .map(|(u, v)| format!("{}: {}", esc(u), n(*v)))
                .collect();
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{} ({}/{})</td><td>{}</td><td>{}</td></tr>",
                esc(&t.phase),
                t.client_completion_tokens,
                t.client_completion_from_usage,
                t.client_requests_with_usage,
                t.client_requests,
                n(t.proxy_generation_tokens),
                engines.join("<br>")
            );
        }
        h.push_str("</table>");
    }
    for n in &c.notes {
        let _ = write!(h, "<p class=meta>{}</p>", esc(n));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = "# TYPE vllm:time_to_first_token_seconds histogram\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"tiny\"} 1.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.2\",model_name=\"tiny\"} 2.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"tiny\"} 2.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"big\"} 50.0\n\
vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"tiny\"} 2.0\n";
    const END: &str = "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"tiny\"} 1.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.2\",model_name=\"tiny\"} 102.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"tiny\"} 102.0\n";

    #[test]
    fn histogram_delta_and_quantile() {
        let s = histogram(
            START,
            "vllm:time_to_first_token_seconds",
            &["model_name"],
            Some("tiny"),
        )
        .unwrap();
        let e = histogram(
            END,
            "vllm:time_to_first_token_seconds",
            &["model_name"],
            Some("tiny"),
        )
        .unwrap();
        let d = delta(Some(&s), &e);
        assert_eq!(d, vec![(0.1, 0.0), (0.2, 100.0), (f64::INFINITY, 100.0)]);
        // All 100 in (0.1, 0.2]: p50 interpolates to the middle.
        assert!((quantile(&d, 0.5).unwrap() - 0.15).abs() < 1e-12);
        assert!((quantile(&d, 0.99).unwrap() - 0.199).abs() < 1e-12);
        assert!(histogram(
            START,
            "vllm:time_to_first_token_seconds",
            &["model_name"],
            Some("nope")
        )
        .is_none());
    }

    #[test]
    fn quantile_edge_cases() {
        assert_eq!(quantile(&vec![(1.0, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
        // Rank in +Inf: the highest finite bound (as PromQL).
        assert_eq!(
            quantile(&vec![(1.0, 0.0), (f64::INFINITY, 4.0)], 0.5),
            Some(1.0)
        );
        // First bucket interpolates from 0.
        assert_eq!(
            quantile(&vec![(2.0, 4.0), (f64::INFINITY, 4.0)], 0.5),
            Some(1.0)
        );
        // Counter reset: the end snapshot alone.
        let d = delta(
            Some(&vec![(1.0, 9.0), (f64::INFINITY, 9.0)]),
            &vec![(1.0, 2.0), (f64::INFINITY, 3.0)],
        );
        assert_eq!(d, vec![(1.0, 2.0), (f64::INFINITY, 3.0)]);
    }

    #[test]
    fn series_sums_counters_and_gauges() {
        let t = "# TYPE vllm:generation_tokens_total counter\n\
vllm:generation_tokens_total{engine=\"0\",model_name=\"tiny\"} 83.0\n\
vllm:generation_tokens_total{engine=\"1\",model_name=\"tiny\"} 17\n\
vllm:generation_tokens_created{engine=\"0\"} 1.7e9\n\
plain_gauge 4\n";
        assert_eq!(series_sum(t, "vllm:generation_tokens_total"), Some(100.0));
        assert_eq!(series_sum(t, "plain_gauge"), Some(4.0));
        assert_eq!(series_sum(t, "plain"), None, "a prefix is not the family");
        assert_eq!(series_sum(t, "vllm:num_requests_running"), None);
    }

    #[test]
    fn counters_and_token_check_per_phase_and_overall() {
        let engine = |gen: u32, running: u32| {
            format!("vllm:generation_tokens_total{{model_name=\"m\"}} {gen}\nvllm:num_requests_running{{model_name=\"m\"}} {running}\n")
        };
        let proxy =
            |gen: u32| format!("goodput_proxy_generation_tokens_total{{model=\"m\"}} {gen}\n");
        let snap = |t: f64, p: u32, e: u32, r: u32| Snapshot {
            t_s: t,
            proxy_asked: true,
            proxy_metrics: Some(proxy(p)),
            engines: vec![("E".into(), Some(engine(e, r)))],
            ..Snapshot::default()
        };
        let win = |name: &str, a: f64, b: f64| PhaseWindow {
            name: name.into(),
            arrivals: String::new(),
            start_s: a,
            end_s: b,
            held_back: 0,
            hold_max_seconds: 0.0,
        };
        let snaps = vec![
            PhaseSnapshots {
                phase: "a".into(),
                start: snap(0.0, 100, 200, 0),
                end: snap(1.0, 110, 210, 2),
                settled: None,
            },
            PhaseSnapshots {
                phase: "b".into(),
                start: snap(1.0, 110, 210, 2),
                end: snap(2.0, 125, 225, 1),
                settled: Some(snap(3.0, 125, 225, 0)),
            },
        ];
        let mut r1 = crate::report::summary::tests::rec("a", 0.1, 0.5, Some(0.1), "success");
        r1.completion_tokens = Some(10);
        let mut r2 = crate::report::summary::tests::rec("b", 1.1, 0.5, Some(0.1), "success");
        r2.completion_tokens = Some(15);
        r2.usage_exact = false;
        let c = build(
            &[win("a", 0.0, 1.0), win("b", 1.0, 2.0)],
            &[r1, r2],
            &snaps,
            None,
        );
        assert_eq!(
            c.counters.len(),
            10,
            "2 sources x (2 instants x 2 phases + settled)"
        );
        let end = &c.counters[7];
        assert_eq!(
            (end.phase.as_str(), end.at.as_str(), end.source.as_str()),
            ("b", "end", "E")
        );
        assert!(end.after_all_requests);
        assert_eq!(end.num_requests_running, Some(1.0));
        let last = c.counters.last().unwrap();
        assert_eq!((last.at.as_str(), last.t_s), ("settled", 3.0));
        assert_eq!(last.num_requests_running, Some(0.0));
        assert_eq!(c.counters[3].num_requests_running, Some(2.0));
        let t: Vec<_> = c.tokens.iter().map(|t| t.phase.as_str()).collect();
        assert_eq!(t, ["a", "b", "overall"]);
        let all = &c.tokens[2];
        assert_eq!(
            (
                all.client_completion_tokens,
                all.client_completion_from_usage,
                all.client_requests_with_usage
            ),
            (25, 10, 1)
        );
        assert_eq!(all.proxy_generation_tokens, Some(25.0));
        assert_eq!(all.engine_generation_tokens["E"], Some(25.0));
        assert_eq!(c.tokens[0].engine_generation_tokens["E"], Some(10.0));
    }

    #[test]
    fn labels_with_escapes() {
        let l = parse_labels(r#"a="x\"y",le="0.5", model="m""#);
        assert_eq!(l["a"], "x\"y");
        assert_eq!(l["le"], "0.5");
        assert_eq!(l["model"], "m");
    }

    #[test]
    fn reads_the_proxys_own_sink_records() {
        use goodput_proxy::measure::record::RequestRecord as ProxyRec;
        use goodput_proxy::measure::{judge, Measurement, Outcome, Slo};
        use std::time::Duration;
        let mut m =
            Measurement::without_body(Outcome::Truncated, Some(200), Duration::from_millis(900));
        m.streaming = true;
        m.ttft = Some(Duration::from_millis(120));
        let v = judge(&m, &Slo::default());
        let rec = ProxyRec::new(
            "lt1-0000007".into(),
            "tiny".into(),
            None,
            0,
            tokio::time::Instant::now(),
            &m,
            v,
        );
        let line = serde_json::to_string(&rec).unwrap();
        let got = parse_proxy_records(&line);
        assert_eq!(
            got,
            vec![ProxyRecord {
                id: "lt1-0000007".into(),
                model: Some("tiny".into()),
                outcome: Some("truncated".into()),
                ttft: Some(0.12),
                tpot: None,
                e2e: Some(0.9),
                completion_tokens: None,
            }]
        );
    }

    #[test]
    fn join_by_request_id() {
        let mut a = crate::report::summary::tests::rec("p", 0.0, 1.0, Some(0.100), "success");
        a.request_id = "r1".into();
        let mut b = crate::report::summary::tests::rec("p", 0.0, 2.0, Some(0.200), "truncated");
        b.request_id = "r2".into();
        let proxy = parse_proxy_records(
            "{\"request_id\":\"r1\",\"outcome\":\"success\",\"ttft_seconds\":0.098,\"e2e_seconds\":0.997,\"completion_tokens\":4}\n\
             {\"id\":\"r2\",\"outcome\":\"upstream_error\",\"ttft\":0.199,\"e2e\":1.999}\nnot json\n",
        );
        assert_eq!(proxy.len(), 2);
        let w = PhaseWindow {
            name: "p".into(),
            arrivals: String::new(),
            start_s: 0.0,
            end_s: 2.0,
            held_back: 0,
            hold_max_seconds: 0.0,
        };
        let mut lost = crate::report::summary::tests::rec("p", 1.0, 1.0, None, "success");
        lost.request_id = "r3".into();
        let c = build(&[w], &[a, b, lost], &[], Some(&proxy));
        assert_eq!(c.joins.len(), 2, "the phase and overall");
        assert_eq!(c.joins[1].phase, "overall");
        let j = &c.joins[0];
        assert_eq!(
            (
                j.client_requests,
                j.matched,
                j.outcomes_agree,
                j.outcomes_disagree
            ),
            (3, 2, 1, 1)
        );
        assert_eq!(j.disagreements["truncated -> upstream_error"], 1);
        assert_eq!(
            j.disagreeing,
            vec![Disagreement {
                request_id: "r2".into(),
                client: "truncated".into(),
                proxy: Some("upstream_error".into()),
            }]
        );
        assert_eq!(j.unmatched_ids, ["r3"]);
        // Tokens are compared on successes only (r1: the client counted 5, the proxy 4).
        assert_eq!((j.tokens_compared, j.tokens_agree), (1, 0));
        assert_eq!(
            (
                j.tokens_disagreeing[0].client,
                j.tokens_disagreeing[0].proxy
            ),
            (5, 4)
        );
        let t = j.ttft_proxy_minus_client.as_ref().unwrap();
        assert!((t.max - -0.001).abs() < 1e-9 && (t.min - -0.002).abs() < 1e-9);
        let exact = c
            .rows
            .iter()
            .find(|r| r.source == "proxy exact" && r.metric == "ttft")
            .unwrap();
        assert_eq!(exact.count, Some(2.0));
    }
}
