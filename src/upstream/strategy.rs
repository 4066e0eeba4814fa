//! The replica choice for one request, by `[balance] strategy` (docs/routing.md):
//!
//! - `p2c`: two random candidates, fewer requests in flight plus engine queue wins: near
//!   least-loaded without the herd behaviour of always picking the global minimum. A request
//!   waiting in the engine queue counts twice on purpose: at equal in-flight the replica whose
//!   engine already queues loses, and traffic it gets from elsewhere shows up at all.
//! - `prefix`: the replicas that recently served the request's longest prefix (at least
//!   `prefix_min_blocks` blocks) are tried first, the most recent first, unless all are
//!   saturated ("sticky until saturated"); otherwise power of two choices on load in tokens
//!   (and the replica chosen becomes the prefix's most recent holder: it moves there).
//! - `goodput`: power of two choices on load in tokens divided by the replica's recent SLO
//!   attainment (to the power `attainment_weight`), plus an `exploration` share sent to a
//!   random replica (not saturated) while attainments differ, so that a replica that
//!   recovered earns traffic back.
//! - `auto`: `prefix` among the replicas whose attainment is within 0.4 of the best, `goodput`
//!   otherwise, with the same exploration share.
//!
//! Load in tokens of a replica: the estimated prompt and output tokens of this proxy's requests
//! in flight there, plus the engine's waiting queue counted in requests like this one. Healthy
//! replicas are preferred; when none is healthy every candidate is tried.
//!
//! [`decide`] is the pure core (candidates and the prefix lookup in, a choice out), table-tested
//! below; [`Balancer`] adds the prefix index around it.

use std::cell::{Cell, OnceCell};
use std::sync::{Arc, Mutex};

use prometheus::IntCounter;
use rand::Rng;
use tokio::time::Instant;

use super::prefix::{PrefixIndex, ReplicaId};
use super::release::Release;
use super::shape::Shape;
use super::Replica;
use crate::config::{BalanceConfig, Strategy};
use crate::metrics::{Counters, Registrar};

