//! Autoscaling signals: how much room is left (docs/autoscaling.md).
//!
//! - SLO attainment (good / eligible finished requests, as the goodput ratio counts them) over
//!   a short and a long sliding window, per model, per tenant, per upstream.
//! - Headroom per model, in streams and in tokens per second: the replicas' capacity at the
//!   `[scale] target` ([`estimate::Curve`], learned from every replica's load against its
//!   attainment), less the load they carry now; and the desired-replicas hint, load / capacity
//!   per replica in whichever unit of what replicas hold binds first ([`Unit`]).
//! - Tokens in flight per upstream: the balancer's own count of the tokens its requests bring,
//!   and the work still to do by kind (prompt tokens to prefill, output tokens to decode).
//!
//! Per request, [`Scale::finished`] only counts (one lock, no allocation for known labels).
//! Every `tick_ms` the proxy hands [`Scale::tick`] each replica's load; the estimate is made
//! there, off the request path, and [`Scale::refresh`] sets the gauges right before a scrape.
//! No clock inside: every instant is passed in, so the tests drive it.

pub mod estimate;
mod gauges;
mod pending;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Registry;
use tokio::time::Instant;

use crate::auth::NO_TENANT;
use crate::config::ScaleConfig;
use crate::metrics::window::{KeyedRings, SecondClock};
use crate::upstream::TokensPending;
use estimate::Curve;
use gauges::Gauges;
use pending::Pending;

/// Lowest load bin edges: a tenth of a stream, one token per second.
const STREAMS_LO: f64 = 0.1;
const TOKENS_LO: f64 = 1.0;
/// Bins per curve: 4 per doubling, so 96 bins span 2^24 from the lowest.
const BINS: usize = 96;

/// One replica's load when a tick is taken.
#[derive(Debug, Clone)]
pub struct ReplicaLoad {
    /// Its `upstream` label value.
    pub upstream: Arc<str>,
    pub healthy: bool,
    /// This proxy's requests in flight there.
    pub in_flight: usize,
    /// Estimated tokens (prompt + output) of those requests, when the balancer counts them.
    pub tokens_in_flight: Option<u64>,
    /// Estimated tokens of every request sent there so far (a counter): its rate is the token
    /// load the replica is offered.
    pub tokens_sent: u64,
    /// Those in flight by kind of work still to do (prefill, decode).
    pub tokens_pending: Option<TokensPending>,
}

/// One replica's tokens in flight as served on `/metrics`.
#[derive(Debug, Clone)]
struct InFlight {
    upstream: Arc<str>,
    tokens: u64,
    pending: Option<TokensPending>,
}

/// One model's estimate as of the last tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimate {
    /// Per replica, at the target.
    pub capacity_streams: Option<f64>,
    pub capacity_tokens: Option<f64>,
    pub headroom_streams: Option<f64>,
    pub headroom_tokens: Option<f64>,
    pub desired_replicas: Option<f64>,
}

/// What every finished request counts, behind one lock: its attainment per dimension over
/// both windows (short, long), and its place in the next tick's curves.
struct Counting {
    clock: SecondClock,
    model: KeyedRings<2>,
    tenant: KeyedRings<2>,
    upstream: KeyedRings<2>,
    /// Finished since the last tick, per (model, upstream).
    pending: Pending<Finished>,
}

impl Counting {
    fn new(windows: [Duration; 2], origin: Instant) -> Self {
        // The scale reads each key's ratio, never the overall one.
        Counting {
            clock: SecondClock::new(origin),
            model: KeyedRings::new(windows),
            tenant: KeyedRings::new(windows),
            upstream: KeyedRings::new(windows),
            pending: Pending::default(),
        }
    }
}

/// One finished request waiting for the next tick: when it started and ended, and whether
/// it met every SLO.
#[derive(Debug, Clone, Copy)]
struct Finished {
    start: Instant,
    end: Instant,
    good: bool,
}

/// Per replica, the load of each recent tick (raw), for the load a request lived through.
const HISTORY_TICKS: usize = 600;

