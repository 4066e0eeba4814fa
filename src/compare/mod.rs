//! `goodput-proxy compare`: for TTFT, TPOT and E2E at p50 / p90 / p99, per model (and per
//! upstream), the exact percentile (raw per-request values), the proxy's histogram estimate and
//! the engine's histogram estimate over one window, their differences, and what the engines'
//! counters say over that window. Each engine's histogram is read by its own name
//! ([`Quantity::engines`]: vLLM, SGLang, TensorRT-LLM, TGI where it has one); a row says which
//! engine's it shows, and which engines of the group export none (llama.cpp exports no latency
//! histogram, TGI no TTFT or TPOT one).
//!
//! The table is plain data ([`Table`]), built from plain inputs ([`Window`]) and rendered by
//! [`render`]; where the inputs come from is a data source's business: [`admin`] reads a live
//! proxy's admin port (two `/metrics` scrapes `window` apart plus `/stats`); another source
//! (e.g. ClickHouse records) can fill the same [`Window`].

pub mod admin;
pub mod history;
pub mod render;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::engine::parse::{Family, Sample};
use goodput_measure::prom::engines::{self, Names};
use goodput_measure::prom::hist::{self, Buckets};

/// The quantiles every row shows.
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// One latency quantity: its name in the table, the proxy's histogram, each engine's and its
/// field in `/stats`.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    pub name: &'static str,
    pub proxy_family: &'static str,
    /// Each engine's histogram of it; an engine not listed exports none.
    pub engines: &'static [EngineHistogram],
    pub stats_field: &'static str,
}

/// One engine's histogram of a quantity: the engine (as `goodput_proxy_engine_kind` names
/// it) and its family names, in order of preference (vLLM's V1 name, then its v0 one).
#[derive(Debug, Clone, Copy)]
pub struct EngineHistogram {
    pub kind: &'static str,
    pub families: &'static [&'static str],
}

const fn engine(names: &'static Names, families: &'static [&'static str]) -> EngineHistogram {
    EngineHistogram {
        kind: names.kind,
        families,
    }
}

impl Quantity {
    /// Every engine family read for this quantity.
    pub fn engine_families(&self) -> impl Iterator<Item = &'static str> {
        self.engines.iter().flat_map(|e| e.families.iter().copied())
    }
}

/// The engine kinds whose families are read (the `kind` label of `goodput_proxy_engine_kind`).
pub const ENGINE_KIND: &str = "goodput_proxy_engine_kind";

// Each engine's histogram names from the one table of engine names (the engines without one
// of a quantity: llama.cpp has none, TGI only E2E).
pub const QUANTITIES: [Quantity; 3] = [
    Quantity {
        name: "ttft",
        proxy_family: "goodput_proxy_time_to_first_token_seconds",
        engines: &[
            engine(&engines::VLLM, engines::VLLM.ttft),
            engine(&engines::SGLANG, engines::SGLANG.ttft),
            engine(&engines::TRTLLM, engines::TRTLLM.ttft),
        ],
        stats_field: "ttft_seconds",
    },
    Quantity {
        name: "tpot",
        proxy_family: "goodput_proxy_time_per_output_token_seconds",
        engines: &[
            engine(&engines::VLLM, engines::VLLM.tpot),
            engine(&engines::SGLANG, engines::SGLANG.tpot),
            engine(&engines::TRTLLM, engines::TRTLLM.tpot),
        ],
        stats_field: "tpot_seconds",
    },
    Quantity {
        name: "e2e",
        proxy_family: "goodput_proxy_e2e_request_latency_seconds",
        engines: &[
            engine(&engines::VLLM, engines::VLLM.e2e),
            engine(&engines::SGLANG, engines::SGLANG.e2e),
            engine(&engines::TRTLLM, engines::TRTLLM.e2e),
            engine(&engines::TGI, engines::TGI.e2e),
        ],
        stats_field: "e2e_seconds",
    },
];

/// Each replica's running batch and waiting queue as the proxy read them through the engine
/// mapping (`engine::signals::TABLE`: every engine's own names, rank rules applied).
pub const UPSTREAM_RUNNING: &str = "goodput_proxy_upstream_running";
pub const UPSTREAM_WAITING: &str = "goodput_proxy_upstream_queue_depth";

/// The engines' finished-request counters `compare` reads (`finished` of the mapping table):
/// family and the label that splits it by finish reason.
pub fn engine_finished() -> impl Iterator<Item = (&'static str, Option<&'static str>)> {
    crate::engine::signals::TABLE
        .iter()
        .filter_map(|m| m.names.finished)
}

