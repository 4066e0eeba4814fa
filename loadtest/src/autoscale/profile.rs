//! The load of the autoscaling proof and what is read from a run: pure (seconds in, figures
//! out). Times are in the model's seconds (see `mod.rs` on time compression).

use goodput_measure::slo::SloVerdict;
use serde::Serialize;

use crate::schedule::{open_offsets, phase_seed, Arrivals};

/// One stretch of the load: its rate moves linearly from `from` to `to` requests per second.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub seconds: f64,
    pub from: f64,
    pub to: f64,
}

/// A burst, then ramp up, hold, spike, hold again, fall: `burst` requests/s for the opening
/// minute (past what the first replica carries: where the proxy first sees the limit),
/// `hold` at the plateau, `spike` x that during the spike.
pub fn phases(base: f64, burst: f64, hold: f64, spike: f64) -> Vec<Phase> {
    let p = |name, minutes: f64, from, to| Phase {
        name,
        seconds: minutes * 60.0,
        from,
        to,
    };
    vec![
        p("warm", 1.0, base, base),
        p("burst", 1.0, burst, burst),
        p("calm", 2.0, base, base),
        p("ramp", 4.0, base, hold),
        p("hold", 10.0, hold, hold),
        p("spike", 1.0, hold * spike, hold * spike),
        p("after", 2.0, hold, hold),
        p("fall", 2.0, hold, base),
    ]
}

/// (start, end) of the phase named `name`, in seconds from the start.
pub fn window(phases: &[Phase], name: &str) -> Option<(f64, f64)> {
    let mut t = 0.0;
    for p in phases {
        if p.name == name {
            return Some((t, t + p.seconds));
        }
        t += p.seconds;
    }
    None
}

pub fn total(phases: &[Phase]) -> f64 {
    phases.iter().map(|p| p.seconds).sum()
}

/// The offered rate at `t`.
pub fn rate_at(phases: &[Phase], t: f64) -> f64 {
    let mut start = 0.0;
    for p in phases {
        if t < start + p.seconds {
            return p.from + (p.to - p.from) * (t - start) / p.seconds;
        }
        start += p.seconds;
    }
    phases.last().map_or(0.0, |p| p.to)
}

/// Poisson arrival times (seconds from the start), seeded: the same for every signal.
pub fn arrivals(phases: &[Phase], seed: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut start = 0.0;
    for (i, p) in phases.iter().enumerate() {
        let a = Arrivals::Ramp {
            from: p.from.max(1e-6),
            to: p.to.max(1e-6),
        };
        let d = std::time::Duration::from_secs_f64(p.seconds);
        out.extend(
            open_offsets(&a, Some(d), None, phase_seed(seed, i))
                .into_iter()
                .map(|o| start + o.as_secs_f64()),
        );
        start += p.seconds;
    }
    out
}

/// One request as the client saw it: when it arrived and finished (model seconds), whether
/// it met every SLO, and if not, the first thing that failed.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Done {
    pub start: f64,
    pub end: f64,
    pub good: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub miss: Option<Miss>,
    /// Time to first token in the run's (real) milliseconds, when a token came.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
}

/// Why a request was not good: the first of these that holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Miss {
    /// Not a success (an engine's or the proxy's rejection, an error, a timeout).
    Failed,
    Ttft,
    Tpot,
    E2e,
    /// Another SLO (stalls, tool calls).
    Other,
}

impl Miss {
    /// Why a request that did (`success`) or did not succeed, judged `v`, was not good;
    /// `None` when it was.
    pub fn of(success: bool, v: &SloVerdict) -> Option<Miss> {
        if success && v.good {
            return None;
        }
        let failed = |ok: Option<bool>| ok == Some(false);
        Some(if !success {
            Miss::Failed
        } else if failed(v.ttft_ok) {
            Miss::Ttft
        } else if failed(v.tpot_ok) {
            Miss::Tpot
        } else if failed(v.e2e_ok) {
            Miss::E2e
        } else {
            Miss::Other
        })
    }
}

/// Share of requests finished in `(t - window, t]` that were good; `None` when none finished.
pub fn attainment_at(done: &[Done], t: f64, window: f64) -> Option<f64> {
    let (g, n) = done
        .iter()
        .filter(|d| d.end > t - window && d.end <= t)
        .fold((0u64, 0u64), |(g, n), d| (g + u64::from(d.good), n + 1));
    (n > 0).then(|| g as f64 / n as f64)
}

/// Replica count over time: `(t, replicas)` steps, the count holding until the next step.
pub fn replica_seconds(steps: &[(f64, usize)], end: f64) -> f64 {
    steps
        .iter()
        .enumerate()
        .map(|(i, &(t, n))| {
            let next = steps.get(i + 1).map_or(end, |s| s.0).min(end);
            (next - t).max(0.0) * n as f64
        })
        .sum()
}

