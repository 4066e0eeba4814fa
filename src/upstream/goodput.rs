//! What each replica's clients got lately, from the proxy's own records: SLO attainment, TTFT
//! and TPOT as exponentially weighted means. Lock-free; two records finishing at the same
//! instant may lose one update, which a moving mean tolerates.
//!
//! Attainment is the share of recent requests that met every SLO:
//! - each verdict moves it by [`ALPHA`] of the way (about the last 10 requests count), and a
//!   stream is judged as soon as its verdict is known ([`early_verdict`]: a TTFT over its SLO
//!   at the first token, or a decode already slower than its TPOT SLO after
//!   [`EARLY_TOKENS`] tokens), not only at its end: a replica that turned slow is seen after a
//!   few of its streams' first tokens, not after its first streams end;
//! - "recent" is also a matter of time: after [`GRACE`] without a new verdict, what is missing
//!   from 1 fades with time constant [`FORGET`]. A replica the balancer stopped sending to
//!   would otherwise keep its last, low, attainment for as long as it gets no traffic (and
//!   `auto` would never give it its prefixes back); fading, it earns a few requests back after
//!   a few seconds, which re-judge it at once. The grace keeps a replica that is still slow
//!   from leaking back: while it is judged every few seconds (a probe, an exploration) it does
//!   not fade at all.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::LazyLock;
use std::time::Duration;

use goodput_measure::slo::Slo;
use tokio::time::Instant;

/// Weight of the newest verdict in the attainment.
pub const ALPHA: f64 = 0.1;
/// Weight of the newest request in the TTFT and TPOT means.
pub const LATENCY_ALPHA: f64 = 0.05;
/// How long an attainment holds without new verdicts before it starts to fade.
pub const GRACE: Duration = Duration::from_secs(2);
/// Time constant with which a replica's missing attainment fades after [`GRACE`].
pub const FORGET: Duration = Duration::from_secs(3);
/// Output tokens after which a stream's decode speed is judged against its TPOT SLO.
pub const EARLY_TOKENS: u64 = 6;

/// The clock's origin for the stamps kept in atomics.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn nanos(t: Instant) -> u64 {
    t.saturating_duration_since(*EPOCH).as_nanos() as u64
}

#[derive(Debug)]
pub struct ReplicaStats {
    /// Share of recent requests that were good (met every SLO), 0..1, as of `stamp`; starts
    /// at 1.
    attainment: AtomicU64,
    /// When the attainment last moved (nanoseconds since [`EPOCH`]).
    stamp: AtomicU64,
    /// Mean TTFT and TPOT, seconds (NaN until the first observation).
    ttft: AtomicU64,
    tpot: AtomicU64,
    observed: AtomicU64,
}

impl Default for ReplicaStats {
    fn default() -> Self {
        ReplicaStats {
            attainment: AtomicU64::new(1f64.to_bits()),
            stamp: AtomicU64::new(0),
            ttft: AtomicU64::new(f64::NAN.to_bits()),
            tpot: AtomicU64::new(f64::NAN.to_bits()),
            observed: AtomicU64::new(0),
        }
    }
}

fn ewma(cell: &AtomicU64, x: f64, alpha: f64) {
    let old = f64::from_bits(cell.load(Relaxed));
    let new = if old.is_nan() {
        x
    } else {
        old + alpha * (x - old)
    };
    cell.store(new.to_bits(), Relaxed);
}

/// `a`, kept at `from`, seen at `now`: after [`GRACE`], what is missing from 1 fades with
/// [`FORGET`].
fn faded(a: f64, from: u64, now: u64) -> f64 {
    let since = now.saturating_sub(from);
    let grace = GRACE.as_nanos() as u64;
    if a >= 1.0 || since <= grace {
        return a;
    }
    let dt = (since - grace) as f64 / FORGET.as_nanos() as f64;
    1.0 - (1.0 - a) * (-dt).exp()
}

impl ReplicaStats {
    /// A verdict on one request served there (requests the client rejected are not passed
    /// in): good, or not, at `now`.
    pub fn judge(&self, good: bool, now: Instant) {
        let now = nanos(now);
        let a = faded(
            f64::from_bits(self.attainment.load(Relaxed)),
            self.stamp.load(Relaxed),
            now,
        );
        let x = if good { 1.0 } else { 0.0 };
        self.attainment
            .store((a + ALPHA * (x - a)).to_bits(), Relaxed);
        self.stamp.store(now, Relaxed);
    }