/// The key of an engine counter without a finish-reason label (SGLang, TGI): its total.
pub const ALL_REASONS: &str = "(all)";

/// A group of the table: one model, or one model on one upstream.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GroupKey {
    pub model: String,
    /// `None`: every upstream together.
    pub upstream: Option<String>,
}

/// Exact percentiles of one group and quantity (from raw per-request values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Exact {
    pub count: u64,
    /// p50, p90, p99 (as [`QUANTILES`]); `None` when the group has no value.
    pub values: [Option<f64>; 3],
}

/// What one data source observed over one window: the two metric pages (proxy's own families
/// plus the engines', relabelled `upstream`), the engine gauges' maxima over the window, and
/// the exact figures per group.
#[derive(Debug, Clone, Default)]
pub struct Window {
    pub seconds: f64,
    pub start: Vec<Family>,
    pub end: Vec<Family>,
    /// Max of each replica's running batch / waiting queue ([`UPSTREAM_RUNNING`],
    /// [`UPSTREAM_WAITING`]) over the window, per (model, upstream) and per (model,
    /// [`ALL_UPSTREAMS`]) for the sum over upstreams.
    pub max_running: BTreeMap<(String, String), f64>,
    pub max_waiting: BTreeMap<(String, String), f64>,
    /// Exact figures per group and quantity name.
    pub exact: BTreeMap<GroupKey, BTreeMap<&'static str, Exact>>,
    /// Where TTFT went per group (from the same `/stats` documents), when engines reported
    /// their per-request timings.
    pub ttft_split: BTreeMap<GroupKey, TtftWhere>,
}

/// p50 and p99 of one part (seconds; `None` without values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct P50P99 {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// Where TTFT goes for one group: each part of the split (proxy, engine queue, engine
/// prefill, rest) over the requests whose engine reported its timings, and for decode the
/// client's TPOT beside the engine's mean ITL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TtftWhere {
    /// Requests split, and those whose engine parts had to be cut (clock skew).
    pub requests: u64,
    pub clamped: u64,
    pub proxy: P50P99,
    pub engine_queue: P50P99,
    pub engine_prefill: P50P99,
    pub rest: P50P99,
    pub client_tpot: P50P99,
    pub engine_mean_itl: P50P99,
}

/// One quantile of one quantity: the three figures and their differences.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cell {
    pub quantile: f64,
    pub exact: Option<f64>,
    pub proxy_hist: Option<f64>,
    pub engine_hist: Option<f64>,
    pub proxy_minus_exact: Option<f64>,
    pub engine_minus_exact: Option<f64>,
    pub proxy_minus_engine: Option<f64>,
    /// Width of the grid bucket the exact value falls in: how far an estimate may be off.
    pub bucket_width: Option<f64>,
}

/// One quantity of one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub quantity: &'static str,
    /// How the proxy's and the engine's histograms relate (see [`Grid`]).
    pub grid: Grid,
    /// Whose histogram the engine column shows (an engine kind), when one had data.
    pub engine: Option<&'static str>,
    /// Engines of the group's replicas that export no histogram of this quantity (the engine
    /// column then covers the other replicas, if any).
    pub no_histogram: Vec<&'static str>,
    pub exact_count: u64,
    pub proxy_count: f64,
    pub engine_count: f64,
    pub cells: Vec<Cell>,
}

/// Whether the proxy's and the engine's estimates come from the same bucket grid. Each
/// histogram's quantile is interpolated within its own grid, never across two; when the grids
/// differ the table says so, since the two estimates then carry different errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grid {
    /// Same bounds: the estimates line up bucket by bucket.
    Same,
    /// The engine's grid is another than the proxy's (SGLang's, or vLLM with
    /// `--custom-histogram-buckets`): each estimate within its own grid.
    EngineDiffers,
    /// The engine replicas of this group use different grids: no engine estimate.
    EnginesDiffer,
    /// The group's replicas run different engines: no engine estimate (their histograms are
    /// not added, whatever their grids).
    MixedEngines,
    /// No engine histogram for this quantity.
    NoEngine,
}

impl Grid {
    fn of(proxy: &[Vec<f64>], engine: &[Vec<f64>]) -> Grid {
        match engine {
            [] => Grid::NoEngine,
            [one] if proxy.iter().all(|p| p == one) => Grid::Same,
            [_] => Grid::EngineDiffers,
            _ => Grid::EnginesDiffer,
        }
    }

