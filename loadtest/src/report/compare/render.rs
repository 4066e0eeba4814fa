//! The comparison as terminal tables and as an HTML section.

use std::fmt::Write as _;

use super::*;

pub(super) fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}", x * 1000.0))
}
pub(super) fn sms(v: Option<f64>) -> String {
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
    if let Some(w) = &c.ttft_split {
        o.push_str(&super::ttft_split::text(w));
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
