//! `report.html`: one self-contained file (inline CSS and SVG, no scripts, no network).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::charts;
use super::summary::{in_flight_steps, PhaseSummary, PhaseWindow, Stats, Summary};
use crate::record::RequestRecord;

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ms(s: Option<f64>) -> String {
    s.map_or("–".into(), |v| format!("{:.1}", v * 1000.0))
}

fn stats_row(name: &str, s: &Option<Stats>) -> String {
    match s {
        Some(s) => format!(
            "<tr><td>{name}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            s.count,
            ms(Some(s.mean)),
            ms(Some(s.p50)),
            ms(Some(s.p90)),
            ms(Some(s.p95)),
            ms(Some(s.p99)),
            ms(Some(s.p999)),
            ms(Some(s.max))
        ),
        None => format!("<tr><td>{name}</td><td>0</td><td colspan=7>no values</td></tr>"),
    }
}

fn phase_block(p: &PhaseSummary) -> String {
    let mut h = String::new();
    let outcomes: Vec<String> = p
        .outcomes
        .iter()
        .map(|(k, v)| format!("{}: {v}", esc(k)))
        .collect();
    let _ = write!(
        h,
        "<h3>{}</h3><p class=meta>{}{:.1}–{:.1} s · {} requests ({:.2}/s) · {} · goodput {} good, {:.2}/s, ratio {} · {:.0} output tok/s · in-flight peak {}{}</p>",
        esc(&p.name),
        if p.arrivals.is_empty() { String::new() } else { format!("{} · ", esc(&p.arrivals)) },
        p.start_s,
        p.end_s,
        p.requests,
        p.requests_per_second,
        outcomes.join(", "),
        p.goodput.good,
        p.goodput.per_second,
        p.goodput.ratio.map_or("–".into(), |r| format!("{:.1}%", r * 100.0)),
        p.tokens.completion_per_second,
        p.in_flight_peak,
        if p.held_back > 0 {
            format!(" · <b class=warn>in-flight cap held back {} arrivals (up to {:.0} ms)</b>", p.held_back, p.hold_max_seconds * 1000.0)
        } else {
            String::new()
        }
    );
    h.push_str("<table><tr><th>latency (ms)</th><th>n</th><th>mean</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th></tr>");
    for (n, s) in [
        ("TTFT", &p.ttft_seconds),
        ("TTFC", &p.ttfc_seconds),
        ("TPOT", &p.tpot_seconds),
        ("ITL", &p.itl_seconds),
        ("E2E", &p.e2e_seconds),
        ("send lag", &p.send_lag_seconds),
    ] {
        h.push_str(&stats_row(n, s));
    }
    h.push_str("</table>");
    if let Some(t) = &p.tool_calls {
        h.push_str(&super::tool_calls::render_html(&p.name, t));
    }
    h
}

