//! The innermost service: picks a replica, rewrites the request for it, sends it on the client
//! connection's lane or through the pooled client (`lane`) and hands the response back with its body streaming, frame by frame.
//!
//! Retry rule: a connect failure (nothing was sent) is retried once on another replica when one
//! exists; an engine's admission rejection is retried on another replica while the client has
//! seen nothing (up to three replicas): a 503 status always (`balance.retry_rejections`), a
//! 200 stream whose first event is a 503 error only when the head is held for it
//! (`balance.hold_first_event`, off by default: it delays the client's response head);
//! anything else that fails after the request went out is never retried.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use tower::Service;

use super::deadline::{until, DeadlineBody};
use super::headers::{connection_named, end_to_end, is_hop_by_hop, Forwarded, Hop};
use super::hold::{self, Prefixed};
use super::lane::{self, Lane};
use super::shape::Shape;
use super::strategy::{Balancer, Belief, Reason};
use super::usage::{usage_for, Usage, UsageOffer};
use super::{Replica, TokenProgress, Upstreams};
use crate::body::ProxyBody;
use crate::context::{ConnInfo, RequestContext, X_GOODPUT_TRACE, X_REQUEST_ID};
use crate::error::ProxyError;

/// Which replica served a response (a response extension, read by the access log and meter).
#[derive(Debug, Clone)]
pub struct ServedBy(pub Arc<str>);

/// How the replica that answered was chosen, and when the request went to it (a response
/// extension, read by the recorder): it feeds the replica's measured goodput, the record's
/// route fields and the proxy's part of the TTFT split.
#[derive(Debug, Clone)]
pub struct Routed {
    pub replica: Arc<Replica>,
    /// When the attempt that answered was handed to the upstream client: the end of the
    /// proxy's own time (body read, balancing, any earlier attempts).
    pub sent: tokio::time::Instant,
    pub reason: Reason,
    /// The replicas tried before the one that answered, in order (none on a first try: no
    /// allocation for the common case).
    pub earlier: Vec<Arc<str>>,
    /// The request as the balancer read it, and what its prefix index believed the replica
    /// held: checked against the engine's `cached_tokens` when the response reports them.
    pub shape: Shape,
    pub belief: Belief,
    pub balancer: Arc<Balancer>,
    /// Its share of the replica's pending work, told as its output is served.
    pub progress: Arc<TokenProgress>,
}

/// What forwarding did with usage injection's offer ([`UsageOffer`]): a response extension
/// when it was used (a stream's, in the request's map the response reuses: no allocation),
/// read by the recorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// No offer, or one not sent (the replica's engine takes no injection), or sent and
    /// answered with an error.
    Unused,
    /// Sent, and answered 2xx: the stream carries a usage chunk the client did not ask for
    /// (the recorder's body strips it).
    Injected,
    /// Not sent, to learn whether the replica's engine adds usage unasked: the record of
    /// the stream tells ([`Unasked`](super::usage::Unasked)).
    Learns,
}

impl Routed {
    /// The engine reported `cached_tokens` of `prompt_tokens` prompt tokens served from its
    /// prefix cache: the balancer's index learns what the replica really held.
    pub fn learn(&self, cached_tokens: u64, prompt_tokens: u64) {
        self.balancer
            .learn(&self.shape, &self.belief, cached_tokens, prompt_tokens);
    }
}

/// Forwards a collected request to one replica.
#[derive(Clone, Debug)]
pub struct Forward {
    upstreams: Arc<Upstreams>,
    forwarded: Forwarded,
    readers: Readers,
}

/// Who reads what forwarding tells in the response's extensions. Each extension is an
/// allocation and a hashed insert per request (and their drops), paid for nothing when its
/// reader is not in the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readers {
    /// The recorder (metering on): [`Routed`] (which names the replica and tells what
    /// became of usage injection's offer: the recorder needs no [`ServedBy`]).
    pub recorder: bool,
    /// The access log: [`ServedBy`].
    pub access_log: bool,
}

impl Readers {
    /// Both readers: every extension is added.
    pub const ALL: Readers = Readers {
        recorder: true,
        access_log: true,
    };
}

impl Forward {
    pub fn new(upstreams: Arc<Upstreams>, forwarded: Forwarded, readers: Readers) -> Self {
        Self {
            upstreams,
            forwarded,
            readers,
        }
    }
}

impl Service<Request<Bytes>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = ProxyError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        Box::pin(forward(
            self.upstreams.clone(),
            self.forwarded,
            self.readers,
            req,
        ))
    }
}

