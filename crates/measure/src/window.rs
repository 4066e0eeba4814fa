//! The goodput ratio over a sliding window (default 60 s), per model and overall: the number an
//! autoscaler or an alert reads (`goodput_proxy_goodput_ratio`). Pure: instants in, ratios out.
//!
//! Counts are kept in one-second slots, so the window slides in one-second steps: a request
//! counts from the second it finished until `window` seconds later. Ratio = good / eligible,
//! where eligible is every finished request except rejections the client caused (DESIGN.md,
//! "Goodput"); no eligible request in the window, no ratio.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Seconds since the window's origin this slot holds counts for.
    second: u64,
    good: u64,
    eligible: u64,
}

/// One key's ring of one-second slots: good / eligible counted in the second a request
/// finished, summed over the seconds a window spans. [`RatioWindow`] and the proxy's windows
/// (one per key and length) count in it.
#[derive(Debug, Clone)]
pub struct SecondRing(Box<[Slot]>);

impl SecondRing {
    /// A ring of `n` seconds (at least one).
    pub fn new(n: usize) -> Self {
        // `second` 0 with zero counts is indistinguishable from an empty slot.
        Self(vec![Slot::default(); n.max(1)].into_boxed_slice())
    }

    /// Counts one request that finished in `second` (since the origin).
    #[inline]
    pub fn add(&mut self, second: u64, good: bool) {
        let n = self.0.len() as u64;
        if let Some(s) = self.0.get_mut((second % n) as usize) {
            if s.second != second {
                *s = Slot {
                    second,
                    good: 0,
                    eligible: 0,
                };
            }
            s.good += u64::from(good);
            s.eligible += 1;
        }
    }

    /// (good, eligible) over the slots of seconds `(now - n, now]`.
    pub fn sum(&self, now: u64) -> (u64, u64) {
        let n = self.0.len() as u64;
        self.0
            .iter()
            .filter(|s| s.second <= now && s.second + n > now)
            .fold((0, 0), |(g, e), s| (g + s.good, e + s.eligible))
    }

    /// The ratio over [`SecondRing::sum`]; `None` when none is eligible.
    pub fn ratio(&self, now: u64) -> Option<f64> {
        ratio(self.sum(now))
    }
}

/// An instant and its second of the slots of windows from one origin
/// ([`RatioWindow::second_of`]).
#[derive(Debug, Clone, Copy)]
pub struct Second {
    origin: Instant,
    at: Instant,
    second: u64,
}

/// Good / eligible over the last `window`, per key (the `model` label value) and overall.
#[derive(Debug, Clone)]
pub struct RatioWindow {
    origin: Instant,
    slots: usize,
    /// The overall ring; `None` in a window made [`RatioWindow::keyed_only`] (a reader of
    /// keys alone need not pay for it on every add).
    all: Option<SecondRing>,
    /// Keys are label values from bounded sets (models, tenants, replicas): a fixed-seed fast
    /// hash is enough (SipHash was most of a finished request's cost here). Each key's
    /// index in `keyed`.
    by_key: HashMap<Arc<str>, usize, FixedState>,
    keyed: Vec<SecondRing>,
    /// The first keys counted, by pointer, with their index: a label value is one `Arc` for
    /// every request of its model (tenant, replica), so a pointer comparison finds its slots
    /// without hashing the text. Another `Arc` of the same text is found by the hash. Up to
    /// `by_pointer_max` keys (0: always by the hash, the reference the tests compare against).
    by_pointer: Vec<(Arc<str>, usize)>,
    by_pointer_max: usize,
}

/// Keys a window finds by pointer (a proxy serves a few models, tenants and replicas).
const BY_POINTER: usize = 8;

impl RatioWindow {
    /// `window` is rounded up to whole seconds (at least one).
    pub fn new(window: Duration, origin: Instant) -> Self {
        let slots = window.as_secs_f64().ceil().max(1.0) as usize;
        Self {
            origin,
            slots,
            all: Some(SecondRing::new(slots)),
            by_key: HashMap::default(),
            keyed: Vec::new(),
            by_pointer: Vec::new(),
            by_pointer_max: BY_POINTER,
        }
    }

    /// Finds keys by their pointer for at most `n` keys (0: always by the hash).
    pub fn with_keys_by_pointer(mut self, n: usize) -> Self {
        self.by_pointer_max = n;
        self.by_pointer.truncate(n);
        self
    }

    /// Counts per key only: [`RatioWindow::overall`] is always `None`, [`RatioWindow::per_key`]
    /// is as before.
    pub fn keyed_only(mut self) -> Self {
        self.all = None;
        self
    }

    pub fn window(&self) -> Duration {
        Duration::from_secs(self.slots as u64)
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_secs()
    }

