//! Shared helpers for the proxy integration tests: a proxy started in-process on port 0, an
//! HTTP client, and a tiny fake upstream whose behaviour each request chooses by header.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use goodput_proxy::app::App;
use goodput_proxy::config::RawConfig;
use http::{Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Generous bound for anything that should be quick, on a loaded 2-core machine.
pub const SLOW: Duration = Duration::from_secs(20);

pub type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A proxy running in-process; dropping `stop` (or sending on it) starts its drain.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Proxy {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
}

/// A config for tests: port 0 everywhere, short drain, the given upstreams.
pub fn test_config(upstreams: &[String]) -> RawConfig {
    let mut c = RawConfig::default();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
    c.server.drain_delay_ms = 0;
    c.server.grace_period_ms = 5_000;
    c.upstream.urls = upstreams.to_vec();
    c.upstream.health_interval_ms = 200;
    // The admin port's content switches on (off by default: tests/it/admin_auth.rs), so the
    // tests read traces and raw records.
    c.admin.trace = true;
    c.admin.records = true;
    c
}

pub async fn start_proxy(config: RawConfig) -> Proxy {
    let config = config.check().expect("a valid test config");
    run_app(App::bind(config).await.expect("bind proxy"))
}

/// Runs a bound proxy (e.g. one bound with a test resolver) until `stop`.
pub fn run_app(app: App) -> Proxy {
    let (addr, admin) = (app.local_addr(), app.admin_addr());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    Proxy {
        addr,
        admin,
        stop: Some(tx),
        task,
    }
}

pub fn post_json(url: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

pub fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

/// Sends and collects the whole response (status, headers, body bytes).
pub async fn send(
    client: &TestClient,
    req: Request<Full<Bytes>>,
) -> (http::response::Parts, Bytes) {
    let resp = tokio::time::timeout(SLOW, client.request(req))
        .await
        .expect("response head in time")
        .expect("response");
    let (parts, body) = resp.into_parts();
    let bytes = tokio::time::timeout(SLOW, body.collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    (parts, bytes)
}

/// Asserts the body is an OpenAI-style error with `code` equal to the status.
pub fn assert_openai_error(status: u16, body: &[u8]) {
    let v: serde_json::Value = serde_json::from_slice(body).expect("error body is JSON");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e.get("param").is_some(), "{v}");
    assert_eq!(e["code"], status, "{v}");
}

// ---------------------------------------------------------------------------------------------
// Fake upstream: just enough of an engine to exercise forwarding.
//
// Behaviour per request, chosen by headers:
//   x-fake-events: N      SSE stream of N events then `data: [DONE]`
//   x-fake-delay-ms: MS   pause before each event (and before the head with x-fake-hang)
//   x-fake-hang: 1        never answer
//   x-fake-bulk: N        N chunks of 64 KiB, as fast as they are pulled
//   x-fake-echo: 1        answer with the request line, headers and body as JSON
//   GET /unhealthy        503 (a health path that always fails)
//   GET /metrics          a one-family Prometheus page (not counted)
// Anything else: a fixed JSON body. Responses carry hop-by-hop headers the proxy must strip.

#[derive(Default)]
pub struct FakeStats {
    /// Streams whose body was dropped before its end (client went away upstream of us).
    pub aborted: AtomicUsize,
    /// Requests other than health probes, `/metrics` scrapes and `GET /v1/models`.
    pub requests: AtomicUsize,
    /// Bytes of `x-fake-bulk` bodies produced so far (pulled by the proxy).
    pub bulk_bytes: AtomicUsize,
    /// TCP connections open to the fake right now (the proxy's pool, health probes, and
    /// every request in flight: a request the proxy gives up on closes its connection).
    pub connections: AtomicUsize,
}

pub struct Fake {
    pub addr: SocketAddr,
    pub stats: Arc<FakeStats>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Fake {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start_fake() -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(FakeStats::default());
    let st = stats.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((io, _)) = listener.accept().await else {
                continue;
            };
            let st = st.clone();
            tokio::spawn(async move {
                st.connections.fetch_add(1, Ordering::SeqCst);
                let open = st.clone();
                let svc = hyper::service::service_fn(move |req| fake_handle(st.clone(), req));
                // Room for a client's 100 fields plus the ones the proxy adds.
                let _ = hyper::server::conn::http1::Builder::new()
                    .max_headers(200)
                    .serve_connection(TokioIo::new(io), svc)
                    .await;
                open.connections.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Fake { addr, stats, task }
}

fn header_u64(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

/// Marks a stream aborted unless it reached its end.
struct AbortWatch {
    stats: Arc<FakeStats>,
    finished: bool,
}

impl AbortWatch {
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for AbortWatch {
    fn drop(&mut self) {
        if !self.finished {
            self.stats.aborted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

pub const BULK_CHUNK: usize = 64 * 1024;

pub fn sse_event(i: u64) -> String {
    format!("data: {{\"id\":\"fake\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n")
}

async fn fake_handle(
    stats: Arc<FakeStats>,
    req: Request<Incoming>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    match (req.method(), req.uri().path()) {
        // Background traffic of the proxy itself (health probes, engine scrapes, model
        // learning) is not counted: tests count what clients caused.
        (_, "/health") | (&http::Method::GET, "/v1/models") => {}
        (_, "/metrics") => {
            let page =
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
                        # TYPE vllm:num_requests_waiting gauge\n\
                        vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} 0.0\n";
            return Ok(Response::new(Full::new(Bytes::from(page)).boxed()));
        }
        (_, "/unhealthy") => {
            let mut r = Response::new(Full::new(Bytes::new()).boxed());
            *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            return Ok(r);
        }
        _ => {
            stats.requests.fetch_add(1, Ordering::SeqCst);
        }
    }
    let delay = Duration::from_millis(header_u64(&req, "x-fake-delay-ms").unwrap_or(0));
    let mut resp = if req.headers().contains_key("x-fake-hang") {
        std::future::pending::<()>().await;
        unreachable!()
    } else if let Some(n) = header_u64(&req, "x-fake-events") {
        let watch = AbortWatch {
            stats: stats.clone(),
            finished: false,
        };
        let body = stream::unfold((0u64, watch), move |(i, mut watch)| async move {
            if i > n {
                watch.finish();
                return None;
            }
            tokio::time::sleep(delay).await;
            let chunk = if i == n {
                "data: [DONE]\n\n".to_string()
            } else {
                sse_event(i)
            };
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))),
                (i + 1, watch),
            ))
        });
        let mut r = Response::new(StreamBody::new(body).boxed());
        r.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        r
    } else if let Some(n) = header_u64(&req, "x-fake-bulk") {
        let watch = AbortWatch {
            stats: stats.clone(),
            finished: false,
        };
        let chunk = Bytes::from(vec![b'x'; BULK_CHUNK]);
        let body = stream::unfold((0u64, watch), move |(i, mut watch)| {
            let chunk = chunk.clone();
            async move {
                if i == n {
                    watch.finish();
                    return None;
                }
                watch
                    .stats
                    .bulk_bytes
                    .fetch_add(chunk.len(), Ordering::SeqCst);
                Some((Ok::<_, Infallible>(Frame::data(chunk)), (i + 1, watch)))
            }
        });
        Response::new(StreamBody::new(body).boxed())
    } else if req.headers().contains_key("x-fake-echo") {
        let method = req.method().to_string();
        let uri = req.uri().to_string();
        let headers: Vec<(String, String)> = req
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let v = serde_json::json!({
            "method": method, "uri": uri, "headers": headers,
            "body": String::from_utf8_lossy(&body),
        });
        Response::new(Full::new(Bytes::from(v.to_string())).boxed())
    } else {
        Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")).boxed())
    };
    let h = resp.headers_mut();
    h.insert("connection", "x-up-hop".parse().unwrap());
    h.insert("x-up-hop", "secret".parse().unwrap());
    h.insert("keep-alive", "timeout=5".parse().unwrap());
    h.insert("x-up-end-to-end", "kept".parse().unwrap());
    Ok(resp)
}

/// Reads raw bytes from a response body until `n` SSE events (`\n\n`) arrived.
pub async fn read_events(body: &mut Incoming, n: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    while buf.windows(2).filter(|w| w == b"\n\n").count() < n {
        let frame = tokio::time::timeout(SLOW, body.frame())
            .await
            .expect("event in time")
            .expect("stream still open")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
    }
    buf
}

/// Polls `cond` every 2 ms until it holds or `within` passes; returns whether it held.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub fn fake_stream_request(url: &str, events: u64, delay_ms: u64) -> Request<Full<Bytes>> {
    let mut req = post_json(url, r#"{"model":"tiny","stream":true,"messages":[]}"#);
    req.headers_mut().insert("x-fake-events", events.into());
    req.headers_mut().insert("x-fake-delay-ms", delay_ms.into());
    req
}
