//! Good / eligible over sliding windows, per key and optionally overall, counted as
//! `goodput_measure::window::RatioWindow` counts them (the reference the tests hold these to),
//! shaped for a count made by every finished request:
//!
//! - [`SecondClock`]: the second since the windows' origin that an instant falls in. Requests
//!   finish in the same second as the one before nearly always: two comparisons against the
//!   second last found, not a clock subtraction per request (and per window).
//! - [`KeyedRings`]: one key's rings of one-second slots for `H` window lengths side by side,
//!   so one look-up of the key serves every length (the autoscaling signals count a request
//!   in a short and a long window).
//!
//! Ratios are read at a second ([`SecondClock::second_at`]); the slots are the reference's:
//! a request counts from the second it finished until the window's length later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;
use goodput_measure::window::SecondRing;
use tokio::time::Instant;

/// The second since an origin that an instant falls in, the last one found kept.
#[derive(Debug, Clone)]
pub struct SecondClock {
    origin: Instant,
    /// `[start, end)` of the second last found, and its number.
    last: Option<(Instant, Instant, u64)>,
}

impl SecondClock {
    pub fn new(origin: Instant) -> Self {
        Self { origin, last: None }
    }

    /// Whole seconds from the origin to `at` (0 before it), as the reference counts them.
    #[inline]
    pub fn second(&mut self, at: Instant) -> u64 {
        match self.last {
            Some((start, end, s)) if start <= at && at < end => s,
            _ => self.find(at),
        }
    }

    /// [`SecondClock::second`] without keeping it (a reader).
    pub fn second_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_secs()
    }

    #[inline(never)]
    fn find(&mut self, at: Instant) -> u64 {
        let s = self.second_at(at);
        let start = self.origin.checked_add(Duration::from_secs(s));
        let end = start.and_then(|t| t.checked_add(Duration::from_secs(1)));
        // Before the origin every instant is second 0, but `[origin, origin + 1 s)` does not
        // hold it: nothing is kept then (nor when the bounds do not fit an instant).
        self.last = match (start, end) {
            (Some(start), Some(end)) if start <= at => Some((start, end, s)),
            _ => None,
        };
        s
    }
}

/// Keys a table finds by pointer (a proxy serves a few models, tenants and replicas).
const BY_POINTER: usize = 8;

/// Good / eligible per key (a label value from a bounded set) over `H` window lengths, and
/// overall when asked for.
#[derive(Debug, Clone)]
pub struct KeyedRings<const H: usize> {
    /// Each window's length in seconds.
    lens: [usize; H],
    overall: Option<[SecondRing; H]>,
    /// Each key's index in `rings`, by text: the fixed-seed fast hash of the reference.
    by_text: HashMap<Arc<str>, usize, FixedState>,
    /// The first keys counted, by pointer: a label value is one `Arc` for every request of
    /// its model (tenant, replica), so a pointer comparison finds its rings without hashing
    /// the text. Another `Arc` of the same text is found by the hash.
    by_pointer: Vec<(Arc<str>, usize)>,
    rings: Vec<[SecondRing; H]>,
}

impl<const H: usize> KeyedRings<H> {
    /// Windows of `lens` (rounded up to whole seconds, at least one), per key only.
    pub fn new(lens: [Duration; H]) -> Self {
        Self {
            lens: lens.map(|d| d.as_secs_f64().ceil().max(1.0) as usize),
            overall: None,
            by_text: HashMap::default(),
            by_pointer: Vec::new(),
            rings: Vec::new(),
        }
    }

    /// Counts overall too ([`KeyedRings::overall`]).
    pub fn with_overall(mut self) -> Self {
        let lens = self.lens;
        self.overall = Some(std::array::from_fn(|h| SecondRing::new(lens[h])));
        self
    }

    /// Window `h`'s length.
    pub fn window(&self, h: usize) -> Duration {
        Duration::from_secs(self.lens.get(h).copied().unwrap_or(1) as u64)
    }

    /// One eligible finished request of `key` in `second` ([`SecondClock::second`]), in every
    /// window.
    #[inline]
    pub fn add(&mut self, key: &Arc<str>, good: bool, second: u64) {
        if let Some(all) = &mut self.overall {
            for r in all.iter_mut() {
                r.add(second, good);
            }
        }
        let i = match self.by_pointer.iter().find(|(k, _)| Arc::ptr_eq(k, key)) {
            Some(&(_, i)) => i,
            None => self.index_of(key),
        };
        if let Some(rings) = self.rings.get_mut(i) {
            for r in rings.iter_mut() {
                r.add(second, good);
            }
        }
    }

