//! Engine personalities: the simulator answering as SGLang, llama.cpp's `llama-server`, TGI or
//! TensorRT-LLM's `trtllm-serve` instead of vLLM. The scheduling and timing model stays the
//! same; what differs is what each engine exposes:
//! - `/metrics`: each engine's own families (names, types, labels, bucket grids, number
//!   formatting) for the same state (a subset: the load signals, the latency histograms and the
//!   token and request counters), rendered by [`Personality::render_metrics`];
//! - where the Prometheus text is served ([`Personality::metrics_path`]: `trtllm-serve` serves
//!   it on `/prometheus/metrics`);
//! - the stream: SGLang's `--stream-response-default-include-usage` (usage the client did not
//!   ask for), llama.cpp's `timings` on the last chunk ([`timings`]) and its `prompt_progress`
//!   chunks before the first token ([`progress`]);
//! - the `Server` header (llama-server names itself), and llama-server without `--metrics`.
//!
//! Shaped from each engine's source; files and commits are cited in docs/engines.md.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::LazyLock;

use serde::Deserialize;

use crate::metrics::{py_float, EngineMetrics, Grids, Histogram, ModelMetrics, VLLM_GRIDS};

/// Which engine the simulator answers as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Personality {
    #[default]
    Vllm,
    Sglang,
    Llamacpp,
    Tgi,
    Trtllm,
}

/// SGLang's default TTFT grid (`TokenizerMetricsCollector`): it starts at 0.1 s.
const SGLANG_TTFT: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];
const SGLANG_ITL: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
];
const SGLANG_E2E: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 600.0, 1200.0, 1800.0, 2400.0,
];

/// TGI's grid for every `*duration` histogram: 35 bounds, 0.0001 * 1.5^k, k = 1..=35.
static TGI_DURATION: LazyLock<Vec<f64>> = LazyLock::new(|| {
    let mut v = 0.0001;
    (0..35)
        .map(|_| {
            v *= 1.5;
            v
        })
        .collect()
});

impl Personality {
    pub const ALL: [Personality; 5] = [
        Personality::Vllm,
        Personality::Sglang,
        Personality::Llamacpp,
        Personality::Tgi,
        Personality::Trtllm,
    ];

    /// The engine ends each request with llama.cpp's `timings` ([`timings`]).
    pub fn reports_timings(self) -> bool {
        self == Personality::Llamacpp
    }

