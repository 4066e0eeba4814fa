//! The engine: continuous-batching admission (at most `max_num_seqs` sequences running, the
//! rest waiting FIFO; an optional cap on unfinished requests answered with vLLM's 503), the
//! timing model (prefill through the shared step budget, [`sched`](super::sched)), the KV
//! cache with prefix caching ([`kvcache`](super::kvcache)), and per-request metric records
//! measured from arrival as vLLM measures them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::config::SimConfig;
use super::gen::{Generation, TokenOut};
use super::kvcache::{block_hashes, Held, KvCache};
use super::metrics::{EngineMetrics, FinishedReason};
use super::per_request::EngineTimes;
use super::render::{Finish, PromptDetails};
use super::request::GenRequest;
use super::sched::{self, PrefillLine};
use super::text::{jitter_factor, SplitMix};

/// Counters for tests and operators (not exported as metrics).
#[derive(Debug, Default)]
pub struct Stats {
    /// Generation requests accepted (valid, no status fault).
    pub started: AtomicU64,
    /// Requests that ran to their end (finish, or an injected in-band error).
    pub finished: AtomicU64,
    /// Requests that ended early: client disconnect or `truncate-after`.
    pub aborted: AtomicU64,
}

/// Shared state of one simulated engine.
#[derive(Debug)]
pub struct Engine {
    pub cfg: SimConfig,
    /// `created` of every response: the process start (unix seconds), fixed so that
    /// identical requests get identical bytes.
    pub created: u64,
    pub metrics: EngineMetrics,
    pub stats: Stats,
    seqs: Arc<Semaphore>,
    arrivals: AtomicU64,
    /// Sequences of accepted requests not finished yet (running or waiting): what
    /// `max_num_queued_reqs` caps.
    unfinished: AtomicU64,
    cache: Mutex<KvCache>,
    line: PrefillLine,
    /// `speed` (f64 bits): the config's, until [`set_speed`](Self::set_speed) changes it.
    speed: AtomicU64,
}

impl Engine {
    pub fn new(cfg: SimConfig) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let cache = KvCache::new(
            cfg.kv_cache_tokens,
            cfg.block_size,
            cfg.enable_prefix_caching,
        );
        let metrics = EngineMetrics::with_grids(
            &cfg.models,
            cache.capacity_tokens(),
            cfg.legacy_metric_names,
            now.as_secs_f64(),
            cfg.personality.grids(),
        );
        Engine {
            seqs: Arc::new(Semaphore::new(cfg.max_num_seqs)),
            created: now.as_secs(),
            metrics,
            stats: Stats::default(),
            arrivals: AtomicU64::new(0),
            unfinished: AtomicU64::new(0),
            cache: Mutex::new(cache),
            line: PrefillLine::new(Instant::now()),
            speed: AtomicU64::new(cfg.speed.to_bits()),
            cfg,
        }
    }

    /// Every cost is divided by the speed from now on (a replica that slows down, or
    /// recovers, while it serves); values that are not finite and positive are ignored.
    pub fn set_speed(&self, speed: f64) {
        if speed.is_finite() && speed > 0.0 {
            self.speed.store(speed.to_bits(), Relaxed);
        }
    }

    pub fn speed(&self) -> f64 {
        f64::from_bits(self.speed.load(Relaxed))
    }

    fn cache(&self) -> MutexGuard<'_, KvCache> {
        // A panic while holding the lock leaves the pool consistent enough for a simulator.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the pool's usage as `kv_cache_usage_perc`.
    fn sync_kv(&self, cache: &KvCache) {
        self.metrics
            .kv_tokens
            .store(cache.used_tokens() as i64, Relaxed);
    }

    /// Prompt tokens the prefix cache holds for these token ids now (tests, operators).
    pub fn cached_prefix_tokens(&self, prompt_ids: &[u32]) -> u64 {
        let cache = self.cache();
        let hashes = block_hashes(prompt_ids, cache.block_size());
        cache.lookup(&hashes, prompt_ids.len() as u64)
    }

    /// Admission control (vLLM's `check_admission`): `None` when a request of `n` sequences
    /// fits under `max_num_queued_reqs`, else the rejection is counted and returned.
    pub fn check_admission(&self, model: usize, n: u64) -> Result<(), Rejected> {
        let Some(cap) = self.cfg.max_num_queued_reqs else {
            return Ok(());
        };
        if self.unfinished.load(Relaxed) + n > cap {
            self.metrics.models[model]
                .admission_rejections
                .fetch_add(1, Relaxed);
            return Err(Rejected);
        }
        Ok(())
    }

    /// Arrival number of a new request (seeds its timing jitter and fault draw).
    pub fn next_arrival(&self) -> u64 {
        self.arrivals.fetch_add(1, Relaxed)
    }

    pub fn running(&self) -> usize {
        self.cfg.max_num_seqs - self.seqs.available_permits()
    }

    pub fn waiting(&self) -> usize {
        self.metrics
            .models
            .iter()
            .map(|m| m.waiting.load(Relaxed).max(0) as usize)
            .sum()
    }

    /// In-flight requests (`/load`).
    pub fn load(&self) -> u64 {
        // Ended counts are read after started, so they may run ahead: saturate.
        let ended = self.stats.finished.load(Relaxed) + self.stats.aborted.load(Relaxed);
        self.stats.started.load(Relaxed).saturating_sub(ended)
    }
}

