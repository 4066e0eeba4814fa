//! The dashboard's panels: each one function from [`Inputs`] (gathered once per document) to
//! its part of `/dashboard.json`, rendered in the page by the script's `PANELS.NAME`. Every
//! list is capped, so the document stays small whatever the traffic (model and upstream names
//! are the metric labels: bounded sets; request ids are cut).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use goodput_measure::outcome::Outcome;
use goodput_measure::record::{compute_stats, Entry};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::compare::{
    self,
    admin::{exact_from_stats, split_from_stats},
    ENGINE_KIND, QUANTITIES, UPSTREAM_RUNNING, UPSTREAM_WAITING,
};
use crate::engine::parse::{self, Family};
use crate::metrics::NO_UPSTREAM;
use crate::state::AppState;

/// One panel: its name (the page's `data-panel`) and its builder.
pub type Panel = (&'static str, fn(&Inputs) -> Value);

/// Every panel, in the document's order. A new panel: a builder here (or in its own file),
/// one line in this list, a section and a renderer in the page (`page/`).
pub const PANELS: &[Panel] = &[
    ("traffic", traffic),
    ("goodput", goodput),
    ("replicas", replicas),
    ("headroom", headroom),
    ("routing", routing),
    ("tools", tools),
    ("latency", latency),
    ("ttft_split", super::split::ttft_split),
    ("slowest", slowest),
];

/// Most models with their own row (the busiest first).
pub const MAX_MODELS: usize = 16;
/// Most (model, upstream) groups in the latency table.
pub const MAX_GROUPS: usize = 32;
/// Most replicas listed.
pub const MAX_REPLICAS: usize = 64;
/// Slowest requests listed.
pub const SLOWEST: usize = 10;
/// Request ids are cut to this many characters (they come from clients).
pub const MAX_ID_CHARS: usize = 96;
/// The proxy's in-flight gauge (per model).
const IN_FLIGHT: &str = "goodput_proxy_requests_in_flight";
/// The "now" figures (requests/s, good/s) cover this much.
pub const RECENT: Duration = Duration::from_secs(10);

/// What the panels read, gathered once per document.
pub struct Inputs<'a> {
    pub state: &'a AppState,
    pub now: Instant,
    /// The window the document covers: as asked, shorter while the proxy has run for less.
    pub window: Duration,
    pub uptime: Duration,
    /// Records that ended in the window, oldest first.
    pub entries: Vec<Entry>,
    /// `/stats` over the window, every model.
    pub stats: Value,
    /// `compare`'s table over the histogram window: the proxy's life while it is shorter than
    /// the window, else from the oldest page kept inside the window (shorter than asked for
    /// the first minutes a page is open); `None`: no page from inside the window yet (the next
    /// refresh has one).
    pub table: Option<compare::Table>,
    /// `goodput_proxy_requests_in_flight`, every model.
    pub in_flight: i64,
}

impl<'a> Inputs<'a> {
    pub fn gather(state: &'a AppState, now: Instant, asked: Duration) -> Inputs<'a> {
        let ring = state.recorder.ring();
        let uptime = now.saturating_duration_since(ring.started());
        let window = asked.min(uptime);
        let entries = ring.snapshot(now, window);
        let stats = compute_stats(&entries, now, window, window, None);
        let gathered = state.registry.gather();
        let in_flight = gathered
            .iter()
            .filter(|f| f.name() == IN_FLIGHT)
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_gauge().get_value() as i64)
            .sum();
        let page = Arc::new(metric_page(state, gathered));
        let start = state.dashboard.start_and_keep(now, asked, || page.clone());
        let table = match start {
            // While the proxy is younger than the window, the window is its whole life.
            _ if uptime <= asked => Some(table(state, now, uptime, &[], &page)),
            Some((at, start)) => Some(table(state, now, now - at, &start, &page)),
            None => None,
        };
        Inputs {
            state,
            now,
            window,
            uptime,
            entries,
            stats,
            table,
            in_flight,
        }
    }