    /// One finished request's latencies (judged on its own with [`judge`](Self::judge)).
    pub fn observe(&self, ttft_s: Option<f64>, tpot_s: Option<f64>) {
        if let Some(t) = ttft_s.filter(|t| t.is_finite()) {
            ewma(&self.ttft, t, LATENCY_ALPHA);
        }
        if let Some(t) = tpot_s.filter(|t| t.is_finite()) {
            ewma(&self.tpot, t, LATENCY_ALPHA);
        }
        self.observed.fetch_add(1, Relaxed);
    }

    /// The attainment as of `now`.
    #[inline]
    pub fn attainment(&self, now: Instant) -> f64 {
        let a = f64::from_bits(self.attainment.load(Relaxed));
        if a >= 1.0 {
            return a;
        }
        faded(a, self.stamp.load(Relaxed), nanos(now))
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

/// A stream's progress as its verdict is told early: `first` is the time from the request's
/// dispatch to its first output token; after it, `gaps` of the first output tokens' gaps
/// were counted and `slow` of them were longer than the TPOT SLO (per token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Early {
    pub first: Duration,
    pub gaps: u64,
    pub slow: u64,
}

/// `Some(false)` when what the client got of a stream so far already says it will not be
/// good: its first token came later than the TTFT SLO (final: TTFT does not change), or over
/// its first [`EARLY_TOKENS`] tokens most gaps were slower than the TPOT SLO (the replica
/// decodes too slowly; one long gap, a prefill squeezed between two steps, is not enough).
/// `None`: not known yet; a good verdict waits for the end.
pub fn early_verdict(e: &Early, slo: &Slo) -> Option<bool> {
    if slo.ttft.is_some_and(|l| e.first > l) {
        return Some(false);
    }
    if slo.tpot.is_some() && e.gaps + 1 >= EARLY_TOKENS && e.slow * 2 > e.gaps {
        return Some(false);
    }
    None
}

/// One stream's early judgement, as its output is served (the recorder's body owns it):
/// reports a bad verdict once, the moment [`early_verdict`] knows it.
#[derive(Debug, Clone)]
pub struct Judging {
    slo: Slo,
    /// The request's start (the client's TTFT counts from it).
    t0: Instant,
    first: Option<Duration>,
    /// The last output's time and the tokens served by then.
    last: Instant,
    last_n: u64,
    gaps: u64,
    slow: u64,
    /// Judged, or past the point where an early verdict could come.
    done: bool,
}

impl Judging {
    pub fn new(t0: Instant, slo: Slo) -> Self {
        Judging {
            slo,
            t0,
            first: None,
            last: t0,
            last_n: 0,
            gaps: 0,
            slow: 0,
            done: false,
        }
    }

    /// The client has been served `n` output tokens by `now` (`None`: none yet). `true` the
    /// one time the stream is known not to be good.
    /// Inlined, `done` checked first: past its first few tokens a stream is done with, and
    /// every frame served asks (the call was about 40 instructions a frame).
    #[inline]
    pub fn served(&mut self, now: Instant, n: Option<u64>) -> bool {
        if self.done {
            return false;
        }
        self.judge(now, n)
    }

