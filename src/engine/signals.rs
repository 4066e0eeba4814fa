//! What the balancer and autoscalers read from an engine's `/metrics`, the same whatever the
//! engine: its waiting queue, running batch and KV-cache use. Each engine names these facts
//! differently; [`TABLE`] maps every engine's own families onto them, and [`detect`] tells the
//! engine from the families its page serves, else [`from_server`] from the `Server` header its
//! answer carried. Pure: families in, numbers out.
//!
//! Health is not read from the page: it is the replica's probe of `upstream.health_path`
//! (`/health` on all five engines, `Replica::is_healthy`) and whether its last scrape
//! succeeded (`goodput_proxy_engine_up`).

use goodput_measure::prom::engines::{self, Names};
use goodput_measure::prom::Sample;

use super::parse::Family;
pub use crate::config::EngineKind;
pub use crate::upstream::EngineLoad;

/// How series of one family that differ in labels are combined into one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranks {
    /// Every series is a rank of its own: they add up.
    Sum,
    /// Series with equal values of these labels are one rank (its value reported by several
    /// workers, e.g. every tensor-parallel rank); distinct values add up (data-parallel ranks).
    By(&'static [&'static str]),
}

/// One engine's names for the canonical signals and how its series add up.
#[derive(Debug)]
pub struct Mapping {
    pub kind: EngineKind,
    /// Its names (`goodput_measure::prom::engines`): waiting (the first family present is
    /// read), running, KV-cache use (the fullest series counts), its prefix (detection when no
    /// signal family is served), its `Server` header.
    pub names: &'static Names,
    /// How the queue and running series add up.
    pub ranks: Ranks,
    /// Series with a non-empty value of one of these labels break a total down (and are left
    /// out: the total is its own series).
    pub breakdowns: &'static [&'static str],
}

/// The mapping table: each engine's names (one table of them, `goodput_measure::prom::engines`)
/// and how its series add up; the sources each row was read from are cited in docs/engines.md.
pub const TABLE: &[Mapping] = &[
    Mapping {
        kind: EngineKind::Vllm,
        names: &engines::VLLM,
        // One series per data-parallel engine (`engine` label).
        ranks: Ranks::Sum,
        breakdowns: &[],
    },
    Mapping {
        kind: EngineKind::Sglang,
        names: &engines::SGLANG,
        // With `--enable-metrics-for-all-schedulers` every tensor-parallel rank reports the
        // same queue; data-parallel ranks each have their own.
        ranks: Ranks::By(&["dp_rank"]),
        // With priority scheduling the total sits under priority="" and each priority has a
        // series of its own.
        breakdowns: &["priority"],
    },
    Mapping {
        kind: EngineKind::Llamacpp,
        names: &engines::LLAMACPP,
        ranks: Ranks::Sum,
        breakdowns: &[],
    },
    Mapping {
        kind: EngineKind::Tgi,
        names: &engines::TGI,
        ranks: Ranks::Sum,
        breakdowns: &[],
    },
    Mapping {
        kind: EngineKind::Trtllm,
        names: &engines::TRTLLM,
        ranks: Ranks::Sum,
        breakdowns: &[],
    },
];

/// The row of one engine.
pub fn mapping(kind: EngineKind) -> &'static Mapping {
    TABLE.iter().find(|m| m.kind == kind).unwrap_or(&TABLE[0])
}

/// One replica's engine signals: which engine (configured or detected; `None` when the page
/// is no known engine's) and its load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    pub kind: Option<EngineKind>,
    pub load: EngineLoad,
}

impl Signals {
    /// Reads a page's families as `configured` says, else as the engine they tell
    /// ([`detect`]), else as the one the answer's `Server` header named (`server`, from
    /// [`from_server`]).
    pub fn read(
        families: &[Family],
        configured: Option<EngineKind>,
        server: Option<EngineKind>,
    ) -> Signals {
        let Some(kind) = configured.or_else(|| detect(families)).or(server) else {
            return Signals::default();
        };
        let m = mapping(kind);
        let family = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| families.iter().find(|f| f.name == *n))
        };
        let count = |names: &[&str]| family(names).map(|f| count(m, &f.samples));
        let n = m.names;
        Signals {
            kind: Some(kind),
            load: EngineLoad {
                waiting: count(n.waiting),
                running: count(n.running),
                kv_cache_usage: family(n.kv_cache_usage).and_then(|f| fullest(m, &f.samples)),
            },
        }
    }

    /// The queue the balancer adds to in-flight: whole requests, 0 when unknown.
    pub fn queue(&self) -> usize {
        self.load.queue()
    }
}

