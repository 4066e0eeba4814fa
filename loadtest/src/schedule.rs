//! Arrival schedules: pure and seeded. Open-loop phases get their send offsets computed up front
//! from the phase's arrival process, so the runner never waits for a response before sending the
//! next request (no coordinated omission). Closed-loop (`concurrency`) phases are driven by
//! workers instead and have no precomputed offsets.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp1};
use serde::Deserialize;

/// How requests arrive within a phase.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Arrivals {
    /// Poisson process: exponential gaps with mean `1/rate` (requests per second).
    Poisson { rate: f64 },
    /// Evenly spaced arrivals, `rate` per second, the first at the phase start.
    Constant { rate: f64 },
    /// Closed loop: `n` workers each send the next request when the previous one ends.
    Concurrency { n: usize },
    /// Poisson arrivals whose rate moves linearly from `from` to `to` over the phase duration.
    Ramp { from: f64, to: f64 },
}

impl Arrivals {
    /// Checks values; returns `(field, reason)` naming the offending key under `prefix`.
    pub fn validate(&self, prefix: &str, has_duration: bool) -> Result<(), (String, String)> {
        let rate_ok = |r: f64| r > 0.0 && r.is_finite();
        match *self {
            Arrivals::Poisson { rate } if !rate_ok(rate) => {
                Err((format!("{prefix}.poisson.rate"), "must be > 0".into()))
            }
            Arrivals::Constant { rate } if !rate_ok(rate) => {
                Err((format!("{prefix}.constant.rate"), "must be > 0".into()))
            }
            Arrivals::Concurrency { n: 0 } => {
                Err((format!("{prefix}.concurrency.n"), "must be >= 1".into()))
            }
            Arrivals::Ramp { from, to } => {
                if !(from >= 0.0
                    && to >= 0.0
                    && from.is_finite()
                    && to.is_finite()
                    && from + to > 0.0)
                {
                    Err((
                        format!("{prefix}.ramp"),
                        "needs from, to >= 0 and not both 0".into(),
                    ))
                } else if !has_duration {
                    Err((
                        format!("{prefix}.ramp"),
                        "a ramp needs the phase's duration_s".into(),
                    ))
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    pub fn is_open_loop(&self) -> bool {
        !matches!(self, Arrivals::Concurrency { .. })
    }

    /// Short label for reports, e.g. `poisson(5/s)`.
    pub fn label(&self) -> String {
        match *self {
            Arrivals::Poisson { rate } => format!("poisson({rate}/s)"),
            Arrivals::Constant { rate } => format!("constant({rate}/s)"),
            Arrivals::Concurrency { n } => format!("concurrency({n})"),
            Arrivals::Ramp { from, to } => format!("ramp({from}->{to}/s)"),
        }
    }
}

/// Seed for phase `index`: phases get independent streams so editing one phase does not shift
/// the arrivals of the others.
pub fn phase_seed(seed: u64, index: usize) -> u64 {
    // splitmix64 step: decorrelates consecutive indices.
    let mut z = seed
        ^ (index as u64)
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Send offsets (from the phase start) of an open-loop phase, ascending. Stops at `duration`
/// (exclusive) or after `requests` arrivals, whichever comes first; at least one must be set.
/// Closed-loop arrivals return an empty plan.
pub fn open_offsets(
    arrivals: &Arrivals,
    duration: Option<Duration>,
    requests: Option<u64>,
    seed: u64,
) -> Vec<Duration> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let end = duration.map(|d| d.as_secs_f64()).unwrap_or(f64::INFINITY);
    let max = requests.unwrap_or(u64::MAX);
    if end.is_infinite() && max == u64::MAX {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(requests.unwrap_or(0).min(1 << 20) as usize);
    // `cum` walks the cumulative intensity; `t_of` maps it back to time (inversion method).
    let mut cum = 0.0f64;
    let mut k: u64 = 0;
    while k < max {
        let t = match *arrivals {
            Arrivals::Poisson { rate } => {
                cum += Distribution::<f64>::sample(&Exp1, &mut rng);
                cum / rate
            }
            Arrivals::Constant { rate } => k as f64 / rate,
            Arrivals::Ramp { from, to } => {
                cum += Distribution::<f64>::sample(&Exp1, &mut rng);
                ramp_time(from, to, end, cum)
            }
            Arrivals::Concurrency { .. } => return Vec::new(),
        };
        // `t` may be +inf (a falling ramp that runs dry): stop there too.
        if t.is_nan() || t >= end {
            break;
        }
        out.push(Duration::from_secs_f64(t));
        k += 1;
    }
    out
}

/// Time at which the cumulative intensity of a linear ramp over `[0, d]` reaches `s`:
/// solves `from*t + (to-from)/(2d) * t^2 = s`.
fn ramp_time(from: f64, to: f64, d: f64, s: f64) -> f64 {
    let a = (to - from) / (2.0 * d);
    if a.abs() < 1e-12 {
        return s / from;
    }
    let disc = from * from + 4.0 * a * s;
    if disc < 0.0 {
        // A falling ramp whose remaining intensity never reaches `s`.
        return f64::INFINITY;
    }
    (-from + disc.sqrt()) / (2.0 * a)
}

/// A uniform draw in `[0, 1)`, used by request mixing with the same seeded generator type.
pub fn unit(rng: &mut SmallRng) -> f64 {
    rng.random::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(offsets: &[Duration]) -> Vec<f64> {
        offsets
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect()
    }
    fn mean_cv(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_rate_and_spread() {
        for (rate, seed) in [(5.0, 1u64), (100.0, 42), (1000.0, 7)] {
            let offs = open_offsets(&Arrivals::Poisson { rate }, None, Some(20_000), seed);
            assert_eq!(offs.len(), 20_000);
            let (mean, cv) = mean_cv(&gaps(&offs));
            // 20k exponential gaps: standard error of the mean is ~0.7%; allow 3%.
            assert!(
                (mean * rate - 1.0).abs() < 0.03,
                "rate {rate}: mean gap {mean}"
            );
            // Exponential gaps have CV 1.
            assert!((cv - 1.0).abs() < 0.05, "rate {rate}: cv {cv}");
        }
    }

    #[test]
    fn poisson_count_in_a_window_matches_rate() {
        let offs = open_offsets(
            &Arrivals::Poisson { rate: 50.0 },
            Some(Duration::from_secs(200)),
            None,
            3,
        );
        let n = offs.len() as f64;
        // Expected 10_000, sd 100.
        assert!((n - 10_000.0).abs() < 400.0, "{n}");
    }

    #[test]
    fn constant_is_exact_and_has_no_spread() {
        let offs = open_offsets(
            &Arrivals::Constant { rate: 4.0 },
            Some(Duration::from_secs(10)),
            None,
            0,
        );
        assert_eq!(offs.len(), 40);
        assert_eq!(offs[0], Duration::ZERO);
        let (mean, cv) = mean_cv(&gaps(&offs));
        assert!((mean - 0.25).abs() < 1e-9);
        assert!(cv < 1e-6);
    }

    #[test]
    fn same_seed_same_schedule_other_seed_other_schedule() {
        let a = open_offsets(&Arrivals::Poisson { rate: 10.0 }, None, Some(100), 5);
        let b = open_offsets(&Arrivals::Poisson { rate: 10.0 }, None, Some(100), 5);
        let c = open_offsets(&Arrivals::Poisson { rate: 10.0 }, None, Some(100), 6);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(phase_seed(1, 0), phase_seed(1, 1));
    }

    #[test]
    fn phase_boundaries_are_honoured() {
        let d = Duration::from_secs(3);
        for arr in [
            Arrivals::Poisson { rate: 100.0 },
            Arrivals::Constant { rate: 100.0 },
            Arrivals::Ramp {
                from: 10.0,
                to: 200.0,
            },
            Arrivals::Ramp {
                from: 200.0,
                to: 0.0,
            },
        ] {
            let offs = open_offsets(&arr, Some(d), None, 11);
            assert!(!offs.is_empty(), "{arr:?}");
            assert!(
                offs.iter().all(|o| *o < d),
                "{arr:?} sent past the phase end"
            );
            assert!(
                offs.windows(2).all(|w| w[0] <= w[1]),
                "{arr:?} not ascending"
            );
            // Requests cap wins when it comes first.
            let capped = open_offsets(&arr, Some(d), Some(7), 11);
            assert_eq!(capped.len(), 7);
            assert_eq!(&capped[..], &offs[..7]);
        }
        assert!(open_offsets(&Arrivals::Concurrency { n: 3 }, Some(d), None, 1).is_empty());
    }

    #[test]
    fn ramp_follows_its_rate() {
        // 0 -> 100/s over 20 s: expected 1000 arrivals, 3/4 of them in the second half.
        let offs = open_offsets(
            &Arrivals::Ramp {
                from: 0.0,
                to: 100.0,
            },
            Some(Duration::from_secs(20)),
            None,
            9,
        );
        let n = offs.len() as f64;
        assert!((n - 1000.0).abs() < 130.0, "{n}");
        let late = offs.iter().filter(|o| o.as_secs_f64() >= 10.0).count() as f64;
        assert!((late / n - 0.75).abs() < 0.05, "{}", late / n);
    }
}
