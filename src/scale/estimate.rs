//! The headroom estimator, pure (no clock, no I/O): what one replica can carry before the share
//! of requests meeting their SLOs falls below the target, learned from the proxy's own history
//! of load against attainment.
//!
//! Each sample is one replica over one tick: the load it carried (requests in flight, or
//! tokens per second) and how many of the requests it finished met every SLO. Samples go into
//! geometric load bins (4 per doubling); each bin keeps its own good / total, remembering its
//! last [`Curve::memory`] requests (older ones are scaled down as new ones arrive), so a bin
//! forgets only when the load revisits it, never because time passed. The capacity is where a
//! non-increasing fit of attainment against load (pool adjacent violators, weighted by
//! requests) crosses the target, interpolated between the bins on either side. Until some bin
//! with enough requests is below the target there is no capacity: the limit has not been seen,
//! and the estimator says nothing rather than guess.
//!
//! Each bin also keeps how long its requests took, so the limit comes with the request time
//! there: by Little's law (held = throughput x time) the load a fleet holds converts into the
//! throughput it serves, and the replicas a load needs are its throughput over one replica's
//! throughput at the limit ([`desired_replicas`]).

/// Attainment against load for one model, over replicas (all replicas are taken to be alike).
#[derive(Debug, Clone)]
pub struct Curve {
    /// Upper edge of the first bin (everything below lands in it).
    lo: f64,
    /// The least load [`log_bin`] puts in bin 2, 3, ...: a request's bin is found by
    /// comparisons, bit for bit the bin of the logarithm, without a logarithm per request.
    starts: Box<[f64]>,
    bins: Vec<Bin>,
    memory: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Bin {
    good: f64,
    total: f64,
    /// Seconds the requests took, summed.
    seconds: f64,
}

/// Where attainment falls to the target: the load one replica carries there, and the mean
/// time its requests took at that load (0 when the requests were not timed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub load: f64,
    pub seconds: f64,
}

/// One group of neighbouring bins: its load (the middle of its bins, weighted by requests),
/// attainment, requests and mean request time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Group {
    load: f64,
    attainment: f64,
    requests: f64,
    seconds: f64,
}

/// Each bin is this much wider than the one before (4 bins per doubling).
pub const BIN_RATIO: f64 = 1.189_207_115_002_721; // 2^(1/4)

impl Curve {
    /// Bins from `lo` upwards, `n` of them; each remembers its last `memory` requests.
    /// `lo` is positive and finite.
    pub fn new(lo: f64, n: usize, memory: f64) -> Self {
        let n = n.max(2);
        Curve {
            lo,
            starts: (2..n).map(|k| least_load_in(lo, k)).collect(),
            bins: vec![Bin::default(); n],
            memory: memory.max(1.0),
        }
    }

    /// Requests remembered per bin.
    pub fn memory(&self) -> f64 {
        self.memory
    }

    /// The bin of `load`: 0 up to `lo` (and for NaN), else [`log_bin`]'s, at most the last.
    fn bin_of(&self, load: f64) -> usize {
        if load.is_nan() || load <= self.lo {
            return 0;
        }
        let k = 1 + self.starts.partition_point(|&s| s <= load);
        k.min(self.bins.len() - 1)
    }

    /// Lower and upper edge of bin `k` (bin 0 starts at 0).
    fn edges(&self, k: usize) -> (f64, f64) {
        let hi = self.lo * BIN_RATIO.powi(k as i32);
        let lo = if k == 0 { 0.0 } else { hi / BIN_RATIO };
        (lo, hi)
    }

    /// Where a bin's requests sat: its geometric middle (bin 0: half its edge).
    fn middle(&self, k: usize) -> f64 {
        let (lo, hi) = self.edges(k);
        if k == 0 {
            hi / 2.0
        } else {
            (lo * hi).sqrt()
        }
    }

    /// One replica over one tick: it carried `load` and finished `total` requests, `good` of
    /// which met every SLO, taking `seconds` together (start to end, summed).
    pub fn observe(&mut self, load: f64, good: u64, total: u64, seconds: f64) {
        if let Some(k) = self.bin(load) {
            self.observe_in(k, good, total, seconds);
        }
    }

    /// The bin [`Curve::observe`] counts `load` in; `None` for a load it ignores (negative
    /// or not finite). Curves made alike (the same `lo` and bins) put a load in the same bin.
    pub fn bin(&self, load: f64) -> Option<usize> {
        (load.is_finite() && load >= 0.0).then(|| self.bin_of(load))
    }

