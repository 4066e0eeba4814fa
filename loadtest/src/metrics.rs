//! The loadtest's own Prometheus endpoint (`--metrics-listen`), so a dashboard can filter the
//! proxy's and engines' panels by test phase. Labels come only from the scenario's phase names
//! and the bounded outcome set.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus::{Encoder, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};
use tokio::net::TcpListener;

/// Every family, registered in one place.
pub struct LoadMetrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub in_flight: IntGauge,
    pub phase: IntGaugeVec,
    phases: Vec<String>,
}

impl LoadMetrics {
    pub fn new(phases: &[String]) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "goodput_loadtest_requests_total",
                "Requests finished by the load generator, by phase and outcome.",
            ),
            &["phase", "outcome"],
        )?;
        let in_flight = IntGauge::new(
            "goodput_loadtest_requests_in_flight",
            "Requests the load generator has in flight.",
        )?;
        let phase = IntGaugeVec::new(
            Opts::new(
                "goodput_loadtest_phase",
                "1 for the phase now running, 0 for the others (info gauge).",
            ),
            &["phase"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(phase.clone()))?;
        for p in phases {
            phase.with_label_values(&[p.as_str()]).set(0);
        }
        Ok(Self {
            registry,
            requests,
            in_flight,
            phase,
            phases: phases.to_vec(),
        })
    }

    /// Mark `current` as the running phase (None: the run is over).
    pub fn set_phase(&self, current: Option<&str>) {
        for p in &self.phases {
            self.phase
                .with_label_values(&[p.as_str()])
                .set((Some(p.as_str()) == current) as i64);
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        buf
    }
}

/// Serve `GET /metrics` (any path, in fact) on `addr` until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    m: Arc<LoadMetrics>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let m = m.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<hyper::body::Incoming>| {
                    let body = m.encode();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(body)))
                                .unwrap_or_default(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_gauge_marks_one_phase() {
        let m = LoadMetrics::new(&["a".into(), "b".into()]).unwrap();
        m.set_phase(Some("b"));
        m.requests.with_label_values(&["b", "success"]).inc();
        let text = String::from_utf8(m.encode()).unwrap();
        assert!(text.contains("goodput_loadtest_phase{phase=\"a\"} 0"));
        assert!(text.contains("goodput_loadtest_phase{phase=\"b\"} 1"));
        assert!(text.contains("goodput_loadtest_requests_total{outcome=\"success\",phase=\"b\"} 1"));
        assert!(text.contains("goodput_loadtest_requests_in_flight 0"));
    }
}
