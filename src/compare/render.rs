//! The comparison table as text (for a terminal) or JSON (for scripts).

use std::fmt::Write as _;

use super::{Cell, Group, Table, P50P99};

/// The table as one JSON document (the [`Table`] fields, `null` where a figure is undefined).
pub fn json(t: &Table) -> String {
    serde_json::to_string_pretty(t).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.2}", v * 1e3))
}

fn signed_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:+.2}", v * 1e3))
}

fn quantile_name(q: f64) -> String {
    format!("p{}", (q * 100.0).round())
}

/// The column heads of the text table (the first is the quantity's).
pub const COLUMNS: [&str; 10] = [
    "",
    "q",
    "exact",
    "proxy~",
    "engine~",
    "proxy-exact",
    "engine-exact",
    "proxy-engine",
    "bucket",
    "n exact/proxy/engine",
];

fn cells_row(quantity: &str, c: &Cell, counts: &str) -> [String; 10] {
    [
        quantity.to_string(),
        quantile_name(c.quantile),
        ms(c.exact),
        ms(c.proxy_hist),
        ms(c.engine_hist),
        signed_ms(c.proxy_minus_exact),
        signed_ms(c.engine_minus_exact),
        signed_ms(c.proxy_minus_engine),
        ms(c.bucket_width),
        counts.to_string(),
    ]
}

fn group_text(out: &mut String, g: &Group) {
    let _ = match &g.upstream {
        Some(u) => writeln!(out, "model {}  upstream {}", g.model, u),
        None => writeln!(out, "model {}  (all upstreams)", g.model),
    };
    let mut lines: Vec<[String; 10]> = vec![COLUMNS.map(str::to_string)];
    for r in &g.rows {
        for (i, c) in r.cells.iter().enumerate() {
            let counts = if i == 0 {
                format!("{}/{}/{}", r.exact_count, r.proxy_count, r.engine_count)
            } else {
                String::new()
            };
            lines.push(cells_row(if i == 0 { r.quantity } else { "" }, c, &counts));
        }
    }
    let widths: Vec<usize> = (0..COLUMNS.len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    for l in &lines {
        let mut line = String::from(" ");
        for (i, cell) in l.iter().enumerate() {
            // Text columns left, numbers right.
            if i < 2 {
                let _ = write!(line, " {cell:<w$}", w = widths[i]);
            } else {
                let _ = write!(line, " {cell:>w$}", w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    for r in &g.rows {
        if let Some(note) = r.grid.note() {
            let _ = writeln!(out, "  {}: {note}", r.quantity);
        }
        if !r.no_histogram.is_empty() {
            let others = if r.engine.is_some() {
                ": the engine column covers the other replicas"
            } else {
                ": no engine estimate"
            };
            let _ = writeln!(
                out,
                "  {}: {} exports no such histogram{others}",
                r.quantity,
                r.no_histogram.join(", ")
            );
        }
    }
    let e = &g.engine;
    let reasons: Vec<String> = e
        .finished_reason
        .iter()
        .filter(|(_, n)| **n > 0.0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    if let Some(s) = &g.ttft_split {
        let pq = |p: &P50P99| format!("{}/{}", ms(p.p50), ms(p.p99));
        let _ = writeln!(
            out,
            "  where TTFT goes (p50/p99 ms, {} requests the engine reported{}): proxy {}, engine queue {}, engine prefill {}, rest {}",
            s.requests,
            if s.clamped > 0 {
                format!(", {} clamped", s.clamped)
            } else {
                String::new()
            },
            pq(&s.proxy),
            pq(&s.engine_queue),
            pq(&s.engine_prefill),
            pq(&s.rest),
        );
        let _ = writeln!(
            out,
            "  decode (p50/p99 ms): client TPOT {}, engine mean ITL {}",
            pq(&s.client_tpot),
            pq(&s.engine_mean_itl),
        );
    }
    let opt = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| v.to_string());
    let _ = writeln!(
        out,
        "  engine counters: {:.2} req/s; finished_reason: {}; max running {}, max waiting {}",
        e.requests_per_s,
        if reasons.is_empty() {
            "-".to_string()
        } else {
            reasons.join(", ")
        },
        opt(e.max_running),
        opt(e.max_waiting),
    );
}

/// The table for a terminal: one block per group, times in milliseconds.
pub fn text(t: &Table) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "window {:.1} s. Times in ms. exact: raw per-request values (/stats); proxy~ / engine~: \
         histogram estimates (histogram_quantile interpolation over the bucket deltas between \
         two scrapes); bucket: width of the proxy bucket holding the exact value.",
        t.window_seconds
    );
    if t.groups.is_empty() {
        let _ = writeln!(out, "no request finished through the proxy in the window");
    }
    for g in &t.groups {
        out.push('\n');
        group_text(&mut out, g);
    }
    out
}
