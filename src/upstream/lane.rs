//! The fast lane: each client connection keeps one HTTP/1.1 connection to the replica it last
//! used, driven by the client connection's own task.
//!
//! The pooled client runs every upstream connection in a task of its own: a request goes to
//! it through the pool (a checkout and a return under a lock, keyed by a hash of the
//! replica's authority) and a channel, and each response frame the connection reads wakes the
//! client connection's task from that other task. A lane's connection is polled where its
//! request and its response body are polled (the request future while it waits for the head,
//! the body before each frame), so every wakeup of its socket is the client connection's own
//! and nothing is spawned.
//!
//! A lane is taken for one request at a time; the connection goes back to it only when the
//! response ended cleanly (its body read to the end); otherwise it is dropped, which closes it
//! (an engine aborts a request whose connection closes, as when the client goes away with the
//! pooled client). Before a reuse the connection is polled once to see whether the engine
//! closed it while it was idle, and a lane idle longer than `pool_idle_timeout` is let go, as
//! the pool lets its idle connections go before the engine's keep-alive closes them under a
//! request. A request the reused connection did not send is given back by hyper and goes
//! through the pool.
//!
//! The pooled client serves everything else: a second request while the lane is busy (HTTP/2
//! clients), a request to another replica than the lane's, health probes and scrapes. The
//! bytes a replica reads are the pooled client's: the request in origin form, `Host` preset
//! per replica (`Replica::host`), the same HTTP/1 settings.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tower::ServiceExt;

use super::prefix::ReplicaId;
use super::tls::UpstreamStream;
use super::{Replica, SharedConnector, Upstreams};
use crate::body::BoxError;

type Sender = http1::SendRequest<Full<Bytes>>;
type Conn = http1::Connection<TokioIo<UpstreamStream>, Full<Bytes>>;

/// One client connection's lane (a request extension the listener adds; cloning it is a
/// reference count).
#[derive(Clone, Default)]
pub struct Lane(Arc<Mutex<Slot>>);

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lane")
    }
}

#[derive(Default)]
struct Slot {
    /// A request uses the lane (its [`Lease`] is alive).
    busy: bool,
    /// A connection that finished its last response cleanly (none: the next request opens
    /// one).
    idle: Option<Idle>,
}

struct Idle {
    replica: ReplicaId,
    since: Instant,
    conn: Box<Driven>,
}

/// How a lane opens its connections: the pooled client's connector and HTTP/1 settings.
#[derive(Clone, Debug)]
pub struct Opener {
    connector: SharedConnector,
    builder: http1::Builder,
}

impl Opener {
    pub(super) fn new(connector: SharedConnector, read_buffer: Option<usize>) -> Self {
        let mut builder = http1::Builder::new();
        if let Some(bytes) = read_buffer {
            // As the pooled client's (`http1_read_buf_exact_size`).
            builder.read_buf_exact_size(Some(bytes));
        }
        Opener { connector, builder }
    }
}

/// An upstream connection and its sender; the connection future is polled by whoever holds it.
/// Boxed once per connection: a request moves only the pointer (the connection's state is
/// several hundred bytes).
struct Driven {
    send: Sender,
    conn: Conn,
    /// The connection future has finished (closed, or failed): nothing more can go through.
    finished: bool,
    /// What the connection wakes (made once per connection from `relay`).
    waker: Waker,
    relay: Arc<Relay>,
}

impl Driven {
    fn new(send: Sender, conn: Conn) -> Box<Driven> {
        let relay = Arc::new(Relay::default());
        Box::new(Driven {
            send,
            conn,
            finished: false,
            waker: Waker::from(relay.clone()),
            relay,
        })
    }

