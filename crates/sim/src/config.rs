//! Simulator settings: one serde struct shared by the `[sim]` config table, the CLI and tests.

use serde::Deserialize;

use super::faults::FaultRule;
use super::personality::Personality;

/// How each timing cost varies around its configured mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Jitter {
    /// Every cost is exactly its configured value.
    #[default]
    Constant,
    /// Normal around the mean with standard deviation `jitter_cv * mean`, clipped at 0.
    Normal,
    /// Log-normal with mean 1 and coefficient of variation `jitter_cv` (long right tail).
    Lognormal,
    /// Exponential with the configured mean (`jitter_cv` is ignored; cv is 1).
    Exponential,
}

/// Settings of the simulated engine. Every field has a default, so a `[sim]` table may name
/// only what it changes; unknown keys are rejected.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Served model names; requests for any other name get vLLM's 404.
    pub models: Vec<String>,
    /// Seed of everything random: token text, timing jitter, fault draws.
    pub seed: u64,
    /// Base prefill time (time to first token of an unqueued request), milliseconds.
    pub ttft_ms: f64,
    /// Extra prefill time per prompt token, milliseconds.
    pub prefill_ms_per_token: f64,
    /// Decode step (time per output token) with one running sequence, milliseconds.
    pub tpot_ms: f64,
    /// Extra decode-step time per additional running sequence, milliseconds: the step grows
    /// with the batch as on a real engine.
    pub tpot_ms_per_seq: f64,
    /// Distribution of every timing cost around its mean.
    pub jitter: Jitter,
    /// Coefficient of variation for `normal` and `lognormal` jitter.
    pub jitter_cv: f64,
    /// Most sequences running at once (vLLM `--max-num-seqs`); the rest wait FIFO.
    pub max_num_seqs: usize,
    /// Context length; `max_tokens` above it is answered with vLLM's 400.
    pub max_model_len: u64,
    /// KV-cache capacity in tokens; `kv_cache_usage_perc` = tokens held / capacity.
    pub kv_cache_tokens: u64,
    /// Per-token probability of an end-of-sequence token (`finish_reason: "stop"`), unless the
    /// request sets `ignore_eos`.
    pub stop_prob: f64,
    /// Per-token probability of an empty `content` delta (a partial UTF-8 byte token, as real
    /// vLLM emits); such a token still counts in usage.
    pub empty_delta_prob: f64,
    /// Per-token probability that a stream event is held and the next token of the same
    /// choice joins it (vLLM packs tokens into one event under load); usage stays exact.
    pub coalesce_prob: f64,
    /// Emit vLLM v0 metric names (`gpu_cache_usage_perc`, `time_per_output_token_seconds`).
    pub legacy_metric_names: bool,
    /// Faults drawn per request with the given probabilities (seeded, in arrival order).
    pub faults: Vec<FaultRule>,
    /// vLLM `--enable-per-request-metrics`: the final usage chunk of a stream (only when it
    /// is sent) and every JSON answer of one choice carry the engine's own `metrics` (queue,
    /// time to first token from scheduling, generation time, mean ITL, tokens per second).
    pub enable_per_request_metrics: bool,
    /// vLLM `--enable-force-include-usage`: usage on every chunk and a final usage chunk,
    /// whatever the request's `stream_options` say.
    pub enable_force_include_usage: bool,
    /// vLLM `--stream-interval`: the first token goes out alone, then one event per this
    /// many tokens (the rest with the finish).
    pub stream_interval: u64,
    /// vLLM `--sse-keep-alive-interval`, seconds (0: off): a `: keep-alive` comment frame
    /// whenever a stream has been idle this long. vLLM takes whole seconds; fractions are
    /// allowed here for tests.
    pub sse_keep_alive_interval: f64,
    /// Automatic prefix caching (vLLM V1's default; `--no-prefix-caching` turns it off): full
    /// prompt blocks stay cached after their request ends until evicted, least recently used
    /// first, and a later prompt with the same prefix skips their prefill.
    pub enable_prefix_caching: bool,
    /// Tokens per KV block (vLLM `--block-size`; 16 on GPUs, 128 on vLLM's CPU backend).
    pub block_size: u64,
    /// Tokens one engine step computes at most (vLLM `--max-num-batched-tokens`): one per
    /// decoding sequence, the rest for prompts in prefill, chunk by chunk.
    pub max_num_batched_tokens: u64,
    /// Speed of this engine: every cost is divided by it (0.5: half speed, every cost doubled).
    pub speed: f64,
    /// Cap on unfinished sequences (running + waiting; vLLM `--max-num-queued-reqs`): a request
    /// that would exceed it is rejected with vLLM's 503 and counted in
    /// `vllm:admission_rejections_total`. `None`: no cap.
    pub max_num_queued_reqs: Option<u64>,
    /// Share of over-cap streaming requests rejected in-band (a 200 stream whose only event is
    /// the 503 error) instead of with a 503 status, as vLLM answers requests that raced past
    /// its API server's first check.
    pub admission_inband_prob: f64,
    /// `usage.prompt_tokens_details` (`cached_tokens`, ...) as vLLM's
    /// `--enable-prompt-tokens-details` adds it.
    pub enable_prompt_tokens_details: bool,
    /// Which engine the simulator answers as (its `/metrics` families and stream
    /// differences; see `personality.rs`). Default: vLLM.
    pub personality: Personality,
    /// SGLang `--stream-response-default-include-usage`: every stream ends with a usage
    /// chunk, asked for or not (`stream_options.include_usage` or this).
    pub stream_response_default_include_usage: bool,
    /// The engine runs without its metrics (llama-server without `--metrics`): the metrics
    /// path answers as [`Personality::metrics_off`] says.
    pub metrics_off: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            models: vec!["tiny".to_string()],
            seed: 0,
            ttft_ms: 50.0,
            prefill_ms_per_token: 0.02,
            tpot_ms: 15.0,
            tpot_ms_per_seq: 0.05,
            jitter: Jitter::Constant,
            jitter_cv: 0.1,
            max_num_seqs: 256,
            max_model_len: 2048,
            kv_cache_tokens: 1_048_576,
            stop_prob: 0.0,
            empty_delta_prob: 0.0,
            coalesce_prob: 0.0,
            legacy_metric_names: false,
            faults: Vec::new(),
            enable_per_request_metrics: false,
            enable_force_include_usage: false,
            stream_interval: 1,
            sse_keep_alive_interval: 0.0,
            enable_prefix_caching: true,
            block_size: 16,
            max_num_batched_tokens: 2048,
            speed: 1.0,
            max_num_queued_reqs: None,
            admission_inband_prob: 0.0,
            enable_prompt_tokens_details: false,
            personality: Personality::Vllm,
            stream_response_default_include_usage: false,
            metrics_off: false,
        }
    }
}

