//! The autoscaling run's figures per signal: summary.json, table.md (the table of
//! docs/autoscaling.md) and report.html (load, replicas and attainment over time).

use std::fmt::Write as _;

use anyhow::Context;
use serde::Serialize;

use super::profile::{self, Done, Phase};
use super::{AutoscaleArgs, SignalRun};
use crate::report::charts;
use crate::report::html::esc;
use crate::report::PhaseWindow;

/// Attainment is read over this long (model seconds), sampled this often.
const WINDOW_S: f64 = 30.0;
const STEP_S: f64 = 5.0;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub signal: &'static str,
    pub metric: &'static str,
    pub target: f64,
    /// Each replica's cap on unfinished requests (`None`: unbounded).
    pub engine_cap: Option<u64>,
    pub requests: usize,
    pub goodput_ratio: Option<f64>,
    /// Good share of the requests that arrived during the ramp; lowest 30-s attainment there.
    pub ramp_good: Option<f64>,
    pub ramp_lowest: Option<f64>,
    /// Requests arriving during the spike or the minute after that missed an SLO.
    pub spike_misses: usize,
    /// Seconds after the spike's end until the 30-s attainment is back at the target for the
    /// rest of the plateau (0: it never fell; `None`: it did not come back).
    pub recovery_s: Option<f64>,
    pub replica_seconds: f64,
    pub peak_replicas: usize,
    /// Replica count changes during the 10-minute plateau.
    pub hold_changes: usize,
}

fn good_share(done: &[Done], from: f64, to: f64) -> Option<f64> {
    let (g, n) = done
        .iter()
        .filter(|d| d.start >= from && d.start < to)
        .fold((0usize, 0usize), |(g, n), d| {
            (g + usize::from(d.good), n + 1)
        });
    (n > 0).then(|| g as f64 / n as f64)
}

pub fn row(r: &SignalRun, phases: &[Phase], target: f64) -> Row {
    let end = profile::total(phases);
    let w = |name| profile::window(phases, name).unwrap_or((0.0, 0.0));
    let (ramp, hold, spike, after) = (w("ramp"), w("hold"), w("spike"), w("after"));
    Row {
        signal: r.signal.as_str(),
        metric: r.metric,
        target: r.target,
        engine_cap: r.engine_cap,
        requests: r.done.len(),
        goodput_ratio: good_share(&r.done, 0.0, f64::INFINITY),
        ramp_good: good_share(&r.done, ramp.0, ramp.1),
        ramp_lowest: profile::lowest(&r.done, ramp.0 + WINDOW_S, ramp.1, WINDOW_S, STEP_S),
        spike_misses: r
            .done
            .iter()
            .filter(|d| d.start >= spike.0 && d.start < spike.1 + 60.0 && !d.good)
            .count(),
        recovery_s: profile::recovery(&r.done, spike.1, after.1, WINDOW_S, STEP_S, target),
        replica_seconds: profile::replica_seconds(&r.replicas, end),
        peak_replicas: r.replicas.iter().map(|s| s.1).max().unwrap_or(0),
        hold_changes: profile::changes(&r.replicas, hold.0, hold.1),
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

pub fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| signal (per-replica target) | engine cap | goodput ratio | ramp: good / lowest 30 s | spike misses | back at target after spike | replica-seconds | peak | changes on plateau |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let back = r
            .recovery_s
            .map_or("not within the plateau".into(), |s| format!("{s:.0} s"));
        let _ = writeln!(
            t,
            "| {} `{}` ({}) | {} | {} | {} / {} | {} | {} | {:.0} | {} | {} |",
            r.signal,
            r.metric,
            fmt_target(r.target),
            r.engine_cap.map_or("none".into(), |c| c.to_string()),
            pct(r.goodput_ratio),
            pct(r.ramp_good),
            pct(r.ramp_lowest),
            r.spike_misses,
            back,
            r.replica_seconds,
            r.peak_replicas,
            r.hold_changes,
        );
    }
    t
}