    /// Lets the connection do what it can: write the request, read the response into the
    /// body's channel, notice a close. Its wakeups (socket readiness) go to `cx`'s task.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if self.finished {
            return;
        }
        self.relay.follow(cx.waker());
        if Pin::new(&mut self.conn)
            .poll(&mut Context::from_waker(&self.waker))
            .is_ready()
        {
            self.finished = true;
        }
    }

    /// Polls what the connection produces (the response head, body frames). Only `drive`
    /// produces them, and every caller drives before it reports `Pending`, so the consumer
    /// needs no waker of its own; and a wake the connection asks for while its output is taken
    /// (room in the body's channel) is not passed on: the next `drive` comes anyway. Either
    /// would wake this very task, and a task woken while it runs is polled once more.
    fn consume<T>(&self, poll: impl FnOnce(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
        let _quiet = Quiet::enter(&self.relay);
        poll(&mut Context::from_waker(Waker::noop()))
    }

    /// Whether an idle connection can take a request: polled once (its wakeups go nowhere:
    /// the request that takes it drives it again) so that a close the engine sent while it
    /// was idle is read now, then asked whether it waits for a request.
    fn usable(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()));
        !self.finished && self.send.is_ready()
    }
}

/// The waker a lane's connection registers (its socket, its channels): the task that drove
/// it last, except for wakes this thread causes while it takes the connection's output.
#[derive(Default)]
struct Relay {
    task: Mutex<Option<Waker>>,
}

impl Relay {
    fn follow(&self, waker: &Waker) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        match &*task {
            Some(w) if w.will_wake(waker) => {}
            _ => *task = Some(waker.clone()),
        }
    }
}

impl std::task::Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if QUIET.with(|q| q.get()) == Arc::as_ptr(self) as usize {
            return;
        }
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = &*task {
            w.wake_by_ref();
        }
    }
}

thread_local! {
    /// The relay whose connection's output this thread is taking (its address; 0: none).
    /// Wakes from other threads (the I/O driver's) always pass.
    static QUIET: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

struct Quiet;

impl Quiet {
    fn enter(relay: &Arc<Relay>) -> Quiet {
        QUIET.with(|q| q.set(Arc::as_ptr(relay) as usize));
        Quiet
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.with(|q| q.set(0));
    }
}

/// A lane taken by one request. Its slot is busy until this drops: then the connection goes
/// back idle when the response ended cleanly, else it is closed.
pub struct Lease {
    lane: Lane,
    replica: ReplicaId,
    conn: Option<Box<Driven>>,
    reused: bool,
    clean: bool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let idle = self.conn.take().filter(|_| self.clean);
        let mut slot = self.lane.0.lock().unwrap_or_else(PoisonError::into_inner);
        slot.busy = false;
        slot.idle = idle.map(|conn| Idle {
            replica: self.replica,
            since: Instant::now(),
            conn,
        });
    }
}

impl Lane {
    /// The lane for a request to `replica` at `now`, or `None` when the pooled client takes it
    /// (the lane is busy, or idle with a connection to another replica that is still fresh).
    fn take(
        &self,
        replica: &Replica,
        now: Instant,
        idle_timeout: std::time::Duration,
    ) -> Option<Lease> {
        let id = replica.route.id;
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.busy {
            return None;
        }
        let conn = match slot.idle.take() {
            None => None,
            Some(mut idle) => {
                let fresh = now.saturating_duration_since(idle.since) < idle_timeout;
                if idle.replica != id && fresh {
                    slot.idle = Some(idle);
                    return None;
                }
                // A stale or closed connection is dropped here: closed.
                (idle.replica == id && fresh && idle.conn.usable()).then_some(idle.conn)
            }
        };
        slot.busy = true;
        drop(slot);
        Some(Lease {
            lane: self.clone(),
            replica: id,
            reused: conn.is_some(),
            conn,
            clean: false,
        })
    }
}