    /// The index of `key`'s rings (new ones for a new key), found by its text.
    #[inline(never)]
    fn index_of(&mut self, key: &Arc<str>) -> usize {
        // Looked up before inserting: a key seen before costs no clone.
        if let Some(&i) = self.by_text.get(key) {
            return i;
        }
        let lens = self.lens;
        self.rings
            .push(std::array::from_fn(|h| SecondRing::new(lens[h])));
        let i = self.rings.len() - 1;
        self.by_text.insert(key.clone(), i);
        // The `Arc` a text was first counted with (the label's own, kept by the label set).
        if self.by_pointer.len() < BY_POINTER {
            self.by_pointer.push((key.clone(), i));
        }
        i
    }

    /// Window `h`'s overall ratio at second `now`; `None` when nothing eligible is in it, or
    /// overall is not counted.
    pub fn overall(&self, h: usize, now: u64) -> Option<f64> {
        self.overall.as_ref()?.get(h)?.ratio(now)
    }

    /// Every key's ratio in window `h` at second `now` (`None` for a key with nothing in it).
    pub fn per_key(&self, h: usize, now: u64) -> Vec<(Arc<str>, Option<f64>)> {
        self.by_text
            .iter()
            .filter_map(|(k, &i)| Some((k.clone(), self.rings.get(i)?.get(h)?.ratio(now))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use goodput_measure::window::RatioWindow;
    use proptest::prelude::*;

    fn sorted(mut v: Vec<(Arc<str>, Option<f64>)>) -> Vec<(Arc<str>, Option<f64>)> {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    proptest! {
        /// Any sequence of adds (keys of one text in several `Arc`s, more keys than are found
        /// by pointer, instants before the origin, steps within and across seconds): at every
        /// step, every window's per-key and overall ratios are those of the reference, one
        /// `RatioWindow` per length.
        #[test]
        fn rings_count_as_the_reference_windows(
            ops in prop::collection::vec((0usize..12, 0usize..3, any::<bool>(), 0u64..1_700), 1..300),
            lens in (1u64..5, 1u64..9),
            origin_ms in 0u64..3_000,
        ) {
            let texts = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9", "m10", "m11"];
            let keys: Vec<[Arc<str>; 3]> =
                texts.iter().map(|t| [Arc::from(*t), Arc::from(*t), Arc::from(*t)]).collect();
            let t0 = Instant::now();
            let origin = t0 + Duration::from_millis(origin_ms);
            let lens = [Duration::from_secs(lens.0), Duration::from_secs(lens.1)];
            let mut clock = SecondClock::new(origin);
            let mut rings = KeyedRings::new(lens).with_overall();
            let mut reference = lens.map(|l| RatioWindow::new(l, origin));
            let mut at = t0;
            for (k, copy, good, step_ms) in ops {
                at += Duration::from_millis(step_ms);
                let key = &keys[k][copy];
                rings.add(key, good, clock.second(at));
                for w in reference.iter_mut() {
                    w.add(key, good, at);
                }
                prop_assert_eq!(clock.second(at), clock.second_at(at));
                let now = clock.second_at(at);
                for (h, w) in reference.iter().enumerate() {
                    prop_assert_eq!(rings.window(h), w.window());
                    prop_assert_eq!(rings.overall(h, now), w.overall(at));
                    prop_assert_eq!(sorted(rings.per_key(h, now)), sorted(w.per_key(at)));
                }
            }
        }
    }

    #[test]
    fn the_clock_finds_each_second_at_its_edges() {
        let t0 = Instant::now();
        let origin = t0 + Duration::from_secs(2);
        let mut c = SecondClock::new(origin);
        let ns = Duration::from_nanos(1);
        // (instant, second), in an order that hits and misses the kept second.
        let cases = [
            (t0, 0),
            (origin, 0),
            (origin + Duration::from_millis(999), 0),
            (origin + Duration::from_secs(1) - ns, 0),
            (origin + Duration::from_secs(1), 1),
            (origin - ns, 0),
            (origin + Duration::from_secs(1), 1),
            (origin + Duration::from_secs(2) - ns, 1),
            (origin + Duration::from_secs(7), 7),
            (origin + Duration::from_secs(1), 1),
        ];
        for (at, want) in cases {
            assert_eq!(c.second(at), want, "{:?}", at.saturating_duration_since(t0));
            assert_eq!(c.second_at(at), want);
        }
    }
}