/// Why a replica was chosen (the `reason` label of `goodput_proxy_route_decisions_total` and
/// the record's `route_reason`).
pub use goodput_measure::record::RouteReason as Reason;

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
        let mut matched = [0usize; super::prefix::WAYS];
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
        let prompt_bytes = shape
            .prompt_tokens
            .saturating_mul(super::shape::BYTES_PER_TOKEN);
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
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn cand(id: u32, tokens: u64) -> Cand {
        Cand {
            id,
            healthy: true,
            in_flight: (tokens / 100) as usize,
            tokens,
            waiting: Some(0.0),
            kv: Some(0.1),
            attainment: 1.0,
        }
    }

    fn balancer(cfg: BalanceConfig) -> Balancer {
        Balancer::new(cfg, &Registrar::new(&prometheus::Registry::new())).unwrap()
    }

    fn cfg(strategy: Strategy) -> BalanceConfig {
        BalanceConfig {
            strategy,
            exploration: 0.0,
            prefix_min_blocks: 2,
            ..BalanceConfig::default()
        }
    }

    fn shape(blocks: usize) -> Shape {
        Shape {
            blocks: (0..blocks as u64).collect(),
            prompt_tokens: 100,
            output_tokens: 100,
        }
    }

    fn run(
        cfg: &BalanceConfig,
        cands: &[Cand],
        matched: &[usize],
        blocks: usize,
        excluded: &[usize],
    ) -> Option<Choice> {
        let mut rng = SmallRng::seed_from_u64(5);
        decide(
            cfg,
            cands,
            &Ask {
                shape: &shape(blocks),
                matched,
                match_blocks: blocks,
                excluded,
                room: Room::Unknown,
            },
            &mut rng,
            &mut Vec::new(),
        )
    }

    #[test]
    fn prefix_affinity_is_sticky_until_saturated() {
        let c = cfg(Strategy::Prefix);
        let hit = Some(Choice {
            idx: 2,
            reason: Reason::PrefixHit,
        });
        let cases: Vec<(&str, Vec<Cand>, Option<Choice>)> = vec![
            (
                "idle cluster: the match wins",
                vec![cand(0, 0), cand(1, 0), cand(2, 0)],
                hit,
            ),
            (
                "busier than the others, not saturated: still the match",
                vec![cand(0, 400), cand(1, 400), cand(2, 900)],
                hit,
            ),
            (
                "far above the mean: released",
                vec![cand(0, 200), cand(1, 200), cand(2, 5_000)],
                Some(Choice {
                    idx: 0,
                    reason: Reason::PrefixSaturated,
                }),
            ),
            (
                "its engine queues: released",
                vec![
                    cand(0, 0),
                    cand(1, 0),
                    Cand {
                        waiting: Some(4.0),
                        ..cand(2, 0)
                    },
                ],
                Some(Choice {
                    idx: 0,
                    reason: Reason::PrefixSaturated,
                }),
            ),
            (
                "its KV cache is full and a request waits: released",
                vec![
                    cand(0, 0),
                    cand(1, 0),
                    Cand {
                        kv: Some(0.97),
                        waiting: Some(1.0),
                        ..cand(2, 0)
                    },
                ],
                Some(Choice {
                    idx: 0,
                    reason: Reason::PrefixSaturated,
                }),
            ),
            (
                "its KV cache is full, nothing waits: it still admits, kept",
                vec![
                    cand(0, 0),
                    cand(1, 0),
                    Cand {
                        kv: Some(0.97),
                        ..cand(2, 0)
                    },
                ],
                hit,
            ),
            (
                "its KV cache is full, its queue unknown: released",
                vec![
                    cand(0, 0),
                    cand(1, 0),
                    Cand {
                        kv: Some(0.97),
                        waiting: None,
                        ..cand(2, 0)
                    },
                ],
                Some(Choice {
                    idx: 0,
                    reason: Reason::PrefixSaturated,
                }),
            ),
            (
                "unhealthy: not a candidate",
                vec![
                    cand(0, 0),
                    cand(1, 0),
                    Cand {
                        healthy: false,
                        ..cand(2, 0)
                    },
                ],
                Some(Choice {
                    idx: 0,
                    reason: Reason::LeastLoad,
                }),
            ),
        ];
        for (what, cands, want) in cases {
            let got = run(&c, &cands, &[2], 3, &[]);
            assert_eq!(got.map(|g| g.reason), want.map(|w| w.reason), "{what}");
            if want.map(|w| w.reason) == Some(Reason::PrefixHit) {
                assert_eq!(got, want, "{what}");
            } else {
                assert_ne!(got.map(|g| g.idx), Some(2), "{what}");
            }
        }
        // Too short a match, or none: load decides.
        let cands = [cand(0, 0), cand(1, 0), cand(2, 0)];
        assert_eq!(
            run(&c, &cands, &[2], 1, &[]).unwrap().reason,
            Reason::LeastLoad
        );
        assert_eq!(
            run(&c, &cands, &[], 0, &[]).unwrap().reason,
            Reason::LeastLoad
        );
    }

    #[test]
    fn a_holder_is_saturated_by_what_its_requests_cost_it() {
        // A long shared prompt (3,100 estimated tokens, 48 blocks of 64 tokens cached) with a
        // short question and 30 output tokens: 58 tokens on its holder, 3,130 elsewhere. The
        // balancer counts requests in flight the same way (`Replica::start_cached`).
        let c = cfg(Strategy::Prefix);
        let s = Shape {
            blocks: (0..48).collect(),
            prompt_tokens: 3_100,
            output_tokens: 30,
        };
        let (warm, cold) = (58u64, 3_130u64);
        let at = |tokens: u64, waiting: Option<f64>, kv: Option<f64>| Cand {
            tokens,
            waiting,
            kv,
            ..cand(0, 0)
        };
        let idle = at(0, Some(0.0), Some(0.1));
        // (what, the holder, the other two's tokens in flight, released)
        type Case = (&'static str, Cand, [u64; 2], bool);
        let cases: Vec<Case> = vec![
            ("idle cluster", idle, [0, 0], false),
            (
                "a burst of 8 cached requests at low concurrency: cheap for the holder",
                at(8 * warm, Some(0.0), Some(0.5)),
                [cold, 0],
                false,
            ),
            (
                "400 cached requests: past the bound",
                at(400 * warm, Some(0.0), Some(0.5)),
                [cold, 0],
                true,
            ),
            (
                "8 cold requests against 1 elsewhere: saturated",
                at(8 * cold, Some(0.0), Some(0.5)),
                [cold, 0],
                true,
            ),
            (
                "within 1.5x the mean with the request, plus one cold request",
                at(12_000, None, None),
                [0, 0],
                false,
            ),
            (
                "beyond it, the engine's signals unknown",
                at(20_000, None, None),
                [0, 0],
                true,
            ),
            (
                "its engine queues",
                at(warm, Some(c.saturation_queue), Some(0.5)),
                [0, 0],
                true,
            ),
            (
                "its KV cache is full while a request waits",
                at(warm, Some(1.0), Some(0.96)),
                [0, 0],
                true,
            ),
            (
                "its KV cache is full, nothing waits",
                at(warm, Some(0.0), Some(0.96)),
                [0, 0],
                false,
            ),
        ];
        let mut rng = SmallRng::seed_from_u64(4);
        for (what, holder, others, released) in cases {
            let cands = [
                Cand {
                    id: 0,
                    tokens: others[0],
                    ..idle
                },
                Cand {
                    id: 1,
                    tokens: others[1],
                    ..idle
                },
                Cand { id: 2, ..holder },
            ];
            let got = decide(
                &c,
                &cands,
                &Ask {
                    shape: &s,
                    matched: &[2],
                    match_blocks: 48,
                    excluded: &[],
                    room: Room::Unknown,
                },
                &mut rng,
                &mut Vec::new(),
            )
            .unwrap();
            if released {
                assert_eq!(got.reason, Reason::PrefixSaturated, "{what}");
                assert_ne!(got.idx, 2, "{what}");
            } else {
                assert_eq!(
                    got,
                    Choice {
                        idx: 2,
                        reason: Reason::PrefixHit
                    },
                    "{what}"
                );
            }
        }
    }

    #[test]
    fn the_quick_prefix_hit_is_the_full_paths_choice() {
        // Random fleets: whenever the quick path answers, the full path answers the same.
        let mut rng = SmallRng::seed_from_u64(8);
        let mut quick = 0;
        for round in 0..20_000 {
            let strategy = if round % 2 == 0 {
                Strategy::Prefix
            } else {
                Strategy::Auto
            };
            let c = cfg(strategy);
            let n = rng.random_range(1..6);
            let cands: Vec<Cand> = (0..n)
                .map(|id| Cand {
                    id,
                    healthy: rng.random_bool(0.8),
                    in_flight: 0,
                    tokens: rng.random_range(0..2_000),
                    waiting: [None, Some(0.0), Some(5.0)][rng.random_range(0..3)],
                    kv: [None, Some(0.2), Some(0.99)][rng.random_range(0..3)],
                    attainment: [1.0, 0.9, 0.5][rng.random_range(0..3)],
                })
                .collect();
            let matched: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.4)).collect();
            let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.2)).collect();
            let s = Shape {
                prompt_tokens: rng.random_range(50..600),
                ..shape(rng.random_range(0..8))
            };
            let blocks = s.blocks.len();
            if blocks < c.prefix_min_blocks {
                continue;
            }
            let ask = Ask {
                shape: &s,
                matched: &matched,
                match_blocks: blocks,
                excluded: &excluded,
                room: Room::Unknown,
            };
            if let Some(hit) = quick_hit(&c, &cands, &ask) {
                quick += 1;
                let full = decide_full(&c, &cands, &ask, &mut rng, &mut Vec::new());
                assert_eq!(Some(hit), full, "{cands:?} {matched:?} {excluded:?} {s:?}");
            }
        }
        assert!(quick > 500, "{quick}");
    }

    /// Random fleets for the differential tests: `n` candidates with ids 1..=n, some
    /// unhealthy, engines and attainments varied.
    fn random_fleet(rng: &mut SmallRng, n: u32) -> Vec<Cand> {
        (1..=n)
            .map(|id| Cand {
                id,
                healthy: rng.random_bool(0.85),
                in_flight: rng.random_range(0..8),
                tokens: rng.random_range(0..3_000),
                waiting: [None, Some(0.0), Some(1.0), Some(5.0)][rng.random_range(0..4)],
                kv: [None, Some(0.2), Some(0.99)][rng.random_range(0..3)],
                attainment: [1.0, 1.0, 0.9, 0.5][rng.random_range(0..4)],
            })
            .collect()
    }

    #[test]
    fn choosing_among_replicas_is_choosing_among_their_snapshot() {
        let set: Vec<Arc<Replica>> = (0..6)
            .map(|i| Arc::new(Replica::new(&format!("http://e{i}:1")).unwrap()))
            .collect();
        let mut guards = Vec::new();
        for (i, r) in set.iter().enumerate() {
            r.set_healthy(i != 4);
            for _ in 0..i % 3 {
                guards.push(r.start_tokens(200 * i as u64, 50));
            }
        }
        let long = shape(4);
        for strategy in [
            Strategy::P2c,
            Strategy::Prefix,
            Strategy::Goodput,
            Strategy::Auto,
        ] {
            let (a, b) = (balancer(cfg(strategy)), balancer(cfg(strategy)));
            for round in 0..40 {
                let now = Instant::now();
                let snapshot: Vec<Cand> = set.iter().map(|r| r.cand(now)).collect();
                let excluded: &[usize] = if round % 5 == 0 { &[1, 2] } else { &[] };
                let got = a.choose_among(
                    &set,
                    now,
                    &long,
                    excluded,
                    &mut SmallRng::seed_from_u64(round),
                );
                let want = b.choose(
                    &snapshot,
                    &long,
                    excluded,
                    &mut SmallRng::seed_from_u64(round),
                );
                assert_eq!(got, want, "{strategy:?} round {round}");
            }
        }
    }

    #[test]
    fn the_eligible_list_is_the_simple_filters() {
        let simple = |cands: &[Cand], excluded: &[usize]| -> Vec<usize> {
            let ok = |i: &usize| !excluded.contains(i);
            let healthy: Vec<usize> = (0..cands.len())
                .filter(|i| ok(i) && cands[*i].healthy)
                .collect();
            if healthy.is_empty() {
                (0..cands.len()).filter(ok).collect()
            } else {
                healthy
            }
        };
        let mut rng = SmallRng::seed_from_u64(11);
        let mut scratch = Vec::new();
        let mut all = 0;
        for round in 0..5_000 {
            // Past `ALL`'s length now and then, all healthy often.
            let n = if round % 50 == 0 {
                300
            } else {
                rng.random_range(0..70)
            };
            let mut cands = random_fleet(&mut rng, n);
            if round % 2 == 0 {
                cands.iter_mut().for_each(|c| c.healthy = true);
            }
            let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.02)).collect();
            let got = eligible(&cands, &excluded, &mut scratch).to_vec();
            all += usize::from(got.len() == cands.len());
            assert_eq!(got, simple(&cands, &excluded), "{n} {excluded:?}");
        }
        assert!(all > 1_000, "{all}");
    }

    #[test]
    fn the_room_looked_up_in_the_index_places_as_the_room_of_every_candidate() {
        // The balancer reads the index's room only for the candidates a placement considers;
        // the full list of every candidate's room, read first, must choose the same.
        let mut rng = SmallRng::seed_from_u64(12);
        let mut placed = 0;
        for round in 0..4_000 {
            let strategy = if round % 2 == 0 {
                Strategy::Prefix
            } else {
                Strategy::Auto
            };
            let c = cfg(strategy);
            let n = rng.random_range(1..12);
            let cands = random_fleet(&mut rng, n);
            let mut index = PrefixIndex::new(4_096);
            for p in 0..rng.random_range(0..40u64) {
                let blocks: Vec<u64> = (0..rng.random_range(1..10)).map(|b| p << 8 | b).collect();
                index.record(&blocks, rng.random_range(1..=n));
            }
            let room: Vec<u64> = cands.iter().map(|c| index.owned(c.id)).collect();
            let matched: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.2)).collect();
            let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.1)).collect();
            let s = shape(rng.random_range(0..8));
            let ask = |room| Ask {
                shape: &s,
                matched: &matched,
                match_blocks: if matched.is_empty() {
                    0
                } else {
                    s.blocks.len()
                },
                excluded: &excluded,
                room,
            };
            let seed = rng.random();
            let lazy = decide(
                &c,
                &cands,
                &ask(Room::Index(&index)),
                &mut SmallRng::seed_from_u64(seed),
                &mut Vec::new(),
            );
            let each = decide(
                &c,
                &cands,
                &ask(Room::Each(&room)),
                &mut SmallRng::seed_from_u64(seed),
                &mut Vec::new(),
            );
            assert_eq!(lazy, each, "{cands:?} {room:?} {matched:?} {excluded:?}");
            // Not vacuous: often the room decided (without it the choice differs).
            let blind = decide(
                &c,
                &cands,
                &ask(Room::Unknown),
                &mut SmallRng::seed_from_u64(seed),
                &mut Vec::new(),
            );
            placed += usize::from(blind != lazy);
        }
        assert!(placed > 200, "{placed}");
    }

    #[test]
    fn a_new_prefix_goes_where_placed_prefixes_take_the_least_room() {
        let idle = || (0..4).map(|id| cand(id, 0)).collect::<Vec<Cand>>();
        let with = |i: usize, f: &dyn Fn(&mut Cand)| {
            let mut v = idle();
            f(&mut v[i]);
            v
        };
        // (what, strategy, candidates, room per candidate, holders, prompt blocks, want idx
        // (None: any), reason)
        type Case = (
            &'static str,
            Strategy,
            Vec<Cand>,
            [u64; 4],
            Vec<usize>,
            usize,
            Option<usize>,
            Reason,
        );
        let cases: Vec<Case> = vec![
            (
                "the least room wins; a tie goes to the first",
                Strategy::Prefix,
                idle(),
                [300, 100, 200, 100],
                vec![],
                4,
                Some(1),
                Reason::LeastLoad,
            ),
            (
                "a tie goes to the lower load",
                Strategy::Prefix,
                with(1, &|c| c.tokens = 150),
                [300, 100, 200, 100],
                vec![],
                4,
                Some(3),
                Reason::LeastLoad,
            ),
            (
                "room before load, within the load bound",
                Strategy::Prefix,
                with(1, &|c| c.tokens = 300),
                [300, 100, 200, 150],
                vec![],
                4,
                Some(1),
                Reason::LeastLoad,
            ),
            (
                "past the load bound: not open",
                Strategy::Prefix,
                with(1, &|c| c.tokens = 5_000),
                [300, 100, 200, 150],
                vec![],
                4,
                Some(3),
                Reason::LeastLoad,
            ),
            (
                "a full KV cache: not open",
                Strategy::Prefix,
                with(1, &|c| {
                    c.kv = Some(0.99);
                    c.waiting = Some(1.0);
                }),
                [300, 100, 200, 150],
                vec![],
                4,
                Some(3),
                Reason::LeastLoad,
            ),
            (
                "auto: an attainment below the gap is not open",
                Strategy::Auto,
                with(1, &|c| c.attainment = 0.5),
                [300, 100, 200, 150],
                vec![],
                4,
                Some(3),
                Reason::Goodput,
            ),
            (
                "a short prompt is no prefix to place: load decides",
                Strategy::Prefix,
                with(1, &|c| c.tokens = 300),
                [0, 0, 0, 0],
                vec![],
                1,
                None,
                Reason::LeastLoad,
            ),
            (
                "moved off a saturated holder: placed the same way",
                Strategy::Prefix,
                with(2, &|c| {
                    c.kv = Some(0.99);
                    c.waiting = Some(2.0);
                }),
                [300, 200, 100, 150],
                vec![2],
                4,
                Some(3),
                Reason::PrefixSaturated,
            ),
        ];
        for (what, strategy, cands, room, held, blocks, want, reason) in cases {
            let c = cfg(strategy);
            let got = decide(
                &c,
                &cands,
                &Ask {
                    shape: &shape(blocks),
                    matched: &held,
                    match_blocks: if held.is_empty() { 0 } else { blocks },
                    excluded: &[],
                    room: Room::Each(&room),
                },
                &mut SmallRng::seed_from_u64(2),
                &mut Vec::new(),
            )
            .unwrap();
            assert_eq!(got.reason, reason, "{what}");
            if let Some(want) = want {
                assert_eq!(got.idx, want, "{what}");
            }
        }
        // Every replica saturated: load decides among all.
        let busy: Vec<Cand> = (0..4).map(|id| cand(id, 9_000 + 100 * id as u64)).collect();
        let mut rng = SmallRng::seed_from_u64(3);
        let long = shape(4);
        let mut ask = Ask::cold(&long);
        ask.room = Room::Each(&[0, 0, 0, 0]);
        let kv_full: Vec<Cand> = busy
            .iter()
            .map(|c| Cand {
                kv: Some(1.0),
                waiting: Some(1.0),
                ..*c
            })
            .collect();
        for _ in 0..50 {
            let ch = decide(
                &cfg(Strategy::Prefix),
                &kv_full,
                &ask,
                &mut rng,
                &mut Vec::new(),
            );
            assert_ne!(
                ch.unwrap().idx,
                3,
                "two random choices never take the busiest"
            );
        }
    }

    #[test]
    fn eight_long_prompts_spread_two_to_each_of_four_replicas() {
        // The first request of each prompt arrives while the others' are in flight at
        // different loads; placed by room, each replica gets two, whatever the loads.
        for strategy in [Strategy::Prefix, Strategy::Auto] {
            let b = balancer(cfg(strategy));
            let mut cands: Vec<Cand> = (0..4).map(|id| cand(id, 0)).collect();
            let mut rng = SmallRng::seed_from_u64(7);
            let mut placed = [0; 4];
            for k in 0..8u64 {
                let s = Shape {
                    blocks: (0..20).map(|j| k << 32 | j).collect(),
                    prompt_tokens: 1_400,
                    output_tokens: 32,
                };
                let (ch, _) = b.choose(&cands, &s, &[], &mut rng).unwrap();
                placed[ch.idx] += 1;
                // Its cold prefill is in flight there.
                cands[ch.idx].tokens += 1_432;
                cands[ch.idx].in_flight += 1;
            }
            assert_eq!(placed, [2, 2, 2, 2], "{strategy:?}");
        }
    }

    #[test]
    fn a_release_names_the_first_saturation_test_its_holder_failed() {
        let with = |f: &dyn Fn(&mut Cand)| {
            let mut v = vec![cand(0, 200), cand(1, 200), cand(2, 0)];
            f(&mut v[2]);
            v
        };
        // (what, strategy, candidates (holder: 2), excluded, cause)
        type Case = (
            &'static str,
            Strategy,
            Vec<Cand>,
            Vec<usize>,
            Option<Release>,
        );
        let cases: Vec<Case> = vec![
            ("open", Strategy::Prefix, with(&|_| ()), vec![], None),
            (
                "engine queue",
                Strategy::Prefix,
                with(&|c| c.waiting = Some(4.0)),
                vec![],
                Some(Release::Queue),
            ),
            (
                "KV cache, a request waiting",
                Strategy::Prefix,
                with(&|c| {
                    c.kv = Some(0.97);
                    c.waiting = Some(1.0);
                }),
                vec![],
                Some(Release::Kv),
            ),
            (
                "KV cache full, nothing waiting",
                Strategy::Prefix,
                with(&|c| c.kv = Some(0.97)),
                vec![],
                None,
            ),
            (
                "queue and KV: the queue is tested first",
                Strategy::Auto,
                with(&|c| {
                    c.waiting = Some(9.0);
                    c.kv = Some(1.0);
                }),
                vec![],
                Some(Release::Queue),
            ),
            (
                "load far above the mean",
                Strategy::Prefix,
                with(&|c| c.tokens = 5_000),
                vec![],
                Some(Release::Load),
            ),
            (
                "load and attainment: load first",
                Strategy::Auto,
                with(&|c| {
                    c.tokens = 5_000;
                    c.attainment = 0.1;
                }),
                vec![],
                Some(Release::Load),
            ),
            (
                "auto: attainment far below the best",
                Strategy::Auto,
                with(&|c| c.attainment = 0.5),
                vec![],
                Some(Release::Attainment),
            ),
            (
                "prefix ignores attainment",
                Strategy::Prefix,
                with(&|c| c.attainment = 0.5),
                vec![],
                None,
            ),
            (
                "unhealthy",
                Strategy::Prefix,
                with(&|c| c.healthy = false),
                vec![],
                Some(Release::Unhealthy),
            ),
            (
                "already tried",
                Strategy::Auto,
                with(&|_| ()),
                vec![2],
                Some(Release::Excluded),
            ),
        ];
        for (what, strategy, cands, excluded, want) in cases {
            let c = cfg(strategy);
            let ask = Ask {
                shape: &shape(3),
                matched: &[2],
                match_blocks: 3,
                excluded: &excluded,
                room: Room::Unknown,
            };
            assert_eq!(release_cause(&c, &cands, &ask), want, "{what}");
            // The choice agrees: it leaves the holder exactly when a cause is named.
            let ch = decide(
                &c,
                &cands,
                &ask,
                &mut SmallRng::seed_from_u64(1),
                &mut Vec::new(),
            );
            assert_eq!(ch.unwrap().idx != 2, want.is_some(), "{what}");
        }
    }

    #[test]
    fn a_prefix_leaves_its_holders_only_with_a_cause() {
        // Random fleets: a choice that leaves every holder has a cause; one whose most recent
        // eligible holder has none stays on it.
        let mut rng = SmallRng::seed_from_u64(12);
        let mut left = 0;
        for round in 0..20_000 {
            let strategy = [Strategy::Prefix, Strategy::Auto][round % 2];
            let c = cfg(strategy);
            let n = rng.random_range(2..6);
            let cands: Vec<Cand> = (0..n)
                .map(|id| Cand {
                    id,
                    healthy: rng.random_bool(0.8),
                    in_flight: 0,
                    tokens: rng.random_range(0..2_000),
                    waiting: [None, Some(0.0), Some(5.0)][rng.random_range(0..3)],
                    kv: [None, Some(0.2), Some(0.99)][rng.random_range(0..3)],
                    attainment: [1.0, 0.9, 0.5][rng.random_range(0..3)],
                })
                .collect();
            let matched: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.4)).collect();
            let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.2)).collect();
            if matched.is_empty() || excluded.len() == n as usize {
                continue;
            }
            let s = Shape {
                prompt_tokens: rng.random_range(50..600),
                ..shape(4)
            };
            let ask = Ask {
                shape: &s,
                matched: &matched,
                match_blocks: 4,
                excluded: &excluded,
                room: Room::Unknown,
            };
            let cause = release_cause(&c, &cands, &ask);
            let ch = decide(&c, &cands, &ask, &mut rng, &mut Vec::new()).unwrap();
            if !matched.contains(&ch.idx) {
                left += 1;
                assert!(cause.is_some(), "{cands:?} {matched:?} {excluded:?} {ch:?}");
            }
            if cause.is_none() {
                assert!(
                    matched.contains(&ch.idx),
                    "{cands:?} {matched:?} {excluded:?} {ch:?}"
                );
            }
        }
        assert!(left > 1_000, "{left}");
    }

    #[test]
    fn a_prefix_stays_on_its_most_recent_open_holder() {
        let c = cfg(Strategy::Prefix);
        let idle: Vec<Cand> = (0..5).map(|id| cand(id, 0)).collect();
        let with = |f: &dyn Fn(&mut Vec<Cand>)| {
            let mut v = idle.clone();
            f(&mut v);
            v
        };
        // (what, candidates, holders most recent first, want idx or None: not a holder)
        type Case = (&'static str, Vec<Cand>, Vec<usize>, Option<usize>, Reason);
        let cases: Vec<Case> = vec![
            (
                "of several holders the most recent, not the least loaded",
                with(&|v| v[3].tokens = 400),
                vec![3, 1],
                Some(3),
                Reason::PrefixHit,
            ),
            (
                "it saturated: the next most recent",
                with(&|v| v[3].tokens = 50_000),
                vec![3, 1],
                Some(1),
                Reason::PrefixHit,
            ),
            (
                "its engine queues: the next most recent",
                with(&|v| v[3].waiting = Some(9.0)),
                vec![3, 1, 4],
                Some(1),
                Reason::PrefixHit,
            ),
            (
                "every holder saturated: elsewhere, by load",
                with(&|v| {
                    v[3].tokens = 50_000;
                    v[1].kv = Some(0.99);
                    v[1].waiting = Some(1.0);
                }),
                vec![3, 1],
                None,
                Reason::PrefixSaturated,
            ),
            (
                "an unhealthy holder is passed over",
                with(&|v| v[3].healthy = false),
                vec![3, 1],
                Some(1),
                Reason::PrefixHit,
            ),
        ];
        let mut rng = SmallRng::seed_from_u64(11);
        for (what, cands, held, idx, reason) in cases {
            for _ in 0..20 {
                let got = decide(
                    &c,
                    &cands,
                    &Ask {
                        shape: &shape(3),
                        matched: &held,
                        match_blocks: 3,
                        excluded: &[],
                        room: Room::Unknown,
                    },
                    &mut rng,
                    &mut Vec::new(),
                )
                .unwrap();
                assert_eq!(got.reason, reason, "{what}");
                match idx {
                    Some(i) => assert_eq!(got.idx, i, "{what}"),
                    None => assert!(!held.contains(&got.idx), "{what}: {got:?}"),
                }
            }
        }
    }

    #[test]
    fn a_spilled_prefix_moves_and_does_not_spread() {
        // The index and the choice together: a prefix whose replica saturates moves to one
        // other replica and stays there, busier than its former holders as it may be; its
        // traffic is never shared out among every replica that once served it.
        let b = balancer(cfg(Strategy::Prefix));
        let idle: Vec<Cand> = (0..4).map(|id| cand(id, 0)).collect();
        let s = shape(6);
        let mut rng = SmallRng::seed_from_u64(2);
        let mut home = b.choose(&idle, &s, &[], &mut rng).unwrap().0.idx;
        let mut homes = std::collections::BTreeSet::from([home]);
        for round in 0..200 {
            let saturated = round % 10 == 9;
            let mut cands = idle.clone();
            // Serving the prefix keeps its replica busier than the others.
            cands[home].tokens = if saturated { 50_000 } else { 400 };
            let ch = b.choose(&cands, &s, &[], &mut rng).unwrap().0;
            if saturated {
                // To a former holder when one is open (likely still cached), else by load.
                let want = if homes.len() == 1 {
                    Reason::PrefixSaturated
                } else {
                    Reason::PrefixHit
                };
                assert_eq!(ch.reason, want, "round {round}");
                assert_ne!(ch.idx, home, "round {round}");
                home = ch.idx;
                homes.insert(home);
            } else {
                assert_eq!(
                    ch,
                    Choice {
                        idx: home,
                        reason: Reason::PrefixHit
                    },
                    "round {round}"
                );
            }
        }
        assert!(homes.len() > 1, "it moved: {homes:?}");
    }

    #[test]
    fn goodput_steers_away_from_replicas_that_miss_their_slos() {
        let c = cfg(Strategy::Goodput);
        let slow = Cand {
            attainment: 0.2,
            ..cand(1, 0)
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = [0usize; 2];
        for _ in 0..1_000 {
            let ch = decide(
                &c,
                &[cand(0, 3_000), slow],
                &Ask::cold(&shape(0)),
                &mut rng,
                &mut Vec::new(),
            )
            .unwrap();
            assert_eq!(ch.reason, Reason::Goodput);
            counts[ch.idx] += 1;
        }
        // 3,000 tokens in flight on the good one still beat an idle replica at 20 %.
        assert_eq!(counts, [1_000, 0]);
        // With weight 0 attainment is ignored: the idle one wins.
        let flat = BalanceConfig {
            attainment_weight: 0.0,
            ..c.clone()
        };
        assert_eq!(
            run(&flat, &[cand(0, 3_000), slow], &[], 0, &[])
                .unwrap()
                .idx,
            1
        );
    }

    #[test]
    fn the_exploration_share_runs_while_attainments_differ_and_skips_saturated_engines() {
        let c = BalanceConfig {
            exploration: 0.1,
            ..cfg(Strategy::Auto)
        };
        let bad = Cand {
            attainment: 0.0,
            ..cand(2, 0)
        };
        let mut rng = SmallRng::seed_from_u64(9);
        let mut decide_n = |cands: &[Cand], n: usize| {
            (0..n)
                .map(|_| {
                    decide(&c, cands, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new()).unwrap()
                })
                .collect::<Vec<_>>()
        };
        // While attainments differ, a random replica is explored; only exploration reaches
        // the one the weighted score keeps away.
        let choices = decide_n(&[cand(0, 0), cand(1, 0), bad], 10_000);
        let explored = choices
            .iter()
            .filter(|ch| ch.reason == Reason::Explore)
            .count();
        assert!((900..1_100).contains(&explored), "{explored}");
        let to_bad = choices.iter().filter(|ch| ch.idx == 2);
        assert!(to_bad.clone().all(|ch| ch.reason == Reason::Explore));
        let to_bad = to_bad.count();
        assert!((250..420).contains(&to_bad), "{to_bad}");
        // A request whose prefix is cached is not explored with.
        for _ in 0..2_000 {
            let ch = decide(
                &c,
                &[cand(0, 0), cand(1, 0), bad],
                &Ask {
                    shape: &shape(3),
                    matched: &[1],
                    match_blocks: 3,
                    excluded: &[],
                    room: Room::Unknown,
                },
                &mut rng,
                &mut Vec::new(),
            )
            .unwrap();
            assert_eq!(
                ch,
                Choice {
                    idx: 1,
                    reason: Reason::PrefixHit
                }
            );
        }
        let mut decide_n = |cands: &[Cand], n: usize| {
            (0..n)
                .map(|_| {
                    decide(&c, cands, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new()).unwrap()
                })
                .collect::<Vec<_>>()
        };
        // Replicas alike: nothing to re-measure, no request sent past a shorter queue.
        let queued = Cand {
            waiting: Some(3.0),
            ..cand(1, 0)
        };
        let choices = decide_n(&[cand(0, 0), queued], 2_000);
        assert!(choices
            .iter()
            .all(|ch| ch.reason != Reason::Explore && ch.idx == 0));
        // A penalized replica whose engine is saturated is not explored either.
        for busy in [
            Cand {
                waiting: Some(c.saturation_queue),
                ..bad
            },
            Cand {
                kv: Some(c.saturation_kv),
                waiting: Some(1.0),
                ..bad
            },
        ] {
            let choices = decide_n(&[cand(0, 0), cand(1, 0), busy], 2_000);
            assert!(choices.iter().all(|ch| ch.idx != 2));
        }
        // p2c and prefix never explore.
        for s in [Strategy::P2c, Strategy::Prefix] {
            let c = BalanceConfig {
                exploration: 0.5,
                ..cfg(s)
            };
            for _ in 0..200 {
                let ch = decide(
                    &c,
                    &[cand(0, 0), cand(1, 0), bad],
                    &Ask::cold(&shape(0)),
                    &mut rng,
                    &mut Vec::new(),
                );
                assert_ne!(ch.unwrap().reason, Reason::Explore);
            }
        }
    }

    #[test]
    fn auto_takes_the_prefix_only_on_a_replica_that_meets_its_slos() {
        let c = cfg(Strategy::Auto);
        let failing = Cand {
            attainment: 0.5,
            ..cand(2, 0)
        };
        let ch = run(&c, &[cand(0, 0), cand(1, 0), failing], &[2], 3, &[]).unwrap();
        // Its prefix moves on, as from a saturated replica.
        assert_eq!(ch.reason, Reason::PrefixSaturated);
        assert_ne!(ch.idx, 2);
        // Within AUTO_ATTAINMENT_GAP of the best, it keeps it: a few streams slowed by cold
        // prefills do not move its prefixes. (holder's attainment, the best's, released)
        let cases = [
            (0.85, 1.0, false),
            (0.7, 1.0, false),
            (0.62, 1.0, false),
            (0.55, 1.0, true),
            (0.55, 0.9, false),
            (0.3, 0.75, true),
        ];
        for (att, best, released) in cases {
            let holder = Cand {
                attainment: att,
                ..cand(2, 0)
            };
            let top = Cand {
                attainment: best,
                ..cand(0, 0)
            };
            let others = [top, cand(1, 0), holder].map(|c| Cand {
                attainment: c.attainment.min(best),
                ..c
            });
            let ch = run(&c, &others, &[2], 3, &[]).unwrap();
            assert_eq!(ch.idx != 2, released, "{att} against {best}");
        }
        let ch = run(&c, &[cand(0, 0), cand(1, 0), cand(2, 0)], &[2], 3, &[]).unwrap();
        assert_eq!(
            ch,
            Choice {
                idx: 2,
                reason: Reason::PrefixHit
            }
        );
    }

    #[test]
    fn exclusions_health_and_single_candidates() {
        for s in [
            Strategy::P2c,
            Strategy::Prefix,
            Strategy::Goodput,
            Strategy::Auto,
        ] {
            let c = cfg(s);
            assert_eq!(run(&c, &[], &[], 0, &[]), None);
            assert_eq!(run(&c, &[cand(0, 0)], &[], 0, &[0]), None);
            let only = run(&c, &[cand(0, 0), cand(1, 0)], &[0], 3, &[1]).unwrap();
            assert_eq!(
                only,
                Choice {
                    idx: 0,
                    reason: Reason::Only
                }
            );
            // Nobody healthy: still served.
            let sick = |id| Cand {
                healthy: false,
                ..cand(id, 0)
            };
            assert!(run(&c, &[sick(0), sick(1)], &[], 0, &[]).is_some());
            // Healthy first.
            let ch = run(&c, &[sick(0), cand(1, 9_000)], &[0], 3, &[]).unwrap();
            assert_eq!(ch.idx, 1, "{s:?}");
        }
    }

    #[test]
    fn p2c_compares_in_flight_plus_engine_queue() {
        let c = cfg(Strategy::P2c);
        let q = |in_flight: usize, waiting: f64| Cand {
            in_flight,
            waiting: Some(waiting),
            ..cand(0, 0)
        };
        let cases: Vec<(Vec<Cand>, usize)> = vec![
            // equal in-flight: the replica whose engine queues loses
            (vec![q(2, 6.0), q(2, 0.0)], 1),
            // a long engine queue outweighs fewer in-flight requests
            (vec![q(1, 8.0), q(4, 0.0)], 1),
            // fewer in-flight wins when the queues are level
            (vec![q(1, 3.0), q(4, 3.0)], 0),
            (vec![q(3, 0.0), q(1, 0.0)], 1),
            // an unknown queue counts as empty
            (
                vec![
                    Cand {
                        waiting: None,
                        ..q(1, 0.0)
                    },
                    q(2, 0.0),
                ],
                0,
            ),
        ];
        let mut rng = SmallRng::seed_from_u64(3);
        for (cands, want) in cases {
            for _ in 0..20 {
                let ch = decide(&c, &cands, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new());
                assert_eq!(
                    ch,
                    Some(Choice {
                        idx: want,
                        reason: Reason::P2c
                    }),
                    "{cands:?}"
                );
            }
        }
        // Of many, never the most loaded.
        let many: Vec<Cand> = (0..5).map(|i| q(i, 0.0)).collect();
        for _ in 0..200 {
            let ch = decide(&c, &many, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new());
            assert_ne!(ch.unwrap().idx, 4);
        }
    }

    #[test]
    fn the_balancer_learns_prefixes_and_what_the_engines_evicted() {
        let b = balancer(cfg(Strategy::Prefix));
        let cands = [cand(10, 0), cand(11, 0), cand(12, 0), cand(13, 0)];
        // While only replica 10 is healthy, every prompt goes there.
        let solo: Vec<Cand> = cands
            .iter()
            .map(|c| Cand {
                healthy: c.id == 10,
                ..*c
            })
            .collect();
        // 4 blocks of 256 bytes: a 1,024-byte prefix of a prompt of 400 estimated tokens.
        let s = Shape {
            prompt_tokens: 400,
            ..shape(4)
        };
        let older = Shape {
            blocks: (100..104).collect(),
            ..s.clone()
        };
        let newer = Shape {
            blocks: (200..204).collect(),
            ..s.clone()
        };
        let mut rng = SmallRng::seed_from_u64(3);
        let mut choose =
            |cands: &[Cand], shape: &Shape| b.choose(cands, shape, &[], &mut rng).unwrap();
        assert_eq!(
            choose(&solo, &older).1,
            Belief::default(),
            "nothing expected of a first request"
        );
        choose(&solo, &s);
        // Healthy again: the prompt goes back where it was served, expected there.
        let (hit, belief) = choose(&cands, &s);
        assert_eq!(
            hit,
            Choice {
                idx: 0,
                reason: Reason::PrefixHit
            }
        );
        assert_eq!((belief.id, belief.blocks), (10, 4));
        choose(&solo, &newer);
        // The engines report (cached, prompt) tokens: 4 of 6.25 parts of 500 = 320 expected.
        let cases: &[(&str, u64, bool)] = &[
            ("all of it cached", 320, false),
            ("more than expected", 480, false),
            ("a block short: estimates are rough", 250, false),
            ("well short: evicted", 200, true),
            ("nothing", 0, true),
        ];
        for &(what, cached, evicted) in cases {
            assert_eq!(b.learn(&s, &belief, cached, 500), evicted, "{what}");
        }
        // Nothing was expected: nothing to learn; p2c keeps no index.
        assert!(!b.learn(&s, &Belief::default(), 0, 500));
        let p2c = balancer(cfg(Strategy::P2c));
        assert!(!p2c.learn(&s, &belief, 0, 500));
        // The engine had lost the prompt: the index forgets it there with everything older
        // (the request that found it missing was recorded anew: that prompt stays), and keeps
        // what came after.
        assert!(b.learn(&s, &belief, 0, 500));
        let mut choose = |shape: &Shape| b.choose(&cands, shape, &[], &mut rng).unwrap();
        assert_eq!(
            choose(&s).0,
            Choice {
                idx: 0,
                reason: Reason::PrefixHit
            }
        );
        assert_eq!(
            choose(&newer).0,
            Choice {
                idx: 0,
                reason: Reason::PrefixHit
            }
        );
        let (stale, belief) = choose(&older);
        assert_eq!(stale.reason, Reason::LeastLoad, "forgotten");
        assert_eq!(belief, Belief::default());
    }

    #[test]
    fn every_decision_reason_and_release_cause_is_a_series_from_the_start() {
        let registry = prometheus::Registry::new();
        let b = Balancer::new(cfg(Strategy::Auto), &Registrar::new(&registry)).unwrap();
        b.count(Reason::PrefixHit);
        b.count(Reason::PrefixHit);
        // A prefix placed, then sent away from its holder's full KV cache: one release.
        let idle: Vec<Cand> = (0..3).map(|id| cand(id, 0)).collect();
        let mut rng = SmallRng::seed_from_u64(6);
        let home = b.choose(&idle, &shape(6), &[], &mut rng).unwrap().0.idx;
        let mut full = idle.clone();
        full[home].kv = Some(1.0);
        full[home].waiting = Some(1.0);
        let moved = b.choose(&full, &shape(6), &[], &mut rng).unwrap().0;
        assert_eq!(moved.reason, Reason::PrefixSaturated);
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        for r in Reason::ALL {
            let n = if r == Reason::PrefixHit { 2 } else { 0 };
            let line = format!(
                "goodput_proxy_route_decisions_total{{reason=\"{}\"}} {n}\n",
                r.as_str()
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        for r in Release::ALL {
            let n = if r == Release::Kv { 1 } else { 0 };
            let line = format!(
                "goodput_proxy_route_releases_total{{cause=\"{}\"}} {n}\n",
                r.as_str()
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        // Declared once: a second balancer on the same registry is refused.
        assert!(Balancer::new(cfg(Strategy::Auto), &Registrar::new(&registry)).is_err());
    }
}
