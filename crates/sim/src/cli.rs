//! `goodput-proxy sim`: flags override the `[sim]` table of `--config`, which overrides the
//! defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;

use super::config::{Jitter, SimConfig};
use super::faults::FaultRule;
use super::personality::Personality;
use super::SimServer;

/// Flags of `goodput-proxy sim`. Every timing flag is in milliseconds.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Served model name (repeat for more names). Default: `tiny`.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// Seed of token text, timing jitter and fault draws.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Base time to first token of an unqueued request.
    #[arg(long)]
    pub ttft_ms: Option<f64>,
    /// Extra prefill time per prompt token.
    #[arg(long)]
    pub prefill_ms_per_token: Option<f64>,
    /// Decode step per output token with one running sequence.
    #[arg(long)]
    pub tpot_ms: Option<f64>,
    /// Extra decode-step time per additional running sequence.
    #[arg(long)]
    pub tpot_ms_per_seq: Option<f64>,
    /// Distribution of every timing cost around its mean.
    #[arg(long, value_enum)]
    pub jitter: Option<Jitter>,
    /// Coefficient of variation for normal / lognormal jitter.
    #[arg(long)]
    pub jitter_cv: Option<f64>,
    /// Most sequences running at once; the rest wait FIFO.
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Context length; larger max_tokens get vLLM's 400.
    #[arg(long)]
    pub max_model_len: Option<u64>,
    /// KV-cache capacity in tokens (for kv_cache_usage_perc).
    #[arg(long)]
    pub kv_cache_tokens: Option<u64>,
    /// Per-token probability of an EOS (finish_reason "stop").
    #[arg(long)]
    pub stop_prob: Option<f64>,
    /// Per-token probability of an empty content delta.
    #[arg(long)]
    pub empty_delta_prob: Option<f64>,
    /// Per-token probability that the next token joins the same SSE event (seeded).
    #[arg(long)]
    pub coalesce_prob: Option<f64>,
    /// Emit vLLM v0 metric names (gpu_cache_usage_perc, time_per_output_token_seconds).
    #[arg(long)]
    pub legacy_metric_names: bool,
    /// A fault drawn per request: `PROB:FAULTS`, e.g. `0.05:status=503` (repeatable).
    #[arg(long = "fault")]
    pub faults: Vec<FaultRule>,
    /// Put the engine's own timings (`metrics`) on the final usage chunk and JSON answers.
    #[arg(long)]
    pub enable_per_request_metrics: bool,
    /// Usage on every chunk and a final usage chunk, whatever the request asks.
    #[arg(long)]
    pub enable_force_include_usage: bool,
    /// One event per this many tokens after the first (vLLM `--stream-interval`).
    #[arg(long)]
    pub stream_interval: Option<u64>,
    /// Seconds of stream idleness before a `: keep-alive` comment (0: off).
    #[arg(long)]
    pub sse_keep_alive_interval: Option<f64>,
    /// Answer as this engine: its /metrics families and stream differences.
    #[arg(long, value_enum)]
    pub personality: Option<Personality>,
    /// SGLang's flag: every stream ends with a usage chunk, asked for or not.
    #[arg(long)]
    pub stream_response_default_include_usage: bool,
    /// Serve no metrics (llama-server without `--metrics`: its /metrics answers 501).
    #[arg(long)]
    pub no_metrics: bool,
    /// Turn automatic prefix caching off (vLLM `--no-prefix-caching`).
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Tokens per KV block (vLLM `--block-size`).
    #[arg(long)]
    pub block_size: Option<u64>,
    /// Tokens one engine step computes at most: decodes first, then prefill chunks.
    #[arg(long)]
    pub max_num_batched_tokens: Option<u64>,
    /// Engine speed: every cost is divided by it (0.5 is half speed).
    #[arg(long)]
    pub speed: Option<f64>,
    /// Cap on unfinished sequences; over it, vLLM's 503 (admission rejection).
    #[arg(long)]
    pub max_num_queued_reqs: Option<u64>,
    /// Share of over-cap streams rejected in-band (200, one error event) instead of with 503.
    #[arg(long)]
    pub admission_inband_prob: Option<f64>,
    /// Add usage.prompt_tokens_details (cached_tokens) as vLLM's flag of that name.
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
    /// TOML config file; its `[sim]` table is read.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(serde::Deserialize, Default)]
struct FileWithSim {
    #[serde(default)]
    sim: Option<toml::Value>,
}