    /// The engine streams `prompt_progress` chunks when a request asks (`return_progress`,
    /// [`progress`]).
    pub fn streams_progress(self, body: &[u8]) -> bool {
        self == Personality::Llamacpp && progress::asked(body)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Personality::Vllm => "vllm",
            Personality::Sglang => "sglang",
            Personality::Llamacpp => "llamacpp",
            Personality::Tgi => "tgi",
            Personality::Trtllm => "trtllm",
        }
    }

    /// The latency histograms' bucket grids.
    pub fn grids(self) -> Grids {
        match self {
            Personality::Sglang => Grids {
                ttft: SGLANG_TTFT,
                itl: SGLANG_ITL,
                tpot: SGLANG_ITL,
                e2e: SGLANG_E2E,
                ..VLLM_GRIDS
            },
            Personality::Tgi => {
                let d: &'static [f64] = &TGI_DURATION;
                Grids {
                    e2e: d,
                    queue: d,
                    tpot: d,
                    inference: d,
                    ..VLLM_GRIDS
                }
            }
            // TensorRT-LLM adapted vLLM's collector, grids included; llama.cpp has none.
            Personality::Vllm | Personality::Llamacpp | Personality::Trtllm => VLLM_GRIDS,
        }
    }

    /// The `Server` header on every answer (`None`: the engine's HTTP server sends none).
    pub fn server_header(self) -> Option<&'static str> {
        match self {
            // uvicorn's default header: vLLM, SGLang and trtllm-serve serve through it.
            Personality::Vllm | Personality::Sglang | Personality::Trtllm => Some("uvicorn"),
            // `set_default_headers({{"Server", "llama.cpp"}})`, tools/server/server-http.cpp.
            Personality::Llamacpp => Some("llama.cpp"),
            // axum adds none.
            Personality::Tgi => None,
        }
    }

    /// Sets the engine's `Server` header on an answer (the routes write uvicorn's).
    pub fn set_server_header(self, headers: &mut http::HeaderMap) {
        match self.server_header() {
            Some(v) => {
                headers.insert(http::header::SERVER, http::HeaderValue::from_static(v));
            }
            None => {
                headers.remove(http::header::SERVER);
            }
        }
    }

    /// The answer of the metrics path when the engine was started without its metrics
    /// (`metrics_off`): llama-server without `--metrics` answers 501 with its error object
    /// (`ERROR_TYPE_NOT_SUPPORTED`, tools/server/server-context.cpp); the others 404.
    pub fn metrics_off(self) -> (u16, &'static str) {
        match self {
            Personality::Llamacpp => (
                501,
                r#"{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with `--metrics`","type":"not_supported_error"}}"#,
            ),
            _ => (404, r#"{"detail":"Not Found"}"#),
        }
    }

    /// Where the engine serves Prometheus text.
    pub fn metrics_path(self) -> &'static str {
        match self {
            Personality::Trtllm => "/prometheus/metrics",
            _ => "/metrics",
        }
    }

    /// The `/metrics` page of `m` (built on [`Personality::grids`]) as this engine writes it.
    pub fn render_metrics(self, m: &EngineMetrics) -> String {
        let mut o = String::with_capacity(8 * 1024);
        match self {
            Personality::Vllm => o = m.render(),
            Personality::Sglang => sglang(&mut o, m),
            Personality::Llamacpp => llamacpp(&mut o, m),
            Personality::Tgi => tgi(&mut o, m),
            Personality::Trtllm => trtllm(&mut o, m),
        }
        o
    }
}

/// A family read per model: name, help, how to read it.
type Reading<'a> = (&'static str, &'static str, &'a dyn Fn(&ModelMetrics) -> f64);
/// A histogram family: name, help, which histogram.
type HistFamily = (&'static str, &'static str, fn(&ModelMetrics) -> &Histogram);
/// A family and whether its series carry SGLang's `is_streaming` label.
type Labelled<T> = (T, bool);