fn fmt_target(t: f64) -> String {
    if t >= 100.0 {
        format!("{t:.0}")
    } else {
        format!("{t}")
    }
}

/// Steps as a line that holds each value until the next step.
fn step_line(steps: &[(f64, usize)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(steps.len() * 2);
    for (i, &(t, n)) in steps.iter().enumerate() {
        if i > 0 {
            out.push((t, steps[i - 1].1 as f64));
        }
        out.push((t, n as f64));
    }
    out
}

pub fn write(args: &AutoscaleArgs, phases: &[Phase], runs: &[SignalRun]) -> anyhow::Result<()> {
    let rows: Vec<Row> = runs.iter().map(|r| row(r, phases, args.target)).collect();
    let md = table(&rows);
    println!("{md}");
    let out = &args.out;
    std::fs::write(out.join("table.md"), &md).context("writing table.md")?;
    let summary = serde_json::json!({ "args": args, "phases": phases, "rows": rows, "runs": runs });
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_vec_pretty(&summary)?,
    )
    .context("writing summary.json")?;
    let end = profile::total(phases);
    let mut windows = Vec::new();
    let mut t = 0.0;
    for p in phases {
        windows.push(PhaseWindow {
            name: p.name.to_string(),
            arrivals: String::new(),
            start_s: t,
            end_s: t + p.seconds,
            held_back: 0,
            hold_max_seconds: 0.0,
        });
        t += p.seconds;
    }
    let samples: Vec<f64> = (0..=(end / STEP_S) as usize)
        .map(|i| i as f64 * STEP_S)
        .collect();
    let load: Vec<(f64, f64)> = samples
        .iter()
        .map(|&t| (t, profile::rate_at(phases, t)))
        .collect();
    let replicas: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| (r.signal.as_str().to_string(), step_line(&r.replicas)))
        .collect();
    let attainment: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let pts = samples
                .iter()
                .filter_map(|&t| Some((t, profile::attainment_at(&r.done, t, WINDOW_S)?)))
                .collect();
            (r.signal.as_str().to_string(), pts)
        })
        .collect();
    let mut target_line = vec![(0.0, args.target), (end, args.target)];
    if attainment.is_empty() {
        target_line.clear();
    }
    let mut att = vec![("target".to_string(), target_line)];
    att.extend(attainment);
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>goodput-loadtest autoscale</title>\
         <style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:4px 8px}</style></head><body>\
         <h1>Autoscaling on each signal, same seeded load</h1>",
    );
    let _ = write!(
        html,
        "<p>Time in model seconds (the run is compressed {}x). Load in requests per second of the run.</p>",
        args.compress
    );
    html.push_str(&charts::time_series(
        "Offered load",
        "requests/s",
        &windows,
        end,
        &[("load".into(), load)],
    ));
    html.push_str(&charts::time_series(
        "Replicas (asked for, starting included)",
        "replicas",
        &windows,
        end,
        &replicas,
    ));
    html.push_str(&charts::time_series(
        "SLO attainment over 30 s (client side)",
        "share good",
        &windows,
        end,
        &att,
    ));
    html.push_str("<table><tr><th>signal</th><th>metric</th><th>target</th><th>goodput ratio</th><th>ramp good</th><th>ramp lowest</th><th>spike misses</th><th>back after spike (s)</th><th>replica-seconds</th><th>peak</th><th>changes on plateau</th></tr>");
    for r in &rows {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{}</td></tr>",
            esc(r.signal),
            esc(r.metric),
            fmt_target(r.target),
            pct(r.goodput_ratio),
            pct(r.ramp_good),
            pct(r.ramp_lowest),
            r.spike_misses,
            r.recovery_s.map_or("-".into(), |s| format!("{s:.0}")),
            r.replica_seconds,
            r.peak_replicas,
            r.hold_changes
        );
    }
    html.push_str("</table></body></html>\n");
    std::fs::write(out.join("report.html"), html).context("writing report.html")?;
    eprintln!("autoscale: wrote {}", out.display());
    Ok(())
}
