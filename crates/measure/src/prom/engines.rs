//! Every engine's own names for what the proxy and the load generator read from its `/metrics`
//! page: its load (waiting queue, running batch, KV-cache use), its finished requests, its
//! token counters and its latency histograms. The one table of engine names: the proxy's
//! signal mapping (`engine::signals`), `compare`, the dashboard and the load generator's
//! comparison all read them from here. The sources each row was read from are cited in
//! docs/engines.md. Where a fact has several names, the first one a page serves is read
//! (vLLM's V1 name before its v0 one).

/// One engine's names.
#[derive(Debug)]
pub struct Names {
    /// The engine as `engine.kind` and the `kind` label name it.
    pub kind: &'static str,
    /// Every family of this engine starts with it.
    pub prefix: &'static str,
    /// Requests waiting for admission.
    pub waiting: &'static [&'static str],
    /// Requests in the running batch.
    pub running: &'static [&'static str],
    /// KV-cache use 0..1; empty when the engine exports none.
    pub kv_cache_usage: &'static [&'static str],
    /// Requests the engine finished (a counter) and the label splitting it by finish reason
    /// (`None`: one total); `None` when the engine counts none.
    pub finished: Option<(&'static str, Option<&'static str>)>,
    /// Output tokens generated, a counter (sample names).
    pub generation_tokens: &'static [&'static str],
    /// Prompt tokens processed, a counter (sample names).
    pub prompt_tokens: &'static [&'static str],
    /// Latency histograms (family names); empty when the engine has none.
    pub ttft: &'static [&'static str],
    pub tpot: &'static [&'static str],
    pub e2e: &'static [&'static str],
    /// The `Server` header the engine's own HTTP server puts on every answer; `None` when it
    /// sends none (TGI's axum) or a shared one (`uvicorn`: vLLM, SGLang, TensorRT-LLM).
    pub server: Option<&'static str>,
}

pub const VLLM: Names = Names {
    kind: "vllm",
    prefix: "vllm:",
    waiting: &["vllm:num_requests_waiting"],
    running: &["vllm:num_requests_running"],
    // V1 name first; V0 called it gpu_cache_usage_perc.
    kv_cache_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    // Every finished request (stop, length, abort, ...), by `finished_reason`.
    finished: Some(("vllm:request_success_total", Some("finished_reason"))),
    generation_tokens: &["vllm:generation_tokens_total"],
    prompt_tokens: &["vllm:prompt_tokens_total"],
    ttft: &["vllm:time_to_first_token_seconds"],
    // V1's per-request TPOT; v0's name, closer to an inter-token latency, when V1's is absent.
    tpot: &[
        "vllm:request_time_per_output_token_seconds",
        "vllm:time_per_output_token_seconds",
    ],
    e2e: &["vllm:e2e_request_latency_seconds"],
    server: None,
};

pub const SGLANG: Names = Names {
    kind: "sglang",
    prefix: "sglang:",
    waiting: &["sglang:num_queue_reqs"],
    running: &["sglang:num_running_reqs"],
    // The fullest of its KV pools (full, sliding-window, mamba): what stalls admissions.
    kv_cache_usage: &["sglang:token_usage"],
    // Every finished request, no reason label.
    finished: Some(("sglang:num_requests_total", None)),
    generation_tokens: &["sglang:generation_tokens_total"],
    prompt_tokens: &["sglang:prompt_tokens_total"],
    // Its TTFT grid starts at 0.1 s (`TokenizerMetricsCollector`).
    ttft: &["sglang:time_to_first_token_seconds"],
    tpot: &["sglang:request_time_per_output_token_seconds"],
    e2e: &["sglang:e2e_request_latency_seconds"],
    server: None,
};

pub const LLAMACPP: Names = Names {
    kind: "llamacpp",
    prefix: "llamacpp:",
    // Tasks deferred for want of a free slot; only served with `--metrics`.
    waiting: &["llamacpp:requests_deferred"],
    running: &["llamacpp:requests_processing"],
    // Removed from recent llama-server builds; read when an older one serves it.
    kv_cache_usage: &["llamacpp:kv_cache_usage_ratio"],
    // `--metrics` counts tokens and decode calls, not requests.
    finished: None,
    generation_tokens: &["llamacpp:tokens_predicted_total"],
    // Prompt tokens evaluated, the cached ones left out.
    prompt_tokens: &["llamacpp:prompt_tokens_total"],
    // Counters and gauges only.
    ttft: &[],
    tpot: &[],
    e2e: &[],
    // On every answer (`set_default_headers`, tools/server/server-http.cpp), the 501 of
    // `/metrics` without `--metrics` included: the kind is known without its families.
    server: Some("llama.cpp"),
};