/// The engine whose signal families the page serves (most of them wins; ties go to the
/// earlier row), else the one most of whose families it serves by name prefix; `None` for a
/// page of no known engine.
pub fn detect(families: &[Family]) -> Option<EngineKind> {
    let has = |n: &&str| families.iter().any(|f| f.name == *n);
    let best = |score: &dyn Fn(&Mapping) -> usize| {
        TABLE
            .iter()
            .map(|m| (score(m), m.kind))
            .filter(|(s, _)| *s > 0)
            .fold(
                None,
                |best: Option<(usize, EngineKind)>, (s, k)| match best {
                    Some((b, _)) if b >= s => best,
                    _ => Some((s, k)),
                },
            )
            .map(|(_, k)| k)
    };
    best(&|m| {
        [m.names.waiting, m.names.running, m.names.kv_cache_usage]
            .iter()
            .filter(|names| names.iter().any(has))
            .count()
    })
    .or_else(|| {
        best(&|m| {
            families
                .iter()
                .filter(|f| f.name.starts_with(m.names.prefix))
                .count()
        })
    })
}

/// The engine whose own HTTP server sends this `Server` header value (case aside); `None` for a
/// header no engine owns.
pub fn from_server(value: &str) -> Option<EngineKind> {
    let value = value.trim();
    TABLE
        .iter()
        .find(|m| {
            m.names
                .server
                .is_some_and(|s| s.eq_ignore_ascii_case(value))
        })
        .map(|m| m.kind)
}

fn label<'a>(s: &'a Sample, name: &str) -> Option<&'a str> {
    s.labels
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The series that count: finite values, totals rather than their breakdowns.
fn counted<'a>(m: &'a Mapping, samples: &'a [Sample]) -> impl Iterator<Item = &'a Sample> {
    samples.iter().filter(|s| {
        s.value.is_finite()
            && m.breakdowns
                .iter()
                .all(|b| label(s, b).is_none_or(str::is_empty))
    })
}

/// Requests over all ranks (never negative).
fn count(m: &Mapping, samples: &[Sample]) -> f64 {
    let total = match m.ranks {
        Ranks::Sum => counted(m, samples).map(|s| s.value).sum::<f64>(),
        Ranks::By(keys) => {
            // Largest value per rank (the workers of one rank agree), ranks summed.
            let mut ranks: Vec<(Vec<Option<&str>>, f64)> = Vec::new();
            for s in counted(m, samples) {
                let key: Vec<Option<&str>> = keys.iter().map(|k| label(s, k)).collect();
                match ranks.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, v)) => *v = v.max(s.value),
                    None => ranks.push((key, s.value)),
                }
            }
            ranks.iter().map(|(_, v)| v).sum()
        }
    };
    total.max(0.0)
}

/// The fullest series (one full rank is what stalls admissions).
fn fullest(m: &Mapping, samples: &[Sample]) -> Option<f64> {
    counted(m, samples).map(|s| s.value).reduce(f64::max)
}

/// `goodput_proxy_demand`: what the replicas are asked to carry now, for an autoscaler.
/// `in_flight` (this proxy's requests, all replicas) plus every fresh engine's waiting queue:
/// a backlog raises the signal beyond the requests themselves, which is what should add
/// replicas (an engine that keeps up has an empty queue, and demand = in-flight).
pub fn demand(in_flight: usize, queues: impl IntoIterator<Item = f64>) -> f64 {
    in_flight as f64 + queues.into_iter().filter(|q| q.is_finite()).sum::<f64>()
}

#[cfg(test)]
mod tests;
