//! The pure core of the replica choice: candidates and what the request asks in, a choice out
//! (see the parent module for the strategies).

use std::cell::OnceCell;

use rand::Rng;

use super::Reason;
use crate::config::{BalanceConfig, Strategy};
use crate::upstream::prefix::{PrefixIndex, ReplicaId};
use crate::upstream::release::Release;
use crate::upstream::shape::Shape;

/// One replica as the choice sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    pub id: ReplicaId,
    pub healthy: bool,
    /// This proxy's requests in flight there.
    pub in_flight: usize,
    /// Their estimated tokens (prompt + output).
    pub tokens: u64,
    /// The engine's waiting queue and KV-cache use from its last scrape (`None`: unknown).
    pub waiting: Option<f64>,
    pub kv: Option<f64>,
    /// Recent SLO attainment, 0..1.
    pub attainment: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub idx: usize,
    pub reason: Reason,
}

/// How far below the best attainment a replica may be and still keep `auto`'s prefix affinity
/// (and be open to a new prefix). Wide enough that a healthy replica whose streams a few cold
/// prefills slowed keeps its prefixes (a handful of bad verdicts: 0.55-0.8 in the shared-prefix
/// benchmark, and each move it caused started more cold prefills elsewhere), narrow enough that
/// one that misses every request loses them after about ten verdicts (0.9^9 < 0.4).
const AUTO_ATTAINMENT_GAP: f64 = 0.4;

/// `ALL[i] == i`: the eligible list when every candidate is eligible, written nowhere.
const ALL: [usize; 256] = {
    let mut all = [0; 256];
    let mut i = 0;
    while i < all.len() {
        all[i] = i;
        i += 1;
    }
    all
};

/// The candidates `excluded` leaves, healthy ones only when there are any (in `out` when some
/// are left out; the common case, all of them, is a slice of [`ALL`]).
fn eligible<'a>(cands: &[Cand], excluded: &[usize], out: &'a mut Vec<usize>) -> &'a [usize] {
    if excluded.is_empty() && cands.len() <= ALL.len() && cands.iter().all(|c| c.healthy) {
        return &ALL[..cands.len()];
    }
    out.clear();
    out.extend((0..cands.len()).filter(|i| cands[*i].healthy && !excluded.contains(i)));
    if out.is_empty() {
        out.extend((0..cands.len()).filter(|i| !excluded.contains(i)));
    }
    out
}

/// Load in tokens on candidate `c` before it takes a request of `req` tokens: this proxy's
/// requests in flight there plus the engine's waiting queue counted in requests like it.
fn base_load(c: &Cand, req: f64) -> f64 {
    c.tokens as f64 + c.waiting.unwrap_or(0.0).max(0.0) * req
}

/// Load in tokens of candidate `c` if it took `shape` cold (nothing of it cached there).
fn load(c: &Cand, shape: &Shape) -> f64 {
    let req = shape.tokens().max(1) as f64;
    base_load(c, req) + req
}

/// Two distinct random candidates of `elig`, the lower `score` wins.
fn two_choices<R: Rng + ?Sized>(
    elig: &[usize],
    rng: &mut R,
    score: impl Fn(usize) -> f64,
) -> usize {
    let n = elig.len();
    let a = rng.random_range(0..n);
    let mut b = rng.random_range(0..n - 1);
    if b >= a {
        b += 1;
    }
    let (a, b) = (elig[a], elig[b]);
    if score(b) < score(a) {
        b
    } else {
        a
    }
}

/// A random replica for the exploration share, while the replicas' attainments differ (the
/// weighted score keeps traffic away from the lower ones, so only exploration shows that one
/// recovered), and never one whose engine is saturated (a deep queue or a full KV cache would
/// fail the request, not measure the replica). `None` when every replica is at the best
/// attainment: the load score already treats them alike, and a random pick would only send
/// requests past a shorter queue. Uniform over the rest, not aimed at the lower replicas: aimed,
/// the share landed on replicas whose caches did not hold the requests' prefixes, and `auto`
/// lost its affinity on a shared-prefix workload (docs/routing.md).
fn explore<R: Rng + ?Sized>(
    cfg: &BalanceConfig,
    cands: &[Cand],
    elig: &[usize],
    rng: &mut R,
) -> Option<usize> {
    let best = elig
        .iter()
        .map(|&i| cands[i].attainment)
        .fold(0.0, f64::max);
    if elig.iter().all(|&i| cands[i].attainment >= best) {
        return None;
    }
    let open = |i: &usize| !engine_saturated(cfg, &cands[*i]);
    let n = elig.iter().filter(|i| open(i)).count();
    if n == 0 {
        return None;
    }
    elig.iter()
        .copied()
        .filter(open)
        .nth(rng.random_range(0..n))
}