    fn model_label(&self, e: &Entry) -> Arc<str> {
        self.state
            .recorder
            .metrics()
            .models
            .resolve(&e.record.model)
    }

    fn upstream_label(&self, e: &Entry) -> Arc<str> {
        upstream_label(self.state, e)
    }
}

fn upstream_label(state: &AppState, e: &Entry) -> Arc<str> {
    match &e.record.upstream {
        Some(url) => state.recorder.metrics().upstreams.resolve(url),
        None => Arc::from(NO_UPSTREAM),
    }
}

/// The families `compare` reads: the proxy's three latency histograms and the engines'
/// (relabelled `upstream`, as on `/metrics`).
fn metric_page(state: &AppState, gathered: Vec<prometheus::proto::MetricFamily>) -> Vec<Family> {
    use prometheus::Encoder;
    // With the engine kinds read: the table names engines without such a histogram.
    let own: HashSet<&str> = QUANTITIES
        .iter()
        .map(|q| q.proxy_family)
        .chain([ENGINE_KIND, UPSTREAM_RUNNING, UPSTREAM_WAITING])
        .collect();
    let families: Vec<_> = gathered
        .into_iter()
        .filter(|f| own.contains(f.name()))
        .collect();
    let mut buf = Vec::new();
    if prometheus::TextEncoder::new()
        .encode(&families, &mut buf)
        .is_err()
    {
        buf.clear();
    }
    let mut text = String::from_utf8(buf).unwrap_or_default();
    let engine: HashSet<&str> = QUANTITIES
        .iter()
        .flat_map(|q| q.engine_families())
        .chain(compare::engine_finished().map(|(family, _)| family))
        .collect();
    // A counter's family may be named with or without `_total`.
    let wanted = |n: &str| engine.contains(n) || engine.contains(format!("{n}_total").as_str());
    state.engines.render_into(&mut text, &|n| !wanted(n));
    parse::parse(&text).unwrap_or_default()
}

/// `compare`'s table per model and upstream, from `start` to `end` (`seconds` apart), with the
/// exact figures of the records that ended in between.
fn table(
    state: &AppState,
    now: Instant,
    seconds: Duration,
    start: &[Family],
    end: &[Family],
) -> compare::Table {
    let mut w = compare::Window {
        seconds: seconds.as_secs_f64(),
        start: start.to_vec(),
        end: end.to_vec(),
        ..Default::default()
    };
    compare::fold_gauges(&mut w, start);
    compare::fold_gauges(&mut w, end);
    let groups = compare::groups_in(&w, true);
    if !groups.is_empty() {
        let entries = state.recorder.ring().snapshot(now, seconds);
        let models = &state.recorder.metrics().models;
        let mut parts: BTreeMap<(Arc<str>, Arc<str>), Vec<Entry>> = BTreeMap::new();
        for e in entries {
            let key = (models.resolve(&e.record.model), upstream_label(state, &e));
            parts.entry(key).or_default().push(e);
        }
        for key in groups.into_iter().take(MAX_GROUPS) {
            let part = parts
                .get(&(
                    Arc::from(key.model.as_str()),
                    Arc::from(key.upstream.as_deref().unwrap_or("")),
                ))
                .map_or(&[][..], Vec::as_slice);
            let doc = compute_stats(part, now, seconds, seconds, None);
            w.ttft_split.insert(key.clone(), split_from_stats(&doc));
            w.exact
                .insert(key, exact_from_stats(&doc).unwrap_or_default());
        }
    }
    let mut t = compare::build(&w, true);
    t.groups.truncate(MAX_GROUPS);
    t
}

