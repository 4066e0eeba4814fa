//! The live data source of `compare`: a running proxy's admin port. `/metrics` is scraped at
//! the start, every second during the window (for the engines' running / waiting maxima) and at
//! the end; `/stats` gives the exact percentiles of the same window at its end.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::time::Instant;

use super::{
    check_families, fold_gauges, groups_in, Exact, GroupKey, TtftWhere, Window, P50P99, QUANTITIES,
};
use crate::engine::parse::{self, Family};

/// How long one admin request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest admin page read (the proxy's `/metrics` carries every replica's engine families:
/// a few hundred KiB each).
const MAX_PAGE_BYTES: usize = 64 << 20;
/// Default interval of the extra scrapes during the window (engine gauge maxima).
const GAUGE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("--admin {0:?} is not an http:// URL")]
    BadUrl(String),
    #[error(
        "the admin URL {url} does not answer: {reason} (is the proxy running? --admin is its \
         server.admin_listen, e.g. http://127.0.0.1:9090)"
    )]
    Unreachable { url: String, reason: String },
    #[error("{url} answered {status}")]
    Status { url: String, status: u16 },
    #[error("{url} is not Prometheus text: {source}")]
    Parse {
        url: String,
        source: parse::ParseError,
    },
    #[error("{url} is not a /stats document: {reason}")]
    Stats { url: String, reason: String },
    #[error(transparent)]
    Compare(#[from] super::CompareError),
}

/// A proxy's admin port.
pub struct Admin {
    base: String,
    client: Client<HttpConnector, Empty<Bytes>>,
    gauge_interval: Duration,
}

impl Admin {
    pub fn new(url: &str) -> Result<Admin, AdminError> {
        let base = url.trim_end_matches('/').to_string();
        match base.parse::<Uri>() {
            Ok(u) if u.scheme_str() == Some("http") && u.authority().is_some() => {}
            _ => return Err(AdminError::BadUrl(url.to_string())),
        }
        Ok(Admin {
            base,
            client: Client::builder(TokioExecutor::new()).build_http(),
            gauge_interval: GAUGE_INTERVAL,
        })
    }

    /// Samples the engine gauges every `every` during a window instead of every second. A
    /// batch that fills and drains between two samples is missed, so short loads (tests, a
    /// burst) want samples as often as the proxy scrapes its engines.
    pub fn with_gauge_interval(mut self, every: Duration) -> Admin {
        self.gauge_interval = every.max(Duration::from_millis(10));
        self
    }

    async fn get(&self, path_and_query: &str) -> Result<String, AdminError> {
        let url = format!("{}{}", self.base, path_and_query);
        let unreachable = |reason: String| AdminError::Unreachable {
            url: self.base.clone(),
            reason,
        };
        let uri: Uri = url.parse().map_err(|_| AdminError::BadUrl(url.clone()))?;
        let req = Request::get(uri)
            .body(Empty::new())
            .map_err(|_| AdminError::BadUrl(url.clone()))?;
        let page = goodput_net::fetch(&self.client, req, REQUEST_TIMEOUT, MAX_PAGE_BYTES)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if page.status != 200 {
            return Err(AdminError::Status {
                url: url.clone(),
                status: page.status.as_u16(),
            });
        }
        Ok(String::from_utf8_lossy(&page.body).into_owned())
    }

    async fn metrics(&self) -> Result<Vec<Family>, AdminError> {
        let text = self.get("/metrics").await?;
        parse::parse(&text).map_err(|source| AdminError::Parse {
            url: format!("{}/metrics", self.base),
            source,
        })
    }

    /// Scrapes, waits `window`, scrapes again, and reads `/stats` for every group that had
    /// requests in between.
    pub async fn window(&self, window: Duration, by_upstream: bool) -> Result<Window, AdminError> {
        let page = format!("{}/metrics", self.base);
        let start = self.metrics().await?;
        // The first engine scrape may not have happened yet: engines are checked at the end.
        check_families(&start, &page, false)?;
        let t0 = Instant::now();
        let mut w = Window::default();
        fold_gauges(&mut w, &start);
        w.start = start;
        let end = loop {
            let left = window.saturating_sub(t0.elapsed());
            tokio::time::sleep(left.min(self.gauge_interval)).await;
            let page = self.metrics().await?;
            fold_gauges(&mut w, &page);
            if t0.elapsed() >= window {
                break page;
            }
        };
        check_families(&end, &page, true)?;
        w.seconds = t0.elapsed().as_secs_f64();
        w.end = end;
        for key in groups_in(&w, by_upstream) {
            let (exact, split) = self.exact(&key, w.seconds).await?;
            w.exact.insert(key.clone(), exact);
            w.ttft_split.insert(key, split);
        }
        Ok(w)
    }