/// Whether `c`'s engine says it is saturated: a queue of `saturation_queue` requests
/// ([`queue_full`]), or a KV cache fuller than `saturation_kv` while requests wait
/// ([`kv_full`]).
fn engine_saturated(cfg: &BalanceConfig, c: &Cand) -> bool {
    queue_full(cfg, c) || kv_full(cfg, c)
}

fn queue_full(cfg: &BalanceConfig, c: &Cand) -> bool {
    c.waiting
        .is_some_and(|w| w >= cfg.saturation_queue.max(1.0))
}

/// A KV cache fuller than `saturation_kv` with at least one request waiting (or the queue
/// unknown). A full cache alone is no saturation: the engine's KV use counts the blocks its
/// running requests hold, and while it still admits every request (nothing waits) a full
/// cache costs no client anything; it does when requests wait for blocks (vLLM keeps them
/// queued, or preempts a running one back into the queue). Read alone, from a scrape up to an
/// interval old, a full cache released every prefix its replica held within one reading, each
/// move a cold prefill that filled another cache in turn (docs/routing.md).
fn kv_full(cfg: &BalanceConfig, c: &Cand) -> bool {
    c.kv.is_some_and(|k| k >= cfg.saturation_kv) && c.waiting.is_none_or(|w| w >= 1.0)
}

/// What a request of `shape` brings to a replica holding its first `match_blocks` blocks, and
/// to any other (cold), in tokens.
fn warm_and_full(cfg: &BalanceConfig, shape: &Shape, match_blocks: usize) -> (f64, f64) {
    let full = shape.tokens().max(1) as f64;
    let warm = shape
        .uncached_tokens(match_blocks, cfg.prefix_block_bytes)
        .max(1) as f64;
    (warm, full)
}

/// Whether holder `c` is open to the prefix by its own figures alone, whatever the other
/// candidates: its engine not saturated, its load with the request (`warm`) within
/// `saturation_ratio` + 1 cold requests (`full`: the mean load with the request is at least
/// one, so the bound is at least that), and, for auto, an attainment within the gap of 1 (so
/// of the best). `false` says only that the others must be looked at.
fn surely_open(cfg: &BalanceConfig, c: &Cand, warm: f64, full: f64) -> bool {
    !engine_saturated(cfg, c)
        && base_load(c, full) + warm <= (cfg.saturation_ratio + 1.0) * full
        && (cfg.strategy == Strategy::Prefix || c.attainment >= 1.0 - AUTO_ATTAINMENT_GAP)
}

/// The common prefix hit, found without a pass over every candidate: the most recent eligible
/// holder, open by its own figures, while another candidate is eligible (else the choice is
/// `Only`). `decide` would choose the same; `None` leaves it to `decide`'s full path. A healthy
/// holder is eligible whatever the others; an unhealthy one only when none is healthy, which
/// the full path sorts out.
fn quick_hit(cfg: &BalanceConfig, cands: &[Cand], ask: &Ask) -> Option<Choice> {
    let excluded = ask.excluded;
    let &h = ask
        .matched
        .iter()
        .find(|&&i| cands[i].healthy && !excluded.contains(&i))?;
    let (warm, full) = warm_and_full(cfg, ask.shape, ask.match_blocks);
    if !surely_open(cfg, &cands[h], warm, full) {
        return None;
    }
    let another = cands
        .iter()
        .enumerate()
        .any(|(i, c)| i != h && c.healthy && !excluded.contains(&i));
    another.then_some(Choice {
        idx: h,
        reason: Reason::PrefixHit,
    })
}

/// What one request asks of the choice: its shape, the candidates holding its longest recorded
/// prefix (`matched`, most recent first) and that prefix's length in blocks, the candidates it
/// must not go to (replicas already tried), and per candidate the cache room the prefixes the
/// index places there take ([`Room`]).
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub shape: &'a Shape,
    pub matched: &'a [usize],
    pub match_blocks: usize,
    pub excluded: &'a [usize],
    pub room: Room<'a>,
}

/// The cache room the prefixes placed on each candidate take, in blocks: what a placement
/// compares. Read only for the candidates a placement considers, so a choice that places
/// nothing (most of them) looks up none.
#[derive(Debug, Clone, Copy)]
pub enum Room<'a> {
    /// Unknown: all alike.
    Unknown,
    /// Per candidate, as `cands` (missing: 0).
    Each(&'a [u64]),
    /// The prefix index's count for the candidate's id ([`PrefixIndex::owned`]).
    Index(&'a PrefixIndex),
}

impl Room<'_> {
    fn of(&self, cands: &[Cand], i: usize) -> u64 {
        match self {
            Room::Unknown => 0,
            Room::Each(room) => room.get(i).copied().unwrap_or(0),
            Room::Index(index) => index.owned(cands[i].id),
        }
    }
}