impl SimArgs {
    /// The effective config: defaults, then the file's `[sim]` table, then flags.
    pub fn to_config(&self) -> anyhow::Result<SimConfig> {
        let mut cfg = match &self.config {
            None => SimConfig::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let file: FileWithSim =
                    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
                match file.sim {
                    Some(v) => v
                        .try_into()
                        .with_context(|| format!("[sim] in {}", path.display()))?,
                    None => SimConfig::default(),
                }
            }
        };
        if !self.models.is_empty() {
            cfg.models = self.models.clone();
        }
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { cfg.$f = v; } )* };
        }
        set!(
            seed,
            ttft_ms,
            prefill_ms_per_token,
            tpot_ms,
            tpot_ms_per_seq,
            jitter,
            jitter_cv,
            max_num_seqs,
            max_model_len,
            kv_cache_tokens,
            stop_prob,
            empty_delta_prob,
            coalesce_prob,
            stream_interval,
            sse_keep_alive_interval,
            block_size,
            max_num_batched_tokens,
            speed,
            admission_inband_prob
        );
        if self.max_num_queued_reqs.is_some() {
            cfg.max_num_queued_reqs = self.max_num_queued_reqs;
        }
        cfg.legacy_metric_names |= self.legacy_metric_names;
        cfg.enable_per_request_metrics |= self.enable_per_request_metrics;
        cfg.enable_force_include_usage |= self.enable_force_include_usage;
        if let Some(p) = self.personality {
            cfg.personality = p;
        }
        cfg.stream_response_default_include_usage |= self.stream_response_default_include_usage;
        cfg.metrics_off |= self.no_metrics;
        cfg.enable_prefix_caching &= !self.no_prefix_caching;
        cfg.enable_prompt_tokens_details |= self.enable_prompt_tokens_details;
        if !self.faults.is_empty() {
            cfg.faults = self.faults.clone();
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Runs the simulator until SIGINT or SIGTERM.
pub async fn run_cli(args: SimArgs) -> anyhow::Result<()> {
    let cfg = args.to_config()?;
    let server = SimServer::bind(cfg.clone(), args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = server.local_addr();
    tracing::info!(%addr, models = ?cfg.models, ttft_ms = cfg.ttft_ms, tpot_ms = cfg.tpot_ms, max_num_seqs = cfg.max_num_seqs, "sim listening");
    eprintln!(
        "goodput-proxy sim listening on http://{addr} (models: {})",
        cfg.models.join(", ")
    );
    tokio::select! {
        _ = server.run() => {}
        _ = shutdown_signal() => {}
    }
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn flags_override_file_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[sim]\nttft_ms = 7\ntpot_ms = 3\nmodels = [\"f\"]\n[other]\nx = 1\n",
        )
        .unwrap();
        let t = T::parse_from([
            "x",
            "--config",
            path.to_str().unwrap(),
            "--tpot-ms",
            "1.5",
            "--model",
            "a",
            "--model",
            "b",
            "--fault",
            "0.5:status=503",
            "--enable-per-request-metrics",
            "--enable-force-include-usage",
            "--stream-interval",
            "4",
            "--sse-keep-alive-interval",
            "0.5",
            "--coalesce-prob",
            "0.3",
            "--no-prefix-caching",
            "--block-size",
            "128",
            "--speed",
            "0.5",
            "--max-num-queued-reqs",
            "4",
            "--max-num-batched-tokens",
            "512",
            "--enable-prompt-tokens-details",
        ]);
        let cfg = t.sim.to_config().unwrap();
        assert_eq!(cfg.ttft_ms, 7.0);
        assert_eq!(cfg.tpot_ms, 1.5);
        assert_eq!(cfg.models, vec!["a", "b"]);
        assert_eq!(cfg.faults.len(), 1);
        assert!(cfg.enable_per_request_metrics && cfg.enable_force_include_usage);
        assert_eq!((cfg.stream_interval, cfg.sse_keep_alive_interval), (4, 0.5));
        assert_eq!(cfg.coalesce_prob, 0.3);
        assert!(!cfg.enable_prefix_caching && cfg.enable_prompt_tokens_details);
        assert_eq!((cfg.block_size, cfg.max_num_batched_tokens), (128, 512));
        assert_eq!((cfg.speed, cfg.max_num_queued_reqs), (0.5, Some(4)));
        let bad = T::parse_from(["x", "--max-num-seqs", "0"]);
        assert!(bad.sim.to_config().is_err());
    }
}
