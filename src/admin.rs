//! Admin listener routes, on their own port: `/healthz` (alive), `/readyz` (an upstream answers
//! and the process is not draining), `/metrics` (Prometheus text), `/stats` (not yet).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::app::AppState;

/// Answers one admin request.
pub async fn handle<B>(
    state: Arc<AppState>,
    req: Request<B>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"));
    }
    Ok(match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => readyz(&state),
        "/metrics" => metrics(&state),
        // STATS: the measure engineer's raw-record ring answers here; until then, 501.
        "/stats" => text(
            StatusCode::NOT_IMPLEMENTED,
            "stats are not implemented yet\n",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

fn readyz(state: &AppState) -> Response<Full<Bytes>> {
    if state.draining.load(Ordering::SeqCst) {
        text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else if !state.upstreams.any_healthy() {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no upstream answers its health check\n",
        )
    } else {
        text(StatusCode::OK, "ready\n")
    }
}

fn metrics(state: &AppState) -> Response<Full<Bytes>> {
    use prometheus::Encoder;
    let encoder = prometheus::TextEncoder::new();
    let mut buf = Vec::new();
    if let Err(e) = encoder.encode(&state.registry.gather(), &mut buf) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding metrics failed: {e}\n"),
        );
    }
    let mut resp = Response::new(Full::new(Bytes::from(buf)));
    if let Ok(v) = encoder.format_type().parse() {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
