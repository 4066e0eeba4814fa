//! Exact statistics over raw values (shared by `/stats` and the load generator's report).
//!
//! Percentiles use linear interpolation between closest ranks, numpy's default (and so what
//! `vllm bench serve` reports): for sorted `x[0..n)` and `h = (n - 1) * q`,
//! `p(q) = x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])` (DESIGN.md). This is
//! the one implementation: `/stats`, the load generator's summaries and reports, and `compare`
//! all call [`percentile`].

use serde::{Deserialize, Serialize};

/// Exact statistics of one quantity; the load generator's `summary.json` reads them back.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Summary {
    /// Summarizes owned values; `None` when there are none.
    pub fn of(mut values: Vec<f64>) -> Option<Summary> {
        summarize(&mut values)
    }
}

/// Sorts `values` in place and summarizes them; `None` when empty. NaNs sort last.
pub fn summarize(values: &mut [f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    let sum: f64 = values.iter().sum();
    Some(Summary {
        count: values.len() as u64,
        mean: sum / values.len() as f64,
        p50: percentile(values, 0.50),
        p90: percentile(values, 0.90),
        p95: percentile(values, 0.95),
        p99: percentile(values, 0.99),
        p999: percentile(values, 0.999),
        max: values[values.len() - 1],
    })
}

/// Percentile of already sorted values by linear interpolation (numpy's default), `q` in
/// [0, 1] (clamped; NaN reads as 0). NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return f64::NAN;
    };
    let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
    let h = last as f64 * q;
    let lo = (h.floor() as usize).min(last);
    let hi = (lo + 1).min(last);
    let frac = h - lo as f64;
    // numpy's `_lerp`: exact at both ends, so p(1) is the maximum and p(0) the minimum.
    let (a, b) = (sorted[lo], sorted[hi]);
    if frac >= 0.5 {
        b - (b - a) * (1.0 - frac)
    } else {
        a + (b - a) * frac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values computed with numpy 2 (`np.percentile(values, q * 100)`, the default
    /// "linear" method), printed with `repr(float(...))`.
    #[test]
    fn matches_numpy_linear_interpolation() {
        let qs = [0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0];
        let squares: Vec<f64> = (0..37).map(|i| 0.1 * f64::from(i * i)).collect();
        let cases: Vec<(Vec<f64>, [f64; 8])> = vec![
            (
                (1..=100).map(f64::from).collect(),
                [
                    1.0,
                    1.99,
                    50.5,
                    90.10000000000001,
                    95.05,
                    99.01,
                    99.90100000000001,
                    100.0,
                ],
            ),
            (
                (1..=10).map(f64::from).collect(),
                [
                    1.0,
                    1.09,
                    5.5,
                    9.1,
                    9.549999999999999,
                    9.91,
                    9.991000000000001,
                    10.0,
                ],
            ),
            (vec![7.0], [7.0; 8]),
            (
                vec![1.0, 2.0],
                [1.0, 1.01, 1.5, 1.9, 1.95, 1.99, 1.999, 2.0],
            ),
            (
                vec![1.25, 2.0, 3.5, 7.75, 9.0],
                [1.25, 1.28, 3.5, 8.5, 8.75, 8.95, 8.995000000000001, 9.0],
            ),
            (
                squares,
                [
                    0.0,
                    0.036,
                    32.4,
                    105.0,
                    116.97999999999998,
                    127.044,
                    129.34440000000004,
                    129.6,
                ],
            ),
        ];
        for (values, want) in cases {
            for (q, w) in qs.iter().zip(want) {
                let got = percentile(&values, *q);
                assert!(
                    (got - w).abs() <= 1e-12 * w.abs().max(1.0),
                    "n={} q={q}: got {got}, numpy {w}",
                    values.len()
                );
            }
        }
        assert!(percentile(&[], 0.5).is_nan());
        assert_eq!(percentile(&[1.0, 2.0], f64::NAN), 1.0);
        assert_eq!(percentile(&[1.0, 2.0], 7.0), 2.0, "q is clamped");
    }

    #[test]
    fn summary_sorts_and_is_exact() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        let s = summarize(&mut v).unwrap();
        assert_eq!(s.count, 5);
        assert_eq!((s.mean, s.p50, s.max), (3.0, 3.0, 5.0));
        assert!((s.p90 - 4.6).abs() < 1e-12, "numpy: 4.6, got {}", s.p90);
        assert_eq!(v, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!(summarize(&mut []).is_none());
    }
}