/// Render the whole report.
pub fn render(summary: &Summary, windows: &[PhaseWindow], records: &[RequestRecord]) -> String {
    let total = windows
        .last()
        .map_or(0.0, |w| w.end_s)
        .max(records.iter().map(|r| r.end_s()).fold(0.0, f64::max));
    let per_phase = |f: fn(&RequestRecord) -> Option<f64>| -> Vec<(String, Vec<f64>)> {
        windows
            .iter()
            .map(|w| {
                (
                    w.name.clone(),
                    records
                        .iter()
                        .filter(|r| r.phase == w.name)
                        .filter_map(f)
                        .collect(),
                )
            })
            .collect()
    };
    let ttft_cdf = charts::cdf("TTFT CDF per phase", &per_phase(|r| r.ttft_seconds));
    let tpot_cdf = charts::cdf("TPOT CDF per phase", &per_phase(|r| r.tpot_seconds));
    let e2e_cdf = charts::cdf("E2E CDF per phase", &per_phase(|r| Some(r.e2e_seconds)));
    let (done, good) = charts::throughput(records, total);
    let thr = charts::time_series(
        "Throughput",
        "requests/s",
        windows,
        total,
        &[("completed".into(), done), ("good".into(), good)],
    );
    let infl = charts::time_series(
        "Requests in flight",
        "in flight",
        windows,
        total,
        &[(
            "in flight".into(),
            charts::in_flight_line(&in_flight_steps(records)),
        )],
    );
    let (p50, p99) = charts::ttft_series(records, total);
    let ttft_ts = charts::time_series(
        "TTFT over time (by send time)",
        "ms",
        windows,
        total,
        &[("p50".into(), p50), ("p99".into(), p99)],
    );
    let names: BTreeSet<String> = summary
        .phases
        .iter()
        .flat_map(|p| p.outcomes.keys().cloned())
        .collect();
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort_by_key(|n| (n != "success", n.clone()));
    let outc = charts::outcomes(
        &summary
            .phases
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.outcomes.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                )
            })
            .collect::<Vec<_>>(),
        &names,
    );

    let mut h = String::with_capacity(256 * 1024);
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=utf-8><title>goodput-loadtest report</title><style>{CSS}</style></head><body>\
         <h1>goodput-loadtest report</h1><p class=meta>target <code>{}</code> · scenario <code>{}</code> · seed {} · max in flight {} · SLO TTFT {} ms, TPOT {} ms, E2E {} ms{}</p>",
        esc(&summary.target),
        esc(&summary.scenario),
        summary.seed,
        summary.max_in_flight,
        summary.slo.ttft_ms.map_or("–".into(), |v| v.to_string()),
        summary.slo.tpot_ms.map_or("–".into(), |v| v.to_string()),
        summary.slo.e2e_ms.map_or("–".into(), |v| v.to_string()),
        summary
            .slo
            .max_stall_ms
            .map_or(String::new(), |v| format!(", stall {v} ms")),
    );
    h.push_str("<h2>Latency distributions</h2><div class=grid>");
    for c in [&ttft_cdf, &tpot_cdf, &e2e_cdf, &outc] {
        let _ = write!(h, "<div class=chart>{c}</div>");
    }
    h.push_str("</div><h2>Over time</h2><div class=grid>");
    for c in [&thr, &infl, &ttft_ts] {
        let _ = write!(h, "<div class=chart>{c}</div>");
    }
    h.push_str("</div><h2>Phases</h2>");
    h.push_str(&phase_block(&summary.overall));
    for p in &summary.phases {
        h.push_str(&phase_block(p));
    }
    let by_option = &summary.overall.outcomes_by_option;
    if !by_option.is_empty() {
        h.push_str("<h2>Outcomes by request option</h2><table><tr><th>option</th>");
        for n in &names {
            let _ = write!(h, "<th>{}</th>", esc(n));
        }
        h.push_str("</tr>");
        for (k, counts) in by_option {
            let _ = write!(h, "<tr><td>{}</td>", esc(k));
            for n in &names {
                let _ = write!(h, "<td>{}</td>", counts.get(n).copied().unwrap_or(0));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    if let Some(c) = &summary.comparison {
        h.push_str("<h2>Client vs proxy vs engine</h2>");
        h.push_str(&crate::report::compare::render_html(c));
    }
    h.push_str("<p class=meta>Percentiles are exact (linear interpolation between closest ranks, as numpy and vllm bench serve compute them, over raw per-request values); histogram figures in the comparison are bucket estimates.</p></body></html>\n");
    h
}

const CSS: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1280px}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:18px 0 4px}\
.meta{color:#555;font-size:13px}.warn{color:#b00}code{background:#f3f3f3;padding:1px 4px}\
.grid{display:flex;flex-wrap:wrap;gap:8px}.chart{border:1px solid #eee}\
table{border-collapse:collapse;font-size:13px;margin:4px 0 10px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\
td:first-child,th:first-child{text-align:left}th{background:#f6f6f6}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample as rec;
    use crate::report::summary::build;

    /// Three phases of synthetic records with a spread of latencies and outcomes.
    pub(crate) fn sample() -> (Summary, Vec<PhaseWindow>, Vec<RequestRecord>) {
        let mut records = Vec::new();
        let mut windows = Vec::new();
        for (pi, name) in ["warmup", "steady", "overload"].iter().enumerate() {
            let start = pi as f64 * 10.0;
            windows.push(PhaseWindow {
                name: name.to_string(),
                arrivals: "poisson(5/s)".into(),
                start_s: start,
                end_s: start + 10.0,
                held_back: 0,
                hold_max_seconds: 0.0,
            });
            for k in 0..200 {
                let x = k as f64 / 200.0;
                let outcome = match k % 23 {
                    0 => "truncated",
                    1 => "upstream_error",
                    _ => "success",
                };
                let mut r = rec(
                    name,
                    start + x * 10.0,
                    0.5 + x * (pi + 1) as f64,
                    Some(0.05 + 0.1 * x * x * (pi + 1) as f64),
                    outcome,
                );
                r.tpot_seconds = Some(0.01 + 0.005 * x * (pi + 1) as f64);
                records.push(r);
            }
        }
        let (phases, overall) = build(&windows, &records);
        let summary = Summary {
            target: "http://127.0.0.1:1".into(),
            scenario: "test <&>".into(),
            seed: 1,
            max_in_flight: 8,
            slo: crate::scenario::SloSpec::default(),
            phases,
            overall,
            comparison: None,
        };
        (summary, windows, records)
    }

    #[test]
    fn report_has_every_chart_and_escapes_text() {
        let (summary, windows, records) = sample();
        let html = render(&summary, &windows, &records);
        assert_eq!(
            html.matches("<svg").count(),
            7,
            "3 CDFs, outcomes, throughput, in-flight, TTFT over time"
        );
        assert!(!html.contains("could not be drawn"));
        assert!(!html.contains("<script"), "self-contained, no scripts");
        assert!(html.contains("test &lt;&amp;&gt;"));
        for p in ["warmup", "steady", "overload"] {
            assert!(html.contains(p));
        }
        if let Ok(path) = std::env::var("LOADTEST_SAMPLE_HTML") {
            std::fs::write(path, &html).unwrap();
        }
    }
}