/// The request taken apart before the future is made, which then holds its parts once (an
/// `async fn` keeps its arguments apart from its locals: the request was held twice, as the
/// argument and as its parts, and every byte of the future is copied into its box).
fn forward(
    up: Arc<Upstreams>,
    forwarded: Forwarded,
    readers: Readers,
    req: Request<Bytes>,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send {
    let (mut parts, body) = req.into_parts();
    // The body with usage injected, sent only to a replica whose engine takes it.
    let offer = parts.extensions.remove::<UsageOffer>();
    async move { forward_parts(&up, forwarded, readers, &mut parts, &body, offer.as_ref()).await }
}

async fn forward_parts(
    up: &Arc<Upstreams>,
    forwarded: Forwarded,
    readers: Readers,
    parts: &mut http::request::Parts,
    body: &Bytes,
    offer: Option<&UsageOffer>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let path_and_query = parts.uri.path_and_query();
    // The client connection's own upstream connection (absent when the request came from no
    // listener, e.g. a test calling the stack).
    let lane = parts.extensions.get::<Lane>();
    let first_byte = up.config.first_byte_timeout;
    let balancer = &up.balancer;
    let shape = Shape::of(body, balancer.cfg.prefix_block_bytes);

    let mut excluded: Vec<usize> = Vec::new();
    let mut earlier: Vec<Arc<str>> = Vec::new();
    let mut connect_retried = false;
    // One snapshot per request: discovery may change the set meanwhile.
    let replicas = up.replicas();
    loop {
        let now = tokio::time::Instant::now();
        let Some((choice, belief)) =
            balancer.choose_among(&replicas, now, &shape, &excluded, &mut rand::rng())
        else {
            return Err(ProxyError::UpstreamConnect {
                source: "no upstream replica configured".into(),
            });
        };
        balancer.count(choice.reason);
        let idx = choice.idx;
        let replica = &replicas[idx];
        // Where the prefix index expects the prompt's prefix cached, the request counts at
        // what that engine lacks of it.
        let cached = shape.cached_tokens(belief.blocks, balancer.cfg.prefix_block_bytes);
        let guard = replica.start_cached(shape.prompt_tokens, shape.output_tokens, cached);
        // Only the recorder tells the replica's pending work as the output is served.
        let progress = readers.recorder.then(|| guard.progress());
        let uri = replica
            .request_uri(path_and_query)
            .map_err(|e| ProxyError::Upstream { source: e.into() })?;
        let usage = usage_for(replica.engine_kind(), replica.usage_unasked());
        let injected = offer.filter(|_| usage == Usage::Inject);
        let sent_body = injected.map_or(body, |o| &o.0);
        // Built by a function of its own: built here, borrowed while it is built, the request
        // would keep its room in this future's state after it went to the send.
        let out = outgoing(up, forwarded, parts, replica, uri, sent_body);

        let sent = tokio::time::Instant::now();
        let first_byte_by = sent + first_byte;
        // One timer for the first byte: it waits for the head here, then the response body
        // goes on with it (`DeadlineBody::with_timer`).
        let mut timer = Box::pin(tokio::time::sleep_until(first_byte_by));
        // In a block of its own: the send is gone before anything else is awaited (a held
        // first event), which then needs no room beside it in this future.
        let result = {
            let send = std::pin::pin!(lane::send(up, lane, replica, out, sent));
            until(send, timer.as_mut()).await
        };
        let resp = match result {
            None => {
                return Err(ProxyError::FirstByteTimeout {
                    ms: first_byte.as_millis() as u64,
                });
            }
            Some(Ok(resp)) => resp,
            // A connect error means nothing was sent: one more attempt is safe. On another
            // replica when there is one; else on the same one after a short pause (a burst of
            // new connections can overflow the engine's listen backlog for an instant).
            Some(Err(e)) if e.connect && !connect_retried => {
                connect_retried = true;
                let another = replicas.len() > excluded.len() + 1;
                tracing::warn!(upstream = %replica.url, error = %e, another, "upstream connect failed; retrying once");
                drop(guard);
                if another {
                    excluded.push(idx);
                } else {
                    tokio::time::sleep(CONNECT_RETRY_PAUSE).await;
                }
                earlier.push(replica.url.clone());
                continue;
            }
            Some(Err(e)) if e.connect => {
                tracing::warn!(upstream = %replica.url, error = %e, "upstream connect failed");
                return Err(ProxyError::UpstreamConnect { source: e.source });
            }
            Some(Err(e)) => return Err(ProxyError::Upstream { source: e.source }),
        };

        let (mut rparts, rbody) = resp.into_parts();
        rparts.headers = end_to_end(std::mem::take(&mut rparts.headers));
        let body = DeadlineBody::with_timer(
            rbody,
            first_byte_by,
            up.config.stream_idle_timeout,
            up.config.total_timeout,
            guard,
            timer,
        );
        // An admission rejection is retried elsewhere while the client has seen nothing, and
        // only when another replica is left to try.
        let retry = balancer.cfg.retry_rejections
            && earlier.len() + 1 < MAX_ATTEMPTS
            && replicas.len() > excluded.len() + 1;
        let body = if !retry {
            body.boxed_unsync()
        } else if rparts.status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::debug!(upstream = %replica.url, "admission rejection (503); trying another replica");
            excluded.push(idx);
            earlier.push(replica.url.clone());
            continue;
        } else if balancer.cfg.hold_first_event
            && rparts.status == StatusCode::OK
            && is_event_stream(&rparts.headers)
        {
            let mut body = body;
            let held = hold::first_event(&mut body).await.map_err(held_error)?;
            if held.is_rejection() {
                tracing::debug!(upstream = %replica.url, "admission rejection in the stream; trying another replica");
                excluded.push(idx);
                earlier.push(replica.url.clone());
                continue;
            }
            Prefixed::new(held, body).boxed_unsync()
        } else {
            body.boxed_unsync()
        };
        if readers.access_log || progress.is_some() {
            // The request's map (its entries are done with: the request has gone) holds the
            // response's: kept, where a map of its own is two allocations for the response
            // and the request's two freed.
            let mut map = std::mem::take(&mut parts.extensions);
            map.clear();
            map.extend(std::mem::take(&mut rparts.extensions));
            rparts.extensions = map;
        }
        // What became of usage injection's offer, for the recorder (the only reader: without
        // it the stack has no usage layer, and no offer is made). An error body (4xx/5xx
        // JSON) carries no usage chunk to strip.
        let offered = if injected.is_some() {
            if rparts.status.is_success() {
                Offered::Injected
            } else {
                Offered::Unused
            }
        } else if offer.is_some() && usage == Usage::Learn {
            Offered::Learns
        } else {
            Offered::Unused
        };
        if readers.access_log {
            rparts.extensions.insert(ServedBy(replica.url.clone()));
        }
        if offered != Offered::Unused {
            rparts.extensions.insert(offered);
        }
        if let Some(progress) = progress {
            rparts.extensions.insert(Routed {
                replica: replica.clone(),
                sent,
                reason: choice.reason,
                earlier,
                shape,
                belief,
                balancer: up.balancer.clone(),
                progress,
            });
        }
        return Ok(Response::from_parts(rparts, body));
    }
}