fn header(o: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sum(m: &EngineMetrics, f: impl Fn(&ModelMetrics) -> f64) -> f64 {
    m.models.iter().map(f).sum()
}

fn running(mm: &ModelMetrics) -> f64 {
    mm.running.load(Relaxed).max(0) as f64
}

fn waiting(mm: &ModelMetrics) -> f64 {
    mm.waiting.load(Relaxed).max(0) as f64
}

fn finished(mm: &ModelMetrics) -> f64 {
    (0..5).map(|r| mm.success_count(r) as f64).sum()
}

/// Buckets, `_count`, `_sum` of one series in prometheus_client's order and formatting;
/// `labels` is the sorted label list without `le`, which goes in its sorted place.
fn py_histogram(o: &mut String, name: &str, labels: &[(&str, &str)], h: &Histogram) {
    let with_le = |le: &str| {
        let mut l: Vec<(&str, &str)> = labels.to_vec();
        l.push(("le", le));
        l.sort();
        braces(&l)
    };
    for (b, c) in h.cumulative() {
        let l = with_le(&py_float(b));
        let _ = writeln!(o, "{name}_bucket{l} {}", py_float(c as f64));
    }
    let count = py_float(h.count() as f64);
    let _ = writeln!(o, "{name}_bucket{} {count}", with_le("+Inf"));
    let l = braces(labels);
    let _ = writeln!(o, "{name}_count{l} {count}");
    let _ = writeln!(o, "{name}_sum{l} {}", py_float(h.sum()));
}

fn braces(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{{{}}}", inner.join(","))
}

/// SGLang: prometheus_client in multiprocess mode (no `_created` series), labels sorted; the
/// scheduler's gauges carry its ranks, the tokenizer's histograms `is_streaming` (every
/// simulated request is reported as a stream). No `finished_reason` label anywhere.
fn sglang(o: &mut String, m: &EngineMetrics) {
    let sched = |model: &str| -> String {
        format!("{{engine_type=\"unified\",model_name=\"{model}\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"}}")
    };
    let kv = m.kv_usage();
    let gauges: [Reading; 4] = [
        (
            "sglang:num_running_reqs",
            "The number of running requests.",
            &running,
        ),
        (
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            &waiting,
        ),
        (
            "sglang:cache_hit_rate",
            "The prefix cache hit rate.",
            &|mm: &ModelMetrics| {
                let q = mm.prefix_queries.load(Relaxed);
                if q == 0 {
                    0.0
                } else {
                    mm.prefix_hits.load(Relaxed) as f64 / q as f64
                }
            },
        ),
        ("sglang:token_usage", "The token usage.", &|_| kv),
    ];
    for (name, help, f) in gauges {
        header(o, name, help, "gauge");
        for (i, mm) in m.models.iter().enumerate() {
            let _ = writeln!(o, "{name}{} {}", sched(&m.names()[i]), py_float(f(mm)));
        }
    }
    let counters: [Labelled<Reading>; 3] = [
        (
            (
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                &|mm| mm.prompt_tokens.load(Relaxed) as f64,
            ),
            true,
        ),
        (
            (
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                &|mm| mm.generation_tokens.load(Relaxed) as f64,
            ),
            true,
        ),
        (
            (
                "sglang:num_requests_total",
                "Number of requests processed.",
                &finished,
            ),
            false,
        ),
    ];
    for ((name, help, f), streaming) in counters {
        header(o, name, help, "counter");
        for (i, mm) in m.models.iter().enumerate() {
            let model = &m.names()[i];
            let l = if streaming {
                format!("{{engine_type=\"unified\",is_streaming=\"true\",model_name=\"{model}\"}}")
            } else {
                format!("{{engine_type=\"unified\",model_name=\"{model}\"}}")
            };
            let _ = writeln!(o, "{name}{l} {}", py_float(f(mm)));
        }
    }
    let hists: [Labelled<HistFamily>; 4] = [
        (("sglang:time_to_first_token_seconds",
"Histogram of time to first token in seconds.",
|mm| &mm.ttft), true),
        (("sglang:inter_token_latency_seconds",
"Histogram of inter-token latency in seconds.",
|mm| &mm.itl), false),
        (("sglang:request_time_per_output_token_seconds",
"Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
|mm| &mm.tpot), true),
        (("sglang:e2e_request_latency_seconds",
"Histogram of End-to-end request latency in seconds",
|mm| &mm.e2e), true),
    ];
    for ((name, help, h), streaming) in hists {
        header(o, name, help, "histogram");
        for (i, mm) in m.models.iter().enumerate() {
            let model = m.names()[i].as_str();
            let mut l = vec![("engine_type", "unified"), ("model_name", model)];
            if streaming {
                l.insert(1, ("is_streaming", "true"));
            }
            py_histogram(o, name, &l, h(mm));
        }
    }
}

/// A double as C++'s `std::ostream <<` writes it (`%g`, 6 significant digits).
pub fn cpp_double(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return match v {
            v if v.is_nan() => "nan".into(),
            v if v == f64::INFINITY => "inf".into(),
            v if v == f64::NEG_INFINITY => "-inf".into(),
            _ => "0".into(),
        };
    }
    let sci = format!("{v:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(&format!("{v:.decimals$}"))
    }
}

