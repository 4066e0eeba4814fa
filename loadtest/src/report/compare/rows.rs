//! The per-source percentile rows: client exact, proxy exact, proxy and engine histograms.

use super::prom::engine_of;
use super::*;
use goodput_measure::prom::engines::{Names, VLLM};

pub(super) const METRICS: [&str; 3] = ["ttft", "tpot", "e2e"];

pub(super) fn proxy_family(metric: &str) -> &'static str {
    match metric {
        "ttft" => "goodput_proxy_time_to_first_token_seconds",
        "tpot" => "goodput_proxy_time_per_output_token_seconds",
        _ => "goodput_proxy_e2e_request_latency_seconds",
    }
}
/// The engine's histogram families of `metric`, by its own names (empty: it has none).
pub(super) fn engine_families(metric: &str, names: &'static Names) -> &'static [&'static str] {
    match metric {
        "ttft" => names.ttft,
        "tpot" => names.tpot,
        _ => names.e2e,
    }
}
pub(super) fn client_value(r: &RequestRecord, metric: &str) -> Option<f64> {
    match metric {
        "ttft" => r.ttft_seconds,
        "tpot" => r.tpot_seconds,
        _ => Some(r.e2e_seconds),
    }
}
pub(super) fn proxy_value(r: &ProxyRecord, metric: &str) -> Option<f64> {
    match metric {
        "ttft" => r.ttft,
        "tpot" => r.tpot,
        _ => r.e2e,
    }
}

pub(super) fn row(
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

pub(super) fn hist_q(
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
pub(super) fn rows_for(
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
                    let names = end_text.as_deref().map_or(&VLLM, engine_of);
                    let found = engine_families(metric, names).iter().find_map(|fam| {
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