/// A request over the engine's `max_num_queued_reqs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected;

/// The timeline and engine resources of one request; dropping it mid-way is an abort.
pub struct Run {
    eng: Arc<Engine>,
    model: usize,
    n: u64,
    prompt_tokens: u64,
    /// Chain hashes of the prompt's full blocks.
    hashes: Vec<u64>,
    /// Prompt tokens found in the prefix cache at admission.
    cached: u64,
    max_tokens_param: u64,
    pub gen: Generation,
    rng: SplitMix,
    arrival: Instant,
    scheduled: Option<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
    permit: Option<OwnedSemaphorePermit>,
    waiting: bool,
    /// KV blocks held while running, and the tokens they hold.
    held: Held,
    kv_tokens: u64,
    done: bool,
    /// Still counted in the engine's unfinished sequences.
    unfinished: bool,
}

pub type Acquire = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<OwnedSemaphorePermit, tokio::sync::AcquireError>>
            + Send,
    >,
>;

impl Run {
    pub fn new(eng: Arc<Engine>, req: &GenRequest, arrival: Instant, arrival_no: u64) -> Self {
        eng.stats.started.fetch_add(1, Relaxed);
        eng.unfinished.fetch_add(req.n as u64, Relaxed);
        let gen = Generation::new(req, eng.cfg.stop_prob, eng.cfg.empty_delta_prob);
        let hashes = if eng.cfg.enable_prefix_caching {
            block_hashes(&req.prompt_ids, eng.cfg.block_size)
        } else {
            Vec::new()
        };
        Run {
            rng: SplitMix::new(eng.cfg.seed ^ arrival_no.wrapping_mul(0x2545_f491_4f6c_dd1d)),
            model: req.model_idx,
            n: req.n as u64,
            prompt_tokens: req.prompt_tokens,
            hashes,
            cached: 0,
            max_tokens_param: req.max_tokens_param,
            gen,
            arrival,
            scheduled: None,
            first: None,
            last: None,
            permit: None,
            waiting: false,
            held: Held::default(),
            kv_tokens: 0,
            done: false,
            unfinished: true,
            eng,
        }
    }

    /// What `usage.prompt_tokens_details` says, when the engine reports it: the prompt tokens
    /// found cached, and those this request newly cached (its full prompt blocks that were
    /// not cached before, as vLLM counts `created_cache_tokens`).
    pub fn prompt_details(&self) -> Option<PromptDetails> {
        if !self.eng.cfg.enable_prompt_tokens_details {
            return None;
        }
        let full = self.hashes.len() as u64 * self.eng.cfg.block_size;
        Some(PromptDetails {
            cached_tokens: self.cached,
            created_cache_tokens: full.saturating_sub(self.cached),
        })
    }

    /// Prompt tokens found in the prefix cache (0 until admitted).
    pub fn cached_tokens(&self) -> u64 {
        self.cached
    }

