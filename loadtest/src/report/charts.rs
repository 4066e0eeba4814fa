//! The report's charts as inline SVG strings (plotters, SVG backend; no fonts, no files).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::summary::PhaseWindow;
use crate::record::RequestRecord;

/// Points of one line series.
pub type Line = Vec<(f64, f64)>;

type Res = Result<(), Box<dyn std::error::Error>>;

const W: u32 = 600;
const H: u32 = 320;

/// Distinct, print-friendly colours for phases (and series).
pub fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

fn svg(draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Res) -> String {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (W, H)).into_drawing_area();
        let ok = root.fill(&WHITE).is_ok() && draw(&root).is_ok() && root.present().is_ok();
        if !ok {
            drop(root);
            return "<p>(chart could not be drawn)</p>".into();
        }
    }
    buf
}

/// Empirical CDF of one latency per phase, x clipped at the largest p99.9 so tails stay readable.
pub fn cdf(title: &str, per_phase: &[(String, Vec<f64>)]) -> String {
    let mut sorted: Vec<(String, Vec<f64>)> = per_phase
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(n, v)| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            (n.clone(), v)
        })
        .collect();
    if sorted.is_empty() {
        return format!("<p class=\"empty\">{title}: no values</p>");
    }
    let xmax = sorted
        .iter()
        .map(|(_, v)| v[((v.len() as f64 * 0.999).ceil() as usize).clamp(1, v.len()) - 1])
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.05;
    let (unit, scale) = if xmax < 2.0 {
        ("ms", 1000.0)
    } else {
        ("s", 1.0)
    };
    // Phases that differ by orders of magnitude (overload vs idle) get a log x axis, drawn as
    // log10 on a linear axis with the labels mapped back.
    let xmin_pos = sorted
        .iter()
        .map(|(_, v)| v[0])
        .filter(|x| *x > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log = xmin_pos.is_finite() && xmax / xmin_pos > 30.0;
    let lo = if log {
        (xmin_pos * scale).log10().floor()
    } else {
        0.0
    };
    let fx = move |x: f64| {
        if log {
            (x * scale).max(10f64.powf(lo)).log10()
        } else {
            x * scale
        }
    };
    let (x0, x1) = (if log { lo } else { 0.0 }, fx(xmax));
    let unit = if log {
        format!("{unit} (log scale)")
    } else {
        unit.to_string()
    };
    svg(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(x0..x1, 0f64..1.0)?;
        let label = |v: &f64| {
            let x = if log { 10f64.powf(*v) } else { *v };
            if x >= 100.0 {
                format!("{x:.0}")
            } else if x >= 1.0 {
                format!("{x:.1}")
            } else {
                format!("{x:.2}")
            }
        };
        chart
            .configure_mesh()
            .x_desc(unit.as_str())
            .y_desc("fraction ≤ x")
            .x_label_formatter(&label)
            .draw()?;
        for (i, (name, v)) in sorted.iter_mut().enumerate() {
            let n = v.len();
            let step = (n / 400).max(1);
            let mut pts: Vec<(f64, f64)> = vec![(fx(v[0]), 0.0)];
            pts.extend(
                (0..n)
                    .step_by(step)
                    .chain([n - 1])
                    .map(|k| (fx(v[k].min(xmax)), (k + 1) as f64 / n as f64)),
            );
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
                .label(format!("{name} (n={n})"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()?;
        Ok(())
    })
}

/// One time-series chart: several named lines over run time, phases shaded behind them.
/// All time series share the x range `[0, total_s]` so they line up on the page.
pub fn time_series(
    title: &str,
    y_desc: &str,
    windows: &[PhaseWindow],
    total_s: f64,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let tmax = windows
        .last()
        .map_or(total_s, |w| w.end_s.max(total_s))
        .max(
            series
                .iter()
                .flat_map(|(_, p)| p.iter().map(|q| q.0))
                .fold(0.0, f64::max),
        );
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.15;
    svg(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..tmax.max(1e-3), 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("run time (s)")
            .y_desc(y_desc)
            .draw()?;
        for (i, w) in windows.iter().enumerate() {
            let c = color(i);
            chart.draw_series([Rectangle::new(
                [(w.start_s, 0.0), (w.end_s, ymax)],
                c.mix(0.10).filled(),
            )])?;
            chart.draw_series([Text::new(
                w.name.clone(),
                (w.start_s, ymax * 0.97),
                ("sans-serif", 12).into_font().color(&c),
            )])?;
        }
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = if i == 0 { BLACK } else { color(i + 2) };
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
        }
        if series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .draw()?;
        }
        Ok(())
    })
}

