//! The configured strategy around the pure core: the prefix index, the per-thread buffers a
//! choice uses, the decision and release counters, and learning from the engines' answers.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use prometheus::IntCounter;
use rand::Rng;
use tokio::time::Instant;

use super::decide::{decide, release_cause, Ask, Cand, Choice, Room};
use super::Reason;
use crate::config::{BalanceConfig, Strategy};
use crate::metrics::{Counters, Registrar};
use crate::upstream::prefix::{PrefixIndex, ReplicaId, WAYS};
use crate::upstream::release::Release;
use crate::upstream::shape::{Shape, BYTES_PER_TOKEN};
use crate::upstream::Replica;

/// What the prefix index believed of the chosen replica when it chose, checked against what
/// the engine reports it had cached ([`Balancer::learn`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Belief {
    pub id: ReplicaId,
    /// Blocks of the request's prefix the replica was expected to hold (0: none expected).
    pub blocks: usize,
    /// When it last served them (the index's clock).
    pub stamp: u32,
}

/// The buffers of a choice: the candidates' snapshot and the eligible list.
#[derive(Debug, Default)]
struct Scratch {
    cands: Vec<Cand>,
    elig: Vec<usize>,
}

thread_local! {
    /// One [`Scratch`] per thread, kept between choices (never larger than the largest replica
    /// set seen), so that choosing allocates nothing.
    static SCRATCH: Cell<Scratch> = const {
        Cell::new(Scratch {
            cands: Vec::new(),
            elig: Vec::new(),
        })
    };
}

/// `f` with this thread's [`Scratch`], taken out while `f` runs (a nested call, or a thread
/// exiting, gets new buffers: never a panic on the request path).
fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    let mut scratch = SCRATCH.try_with(Cell::take).unwrap_or_default();
    let out = f(&mut scratch);
    let _ = SCRATCH.try_with(|cell| cell.set(scratch));
    out
}

/// The configured strategy with its prefix index and decision counter.
#[derive(Debug)]
pub struct Balancer {
    pub cfg: BalanceConfig,
    index: Mutex<PrefixIndex>,
    /// `goodput_proxy_route_decisions_total`, one series per reason resolved once (every
    /// reason exists from the start, at 0): counting a decision is one atomic add.
    decisions: [IntCounter; Reason::ALL.len()],
    /// `goodput_proxy_route_releases_total`, one series per cause, resolved once.
    releases: [IntCounter; Release::ALL.len()],
}

impl Balancer {
    /// The balancer of `cfg`, its decision family registered with `r`.
    pub fn new(cfg: BalanceConfig, r: &Registrar) -> Result<Self, prometheus::Error> {
        let family: Counters<Reason> = r.counters(
            "goodput_proxy_route_decisions_total",
            "Replica choices by the balancer, by why the replica was chosen (each attempt of a retried request counts).",
        )?;
        let releases: Counters<Release> = r.counters(
            "goodput_proxy_route_releases_total",
            "Requests sent away from every replica holding their prompt's prefix (the prefix moves), by why its most recent holder was passed over.",
        )?;
        Ok(Balancer {
            index: Mutex::new(PrefixIndex::new(cfg.prefix_index_blocks)),
            cfg,
            decisions: Reason::ALL.map(|reason| family.get(&reason)),
            releases: Release::ALL.map(|cause| releases.get(&cause)),
        })
    }

    /// Counts one decision.
    pub fn count(&self, reason: Reason) {
        self.decisions[reason as usize].inc();
    }

    fn uses_prefix(&self) -> bool {
        matches!(self.cfg.strategy, Strategy::Prefix | Strategy::Auto)
    }

    /// Chooses among `cands` (never an `excluded` index) and, with a prefix strategy, records
    /// the request's blocks under the chosen replica; returns what the index believed that
    /// replica held (for [`Balancer::learn`]).
    pub fn choose<R: Rng + ?Sized>(
        &self,
        cands: &[Cand],
        shape: &Shape,
        excluded: &[usize],
        rng: &mut R,
    ) -> Option<(Choice, Belief)> {
        with_scratch(|s| self.choose_with(cands, shape, excluded, rng, &mut s.elig))
    }

