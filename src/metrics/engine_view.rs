//! Metrics of the engine's own view of each request and of where TTFT went: the engine's
//! queue time and prefill (its TTFT, from scheduling) on vLLM's request-latency grid (the
//! grid of `vllm:request_queue_time_seconds` and `vllm:request_prefill_time_seconds`, so they
//! line up bucket by bucket), the rest of the client's TTFT that no engine histogram shows on
//! the TTFT grid, cached prompt tokens, and stalls (gaps between output events over
//! `measure.stall_ms`). Labels: `model` and `upstream`, from the bounded label sets.

use goodput_measure::meter::Measurement;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::{E2E_BUCKETS, TTFT_BUCKETS};

#[derive(Clone)]
pub struct EngineViewMetrics {
    queue: HistogramVec,
    prefill: HistogramVec,
    rest: HistogramVec,
    cached_tokens: IntCounterVec,
    stalls: IntCounterVec,
}

fn hist(name: &str, help: &str, buckets: &[f64]) -> Result<HistogramVec, prometheus::Error> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &["model", "upstream"],
    )
}

impl EngineViewMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = EngineViewMetrics {
            queue: hist(
                "goodput_proxy_engine_queue_seconds",
                "The engine's own queue time of each request it reported (vLLM per-request metrics).",
                E2E_BUCKETS,
            )?,
            prefill: hist(
                "goodput_proxy_engine_prefill_seconds",
                "The engine's own time to first token, from scheduling (without its queue), of each request it reported.",
                E2E_BUCKETS,
            )?,
            rest: hist(
                "goodput_proxy_ttft_rest_seconds",
                "Client TTFT minus the proxy's time, the engine's queue and its prefill: network, the engine's front end, tokenization, the way back.",
                TTFT_BUCKETS,
            )?,
            cached_tokens: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_cached_prompt_tokens_total",
                    "Prompt tokens the engine served from its prefix cache (usage prompt_tokens_details.cached_tokens).",
                ),
                &["model", "upstream"],
            )?,
            stalls: IntCounterVec::new(
                Opts::new(
                    "goodput_proxy_stalls_total",
                    "Gaps between a stream's output events longer than measure.stall_ms.",
                ),
                &["model", "upstream"],
            )?,
        };
        for h in [&m.queue, &m.prefill, &m.rest] {
            registry.register(Box::new(h.clone()))?;
        }
        registry.register(Box::new(m.cached_tokens.clone()))?;
        registry.register(Box::new(m.stalls.clone()))?;
        Ok(m)
    }

    /// One finished request; `model` and `upstream` already bounded label values.
    pub fn observe(&self, model: &str, upstream: &str, m: &Measurement) {
        let l = [model, upstream];
        if let Some(d) = m.engine.queue {
            self.queue.with_label_values(&l).observe(d.as_secs_f64());
        }
        if let Some(d) = m.engine.ttft {
            self.prefill.with_label_values(&l).observe(d.as_secs_f64());
        }
        if let Some(d) = m.ttft_split.rest {
            self.rest.with_label_values(&l).observe(d.as_secs_f64());
        }
        if let Some(n) = m.engine.cached_prompt_tokens {
            self.cached_tokens.with_label_values(&l).inc_by(n);
        }
        if m.stalls > 0 {
            self.stalls.with_label_values(&l).inc_by(m.stalls);
        }
    }
}