/// The request for `replica` at `uri`, with `body`. Built again for the rare second attempt
/// rather than cloned for every first one.
fn outgoing(
    up: &Upstreams,
    forwarded: Forwarded,
    parts: &http::request::Parts,
    replica: &Replica,
    uri: http::Uri,
    body: &Bytes,
) -> Request<Full<Bytes>> {
    let mut out = Request::new(Full::new(body.clone()));
    *out.method_mut() = parts.method.clone();
    *out.uri_mut() = uri;
    *out.version_mut() = Version::HTTP_11;
    let headers = out.headers_mut();
    *headers = upstream_headers(parts, forwarded, body.len());
    if let Some(key) = &up.config.authorization {
        // `upstream.api_key` replaces whatever credential the client sent.
        headers.insert(header::AUTHORIZATION, key.clone());
    }
    if let Some(host) = &replica.host {
        // Last, where the pooled client would append the one it formats per request.
        headers.insert(header::HOST, host.clone());
    }
    out
}

/// Replicas one request may try when engines reject it at admission.
const MAX_ATTEMPTS: usize = 3;

fn is_event_stream(h: &http::HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"))
}

/// A body that failed while its head was held: the client has not seen the head yet, so the
/// failure is answered as the proxy's own error.
fn held_error(e: crate::body::BoxError) -> ProxyError {
    match e.downcast_ref::<super::deadline::DeadlineError>() {
        Some(super::deadline::DeadlineError::FirstByte) => ProxyError::FirstByteTimeout { ms: 0 },
        _ => ProxyError::Upstream { source: e },
    }
}

/// Pause before retrying a failed connect on the only replica.
const CONNECT_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(25);