    /// [`choose`](Self::choose) among `replicas` as they are at `now` (their snapshot is taken
    /// into a buffer kept per thread).
    pub fn choose_among<R: Rng + ?Sized>(
        &self,
        replicas: &[Arc<Replica>],
        now: Instant,
        shape: &Shape,
        excluded: &[usize],
        rng: &mut R,
    ) -> Option<(Choice, Belief)> {
        with_scratch(|s| {
            s.cands.clear();
            s.cands.extend(replicas.iter().map(|r| r.cand(now)));
            self.choose_with(&s.cands, shape, excluded, rng, &mut s.elig)
        })
    }

    /// [`choose`](Self::choose) with the eligible list's buffer.
    fn choose_with<R: Rng + ?Sized>(
        &self,
        cands: &[Cand],
        shape: &Shape,
        excluded: &[usize],
        rng: &mut R,
        scratch: &mut Vec<usize>,
    ) -> Option<(Choice, Belief)> {
        if !self.uses_prefix() || shape.blocks.len() < self.cfg.prefix_min_blocks {
            let choice = decide(
                &self.cfg,
                cands,
                &Ask {
                    excluded,
                    ..Ask::cold(shape)
                },
                rng,
                scratch,
            )?;
            return Some((choice, Belief::default()));
        }
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let (blocks, ids) = index.longest(&shape.blocks);
        let mut matched = [0usize; WAYS];
        let mut n = 0;
        for id in ids.as_slice() {
            if let Some(i) = cands.iter().position(|c| c.id == *id) {
                matched[n] = i;
                n += 1;
            }
        }
        let ask = Ask {
            shape,
            matched: &matched[..n],
            match_blocks: blocks,
            excluded,
            room: Room::Index(&index),
        };
        let choice = decide(&self.cfg, cands, &ask, rng, scratch)?;
        if n > 0 && blocks >= self.cfg.prefix_min_blocks && !ask.matched.contains(&choice.idx) {
            self.released(cands, &ask, choice);
        }
        let id = cands[choice.idx].id;
        let belief = match ids.stamp_of(id) {
            Some(stamp) => Belief { id, blocks, stamp },
            None => Belief::default(),
        };
        index.record(&shape.blocks, id);
        Some((choice, belief))
    }

    /// Counts (and logs at debug) a request sent away from its prefix's holders, by cause.
    #[cold]
    fn released(&self, cands: &[Cand], ask: &Ask, choice: Choice) {
        let cause = release_cause(&self.cfg, cands, ask);
        if let Some(cause) = cause {
            self.releases[cause as usize].inc();
        }
        let Some(h) = ask.matched.first().map(|&i| &cands[i]) else {
            return;
        };
        tracing::debug!(
            cause = cause.map_or("none", Release::as_str),
            holder = h.id,
            to = cands[choice.idx].id,
            reason = choice.reason.as_str(),
            blocks = ask.match_blocks,
            holder_tokens = h.tokens,
            holder_in_flight = h.in_flight,
            holder_waiting = h.waiting.unwrap_or(-1.0),
            holder_kv = h.kv.unwrap_or(-1.0),
            holder_attainment = h.attainment,
            holder_healthy = h.healthy,
            "prefix released"
        );
    }

    /// The engine of the replica chosen with `belief` served `prompt_tokens` prompt tokens,
    /// `cached_tokens` of them from its prefix cache. Well short of the prefix the index
    /// expected it to hold (under 3/4 of it: the estimate from prompt bytes is rough), the
    /// engine had evicted that prefix, and with it, least recently used first, everything it
    /// served before: the index forgets it for that replica (this request's blocks, just
    /// recorded, stay: the engine holds them again). Returns whether it learned an eviction.
    pub fn learn(
        &self,
        shape: &Shape,
        belief: &Belief,
        cached_tokens: u64,
        prompt_tokens: u64,
    ) -> bool {
        if belief.blocks == 0 || !self.uses_prefix() {
            return false;
        }
        // The engine's tokens for the expected prefix: its share of the prompt's bytes.
        let prompt_bytes = shape.prompt_tokens.saturating_mul(BYTES_PER_TOKEN);
        let prefix_bytes = (belief.blocks * self.cfg.prefix_block_bytes) as u64;
        if prompt_bytes == 0 {
            return false;
        }
        let expected = (prompt_tokens as u128 * prefix_bytes.min(prompt_bytes) as u128
            / prompt_bytes as u128) as u64;
        if cached_tokens.saturating_mul(4) >= expected.saturating_mul(3) {
            return false;
        }
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        index.evicted_up_to(belief.id, belief.stamp);
        true
    }

    /// Blocks the prefix index holds now.
    pub fn index_len(&self) -> usize {
        self.index.lock().map(|i| i.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