    /// The second of this window's slots that `at` falls in, for [`RatioWindow::add_in`]:
    /// windows with the same origin share it (the clock arithmetic done once for all).
    pub fn second_of(&self, at: Instant) -> Second {
        Second {
            origin: self.origin,
            at,
            second: self.second(at),
        }
    }

    /// Counts one eligible finished request. Keys come from a bounded label set.
    pub fn add(&mut self, key: &Arc<str>, good: bool, at: Instant) {
        self.add_second(key, good, self.second(at));
    }

    /// [`RatioWindow::add`] at `s.at` (the second computed once, when `s` came from a window
    /// of the same origin).
    pub fn add_in(&mut self, key: &Arc<str>, good: bool, s: Second) {
        let second = if s.origin == self.origin {
            s.second
        } else {
            self.second(s.at)
        };
        self.add_second(key, good, second);
    }

    #[inline(always)]
    fn add_second(&mut self, key: &Arc<str>, good: bool, s: u64) {
        if let Some(all) = &mut self.all {
            all.add(s, good);
        }
        let i = match self.by_pointer.iter().find(|(k, _)| Arc::ptr_eq(k, key)) {
            Some(&(_, i)) => i,
            None => self.index_of(key),
        };
        if let Some(slots) = self.keyed.get_mut(i) {
            slots.add(s, good);
        }
    }

    /// The index of `key`'s slots (new ones for a new key), found by its text.
    #[inline(never)]
    fn index_of(&mut self, key: &Arc<str>) -> usize {
        // Looked up before inserting: a key seen before costs no clone.
        if let Some(&i) = self.by_key.get(key) {
            return i;
        }
        self.keyed.push(SecondRing::new(self.slots));
        let i = self.keyed.len() - 1;
        self.by_key.insert(key.clone(), i);
        // The `Arc` a text was first counted with (the label's own, kept by the label set; a
        // value made anew per request would only fill the list once).
        if self.by_pointer.len() < self.by_pointer_max {
            self.by_pointer.push((key.clone(), i));
        }
        i
    }

    /// The overall ratio at `now`; `None` when no eligible request finished in the window (or
    /// the window is [`RatioWindow::keyed_only`]).
    pub fn overall(&self, now: Instant) -> Option<f64> {
        ratio(self.all.as_ref()?.sum(self.second(now)))
    }

    /// Every key's ratio at `now` (`None` for a key with nothing in the window).
    pub fn per_key(&self, now: Instant) -> Vec<(Arc<str>, Option<f64>)> {
        let s = self.second(now);
        self.by_key
            .iter()
            .filter_map(|(k, &i)| Some((k.clone(), ratio(self.keyed.get(i)?.sum(s)))))
            .collect()
    }
}

