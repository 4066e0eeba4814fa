//! `[balance]`: how a replica is chosen for each request (see `src/upstream/strategy/` and
//! docs/routing.md). Nothing here needs converting, so the raw table is also the checked form.

use serde::Deserialize;

/// The strategy: one knob, `GOODPUT_PROXY_BALANCE_STRATEGY` in the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Power of two choices on requests in flight plus the engine's queue.
    P2c,
    /// Prefix affinity: the replica that recently served the request's longest prefix, unless
    /// it is saturated; else the least loaded (in tokens).
    Prefix,
    /// Measured goodput: replicas weighted by their recent SLO attainment, load in tokens,
    /// with an exploration share.
    Goodput,
    /// Prefix affinity among the replicas that meet their SLOs, goodput otherwise.
    Auto,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::P2c => "p2c",
            Strategy::Prefix => "prefix",
            Strategy::Goodput => "goodput",
            Strategy::Auto => "auto",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BalanceConfig {
    /// `p2c`, `prefix`, `goodput` or `auto` (docs/routing.md compares them).
    pub strategy: Strategy,
    /// Share of requests (goodput, auto) sent to a random healthy replica whose engine is not
    /// saturated, while the replicas' attainments differ, so that a replica that recovered
    /// earns traffic back (0 to 0.5). While every replica meets its SLOs alike, none is.
    pub exploration: f64,
    /// Bytes of the request's prompt text per prefix block (about 4 bytes per token).
    pub prefix_block_bytes: usize,
    /// Fewest prefix blocks a match must cover to be worth affinity (short shared openings,
    /// such as one system sentence, are cheap to prefill anywhere).
    pub prefix_min_blocks: usize,
    /// Prefix blocks the index remembers, at most (its memory bound: about 64 bytes each).
    pub prefix_index_blocks: usize,
    /// A replica is saturated, and loses its affinity, when its load in tokens with the
    /// request (at what its cache lacks of it) exceeds this multiple of the healthy replicas'
    /// mean load with the request plus one request (cold), or its engine queues
    /// `saturation_queue` requests, or its KV cache is fuller than `saturation_kv` while at
    /// least one request waits (a full cache that still admits every request costs nothing).
    pub saturation_ratio: f64,
    pub saturation_queue: f64,
    pub saturation_kv: f64,
    /// Weight of each measured SLO attainment point (goodput, auto): a replica's load counts
    /// as load / attainment^weight, so one that misses its SLOs gets little traffic.
    pub attainment_weight: f64,
    /// Retry an engine's admission rejection answered with a 503 status on another replica
    /// (nothing reached the client: the status is in the head, nothing is delayed).
    pub retry_rejections: bool,
    /// Also hold a 200 stream's response head until its first event, so that a rejection
    /// sent as the stream's first event (vLLM 0.32 when requests race past its first check)
    /// is retried unseen too (with `retry_rejections`). Off by default: the client's time to
    /// the response head becomes its time to the first event (docs/routing.md measures it).
    pub hold_first_event: bool,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            strategy: Strategy::Auto,
            exploration: 0.02,
            prefix_block_bytes: 256,
            prefix_min_blocks: 4,
            prefix_index_blocks: 65_536,
            saturation_ratio: 1.5,
            saturation_queue: 4.0,
            saturation_kv: 0.95,
            attainment_weight: 2.0,
            retry_rejections: true,
            hold_first_event: false,
        }
    }
}

impl BalanceConfig {
    /// Every problem, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = Vec::new();
        if !(0.0..=0.5).contains(&self.exploration) {
            p.push(("balance.exploration", "must be between 0 and 0.5"));
        }
        if !(16..=65_536).contains(&self.prefix_block_bytes) {
            p.push(("balance.prefix_block_bytes", "must be between 16 and 65536"));
        }
        if self.prefix_min_blocks == 0 {
            p.push(("balance.prefix_min_blocks", "must be positive"));
        }
        if !(1_024..=1 << 24).contains(&self.prefix_index_blocks) {
            p.push((
                "balance.prefix_index_blocks",
                "must be between 1024 and 16777216",
            ));
        }
        if !(self.saturation_ratio.is_finite() && self.saturation_ratio >= 1.0) {
            p.push(("balance.saturation_ratio", "must be a number >= 1"));
        }
        if !(self.saturation_queue.is_finite() && self.saturation_queue >= 0.0) {
            p.push(("balance.saturation_queue", "must be a number >= 0"));
        }
        if !(self.saturation_kv > 0.0 && self.saturation_kv <= 1.0) {
            p.push(("balance.saturation_kv", "must be in (0, 1]"));
        }
        if !(self.attainment_weight.is_finite() && (0.0..=8.0).contains(&self.attainment_weight)) {
            p.push(("balance.attainment_weight", "must be between 0 and 8"));
        }
        p
    }
}