    async fn exact(
        &self,
        key: &GroupKey,
        seconds: f64,
    ) -> Result<(BTreeMap<&'static str, Exact>, TtftWhere), AdminError> {
        let mut q = format!(
            "/stats?window={seconds:.3}&model={}",
            goodput_net::query_value(&key.model)
        );
        if let Some(u) = &key.upstream {
            q.push_str(&format!("&upstream={}", goodput_net::query_value(u)));
        }
        let body = self.get(&q).await?;
        let url = format!("{}{q}", self.base);
        let doc: Value = serde_json::from_str(&body).map_err(|e| AdminError::Stats {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let exact = exact_from_stats(&doc).map_err(|reason| AdminError::Stats { url, reason })?;
        Ok((exact, split_from_stats(&doc)))
    }
}

/// Where TTFT went, from a `/stats` document's `ttft_split`, `engine` and `tpot_seconds`
/// (zeros from a proxy that has no such sections).
pub fn split_from_stats(doc: &Value) -> TtftWhere {
    let pq = |v: Option<&Value>| P50P99 {
        p50: v.and_then(|s| s.get("p50")).and_then(Value::as_f64),
        p99: v.and_then(|s| s.get("p99")).and_then(Value::as_f64),
    };
    let split = doc.get("ttft_split");
    let part = |k: &str| pq(split.and_then(|s| s.get(k)));
    let count = |k: &str| {
        split
            .and_then(|s| s.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    TtftWhere {
        requests: count("requests"),
        clamped: count("clamped"),
        proxy: part("proxy_seconds"),
        engine_queue: part("queue_seconds"),
        engine_prefill: part("prefill_seconds"),
        rest: part("rest_seconds"),
        client_tpot: pq(doc.get("tpot_seconds")),
        engine_mean_itl: pq(doc.get("engine").and_then(|e| e.get("mean_itl_seconds"))),
    }
}

/// The exact figures of a `/stats` document, per quantity.
pub fn exact_from_stats(doc: &Value) -> Result<BTreeMap<&'static str, Exact>, String> {
    let mut out = BTreeMap::new();
    for q in QUANTITIES {
        let s = doc
            .get(q.stats_field)
            .ok_or_else(|| format!("no `{}` field", q.stats_field))?;
        let count = s
            .get("count")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("`{}.count` is not a count", q.stats_field))?;
        let value = |k: &str| s.get(k).and_then(Value::as_f64);
        out.insert(
            q.name,
            Exact {
                count,
                values: [value("p50"), value("p90"), value("p99")],
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_documents_are_read_and_checked() {
        let doc = serde_json::json!({
            "ttft_seconds": {"count": 3, "p50": 0.1, "p90": 0.2, "p99": 0.3},
            "tpot_seconds": {"count": 0, "p50": null, "p90": null, "p99": null},
            "e2e_seconds": {"count": 3, "p50": 1.0, "p90": 2.0, "p99": 3.0},
        });
        let e = exact_from_stats(&doc).unwrap();
        assert_eq!(e["ttft"].values, [Some(0.1), Some(0.2), Some(0.3)]);
        assert_eq!(e["tpot"], Exact::default());
        let err = exact_from_stats(&serde_json::json!({"ttft_seconds": {}})).unwrap_err();
        assert!(err.contains("ttft_seconds.count"), "{err}");
    }

    #[test]
    fn bad_urls_are_refused() {
        assert!(matches!(
            Admin::new("localhost:9090"),
            Err(AdminError::BadUrl(_))
        ));
        assert!(Admin::new("http://127.0.0.1:9090/").is_ok());
    }
}