impl<'a> Ask<'a> {
    /// A request with no recorded prefix and no replica excluded.
    pub fn cold(shape: &'a Shape) -> Self {
        Ask {
            shape,
            matched: &[],
            match_blocks: 0,
            excluded: &[],
            room: Room::Unknown,
        }
    }
}

/// The choice for `ask`; `scratch` is reused between calls. The common prefix hit is found
/// without a pass over the candidates ([`quick_hit`]), the rest by the full path.
pub fn decide<R: Rng + ?Sized>(
    cfg: &BalanceConfig,
    cands: &[Cand],
    ask: &Ask,
    rng: &mut R,
    scratch: &mut Vec<usize>,
) -> Option<Choice> {
    let prefix = matches!(cfg.strategy, Strategy::Prefix | Strategy::Auto);
    if prefix && ask.match_blocks >= cfg.prefix_min_blocks {
        if let Some(hit) = quick_hit(cfg, cands, ask) {
            return Some(hit);
        }
    }
    decide_full(cfg, cands, ask, rng, scratch)
}

/// [`decide`] without its quick path.
fn decide_full<R: Rng + ?Sized>(
    cfg: &BalanceConfig,
    cands: &[Cand],
    ask: &Ask,
    rng: &mut R,
    scratch: &mut Vec<usize>,
) -> Option<Choice> {
    let Ask {
        shape,
        matched,
        match_blocks,
        excluded,
        room,
    } = *ask;
    let strategy = cfg.strategy;
    let prefix = matches!(strategy, Strategy::Prefix | Strategy::Auto);
    let elig = eligible(cands, excluded, scratch);
    let pick = |idx, reason| Some(Choice { idx, reason });
    match elig.len() {
        0 => return None,
        1 => return pick(elig[0], Reason::Only),
        _ => {}
    }
    if strategy == Strategy::P2c {
        let score = |i: usize| {
            let c = &cands[i];
            (c.in_flight + c.waiting.map_or(0, |w| w.max(0.0).round() as usize)) as f64
        };
        return pick(two_choices(elig, rng, score), Reason::P2c);
    }
    let explores = matches!(strategy, Strategy::Goodput | Strategy::Auto);
    // Eligible, as `eligible` chose (no scan of `elig`): not excluded, and healthy unless none
    // is.
    let any_healthy = cands[elig[0]].healthy;
    let held = || {
        matched
            .iter()
            .copied()
            .filter(move |i| !excluded.contains(i) && (cands[*i].healthy || !any_healthy))
    };
    let affine = prefix && match_blocks >= cfg.prefix_min_blocks && held().next().is_some();
    // A request whose prefix is cached somewhere is not explored with: elsewhere it would pay
    // a cold prefill, measure the explored replica by a cache miss, and teach the prefix
    // index a holder that its prefix's order may then prefer.
    if explores && !affine && cfg.exploration > 0.0 && rng.random::<f64>() < cfg.exploration {
        if let Some(i) = explore(cfg, cands, elig, rng) {
            return pick(i, Reason::Explore);
        }
    }
    let weighted = explores && cfg.attainment_weight > 0.0;
    let score = |i: usize| {
        let c = &cands[i];
        let l = load(c, shape);
        if weighted {
            l / c.attainment.clamp(0.01, 1.0).powf(cfg.attainment_weight)
        } else {
            l
        }
    };
    let fallback = if weighted {
        Reason::Goodput
    } else {
        Reason::LeastLoad
    };
    let full = shape.tokens().max(1) as f64;
    // The mean load and the best attainment take a pass over every candidate each, made only
    // when a holder's own figures do not settle the choice (`surely_open`), or to place a
    // prefix.
    let limit = OnceCell::new();
    let limit = || {
        *limit.get_or_init(|| {
            let sum: f64 = elig.iter().map(|&i| base_load(&cands[i], full)).sum();
            cfg.saturation_ratio * (sum / elig.len() as f64 + full) + full
        })
    };
    let best_att = OnceCell::new();
    let best_att = || {
        *best_att.get_or_init(|| {
            elig.iter()
                .map(|&i| cands[i].attainment)
                .fold(0.0, f64::max)
        })
    };
    // Where a prefix cached nowhere, or moved off its saturated holders, goes: of the replicas
    // open to it cold (engine not saturated, load with the request within the bound, for auto
    // an attainment within the gap of the best), the one whose cache the prefixes already
    // placed there take least (`room`), the lower load on a tie. Spread by room, the hot
    // prefixes share the caches out evenly and no replica is given more than its cache holds
    // beside its running requests (placed by two random choices on load, one replica could get
    // three or four of eight long prompts, fill its KV cache and release them again). Not
    // herding: the room a placement takes counts at once (the index records it with the
    // choice), so the next new prefix goes elsewhere. `None`: none is open.
    let place = |among: &mut dyn Iterator<Item = usize>| {
        among
            .filter(|&i| {
                let c = &cands[i];
                !engine_saturated(cfg, c)
                    && base_load(c, full) + full <= limit()
                    && (strategy == Strategy::Prefix
                        || c.attainment >= best_att() - AUTO_ATTAINMENT_GAP)
            })
            .map(|i| (room.of(cands, i), i))
            .min_by(|&(ra, a), &(rb, b)| ra.cmp(&rb).then(score(a).total_cmp(&score(b))))
            .map(|(_, i)| i)
    };
    if affine {
        // Sticky until saturated, on what the request really costs: on a holder it brings
        // only the tokens its cache lacks (the rest of the prompt and the output), elsewhere
        // its whole prompt again; the requests in flight are counted the same way
        // (`Replica::start_cached`). A holder keeps the prefix while its load with the
        // request at that cost stays within `saturation_ratio` x the mean load with the
        // request (cold) plus one cold request; past that, or when its engine's own signals
        // (queue, KV cache) say so, it is saturated. Counted at whole prompts, a few cheap
        // cached requests in flight at low concurrency read as saturation, and every move
        // was a cold prefill (docs/routing.md).
        let (warm, _) = warm_and_full(cfg, shape, match_blocks);
        // Open to the prefix: not saturated and, for auto, meeting its SLOs about as well as
        // the best.
        let open = |i: usize| {
            let c = &cands[i];
            surely_open(cfg, c, warm, full)
                || (!engine_saturated(cfg, c)
                    && base_load(c, full) + warm <= limit()
                    && (strategy == Strategy::Prefix
                        || c.attainment >= best_att() - AUTO_ATTAINMENT_GAP))
        };
        // The most recent holder that is open: the one whose cache most likely still holds
        // the prefix (engines evict the least recently used), and the one the prefix's traffic
        // stays on. Not the least loaded holder: that shared a prefix's traffic between all
        // its holders, so every spill added a replica that kept it cached for good, until
        // every prefix was on every replica and the small caches evicted each other's. Here
        // a spill moves the prefix (the new replica is its most recent holder), and the
        // replicas it left let it age out.
        if let Some(i) = held().find(|&i| open(i)) {
            return pick(i, Reason::PrefixHit);
        }
        // Spilled: placed anew, else (every replica saturated) by load.
        let i = place(&mut elig.iter().copied()).unwrap_or_else(|| two_choices(elig, rng, score));
        return pick(i, Reason::PrefixSaturated);
    }
    if prefix && shape.blocks.len() >= cfg.prefix_min_blocks {
        // A long prompt cached nowhere: its prefix is placed.
        if let Some(i) = place(&mut elig.iter().copied()) {
            return pick(i, fallback);
        }
    }
    pick(two_choices(elig, rng, score), fallback)
}

