//! The prefix index: which replicas recently served a prompt prefix block, bounded in memory.
//!
//! Each block hash (see `shape.rs`) maps to up to [`WAYS`] replicas with the time they last
//! served it. A request's blocks are recorded under the replica chosen for it; a later request
//! looks for its longest recorded prefix (a chain hash of block k implies blocks 0..k, so the
//! recorded blocks of a prompt form a prefix and a binary search finds its end).
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

/// A replica's identity in the index (stable while it is in the set).
pub type ReplicaId = u32;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    ids: [ReplicaId; WAYS],
    /// When each way was last recorded (0: empty).
    stamps: [u32; WAYS],
}

impl Slot {
    fn put(&mut self, id: ReplicaId, stamp: u32) {
        let way = (0..WAYS)
            .find(|&w| self.stamps[w] != 0 && self.ids[w] == id)
            .unwrap_or_else(|| (0..WAYS).min_by_key(|&w| self.stamps[w]).unwrap_or(0));
        self.ids[way] = id;
        self.stamps[way] = stamp;
    }

    fn remove(&mut self, id: ReplicaId) {
        for w in 0..WAYS {
            if self.ids[w] == id {
                self.stamps[w] = 0;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.stamps.iter().all(|&s| s == 0)
    }

    /// Its replicas, most recent first.
    fn replicas(&self) -> Replicas {
        let mut ways: [usize; WAYS] = std::array::from_fn(|w| w);
        ways.sort_unstable_by(|&a, &b| self.stamps[b].cmp(&self.stamps[a]));
        let mut out = Replicas::default();
        for w in ways {
            if self.stamps[w] != 0 {
                out.ids[out.len] = self.ids[w];
                out.len += 1;
            }
        }
        out
    }
}

/// Up to [`WAYS`] replica ids, most recent first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replicas {
    ids: [ReplicaId; WAYS],
    len: usize,
}

impl Replicas {
    pub fn as_slice(&self) -> &[ReplicaId] {
        &self.ids[..self.len]
    }
}

type Map = HashMap<u64, Slot, FixedState>;

#[derive(Debug)]
pub struct PrefixIndex {
    cur: Map,
    old: Map,
    half: usize,
    clock: u32,
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
        }
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
            .filter(|s| !s.is_empty())
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
                    .map(Slot::replicas)
                    .unwrap_or_default(),
            ),
        }
    }

    /// `id` served a request with these blocks.
    pub fn record(&mut self, blocks: &[u64], id: ReplicaId) {
        self.clock = self.clock.wrapping_add(1).max(1);
        for &h in blocks {
            let slot = match self.cur.get_mut(&h) {
                Some(s) => s,
                None => {
                    let moved = self.old.remove(&h).unwrap_or_default();
                    self.cur.entry(h).or_insert(moved)
                }
            };
            slot.put(id, self.clock);
        }
        if self.cur.len() >= self.half {
            self.old = std::mem::replace(
                &mut self.cur,
                Map::with_capacity_and_hasher(self.half, FixedState::default()),
            );
        }
    }

    /// `id` no longer holds these blocks (its engine reported them not cached).
    pub fn forget(&mut self, blocks: &[u64], id: ReplicaId) {
        for h in blocks {
            for map in [&mut self.cur, &mut self.old] {
                if let Some(s) = map.get_mut(h) {
                    s.remove(id);
                }
            }
        }
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
        ix.forget(&a, 7);
        assert_eq!(ix.longest(&a).0, 3);
        assert_eq!(ix.longest(&a).1.as_slice(), &[9]);
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