    /// What the table says under the quantity, `None` when the grids are the same.
    pub fn note(self) -> Option<&'static str> {
        match self {
            Grid::Same | Grid::NoEngine => None,
            Grid::EngineDiffers => Some(
                "engine buckets differ from the proxy's: each estimate is interpolated within its own grid; compare them through the exact column",
            ),
            Grid::EnginesDiffer => Some(
                "engine replicas use different buckets: no engine estimate (not added across grids)",
            ),
            Grid::MixedEngines => Some(
                "replicas run different engines: no engine estimate (their histograms are not added); see each upstream's row",
            ),
        }
    }
}

/// What the engines' counters and gauges say over the window for one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineCounters {
    pub requests_per_s: f64,
    /// Finished requests by `finished_reason` (stop, length, abort, ...), over the window.
    pub finished_reason: BTreeMap<String, f64>,
    pub max_running: Option<f64>,
    pub max_waiting: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    pub model: String,
    pub upstream: Option<String>,
    pub rows: Vec<Row>,
    pub engine: EngineCounters,
    /// Where TTFT goes (none when no engine reported per-request timings in the window).
    pub ttft_split: Option<TtftWhere>,
}

/// The comparison, ready to render.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    pub window_seconds: f64,
    pub by_upstream: bool,
    pub groups: Vec<Group>,
}

/// Why a window cannot be compared.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CompareError {
    #[error("{page} has no `{family}` family: {hint}")]
    MissingFamily {
        page: String,
        family: String,
        hint: &'static str,
    },
}

/// The groups present in the window: every (model, upstream) whose proxy E2E histogram has
/// observations between the scrapes (or, without `by_upstream`, every such model).
pub fn groups_in(w: &Window, by_upstream: bool) -> BTreeSet<GroupKey> {
    let fam = QUANTITIES[2].proxy_family;
    let mut pairs = BTreeSet::new();
    let bucket = format!("{fam}_bucket");
    for s in w
        .end
        .iter()
        .filter(|f| f.name == fam)
        .flat_map(|f| &f.samples)
    {
        if s.name == bucket && s.label("le") == Some("+Inf") {
            let model = s.label("model").unwrap_or("").to_string();
            let upstream = s.label("upstream").map(str::to_string);
            pairs.insert((model, upstream));
        }
    }
    pairs
        .into_iter()
        .filter(|(m, u)| {
            let keep = proxy_filter(m, u.as_deref());
            let d = hist::delta(
                hist::buckets(&w.start, fam, &keep).as_ref(),
                &hist::buckets(&w.end, fam, &keep).unwrap_or_default(),
            );
            hist::count(&d) > 0.0
        })
        .map(|(model, upstream)| GroupKey {
            model,
            upstream: if by_upstream { upstream } else { None },
        })
        .collect()
}

fn proxy_filter<'a>(model: &'a str, upstream: Option<&'a str>) -> impl Fn(&Sample) -> bool + 'a {
    move |s: &Sample| {
        s.label("model") == Some(model) && upstream.is_none_or(|u| s.label("upstream") == Some(u))
    }
}

/// An engine series of the group: its `model_name` is the model, or, for an engine whose
/// series name no model (TGI serves one), its replica is one the proxy sent the model to.
fn engine_filter<'a>(
    model: &'a str,
    upstream: Option<&'a str>,
    served: &'a BTreeSet<String>,
) -> impl Fn(&Sample) -> bool + 'a {
    move |s: &Sample| {
        let up = s.label("upstream");
        upstream.is_none_or(|u| up == Some(u))
            && match s.label("model_name") {
                Some(m) => m == model,
                None => up.is_some_and(|u| served.contains(u)),
            }
    }
}

/// The upstreams the proxy sent `model` to (its E2E histogram's series at the window's end),
/// or just `upstream`.
fn served(w: &Window, model: &str, upstream: Option<&str>) -> BTreeSet<String> {
    let fam = QUANTITIES[2].proxy_family;
    w.end
        .iter()
        .filter(|f| f.name == fam)
        .flat_map(|f| &f.samples)
        .filter(|s| s.label("model") == Some(model))
        .filter_map(|s| s.label("upstream"))
        .filter(|u| upstream.is_none_or(|want| want == *u))
        .map(str::to_string)
        .collect()
}

/// The engines the proxy read on those upstreams (`goodput_proxy_engine_kind` = 1).
fn engine_kinds(w: &Window, upstreams: &BTreeSet<String>) -> BTreeSet<&'static str> {
    w.end
        .iter()
        .filter(|f| f.name == ENGINE_KIND)
        .flat_map(|f| &f.samples)
        .filter(|s| s.value == 1.0 && s.label("upstream").is_some_and(|u| upstreams.contains(u)))
        .filter_map(|s| crate::config::EngineKind::parse(s.label("kind")?))
        .map(crate::config::EngineKind::as_str)
        .collect()
}