    /// [`Curve::observe`] of a load in bin `k` ([`Curve::bin`]), found once for requests that
    /// carried the same load.
    pub fn observe_in(&mut self, k: usize, good: u64, total: u64, seconds: f64) {
        if total == 0 {
            return;
        }
        let seconds = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        let memory = self.memory;
        let Some(b) = self.bins.get_mut(k) else {
            return;
        };
        let (g, t) = (good.min(total) as f64, total as f64);
        // Keep at most `memory` requests: the old ones shrink to make room for the new.
        let keep = if b.total + t > memory {
            ((memory - t).max(0.0) / b.total).min(1.0)
        } else {
            1.0
        };
        b.good = b.good * keep + g;
        b.total = b.total * keep + t;
        b.seconds = b.seconds * keep + seconds;
    }

    /// The load per replica at which attainment falls to `target`, from groups of bins holding
    /// at least `min_requests` each ([`Curve::groups`]): where the fit crosses it, between a
    /// load that met the target and one that did not. `None` until both have been seen: while
    /// no load missed, the limit is unknown; while every load seen missed, load is not what
    /// made them miss (fewer requests per replica are not known to help), and a limit put at
    /// the lightest load seen would ask for replicas without end.
    pub fn capacity(&self, target: f64, min_requests: f64) -> Option<f64> {
        self.limit(target, min_requests).map(|l| l.load)
    }

    /// The capacity ([`Curve::capacity`]) with the mean request time there, interpolated
    /// between the same two groups.
    pub fn limit(&self, target: f64, min_requests: f64) -> Option<Limit> {
        let groups = self.groups(min_requests.max(1.0));
        let fit = non_increasing(
            &groups
                .iter()
                .map(|g| (g.attainment, g.requests))
                .collect::<Vec<_>>(),
        );
        let j = fit.iter().position(|&a| a < target).filter(|&j| j > 0)?;
        let (g0, g1) = (groups[j - 1], groups[j]);
        let f = (fit[j - 1] - target) / (fit[j - 1] - fit[j]);
        Some(Limit {
            load: g0.load + f * (g1.load - g0.load),
            seconds: g0.seconds + f * (g1.seconds - g0.seconds),
        })
    }

    /// The bins as groups, lightest first, neighbours joined until each group holds at least
    /// `min_requests`. Sparse bins are evidence where they lie, not noise to drop: a light load
    /// that met its SLOs over a few bins still counts once together it holds enough requests.
    /// A sparse rest above the last full group is left out.
    fn groups(&self, min_requests: f64) -> Vec<Group> {
        let mut out = Vec::new();
        let mut sum = Bin::default();
        let mut at = 0.0;
        for (k, b) in self.bins.iter().enumerate().filter(|(_, b)| b.total > 0.0) {
            at += self.middle(k) * b.total;
            sum.good += b.good;
            sum.total += b.total;
            sum.seconds += b.seconds;
            if sum.total >= min_requests {
                out.push(Group {
                    load: at / sum.total,
                    attainment: sum.good / sum.total,
                    requests: sum.total,
                    seconds: sum.seconds / sum.total,
                });
                (at, sum) = (0.0, Bin::default());
            }
        }
        out
    }
}

/// The bin of a load above `lo` by its logarithm (the definition; bins are [`BIN_RATIO`]
/// wide): 1 up to `lo * BIN_RATIO`, then one more per ratio. A load whose quotient by `lo` is
/// not finite has the largest index.
fn log_bin(lo: f64, load: f64) -> usize {
    ((load / lo).log(BIN_RATIO).floor() as usize).saturating_add(1)
}

/// The least load above `lo` that [`log_bin`] puts in bin `k` or higher (infinity when no
/// finite load is): a bisection over the doubles above `lo`, which are ordered as their bits,
/// as `log_bin` is non-decreasing in the load.
fn least_load_in(lo: f64, k: usize) -> f64 {
    let (mut a, mut b) = (lo.to_bits() + 1, f64::MAX.to_bits());
    if log_bin(lo, f64::from_bits(b)) < k {
        return f64::INFINITY;
    }
    // Every load below bits `a` is in a lower bin; the load of bits `b` is not.
    while a < b {
        let m = a + (b - a) / 2;
        if log_bin(lo, f64::from_bits(m)) >= k {
            b = m;
        } else {
            a = m + 1;
        }
    }
    f64::from_bits(a)
}

