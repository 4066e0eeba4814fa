//! Routing and response heads, shaped like vLLM behind uvicorn: `date`, `server: uvicorn`,
//! `content-type`, `vary: Origin`, then `content-length` or `transfer-encoding: chunked`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

use super::agent;
use super::coalesce::Packing;
use super::engine::{Engine, Run};
use super::errors::{queue_overflow_stream, ApiError};
use super::faults::{self, Faults, FAULT_HEADER};
use super::nonstream::{self, NonStream};
use super::render::Templates;
use super::request::{self, Api};
use super::stream::{SseBody, Truncated};
use super::text::SplitMix;

/// Largest request body read (vLLM has no small limit; this bounds memory).
const MAX_BODY: usize = 32 * 1024 * 1024;

/// Every response body the simulator sends.
pub enum SimBody {
    Full(Option<Bytes>),
    Sse(Box<SseBody>),
    /// Sends `prefix`, yields once (so it is flushed), then fails so that hyper closes the
    /// connection.
    Cut(Option<Bytes>, bool),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Truncated;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Truncated>>> {
        match self.get_mut() {
            SimBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Sse(s) => Pin::new(s.as_mut()).poll_frame(cx),
            SimBody::Cut(b, yielded) => match b.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None if !*yielded => {
                    *yielded = true;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                None => Poll::Ready(Some(Err(Truncated))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Full(b) => b.is_none(),
            SimBody::Sse(s) => s.is_end_stream(),
            SimBody::Cut(..) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";
const JSON: &str = "application/json";

fn head(
    status: u16,
    content_type: Option<&'static str>,
    len: Option<usize>,
) -> http::response::Builder {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::DATE, http_date(std::time::SystemTime::now()))
        .header(header::SERVER, HeaderValue::from_static("uvicorn"));
    if let Some(len) = len {
        b = b.header(header::CONTENT_LENGTH, len);
    }
    if let Some(ct) = content_type {
        b = b.header(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    b = b.header(header::VARY, HeaderValue::from_static("Origin"));
    if len.is_none() {
        b = b.header(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
    }
    b
}

fn full(
    status: u16,
    content_type: Option<&'static str>,
    body: impl Into<Bytes>,
) -> Response<SimBody> {
    let body = body.into();
    head(status, content_type, Some(body.len()))
        .body(SimBody::Full(Some(body)))
        .unwrap_or_else(|_| Response::new(SimBody::Full(None)))
}

fn json(status: u16, body: impl Into<Bytes>) -> Response<SimBody> {
    full(status, Some(JSON), body)
}

fn error(e: &ApiError) -> Response<SimBody> {
    json(e.status, e.to_json())
}

/// Serves one request.
pub async fn handle(
    eng: Arc<Engine>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<SimBody>, Infallible> {
    let arrival = Instant::now();
    let personality = eng.cfg.personality;
    let mut resp = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => generate(eng, req, Api::Chat, arrival).await,
        (&Method::POST, "/v1/completions") => generate(eng, req, Api::Completions, arrival).await,
        (&Method::GET, "/v1/models") => json(200, models_json(&eng)),
        (&Method::GET, "/health") => full(200, None, Bytes::new()),
        (&Method::GET, "/version") => json(200, "{\"version\":\"0.32.0\"}"),
        (&Method::GET, "/load") => json(200, format!("{{\"server_load\":{}}}", eng.load())),
        (&Method::GET, path) if path == personality.metrics_path() && eng.cfg.metrics_off => {
            let (status, body) = personality.metrics_off();
            json(status, body)
        }
        (&Method::GET, path) if path == personality.metrics_path() => full(
            200,
            Some("text/plain; version=1.0.0; charset=utf-8"),
            personality.render_metrics(&eng.metrics),
        ),
        // trtllm-serve's /metrics: JSON iteration statistics (none kept here).
        (&Method::GET, "/metrics") => json(200, "[]"),
        // vLLM's SageMaker-style liveness probe: 200 with an empty body, GET or POST.
        (&Method::GET | &Method::POST, "/ping") => full(200, None, Bytes::new()),
        (_, path) => match allowed_methods(path) {
            Some(allow) => method_not_allowed(allow),
            None => json(404, "{\"detail\":\"Not Found\"}"),
        },
    };
    if personality != crate::Personality::Vllm {
        personality.set_server_header(resp.headers_mut());
    }
    Ok(resp)
}

/// The methods a known path answers (Starlette's `allow` header on a 405), `None` for an
/// unknown path.
fn allowed_methods(path: &str) -> Option<&'static str> {
    match path {
        "/v1/chat/completions" | "/v1/completions" => Some("POST"),
        "/v1/models" | "/health" | "/version" | "/load" | "/metrics" | "/prometheus/metrics" => {
            Some("GET")
        }
        "/ping" => Some("GET, POST"),
        _ => None,
    }
}

/// 405 as Starlette sends it: `allow` right after `server`, then the JSON body.
fn method_not_allowed(allow: &'static str) -> Response<SimBody> {
    let body = Bytes::from_static(b"{\"detail\":\"Method Not Allowed\"}");
    let mut b = Response::builder()
        .status(StatusCode::METHOD_NOT_ALLOWED)
        .header(header::DATE, http_date(std::time::SystemTime::now()))
        .header(header::SERVER, HeaderValue::from_static("uvicorn"))
        .header(header::ALLOW, HeaderValue::from_static(allow))
        .header(header::CONTENT_LENGTH, body.len())
        .header(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    b = b.header(header::VARY, HeaderValue::from_static("Origin"));
    b.body(SimBody::Full(Some(body)))
        .unwrap_or_else(|_| Response::new(SimBody::Full(None)))
}

async fn generate(
    eng: Arc<Engine>,
    req: Request<hyper::body::Incoming>,
    api: Api,
    arrival: Instant,
) -> Response<SimBody> {
    let header_faults = match req.headers().get(FAULT_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(s)) => match s.parse::<Faults>() {
            Ok(f) => Some(f),
            Err(e) => return error(&ApiError::bad_request(e.to_string(), None)),
        },
        Some(Err(_)) => {
            return error(&ApiError::bad_request(
                "x-sim-fault is not ASCII".into(),
                None,
            ))
        }
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return error(&ApiError::bad_request(
                "request body unreadable or too large".into(),
                None,
            ))
        }
    };
    let arrival_no = eng.next_arrival();
    let faults =
        header_faults.unwrap_or_else(|| faults::draw(&eng.cfg.faults, eng.cfg.seed, arrival_no));
    if faults.hang {
        // Never answer; the client's disconnect drops this future.
        std::future::pending::<()>().await;
    }
    if let Some(status) = faults.status {
        return error(&ApiError::injected(status));
    }
    let cfg = &eng.cfg;
    let mut greq = match request::parse(api, &body, &cfg.models, cfg.max_model_len, cfg.seed) {
        Ok(r) => r,
        Err(e) => return error(&e),
    };
    if eng.check_admission(greq.model_idx, greq.n as u64).is_err() {
        let inband = cfg.admission_inband_prob > 0.0
            && SplitMix::new(cfg.seed ^ arrival_no.wrapping_mul(0xad31_5510)).next_f64()
                < cfg.admission_inband_prob;
        if greq.stream && inband {
            return head(200, Some(EVENT_STREAM), None)
                .body(SimBody::Full(Some(Bytes::from(queue_overflow_stream()))))
                .unwrap_or_else(|_| Response::new(SimBody::Full(None)));
        }
        return error(&ApiError::queue_overflow());
    }
    // SGLang's `--stream-response-default-include-usage`: usage as if the client asked.
    greq.include_usage |= cfg.stream_response_default_include_usage;
    let tmpl = Templates::new(&greq, &cfg.models[greq.model_idx], eng.created)
        .engine_options(
            cfg.enable_force_include_usage,
            cfg.enable_per_request_metrics,
        )
        .with_timings(cfg.personality.reports_timings());
    let run = Run::new(eng.clone(), &greq, arrival, arrival_no);
    let agents = agent::plans(&greq, faults.reasoning, faults.tool_call);
    if greq.stream {
        let packing = Packing::new(faults.coalesce, cfg.coalesce_prob, cfg.seed, arrival_no)
            .stream_interval(cfg.stream_interval);
        let include_usage = tmpl.include_usage();
        let body = SseBody::new(run, tmpl, faults, api, include_usage, packing, agents)
            .keep_alive(Duration::from_secs_f64(cfg.sse_keep_alive_interval))
            .prompt_progress(cfg.personality.streams_progress(&body));
        return head(200, Some(EVENT_STREAM), None)
            .body(SimBody::Sse(Box::new(body)))
            .unwrap_or_else(|_| Response::new(SimBody::Full(None)));
    }
    match nonstream::run(run, tmpl, faults, greq.logprobs.is_some(), agents).await {
        NonStream::Json(b) | NonStream::Malformed(b) => json(200, b),
        NonStream::Error(e) => error(&e),
        NonStream::Truncated { full_len, prefix } => head(200, Some(JSON), Some(full_len))
            .body(SimBody::Cut(Some(prefix), false))
            .unwrap_or_else(|_| Response::new(SimBody::Full(None))),
    }
}

fn models_json(eng: &Engine) -> String {
    let created = eng.created;
    let data: Vec<String> = eng
        .cfg
        .models
        .iter()
        .map(|m| {
            let perm = super::text::hash_bytes(eng.cfg.seed, m.as_bytes());
            format!(
                "{{\"id\":\"{m}\",\"object\":\"model\",\"created\":{created},\"owned_by\":\"vllm\",\"root\":\"{m}\",\"parent\":null,\"max_model_len\":{},\"permission\":[{{\"id\":\"modelperm-{perm:016x}\",\"object\":\"model_permission\",\"created\":{created},\"allow_create_engine\":false,\"allow_sampling\":true,\"allow_logprobs\":true,\"allow_search_indices\":false,\"allow_view\":true,\"allow_fine_tuning\":false,\"organization\":\"*\",\"group\":null,\"is_blocking\":false}}]}}",
                eng.cfg.max_model_len
            )
        })
        .collect();
    format!("{{\"object\":\"list\",\"data\":[{}]}}", data.join(","))
}

/// IMF-fixdate (RFC 9110), e.g. `Sun, 29 Nov 2026 14:55:49 GMT`.
pub fn http_date(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, mi, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(m - 1) as usize];
    format!("{wd}, {d:02} {mon} {y} {h:02}:{mi:02}:{s:02} GMT")
}

/// Exposed for SimHandle: counts of requests, for tests.
pub fn served(eng: &Engine) -> u64 {
    eng.stats.finished.load(Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_date_matches_capture() {
        // date: Sun, 29 Nov 2026 14:55:49 GMT
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_964_149);
        assert_eq!(http_date(t), "Sun, 29 Nov 2026 14:55:49 GMT");
    }
}