/// Horizontal stacked bars: one bar per phase (first phase on top), one segment per outcome;
/// the legend sits in its own column so it never hides a bar.
pub fn outcomes(phases: &[(String, Vec<(String, u64)>)], outcome_names: &[String]) -> String {
    let n = phases.len().max(1);
    let xmax = phases
        .iter()
        .map(|(_, o)| o.iter().map(|x| x.1).sum::<u64>())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.02;
    let names: Vec<String> = phases.iter().map(|p| p.0.clone()).collect();
    // Row of phase `pi`, counted from the bottom.
    let row = |pi: usize| (n - 1 - pi) as f64;
    svg(|root| {
        let (left, right) = root.split_horizontally(W - 120);
        let mut chart = ChartBuilder::on(&left)
            .caption("Outcomes per phase", ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..xmax, 0f64..n as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n * 2 + 1)
            .y_label_formatter(&|y| {
                let k = *y - 0.5;
                if (k - k.round()).abs() < 1e-6 && k >= 0.0 && (k.round() as usize) < n {
                    names
                        .get(n - 1 - k.round() as usize)
                        .cloned()
                        .unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_desc("requests")
            .draw()?;
        for (oi, oname) in outcome_names.iter().enumerate() {
            let c = outcome_color(oname, oi);
            let mut rects = Vec::new();
            for (pi, (_, counts)) in phases.iter().enumerate() {
                let count_of = |o: &String| counts.iter().find(|x| &x.0 == o).map_or(0, |x| x.1);
                let before: u64 = outcome_names[..oi].iter().map(count_of).sum();
                let mine = count_of(oname);
                if mine > 0 {
                    let y = row(pi);
                    rects.push(Rectangle::new(
                        [(before as f64, y + 0.2), ((before + mine) as f64, y + 0.8)],
                        c.filled(),
                    ));
                }
            }
            chart.draw_series(rects)?;
            let y = 50 + oi as i32 * 20;
            right.draw(&Rectangle::new([(4, y - 6), (16, y + 6)], c.filled()))?;
            right.draw(&Text::new(oname.clone(), (22, y - 6), ("sans-serif", 12)))?;
        }
        Ok(())
    })
}

fn outcome_color(name: &str, i: usize) -> RGBColor {
    match name {
        "success" => RGBColor(44, 160, 44),
        "truncated" => RGBColor(255, 127, 14),
        "upstream_error" => RGBColor(214, 39, 40),
        "timeout" => RGBColor(148, 103, 189),
        "client_abort" => RGBColor(127, 127, 127),
        "rejected" => RGBColor(140, 86, 75),
        _ => color(i + 4),
    }
}

/// Bin width for time series: about 100 bins, never below 100 ms.
pub fn bin_width(total_s: f64) -> f64 {
    (total_s / 100.0).max(0.1)
}

/// Completed and good requests per second, per bin of end time.
pub fn throughput(records: &[RequestRecord], total_s: f64) -> (Line, Line) {
    let w = bin_width(total_s);
    let nb = ((total_s / w).ceil() as usize).max(1);
    let (mut done, mut good) = (vec![0u64; nb], vec![0u64; nb]);
    for r in records {
        let b = ((r.end_s() / w) as usize).min(nb - 1);
        done[b] += 1;
        good[b] += r.good as u64;
    }
    let pts = |v: &[u64]| {
        v.iter()
            .enumerate()
            .map(|(i, c)| {
                // The last bin may be shorter than the others: divide by its real width.
                let (a, b) = (i as f64 * w, ((i + 1) as f64 * w).min(total_s.max(w)));
                ((a + b) / 2.0, *c as f64 / (b - a).max(1e-3))
            })
            .collect()
    };
    (pts(&done), pts(&good))
}

/// p50 and p99 of TTFT (ms) for requests started in each bin (bins without TTFTs are skipped).
pub fn ttft_series(records: &[RequestRecord], total_s: f64) -> (Line, Line) {
    let w = bin_width(total_s);
    let nb = ((total_s / w).ceil() as usize).max(1);
    let mut bins: Vec<Vec<f64>> = vec![Vec::new(); nb];
    for r in records {
        if let Some(t) = r.ttft_seconds {
            bins[((r.start_s / w) as usize).min(nb - 1)].push(t * 1000.0);
        }
    }
    let (mut p50, mut p99) = (Vec::new(), Vec::new());
    for (i, mut b) in bins.into_iter().enumerate() {
        if let Some(s) = goodput_measure::stats::summarize(&mut b) {
            let x = ((i as f64 + 0.5) * w).min(total_s);
            p50.push((x, s.p50));
            p99.push((x, s.p99));
        }
    }
    (p50, p99)
}

/// In-flight step line from the exact steps.
pub fn in_flight_line(steps: &[(f64, u64)]) -> Vec<(f64, f64)> {
    let mut pts = Vec::with_capacity(steps.len() * 2 + 1);
    let mut prev = 0.0;
    pts.push((0.0, 0.0));
    for &(t, n) in steps {
        pts.push((t, prev));
        pts.push((t, n as f64));
        prev = n as f64;
    }
    // Thin very long runs: keep the shape, bound the SVG size.
    if pts.len() > 6000 {
        let step = pts.len() / 3000;
        pts = pts.into_iter().step_by(step).collect();
    }
    pts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample as rec;

    #[test]
    fn throughput_counts_every_request_once_at_its_rate() {
        // 50 requests ending evenly over 5 s: 10/s in every bin, none lost at the edges.
        let recs: Vec<RequestRecord> = (0..50)
            .map(|k| rec("p", k as f64 * 0.1, 0.05, None, "success"))
            .collect();
        let total = 5.0;
        let (done, good) = throughput(&recs, total);
        let w = bin_width(total);
        let width = |i: usize| ((i + 1) as f64 * w).min(total) - i as f64 * w;
        let sum: f64 = done.iter().enumerate().map(|(i, p)| p.1 * width(i)).sum();
        assert!((sum - 50.0).abs() < 1e-6, "{sum}");
        assert!(done.iter().all(|p| p.0 <= total));
        assert_eq!(done, good);
    }
}