/// llama.cpp's `llama-server --metrics`: unlabelled counters then gauges, each with its HELP
/// and TYPE, values as C++ prints doubles; one model per server (all names summed).
fn llamacpp(o: &mut String, m: &EngineMetrics) {
    let prompt = sum(m, |mm| mm.prompt_tokens.load(Relaxed) as f64);
    let cached = sum(m, |mm| mm.prompt_cached.load(Relaxed) as f64);
    let prompt_s = sum(m, |mm| mm.prefill.sum());
    let predicted = sum(m, |mm| mm.generation_tokens.load(Relaxed) as f64);
    let predicted_s = sum(m, |mm| mm.decode.sum());
    let decodes = sum(m, |mm| mm.iteration_tokens.count() as f64);
    let rate = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
    let items: [(&str, &str, &str, f64); 11] = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", "counter", prompt - cached),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", "counter", cached),
        ("prompt_seconds_total", "Total time spent processing prompts", "counter", prompt_s),
        ("tokens_predicted_total", "Number of generation tokens processed", "counter", predicted),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", "counter", predicted_s),
        ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding", "counter", decodes),
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", "gauge", rate(prompt - cached, prompt_s)),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s", "gauge", rate(predicted, predicted_s)),
        ("requests_processing", "Number of requests processing", "gauge", sum(m, running)),
        ("requests_deferred", "Number of requests deferred", "gauge", sum(m, waiting)),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", "gauge", rate(predicted, decodes)),
    ];
    for (name, help, kind, v) in items {
        header(o, &format!("llamacpp:{name}"), help, kind);
        let _ = writeln!(o, "llamacpp:{name} {}", cpp_double(v));
    }
}

/// TGI (metrics-exporter-prometheus): no model label, integers for counters, Rust's float
/// formatting, every `*duration` histogram on one geometric grid; no TTFT histogram at all.
fn tgi(o: &mut String, m: &EngineMetrics) {
    let finished = sum(m, finished) as u64;
    let success = sum(m, |mm| (mm.success_count(0) + mm.success_count(1)) as f64) as u64;
    let counters = [
        ("tgi_request_count", "Total number of requests", finished),
        (
            "tgi_request_success",
            "Number of successful requests",
            success,
        ),
    ];
    for (name, help, v) in counters {
        header(o, name, help, "counter");
        let _ = writeln!(o, "{name} {v}");
    }
    let gauges = [
        ("tgi_queue_size", "Current queue size", sum(m, waiting)),
        (
            "tgi_batch_current_size",
            "Current batch size",
            sum(m, running),
        ),
    ];
    for (name, help, v) in gauges {
        header(o, name, help, "gauge");
        let _ = writeln!(o, "{name} {v}");
    }
    let hists: [HistFamily; 4] = [
        (
            "tgi_request_duration",
            "Total time spent processing the request",
            |mm| &mm.e2e,
        ),
        (
            "tgi_request_queue_duration",
            "Time spent in the queue per request",
            |mm| &mm.queue,
        ),
        (
            "tgi_request_inference_duration",
            "Request inference duration",
            |mm| &mm.inference,
        ),
        (
            "tgi_request_mean_time_per_token_duration",
            "Mean time per token per request",
            |mm| &mm.tpot,
        ),
    ];
    for (name, help, h) in hists {
        header(o, name, help, "histogram");
        let per: Vec<Vec<(f64, u64)>> = m.models.iter().map(|mm| h(mm).cumulative()).collect();
        let bounds = per.first().map(|p| p.len()).unwrap_or(0);
        for i in 0..bounds {
            let le = per[0][i].0;
            let c: u64 = per.iter().map(|p| p[i].1).sum();
            let _ = writeln!(o, "{name}_bucket{{le=\"{le}\"}} {c}");
        }
        let count: u64 = m.models.iter().map(|mm| h(mm).count()).sum();
        let total: f64 = m.models.iter().map(|mm| h(mm).sum()).sum();
        let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(o, "{name}_sum {total}");
        let _ = writeln!(o, "{name}_count {count}");
    }
}