pub const TGI: Names = Names {
    kind: "tgi",
    prefix: "tgi_",
    waiting: &["tgi_queue_size"],
    running: &["tgi_batch_current_size"],
    // TGI exports no KV-cache use (only token budgets: tgi_batch_current_max_tokens).
    kv_cache_usage: &[],
    // Successful requests only (`tgi_request_count` counts every request, failed too).
    finished: Some(("tgi_request_success", None)),
    // Histograms of tokens per request: their sums count the tokens.
    generation_tokens: &["tgi_request_generated_tokens_sum"],
    prompt_tokens: &["tgi_request_input_length_sum"],
    // No TTFT histogram; `tgi_request_mean_time_per_token_duration` divides a time that
    // includes the prefill, so it is no TPOT. No model label.
    ttft: &[],
    tpot: &[],
    e2e: &["tgi_request_duration"],
    server: None,
};

pub const TRTLLM: Names = Names {
    kind: "trtllm",
    prefix: "trtllm_",
    waiting: &["trtllm_num_requests_waiting"],
    running: &["trtllm_num_requests_running"],
    kv_cache_usage: &["trtllm_kv_cache_utilization"],
    finished: Some(("trtllm_request_success_total", Some("finished_reason"))),
    generation_tokens: &["trtllm_generation_tokens_total"],
    prompt_tokens: &["trtllm_prompt_tokens_total"],
    // vLLM's collector adapted, grids included.
    ttft: &["trtllm_time_to_first_token_seconds"],
    tpot: &["trtllm_time_per_output_token_seconds"],
    e2e: &["trtllm_e2e_request_latency_seconds"],
    server: None,
};

/// Every engine, in the order detection breaks ties.
pub const ENGINES: [&Names; 5] = [&VLLM, &SGLANG, &LLAMACPP, &TGI, &TRTLLM];

/// The engine named `kind` (as [`Names::kind`]).
pub fn named(kind: &str) -> Option<&'static Names> {
    ENGINES.into_iter().find(|n| n.kind == kind)
}

/// The engine whose name prefix most of `families` carry (ties go to the earlier engine);
/// `None` when none carries any.
pub fn by_prefix<'a>(
    families: impl IntoIterator<Item = &'a str> + Clone,
) -> Option<&'static Names> {
    ENGINES
        .into_iter()
        .map(|n| {
            let count = families
                .clone()
                .into_iter()
                .filter(|f| f.starts_with(n.prefix))
                .count();
            (count, n)
        })
        .filter(|(c, _)| *c > 0)
        .fold(
            None,
            |best: Option<(usize, &'static Names)>, (c, n)| match best {
                Some((b, _)) if b >= c => best,
                _ => Some((c, n)),
            },
        )
        .map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_carries_its_engines_prefix() {
        for n in ENGINES {
            let finished = n.finished.map(|(f, _)| f);
            let all = n
                .waiting
                .iter()
                .chain(n.running)
                .chain(n.kv_cache_usage)
                .chain(n.generation_tokens)
                .chain(n.prompt_tokens)
                .chain(n.ttft)
                .chain(n.tpot)
                .chain(n.e2e)
                .chain(finished.iter());
            for name in all {
                assert!(name.starts_with(n.prefix), "{name} in {}", n.kind);
            }
            assert!(!n.waiting.is_empty() && !n.running.is_empty(), "{}", n.kind);
            assert_eq!(named(n.kind).map(|x| x.kind), Some(n.kind));
        }
    }

    #[test]
    fn the_prefix_most_families_carry() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&[], None),
            (&["process_cpu_seconds_total"], None),
            (&["llamacpp:tokens_predicted_total"], Some("llamacpp")),
            (
                &["tgi_queue_size", "tgi_request_count", "vllm:x"],
                Some("tgi"),
            ),
            (&["sglang:a", "vllm:b"], Some("vllm")),
        ];
        for (families, want) in cases {
            let got = by_prefix(families.iter().copied()).map(|n| n.kind);
            assert_eq!(got, *want, "{families:?}");
        }
    }
}
