//! The prefix index: which replicas recently served a prompt prefix block, bounded in memory.
//!
//! Each block hash (see `shape.rs`) maps to up to [`WAYS`] replicas with the time they last
//! served it. A request's blocks are recorded under the replica chosen for it; a later request
//! looks for its longest recorded prefix (a chain hash of block k implies blocks 0..k, so the
//! recorded blocks of a prompt form a prefix and a binary search finds its end).
//!
//! Learning from the engine: a replica whose engine reports that it no longer held a prefix
//! the index expected it to hold ([`PrefixIndex::evicted_up_to`]) evicted, least recently used
//! first as vLLM does, everything it served no later than that prefix's last use. The index
//! keeps one horizon stamp per such replica: its ways stamped at or before it are dead. One
//! comparison per way on lookup, no scan of the map.
//!
//! Cache room: per replica, the blocks it is the most recent recorder of ([`PrefixIndex::owned`]),
//! kept as blocks are recorded and dropped: what the prefixes the balancer sends there take of
//! its engine's cache, by which a new prefix is placed where it crowds the fewest others. It
//! ignores eviction horizons (an engine that evicted has room again; the index learns that only
//! from `cached_tokens`, and the next placement there re-records).
//!
//! Bound: two generations of at most `capacity / 2` blocks each. When the current one is
//! full it becomes the old one and the previous old one is dropped; a block found only in the
//! old generation is moved back. So the index holds at most `capacity` blocks (about 64 bytes
//! each with the map's overhead: 65,536 blocks take about 4 MiB) and forgets the least
//! recently used prefixes first, as the engines' caches do.

use std::collections::HashMap;

use foldhash::fast::FixedState;

/// Replicas remembered per block.
pub const WAYS: usize = 4;

/// Replicas with an eviction horizon at most (a replica that lost its entry looks as if it
/// still held what it served before: affinity that its engine's answer corrects again).
const MAX_HORIZONS: usize = 256;

/// A replica's identity in the index (stable while it is in the set).
pub type ReplicaId = u32;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    ids: [ReplicaId; WAYS],
    /// When each way was last recorded (0: empty).
    stamps: [u32; WAYS],
}

impl Slot {
    /// Whether way `w` is live: recorded, and after its replica's eviction horizon.
    fn live(&self, w: usize, horizons: &Horizons) -> bool {
        self.stamps[w] != 0 && self.stamps[w] > horizons.of(self.ids[w])
    }

    fn put(&mut self, id: ReplicaId, stamp: u32) {
        let way = (0..WAYS)
            .find(|&w| self.stamps[w] != 0 && self.ids[w] == id)
            .unwrap_or_else(|| (0..WAYS).min_by_key(|&w| self.stamps[w]).unwrap_or(0));
        self.ids[way] = id;
        self.stamps[way] = stamp;
    }

    /// The replica that recorded it last, if any.
    fn owner(&self) -> Option<ReplicaId> {
        (0..WAYS)
            .filter(|&w| self.stamps[w] != 0)
            .max_by_key(|&w| self.stamps[w])
            .map(|w| self.ids[w])
    }

    fn is_live(&self, horizons: &Horizons) -> bool {
        (0..WAYS).any(|w| self.live(w, horizons))
    }

    /// Its live replicas, most recent first.
    fn replicas(&self, horizons: &Horizons) -> Replicas {
        let mut ways: [usize; WAYS] = std::array::from_fn(|w| w);
        ways.sort_unstable_by(|&a, &b| self.stamps[b].cmp(&self.stamps[a]));
        let mut out = Replicas::default();
        for w in ways {
            if self.live(w, horizons) {
                out.ids[out.len] = self.ids[w];
                out.stamps[out.len] = self.stamps[w];
                out.len += 1;
            }
        }
        out
    }
}

/// Up to [`WAYS`] replica ids, most recent first, with when each last served the block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replicas {
    ids: [ReplicaId; WAYS],
    stamps: [u32; WAYS],
    len: usize,
}

impl Replicas {
    pub fn as_slice(&self) -> &[ReplicaId] {
        &self.ids[..self.len]
    }

    /// When `id` last served the block (the index's clock), if it is one of them.
    pub fn stamp_of(&self, id: ReplicaId) -> Option<u32> {
        self.as_slice()
            .iter()
            .position(|&i| i == id)
            .map(|at| self.stamps[at])
    }
}

/// Per replica, the stamp up to which its engine is known to have evicted what it served:
/// a few entries (replicas whose engines reported an eviction), searched linearly.
#[derive(Debug, Default)]
struct Horizons(Vec<(ReplicaId, u32)>);

impl Horizons {
    fn of(&self, id: ReplicaId) -> u32 {
        self.0
            .iter()
            .find_map(|&(i, s)| (i == id).then_some(s))
            .unwrap_or(0)
    }