/// Changes of the replica count inside `[from, to)`.
pub fn changes(steps: &[(f64, usize)], from: f64, to: f64) -> usize {
    steps
        .windows(2)
        .filter(|w| w[1].0 >= from && w[1].0 < to && w[1].1 != w[0].1)
        .count()
}

/// Seconds from `from` until the attainment over `window` is back at `target` and stays
/// there until `until` (sampled every `step`); 0 when it never fell; `None` when it never
/// came back.
pub fn recovery(
    done: &[Done],
    from: f64,
    until: f64,
    window: f64,
    step: f64,
    target: f64,
) -> Option<f64> {
    let mut last_bad: Option<f64> = None;
    let mut t = from;
    while t <= until {
        if attainment_at(done, t, window).is_some_and(|a| a < target) {
            last_bad = Some(t);
        }
        t += step;
    }
    match last_bad {
        None => Some(0.0),
        Some(b) if b + step <= until => Some(b + step - from),
        Some(_) => None,
    }
}

/// Lowest attainment over `window`, sampled every `step` in `[from, to]`.
pub fn lowest(done: &[Done], from: f64, to: f64, window: f64, step: f64) -> Option<f64> {
    let mut low: Option<f64> = None;
    let mut t = from;
    while t <= to {
        if let Some(a) = attainment_at(done, t, window) {
            low = Some(low.map_or(a, |l: f64| l.min(a)));
        }
        t += step;
    }
    low
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(start: f64, end: f64, good: bool) -> Done {
        Done {
            start,
            end,
            good,
            miss: (!good).then_some(Miss::Ttft),
            ttft_ms: None,
        }
    }

    #[test]
    fn the_profile_and_its_windows() {
        let ph = phases(2.0, 8.0, 10.0, 1.5);
        assert_eq!(total(&ph), 23.0 * 60.0);
        assert_eq!(window(&ph, "spike"), Some((1080.0, 1140.0)));
        assert_eq!(rate_at(&ph, 30.0), 2.0);
        assert_eq!(rate_at(&ph, 90.0), 8.0);
        assert_eq!(rate_at(&ph, 240.0 + 120.0), 6.0);
        assert_eq!(rate_at(&ph, 1110.0), 15.0);
        // Same seed, same arrivals; about the integral of the rate.
        let a = arrivals(&ph, 7);
        assert_eq!(a, arrivals(&ph, 7));
        let want = 2.0 * 60.0
            + 8.0 * 60.0
            + 2.0 * 120.0
            + 6.0 * 240.0
            + 10.0 * 600.0
            + 15.0 * 60.0
            + 10.0 * 120.0
            + 6.0 * 120.0;
        assert!(
            (a.len() as f64 - want).abs() < 4.0 * want.sqrt(),
            "{} vs {want}",
            a.len()
        );
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn why_a_request_missed() {
        let ok = SloVerdict {
            ttft_ok: Some(true),
            tpot_ok: Some(true),
            e2e_ok: Some(true),
            good: true,
            ..SloVerdict::default()
        };
        let late = SloVerdict {
            ttft_ok: Some(false),
            e2e_ok: Some(false),
            good: false,
            ..ok
        };
        let slow = SloVerdict {
            tpot_ok: Some(false),
            good: false,
            ..ok
        };
        let stalled = SloVerdict {
            stall_ok: Some(false),
            good: false,
            ..ok
        };
        assert_eq!(Miss::of(true, &ok), None);
        assert_eq!(Miss::of(false, &ok), Some(Miss::Failed));
        assert_eq!(Miss::of(true, &late), Some(Miss::Ttft));
        assert_eq!(Miss::of(true, &slow), Some(Miss::Tpot));
        assert_eq!(Miss::of(true, &stalled), Some(Miss::Other));
    }

    #[test]
    fn replica_seconds_and_changes() {
        let steps = [(0.0, 1), (10.0, 3), (20.0, 2), (25.0, 2)];
        assert_eq!(replica_seconds(&steps, 30.0), 10.0 + 30.0 + 20.0);
        assert_eq!(changes(&steps, 0.0, 30.0), 2);
        assert_eq!(changes(&steps, 15.0, 30.0), 1);
    }

    #[test]
    fn recovery_and_lowest() {
        // Bad from 10 to 20, good again after.
        let done: Vec<Done> = (0..40)
            .map(|i| d(i as f64 - 1.0, i as f64, !(10..20).contains(&i)))
            .collect();
        assert_eq!(attainment_at(&done, 5.0, 5.0), Some(1.0));
        assert_eq!(lowest(&done, 0.0, 39.0, 1.0, 1.0), Some(0.0));
        // Window 1: the last bad sample is at 19, back at 20.
        assert_eq!(recovery(&done, 5.0, 39.0, 1.0, 1.0, 0.95), Some(15.0));
        assert_eq!(recovery(&done, 25.0, 39.0, 1.0, 1.0, 0.95), Some(0.0));
        assert_eq!(recovery(&done, 5.0, 19.0, 1.0, 1.0, 0.95), None);
    }
}