/// A family every goodput-proxy admin page has, traffic or not (the latency histograms only
/// appear with the first request).
pub const PROXY_IDENTITY: &str = "goodput_proxy_records_dropped_total";

/// Checks that `page` is a goodput-proxy admin page, and with `engines` that it carries the
/// engine families the table reads (`url` names the page in errors).
pub fn check_families(page: &[Family], url: &str, engines: bool) -> Result<(), CompareError> {
    let has = |name: &str| page.iter().any(|f| f.name == name);
    let missing = |family: &str, hint| CompareError::MissingFamily {
        page: url.to_string(),
        family: family.to_string(),
        hint,
    };
    if !has(PROXY_IDENTITY) {
        return Err(missing(
            PROXY_IDENTITY,
            "is this a goodput-proxy admin port (server.admin_listen)?",
        ));
    }
    if !engines {
        return Ok(());
    }
    // Any engine's histogram, or the engine kinds read (llama.cpp exports no histogram): a
    // quantity no engine of the page has is a row without an engine estimate, said so.
    let engines_read =
        has(ENGINE_KIND) || QUANTITIES.iter().flat_map(|q| q.engine_families()).any(has);
    if !engines_read {
        return Err(missing(
            QUANTITIES[0].engines[0].families[0],
            "the proxy serves no engine metrics (engine.scrape = false, or no engine answered its last scrape)",
        ));
    }
    Ok(())
}

fn window_delta(w: &Window, family: &str, keep: &dyn Fn(&Sample) -> bool) -> Option<Buckets> {
    let end = hist::buckets(&w.end, family, keep)?;
    Some(hist::delta(
        hist::buckets(&w.start, family, keep).as_ref(),
        &end,
    ))
}

fn diff(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? - b?)
}

/// Builds the table from one window (see [`check_families`] for what must be there).
pub fn build(w: &Window, by_upstream: bool) -> Table {
    let groups = groups_in(w, by_upstream)
        .into_iter()
        .map(|key| build_group(w, &key))
        .collect();
    Table {
        window_seconds: w.seconds,
        by_upstream,
        groups,
    }
}

fn build_group(w: &Window, key: &GroupKey) -> Group {
    let (model, upstream) = (key.model.as_str(), key.upstream.as_deref());
    let pf = proxy_filter(model, upstream);
    let served = served(w, model, upstream);
    let ef = engine_filter(model, upstream, &served);
    let kinds = engine_kinds(w, &served);
    let exact = w.exact.get(key);
    let rows = QUANTITIES
        .iter()
        .map(|q| {
            let proxy = window_delta(w, q.proxy_family, &pf).unwrap_or_default();
            // Each engine's first family with data in this group.
            let found: Vec<(&'static str, &'static str)> = q
                .engines
                .iter()
                .filter_map(|e| {
                    let has_data =
                        |f: &&&str| window_delta(w, f, &ef).is_some_and(|b| !b.is_empty());
                    e.families.iter().find(has_data).map(|f| (e.kind, *f))
                })
                .collect();
            let no_histogram: Vec<&'static str> = kinds
                .iter()
                .filter(|k| !q.engines.iter().any(|e| e.kind == **k))
                .copied()
                .collect();
            let engine_family = match found.as_slice() {
                [one] => Some(*one),
                _ => None,
            };
            let engine_grids =
                engine_family.map_or_else(Vec::new, |(_, f)| hist::grids(&w.end, f, &ef));
            let grid = if found.len() > 1 {
                Grid::MixedEngines
            } else {
                Grid::of(&hist::grids(&w.end, q.proxy_family, &pf), &engine_grids)
            };
            // Replicas on different grids (or engines) cannot be added bucket by bucket: no
            // engine figure rather than one from a mixed grid.
            let engine = match (grid, engine_family) {
                (Grid::EnginesDiffer | Grid::MixedEngines, _) | (_, None) => Buckets::default(),
                (_, Some((_, f))) => window_delta(w, f, &ef).unwrap_or_default(),
            };
            let ex = exact
                .and_then(|e| e.get(q.name))
                .copied()
                .unwrap_or_default();
            let cells = QUANTILES
                .iter()
                .zip(ex.values)
                .map(|(&quantile, exact)| {
                    let proxy_hist = hist::quantile(&proxy, quantile);
                    let engine_hist = hist::quantile(&engine, quantile);
                    Cell {
                        quantile,
                        exact,
                        proxy_hist,
                        engine_hist,
                        proxy_minus_exact: diff(proxy_hist, exact),
                        engine_minus_exact: diff(engine_hist, exact),
                        proxy_minus_engine: diff(proxy_hist, engine_hist),
                        bucket_width: exact.and_then(|v| hist::bucket_width(&proxy, v)),
                    }
                })
                .collect();
            Row {
                quantity: q.name,
                grid,
                engine: engine_family.map(|(kind, _)| kind),
                no_histogram,
                exact_count: ex.count,
                proxy_count: hist::count(&proxy),
                engine_count: hist::count(&engine),
                cells,
            }
        })
        .collect();
    Group {
        model: key.model.clone(),
        upstream: key.upstream.clone(),
        rows,
        engine: engine_counters(w, model, upstream),
        ttft_split: w.ttft_split.get(key).copied().filter(|s| s.requests > 0),
    }
}

