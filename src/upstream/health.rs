//! Readiness probes: each replica's health path, at an interval, feeding `/readyz` and the
//! balancer's preference for healthy replicas.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use super::{Replica, Upstreams};

/// Probes every replica now, then every `health_interval` until the task is aborted.
pub async fn run(upstreams: Arc<Upstreams>) {
    let mut tick = tokio::time::interval(upstreams.config.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let replicas = upstreams.replicas();
        let probes = replicas.iter().map(|r| probe(&upstreams, r));
        futures_util::future::join_all(probes).await;
    }
}

/// Probes one replica and records the result (discovery probes a new replica at once).
pub async fn probe(up: &Upstreams, replica: &Arc<Replica>) {
    let ok = probe_once(up, replica).await;
    if ok != replica.is_healthy() {
        tracing::info!(upstream = %replica.url, healthy = ok, "upstream health changed");
    }
    replica.set_healthy(ok);
}

async fn probe_once(up: &Upstreams, replica: &Replica) -> bool {
    let Ok(uri) = replica.uri_for(&up.config.health_path) else {
        return false;
    };
    let Ok(req) = Request::get(uri).body(Full::new(Bytes::new())) else {
        return false;
    };
    // A probe never waits longer than the interval (nor than connect + a little).
    let limit = up
        .config
        .health_interval
        .min(up.config.connect_timeout + Duration::from_secs(1));
    matches!(
        tokio::time::timeout(limit, up.client.request(req)).await,
        Ok(Ok(resp)) if resp.status().is_success()
    )
}