/// Weighted least-squares fit by a non-increasing sequence (pool adjacent violators).
fn non_increasing(points: &[(f64, f64)]) -> Vec<f64> {
    // Blocks of (mean, weight, length).
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(points.len());
    for &(v, w) in points {
        blocks.push((v, w, 1));
        while blocks.len() > 1 {
            let (b, a) = (blocks[blocks.len() - 1], blocks[blocks.len() - 2]);
            if a.0 >= b.0 {
                break;
            }
            let w = a.1 + b.1;
            blocks.truncate(blocks.len() - 2);
            blocks.push(((a.0 * a.1 + b.0 * b.1) / w, w, a.2 + b.2));
        }
    }
    blocks
        .iter()
        .flat_map(|&(v, _, n)| std::iter::repeat_n(v, n))
        .collect()
}

/// More load the fleet can take before its attainment falls below the target: `replicas`
/// times the per-replica capacity, less the load it carries now (never below 0).
pub fn headroom(capacity: Option<f64>, replicas: usize, load: f64) -> Option<f64> {
    capacity.map(|c| (c * replicas as f64 - load).max(0.0))
}

/// The replicas the load needs to stay at the target: its throughput over what one replica
/// serves at the limit. By Little's law a load held (`load`, e.g. streams in flight) is the
/// throughput times the time requests take (`seconds`, recent ones), and one replica at the
/// limit serves `limit.load / limit.seconds`; so the hint is `load / limit.load x
/// limit.seconds / seconds` (a fraction: the autoscaler rounds up).
///
/// Why not load / capacity alone: below the limit requests take less time than at it (a
/// batch that is not full runs faster), so the load held reads low, and lower the more
/// replicas share it: a fleet that adds replicas sees its hint fall and gives them back.
/// The throughput does not depend on how many replicas share it. Past the limit requests
/// take longer than there (they wait), and the load held, which keeps growing with the queue
/// while the throughput stays flat, is the reading (the factor is never below 1). Without a
/// recent request time, or untimed requests at the limit, it is load / capacity.
pub fn desired_replicas(limit: Option<Limit>, load: f64, seconds: Option<f64>) -> Option<f64> {
    let limit = limit.filter(|l| l.load > 0.0)?;
    let slower_at_limit = match seconds {
        Some(t) if t > 0.0 && limit.seconds > t => limit.seconds / t,
        _ => 1.0,
    };
    Some(load / limit.load * slower_at_limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica whose requests all meet their SLO up to `cap`, then fewer and fewer: the
    /// attainment falls linearly to 0 at twice the capacity.
    fn attainment(load: f64, cap: f64) -> f64 {
        if load <= cap {
            1.0
        } else {
            (1.0 - (load - cap) / cap).max(0.0)
        }
    }

    /// Seconds a request takes at `load` streams on a replica of capacity `cap`: a batch runs
    /// slower the fuller it is (the time doubles from an empty replica to one at capacity).
    fn request_time(load: f64, cap: f64) -> f64 {
        0.5 * (1.0 + load / cap)
    }

    /// Ticks of a load rising from `from` to `to` in `steps` steps, `per_tick` requests each,
    /// against a replica of capacity `cap` (the target crossing sits just past `cap`).
    fn ramp(c: &mut Curve, cap: f64, from: f64, to: f64, steps: usize) {
        for i in 0..=steps {
            let load = from + (to - from) * i as f64 / steps as f64;
            let total = 40u64;
            let good = (attainment(load, cap) * total as f64).round() as u64;
            c.observe(load, good, total, total as f64 * request_time(load, cap));
        }
    }

    const TARGET: f64 = 0.95;
    const MIN: f64 = 20.0;

    fn curve() -> Curve {
        Curve::new(0.5, 64, 400.0)
    }

    #[test]
    fn no_data_no_figures() {
        let c = curve();
        assert_eq!(c.capacity(TARGET, MIN), None);
        assert_eq!(headroom(c.capacity(TARGET, MIN), 3, 10.0), None);
        assert_eq!(
            desired_replicas(c.limit(TARGET, MIN), 10.0, Some(1.0)),
            None
        );
        // Too few requests in any bin: still nothing.
        let mut c = curve();
        c.observe(10.0, 0, 5, 0.0);
        assert_eq!(c.capacity(TARGET, MIN), None);
    }

    #[test]
    fn headroom_falls_to_zero_where_attainment_crosses_the_target() {
        // Attainment crosses 0.95 at 1.05 x capacity.
        let cap = 16.0;
        let crossing = cap * (1.0 + (1.0 - TARGET));
        // (load reached so far, query load, expected headroom for 1 replica; None = absent)
        let cases: &[(f64, f64, Option<f64>)] = &[
            // Below capacity: never missed yet, so nothing is known.
            (cap * 0.9, cap * 0.5, None),
            (cap, cap * 0.9, None),
            // Past the crossing: known, and 0 at the crossing itself.
            (cap * 1.5, crossing, Some(0.0)),
            (cap * 1.5, cap * 1.3, Some(0.0)),
            (cap * 1.5, cap * 0.5, Some(crossing - cap * 0.5)),
            (cap * 2.0, 0.0, Some(crossing)),
        ];
        for &(reached, query, want) in cases {
            let mut c = curve();
            ramp(&mut c, cap, 1.0, reached, 400);
            let got = headroom(c.capacity(TARGET, MIN), 1, query);
            match (got, want) {
                (None, None) => {}
                (Some(g), Some(w)) => {
                    // Within one bin of the truth (bins are 19% wide).
                    assert!(
                        (g - w).abs() <= crossing * 0.19,
                        "reached {reached}, query {query}: {g} vs {w}"
                    );
                }
                _ => panic!("reached {reached}, query {query}: {got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn doubling_the_capacity_doubles_the_headroom() {
        for replicas in [1usize, 3] {
            let mut small = curve();
            let mut big = curve();
            ramp(&mut small, 8.0, 1.0, 20.0, 400);
            ramp(&mut big, 16.0, 2.0, 40.0, 400);
            let (la, lb) = (small.limit(TARGET, MIN), big.limit(TARGET, MIN));
            let (Some(la), Some(lb)) = (la, lb) else {
                panic!("capacity unknown: {la:?} {lb:?}")
            };
            let (a, b) = (la.load, lb.load);
            // Bins are geometric: doubling moves every sample exactly 4 bins up.
            assert!((b / a - 2.0).abs() < 1e-9, "{a} {b}");
            let load = 0.25 * replicas as f64 * a;
            let (ha, hb) = (
                headroom(Some(a), replicas, load),
                headroom(Some(b), replicas, 2.0 * load),
            );
            let (Some(ha), Some(hb)) = (ha, hb) else {
                unreachable!()
            };
            assert!((hb / ha - 2.0).abs() < 1e-9, "{ha} {hb}");
            // Same load share, same replicas wanted.
            let (da, db) = (
                desired_replicas(Some(la), load, Some(0.6)),
                desired_replicas(Some(lb), 2.0 * load, Some(0.6)),
            );
            assert_eq!(da.map(|d| (d * 1e9).round()), db.map(|d| (d * 1e9).round()));
        }
    }

    #[test]
    fn desired_replicas_is_the_throughput_over_a_replicas_at_the_limit() {
        let limit = |load, seconds| Some(Limit { load, seconds });
        // (limit, load held now, recent request time, replicas wanted)
        type Case = (Option<Limit>, f64, Option<f64>, Option<f64>);
        let cases: &[Case] = &[
            // At the limit's pace: load / capacity.
            (limit(10.0, 1.0), 35.0, Some(1.0), Some(3.5)),
            (limit(10.0, 1.0), 0.0, Some(1.0), Some(0.0)),
            // Requests twice as fast as at the limit: 15 held is 30 a second, and one
            // replica serves 10 a second at the limit.
            (limit(10.0, 1.0), 15.0, Some(0.5), Some(3.0)),
            // Slower than at the limit (a queue): the load held, which grows with it.
            (limit(10.0, 1.0), 60.0, Some(2.0), Some(6.0)),
            // No recent request, or requests not timed at the limit: load / capacity.
            (limit(10.0, 1.0), 15.0, None, Some(1.5)),
            (limit(10.0, 1.0), 15.0, Some(0.0), Some(1.5)),
            (limit(10.0, 0.0), 15.0, Some(0.5), Some(1.5)),
            (limit(0.0, 1.0), 5.0, Some(1.0), None),
            (None, 5.0, Some(1.0), None),
        ];
        for &(lim, load, seconds, want) in cases {
            assert_eq!(
                desired_replicas(lim, load, seconds),
                want,
                "{lim:?} {load} {seconds:?}"
            );
        }
        assert_eq!(headroom(Some(10.0), 3, 35.0), Some(0.0));
        assert_eq!(headroom(Some(10.0), 3, 25.0), Some(5.0));
    }

    #[test]
    fn the_limit_comes_with_the_request_time_there() {
        for cap in [4.0, 8.0, 16.0] {
            let mut c = curve();
            ramp(&mut c, cap, cap / 8.0, cap * 2.0, 400);
            let Some(l) = c.limit(TARGET, MIN) else {
                panic!("cap {cap}: no limit")
            };
            // Within a bin (19%) of the time requests took at that load.
            let want = request_time(l.load, cap);
            assert!(
                (l.seconds / want - 1.0).abs() < 0.19,
                "cap {cap}: {l:?} vs {want}"
            );
        }
    }

    /// The same throughput spread over more replicas: each holds fewer streams, which run
    /// faster, so the fleet holds fewer streams in all. The hint must not follow (a fleet that
    /// scaled up would read less load and scale back down: the count would swing on a steady
    /// load); load / capacity alone does.
    #[test]
    fn the_hint_does_not_fall_when_replicas_are_added_to_a_steady_load() {
        let cap = 8.0;
        let mut c = curve();
        ramp(&mut c, cap, 0.5, 2.0 * cap, 400);
        let limit = c.limit(TARGET, MIN);
        let Some(l) = limit else { panic!("no limit") };
        // Requests per second the fleet serves: 2.5 replicas' worth at the limit (one serves
        // l.load / l.seconds there).
        let want = 2.5;
        let rate = want * l.load / l.seconds;
        // Per replica, the streams held at `rate / n` a second: s = rate / n x time(s), solved
        // by fixed point (time grows with s).
        let held = |n: f64| {
            let mut s: f64 = 0.0;
            for _ in 0..200 {
                s = rate / n * request_time(s, cap);
            }
            s
        };
        // Replicas serving: the hint is the same within 2%.
        for n in [3.0, 4.0, 6.0, 10.0] {
            let s = held(n);
            let load = n * s;
            let seconds = request_time(s, cap);
            let got = desired_replicas(limit, load, Some(seconds)).unwrap_or(0.0);
            assert!(
                (got / want - 1.0).abs() < 0.02,
                "{n} replicas: {got} vs {want}"
            );
            // What replicas hold alone reads lower the more replicas share the load.
            let held_only = desired_replicas(limit, load, None).unwrap_or(0.0);
            assert!(held_only < got * 0.95, "{n} replicas: {held_only} vs {got}");
        }
    }

    #[test]
    fn misses_at_every_load_seen_are_not_a_limit() {
        // Requests fail whatever the load (a broken model, a stalled host): no load met the
        // target, so there is no crossing and no capacity, never one near 0 (which would ask
        // for replicas without end).
        let cases: &[&[(f64, u64)]] = &[
            &[(0.05, 0)],
            &[(0.05, 10), (0.3, 5), (3.0, 0)],
            // A lone bad bin at the lightest load, pooled with good ones above it that still
            // fall short together.
            &[(0.05, 0), (1.0, 38), (2.0, 37)],
        ];
        for points in cases {
            let mut c = curve();
            for &(load, good) in *points {
                c.observe(load, good, 40, 0.0);
            }
            assert_eq!(c.capacity(TARGET, MIN), None, "{points:?}");
        }
        // Once a load is seen to meet the target, the crossing is above it.
        let mut c = curve();
        c.observe(0.05, 0, 20, 0.0);
        c.observe(1.0, 400, 400, 0.0);
        c.observe(8.0, 0, 40, 0.0);
        let cap = c.capacity(TARGET, MIN).unwrap_or(0.0);
        assert!(cap > 1.0 && cap < 8.0, "{cap}");
    }

    #[test]
    fn sparse_light_loads_count_together() {
        // A short quiet start: 30 good requests spread over light loads, no bin with 20; then
        // an overload where everything misses. The light loads together met the target, so
        // the limit lies between them and the overload.
        let mut c = curve();
        for load in [1.0, 1.3, 1.6, 2.0, 2.5, 3.0] {
            c.observe(load, 5, 5, 0.0);
        }
        c.observe(20.0, 0, 60, 0.0);
        let cap = c.capacity(TARGET, MIN).unwrap_or(0.0);
        assert!(cap > 2.0 && cap < 20.0, "{cap}");
        // Without the overload there is no limit to speak of.
        let mut c = curve();
        for load in [1.0, 1.3, 1.6, 2.0, 2.5, 3.0] {
            c.observe(load, 5, 5, 0.0);
        }
        assert_eq!(c.capacity(TARGET, MIN), None);
    }

    #[test]
    fn a_bad_patch_at_low_load_is_pooled_with_its_neighbours() {
        // One unlucky bin at light load (errors unrelated to load) among good ones: the
        // non-increasing fit pools it, so it alone does not set the capacity.
        let mut c = curve();
        ramp(&mut c, 16.0, 1.0, 30.0, 400);
        let clean = c.capacity(TARGET, MIN);
        c.observe(2.0, 34, 40, 0.0);
        let noisy = c.capacity(TARGET, MIN);
        assert!(clean.is_some() && noisy.is_some());
        assert!(noisy.unwrap_or(0.0) > 8.0, "{noisy:?}");
    }

    /// The bin by the logarithm itself, as it was computed per request before the bins' starts.
    fn bin_by_log(c: &Curve, load: f64) -> usize {
        if load.is_nan() || load <= c.lo {
            return 0;
        }
        log_bin(c.lo, load).min(c.bins.len() - 1)
    }

    /// Curves of the proxy's units (0.1 streams, 1 token) and others, made once.
    fn curves_of_every_kind() -> &'static [Curve] {
        static CURVES: std::sync::OnceLock<Vec<Curve>> = std::sync::OnceLock::new();
        CURVES.get_or_init(|| {
            let mut out = Vec::new();
            for lo in [0.1, 1.0, 0.5, 3e-7, 12_345.678] {
                for n in [2, 3, 16, 96, 400] {
                    out.push(Curve::new(lo, n, 100.0));
                }
            }
            out
        })
    }

    #[test]
    fn bins_by_comparison_are_the_logarithms_around_every_edge() {
        // Ulp by ulp across each bin's start, and at the ends of the doubles.
        for c in curves_of_every_kind() {
            let c = c.clone();
            assert_eq!(c.starts.len(), c.bins.len() - 2);
            let mut probes = vec![
                f64::NAN,
                f64::NEG_INFINITY,
                -1.0,
                0.0,
                f64::MIN_POSITIVE,
                c.lo,
                f64::MAX,
            ];
            for &s in c.starts.iter().chain([c.lo].iter()) {
                if !s.is_finite() {
                    continue;
                }
                for d in -300i64..=300 {
                    probes.push(f64::from_bits(s.to_bits().saturating_add_signed(d)));
                }
            }
            for x in probes.into_iter().filter(|x| !x.is_infinite()) {
                assert_eq!(c.bin_of(x), bin_by_log(&c, x), "lo {} load {x:e}", c.lo);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn bins_by_comparison_are_the_logarithms(
            bits in 0u64..0x7ff0_0000_0000_0000,
            load in 0.0f64..1e5,
            lo in 1e-3f64..1e3,
            n in 2usize..200,
        ) {
            let x = f64::from_bits(bits);
            for c in curves_of_every_kind().iter().chain([&Curve::new(lo, n, 10.0)]) {
                proptest::prop_assert_eq!(c.bin_of(x), bin_by_log(c, x));
                proptest::prop_assert_eq!(c.bin_of(load), bin_by_log(c, load));
            }
        }
    }

    #[test]
    fn bins_remember_their_last_requests() {
        let mut c = Curve::new(0.5, 16, 100.0);
        c.observe(2.0, 100, 100, 0.0);
        c.observe(4.0, 0, 100, 0.0);
        let cap = c.capacity(TARGET, MIN).unwrap_or(0.0);
        assert!(
            cap > c.middle(c.bin_of(2.0)) && cap < c.middle(c.bin_of(4.0)),
            "{cap}"
        );
        // The same load now meets its SLOs: `memory` new requests replace the old ones, and
        // the limit is no longer seen there.
        for _ in 0..6 {
            c.observe(4.0, 100, 100, 0.0);
        }
        assert_eq!(c.capacity(TARGET, MIN), None);
    }

    #[test]
    fn pooling_fits_a_non_increasing_sequence() {
        type Points = &'static [(f64, f64)];
        let cases: &[(Points, &[f64])] = &[
            (&[], &[]),
            (&[(1.0, 1.0), (0.5, 1.0)], &[1.0, 0.5]),
            (&[(0.5, 1.0), (1.0, 1.0)], &[0.75, 0.75]),
            (
                &[(1.0, 1.0), (0.25, 3.0), (0.75, 1.0)],
                &[1.0, 0.375, 0.375],
            ),
        ];
        for &(points, want) in cases {
            assert_eq!(non_increasing(points), want, "{points:?}");
        }
    }
}
