//! The KV cache as vLLM V1 keeps it: a fixed pool of blocks of `block_size` tokens, and
//! automatic prefix caching over it. Each full block of a prompt is named by a chain hash (the
//! previous block's hash and this block's token ids), so a block is reused only when the whole
//! prefix up to it is the same. A request's blocks are held while it runs; when it ends they
//! join the free queue (its last block first, so a shared prefix outlives the tails that follow
//! it) but keep their contents, and a later request whose prefix hashes match takes them back
//! instead of recomputing them. Allocation takes the block at the head of the free queue, the
//! least recently freed, and forgets what it cached: LRU eviction.
//!
//! Unlike vLLM the simulator never waits for blocks or preempts: a request that does not fit
//! counts the missing blocks as overflow (usage is capped at 1).

use std::collections::{BTreeMap, HashMap};

use super::text::mix64;

/// Chain hashes of the prompt's full blocks, in order.
pub fn block_hashes(ids: &[u32], block_size: u64) -> Vec<u64> {
    let bs = block_size.max(1) as usize;
    let mut parent = 0x006b_7663_6163_6865_u64;
    ids.chunks_exact(bs)
        .map(|block| {
            let mut h = mix64(parent ^ 0x9e37_79b9_7f4a_7c15);
            for &t in block {
                h = mix64(h ^ t as u64);
            }
            parent = h;
            h
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Block {
    /// What the block holds, when it is a full prompt block that later requests may reuse.
    hash: Option<u64>,
    /// Running requests holding it.
    refs: u32,
    /// Its key in the free queue while `refs == 0`.
    stamp: u64,
}

/// The blocks one request holds, in order (prefix first).
#[derive(Debug, Default)]
pub struct Held {
    blocks: Vec<u32>,
    /// Blocks it needed beyond the pool.
    overflow: u64,
}

impl Held {
    fn count(&self) -> u64 {
        self.blocks.len() as u64 + self.overflow
    }

    /// Whether its blocks hold `tokens` tokens (asked without the pool's lock).
    pub fn fits(&self, tokens: u64, block_size: u64) -> bool {
        self.count() * block_size.max(1) >= tokens
    }
}

/// The block pool with its prefix cache.
#[derive(Debug)]
pub struct KvCache {
    block_size: u64,
    caching: bool,
    blocks: Vec<Block>,
    /// Free blocks by stamp: the smallest goes first.
    free: BTreeMap<u64, u32>,
    next_stamp: u64,
    by_hash: HashMap<u64, u32>,
    /// Blocks held by running requests, and the overflow beyond the pool.
    used: u64,
    overflow: u64,
}

impl KvCache {
    /// A pool of `capacity_tokens / block_size` blocks (at least one); `caching` off is
    /// vLLM's `--no-prefix-caching`.
    pub fn new(capacity_tokens: u64, block_size: u64, caching: bool) -> Self {
        let block_size = block_size.max(1);
        let n = (capacity_tokens / block_size).max(1) as u32;
        let blocks = vec![
            Block {
                hash: None,
                refs: 0,
                stamp: 0,
            };
            n as usize
        ];
        let mut cache = KvCache {
            block_size,
            caching,
            blocks,
            free: BTreeMap::new(),
            next_stamp: 0,
            by_hash: HashMap::new(),
            used: 0,
            overflow: 0,
        };
        for b in 0..n {
            cache.push_free(b);
        }
        cache
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Tokens the pool holds.
    pub fn capacity_tokens(&self) -> u64 {
        self.blocks.len() as u64 * self.block_size
    }

    /// Tokens' worth of blocks held by running requests (overflow included).
    pub fn used_tokens(&self) -> u64 {
        (self.used + self.overflow) * self.block_size
    }

    /// Blocks whose contents are cached (held or free), for tests and operators.
    pub fn cached_blocks(&self) -> usize {
        self.by_hash.len()
    }

    fn push_free(&mut self, b: u32) {
        self.next_stamp += 1;
        self.blocks[b as usize].stamp = self.next_stamp;
        self.free.insert(self.next_stamp, b);
    }

    fn take_ref(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        if blk.refs == 0 {
            self.free.remove(&blk.stamp);
            self.used += 1;
        }
        blk.refs += 1;
    }

    /// Cached prompt tokens for these hashes: the longest run of cached blocks from the start,
    /// at most `prompt_len - 1` tokens (the last prompt token is always computed, to get its
    /// logits), whole blocks only.
    pub fn lookup(&self, hashes: &[u64], prompt_len: u64) -> u64 {
        if !self.caching {
            return 0;
        }
        let max_blocks = (prompt_len.saturating_sub(1) / self.block_size) as usize;
        let hit = hashes
            .iter()
            .take(max_blocks)
            .take_while(|h| self.by_hash.contains_key(h))
            .count();
        hit as u64 * self.block_size
    }

    /// Admits a prompt of `prompt_len` tokens: takes its cached prefix blocks and allocates the
    /// rest. Returns the cached tokens (as [`lookup`](Self::lookup) counts them).
    pub fn admit(&mut self, hashes: &[u64], prompt_len: u64, held: &mut Held) -> u64 {
        let cached = self.lookup(hashes, prompt_len);
        let hit = (cached / self.block_size) as usize;
        for h in &hashes[..hit] {
            if let Some(&b) = self.by_hash.get(h) {
                self.take_ref(b);
                held.blocks.push(b);
            }
        }
        self.grow(held, prompt_len);
        cached
    }

    /// Grows a request's blocks to hold `tokens` tokens, evicting the least recently freed.
    pub fn grow(&mut self, held: &mut Held, tokens: u64) {
        let want = tokens.div_ceil(self.block_size);
        while held.count() < want {
            match self.free.pop_first() {
                Some((_, b)) => {
                    let blk = &mut self.blocks[b as usize];
                    if let Some(h) = blk.hash.take() {
                        self.by_hash.remove(&h);
                    }
                    blk.refs = 1;
                    self.used += 1;
                    held.blocks.push(b);
                }
                None => {
                    held.overflow += 1;
                    self.overflow += 1;
                }
            }
        }
    }

    /// The prompt's full blocks are computed: later requests may reuse them. A block whose
    /// contents another request cached meanwhile stays private (the first copy is kept).
    pub fn commit(&mut self, held: &Held, hashes: &[u64]) {
        if !self.caching {
            return;
        }
        for (h, &b) in hashes.iter().zip(&held.blocks) {
            let blk = &mut self.blocks[b as usize];
            if blk.hash.is_some() || self.by_hash.contains_key(h) {
                continue;
            }
            blk.hash = Some(*h);
            self.by_hash.insert(*h, b);
        }
    }

    /// The request ended: its blocks join the free queue, its last block first.
    pub fn free(&mut self, held: &mut Held) {
        let blocks = std::mem::take(&mut held.blocks);
        for &b in blocks.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            blk.refs = blk.refs.saturating_sub(1);
            if blk.refs == 0 {
                self.used -= 1;
                self.push_free(b);
            }
        }
        self.overflow -= held.overflow;
        held.overflow = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn hashes_chain_so_a_change_in_block_k_changes_blocks_k_onwards() {
        let a = ids(1, 64);
        let mut b = a.clone();
        b[35] = 7; // block 2 of 16-token blocks
        let (ha, hb) = (block_hashes(&a, 16), block_hashes(&b, 16));
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        assert!(ha[2..].iter().zip(&hb[2..]).all(|(x, y)| x != y));
        // Only full blocks are hashed.
        assert_eq!(block_hashes(&a[..47], 16).len(), 2);
        assert_eq!(block_hashes(&a, 16), block_hashes(&a.clone(), 16));
    }

    #[test]
    fn a_repeated_prefix_hits_in_whole_blocks_and_leaves_one_token_to_compute() {
        let cases: &[(usize, usize, u64)] = &[
            // (first prompt, second prompt sharing the first's tokens, cached tokens)
            (64, 64, 48), // all cached: the last block is recomputed for the last token
            (64, 70, 64),
            (40, 70, 32), // only the first's full blocks
            (10, 70, 0),  // no full block
        ];
        for &(first, second, want) in cases {
            let mut c = KvCache::new(1024, 16, true);
            let long = ids(3, 100);
            let mut a = Held::default();
            let ha = block_hashes(&long[..first], 16);
            assert_eq!(c.admit(&ha, first as u64, &mut a), 0);
            c.commit(&a, &ha);
            c.free(&mut a);
            let hb = block_hashes(&long[..second], 16);
            let mut b = Held::default();
            assert_eq!(
                c.admit(&hb, second as u64, &mut b),
                want,
                "{first} {second}"
            );
            c.free(&mut b);
        }
    }

    #[test]
    fn nothing_is_cached_before_commit_or_with_caching_off() {
        let p = ids(1, 64);
        let h = block_hashes(&p, 16);
        let mut c = KvCache::new(1024, 16, true);
        let mut a = Held::default();
        c.admit(&h, 64, &mut a);
        assert_eq!(c.lookup(&h, 80), 0, "still prefilling");
        c.commit(&a, &h);
        assert_eq!(c.lookup(&h, 80), 64);
        let mut off = KvCache::new(1024, 16, false);
        let mut a = Held::default();
        off.admit(&h, 64, &mut a);
        off.commit(&a, &h);
        off.free(&mut a);
        assert_eq!(off.lookup(&h, 80), 0);
    }

    #[test]
    fn eviction_takes_the_least_recently_freed_blocks_first() {
        // 8 blocks of 16: three 32-token prompts fit as cache (2 blocks each) beside one running.
        let mut c = KvCache::new(128, 16, true);
        let prompts: Vec<Vec<u32>> = (1..=4).map(|s| ids(s, 33)).collect();
        let hashes: Vec<Vec<u64>> = prompts.iter().map(|p| block_hashes(p, 16)).collect();
        for h in &hashes[..3] {
            let mut r = Held::default();
            c.admit(h, 33, &mut r); // 3 blocks: 2 full + 1 partial
            c.commit(&r, h);
            c.free(&mut r);
        }
        assert_eq!(c.cached_blocks(), 6);
        // Prompt 0 is used again: it becomes the most recent.
        let mut r = Held::default();
        assert_eq!(c.admit(&hashes[0], 33, &mut r), 32);
        c.free(&mut r);
        // A new one-block request takes the least recently freed block: prompt 1's last full
        // block (each request frees its tail before its head).
        let mut big = Held::default();
        let hb = block_hashes(&prompts[3][..16], 16);
        c.admit(&hb, 16, &mut big);
        assert_eq!(c.lookup(&hashes[0], 33), 32, "recently used survives");
        assert_eq!(c.lookup(&hashes[2], 33), 32, "later freed survives");
        assert_eq!(c.lookup(&hashes[1], 33), 16, "oldest loses its tail first");
        c.free(&mut big);
    }

    #[test]
    fn usage_counts_held_blocks_and_overflow_and_returns_to_zero() {
        let mut c = KvCache::new(64, 16, true);
        let p = ids(1, 100);
        let h = block_hashes(&p, 16);
        let mut a = Held::default();
        c.admit(&h, 100, &mut a); // 7 blocks of a pool of 4
        assert_eq!(c.used_tokens(), 7 * 16);
        c.grow(&mut a, 113);
        assert_eq!(c.used_tokens(), 8 * 16);
        assert!(a.fits(128, 16));
        assert!(!a.fits(129, 16));
        c.free(&mut a);
        assert_eq!(c.used_tokens(), 0);
        assert_eq!(c.capacity_tokens(), 64);
    }

    #[test]
    fn shared_blocks_stay_held_until_every_holder_ends() {
        let mut c = KvCache::new(1024, 16, true);
        let p = ids(1, 40);
        let h = block_hashes(&p, 16);
        let mut a = Held::default();
        c.admit(&h, 40, &mut a);
        c.commit(&a, &h);
        let mut b = Held::default();
        assert_eq!(c.admit(&h, 40, &mut b), 32);
        // 3 blocks for a, 2 shared + 1 own for b.
        assert_eq!(c.used_tokens(), 4 * 16);
        c.free(&mut a);
        assert_eq!(c.used_tokens(), 3 * 16);
        c.free(&mut b);
        assert_eq!(c.used_tokens(), 0);
    }
}