    /// Queues for `n` decode slots (FIFO); the future resolves when they are granted.
    pub fn enqueue(&mut self) -> Acquire {
        let want = self.n.min(self.eng.cfg.max_num_seqs as u64) as u32;
        self.waiting = true;
        self.eng.metrics.models[self.model]
            .waiting
            .fetch_add(self.n as i64, Relaxed);
        Box::pin(self.eng.seqs.clone().acquire_many_owned(want))
    }

    /// Slots granted: the request is running from `now`; returns its time to first token:
    /// the wait for the prefill queued before it, then the base cost and its uncached prompt
    /// tokens through the step budget.
    pub fn admitted(&mut self, permit: OwnedSemaphorePermit, extra: Duration) -> Duration {
        let m = &self.eng.metrics.models[self.model];
        if self.waiting {
            self.waiting = false;
            m.waiting.fetch_sub(self.n as i64, Relaxed);
        }
        let decoding = self.eng.running().saturating_sub(self.n as usize) as u64;
        m.running.fetch_add(self.n as i64, Relaxed);
        self.permit = Some(permit);
        let now = Instant::now();
        self.scheduled = Some(now);
        {
            let mut cache = self.eng.cache();
            self.cached = cache.admit(&self.hashes, self.prompt_tokens, &mut self.held);
            self.kv_tokens = self.prompt_tokens;
            self.eng.sync_kv(&cache);
        }
        if self.eng.cfg.enable_prefix_caching {
            // vLLM counts each child request of `n > 1` as its own query.
            m.prefix_queries
                .fetch_add(self.prompt_tokens * self.n, Relaxed);
            m.prefix_hits.fetch_add(self.cached * self.n, Relaxed);
        }
        let c = &self.eng.cfg;
        let uncached = self.prompt_tokens.saturating_sub(self.cached);
        let speed = self.eng.speed();
        let work_ms = sched::prefill_work_ms(c, uncached, decoding, speed);
        let wait = self.eng.line.reserve(now, ms_to_duration(work_ms));
        let ms =
            (c.ttft_ms / speed + work_ms) * jitter_factor(c.jitter, c.jitter_cv, &mut self.rng);
        wait + ms_to_duration(ms) + extra
    }

    /// Time of the next decode step: grows with the running batch, and carries a chunk of
    /// the prefill queued on the engine while there is some.
    pub fn step_time(&mut self, extra: Duration) -> Duration {
        let c = &self.eng.cfg;
        if c.tpot_ms == 0.0 && c.tpot_ms_per_seq == 0.0 && c.prefill_ms_per_token == 0.0 {
            return extra;
        }
        let running = self.eng.running() as u64;
        let others = running.saturating_sub(1);
        let speed = self.eng.speed();
        let ms =
            sched::step_ms(c, others, speed) * jitter_factor(c.jitter, c.jitter_cv, &mut self.rng);
        let share = ms_to_duration(sched::prefill_share_ms(c, running, speed));
        let prefill = self.eng.line.backlog(Instant::now()).min(share);
        ms_to_duration(ms) + prefill + extra
    }

    /// Generates one step (one token per unfinished choice) and records its metrics;
    /// `emit` gets each token with its choice index.
    pub fn step(&mut self, mut emit: impl FnMut(u32, TokenOut)) {
        let now = Instant::now();
        let m = &self.eng.metrics.models[self.model];
        let active = self.gen.active();
        match self.last {
            None => {
                let ttft = now.saturating_duration_since(self.arrival).as_secs_f64();
                m.ttft.observe_n(ttft, active);
                m.iteration_tokens
                    .observe((self.prompt_tokens * self.n + active) as f64);
                self.first = Some(now);
                m.prompt_tokens
                    .fetch_add(self.prompt_tokens * self.n, Relaxed);
                m.prompt_cached.fetch_add(self.cached * self.n, Relaxed);
                // The prompt's blocks are computed: later prompts may reuse them.
                let mut cache = self.eng.cache();
                cache.commit(&self.held, &self.hashes);
            }
            Some(prev) => {
                m.itl
                    .observe_n(now.saturating_duration_since(prev).as_secs_f64(), active);
                m.iteration_tokens.observe(active as f64);
            }
        }
        self.last = Some(now);
        for i in 0..self.gen.n() {
            if let Some(t) = self.gen.next(i) {
                emit(i, t);
            }
        }
        m.generation_tokens.fetch_add(active, Relaxed);
        self.kv_tokens += active;
        // Only a step that fills the last block takes the pool's lock.
        if !self.held.fits(self.kv_tokens, self.eng.cfg.block_size) {
            let mut cache = self.eng.cache();
            cache.grow(&mut self.held, self.kv_tokens);
            self.eng.sync_kv(&cache);
        }
    }