/// What one replica carried, in each unit ([`Unit`]).
type Load = [f64; UNITS];

/// The load units, indices into a [`Load`]. Streams, prefill and decode tokens are what a
/// replica holds: they keep rising while it falls behind (a queue holds requests, their
/// prompts and their outputs to come). Tokens per second offered is a flow the balancer sets:
/// it sends less to a replica that struggles, so its misses show at a light flow. The hint
/// reads only what replicas hold; the flow gives the headroom in tokens per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Streams = 0,
    TokensPerS = 1,
    Prefill = 2,
    Decode = 3,
}
const UNITS: usize = 4;
const HELD: [Unit; 3] = [Unit::Streams, Unit::Prefill, Unit::Decode];

impl Unit {
    /// The lowest bin edge of its curve.
    fn lo(self) -> f64 {
        match self {
            Unit::Streams => STREAMS_LO,
            _ => TOKENS_LO,
        }
    }
}

struct Model {
    /// Attainment against load, one curve per unit.
    curves: [Curve; UNITS],
    /// Seconds taken and requests finished recently, each smoothed over `load_window_ms` like
    /// the load: their ratio is the recent mean request time (Little's law turns the load
    /// held into a throughput with it: [`estimate::desired_replicas`]).
    seconds: f64,
    finished: f64,
}

impl Model {
    /// The mean time of the requests finished recently; `None` when none did.
    fn request_time(&self) -> Option<f64> {
        (self.finished > 1e-9).then(|| self.seconds / self.finished)
    }
}

#[derive(Default)]
struct State {
    /// The list the requests finished before the last tick were taken in: swapped with the
    /// one they are counted in at each tick, so that both keep their room.
    spare: Pending<Finished>,
    /// Each replica's raw load at its recent ticks, oldest first.
    history: HashMap<Arc<str>, std::collections::VecDeque<(Instant, Load)>>,
    /// Each replica's `tokens_sent` at the last tick.
    sent: HashMap<Arc<str>, u64>,
    /// Each replica's load, smoothed over `load_window_ms`.
    replicas: HashMap<Arc<str>, Load>,
    models: HashMap<Arc<str>, Model>,
    estimates: Vec<(Arc<str>, Estimate)>,
    in_flight_tokens: Vec<InFlight>,
    last_tick: Option<Instant>,
}

/// The autoscaling signals of one proxy.
pub struct Scale {
    config: ScaleConfig,
    counting: Mutex<Counting>,
    state: Mutex<State>,
    gauges: Gauges,
    /// The `tenant` label of requests without one, allocated once.
    no_tenant: Arc<str>,
}

impl Scale {
    /// Registers the gauges in `registry`; `origin` starts the attainment windows.
    pub fn register(
        config: &ScaleConfig,
        registry: &Registry,
        origin: Instant,
    ) -> Result<Self, prometheus::Error> {
        let short = Duration::from_secs(config.short_window_s);
        let long = Duration::from_secs(config.long_window_s);
        Ok(Scale {
            config: config.clone(),
            counting: Mutex::new(Counting::new([short, long], origin)),
            state: Mutex::new(State::default()),
            gauges: Gauges::register(registry, [window_label(short), window_label(long)])?,
            no_tenant: Arc::from(NO_TENANT),
        })
    }

    pub fn config(&self) -> &ScaleConfig {
        &self.config
    }

    /// One finished request (called from the recorder's finish point). Labels come from the
    /// bounded sets of the metrics (`tenant`: `None` without one); `eligible` is false for
    /// rejections the client caused, which say nothing about the replicas.
    #[allow(clippy::too_many_arguments)]
    pub fn finished(
        &self,
        model: &Arc<str>,
        tenant: Option<&Arc<str>>,
        upstream: &Arc<str>,
        eligible: bool,
        good: bool,
        start: Instant,
        at: Instant,
    ) {
        if !eligible {
            return;
        }
        // One lock for all of it; the second is found once, and each key once for both
        // windows.
        let Ok(mut c) = self.counting.lock() else {
            return;
        };
        let c = &mut *c;
        let s = c.clock.second(at);
        c.model.add(model, good, s);
        c.tenant.add(tenant.unwrap_or(&self.no_tenant), good, s);
        c.upstream.add(upstream, good, s);
        c.pending.push(
            model,
            upstream,
            Finished {
                start,
                end: at,
                good,
            },
        );
    }