fn traffic(i: &Inputs) -> Value {
    let recent = RECENT.min(i.uptime);
    let from = i.now.checked_sub(recent);
    let (mut n, mut good) = (0u64, 0u64);
    for e in i
        .entries
        .iter()
        .rev()
        .take_while(|e| from.is_none_or(|f| e.record.end >= f))
    {
        n += 1;
        good += u64::from(e.record.slo.good);
    }
    let per_s = |v: u64| {
        let s = recent.as_secs_f64();
        if s > 0.0 {
            v as f64 / s
        } else {
            0.0
        }
    };
    let in_flight = i.in_flight;
    json!({
        "requests": i.stats["requests"],
        "goodput_ratio": i.stats["goodput"]["ratio"],
        "good_per_s": i.stats["goodput"]["per_second"],
        "recent_seconds": recent.as_secs_f64(),
        "recent_requests_per_s": per_s(n),
        "recent_good_per_s": per_s(good),
        "in_flight": in_flight,
    })
}

fn goodput(i: &Inputs) -> Value {
    let mut parts: BTreeMap<Arc<str>, Vec<Entry>> = BTreeMap::new();
    for e in &i.entries {
        parts.entry(i.model_label(e)).or_default().push(e.clone());
    }
    let mut parts: Vec<(Arc<str>, Vec<Entry>)> = parts.into_iter().collect();
    parts.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
    let more = parts.len().saturating_sub(MAX_MODELS);
    let models: Vec<Value> = parts
        .iter()
        .take(MAX_MODELS)
        .map(|(model, part)| {
            let s = compute_stats(part, i.now, i.window, i.window, None);
            json!({
                "model": model,
                "requests": s["requests"],
                "good": s["goodput"]["good"],
                "ratio": s["goodput"]["ratio"],
                "good_per_s": s["goodput"]["per_second"],
                "outcomes": s["outcomes"],
            })
        })
        .collect();
    let names: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
    json!({ "models": models, "more_models": more, "outcome_names": names })
}

fn replicas(i: &Inputs) -> Value {
    let all = i.state.upstreams.replicas();
    let engines = &i.state.engines;
    let replicas: Vec<Value> = all
        .iter()
        .take(MAX_REPLICAS)
        .map(|r| {
            let label = engines
                .upstream(r)
                .unwrap_or_else(|| i.state.recorder.metrics().upstreams.resolve(&r.url));
            let snap = engines.snapshot(r);
            let load = snap.as_ref().map(|s| s.signals.load).unwrap_or_default();
            json!({
                "upstream": label,
                "healthy": r.is_healthy(),
                "in_flight": r.in_flight(),
                "engine_scraped": snap.is_some(),
                "engine_waiting": load.waiting,
                "engine_running": load.running,
                "kv_cache_usage": load.kv_cache_usage,
            })
        })
        .collect();
    json!({ "replicas": replicas, "more": all.len().saturating_sub(MAX_REPLICAS) })
}

/// Why the balancer chose the replicas that answered the window's requests (each record's
/// `route_reason`), overall and per replica, beside the balancer's view of each replica now:
/// its load in tokens (prompt and output still to come of this proxy's requests there) and
/// its recent SLO attainment (the moving mean `goodput` and `auto` weigh it by).
fn routing(i: &Inputs) -> Value {
    let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut per: BTreeMap<Arc<str>, BTreeMap<&'static str, u64>> = BTreeMap::new();
    let mut retried = 0u64;
    for e in &i.entries {
        let Some(reason) = e.record.route_reason else {
            continue;
        };
        *reasons.entry(reason.as_str()).or_default() += 1;
        *per.entry(i.upstream_label(e))
            .or_default()
            .entry(reason.as_str())
            .or_default() += 1;
        retried += u64::from(!e.record.retried_from.is_empty());
    }
    let upstreams = &i.state.upstreams;
    let labels = &i.state.recorder.metrics().upstreams;
    let all = upstreams.replicas();
    let replicas: Vec<Value> = all
        .iter()
        .take(MAX_REPLICAS)
        .map(|r| {
            let label = labels.resolve(&r.url);
            let stats = &r.route.stats;
            json!({
                "reasons": per.get(&label).cloned().unwrap_or_default(),
                "upstream": label,
                "load_tokens": r.route.tokens(),
                "attainment": (stats.observed() > 0).then(|| stats.attainment(tokio::time::Instant::now())),
            })
        })
        .collect();
    json!({
        "strategy": upstreams.balancer.cfg.strategy.as_str(),
        "reasons": reasons,
        "retried": retried,
        "replicas": replicas,
        "more": all.len().saturating_sub(MAX_REPLICAS),
    })
}

