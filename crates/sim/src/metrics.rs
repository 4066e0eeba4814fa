//! The engine's `/metrics`: vLLM V1's 39 `vllm:*` families with their names, types, label
//! order, bucket grids and `*_created` series, in the order a real vLLM 0.32 scrape lists them
//! (`shared/fixtures/vllm-0.32/metrics.txt`). `legacy` switches to the v0 names.
//!
//! Lock-free atomics only: the token path adds to a counter and observes one histogram.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
];
const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
const PREEMPTION_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// `finished_reason` label values, in the scrape's order.
pub const FINISHED_REASONS: [&str; 5] = ["stop", "length", "abort", "error", "repetition"];

/// Index of a `finished_reason` in [`FINISHED_REASONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedReason {
    Stop = 0,
    Length = 1,
    Abort = 2,
    Error = 3,
}

#[derive(Debug, Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn add(&self, v: f64) {
        let mut cur = self.0.load(Relaxed);
        loop {
            let new = (f64::from_bits(cur) + v).to_bits();
            match self.0.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(x) => cur = x,
            }
        }
    }
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Relaxed))
    }
}

/// A histogram over a fixed bucket grid (upper bounds, `+Inf` implied).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicF64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicF64::default(),
        }
    }

    pub fn observe_n(&self, v: f64, n: u64) {
        if n == 0 {
            return;
        }
        let i = self.bounds.partition_point(|&b| b < v);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(n, Relaxed);
        }
        self.count.fetch_add(n, Relaxed);
        self.sum.add(v * n as f64);
    }

    pub fn observe(&self, v: f64) {
        self.observe_n(v, 1);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    pub fn sum(&self) -> f64 {
        self.sum.get()
    }

    /// `(upper bound, cumulative count)` per bucket, `+Inf` left out (it is `count`).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut cum = 0;
        self.bounds
            .iter()
            .zip(self.counts.iter())
            .map(|(b, c)| {
                cum += c.load(Relaxed);
                (*b, cum)
            })
            .collect()
    }
}

/// The bucket grids of the latency histograms (an engine other than vLLM has its own).
#[derive(Debug, Clone, Copy)]
pub struct Grids {
    pub ttft: &'static [f64],
    pub itl: &'static [f64],
    pub tpot: &'static [f64],
    pub e2e: &'static [f64],
    pub queue: &'static [f64],
    pub inference: &'static [f64],
}

/// vLLM's grids.
pub const VLLM_GRIDS: Grids = Grids {
    ttft: TTFT_BUCKETS,
    itl: TPOT_BUCKETS,
    tpot: TPOT_BUCKETS,
    e2e: LATENCY_BUCKETS,
    queue: LATENCY_BUCKETS,
    inference: LATENCY_BUCKETS,
};

/// The series of one `model_name`.
#[derive(Debug)]
pub struct ModelMetrics {
    pub running: AtomicI64,
    pub waiting: AtomicI64,
    pub prompt_tokens: AtomicU64,
    /// Of `prompt_tokens`, those found in the prefix cache (counted with them, at prefill end).
    pub prompt_cached: AtomicU64,
    /// Prefix-cache lookups and hits in tokens, counted at admission as vLLM counts them.
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    /// Requests rejected by `max_num_queued_reqs`.
    pub admission_rejections: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub success: [AtomicU64; 5],
    pub ttft: Histogram,
    pub itl: Histogram,
    pub tpot: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub inference: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    pub req_prompt_tokens: Histogram,
    pub req_generation_tokens: Histogram,
    pub iteration_tokens: Histogram,
    pub max_num_generation_tokens: Histogram,
    pub params_n: Histogram,
    pub params_max_tokens: Histogram,
    pub num_preemptions: Histogram,
    pub prefill_kv_computed: Histogram,
}