    /// One sample per replica: smooths each replica's load in every [`Unit`] (what it holds:
    /// requests, prompt tokens to prefill, output tokens to decode; and the tokens it was
    /// offered per second, a flow: what was sent, not what came out), feeds every model's
    /// curves with what finished since the last tick (each request at the mean load its replica carried
    /// from its start to its end: the load it lived through, not the load when it ended), and
    /// estimates each model's headroom.
    pub fn tick(&self, now: Instant, replicas: &[ReplicaLoad]) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let st = &mut *st;
        let dt = st
            .last_tick
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or(Duration::from_millis(self.config.tick_ms));
        st.last_tick = Some(now);
        let dt_s = dt.as_secs_f64().max(1e-3);
        let alpha = (dt_s * 1e3 / self.config.load_window_ms as f64).min(1.0);
        // The requests' list is swapped out under the counting lock, grouped outside it.
        if let Ok(mut c) = self.counting.lock() {
            std::mem::swap(&mut c.pending, &mut st.spare);
        }
        let pending = st.spare.take_grouped();
        let mut sent = std::mem::take(&mut st.sent);
        let mut smoothed: HashMap<Arc<str>, Load> = HashMap::with_capacity(replicas.len());
        let mut history = std::mem::take(&mut st.history);
        history.retain(|u, _| replicas.iter().any(|r| &r.upstream == u));
        for r in replicas {
            // A replica's counter starts at 0 when it joins.
            let before = sent.remove(&r.upstream).unwrap_or(0);
            let pending = r.tokens_pending.unwrap_or_default();
            let mut raw = [0.0; UNITS];
            raw[Unit::Streams as usize] = r.in_flight as f64;
            raw[Unit::TokensPerS as usize] = r.tokens_sent.saturating_sub(before) as f64 / dt_s;
            raw[Unit::Prefill as usize] = pending.prefill as f64;
            raw[Unit::Decode as usize] = pending.decode as f64;
            let s = match st.replicas.get(&r.upstream) {
                Some(w) => std::array::from_fn(|i| w[i] + alpha * (raw[i] - w[i])),
                None => raw,
            };
            smoothed.insert(r.upstream.clone(), s);
            let h = history.entry(r.upstream.clone()).or_default();
            if h.len() == HISTORY_TICKS {
                h.pop_front();
            }
            h.push_back((now, raw));
        }
        st.replicas = smoothed;
        st.history = history;
        st.sent = replicas
            .iter()
            .map(|r| (r.upstream.clone(), r.tokens_sent))
            .collect();
        let memory = self.config.memory as f64;
        // Every model's recent request time decays; what finished this tick adds to it.
        let mut recent: HashMap<Arc<str>, (f64, f64)> = HashMap::new();
        for ((model, upstream), mut done) in pending {
            let r = recent.entry(model.clone()).or_default();
            // A model's curves are made once a replica it finished on has a load history.
            let h = st.history.get(&upstream);
            let mut m = h.map(|_| {
                st.models.entry(model).or_insert_with(|| Model {
                    curves: [Unit::Streams, Unit::TokensPerS, Unit::Prefill, Unit::Decode]
                        .map(|u| Curve::new(u.lo(), BINS, memory)),
                    seconds: 0.0,
                    finished: 0.0,
                })
            });
            let mut lived = h.map(Lived::new);
            for f in done.drain(..) {
                let took = f.end.saturating_duration_since(f.start).as_secs_f64();
                r.0 += took;
                r.1 += 1.0;
                let (Some(lived), Some(m)) = (lived.as_mut(), m.as_deref_mut()) else {
                    continue;
                };
                if let Some((_, bins)) = lived.load(f.start, f.end, &m.curves) {
                    let good = u64::from(f.good);
                    for (c, k) in m.curves.iter_mut().zip(bins) {
                        if let Some(k) = k {
                            c.observe_in(k, good, 1, took);
                        }
                    }
                }
            }
            st.spare.give_back(done);
        }
        for (model, m) in st.models.iter_mut() {
            let (seconds, finished) = recent.get(model).copied().unwrap_or_default();
            m.seconds += alpha * (seconds - m.seconds);
            m.finished += alpha * (finished - m.finished);
        }
        let healthy = replicas.iter().filter(|r| r.healthy).count();
        let load: Load = st.replicas.values().fold([0.0; UNITS], |mut sum, r| {
            for (s, l) in sum.iter_mut().zip(r) {
                *s += l;
            }
            sum
        });
        let (target, min) = (self.config.target, self.config.min_requests as f64);
        st.estimates = st
            .models
            .iter()
            .map(|(model, m)| {
                let limit: [Option<estimate::Limit>; UNITS] =
                    std::array::from_fn(|i| m.curves[i].limit(target, min));
                let cap = limit.map(|l| l.map(|l| l.load));
                let took = m.request_time();
                // The replicas the load needs in whichever held unit binds first.
                let desired = HELD
                    .iter()
                    .filter_map(|&u| {
                        estimate::desired_replicas(limit[u as usize], load[u as usize], took)
                    })
                    .reduce(f64::max);
                let (s, t) = (Unit::Streams as usize, Unit::TokensPerS as usize);
                let e = Estimate {
                    capacity_streams: cap[s],
                    capacity_tokens: cap[t],
                    headroom_streams: estimate::headroom(cap[s], healthy, load[s]),
                    headroom_tokens: estimate::headroom(cap[t], healthy, load[t]),
                    desired_replicas: desired,
                };
                // The hint's inputs, to see why it moved (`RUST_LOG=goodput_proxy::scale=debug`).
                tracing::debug!(
                    model = &**model,
                    healthy,
                    load = ?load,
                    capacity = ?cap,
                    seconds_at_limit = ?limit.map(|l| l.map(|l| l.seconds)),
                    request_seconds = ?took,
                    desired,
                    "scale estimate (streams, tokens/s offered, prefill tokens, decode tokens)"
                );
                (model.clone(), e)
            })
            .collect();
        st.in_flight_tokens = replicas
            .iter()
            .filter_map(|r| {
                Some(InFlight {
                    upstream: r.upstream.clone(),
                    tokens: r.tokens_in_flight?,
                    pending: r.tokens_pending,
                })
            })
            .collect();
    }

    /// The `window` labels, short then long.
    pub fn window_labels(&self) -> [String; 2] {
        [
            self.gauges.window(0).to_string(),
            self.gauges.window(1).to_string(),
        ]
    }

    /// Each model's attainment at `now` over each window: (window label, model, share).
    pub fn model_attainment(&self, now: Instant) -> Vec<(String, Arc<str>, f64)> {
        let Ok(c) = self.counting.lock() else {
            return Vec::new();
        };
        let s = c.clock.second_at(now);
        let mut out = Vec::new();
        for i in 0..2 {
            for (model, a) in c.model.per_key(i, s) {
                if let Some(a) = a {
                    out.push((self.gauges.window(i).to_string(), model, a));
                }
            }
        }
        out
    }

    /// Each model's estimate as of the last tick.
    pub fn estimates(&self) -> Vec<(Arc<str>, Estimate)> {
        self.state
            .lock()
            .map(|st| st.estimates.clone())
            .unwrap_or_default()
    }

    /// Sets the gauges (right before a scrape): attainment from the windows at `now`, the
    /// rest from the last tick. A figure not known has no series (never a made-up one).
    pub fn refresh(&self, now: Instant) {
        if let Ok(c) = self.counting.lock() {
            let s = c.clock.second_at(now);
            for i in 0..2 {
                self.gauges
                    .set_attainment(i, &c.model, &c.tenant, &c.upstream, s);
            }
        }
        let Ok(st) = self.state.lock() else {
            return;
        };
        self.gauges.set_estimates(&st.estimates);
        self.gauges.set_in_flight_tokens(&st.in_flight_tokens);
    }
}