fn engine_counters(w: &Window, model: &str, upstream: Option<&str>) -> EngineCounters {
    let served = served(w, model, upstream);
    let ef = engine_filter(model, upstream, &served);
    // Every engine's own counter, by its own name: split by reason where it has the label,
    // one total (ALL_REASONS) where it has none.
    let at = |fams: &[Family]| {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for (family, reason) in engine_finished() {
            let sums = hist::sums_by(fams, family, reason.unwrap_or(""), &ef);
            for (k, v) in sums.unwrap_or_default() {
                let k = if reason.is_some() {
                    k
                } else {
                    ALL_REASONS.into()
                };
                *out.entry(k).or_insert(0.0) += v;
            }
        }
        out
    };
    let (start, end) = (at(&w.start), at(&w.end));
    let reset = end
        .iter()
        .any(|(k, v)| *v < start.get(k).copied().unwrap_or(0.0));
    let finished_reason: BTreeMap<String, f64> = end
        .iter()
        .map(|(k, v)| {
            let before = if reset {
                0.0
            } else {
                start.get(k).copied().unwrap_or(0.0)
            };
            (k.clone(), v - before)
        })
        .collect();
    let total: f64 = finished_reason.values().sum();
    let max_of = |m: &BTreeMap<(String, String), f64>| {
        m.get(&(
            model.to_string(),
            upstream.unwrap_or(ALL_UPSTREAMS).to_string(),
        ))
        .copied()
    };
    EngineCounters {
        requests_per_s: if w.seconds > 0.0 {
            total / w.seconds
        } else {
            0.0
        },
        finished_reason,
        max_running: max_of(&w.max_running),
        max_waiting: max_of(&w.max_waiting),
    }
}

/// The upstream key of [`Window::max_running`] for a model's sum over every upstream.
pub const ALL_UPSTREAMS: &str = "*";

/// The models each upstream serves on a page: the `model` of the proxy's own series with an
/// `upstream` label, and the `model_name` of the engines' (relabelled) series.
fn models_by_upstream(page: &[Family]) -> BTreeMap<&str, BTreeSet<&str>> {
    let mut out: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for s in page.iter().flat_map(|f| &f.samples) {
        if let (Some(up), Some(model)) = (
            s.label("upstream"),
            s.label("model").or_else(|| s.label("model_name")),
        ) {
            out.entry(up).or_default().insert(model);
        }
    }
    out
}

/// Folds one page's replica gauges ([`UPSTREAM_RUNNING`], [`UPSTREAM_WAITING`]: whatever the
/// engine, read through its mapping) into the window's maxima, per model and upstream and per
/// model over all upstreams ([`ALL_UPSTREAMS`]). A replica counts for the models the page
/// shows it serving.
pub fn fold_gauges(w: &mut Window, page: &[Family]) {
    let models = models_by_upstream(page);
    for (name, into) in [
        (UPSTREAM_RUNNING, &mut w.max_running),
        (UPSTREAM_WAITING, &mut w.max_waiting),
    ] {
        let mut now: BTreeMap<(String, String), f64> = BTreeMap::new();
        for s in page
            .iter()
            .flat_map(|f| &f.samples)
            .filter(|s| s.name == name)
        {
            let Some(up) = s.label("upstream") else {
                continue;
            };
            for model in models.get(up).into_iter().flatten() {
                *now.entry((model.to_string(), ALL_UPSTREAMS.to_string()))
                    .or_insert(0.0) += s.value;
                *now.entry((model.to_string(), up.to_string()))
                    .or_insert(0.0) += s.value;
            }
        }
        for (k, v) in now {
            let e = into.entry(k).or_insert(v);
            *e = e.max(v);
        }
    }
}

#[cfg(test)]
mod tests;