impl ModelMetrics {
    fn new(g: &Grids) -> Self {
        ModelMetrics {
            running: AtomicI64::new(0),
            waiting: AtomicI64::new(0),
            prompt_tokens: AtomicU64::new(0),
            prompt_cached: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            admission_rejections: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            success: Default::default(),
            ttft: Histogram::new(g.ttft),
            itl: Histogram::new(g.itl),
            tpot: Histogram::new(g.tpot),
            e2e: Histogram::new(g.e2e),
            queue: Histogram::new(g.queue),
            inference: Histogram::new(g.inference),
            prefill: Histogram::new(LATENCY_BUCKETS),
            decode: Histogram::new(LATENCY_BUCKETS),
            req_prompt_tokens: Histogram::new(TOKEN_BUCKETS),
            req_generation_tokens: Histogram::new(TOKEN_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_BUCKETS),
            max_num_generation_tokens: Histogram::new(TOKEN_BUCKETS),
            params_n: Histogram::new(N_BUCKETS),
            params_max_tokens: Histogram::new(TOKEN_BUCKETS),
            num_preemptions: Histogram::new(PREEMPTION_BUCKETS),
            prefill_kv_computed: Histogram::new(TOKEN_BUCKETS),
        }
    }

    pub fn success_count(&self, r: usize) -> u64 {
        self.success[r].load(Relaxed)
    }
}

/// All engine metrics, one [`ModelMetrics`] per served name.
#[derive(Debug)]
pub struct EngineMetrics {
    names: Vec<String>,
    pub models: Vec<ModelMetrics>,
    /// Tokens held in the KV cache (prompt + generated of running sequences).
    pub kv_tokens: AtomicI64,
    kv_capacity: u64,
    legacy: bool,
    /// Unix time the families were created (all `*_created` series).
    created: f64,
}

/// Formats a float as Python's prometheus_client does (`repr`, `1.0`, `1.2e+09`, `+Inf`).
pub fn py_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let a = v.abs();
    let s = if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Python repr switches to exponent form; Rust's `{:e}` lacks the sign and padding.
        let e = format!("{v:e}");
        let (m, exp) = e.split_once('e').unwrap_or((&e, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);

        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    } else {
        format!("{v:?}")
    };
    // floatToGoString: more than 6 digits before the point become exponent form.
    if v > 0.0 && !s.contains('e') {
        if let Some(dot) = s.find('.') {
            if dot > 6 {
                let digits = s.replace('.', "");
                let mantissa = format!("{}.{}", &digits[..1], digits[1..].trim_end_matches('0'));
                let mantissa = mantissa.trim_end_matches('.');
                return format!("{mantissa}e+0{}", dot - 1);
            }
        }
    }
    s
}

struct Out<'a> {
    s: String,
    names: &'a [String],
    created: String,
}

impl Out<'_> {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(
            self.s,
            "# HELP vllm:{name} {help}\n# TYPE vllm:{name} {kind}"
        );
    }

    /// `engine="0",model_name="M"` plus extra labels sorted as Python sorts them.
    fn labels(&self, m: usize, extra_before: &str, extra_after: &str) -> String {
        format!(
            "{{engine=\"0\",{extra_before}model_name=\"{}\"{extra_after}}}",
            self.names[m]
        )
    }

    fn gauge(&mut self, name: &str, help: &str, vals: &[f64]) {
        self.header(name, help, "gauge");
        for (m, v) in vals.iter().enumerate() {
            let l = self.labels(m, "", "");
            let _ = writeln!(self.s, "vllm:{name}{l} {}", py_float(*v));
        }
    }

    /// A counter family: `NAME_total` samples, then its `NAME_created` gauge family.
    fn counter(&mut self, name: &str, help: &str, series: &[(String, f64)]) {
        self.header(&format!("{name}_total"), help, "counter");
        for (l, v) in series {
            let _ = writeln!(self.s, "vllm:{name}_total{l} {}", py_float(*v));
        }
        self.header(&format!("{name}_created"), help, "gauge");
        for (l, _) in series {
            let _ = writeln!(self.s, "vllm:{name}_created{l} {}", self.created);
        }
    }

    fn per_model_counter(&mut self, name: &str, help: &str, vals: &[f64]) {
        let series: Vec<(String, f64)> = vals
            .iter()
            .enumerate()
            .map(|(m, v)| (self.labels(m, "", ""), *v))
            .collect();
        self.counter(name, help, &series);
    }

    fn histogram(&mut self, name: &str, help: &str, hs: &[&Histogram]) {
        self.header(name, help, "histogram");
        for (m, h) in hs.iter().enumerate() {
            let mut cum = 0u64;
            for (i, b) in h.bounds.iter().enumerate() {
                cum += h.counts[i].load(Relaxed);
                let l = self.labels(m, "", "").replace(
                    ",model_name",
                    &format!(",le=\"{}\",model_name", py_float(*b)),
                );
                let _ = writeln!(self.s, "vllm:{name}_bucket{l} {}", py_float(cum as f64));
            }
            let count = h.count();
            let l = self
                .labels(m, "", "")
                .replace(",model_name", ",le=\"+Inf\",model_name");
            let _ = writeln!(self.s, "vllm:{name}_bucket{l} {}", py_float(count as f64));
            let l = self.labels(m, "", "");
            let _ = writeln!(self.s, "vllm:{name}_count{l} {}", py_float(count as f64));
            let _ = writeln!(self.s, "vllm:{name}_sum{l} {}", py_float(h.sum()));
        }
        self.header(&format!("{name}_created"), help, "gauge");
        for m in 0..hs.len() {
            let l = self.labels(m, "", "");
            let _ = writeln!(self.s, "vllm:{name}_created{l} {}", self.created);
        }
    }
}