fn ratio((good, eligible): (u64, u64)) -> Option<f64> {
    (eligible > 0).then(|| good as f64 / eligible as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn ratio_per_key_and_overall() {
        let t0 = Instant::now();
        let mut w = RatioWindow::new(Duration::from_secs(60), t0);
        let (a, b) = (key("a"), key("b"));
        for good in [true, true, true, false] {
            w.add(&a, good, t0 + Duration::from_millis(500));
        }
        w.add(&b, false, t0 + Duration::from_secs(10));
        let now = t0 + Duration::from_secs(20);
        assert_eq!(w.overall(now), Some(3.0 / 5.0));
        let mut per = w.per_key(now);
        per.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(per, vec![(a, Some(0.75)), (b, Some(0.0))]);
    }

    #[test]
    fn requests_leave_the_window_after_it_has_passed() {
        let t0 = Instant::now();
        let mut w = RatioWindow::new(Duration::from_secs(60), t0);
        let a = key("a");
        w.add(&a, false, t0 + Duration::from_secs(1));
        w.add(&a, true, t0 + Duration::from_secs(30));
        // At 60.9 s both are inside (seconds 1 and 30 of (0, 60]).
        assert_eq!(w.overall(t0 + Duration::from_millis(60_900)), Some(0.5));
        // At 61 s second 1 has left.
        assert_eq!(w.overall(t0 + Duration::from_secs(61)), Some(1.0));
        // At 90 s nothing is left: no ratio, for the key too.
        assert_eq!(w.overall(t0 + Duration::from_secs(90)), None);
        assert_eq!(w.per_key(t0 + Duration::from_secs(90)), vec![(a, None)]);
    }

    #[test]
    fn a_reused_slot_forgets_its_old_second() {
        let t0 = Instant::now();
        let mut w = RatioWindow::new(Duration::from_secs(3), t0);
        let a = key("a");
        w.add(&a, false, t0 + Duration::from_secs(2));
        // Second 5 lands in the same slot as second 2 (5 % 3 == 2): the old counts go.
        w.add(&a, true, t0 + Duration::from_secs(5));
        assert_eq!(w.overall(t0 + Duration::from_secs(5)), Some(1.0));
        assert_eq!(w.window(), Duration::from_secs(3));
    }

    #[test]
    fn sub_second_windows_round_up() {
        let w = RatioWindow::new(Duration::from_millis(1), Instant::now());
        assert_eq!(w.window(), Duration::from_secs(1));
    }

    /// Keys found by pointer count as keys found by their text: any sequence of adds with
    /// keys of one text in several `Arc`s, more keys than the pointer list holds, the same
    /// ratios at every step as the window that always hashes.
    #[test]
    fn keys_by_pointer_count_as_keys_by_text() {
        use proptest::prelude::*;
        let texts = [
            "m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9", "m10", "m11",
        ];
        proptest!(|(ops in proptest::collection::vec((0usize..12, 0usize..3, any::<bool>(), 0u64..5_000), 1..300), max in 0usize..10)| {
            // Three `Arc`s of each text.
            let keys: Vec<[Arc<str>; 3]> = texts.iter().map(|t| [key(t), key(t), key(t)]).collect();
            let t0 = Instant::now();
            let mut fast = RatioWindow::new(Duration::from_secs(3), t0).with_keys_by_pointer(max);
            let mut plain = RatioWindow::new(Duration::from_secs(3), t0).with_keys_by_pointer(0);
            let mut at = t0;
            for (k, copy, good, step_ms) in ops {
                at += Duration::from_millis(step_ms);
                let s = fast.second_of(at);
                fast.add_in(&keys[k][copy], good, s);
                plain.add(&keys[k][copy], good, at);
                prop_assert_eq!(fast.overall(at), plain.overall(at));
                let (mut x, mut y) = (fast.per_key(at), plain.per_key(at));
                x.sort_by(|p, q| p.0.cmp(&q.0));
                y.sort_by(|p, q| p.0.cmp(&q.0));
                prop_assert_eq!(x, y);
            }
            prop_assert!(fast.by_pointer.len() <= max);
        });
    }

    /// A window that counts per key only has the per-key ratios of one that counts overall
    /// too, at every step of any sequence of adds, and no overall ratio.
    #[test]
    fn a_keyed_only_window_has_the_same_keys() {
        use proptest::prelude::*;
        let keys = [key("a"), key("b"), key("c")];
        proptest!(|(ops in proptest::collection::vec((0usize..3, any::<bool>(), 0u64..3_000), 1..100))| {
            let t0 = Instant::now();
            let mut both = RatioWindow::new(Duration::from_secs(3), t0);
            let mut keyed = RatioWindow::new(Duration::from_secs(3), t0).keyed_only();
            let mut at = t0;
            for (k, good, step_ms) in ops {
                at += Duration::from_millis(step_ms);
                both.add(&keys[k], good, at);
                keyed.add_in(&keys[k], good, keyed.second_of(at));
                let (mut x, mut y) = (keyed.per_key(at), both.per_key(at));
                x.sort_by(|p, q| p.0.cmp(&q.0));
                y.sort_by(|p, q| p.0.cmp(&q.0));
                prop_assert_eq!(x, y);
                prop_assert!(both.overall(at).is_some());
                prop_assert_eq!(keyed.overall(at), None);
            }
        });
    }

    /// A second computed by one window counts in another as `add` counts it there: shared
    /// when the origins are the same, computed again when they are not.
    #[test]
    fn add_in_counts_as_add() {
        let t0 = Instant::now();
        let (a, b) = (key("a"), key("b"));
        let later = t0 + Duration::from_millis(2500);
        let mut by_add = RatioWindow::new(Duration::from_secs(3), t0);
        let mut by_in = by_add.clone();
        let mut other_origin = RatioWindow::new(Duration::from_secs(3), later);
        let mut other_by_add = other_origin.clone();
        for (i, ms) in [0u64, 900, 1000, 2600, 3100, 5200, 5999]
            .into_iter()
            .enumerate()
        {
            let at = later + Duration::from_millis(ms);
            let good = i % 3 != 0;
            let k = if i % 2 == 0 { &a } else { &b };
            let s = by_add.second_of(at);
            by_add.add(k, good, at);
            by_in.add_in(k, good, s);
            other_by_add.add(k, good, at);
            other_origin.add_in(k, good, s);
            for now in [at, at + Duration::from_millis(1700)] {
                assert_eq!(by_in.overall(now), by_add.overall(now), "{ms}");
                assert_eq!(other_origin.overall(now), other_by_add.overall(now), "{ms}");
                let mut x = by_in.per_key(now);
                let mut y = by_add.per_key(now);
                x.sort_by(|p, q| p.0.cmp(&q.0));
                y.sort_by(|p, q| p.0.cmp(&q.0));
                assert_eq!(x, y);
            }
        }
        assert!(by_add.overall(later + Duration::from_secs(6)).is_some());
    }
}