/// Why a request got no response head.
#[derive(Debug)]
pub struct SendError {
    /// Nothing was sent: the connection could not be made.
    pub connect: bool,
    pub source: BoxError,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

/// Sends `req` (absolute URI, `Host` set) to `replica`: on the client connection's lane when
/// it has one for this replica, else through the pooled client. The response body is the
/// lane's when the lane carried it.
///
/// What can be done at once is done here, before anything waits: the lane's idle connection
/// takes the request now (hyper queues it on the connection), the pooled client likewise. The
/// future then holds only what waits for the head; the request itself is held once, by hyper.
/// (As an `async fn`, the request was kept as its argument, as a local and again in each
/// callee's state: the future was about 1.5 KiB, moved into its caller's pinned place and
/// boxed with the caller's state.)
pub(super) fn send<'a>(
    up: &'a Upstreams,
    lane: Option<&Lane>,
    replica: &Replica,
    req: Request<Full<Bytes>>,
    now: Instant,
) -> Sending<'a, impl Future<Output = Answer>> {
    let lease = lane
        .filter(|_| replica.host.is_some() && req.method() != Method::CONNECT)
        .and_then(|l| l.take(replica, now, up.config.pool_idle_timeout));
    let state = match lease {
        Some(mut lease) => match lease.conn.as_mut() {
            Some(driven) => {
                let absolute = req.uri().clone();
                State::Lane {
                    response: driven.write(req, &absolute),
                    lease: Some(lease),
                    absolute,
                }
            }
            // A lane without a connection opens one first: once per client connection and
            // replica, so that path is boxed rather than carried in every request's state.
            None => State::Opening {
                fut: Box::pin(open_and_send(&up.opener, lease, req)),
            },
        },
        None => State::Pooled {
            fut: up.client.request(req),
        },
    };
    Sending { up, state }
}

/// What the lane's connection answers a request: `Err` gives the request back when the
/// connection took none of it.
type Answer = Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Full<Bytes>>>>;

type Opened<'a> = Pin<Box<dyn Future<Output = Result<Response<LaneBody>, SendError>> + Send + 'a>>;

pin_project_lite::pin_project! {
    /// A request sent to a replica, until its response head (see [`send`]). `F`: what the
    /// lane's connection answers.
    pub(super) struct Sending<'a, F> {
        up: &'a Upstreams,
        #[pin]
        state: State<'a, F>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<'a, F> {
        /// Written to the lane's idle connection, which is driven here until the head comes.
        Lane {
            // Unconstrained: polled without a waker of its own (`Driven::consume`), it must
            // never be the one future tokio's budget turns away (that would wait for a wake
            // nobody sends).
            #[pin]
            response: tokio::task::Unconstrained<F>,
            // Holds the connection; taken when the head is handed over with the body.
            lease: Option<Lease>,
            // The request's target, for the pooled client when the connection gives it back.
            absolute: Uri,
        },
        /// A connection being opened for the lane, then the request on it.
        Opening { fut: Opened<'a> },
        /// Through the pooled client.
        Pooled { fut: hyper_util::client::legacy::ResponseFuture },
        /// The head was handed over.
        Done,
    }
}

impl<F: Future<Output = Answer>> Future for Sending<'_, F> {
    type Output = Result<Response<LaneBody>, SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let back = match this.state.as_mut().project() {
                StateProj::Lane {
                    response,
                    lease,
                    absolute,
                } => {
                    // Always there: the lease came with its connection, and goes only with the
                    // state.
                    let Some(driven) = lease.as_mut().and_then(|l| l.conn.as_mut()) else {
                        return Poll::Ready(Err(done_error()));
                    };
                    driven.drive(cx);
                    let answer = std::task::ready!(driven.consume(|cx| response.poll(cx)));
                    match answer {
                        Ok(resp) => {
                            let lease = lease.take();
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(resp.map(|inner| LaneBody::new(inner, lease))));
                        }
                        Err(mut e) => match e.take_message() {
                            // The reused connection closed before it took the request: hyper
                            // gave it back, and the pooled client sends it.
                            Some(mut req) if lease.as_ref().is_some_and(|l| l.reused) => {
                                *req.uri_mut() = std::mem::take(absolute);
                                req
                            }
                            _ => {
                                this.state.set(State::Done);
                                return Poll::Ready(Err(SendError {
                                    connect: false,
                                    source: e.into_error().into(),
                                }));
                            }
                        },
                    }
                }
                StateProj::Opening { fut } => {
                    let out = std::task::ready!(fut.as_mut().poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(out);
                }
                StateProj::Pooled { fut } => {
                    let out = std::task::ready!(Pin::new(fut).poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(match out {
                        Ok(resp) => Ok(resp.map(|inner| LaneBody::new(inner, None))),
                        Err(e) => Err(SendError {
                            connect: e.is_connect(),
                            source: e.into(),
                        }),
                    });
                }
                StateProj::Done => return Poll::Ready(Err(done_error())),
            };
            // The lane is let go (its connection closed) before the pooled client goes on.
            this.state.set(State::Pooled {
                fut: this.up.client.request(back),
            });
        }
    }
}