/// The headers sent upstream: the client's, minus hop-by-hop and `Host` (the client sets the
/// replica's: the request goes to a configured replica whatever the client's Host or
/// absolute-form URI named), minus `Expect`, plus `X-Forwarded-*` and the request id.
/// `Content-Length` is kept only when it is already what hyper would write for the `body_len`
/// bytes sent (its one value, in canonical decimal): hyper then uses it instead of formatting
/// its own; any other (a body usage injection rewrote, a chunked upload, a second value) is
/// dropped and hyper sets the body's. (With `[auth]` on the client's key is already gone: the
/// auth layer removes it; `upstream.api_key` is set by the caller.)
fn upstream_headers(
    parts: &http::request::Parts,
    forwarded: Forwarded,
    body_len: usize,
) -> http::HeaderMap {
    let client = &parts.headers;
    // The names `Connection` lists: looked up by hash only when the client sent one.
    let named = if client.keys().any(|n| n == header::CONNECTION) {
        connection_named(client)
    } else {
        Vec::new()
    };
    // One pass: each header the client sent is copied unless it is dropped (a copy of a name
    // or value is a reference count), instead of cloning the map and removing by hash.
    // Room for the forwarding headers, the request id and `Host`.
    let mut h = http::HeaderMap::with_capacity(client.len() + 5);
    let mut host: Option<&HeaderValue> = None;
    let mut length_kept = false;
    for (name, value) in client {
        if name == header::HOST {
            // The first `Host` is the one `get` would give.
            host = host.or(Some(value));
            continue;
        }
        if name == header::CONTENT_LENGTH {
            if !length_kept && is_length_of(value, body_len) {
                length_kept = true;
                h.append(name.clone(), value.clone());
            }
            continue;
        }
        let dropped = is_hop_by_hop(name)
            // The proxy's own request header (a trace of this stream): never sent upstream.
            || name == X_GOODPUT_TRACE
            // The body is already read: a 100-continue handshake has nothing left to gate.
            || name == header::EXPECT
            // This hop writes them (see `Forwarded::replaces`).
            || forwarded.replaces(name)
            || named.contains(name);
        if !dropped {
            h.append(name.clone(), value.clone());
        }
    }
    // The client's Host as it came (a value copy is a reference count), when it is text.
    let host = match host {
        Some(v) if v.to_str().is_ok() => Some(v.clone()),
        _ => parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
    };
    // The context layer moved the connection into the context (a request without one, from
    // a test calling forwarding alone, may carry it as its own extension).
    let ctx = RequestContext::of(&parts.extensions);
    let conn = match ctx {
        Some(c) => c.peer.as_ref(),
        None => parts.extensions.get::<ConnInfo>(),
    };
    let proto = if conn.is_some_and(|c| c.tls) {
        "https"
    } else {
        "http"
    };
    let hop = Hop {
        peer: conn.map(|c| &c.peer_ip),
        proto,
        host,
    };
    forwarded.apply_copied(&mut h, hop);
    if let Some(v) = ctx.and_then(|c| c.id_header.clone()) {
        h.insert(X_REQUEST_ID, v);
    }
    h
}

