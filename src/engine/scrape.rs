//! The background scraper: every `engine.scrape_interval_ms`, each replica's `/metrics` is
//! fetched (bounded in time and size), parsed and stored; the replica's canonical signals
//! (queue, running batch, KV use, read through [`Signals::read`]) go to the balancer. A failed
//! scrape is counted, its families are dropped, its signals read unknown (queue 0); the engine
//! its answer's `Server` header names is still known (llama-server started without
//! `--metrics` answers 501, as `llama.cpp`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use goodput_net::FetchError;
use http::{header, Request};
use http_body_util::Full;
use tokio::time::Instant;

use super::parse::{self, ParseError};
use super::signals::{self, EngineKind, EngineLoad, Signals};
use super::{Engines, Snapshot};
use crate::upstream::{Replica, UpstreamClient, Upstreams};

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("bad scrape URI: {0}")]
    Uri(#[from] http::Error),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("status {0}")]
    Status(u16),
    #[error("not Prometheus text: {0}")]
    Parse(#[from] ParseError),
    #[error("parsing was cancelled")]
    Cancelled,
}

/// Scrapes every replica now, then every interval, until the task is aborted.
pub async fn run(upstreams: Arc<Upstreams>, engines: Arc<Engines>) {
    let mut tick = tokio::time::interval(engines.config().scrape_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let replicas = upstreams.replicas();
        let scrapes = replicas
            .iter()
            .map(|r| scrape_replica(&upstreams.client, &engines, r));
        futures_util::future::join_all(scrapes).await;
    }
}

async fn scrape_replica(client: &UpstreamClient, engines: &Engines, replica: &Arc<Replica>) {
    let cfg = engines.config();
    let label = engines.upstream(replica);
    let upstream = label.as_deref().unwrap_or("?");
    let Scraped { server, page } = fetch(
        client,
        replica,
        engines.scrape_path(replica),
        cfg.scrape_timeout,
        cfg.max_bytes,
    )
    .await;
    let configured = engines.configured_kind(replica);
    let parsed = match page {
        // Off the async workers: a large page (up to `max_bytes`) takes milliseconds to
        // parse, and a blocked worker would delay the frames the meter timestamps.
        Ok(text) => match tokio::task::spawn_blocking(move || parse::parse(&text)).await {
            Ok(result) => result.map_err(ScrapeError::from),
            Err(_) => Err(ScrapeError::Cancelled),
        },
        Err(e) => Err(e),
    };
    match parsed {
        Ok(families) => {
            let signals = Signals::read(&families, configured, server);
            let mut load = signals.load;
            if !cfg.balance_on_queue {
                load.waiting = None;
            }
            replica.set_engine_load(load);
            let snap = Snapshot {
                families,
                signals,
                at: Instant::now(),
            };
            if engines.record_success(replica, snap) {
                tracing::info!(upstream, "engine metrics scraped");
            }
        }
        Err(error) => {
            // Unknown is not busy: a stale queue must not keep traffic away.
            replica.set_engine_load(EngineLoad::default());
            let kind = configured.or(server);
            if engines.record_failure(replica, kind) {
                let kind = kind.map(EngineKind::as_str);
                tracing::warn!(upstream, %error, kind, "engine metrics scrape failed");
            } else {
                tracing::debug!(upstream, %error, "engine metrics scrape failed");
            }
        }
    }
}

/// What one `GET` of a replica's metrics path got.
pub struct Scraped {
    /// The engine the answer's `Server` header names, whatever its status.
    pub server: Option<EngineKind>,
    /// The page's text (a 2xx answer), else why there is none.
    pub page: Result<String, ScrapeError>,
}

/// One `GET` of the replica's metrics page, whole, within `timeout` and `max_bytes`.
pub async fn fetch(
    client: &UpstreamClient,
    replica: &Replica,
    path: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Scraped {
    let req = replica.uri_for(path).and_then(|uri| {
        Request::get(uri)
            // The classic text format (not OpenMetrics), which the parser reads.
            .header(header::ACCEPT, "text/plain;version=0.0.4;q=1,*/*;q=0.1")
            .body(Full::new(Bytes::new()))
    });
    let req = match req {
        Ok(req) => req,
        Err(e) => return failed(e.into()),
    };
    let answer = match goodput_net::fetch(client, req, timeout, max_bytes).await {
        Ok(a) => a,
        Err(e) => return failed(e.into()),
    };
    let server = answer
        .headers
        .get(header::SERVER)
        .and_then(|v| v.to_str().ok())
        .and_then(signals::from_server);
    let page = if answer.status.is_success() {
        answer.text().map_err(ScrapeError::from)
    } else {
        Err(ScrapeError::Status(answer.status.as_u16()))
    };
    Scraped { server, page }
}

fn failed(e: ScrapeError) -> Scraped {
    Scraped {
        server: None,
        page: Err(e),
    }
}
