//! Admin listener routes, on their own port: `/healthz` (alive), `/readyz` (an upstream answers
//! and the process is not draining), `/metrics` (Prometheus text: the proxy's families, then
//! every engine's relabelled `upstream`), `/stats` (exact statistics
//! over the recent request records), `/trace/<request-id>` (a traced request's token-level
//! trace while it is kept), `/` (the live dashboard page) and `/dashboard.json` (its data; see
//! `dashboard`).

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::stack::ProxyService;
use crate::state::AppState;
use goodput_measure::record::{parse_stats_query, StatsQueryError};
use tokio::time::Instant;

/// The admin routes as a service the one accept loop (`listener::serve`) can run: the same
/// connection limit, head limits and drain as the public port, nothing of the public stack.
pub fn service(state: Arc<AppState>) -> ProxyService {
    use http_body_util::BodyExt;
    let svc = tower::service_fn(move |req: Request<hyper::body::Incoming>| {
        let state = state.clone();
        async move {
            let resp = handle(state, req).await?;
            Ok::<_, Infallible>(resp.map(|b| b.map_err(|never| match never {}).boxed_unsync()))
        }
    });
    ProxyService::new(svc)
}

/// Answers one admin request.
pub async fn handle<B>(
    state: Arc<AppState>,
    req: Request<B>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"));
    }
    Ok(match req.uri().path() {
        "/" => page(req.headers()),
        "/dashboard.json" => dashboard(&state, req.uri().query()),
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => readyz(&state),
        "/metrics" => metrics(&state),
        "/stats" => stats(&state, req.uri().query()),
        p if p.starts_with("/trace/") => trace(&state, &p["/trace/".len()..]),
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

/// The proxy's own families, then every engine's (relabelled `upstream`, each family once).
fn metrics(state: &AppState) -> Response<Full<Bytes>> {
    use prometheus::Encoder;
    state.engines.refresh_gauges(Instant::now());
    state
        .recorder
        .metrics()
        .refresh_goodput_ratio(Instant::now());
    if let Some(scale) = state.recorder.scale() {
        scale.refresh(Instant::now());
    }
    let encoder = prometheus::TextEncoder::new();
    let families = state.registry.gather();
    let mut buf = Vec::new();
    if let Err(e) = encoder.encode(&families, &mut buf) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding metrics failed: {e}\n"),
        );
    }
    let mut page = String::from_utf8(buf).unwrap_or_default();
    let own: HashSet<&str> = families.iter().map(|f| f.name()).collect();
    // The proxy's prefix is reserved even for families not registered (yet) here, so an engine
    // can never shadow or interleave with one of ours.
    let reserved = |name: &str| own.contains(name) || name.starts_with("goodput_proxy_");
    state.engines.render_into(&mut page, &reserved);
    let mut resp = Response::new(Full::new(Bytes::from(page)));
    if let Ok(v) = encoder.format_type().parse() {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

/// `GET /stats?window=SECONDS[&model=NAME][&upstream=LABEL]`; a bad query is a 400 naming the
/// parameter. `upstream` takes the label value of `/metrics` (`none`: no replica answered).
fn stats(state: &AppState, query: Option<&str>) -> Response<Full<Bytes>> {
    match parse_stats_query(query) {
        Ok(q) => {
            let urls = q
                .upstream
                .as_deref()
                .map(|l| state.recorder.metrics().upstreams.urls_of(l));
            let urls: Option<Vec<&str>> = urls
                .as_ref()
                .map(|u| u.iter().map(|s| s.as_str()).collect());
            let doc = state.recorder.ring().stats_for(
                Instant::now(),
                q.window,
                q.model.as_deref(),
                urls.as_deref(),
            );
            json(StatusCode::OK, &doc)
        }
        Err(e) => {
            let param = match &e {
                StatsQueryError::BadWindow(_) => "window".to_string(),
                StatsQueryError::UnknownParam(p) => p.clone(),
            };
            let doc = serde_json::json!({
                "error": {"message": e.to_string(), "param": param, "code": 400}
            });
            json(StatusCode::BAD_REQUEST, &doc)
        }
    }
}

/// `GET /trace/<request-id>` (the id percent-decoded): `{"id", "record", "trace"}` while the
/// traced request's record and trace are kept in the ring (`[trace] max_traces`), else a 404
/// in the OpenAI error shape.
fn trace(state: &AppState, raw_id: &str) -> Response<Full<Bytes>> {
    let id = percent_decode(raw_id);
    match state.recorder.ring().trace(&id) {
        Some((record, trace)) => {
            let doc = serde_json::json!({ "id": id, "record": record, "trace": trace });
            json(StatusCode::OK, &doc)
        }
        None => {
            let doc = serde_json::json!({ "error": {
                "message": format!("no trace of request {id:?}: it was not traced, or its trace is no longer kept"),
                "type": "not_found",
                "param": "request_id",
                "code": 404,
            }});
            json(StatusCode::NOT_FOUND, &doc)
        }
    }
}

/// The dashboard page: a constant, so a browser that has it revalidates for a 304.
fn page(headers: &http::HeaderMap) -> Response<Full<Bytes>> {
    static ETAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let etag = ETAG.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        crate::dashboard::PAGE.hash(&mut h);
        format!("\"{:016x}\"", h.finish())
    });
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut resp = if fresh {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        Response::new(Full::new(Bytes::from_static(
            crate::dashboard::PAGE.as_bytes(),
        )))
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    if let Ok(v) = header::HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    // Everything the page needs is inline; it talks only to this port.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    resp
}

/// `GET /dashboard.json?window=SECONDS`: the page's data (see `dashboard::document`).
fn dashboard(state: &AppState, query: Option<&str>) -> Response<Full<Bytes>> {
    match crate::dashboard::parse_query(query) {
        Ok(window) => {
            let mut resp = json(StatusCode::OK, &crate::dashboard::document(state, window));
            resp.headers_mut().insert(
                header::CACHE_CONTROL,
                header::HeaderValue::from_static("no-store"),
            );
            resp
        }
        Err(e) => {
            let doc = serde_json::json!({
                "error": {"message": e.to_string(), "param": e.param(), "code": 400}
            });
            json(StatusCode::BAD_REQUEST, &doc)
        }
    }
}

/// `%XX` decoded (a path segment: `+` stays itself); invalid UTF-8 replaced.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| char::from(c).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json(status: StatusCode, doc: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(doc.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
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
