//! The autoscaling gauges, registered in one place. Labels: `window` (the two configured
//! lengths), `model` / `tenant` / `upstream` (the metrics' bounded label sets).

use std::sync::{Arc, Mutex};

use prometheus::{GaugeVec, Opts, Registry};
use tokio::time::Instant;

use super::{Estimate, InFlight};
use crate::metrics::labels::{PendingTokens, TokenPhase};
use crate::metrics::{Gauges as Family, Registrar};
use goodput_measure::window::RatioWindow;

pub(super) struct Gauges {
    windows: [String; 2],
    attainment_model: GaugeVec,
    attainment_tenant: GaugeVec,
    attainment_upstream: GaugeVec,
    headroom_streams: GaugeVec,
    headroom_tokens: GaugeVec,
    capacity_streams: GaugeVec,
    capacity_tokens: GaugeVec,
    desired_replicas: GaugeVec,
    tokens_in_flight: GaugeVec,
    tokens_pending: Family<PendingTokens<'static>>,
    /// Upstreams whose tokens-in-flight series is set (a replica that left loses it).
    tokens_set: Mutex<Vec<Arc<str>>>,
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec, prometheus::Error> {
    GaugeVec::new(Opts::new(name, help), labels)
}

impl Gauges {
    pub(super) fn register(
        registry: &Registry,
        windows: [String; 2],
    ) -> Result<Self, prometheus::Error> {
        let g = Gauges {
            windows,
            attainment_model: gauge(
                "goodput_proxy_slo_attainment",
                "Share of finished requests (rejections the client caused left out) that met every SLO, over the sliding window `window` (scale.short_window_s, scale.long_window_s), per model; absent while the window is empty.",
                &["window", "model"],
            )?,
            attainment_tenant: gauge(
                "goodput_proxy_slo_attainment_by_tenant",
                "goodput_proxy_slo_attainment per tenant (`none`: no tenant).",
                &["window", "tenant"],
            )?,
            attainment_upstream: gauge(
                "goodput_proxy_slo_attainment_by_upstream",
                "goodput_proxy_slo_attainment per replica.",
                &["window", "upstream"],
            )?,
            headroom_streams: gauge(
                "goodput_proxy_headroom_streams",
                "More concurrent streams the healthy replicas can take before the model's SLO attainment falls below scale.target, learned from load against attainment per replica; absent until that limit has been seen.",
                &["model"],
            )?,
            headroom_tokens: gauge(
                "goodput_proxy_headroom_tokens_per_second",
                "As goodput_proxy_headroom_streams, in tokens offered per second (prompt + output asked for, as the balancer estimates them when it sends a request).",
                &["model"],
            )?,
            capacity_streams: gauge(
                "goodput_proxy_capacity_streams",
                "Concurrent streams one replica carries at scale.target attainment for the model (the estimate behind the headroom); absent until seen.",
                &["model"],
            )?,
            capacity_tokens: gauge(
                "goodput_proxy_capacity_tokens_per_second",
                "Tokens per second one replica carries at scale.target attainment for the model; absent until seen.",
                &["model"],
            )?,
            desired_replicas: gauge(
                "goodput_proxy_desired_replicas",
                "Replicas the current load needs to meet scale.target for the model: load / capacity per replica, the largest over what replicas hold (streams, prompt tokens to prefill, output tokens to decode) (a fraction: round up); absent until a capacity is known.",
                &["model"],
            )?,
            tokens_in_flight: gauge(
                "goodput_proxy_upstream_tokens_in_flight",
                "Estimated tokens (prompt + output asked for) of this proxy's requests in flight at the replica, as the balancer counts them.",
                &["upstream"],
            )?,
            tokens_pending: Registrar::new(registry).gauges(
                "goodput_proxy_upstream_tokens_pending",
                "Work of this proxy's requests in flight at the replica, in estimated tokens, by phase: prefill (prompt tokens of requests without output yet: waiting or in prefill) and decode (output tokens still to come: max_tokens, else 256, less those served). Non-streaming requests count as prefill until they end.",
            )?,
            tokens_set: Mutex::new(Vec::new()),
        };
        for f in [
            &g.attainment_model,
            &g.attainment_tenant,
            &g.attainment_upstream,
            &g.headroom_streams,
            &g.headroom_tokens,
            &g.capacity_streams,
            &g.capacity_tokens,
            &g.desired_replicas,
            &g.tokens_in_flight,
        ] {
            registry.register(Box::new(f.clone()))?;
        }
        Ok(g)
    }

    /// The `window` label of window `i` (0: short, 1: long).
    pub(super) fn window(&self, i: usize) -> &str {
        &self.windows[i]
    }

    /// Window `i`'s attainment series at `now`.
    pub(super) fn set_attainment(
        &self,
        i: usize,
        model: &RatioWindow,
        tenant: &RatioWindow,
        upstream: &RatioWindow,
        now: Instant,
    ) {
        let w = &self.windows[i];
        for (g, win) in [
            (&self.attainment_model, model),
            (&self.attainment_tenant, tenant),
            (&self.attainment_upstream, upstream),
        ] {
            for (key, ratio) in win.per_key(now) {
                set_or_remove(g, &[w, &key], ratio);
            }
        }
    }

    pub(super) fn set_estimates(&self, estimates: &[(Arc<str>, Estimate)]) {
        for (model, e) in estimates {
            let l = [&**model];
            set_or_remove(&self.headroom_streams, &l, e.headroom_streams);
            set_or_remove(&self.headroom_tokens, &l, e.headroom_tokens);
            set_or_remove(&self.capacity_streams, &l, e.capacity_streams);
            set_or_remove(&self.capacity_tokens, &l, e.capacity_tokens);
            set_or_remove(&self.desired_replicas, &l, e.desired_replicas);
        }
    }

    pub(super) fn set_in_flight_tokens(&self, tokens: &[InFlight]) {
        let Ok(mut set) = self.tokens_set.lock() else {
            return;
        };
        let phases = [TokenPhase::Prefill, TokenPhase::Decode];
        for gone in set
            .iter()
            .filter(|u| !tokens.iter().any(|t| &t.upstream == *u))
        {
            let _ = self.tokens_in_flight.remove_label_values(&[gone]);
            for phase in phases {
                self.tokens_pending.remove(&PendingTokens {
                    upstream: gone,
                    phase,
                });
            }
        }
        for t in tokens {
            let u = &*t.upstream;
            self.tokens_in_flight
                .with_label_values(&[u])
                .set(t.tokens as f64);
            for phase in phases {
                let n = t.pending.map(|p| match phase {
                    TokenPhase::Prefill => p.prefill,
                    TokenPhase::Decode => p.decode,
                });
                let series = PendingTokens { upstream: u, phase };
                self.tokens_pending
                    .set_or_remove(&series, n.map(|n| n as f64));
            }
        }
        *set = tokens.iter().map(|t| t.upstream.clone()).collect();
    }
}

fn set_or_remove(g: &GaugeVec, l: &[&str], v: Option<f64>) {
    match v {
        Some(v) => g.with_label_values(l).set(v),
        None => {
            let _ = g.remove_label_values(l);
        }
    }
}