/// Why a request whose prefix is held by `ask.matched` went elsewhere: the first of the
/// saturation tests [`decide`] applies that its most recent eligible holder failed, or why no
/// holder was eligible. `None` when that holder was open after all (the choice did not leave
/// it for any reason this knows).
pub fn release_cause(cfg: &BalanceConfig, cands: &[Cand], ask: &Ask) -> Option<Release> {
    let excluded = ask.excluded;
    let any_healthy = cands
        .iter()
        .enumerate()
        .any(|(i, c)| c.healthy && !excluded.contains(&i));
    let Some(&h) = ask
        .matched
        .iter()
        .find(|&&i| !excluded.contains(&i) && (cands[i].healthy || !any_healthy))
    else {
        let tried = ask.matched.iter().all(|i| excluded.contains(i));
        return Some(if tried {
            Release::Excluded
        } else {
            Release::Unhealthy
        });
    };
    let c = &cands[h];
    if queue_full(cfg, c) {
        return Some(Release::Queue);
    }
    if kv_full(cfg, c) {
        return Some(Release::Kv);
    }
    let (warm, full) = warm_and_full(cfg, ask.shape, ask.match_blocks);
    let mut scratch = Vec::new();
    let elig = eligible(cands, excluded, &mut scratch);
    let n = elig.len().max(1) as f64;
    let sum: f64 = elig.iter().map(|&i| base_load(&cands[i], full)).sum();
    let limit = cfg.saturation_ratio * (sum / n + full) + full;
    if base_load(c, full) + warm > limit {
        return Some(Release::Load);
    }
    let best = elig
        .iter()
        .map(|&i| cands[i].attainment)
        .fold(0.0, f64::max);
    if cfg.strategy == Strategy::Auto && c.attainment < best - AUTO_ATTAINMENT_GAP {
        return Some(Release::Attainment);
    }
    None
}

#[cfg(test)]
mod tests;