fn done_error() -> SendError {
    SendError {
        connect: false,
        source: "upstream request polled after its answer".into(),
    }
}

impl Driven {
    /// Hands `req` to the connection (queued at once, written as the connection is driven),
    /// in origin form; `absolute`: its target.
    fn write(
        &mut self,
        mut req: Request<Full<Bytes>>,
        absolute: &Uri,
    ) -> tokio::task::Unconstrained<impl Future<Output = Answer>> {
        *req.uri_mut() = origin_form(absolute);
        tokio::task::unconstrained(self.send.try_send_request(req))
    }
}

/// A new connection for `lease`'s lane, and the request on it. A new connection never gives
/// the request back.
async fn open_and_send(
    opener: &Opener,
    mut lease: Lease,
    req: Request<Full<Bytes>>,
) -> Result<Response<LaneBody>, SendError> {
    let absolute = req.uri().clone();
    let mut driven = open(opener, absolute.clone()).await?;
    let response = driven.write(req, &absolute);
    let mut response = std::pin::pin!(response);
    let result = poll_fn(|cx| {
        driven.drive(cx);
        driven.consume(|cx| response.as_mut().poll(cx))
    })
    .await;
    match result {
        Ok(resp) => {
            lease.conn = Some(driven);
            Ok(resp.map(|inner| LaneBody::new(inner, Some(lease))))
        }
        Err(e) => Err(SendError {
            connect: false,
            source: e.into_error().into(),
        }),
    }
}

/// A new connection to `uri`'s replica, through the pooled client's connector.
async fn open(opener: &Opener, uri: Uri) -> Result<Box<Driven>, SendError> {
    let connect_error = |source| SendError {
        connect: true,
        source,
    };
    let io = opener
        .connector
        .clone()
        .oneshot(uri)
        .await
        .map_err(connect_error)?;
    let (send, conn) = opener
        .builder
        .handshake(io)
        .await
        .map_err(|e| connect_error(e.into()))?;
    Ok(Driven::new(send, conn))
}

/// The request target as the pooled client writes it to a replica it reaches directly: the
/// path and query alone (`/` without one).
fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(pq) if pq.as_str() != "/" => {
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = Some(pq.clone());
            Uri::from_parts(parts).unwrap_or_default()
        }
        _ => Uri::default(),
    }
}

/// The response body from a replica. On a lane it drives the lane's connection before each
/// frame it waits for, and hands the lane back once the body has ended.
pub struct LaneBody {
    inner: Incoming,
    lease: Option<Lease>,
    /// An upstream error held back for one poll (see `poll_frame`).
    held: Option<hyper::Error>,
    /// Something (the head, a frame) was handed over since this body last answered
    /// `Pending`.
    handed: bool,
}

impl LaneBody {
    fn new(inner: Incoming, lease: Option<Lease>) -> Self {
        LaneBody {
            inner,
            lease,
            held: None,
            // The head counts: it is handed over just before the body's first poll.
            handed: true,
        }
    }
}