/// TensorRT-LLM's `trtllm-serve` (prometheus_client, default registry: `_created` series),
/// labels `engine_type="trtllm"` and `model_name`, `finished_reason` on the success counter.
fn trtllm(o: &mut String, m: &EngineMetrics) {
    let created = py_float(m.created());
    let labels = |model: &str| format!("{{engine_type=\"trtllm\",model_name=\"{model}\"}}");
    let help = "Count of successfully processed requests.";
    header(o, "trtllm_request_success_total", help, "counter");
    let reasons = crate::metrics::FINISHED_REASONS;
    let reason_labels = |model: &str, r: &str| {
        format!("{{engine_type=\"trtllm\",finished_reason=\"{r}\",model_name=\"{model}\"}}")
    };
    for (i, mm) in m.models.iter().enumerate() {
        for (r, reason) in reasons.iter().enumerate() {
            let l = reason_labels(&m.names()[i], reason);
            let v = py_float(mm.success_count(r) as f64);
            let _ = writeln!(o, "trtllm_request_success_total{l} {v}");
        }
    }
    header(o, "trtllm_request_success_created", help, "gauge");
    for name in m.names() {
        for reason in reasons {
            let l = reason_labels(name, reason);
            let _ = writeln!(o, "trtllm_request_success_created{l} {created}");
        }
    }
    let hists: [HistFamily; 4] = [
        (
            "trtllm_e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            |mm| &mm.e2e,
        ),
        (
            "trtllm_time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            |mm| &mm.ttft,
        ),
        (
            "trtllm_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            |mm| &mm.tpot,
        ),
        (
            "trtllm_request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            |mm| &mm.queue,
        ),
    ];
    for (name, help, h) in hists {
        header(o, name, help, "histogram");
        for (i, mm) in m.models.iter().enumerate() {
            let model = m.names()[i].as_str();
            py_histogram(
                o,
                name,
                &[("engine_type", "trtllm"), ("model_name", model)],
                h(mm),
            );
        }
        header(o, &format!("{name}_created"), help, "gauge");
        for model in m.names() {
            let _ = writeln!(o, "{name}_created{} {created}", labels(model));
        }
    }
    let counters: [Reading; 2] = [
        (
            "trtllm_prompt_tokens",
            "Cumulative number of prompt (input) tokens processed.",
            &|mm: &ModelMetrics| mm.prompt_tokens.load(Relaxed) as f64,
        ),
        (
            "trtllm_generation_tokens",
            "Cumulative number of generation (output) tokens produced.",
            &|mm: &ModelMetrics| mm.generation_tokens.load(Relaxed) as f64,
        ),
    ];
    for (name, help, f) in counters {
        header(o, &format!("{name}_total"), help, "counter");
        for (i, mm) in m.models.iter().enumerate() {
            let _ = writeln!(
                o,
                "{name}_total{} {}",
                labels(&m.names()[i]),
                py_float(f(mm))
            );
        }
        header(o, &format!("{name}_created"), help, "gauge");
        for model in m.names() {
            let _ = writeln!(o, "{name}_created{} {created}", labels(model));
        }
    }
    let kv = m.kv_usage();
    let gauges: [Reading; 3] = [
        (
            "trtllm_kv_cache_utilization",
            "KV cache utilization",
            &|_| kv,
        ),
        (
            "trtllm_num_requests_running",
            "Number of active requests",
            &running,
        ),
        (
            "trtllm_num_requests_waiting",
            "Number of queued requests",
            &waiting,
        ),
    ];
    for (name, help, f) in gauges {
        header(o, name, help, "gauge");
        for (i, mm) in m.models.iter().enumerate() {
            let _ = writeln!(o, "{name}{} {}", labels(&m.names()[i]), py_float(f(mm)));
        }
    }
}

pub mod progress;
pub mod timings;

#[cfg(test)]
mod tests;
