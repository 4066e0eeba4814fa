//! What each replica's clients got lately, from the proxy's own records: SLO attainment, TTFT
//! and TPOT as exponentially weighted means (each finished request moves them by
//! [`ALPHA`] of the way: about the last 20 requests count). Lock-free; two records finishing
//! at the same instant may lose one update, which a moving mean tolerates.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Weight of the newest request in each mean.
pub const ALPHA: f64 = 0.05;

#[derive(Debug)]
pub struct ReplicaStats {
    /// Share of recent requests that were good (met every SLO), 0..1; starts at 1.
    attainment: AtomicU64,
    /// Mean TTFT and TPOT, seconds (NaN until the first observation).
    ttft: AtomicU64,
    tpot: AtomicU64,
    observed: AtomicU64,
}

impl Default for ReplicaStats {
    fn default() -> Self {
        ReplicaStats {
            attainment: AtomicU64::new(1f64.to_bits()),
            ttft: AtomicU64::new(f64::NAN.to_bits()),
            tpot: AtomicU64::new(f64::NAN.to_bits()),
            observed: AtomicU64::new(0),
        }
    }
}

fn ewma(cell: &AtomicU64, x: f64) {
    let old = f64::from_bits(cell.load(Relaxed));
    let new = if old.is_nan() {
        x
    } else {
        old + ALPHA * (x - old)
    };
    cell.store(new.to_bits(), Relaxed);
}

impl ReplicaStats {
    /// One finished request served there (requests the client rejected are not passed in).
    pub fn observe(&self, good: bool, ttft_s: Option<f64>, tpot_s: Option<f64>) {
        ewma(&self.attainment, if good { 1.0 } else { 0.0 });
        if let Some(t) = ttft_s.filter(|t| t.is_finite()) {
            ewma(&self.ttft, t);
        }
        if let Some(t) = tpot_s.filter(|t| t.is_finite()) {
            ewma(&self.tpot, t);
        }
        self.observed.fetch_add(1, Relaxed);
    }

    pub fn attainment(&self) -> f64 {
        f64::from_bits(self.attainment.load(Relaxed))
    }

    /// Mean TTFT and TPOT (seconds), `None` before the first.
    pub fn ttft(&self) -> Option<f64> {
        Some(f64::from_bits(self.ttft.load(Relaxed))).filter(|v| !v.is_nan())
    }

    pub fn tpot(&self) -> Option<f64> {
        Some(f64::from_bits(self.tpot.load(Relaxed))).filter(|v| !v.is_nan())
    }

    pub fn observed(&self) -> u64 {
        self.observed.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attainment_follows_recent_requests_and_recovers() {
        let s = ReplicaStats::default();
        assert_eq!(s.attainment(), 1.0);
        assert_eq!((s.ttft(), s.tpot()), (None, None));
        for _ in 0..60 {
            s.observe(false, Some(3.0), None);
        }
        assert!(s.attainment() < 0.05, "{}", s.attainment());
        assert!((s.ttft().unwrap() - 3.0).abs() < 1e-9);
        for _ in 0..60 {
            s.observe(true, Some(0.1), Some(0.02));
        }
        assert!(s.attainment() > 0.95, "{}", s.attainment());
        assert!(s.ttft().unwrap() < 0.3);
        assert_eq!(s.tpot(), Some(0.02));
        assert_eq!(s.observed(), 120);
    }
}