/// The mean load of the ticks in `[start, end]`; a request shorter than a tick gets the last
/// tick at or before its end. The history is in tick order (the ticks' instants never go
/// back): both ends are found by bisection, not by a pass over all [`HISTORY_TICKS`] ticks
/// for every finished request.
#[cfg(test)]
fn lived_through(
    h: &std::collections::VecDeque<(Instant, Load)>,
    start: Instant,
    end: Instant,
) -> Option<Load> {
    let (from, to) = span(h, start, end);
    mean_load(h, from, to)
}

/// The ticks of `h` in `[start, end]`, as `from..to`.
fn span(
    h: &std::collections::VecDeque<(Instant, Load)>,
    start: Instant,
    end: Instant,
) -> (usize, usize) {
    (
        h.partition_point(|(t, _)| *t < start),
        h.partition_point(|(t, _)| *t <= end),
    )
}

/// The mean load of ticks `from..to` of `h`; when there are none, the last tick before `to`.
fn mean_load(
    h: &std::collections::VecDeque<(Instant, Load)>,
    from: usize,
    to: usize,
) -> Option<Load> {
    if from >= to {
        return to.checked_sub(1).and_then(|i| h.get(i)).map(|(_, l)| *l);
    }
    let mut sum = [0.0; UNITS];
    for (_, l) in h.range(from..to) {
        for (s, v) in sum.iter_mut().zip(l) {
            *s += v;
        }
    }
    let n = to - from;
    Some(sum.map(|s| s / n as f64))
}

