//! The step budget: vLLM runs one engine step at a time, and each step computes at most
//! `max_num_batched_tokens` tokens: one per running (decoding) sequence, the rest for prompts
//! still in prefill, chunk by chunk, first come first served (chunked prefill). So prefill is
//! a shared line through the engine: a prompt waits for the prefill work queued before it,
//! and while that line is busy every decode step also computes a prefill chunk and takes
//! longer, which is how a long prompt slows the streams already running.
//!
//! The simulator keeps a timer per request rather than one step loop, so the line is kept as
//! the instant its queued work ends ([`PrefillLine`]); costs are pure functions of the config.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use super::config::SimConfig;

/// One decode step with `others` sequences besides this one at `speed`, milliseconds (before
/// jitter). The engine's speed may change while it runs ([`Engine::set_speed`]), so it is
/// passed in rather than read from the config.
///
/// [`Engine::set_speed`]: super::engine::Engine::set_speed
pub fn step_ms(c: &SimConfig, others: u64, speed: f64) -> f64 {
    (c.tpot_ms + c.tpot_ms_per_seq * others as f64) / speed
}

/// Prompt tokens one step can compute beside `decoding` running sequences (at least one, as
/// vLLM always makes progress).
pub fn chunk_tokens(c: &SimConfig, decoding: u64) -> u64 {
    c.max_num_batched_tokens.saturating_sub(decoding).max(1)
}

/// Time the prefill line spends on `uncached` prompt tokens beside `decoding` running
/// sequences, milliseconds: the tokens' compute, plus one more step for every chunk after the
/// first (the first chunk's step is the base `ttft_ms`).
pub fn prefill_work_ms(c: &SimConfig, uncached: u64, decoding: u64, speed: f64) -> f64 {
    let chunks = uncached.div_ceil(chunk_tokens(c, decoding)).max(1);
    c.prefill_ms_per_token * uncached as f64 / speed
        + (chunks - 1) as f64 * step_ms(c, decoding, speed)
}

/// The most prefill one decode step carries beside `decoding` sequences, milliseconds.
pub fn prefill_share_ms(c: &SimConfig, decoding: u64, speed: f64) -> f64 {
    c.prefill_ms_per_token * chunk_tokens(c, decoding) as f64 / speed
}

/// When the prefill work queued so far ends (lock-free: one atomic, nanoseconds from `epoch`).
#[derive(Debug)]
pub struct PrefillLine {
    epoch: Instant,
    free_at_ns: AtomicU64,
}

impl PrefillLine {
    pub fn new(epoch: Instant) -> Self {
        PrefillLine {
            epoch,
            free_at_ns: AtomicU64::new(0),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Queues `work` arriving at `now`; returns how long it waits for the work before it.
    pub fn reserve(&self, now: Instant, work: Duration) -> Duration {
        let now_ns = self.ns(now);
        let work_ns = work.as_nanos() as u64;
        let mut start = now_ns;
        let _ = self.free_at_ns.fetch_update(Relaxed, Relaxed, |free_at| {
            start = free_at.max(now_ns);
            Some(start + work_ns)
        });
        Duration::from_nanos(start - now_ns)
    }

    /// Prefill work still queued at `now`.
    pub fn backlog(&self, now: Instant) -> Duration {
        Duration::from_nanos(self.free_at_ns.load(Relaxed).saturating_sub(self.ns(now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(budget: u64) -> SimConfig {
        SimConfig {
            ttft_ms: 10.0,
            prefill_ms_per_token: 0.1,
            tpot_ms: 20.0,
            tpot_ms_per_seq: 1.0,
            max_num_batched_tokens: budget,
            ..SimConfig::default()
        }
    }

    #[test]
    fn prefill_is_chunked_by_what_the_decoding_sequences_leave_of_the_budget() {
        // (budget, uncached, decoding, chunk, work ms)
        let cases: &[(u64, u64, u64, u64, f64)] = &[
            (2048, 1000, 0, 2048, 100.0),
            (2048, 1000, 48, 2000, 100.0),
            // 512 - 12 = 500 per step: 2 chunks, one extra step of 20 + 12 ms.
            (512, 1000, 12, 500, 100.0 + 32.0),
            // 3 chunks of 400 (budget 400, nothing decoding): two extra steps of 20 ms.
            (400, 1000, 0, 400, 100.0 + 40.0),
            // A budget smaller than the batch still computes one prompt token per step.
            (8, 3, 10, 1, 0.3 + 2.0 * 30.0),
        ];
        for &(budget, uncached, decoding, chunk, work) in cases {
            let c = cfg(budget);
            assert_eq!(chunk_tokens(&c, decoding), chunk, "{budget} {decoding}");
            let got = prefill_work_ms(&c, uncached, decoding, 1.0);
            assert!(
                (got - work).abs() < 1e-9,
                "{budget} {uncached}: {got} != {work}"
            );
        }
    }

    #[test]
    fn speed_divides_every_cost() {
        let c = cfg(512);
        let base = (
            step_ms(&c, 3, 1.0),
            prefill_work_ms(&c, 1000, 12, 1.0),
            prefill_share_ms(&c, 12, 1.0),
        );
        assert_eq!(step_ms(&c, 3, 0.5), 2.0 * base.0);
        assert_eq!(prefill_work_ms(&c, 1000, 12, 0.5), 2.0 * base.1);
        assert_eq!(prefill_share_ms(&c, 12, 0.5), 2.0 * base.2);
    }

    #[test]
    fn the_line_serves_prefills_in_arrival_order_and_decode_steps_see_its_backlog() {
        let t0 = Instant::now();
        let line = PrefillLine::new(t0);
        let ms = Duration::from_millis;
        assert_eq!(line.reserve(t0, ms(100)), ms(0));
        // Arrives 30 ms later: waits for the 70 ms left of the first.
        assert_eq!(line.reserve(t0 + ms(30), ms(50)), ms(70));
        assert_eq!(line.backlog(t0 + ms(30)), ms(120));
        assert_eq!(line.backlog(t0 + ms(140)), ms(10));
        // After the line drains, the next one starts at once.
        assert_eq!(line.backlog(t0 + ms(200)), ms(0));
        assert_eq!(line.reserve(t0 + ms(200), ms(5)), ms(0));
    }
}
