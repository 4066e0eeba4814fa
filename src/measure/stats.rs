//! Exact statistics over raw values (shared by `/stats` and the load generator's report).
//!
//! Percentiles use the nearest-rank method: the q-quantile of n sorted values is the value at
//! rank `ceil(q * n)` (1-based, at least 1). It always returns an observed value.

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

/// Nearest-rank percentile of already sorted values, `q` in [0, 1] (clamped). NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let n = sorted.len();
    let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
    // The epsilon keeps 0.9 * 10 = 9.000000000000002 at rank 9.
    let rank = (q * n as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let cases = [
            (0.0, 1.0),
            (0.01, 1.0),
            (0.5, 50.0),
            (0.9, 90.0),
            (0.95, 95.0),
            (0.99, 99.0),
            (0.999, 100.0),
            (1.0, 100.0),
        ];
        for (q, want) in cases {
            assert_eq!(percentile(&v, q), want, "q={q}");
        }
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 0.9), 9.0, "0.9 * 10 is rank 9, not 10");
        assert_eq!(percentile(&ten, 0.5), 5.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn summary_sorts_and_is_exact() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        let s = summarize(&mut v).unwrap();
        assert_eq!(s.count, 5);
        assert_eq!((s.mean, s.p50, s.p90, s.max), (3.0, 3.0, 5.0, 5.0));
        assert_eq!(v, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!(summarize(&mut []).is_none());
    }
}