/// A setting that cannot work, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("sim.{field}: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

fn check(ok: bool, field: &'static str, reason: &str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError {
            field,
            reason: reason.to_string(),
        })
    }
}

impl SimConfig {
    /// All costs zero: the engine answers as fast as it can (throughput tests, benchmarks).
    pub fn fast() -> Self {
        SimConfig {
            ttft_ms: 0.0,
            prefill_ms_per_token: 0.0,
            tpot_ms: 0.0,
            tpot_ms_per_seq: 0.0,
            ..SimConfig::default()
        }
    }

    /// Small constant costs, handy for tests that need visible but short timings.
    pub fn with_timing(ttft_ms: f64, tpot_ms: f64) -> Self {
        SimConfig {
            ttft_ms,
            tpot_ms,
            prefill_ms_per_token: 0.0,
            tpot_ms_per_seq: 0.0,
            ..SimConfig::default()
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check(!self.models.is_empty(), "models", "at least one model name")?;
        for m in &self.models {
            check(
                !m.is_empty() && m.chars().all(|c| !c.is_control() && c != '"' && c != '\\'),
                "models",
                "names must be non-empty, without quotes, backslashes or control characters",
            )?;
        }
        let costs = [
            ("ttft_ms", self.ttft_ms),
            ("prefill_ms_per_token", self.prefill_ms_per_token),
            ("tpot_ms", self.tpot_ms),
            ("tpot_ms_per_seq", self.tpot_ms_per_seq),
            ("jitter_cv", self.jitter_cv),
        ];
        for (field, v) in costs {
            check(
                v.is_finite() && v >= 0.0,
                field,
                "must be a finite number >= 0",
            )?;
        }
        check(self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1")?;
        check(
            self.max_num_seqs <= 1 << 20,
            "max_num_seqs",
            "must be <= 1048576",
        )?;
        check(self.max_model_len >= 1, "max_model_len", "must be >= 1")?;
        check(self.stream_interval >= 1, "stream_interval", "must be >= 1")?;
        check(
            self.sse_keep_alive_interval.is_finite()
                && (0.0..=86_400.0).contains(&self.sse_keep_alive_interval),
            "sse_keep_alive_interval",
            "must be between 0 (off) and 86400 seconds",
        )?;
        check(self.kv_cache_tokens >= 1, "kv_cache_tokens", "must be >= 1")?;
        check(
            (1..=1 << 16).contains(&self.block_size),
            "block_size",
            "must be between 1 and 65536",
        )?;
        check(
            self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens",
            "must be >= 1",
        )?;
        check(
            self.speed.is_finite() && self.speed > 0.0,
            "speed",
            "must be a finite number > 0",
        )?;
        for (field, p) in [
            ("stop_prob", self.stop_prob),
            ("empty_delta_prob", self.empty_delta_prob),
            ("coalesce_prob", self.coalesce_prob),
            ("admission_inband_prob", self.admission_inband_prob),
        ] {
            check(
                (0.0..=1.0).contains(&p),
                field,
                "must be a probability in [0, 1]",
            )?;
        }
        for rule in &self.faults {
            check(
                (0.0..=1.0).contains(&rule.prob),
                "faults",
                "prob must be in [0, 1]",
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_fast_is_zero_cost() {
        SimConfig::default().validate().unwrap();
        let f = SimConfig::fast();
        f.validate().unwrap();
        assert_eq!(f.ttft_ms + f.tpot_ms + f.prefill_ms_per_token, 0.0);
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: Vec<(SimConfig, &str)> = vec![
            (
                SimConfig {
                    models: vec![],
                    ..Default::default()
                },
                "models",
            ),
            (
                SimConfig {
                    tpot_ms: -1.0,
                    ..Default::default()
                },
                "tpot_ms",
            ),
            (
                SimConfig {
                    max_num_seqs: 0,
                    ..Default::default()
                },
                "max_num_seqs",
            ),
            (
                SimConfig {
                    stop_prob: 1.5,
                    ..Default::default()
                },
                "stop_prob",
            ),
            (
                SimConfig {
                    coalesce_prob: -0.1,
                    ..Default::default()
                },
                "coalesce_prob",
            ),
            (
                SimConfig {
                    stream_interval: 0,
                    ..Default::default()
                },
                "stream_interval",
            ),
            (
                SimConfig {
                    sse_keep_alive_interval: f64::NAN,
                    ..Default::default()
                },
                "sse_keep_alive_interval",
            ),
            (
                SimConfig {
                    speed: 0.0,
                    ..Default::default()
                },
                "speed",
            ),
            (
                SimConfig {
                    block_size: 0,
                    ..Default::default()
                },
                "block_size",
            ),
            (
                SimConfig {
                    max_num_batched_tokens: 0,
                    ..Default::default()
                },
                "max_num_batched_tokens",
            ),
        ];
        for (cfg, field) in cases {
            assert_eq!(cfg.validate().unwrap_err().field, field);
        }
    }

    #[test]
    fn toml_table_parses_and_rejects_unknown_keys() {
        let cfg: SimConfig = toml::from_str(
            "models = [\"a\", \"b\"]\nttft_ms = 5\ntpot_ms = 1.5\njitter = \"normal\"\ncoalesce_prob = 0.25\n\
             faults = [{ prob = 0.1, fault = \"status=503\" }]",
        )
        .unwrap();
        assert_eq!(cfg.models, vec!["a", "b"]);
        assert_eq!(cfg.tpot_ms, 1.5);
        assert_eq!(cfg.jitter, Jitter::Normal);
        assert_eq!(cfg.coalesce_prob, 0.25);
        assert_eq!(cfg.faults.len(), 1);
        assert!(toml::from_str::<SimConfig>("nope = 1").is_err());
    }
}