/// Whether `value` is exactly how hyper writes a `Content-Length` of `len` (decimal, no sign,
/// no leading zero, no space) for a body that is not empty (hyper writes none for an empty
/// body of a request without one).
fn is_length_of(value: &HeaderValue, len: usize) -> bool {
    let digits = value.as_bytes();
    if len == 0 || digits.first().is_none_or(|&d| d == b'0') {
        return false;
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return false;
        }
        n = match n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d - b'0')))
        {
            Some(n) => n,
            None => return false,
        };
    }
    n == len as u64
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http::Uri;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tower::util::BoxCloneSyncService;
    use tower::ServiceExt;

    use super::*;
    use crate::config::UpstreamConfig;
    use crate::upstream::{http_connector, UpstreamConnector};

    /// A replica that answers every request 200.
    async fn replica() -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let ok = service_fn(|_| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("ok"))))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), ok),
                );
            }
        });
        addr
    }

    /// The real connector, except that the first `refuse` attempts fail as a full listen
    /// backlog makes them fail; records the authority of every attempt.
    fn refusing(
        config: &UpstreamConfig,
        refuse: usize,
        attempts: &Arc<Mutex<Vec<String>>>,
    ) -> UpstreamConnector {
        let inner = http_connector(config);
        let attempts = attempts.clone();
        BoxCloneSyncService::new(tower::service_fn(move |uri: Uri| {
            let (inner, attempts) = (inner.clone(), attempts.clone());
            async move {
                let n = {
                    let mut a = attempts.lock().unwrap();
                    a.push(uri.authority().map_or(String::new(), |a| a.to_string()));
                    a.len()
                };
                if n <= refuse {
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
                }
                inner
                    .oneshot(uri)
                    .await
                    .map(crate::upstream::tls::plain)
                    .map_err(Into::into)
            }
        }))
    }

    async fn forward_with(refuse: usize) -> (Result<u16, ProxyError>, Vec<String>, String) {
        let addr = replica().await;
        let config = UpstreamConfig {
            urls: vec![crate::config::BaseUrl::parse(&format!("http://{addr}")).unwrap()],
            ..UpstreamConfig::default()
        };
        let attempts = Arc::default();
        let connector = refusing(&config, refuse, &attempts);
        let up = Arc::new(
            Upstreams::with_connector(&config, connector, &prometheus::Registry::new()).unwrap(),
        );
        let req = Request::post("/v1/completions")
            .body(Bytes::from("{}"))
            .unwrap();
        let status = forward(up, Forwarded::default(), Readers::ALL, req)
            .await
            .map(|r| r.status().as_u16());
        let seen = attempts.lock().unwrap().clone();
        (status, seen, addr.to_string())
    }

    #[test]
    fn a_content_length_is_kept_only_as_hyper_would_write_it() {
        let cases: &[(&str, usize, bool)] = &[
            ("42", 42, true),
            ("1", 1, true),
            ("18446744073709551615", usize::MAX, usize::BITS == 64),
            ("41", 42, false),
            ("042", 42, false),
            ("0", 0, false),
            ("", 0, false),
            (" 42", 42, false),
            ("+42", 42, false),
            ("4 2", 42, false),
            ("18446744073709551616", 0, false),
            ("99999999999999999999999", 42, false),
        ];
        for &(value, len, kept) in cases {
            let v = HeaderValue::from_str(value).unwrap();
            assert_eq!(is_length_of(&v, len), kept, "{value:?} for {len}");
        }
    }

    /// The client's headers, as forwarding sends them to a replica for a body of `len`.
    fn sent(client: &[(&str, &str)], len: usize) -> Vec<(String, String)> {
        let mut req = Request::post("/v1/chat/completions");
        for (k, v) in client {
            req = req.header(*k, *v);
        }
        let (parts, ()) = req.body(()).unwrap().into_parts();
        upstream_headers(&parts, Forwarded::default(), len)
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn upstream_headers_drop_what_is_not_end_to_end_and_add_this_hop() {
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let client = [
            ("host", "proxy.example"),
            ("content-type", "application/json"),
            ("content-length", "2"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("expect", "100-continue"),
            ("x-goodput-trace", "1"),
            ("x-forwarded-for", "6.6.6.6"),
            ("accept", "*/*"),
            ("x-forwarded-proto", "https"),
        ];
        let want = |length: Option<&str>| {
            let mut w = vec![("content-type", "application/json")];
            w.extend(length.map(|l| ("content-length", l)));
            w.extend([
                ("accept", "*/*"),
                ("x-forwarded-proto", "http"),
                ("x-forwarded-host", "proxy.example"),
            ]);
            pairs(&w)
        };
        // The body as the client sent it: its length kept where it was.
        assert_eq!(sent(&client, 2), want(Some("2")));
        // A body of another length (usage injected): hyper writes the length.
        assert_eq!(sent(&client, 3), want(None));
        // A second length is never sent on.
        let mut twice = client.to_vec();
        twice.push(("content-length", "2"));
        assert_eq!(sent(&twice, 2), want(Some("2")));
        // No Host header: the authority of an absolute-form target, else none.
        assert_eq!(
            sent(&[("accept", "*/*")], 0),
            pairs(&[("accept", "*/*"), ("x-forwarded-proto", "http")])
        );
    }

    #[tokio::test]
    async fn a_refused_connect_is_retried_once_on_the_only_replica() {
        let (status, attempts, addr) = forward_with(1).await;
        assert_eq!(status.unwrap(), 200);
        assert_eq!(attempts, [addr.clone(), addr]);
    }

    #[tokio::test]
    async fn a_second_refused_connect_is_a_connect_error_with_no_third_attempt() {
        let (status, attempts, addr) = forward_with(2).await;
        assert!(
            matches!(status, Err(ProxyError::UpstreamConnect { .. })),
            "{status:?}"
        );
        assert_eq!(attempts, [addr.clone(), addr]);
    }
}