impl Body for LaneBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(e) = this.held.take() {
            return Poll::Ready(Some(Err(e)));
        }
        let frame = this.poll_upstream(cx);
        match frame {
            // The upstream broke right after what it sent last (a cut the same read brought):
            // the error waits one poll, so the client connection writes out the head and the
            // bytes before it first (its error would close the connection with them still in
            // its buffer, and the client would see no response at all, not a truncated one).
            Poll::Ready(Some(Err(e))) if this.handed => {
                this.handed = false;
                this.held = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => {
                this.handed = false;
                Poll::Pending
            }
            frame => {
                this.handed = true;
                frame
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl LaneBody {
    /// The next frame from the replica; on a lane, the connection is driven for it.
    fn poll_upstream(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self;
        let inner = &mut this.inner;
        let Some(lease) = &mut this.lease else {
            return Pin::new(inner).poll_frame(cx);
        };
        let frame = match &mut lease.conn {
            Some(conn) => {
                // A frame the last drive left in the channel first, else drive and look again.
                let mut frame = conn.consume(|cx| Pin::new(&mut *inner).poll_frame(cx));
                if frame.is_pending() {
                    conn.drive(cx);
                    frame = conn.consume(|cx| Pin::new(&mut *inner).poll_frame(cx));
                }
                frame
            }
            None => Pin::new(&mut *inner).poll_frame(cx),
        };
        let ended = match &frame {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Ready(Some(Err(_))) | Poll::Pending => false,
        };
        if ended {
            lease.clean = true;
            // Back to the lane now: the client connection's next request may come before this
            // body is dropped.
            this.lease = None;
        }
        frame
    }
}

impl Drop for LaneBody {
    fn drop(&mut self) {
        // A body that was empty from its head on (204, HEAD, `content-length: 0`) is never
        // polled to its end: it ended all the same, and its connection is reusable.
        if let Some(lease) = &mut self.lease {
            lease.clean = self.inner.is_end_stream();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http_body_util::BodyExt;
    use prometheus::Registry;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::config::{BaseUrl, UpstreamConfig};

    /// How the test replica treats a connection after each answer.
    #[derive(Clone, Copy)]
    enum Mode {
        /// `ok` (content length), and wait for the next request.
        KeepAlive,
        /// `ok`, then close the idle connection after the pause (no `Connection: close`: as
        /// an engine's keep-alive timeout does).
        CloseIdleAfter(Duration),
        /// A chunked answer's first chunk, then wait for the client to go away.
        Stream,
    }

    /// A replica speaking raw HTTP/1.1, so the test sees its connections: how many it
    /// accepted, every request head, how many the proxy closed.
    struct Replica1 {
        url: String,
        accepts: Arc<AtomicUsize>,
        closed_by_proxy: Arc<AtomicUsize>,
        heads: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    async fn replica(mode: Mode) -> Replica1 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Replica1 {
            url: format!("http://{}", l.local_addr().unwrap()),
            accepts: Arc::default(),
            closed_by_proxy: Arc::default(),
            heads: Arc::default(),
        };
        let (accepts, closed, heads) = (
            r.accepts.clone(),
            r.closed_by_proxy.clone(),
            r.heads.clone(),
        );
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                accepts.fetch_add(1, Ordering::SeqCst);
                let (closed, heads) = (closed.clone(), heads.clone());
                tokio::spawn(serve(s, mode, closed, heads));
            }
        });
        r
    }

    async fn serve(
        mut s: TcpStream,
        mode: Mode,
        closed: Arc<AtomicUsize>,
        heads: Arc<Mutex<Vec<Vec<u8>>>>,
    ) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        closed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                continue;
            };
            let head = buf[..end + 4].to_vec();
            let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let body_len: usize = text
                .split("\r\n")
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |n| n.trim().parse().unwrap());
            while buf.len() < end + 4 + body_len {
                let n = s.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            buf.drain(..end + 4 + body_len);
            heads.lock().unwrap().push(head);
            match mode {
                Mode::KeepAlive => {
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    s.write_all(answer).await.unwrap();
                }
                Mode::CloseIdleAfter(pause) => {
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    s.write_all(answer).await.unwrap();
                    tokio::time::sleep(pause).await;
                    return;
                }
                Mode::Stream => {
                    let head =
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
                    s.write_all(head).await.unwrap();
                }
            }
        }
    }

    fn upstreams(urls: &[&str]) -> Upstreams {
        let config = UpstreamConfig {
            urls: urls.iter().map(|u| BaseUrl::parse(u).unwrap()).collect(),
            ..UpstreamConfig::default()
        };
        Upstreams::new(&config, &Registry::new()).unwrap()
    }

    /// The request as forwarding hands it over: absolute URI, `Host` preset.
    fn request(replica: &Replica) -> Request<Full<Bytes>> {
        let pq: http::uri::PathAndQuery = "/v1/chat/completions?x=1".parse().unwrap();
        let mut req = Request::post(replica.request_uri(Some(&pq)).unwrap())
            .header("content-type", "application/json")
            .header("x-request-id", "abc")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let host = replica.host.clone().unwrap();
        req.headers_mut().insert(http::header::HOST, host);
        req
    }

    async fn call(up: &Upstreams, lane: Option<&Lane>, replica: &Replica) -> Response<LaneBody> {
        send(up, lane, replica, request(replica), Instant::now())
            .await
            .unwrap()
    }

    async fn text(resp: Response<LaneBody>) -> String {
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    fn empty(lane: &Lane) -> bool {
        let slot = lane.0.lock().unwrap();
        !slot.busy && slot.idle.is_none()
    }

    fn on_lane(resp: &Response<LaneBody>) -> bool {
        resp.body().lease.is_some()
    }

    #[tokio::test]
    async fn a_client_connections_requests_share_one_upstream_connection_on_its_lane() {
        let engine = replica(Mode::KeepAlive).await;
        let up = upstreams(&[&engine.url]);
        let r = up.replicas()[0].clone();
        let lane = Lane::default();
        for _ in 0..5 {
            let resp = call(&up, Some(&lane), &r).await;
            assert!(on_lane(&resp));
            assert_eq!(text(resp).await, "ok");
        }
        assert_eq!(engine.accepts.load(Ordering::SeqCst), 1);
        assert!(lane.0.lock().unwrap().idle.is_some());
        // The client connection ends: its lane's connection closes with it.
        drop(lane);
        tokio::time::timeout(Duration::from_secs(5), async {
            while engine.closed_by_proxy.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn an_idle_connection_the_engine_closed_is_replaced_without_an_error() {
        let engine = replica(Mode::CloseIdleAfter(Duration::from_millis(20))).await;
        let up = upstreams(&[&engine.url]);
        let r = up.replicas()[0].clone();
        let lane = Lane::default();
        for i in 1..=3 {
            let resp = call(&up, Some(&lane), &r).await;
            assert!(on_lane(&resp), "request {i}");
            assert_eq!(text(resp).await, "ok");
            // The engine closes the idle connection before the next request.
            tokio::time::sleep(Duration::from_millis(80)).await;
            assert_eq!(engine.accepts.load(Ordering::SeqCst), i);
        }
    }

    #[tokio::test]
    async fn a_lane_idle_past_the_pool_idle_timeout_is_not_reused() {
        let engine = replica(Mode::KeepAlive).await;
        let up = upstreams(&[&engine.url]);
        let r = up.replicas()[0].clone();
        let lane = Lane::default();
        assert_eq!(text(call(&up, Some(&lane), &r).await).await, "ok");
        let later = Instant::now() + up.config.pool_idle_timeout;
        let resp = send(&up, Some(&lane), &r, request(&r), later)
            .await
            .unwrap();
        assert!(on_lane(&resp));
        assert_eq!(text(resp).await, "ok");
        assert_eq!(engine.accepts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_dropped_mid_stream_closes_its_connection_and_it_is_not_reused() {
        let engine = replica(Mode::Stream).await;
        let up = upstreams(&[&engine.url]);
        let r = up.replicas()[0].clone();
        let lane = Lane::default();
        let mut body = call(&up, Some(&lane), &r).await.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "hello");
        assert!(lane.0.lock().unwrap().busy);
        // The client goes away: the engine sees its connection close (and aborts).
        drop(body);
        tokio::time::timeout(Duration::from_secs(5), async {
            while engine.closed_by_proxy.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        assert!(empty(&lane));
        let resp = call(&up, Some(&lane), &r).await;
        assert!(on_lane(&resp));
        assert_eq!(engine.accepts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_second_request_while_the_lane_is_busy_goes_through_the_pool() {
        let engine = replica(Mode::KeepAlive).await;
        let up = upstreams(&[&engine.url]);
        let r = up.replicas()[0].clone();
        let lane = Lane::default();
        // HTTP/2 clients: two requests of one connection at once.
        let first = call(&up, Some(&lane), &r).await;
        let second = call(&up, Some(&lane), &r).await;
        assert!(on_lane(&first));
        assert!(!on_lane(&second));
        assert_eq!(text(second).await, "ok");
        assert_eq!(text(first).await, "ok");
        assert_eq!(engine.accepts.load(Ordering::SeqCst), 2);
        // The lane is free again once the first body ended.
        let third = call(&up, Some(&lane), &r).await;
        assert!(on_lane(&third));
        assert_eq!(text(third).await, "ok");
        assert_eq!(engine.accepts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_to_another_replica_than_the_lanes_goes_through_the_pool() {
        let (a, b) = (
            replica(Mode::KeepAlive).await,
            replica(Mode::KeepAlive).await,
        );
        let up = upstreams(&[&a.url, &b.url]);
        let (ra, rb) = (up.replicas()[0].clone(), up.replicas()[1].clone());
        let lane = Lane::default();
        assert!(on_lane(&call(&up, Some(&lane), &ra).await));
        // (the body above was dropped before its end: the lane is empty again)
        let resp = call(&up, Some(&lane), &ra).await;
        assert!(on_lane(&resp));
        assert_eq!(text(resp).await, "ok");
        let resp = call(&up, Some(&lane), &rb).await;
        assert!(!on_lane(&resp));
        assert_eq!(text(resp).await, "ok");
        let resp = call(&up, Some(&lane), &ra).await;
        assert!(on_lane(&resp));
        assert_eq!(text(resp).await, "ok");
        assert_eq!(a.accepts.load(Ordering::SeqCst), 2);
        assert_eq!(b.accepts.load(Ordering::SeqCst), 1);
    }

    /// The request head a replica reads is the same from a lane and from the pooled client.
    #[tokio::test]
    async fn a_lane_sends_the_bytes_the_pooled_client_sends() {
        let engine = replica(Mode::KeepAlive).await;
        let up = upstreams(&[&engine.url]);
        let r = up.replicas()[0].clone();
        let lane = Lane::default();
        let pooled = call(&up, None, &r).await;
        assert!(!on_lane(&pooled));
        assert_eq!(text(pooled).await, "ok");
        let laned = call(&up, Some(&lane), &r).await;
        assert!(on_lane(&laned));
        assert_eq!(text(laned).await, "ok");
        let heads = engine.heads.lock().unwrap();
        assert_eq!(heads.len(), 2);
        let text = String::from_utf8_lossy(&heads[0]);
        assert!(
            text.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\n"),
            "{text}"
        );
        assert_eq!(heads[0], heads[1], "{text}");
    }

    #[tokio::test]
    async fn a_refused_connect_on_a_lane_is_a_connect_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        let up = upstreams(&[&url]);
        let r = up.replicas()[0].clone();
        let lane = Lane::default();
        let err = send(&up, Some(&lane), &r, request(&r), Instant::now())
            .await
            .err()
            .unwrap();
        assert!(err.connect, "{err}");
        assert!(empty(&lane));
    }

    /// Counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_relay_passes_every_wake_but_those_this_thread_causes_while_taking_output() {
        let count = Arc::new(Count::default());
        let task = Waker::from(count.clone());
        let relay = Arc::new(Relay::default());
        let waker = Waker::from(relay.clone());
        // Nothing followed yet: a wake goes nowhere.
        waker.wake_by_ref();
        relay.follow(&task);
        waker.wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        {
            let _quiet = Quiet::enter(&relay);
            waker.wake_by_ref();
            assert_eq!(count.0.load(Ordering::SeqCst), 1, "quiet on this thread");
            // Another thread's wake (the I/O driver's) is never lost.
            let other = waker.clone();
            std::thread::spawn(move || other.wake()).join().unwrap();
            assert_eq!(count.0.load(Ordering::SeqCst), 2);
            // Another relay's wake passes too.
            let second = Arc::new(Relay::default());
            second.follow(&task);
            Waker::from(second).wake();
            assert_eq!(count.0.load(Ordering::SeqCst), 3);
        }
        waker.wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn origin_form_is_the_path_and_query() {
        for (uri, want) in [
            ("http://e:1/v1/models?x=1", "/v1/models?x=1"),
            ("http://e:1/", "/"),
            ("http://e:1", "/"),
            ("https://e/a/b", "/a/b"),
        ] {
            let uri: Uri = uri.parse().unwrap();
            assert_eq!(origin_form(&uri).to_string(), want);
        }
    }
}