    /// [`Judging::served`] while an early verdict may still come.
    #[inline(never)]
    fn judge(&mut self, now: Instant, n: Option<u64>) -> bool {
        let Some(n) = n.filter(|&n| n > self.last_n) else {
            return false;
        };
        match self.first {
            None => self.first = Some(now.saturating_duration_since(self.t0)),
            Some(_) => {
                let k = n - self.last_n;
                let per_token = now.saturating_duration_since(self.last) / k as u32;
                self.gaps += k;
                if self.slo.tpot.is_some_and(|l| per_token > l) {
                    self.slow += k;
                }
            }
        }
        self.last = now;
        self.last_n = n;
        let e = Early {
            first: self.first.unwrap_or_default(),
            gaps: self.gaps,
            slow: self.slow,
        };
        let bad = early_verdict(&e, &self.slo) == Some(false);
        self.done = bad || self.gaps + 1 >= EARLY_TOKENS;
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attainment_follows_recent_verdicts_and_fades_back_without_them() {
        let s = ReplicaStats::default();
        let t0 = Instant::now();
        assert_eq!(s.attainment(t0), 1.0);
        assert_eq!((s.ttft(), s.tpot()), (None, None));
        // A replica that turned slow: a few verdicts take it well down.
        for _ in 0..7 {
            s.judge(false, t0);
        }
        assert!(s.attainment(t0) < 0.5, "{}", s.attainment(t0));
        for _ in 0..30 {
            s.judge(false, t0);
            s.observe(Some(3.0), None);
        }
        assert!(s.attainment(t0) < 0.05, "{}", s.attainment(t0));
        assert!((s.ttft().unwrap() - 3.0).abs() < 1e-9);
        // No verdicts since: it holds for GRACE, then what is missing fades with FORGET.
        let at = |forgets: f64| t0 + GRACE + FORGET.mul_f64(forgets);
        let cases: &[(Instant, f64, f64)] = &[
            // (when, at least, at most)
            (t0 + GRACE / 2, 0.0, 0.05),
            (at(0.0), 0.0, 0.05),
            (at(1.0), 0.60, 0.66),
            (at(3.0), 0.94, 0.96),
        ];
        for &(t, lo, hi) in cases {
            let a = s.attainment(t);
            assert!((lo..=hi).contains(&a), "{:?}: {a}", t - t0);
        }
        // A verdict starts from the faded value, and holds it through a new grace.
        s.judge(false, at(3.0));
        let a = s.attainment(at(3.0) + GRACE);
        assert!((0.84..0.87).contains(&a), "{a}");
        // Good requests bring it back.
        for _ in 0..40 {
            s.judge(true, at(3.0));
            s.observe(Some(0.1), Some(0.02));
        }
        assert!(s.attainment(at(3.0)) > 0.99);
        assert!(s.ttft().unwrap() < 0.5);
        assert_eq!(s.tpot(), Some(0.02));
        assert_eq!(s.observed(), 70);
    }

    #[test]
    fn judging_a_stream_as_it_is_served() {
        let ms = Duration::from_millis;
        let slo = Slo {
            ttft: Some(ms(1_000)),
            tpot: Some(ms(20)),
            ..Slo::default()
        };
        let t0 = Instant::now();
        // (events: ms since t0 and tokens served by then; the event at which it is judged bad)
        type Case<'a> = (&'a str, &'a [(u64, u64)], Option<usize>);
        let cases: &[Case] = &[
            (
                "fast replica: no early verdict",
                &[
                    (100, 1),
                    (111, 2),
                    (122, 3),
                    (133, 4),
                    (144, 5),
                    (155, 6),
                    (166, 7),
                ],
                None,
            ),
            (
                "slow decode: bad at the sixth token",
                &[
                    (100, 1),
                    (125, 2),
                    (150, 3),
                    (175, 4),
                    (200, 5),
                    (225, 6),
                    (250, 7),
                ],
                Some(5),
            ),
            (
                "one prefill gap: not judged",
                &[
                    (100, 1),
                    (110, 2),
                    (260, 3),
                    (270, 4),
                    (280, 5),
                    (290, 6),
                    (300, 7),
                ],
                None,
            ),
            (
                "packed events count per token",
                &[(100, 1), (150, 3), (200, 5), (250, 7)],
                Some(3),
            ),
            (
                "late first token: bad at once",
                &[(1_500, 1), (1_510, 2)],
                Some(0),
            ),
            (
                "slow after the judged tokens: too late to tell early",
                &[
                    (100, 1),
                    (110, 2),
                    (120, 3),
                    (130, 4),
                    (140, 5),
                    (150, 6),
                    (400, 7),
                    (700, 8),
                ],
                None,
            ),
        ];
        for (what, events, want) in cases {
            let mut j = Judging::new(t0, slo);
            assert!(!j.served(t0 + ms(50), None), "{what}: no output yet");
            let got: Vec<usize> = events
                .iter()
                .enumerate()
                .filter(|(_, e)| j.served(t0 + ms(e.0), Some(e.1)))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "{what}");
        }
    }

    #[test]
    fn a_stream_is_judged_bad_as_soon_as_it_cannot_be_good() {
        let ms = Duration::from_millis;
        let slo = Slo {
            ttft: Some(ms(1_000)),
            tpot: Some(ms(20)),
            ..Slo::default()
        };
        let e = |first: u64, gaps: u64, slow: u64| Early {
            first: ms(first),
            gaps,
            slow,
        };
        let cases: &[(&str, Early, Slo, Option<bool>)] = &[
            ("first token in time", e(200, 0, 0), slo, None),
            ("first token late: bad", e(1_200, 0, 0), slo, Some(false)),
            ("few gaps yet", e(200, 3, 3), slo, None),
            ("most early gaps slow: bad", e(200, 5, 3), slo, Some(false)),
            ("half of them: not yet", e(200, 6, 3), slo, None),
            ("one long gap (a prefill)", e(200, 5, 1), slo, None),
            (
                "no TPOT SLO: gaps do not judge",
                e(200, 9, 9),
                Slo { tpot: None, ..slo },
                None,
            ),
            (
                "no TTFT SLO: a late first token does not",
                e(5_000, 0, 0),
                Slo { ttft: None, ..slo },
                None,
            ),
        ];
        for (what, early, slo, want) in cases {
            assert_eq!(early_verdict(early, slo), *want, "{what}");
        }
    }
}
