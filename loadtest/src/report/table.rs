//! The readable terminal summary printed at the end of a run.

use std::fmt::Write as _;

use super::summary::{PhaseSummary, Stats, Summary};

/// Send lag beyond which the offered load is not the planned one.
const LAG_WARN_SECONDS: f64 = 0.010;

fn ms(v: f64) -> String {
    format!("{:.1}", v * 1000.0)
}

fn line(name: &str, s: &Option<Stats>) -> String {
    match s {
        Some(s) => format!(
            "  {name:<5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            s.count,
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            ms(s.max),
            ms(s.mean)
        ),
        None => format!("  {name:<5} {:>7}\n", 0),
    }
}

fn phase(out: &mut String, p: &PhaseSummary) {
    let outcomes: Vec<String> = p.outcomes.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(
        out,
        "{}{} {:.1}s  requests={} ({:.2}/s)  {}",
        p.name,
        if p.arrivals.is_empty() {
            String::new()
        } else {
            format!(" [{}]", p.arrivals)
        },
        p.elapsed_seconds,
        p.requests,
        p.requests_per_second,
        outcomes.join(" ")
    );
    let _ = writeln!(
        out,
        "  goodput {} good ({:.2}/s, ratio {})  output {:.0} tok/s  in-flight peak {}{}",
        p.goodput.good,
        p.goodput.per_second,
        p.goodput
            .ratio
            .map_or("-".into(), |r| format!("{:.1}%", r * 100.0)),
        p.tokens.completion_per_second,
        p.in_flight_peak,
        if p.held_back > 0 {
            format!(
                "  HELD BACK {} arrivals by the in-flight cap (max {:.0} ms)",
                p.held_back,
                p.hold_max_seconds * 1000.0
            )
        } else {
            String::new()
        }
    );
    if let Some(lag) = p
        .send_lag_seconds
        .filter(|l| l.p99 > LAG_WARN_SECONDS && p.held_back == 0)
    {
        let _ = writeln!(
            out,
            "  WARNING: sends fell behind the schedule (lag p99 {:.0} ms): the generator could not offer this load",
            lag.p99 * 1000.0
        );
    }
    let _ = writeln!(
        out,
        "  {:<5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "ms", "n", "p50", "p90", "p99", "max", "mean"
    );
    for (n, s) in [
        ("TTFT", &p.ttft_seconds),
        ("TTFC", &p.ttfc_seconds),
        ("TPOT", &p.tpot_seconds),
        ("ITL", &p.itl_seconds),
        ("E2E", &p.e2e_seconds),
        ("lag", &p.send_lag_seconds),
    ] {
        out.push_str(&line(n, s));
    }
    if let Some(t) = &p.tool_calls {
        super::tool_calls::render_text(out, t);
    }
}

pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    for p in &s.phases {
        phase(&mut out, p);
    }
    if s.phases.len() > 1 {
        phase(&mut out, &s.overall);
    }
    // Only when the mix varied: one line per option value that not every request shared.
    let n = s.overall.requests;
    let varied: Vec<_> = s
        .overall
        .outcomes_by_option
        .iter()
        .filter(|(_, c)| c.values().sum::<u64>() < n)
        .collect();
    if !varied.is_empty() {
        out.push_str("\noutcomes by request option\n");
        for (k, c) in varied {
            let parts: Vec<String> = c.iter().map(|(o, v)| format!("{o} {v}")).collect();
            let _ = writeln!(out, "  {k:<24} {}", parts.join(", "));
        }
    }
    if let Some(c) = &s.comparison {
        out.push_str(&crate::report::compare::render_text(c));
    }
    out
}
