//! Metrics of the engine's own view of each request and of where TTFT went: the engine's
//! queue time and prefill (its TTFT, from scheduling) on vLLM's request-latency grid (the
//! grid of `vllm:request_queue_time_seconds` and `vllm:request_prefill_time_seconds`, so they
//! line up bucket by bucket), every request it reported; the TTFT split of the requests whose
//! TTFT could be split, one family with a `part` label on the TTFT grid (the four parts of
//! one request are observed together, so per part `_sum / _count` are means over the same
//! requests and add up to their mean client TTFT: a stacked chart is exact); cached prompt
//! tokens, and stalls (gaps between output events over `measure.stall_ms`). Labels: `model`
//! and `upstream`, from the bounded label sets, and `part` from a closed enum.

use goodput_measure::meter::Measurement;

use super::family::{Counters, Histograms, Registrar};
use super::labels::{Served, SplitPart, TtftPart};
use super::{E2E_BUCKETS, TTFT_BUCKETS};

pub struct EngineViewFamilies {
    queue: Histograms<Served<'static>>,
    prefill: Histograms<Served<'static>>,
    split: Histograms<SplitPart<'static>>,
    cached_tokens: Counters<Served<'static>>,
    stalls: Counters<Served<'static>>,
}

impl EngineViewFamilies {
    pub fn register(r: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(EngineViewFamilies {
            queue: r.histograms(
                "goodput_proxy_engine_queue_seconds",
                "The engine's own queue time of each request it reported (vLLM per-request metrics).",
                E2E_BUCKETS,
            )?,
            prefill: r.histograms(
                "goodput_proxy_engine_prefill_seconds",
                "The engine's own time to first token, from scheduling (without its queue), of each request it reported.",
                E2E_BUCKETS,
            )?,
            split: r.histograms(
                "goodput_proxy_ttft_split_seconds",
                "Where the client's TTFT went, per part: proxy (request head to forwarding), engine_queue, engine_prefill (the engine's TTFT from scheduling), rest (network, the engine's front end, tokenization, the way back). The parts of a request add up to its TTFT.",
                TTFT_BUCKETS,
            )?,
            cached_tokens: r.counters(
                "goodput_proxy_cached_prompt_tokens_total",
                "Prompt tokens the engine served from its prefix cache (usage prompt_tokens_details.cached_tokens).",
            )?,
            stalls: r.counters(
                "goodput_proxy_stalls_total",
                "Gaps between a stream's output events longer than measure.stall_ms.",
            )?,
        })
    }

    /// One finished request; `model` and `upstream` already bounded label values.
    pub fn observe(&self, model: &str, upstream: &str, m: &Measurement) {
        let l = Served { model, upstream };
        let Some(report) = &m.engine else { return };
        if report.stalls > 0 {
            self.stalls.get(&l).inc_by(u64::from(report.stalls));
        }
        let (e, split) = (&report.view, &report.split);
        if let Some(d) = e.queue {
            self.queue.get(&l).observe(d.as_secs_f64());
        }
        if let Some(d) = e.ttft {
            self.prefill.get(&l).observe(d.as_secs_f64());
        }
        if let Some(parts) = split.parts() {
            for (part, d) in TtftPart::ALL.into_iter().zip(parts) {
                let series = SplitPart {
                    model,
                    upstream,
                    part,
                };
                self.split.get(&series).observe(d.as_secs_f64());
            }
        }
        if let Some(n) = e.cached_prompt_tokens {
            self.cached_tokens.get(&l).inc_by(n);
        }
    }
}
