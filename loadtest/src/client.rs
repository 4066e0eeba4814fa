//! The HTTP client: sends one request and measures it with the proxy's own `StreamMeter`, so the
//! client and the proxy measure by one definition. Frames are timestamped as they arrive.

use std::time::Duration;

use bytes::Bytes;
use goodput_measure::agent::ToolSet;
use goodput_measure::sse::SseParser;
use goodput_measure::{Ending, Measurement, Outcome, StreamMeter};
use goodput_net::error_chain;
use http::{header, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A pooled HTTP/1 client (one connection per request in flight, reused).
pub fn http_client(max_idle: usize) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(max_idle)
        .build(conn)
}

/// What one request produced.
#[derive(Debug)]
pub struct Sent {
    /// The monotonic instant the request was handed to the client (`t0`).
    pub t0: Instant,
    pub measurement: Measurement,
    /// Every inter-token gap, in seconds.
    pub itl: Vec<f64>,
    /// Transport error text, if any.
    pub error: Option<String>,
    /// The client hung up (dropped the response) after `Outgoing::hangup_after` SSE events.
    pub hung_up: bool,
}

/// Everything needed to send one request.
pub struct Outgoing<'a> {
    pub uri: &'a Uri,
    pub body: Vec<u8>,
    pub stream: bool,
    pub request_id: &'a str,
    pub extra_header: Option<(&'a str, &'a str)>,
    pub timeout: Duration,
    /// Drop the response once this many SSE events have arrived (a client that hangs up).
    pub hangup_after: Option<u64>,
}

/// Send one request and read its body to the end (or the deadline), metering every frame.
pub async fn send(client: &HttpClient, out: Outgoing<'_>) -> Sent {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(out.uri.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-request-id", out.request_id);
    if out.stream {
        b = b.header(header::ACCEPT, "text/event-stream");
    }
    if let Some((k, v)) = out.extra_header {
        b = b.header(k, v);
    }
    // Tool calls are judged against the request's own `tools`, as the proxy judges them.
    let tools = ToolSet::from_request(&out.body);
    let t0 = Instant::now();
    let req = match b.body(Full::new(Bytes::from(out.body))) {
        Ok(r) => r,
        Err(e) => {
            return Sent {
                t0,
                measurement: Measurement::without_body(Outcome::Rejected, None, Duration::ZERO),
                itl: Vec::new(),
                error: Some(format!("building request: {e}")),
                hung_up: false,
            }
        }
    };
    let mut meter = StreamMeter::new(t0, out.stream).with_tools(tools);
    let mut itl = Vec::new();
    let mut error = None;
    let mut got_head = false;
    let mut hung_up = false;
    // Counts whole SSE events (the meter's parser is private to it); only for hanging up.
    let mut events = SseParser::new();
    let mut seen: u64 = 0;
    let hangup_after = out.hangup_after;
    let exchange = async {
        let resp = match client.request(req).await {
            Ok(r) => r,
            Err(e) => {
                error = Some(error_chain(&e));
                return None;
            }
        };
        meter.on_head(Instant::now(), resp.status().as_u16());
        got_head = true;
        let mut body = resp.into_body();
        loop {
            match body.frame().await {
                None => return Some(Ending::Complete),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        meter.on_frame(Instant::now(), data, |gap| itl.push(gap.as_secs_f64()));
                        if let Some(k) = hangup_after {
                            events.feed(data, |_| seen += 1);
                            if seen >= k {
                                // Returning drops `body`: the connection closes mid-stream,
                                // as when a real client goes away.
                                hung_up = true;
                                return Some(Ending::ClientGone);
                            }
                        }
                    }
                }
                Some(Err(e)) => {
                    error = Some(error_chain(&e));
                    return Some(Ending::BodyError);
                }
            }
        }
    };
    let ending = tokio::time::timeout_at(t0 + out.timeout, exchange).await;
    let t_end = Instant::now();
    let measurement = match ending {
        Ok(Some(ending)) => meter.finish(t_end, ending),
        // No response head at all: connect or protocol failure.
        Ok(None) => Measurement::without_body(Outcome::UpstreamError, None, t_end - t0),
        Err(_) if got_head => meter.finish(t_end, Ending::Timeout),
        Err(_) => {
            error.get_or_insert_with(|| "no response head before the deadline".into());
            meter.finish(t_end, Ending::Timeout)
        }
    };
    Sent {
        t0,
        measurement,
        itl,
        error,
        hung_up,
    }
}

/// GET a URL and return its body as text (admin `/metrics`, `/stats`, engine `/metrics`).
pub async fn get_text(client: &HttpClient, url: &str, timeout: Duration) -> Result<String, String> {
    let uri: Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let req = Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    // Admin and engine pages: a few MiB at the most, bounded all the same.
    let page = goodput_net::fetch(client, req, timeout, 64 << 20)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !page.status.is_success() {
        return Err(format!("{url}: HTTP {}", page.status));
    }
    page.text().map_err(|e| format!("{url}: {e}"))
}
