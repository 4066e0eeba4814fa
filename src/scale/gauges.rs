//! The autoscaling gauges, registered in one place. Labels: `window` (the two configured
//! lengths), `model` / `tenant` / `upstream` (the metrics' bounded label sets).

use std::sync::{Arc, Mutex};

use prometheus::Registry;

use super::{Estimate, InFlight};
use crate::metrics::labels::{
    ByModel, ByUpstream, PendingTokens, TokenPhase, WindowModel, WindowTenant, WindowUpstream,
};
use crate::metrics::window::KeyedRings;
use crate::metrics::{Gauges as Family, Registrar};

pub(super) struct Gauges {
    windows: [String; 2],
    attainment_model: Family<WindowModel<'static>>,
    attainment_tenant: Family<WindowTenant<'static>>,
    attainment_upstream: Family<WindowUpstream<'static>>,
    headroom_streams: Family<ByModel<'static>>,
    headroom_tokens: Family<ByModel<'static>>,
    capacity_streams: Family<ByModel<'static>>,
    capacity_tokens: Family<ByModel<'static>>,
    desired_replicas: Family<ByModel<'static>>,
    tokens_in_flight: Family<ByUpstream<'static>>,
    tokens_pending: Family<PendingTokens<'static>>,
    /// Upstreams whose tokens-in-flight series is set (a replica that left loses it).
    tokens_set: Mutex<Vec<Arc<str>>>,
}

impl Gauges {
    pub(super) fn register(
        registry: &Registry,
        windows: [String; 2],
    ) -> Result<Self, prometheus::Error> {
        let r = Registrar::new(registry);
        Ok(Gauges {
            windows,
            attainment_model: r.gauges(
                "goodput_proxy_slo_attainment",
                "Share of finished requests (rejections the client caused left out) that met every SLO, over the sliding window `window` (scale.short_window_s, scale.long_window_s), per model; absent while the window is empty.",
            )?,
            attainment_tenant: r.gauges(
                "goodput_proxy_slo_attainment_by_tenant",
                "goodput_proxy_slo_attainment per tenant (`none`: no tenant).",
            )?,
            attainment_upstream: r.gauges(
                "goodput_proxy_slo_attainment_by_upstream",
                "goodput_proxy_slo_attainment per replica.",
            )?,
            headroom_streams: r.gauges(
                "goodput_proxy_headroom_streams",
                "More concurrent streams the healthy replicas can take before the model's SLO attainment falls below scale.target, learned from load against attainment per replica; absent until that limit has been seen.",
            )?,
            headroom_tokens: r.gauges(
                "goodput_proxy_headroom_tokens_per_second",
                "As goodput_proxy_headroom_streams, in tokens offered per second (prompt + output asked for, as the balancer estimates them when it sends a request).",
            )?,
            capacity_streams: r.gauges(
                "goodput_proxy_capacity_streams",
                "Concurrent streams one replica carries at scale.target attainment for the model (the estimate behind the headroom); absent until seen.",
            )?,
            capacity_tokens: r.gauges(
                "goodput_proxy_capacity_tokens_per_second",
                "Tokens per second one replica carries at scale.target attainment for the model; absent until seen.",
            )?,
            desired_replicas: r.gauges(
                "goodput_proxy_desired_replicas",
                "Replicas the current load needs to meet scale.target for the model: its throughput over one replica's at the limit (Little's law: load held / capacity per replica x request time at the capacity / recent request time, never below load / capacity), the largest over what replicas hold (streams, prompt tokens to prefill, output tokens to decode) (a fraction: round up); absent until a capacity is known.",
            )?,
            tokens_in_flight: r.gauges(
                "goodput_proxy_upstream_tokens_in_flight",
                "Estimated tokens (prompt + output asked for) of this proxy's requests in flight at the replica, as the balancer counts them.",
            )?,
            tokens_pending: r.gauges(
                "goodput_proxy_upstream_tokens_pending",
                "Work of this proxy's requests in flight at the replica, in estimated tokens, by phase: prefill (prompt tokens of requests without output yet: waiting or in prefill) and decode (output tokens still to come: max_tokens, else 256, less those served). Non-streaming requests count as prefill until they end.",
            )?,
            tokens_set: Mutex::new(Vec::new()),
        })
    }

    /// The `window` label of window `i` (0: short, 1: long).
    pub(super) fn window(&self, i: usize) -> &str {
        &self.windows[i]
    }

    /// Window `i`'s attainment series at second `now` of the rings.
    pub(super) fn set_attainment(
        &self,
        i: usize,
        model: &KeyedRings<2>,
        tenant: &KeyedRings<2>,
        upstream: &KeyedRings<2>,
        now: u64,
    ) {
        let window = &*self.windows[i];
        for (model, ratio) in model.per_key(i, now) {
            let series = WindowModel {
                window,
                model: &model,
            };
            self.attainment_model.set_or_remove(&series, ratio);
        }
        for (tenant, ratio) in tenant.per_key(i, now) {
            let series = WindowTenant {
                window,
                tenant: &tenant,
            };
            self.attainment_tenant.set_or_remove(&series, ratio);
        }
        for (upstream, ratio) in upstream.per_key(i, now) {
            let series = WindowUpstream {
                window,
                upstream: &upstream,
            };
            self.attainment_upstream.set_or_remove(&series, ratio);
        }
    }

    pub(super) fn set_estimates(&self, estimates: &[(Arc<str>, Estimate)]) {
        for (model, e) in estimates {
            let l = ByModel { model };
            self.headroom_streams.set_or_remove(&l, e.headroom_streams);
            self.headroom_tokens.set_or_remove(&l, e.headroom_tokens);
            self.capacity_streams.set_or_remove(&l, e.capacity_streams);
            self.capacity_tokens.set_or_remove(&l, e.capacity_tokens);
            self.desired_replicas.set_or_remove(&l, e.desired_replicas);
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
            self.tokens_in_flight.remove(&ByUpstream { upstream: gone });
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
                .get(&ByUpstream { upstream: u })
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