    fn raise(&mut self, id: ReplicaId, stamp: u32) {
        match self.0.iter_mut().find(|(i, _)| *i == id) {
            Some((_, s)) => *s = (*s).max(stamp),
            None => {
                if self.0.len() >= MAX_HORIZONS {
                    // Replicas come and go with discovery: the oldest entry makes room.
                    self.0.remove(0);
                }
                self.0.push((id, stamp));
            }
        }
    }
}

type Map = HashMap<u64, Slot, FixedState>;

/// Per replica, the blocks it recorded last (see the module doc): a map, so that a choice
/// looking at every candidate pays one hash lookup each.
#[derive(Debug, Default)]
struct Owned(HashMap<ReplicaId, u64, FixedState>);

impl Owned {
    fn add(&mut self, id: ReplicaId) {
        *self.0.entry(id).or_insert(0) += 1;
    }

    fn sub(&mut self, id: ReplicaId) {
        if let Some(n) = self.0.get_mut(&id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.0.remove(&id);
            }
        }
    }
}

#[derive(Debug)]
pub struct PrefixIndex {
    cur: Map,
    old: Map,
    half: usize,
    clock: u32,
    horizons: Horizons,
    owned: Owned,
}

impl PrefixIndex {
    /// An index of at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        let half = (capacity / 2).max(1);
        PrefixIndex {
            cur: Map::with_capacity_and_hasher(half, FixedState::default()),
            old: Map::with_hasher(FixedState::default()),
            half,
            clock: 0,
            horizons: Horizons::default(),
            owned: Owned::default(),
        }
    }

    /// Blocks `id` is the most recent recorder of: the room the prefixes the index expects
    /// there take in its engine's cache, in blocks.
    pub fn owned(&self, id: ReplicaId) -> u64 {
        self.owned.0.get(&id).copied().unwrap_or(0)
    }

    /// Blocks held now (at most the capacity).
    pub fn len(&self) -> usize {
        self.cur.len() + self.old.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, h: u64) -> Option<&Slot> {
        self.cur
            .get(&h)
            .or_else(|| self.old.get(&h))
            .filter(|s| s.is_live(&self.horizons))
    }

    /// The longest recorded prefix of `blocks` (in blocks) and the replicas that recorded its
    /// last block, most recent first.
    pub fn longest(&self, blocks: &[u64]) -> (usize, Replicas) {
        // Largest k with blocks[k - 1] recorded, assuming recorded blocks form a prefix.
        let (mut lo, mut hi) = (0usize, blocks.len());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.get(blocks[mid - 1]).is_some() {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        match lo {
            0 => (0, Replicas::default()),
            k => (
                k,
                self.get(blocks[k - 1])
                    .map(|s| s.replicas(&self.horizons))
                    .unwrap_or_default(),
            ),
        }
    }

    /// `id` served a request with these blocks.
    pub fn record(&mut self, blocks: &[u64], id: ReplicaId) {
        self.clock = self.clock.wrapping_add(1);
        if self.clock == 0 {
            // The clock wrapped (after 2^32 requests): stamps no longer order, start afresh.
            self.cur.clear();
            self.old.clear();
            self.horizons = Horizons::default();
            self.owned = Owned::default();
            self.clock = 1;
        }
        for &h in blocks {
            let slot = match self.cur.get_mut(&h) {
                Some(s) => s,
                None => {
                    let moved = self.old.remove(&h).unwrap_or_default();
                    self.cur.entry(h).or_insert(moved)
                }
            };
            let was = slot.owner();
            slot.put(id, self.clock);
            if was != Some(id) {
                if let Some(was) = was {
                    self.owned.sub(was);
                }
                self.owned.add(id);
            }
        }
        if self.cur.len() >= self.half {
            // The old generation is dropped: its blocks leave their owners' room (one pass
            // per `half` blocks recorded).
            for slot in self.old.values() {
                if let Some(was) = slot.owner() {
                    self.owned.sub(was);
                }
            }
            self.old = std::mem::replace(
                &mut self.cur,
                Map::with_capacity_and_hasher(self.half, FixedState::default()),
            );
        }
    }

    /// The index's clock: the stamp the next [`record`](Self::record) will use is above it.
    pub fn clock(&self) -> u32 {
        self.clock
    }

    /// `id`'s engine evicted what it served up to `stamp` (it no longer held a prefix it last
    /// served then): every block recorded under it no later than `stamp` is forgotten for it.
    pub fn evicted_up_to(&mut self, id: ReplicaId, stamp: u32) {
        self.horizons.raise(id, stamp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| seed << 32 | i).collect()
    }

    #[test]
    fn the_longest_recorded_prefix_and_its_replicas() {
        let mut ix = PrefixIndex::new(1024);
        let a = blocks(1, 10);
        ix.record(&a[..6], 7);
        ix.record(&a[..3], 9);
        assert_eq!(ix.longest(&a).0, 6);
        assert_eq!(ix.longest(&a).1.as_slice(), &[7]);
        assert_eq!(
            ix.longest(&a[..3]).1.as_slice(),
            &[9, 7],
            "most recent first"
        );
        assert_eq!(ix.longest(&blocks(2, 5)), (0, Replicas::default()));
        assert_eq!(ix.longest(&[]).0, 0);
    }

    #[test]
    fn an_eviction_forgets_what_the_replica_served_up_to_then_only() {
        let mut ix = PrefixIndex::new(1024);
        let (a, b, c) = (blocks(1, 4), blocks(2, 4), blocks(3, 4));
        ix.record(&a, 7);
        ix.record(&a, 8);
        ix.record(&b, 7);
        let b_stamp = ix.longest(&b).1.stamp_of(7).unwrap();
        ix.record(&c, 7);
        assert_eq!(ix.longest(&a).1.stamp_of(8), Some(2));
        assert_eq!(ix.longest(&b).1.stamp_of(8), None);
        // 7's engine no longer had `b`: `a` (older) is gone from it too, `c` (newer) is not,
        // and replica 8 keeps `a`.
        ix.evicted_up_to(7, b_stamp);
        assert_eq!(ix.longest(&a).0, 4);
        assert_eq!(ix.longest(&a).1.as_slice(), &[8]);
        assert_eq!(ix.longest(&b).0, 0);
        assert_eq!(ix.longest(&c).1.as_slice(), &[7]);
        // A horizon never moves back; what 7 serves afterwards is live again.
        ix.evicted_up_to(7, 1);
        assert_eq!(ix.longest(&b).0, 0);
        ix.record(&b, 7);
        assert_eq!(ix.longest(&b).1.as_slice(), &[7]);
        assert!(ix.clock() > b_stamp);
    }

    #[test]
    fn a_wrapped_clock_starts_afresh() {
        let mut ix = PrefixIndex::new(1024);
        ix.record(&blocks(1, 2), 7);
        ix.evicted_up_to(7, u32::MAX - 1);
        ix.clock = u32::MAX;
        ix.record(&blocks(2, 2), 7);
        assert_eq!(ix.clock(), 1);
        assert_eq!(ix.longest(&blocks(1, 2)).0, 0);
        assert_eq!(ix.longest(&blocks(2, 2)).1.as_slice(), &[7]);
    }

    #[test]
    fn a_block_keeps_the_most_recent_ways() {
        let mut ix = PrefixIndex::new(1024);
        let a = blocks(1, 1);
        for id in 1..=6 {
            ix.record(&a, id);
        }
        assert_eq!(ix.longest(&a).1.as_slice(), &[6, 5, 4, 3]);
        ix.record(&a, 4);
        assert_eq!(ix.longest(&a).1.as_slice(), &[4, 6, 5, 3]);
    }

    #[test]
    fn each_replica_owns_the_blocks_it_recorded_last() {
        let mut ix = PrefixIndex::new(1024);
        let (a, b) = (blocks(1, 6), blocks(2, 4));
        // (what, record, under, owned by 7, 8, 9 after it)
        let steps: &[(&str, &[u64], ReplicaId, [u64; 3])] = &[
            ("a placed on 7", &a, 7, [6, 0, 0]),
            ("again: nothing new", &a, 7, [6, 0, 0]),
            ("b on 8", &b, 8, [6, 4, 0]),
            ("a's first half moves to 9", &a[..3], 9, [3, 4, 3]),
            ("all of a to 8", &a, 8, [0, 10, 0]),
            ("b back to 7", &b, 7, [4, 6, 0]),
        ];
        for (what, rec, id, want) in steps {
            ix.record(rec, *id);
            assert_eq!([ix.owned(7), ix.owned(8), ix.owned(9)], *want, "{what}");
        }
        // Owned blocks add up to the blocks held; an evicted horizon does not change them.
        ix.evicted_up_to(8, ix.clock());
        assert_eq!(ix.owned(7) + ix.owned(8), ix.len() as u64);
    }

    #[test]
    fn owned_blocks_leave_with_the_generation_that_held_them() {
        let mut ix = PrefixIndex::new(64);
        for seed in 1..200 {
            ix.record(&blocks(seed, 8), (seed % 3) as ReplicaId);
            let total: u64 = (0..3).map(|id| ix.owned(id)).sum();
            assert_eq!(total, ix.len() as u64, "seed {seed}");
        }
        assert!(ix.len() <= 64);
    }

    #[test]
    fn memory_is_bounded_and_recent_prefixes_survive() {
        let mut ix = PrefixIndex::new(1024);
        let hot = blocks(0, 8);
        for seed in 1..2_000 {
            ix.record(&blocks(seed, 8), 1);
            if seed % 16 == 0 {
                ix.record(&hot, 2);
            }
            assert!(ix.len() <= 1024, "{}", ix.len());
        }
        assert_eq!(ix.longest(&hot).0, 8, "kept while in use");
        assert_eq!(ix.longest(&blocks(1, 8)).0, 0, "the oldest is gone");
        assert_eq!(ix.longest(&blocks(1999, 8)).0, 8);
    }
}