    pub fn steps_done(&self) -> u64 {
        (0..self.gen.n())
            .map(|i| self.gen.tokens(i))
            .max()
            .unwrap_or(0)
    }

    /// The engine's timestamps of this request, from which its per-request metrics come
    /// (the same instants its histograms observe).
    pub fn times(&self) -> EngineTimes {
        EngineTimes {
            queued: self.arrival,
            scheduled: self.scheduled,
            first_token: self.first,
            last_token: self.last,
        }
    }

    /// The request reached its end: record finish metrics (per choice, as vLLM counts the
    /// child requests of `n > 1`) and free the slots. `error` marks an injected failure.
    pub fn finish(&mut self, error: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let now = Instant::now();
        let m = &self.eng.metrics.models[self.model];
        let sched = self.scheduled.unwrap_or(now);
        let first = self.first.unwrap_or(now);
        let last = self.last.unwrap_or(now);
        let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
        let mut max_gen = 0;
        for i in 0..self.gen.n() {
            let toks = self.gen.tokens(i);
            max_gen = max_gen.max(toks);
            let reason = match (error, self.gen.finish(i)) {
                (true, _) => FinishedReason::Error,
                (false, Some(Finish::Length)) | (false, None) => FinishedReason::Length,
                (false, Some(Finish::Stop(_) | Finish::ToolCalls)) => FinishedReason::Stop,
                (false, Some(Finish::Abort)) => FinishedReason::Abort,
                (false, Some(Finish::Error)) => FinishedReason::Error,
            };
            m.success[reason as usize].fetch_add(1, Relaxed);
            m.e2e.observe(secs(self.arrival, now));
            m.queue.observe(secs(self.arrival, sched));
            m.prefill.observe(secs(sched, first));
            m.decode.observe(secs(first, last));
            m.inference.observe(secs(sched, last));
            let tpot = if toks > 1 {
                secs(first, last) / (toks - 1) as f64
            } else {
                0.0
            };
            m.tpot.observe(tpot);
            m.req_prompt_tokens.observe(self.prompt_tokens as f64);
            m.prefill_kv_computed
                .observe(self.prompt_tokens.saturating_sub(self.cached) as f64);
            m.req_generation_tokens.observe(toks as f64);
            m.params_max_tokens.observe(self.max_tokens_param as f64);
            m.num_preemptions.observe(0.0);
        }
        m.params_n.observe(self.n as f64);
        m.max_num_generation_tokens.observe(max_gen as f64);
        self.eng.stats.finished.fetch_add(1, Relaxed);
        self.release();
    }

    fn release(&mut self) {
        if std::mem::take(&mut self.unfinished) {
            self.eng.unfinished.fetch_sub(self.n, Relaxed);
        }
        if self.permit.take().is_some() {
            self.eng.metrics.models[self.model]
                .running
                .fetch_sub(self.n as i64, Relaxed);
            let mut cache = self.eng.cache();
            cache.free(&mut self.held);
            self.eng.sync_kv(&cache);
            self.kv_tokens = 0;
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.waiting {
            self.eng.metrics.models[self.model]
                .waiting
                .fetch_sub(self.n as i64, Relaxed);
        }
        if !self.done {
            // Client went away (or a truncation): like vLLM, no success count and no e2e
            // sample, but its tokens and TTFT were already recorded.
            self.eng.stats.aborted.fetch_add(1, Relaxed);
        }
        self.release();
    }
}

fn ms_to_duration(ms: f64) -> Duration {
    if ms > 0.0 && ms.is_finite() {
        Duration::from_secs_f64(ms / 1000.0)
    } else {
        Duration::ZERO
    }
}