/// Per model: SLO attainment over both windows, headroom and the desired-replicas hint as the
/// autoscaling estimate has them (docs/autoscaling.md); `null` where not known yet.
fn headroom(i: &Inputs) -> Value {
    let Some(scale) = i.state.recorder.scale() else {
        return json!({ "target": null, "windows": [], "models": [] });
    };
    let mut models: BTreeMap<Arc<str>, Value> = BTreeMap::new();
    for (window, model, a) in scale.model_attainment(i.now) {
        let m = models
            .entry(model)
            .or_insert_with(|| json!({ "attainment": {} }));
        m["attainment"][window] = json!(a);
    }
    for (model, e) in scale.estimates() {
        let m = models
            .entry(model)
            .or_insert_with(|| json!({ "attainment": {} }));
        m["headroom_streams"] = json!(e.headroom_streams);
        m["headroom_tokens_per_second"] = json!(e.headroom_tokens);
        m["capacity_streams"] = json!(e.capacity_streams);
        m["desired_replicas"] = json!(e.desired_replicas);
    }
    let rows: Vec<Value> = models
        .into_iter()
        .take(MAX_MODELS)
        .map(|(model, mut m)| {
            m["model"] = json!(model);
            m
        })
        .collect();
    json!({ "target": scale.config().target, "windows": scale.window_labels(), "models": rows })
}

fn latency(i: &Inputs) -> Value {
    match &i.table {
        Some(t) => {
            // Where TTFT goes is its own panel (`split.rs`): not sent twice.
            let mut groups = json!(t.groups);
            for g in groups.as_array_mut().into_iter().flatten() {
                if let Some(g) = g.as_object_mut() {
                    g.remove("ttft_split");
                }
            }
            json!({
                "window_seconds": t.window_seconds,
                "groups": groups,
                "starting": false,
            })
        }
        None => json!({ "window_seconds": 0.0, "groups": [], "starting": true }),
    }
}

fn tools(i: &Inputs) -> Value {
    let outcomes = &i.stats["tool_calls"];
    let requests: u64 = outcomes
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    json!({ "outcomes": outcomes, "requests": requests })
}

fn slowest(i: &Inputs) -> Value {
    let mut slow: Vec<&Entry> = i
        .entries
        .iter()
        .filter(|e| e.record.measured.outcome != Outcome::Rejected)
        .collect();
    slow.sort_by_key(|e| std::cmp::Reverse(e.record.measured.e2e));
    let ring = i.state.recorder.ring();
    let requests: Vec<Value> = slow
        .into_iter()
        .take(SLOWEST)
        .map(|e| {
            let r = &e.record;
            let m = &r.measured;
            let id: String = r.id.chars().take(MAX_ID_CHARS).collect();
            // Ids only where the admin port serves per-request data; a cut id would link to no
            // trace, and traces only where they are served.
            let admin = &i.state.admin;
            let traced = admin.records
                && admin.trace
                && id.len() == r.id.len()
                && ring.trace(&r.id).is_some();
            let id = admin.records.then_some(id);
            json!({
                "id": id,
                "trace": traced,
                "model": i.model_label(e),
                "upstream": i.upstream_label(e),
                "outcome": m.outcome.as_str(),
                "status": m.status,
                "e2e_s": m.e2e.as_secs_f64(),
                "ttft_s": m.ttft.map(|d| d.as_secs_f64()),
                "completion_tokens": m.completion_tokens,
                "age_s": i.now.saturating_duration_since(r.end).as_secs_f64(),
            })
        })
        .collect();
    json!({ "requests": requests })
}