/// A load a request lived through and its bin in each of a model's curves.
type LoadBins = (Load, [Option<usize>; UNITS]);

/// The load each request of one replica lived through, and its bins in a model's curves, the
/// last span kept: a tick's requests mostly start and end between the same two ticks as the
/// one before (every JSON answer and short stream does), and then lived through the same load,
/// found by four comparisons instead of two bisections, a mean and a bin per curve.
struct Lived<'h> {
    h: &'h std::collections::VecDeque<(Instant, Load)>,
    /// The last span (`from..to`) and what it gave.
    last: Option<(usize, usize, Option<LoadBins>)>,
}

impl<'h> Lived<'h> {
    fn new(h: &'h std::collections::VecDeque<(Instant, Load)>) -> Self {
        Lived { h, last: None }
    }

    /// [`mean_load`] of the request's span and its bins ([`Curve::bin`]) in `curves`: the
    /// same for every request of one group (one model's curves).
    fn load(&mut self, start: Instant, end: Instant, curves: &[Curve; UNITS]) -> Option<LoadBins> {
        if let Some((from, to, found)) = self.last {
            if self.holds(from, to, start, end) {
                return found;
            }
        }
        let (from, to) = span(self.h, start, end);
        let found = mean_load(self.h, from, to)
            .map(|load| (load, std::array::from_fn(|i| curves[i].bin(load[i]))));
        self.last = Some((from, to, found));
        found
    }

    /// Whether `from..to` is [`span`]'s answer for `[start, end]`: `from` is the first tick
    /// not before `start`, `to` the first after `end`.
    fn holds(&self, from: usize, to: usize, start: Instant, end: Instant) -> bool {
        let at = |i: usize| self.h.get(i).map(|(t, _)| *t);
        let before = |i: usize| i.checked_sub(1).and_then(at);
        before(from).is_none_or(|t| t < start)
            && at(from).is_none_or(|t| t >= start)
            && before(to).is_none_or(|t| t <= end)
            && at(to).is_none_or(|t| t > end)
    }
}

/// `30s`, `5m`, `2h`: the `window` label of a window length.
fn window_label(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        _ if s >= 3_600 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        _ if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests;