impl EngineMetrics {
    pub fn new(names: &[String], kv_capacity: u64, legacy: bool, created: f64) -> Self {
        Self::with_grids(names, kv_capacity, legacy, created, VLLM_GRIDS)
    }

    /// As [`EngineMetrics::new`], with the latency histograms on other grids (another
    /// engine's, see `personality.rs`, which also renders such an engine's page).
    pub fn with_grids(
        names: &[String],
        kv_capacity: u64,
        legacy: bool,
        created: f64,
        grids: Grids,
    ) -> Self {
        EngineMetrics {
            names: names.to_vec(),
            models: names.iter().map(|_| ModelMetrics::new(&grids)).collect(),
            kv_tokens: AtomicI64::new(0),
            kv_capacity,
            legacy,
            created,
        }
    }

    /// The served model names, one per [`ModelMetrics`].
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Unix time the families were created.
    pub fn created(&self) -> f64 {
        self.created
    }

    pub fn kv_usage(&self) -> f64 {
        (self.kv_tokens.load(Relaxed).max(0) as f64 / self.kv_capacity as f64).min(1.0)
    }

    /// The Prometheus text exposition of every `vllm:*` family.
    pub fn render(&self) -> String {
        let mut o = Out {
            s: String::with_capacity(64 * 1024),
            names: &self.names,
            created: py_float(self.created),
        };
        let ms = &self.models;
        let zeros: Vec<f64> = ms.iter().map(|_| 0.0).collect();
        let per = |f: &dyn Fn(&ModelMetrics) -> f64| -> Vec<f64> { ms.iter().map(f).collect() };
        let hist = |f: &dyn Fn(&ModelMetrics) -> &Histogram| -> Vec<&Histogram> {
            ms.iter().map(f).collect()
        };
        let with = |o: &Out, before: &str, key: &str, vals: &[(&str, Vec<f64>)]| {
            let mut series = Vec::new();
            for (v, per_model) in vals {
                for (m, x) in per_model.iter().enumerate() {
                    let l = if before.is_empty() {
                        o.labels(m, "", &format!(",{key}=\"{v}\""))
                    } else {
                        o.labels(m, &format!("{key}=\"{v}\","), "")
                    };
                    series.push((l, *x));
                }
            }
            series
        };
        let mfu = "(for Model Flops Utilization calculations).";
        o.per_model_counter(
            "estimated_flops_per_gpu",
            &format!("Estimated number of floating point operations per GPU {mfu}"),
            &zeros,
        );
        o.per_model_counter(
            "estimated_read_bytes_per_gpu",
            &format!("Estimated number of bytes read from memory per GPU {mfu}"),
            &zeros,
        );
        o.per_model_counter(
            "estimated_write_bytes_per_gpu",
            &format!("Estimated number of bytes written to memory per GPU {mfu}"),
            &zeros,
        );
        let running = per(&|m| m.running.load(Relaxed).max(0) as f64);
        let waiting = per(&|m| m.waiting.load(Relaxed).max(0) as f64);
        o.gauge(
            "num_requests_running",
            "Number of requests in model execution batches.",
            &running,
        );
        if self.legacy {
            o.gauge(
                "num_requests_swapped",
                "Number of requests swapped to CPU.",
                &zeros,
            );
        }
        o.gauge(
            "num_requests_waiting",
            "Number of requests waiting to be processed.",
            &waiting,
        );
        if !self.legacy {
            o.header("num_requests_waiting_by_reason", "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.", "gauge");
            for (reason, vals) in [("capacity", &waiting), ("deferred", &zeros)] {
                for (m, v) in vals.iter().enumerate() {
                    let l = o.labels(m, "", &format!(",reason=\"{reason}\""));
                    let _ = writeln!(
                        o.s,
                        "vllm:num_requests_waiting_by_reason{l} {}",
                        py_float(*v)
                    );
                }
            }
            o.header("engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.", "gauge");
            for (state, v) in [
                ("awake", 1.0),
                ("weights_offloaded", 0.0),
                ("discard_all", 0.0),
            ] {
                for m in 0..ms.len() {
                    let l = o.labels(m, "", &format!(",sleep_state=\"{state}\""));
                    let _ = writeln!(o.s, "vllm:engine_sleep_state{l} {}", py_float(v));
                }
            }
        }
        let kv: Vec<f64> = ms.iter().map(|_| self.kv_usage()).collect();
        if self.legacy {
            o.gauge(
                "gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.",
                &kv,
            );
            o.gauge(
                "cpu_cache_usage_perc",
                "CPU KV-cache usage. 1 means 100 percent usage.",
                &zeros,
            );
            let rate = per(&|m| {
                let q = m.prefix_queries.load(Relaxed);
                if q == 0 {
                    0.0
                } else {
                    m.prefix_hits.load(Relaxed) as f64 / q as f64
                }
            });
            o.gauge(
                "gpu_prefix_cache_hit_rate",
                "GPU prefix cache block hit rate.",
                &rate,
            );
        } else {
            o.gauge(
                "kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                &kv,
            );
        }
        let prompt = per(&|m| m.prompt_tokens.load(Relaxed) as f64);
        let cached = per(&|m| m.prompt_cached.load(Relaxed) as f64);
        let computed: Vec<f64> = prompt.iter().zip(&cached).map(|(p, c)| p - c).collect();
        if !self.legacy {
            o.per_model_counter(
                "prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                &per(&|m| m.prefix_queries.load(Relaxed) as f64),
            );
            o.per_model_counter(
                "prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                &per(&|m| m.prefix_hits.load(Relaxed) as f64),
            );
            o.per_model_counter("external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", &zeros);
            o.per_model_counter("external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", &zeros);
            o.per_model_counter(
                "mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.",
                &zeros,
            );
            o.per_model_counter(
                "mm_cache_hits",
                "Multi-modal cache hits, in terms of number of cached items.",
                &zeros,
            );
        }
        o.per_model_counter(
            "num_preemptions",
            "Cumulative number of preemption from the engine.",
            &zeros,
        );
        o.per_model_counter(
            "prompt_tokens",
            "Number of prefill tokens processed.",
            &prompt,
        );
        if !self.legacy {
            let s = with(
                &o,
                "",
                "source",
                &[
                    ("local_compute", computed),
                    ("local_cache_hit", cached.clone()),
                    ("external_kv_transfer", zeros.clone()),
                ],
            );
            o.counter(
                "prompt_tokens_by_source",
                "Number of prompt tokens by source.",
                &s,
            );
            o.per_model_counter(
                "prompt_tokens_cached",
                "Number of cached prompt tokens (local + external).",
                &cached,
            );
            let s = with(
                &o,
                "",
                "source",
                &[
                    ("device", cached.clone()),
                    ("host", zeros.clone()),
                    ("p2p", zeros.clone()),
                    ("disk", zeros.clone()),
                    ("external_unspecified", zeros.clone()),
                ],
            );
            o.counter("prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", &s);
        }
        o.per_model_counter(
            "generation_tokens",
            "Number of generation tokens processed.",
            &per(&|m| m.generation_tokens.load(Relaxed) as f64),
        );
        let reasons: Vec<(&str, Vec<f64>)> = FINISHED_REASONS
            .iter()
            .enumerate()
            .map(|(i, r)| (*r, per(&|m| m.success_count(i) as f64)))
            .collect();
        let s = with(&o, "before", "finished_reason", &reasons);
        o.counter(
            "request_success",
            "Count of successfully processed requests.",
            &s,
        );
        if !self.legacy {
            let help = "Number of admission attempts rejected by a queue limit, by reason.";
            let mut series = Vec::new();
            for reason in ["max_num_queued_reqs", "max_num_queued_tokens"] {
                for (name, m) in o.names.iter().zip(ms) {
                    let v = match reason {
                        "max_num_queued_reqs" => m.admission_rejections.load(Relaxed) as f64,
                        _ => 0.0,
                    };
                    series.push((format!("{{model_name=\"{name}\",reason=\"{reason}\"}}"), v));
                }
            }
            o.counter("admission_rejections", help, &series);
        }
        o.histogram(
            "request_prompt_tokens",
            "Number of prefill tokens processed.",
            &hist(&|m| &m.req_prompt_tokens),
        );
        o.histogram(
            "request_generation_tokens",
            "Number of generation tokens processed.",
            &hist(&|m| &m.req_generation_tokens),
        );
        o.histogram(
            "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &hist(&|m| &m.iteration_tokens),
        );
        o.histogram(
            "request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            &hist(&|m| &m.max_num_generation_tokens),
        );
        o.histogram(
            "request_params_n",
            "Histogram of the n request parameter.",
            &hist(&|m| &m.params_n),
        );
        o.histogram(
            "request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            &hist(&|m| &m.params_max_tokens),
        );
        o.histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &hist(&|m| &m.ttft),
        );
        if self.legacy {
            o.histogram(
                "time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                &hist(&|m| &m.itl),
            );
        } else {
            o.histogram(
                "inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &hist(&|m| &m.itl),
            );
            o.histogram(
                "request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                &hist(&|m| &m.tpot),
            );
        }
        o.histogram(
            "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &hist(&|m| &m.e2e),
        );
        o.histogram(
            "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &hist(&|m| &m.queue),
        );
        o.histogram(
            "request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            &hist(&|m| &m.inference),
        );
        o.histogram(
            "request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &hist(&|m| &m.prefill),
        );
        o.histogram(
            "request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &hist(&|m| &m.decode),
        );
        if !self.legacy {
            o.histogram(
                "request_num_preemptions",
                "Histogram of the number of times a request was preempted.",
                &hist(&|m| &m.num_preemptions),
            );
            o.histogram(
                "request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                &hist(&|m| &m.prefill_kv_computed),
            );
        }
        o.header(
            "cache_config_info",
            "Information of the LLMEngine CacheConfig",
            "gauge",
        );
        let _ = writeln!(
            o.s,
            "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"False\",engine=\"0\",kv_cache_size_tokens=\"{}\"}} 1.0",
            self.kv_capacity
        );
        o.s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_format_like_prometheus_client() {
        let table = [
            (0.0, "0.0"),
            (1.0, "1.0"),
            (167.0, "167.0"),
            (0.21997547149658203, "0.21997547149658203"),
            (1.795964148972346e9, "1.795964148972346e+09"),
            (1234567.0, "1.234567e+06"),
            (123456.0, "123456.0"),
            (0.00001, "1e-05"),
            (f64::INFINITY, "+Inf"),
        ];
        for (v, want) in table {
            assert_eq!(py_float(v), want, "{v}");
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_with_le_inclusive() {
        let m = EngineMetrics::new(&["tiny".to_string()], 100, false, 1.0);
        m.models[0].ttft.observe(0.005);
        m.models[0].ttft.observe(3000.0);
        let text = m.render();
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\",model_name=\"tiny\"} 0.0\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.005\",model_name=\"tiny\"} 1.0\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"2560.0\",model_name=\"tiny\"} 1.0\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"tiny\"} 2.0\n"));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"tiny\"} 2.0\n"
        ));
    }

    #[test]
    fn legacy_names_replace_v1_names() {
        let names = ["tiny".to_string()];
        let v1 = EngineMetrics::new(&names, 100, false, 1.0).render();
        let v0 = EngineMetrics::new(&names, 100, true, 1.0).render();
        assert!(v1.contains("vllm:kv_cache_usage_perc{") && !v1.contains("gpu_cache_usage_perc"));
        assert!(v0.contains("vllm:gpu_cache_usage_perc{") && !v0.contains("kv_cache_usage_perc"));
        assert!(v0.contains("vllm:time_per_output_token_seconds_bucket{"));
        assert!(!v0.contains("inter_token_latency_seconds"));
        assert!(
            v0.contains("vllm:gpu_prefix_cache_hit_rate{") && !v0.contains("prefix_cache_hits")
        );
    }
}
