//! The one accept loop, used by both listeners (public and admin): connection limit, TLS with
//! a handshake deadline and certificates reloadable while streams run, hyper-util serving
//! HTTP/1.1 and HTTP/2 on one port (h2c by prior knowledge) with explicit head and stream
//! limits ([`Limits`]), and graceful drain.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::Request;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::context::ConnInfo;
use crate::limits::Limits;
use crate::stack::ProxyService;
use crate::upstream::lane::Lane;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Loads a PEM certificate chain and key into an acceptor offering h2 and http/1.1 via ALPN.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let file_err = |path: &Path, e: &dyn std::fmt::Display| TlsError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_err(cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(cert, &e))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_err(key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The listener's certificate and key, reloadable from their files (SIGHUP): a new handshake
/// takes the current acceptor; connections already up keep the one they shook hands with, so
/// live streams are not touched.
pub struct ReloadableTls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<TlsAcceptor>,
}

impl ReloadableTls {
    pub fn load(cert: &Path, key: &Path) -> Result<ReloadableTls, TlsError> {
        Ok(ReloadableTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new(tls_acceptor(cert, key)?),
        })
    }

    /// Reads both files again; on any error the previous certificate stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let next = tls_acceptor(&self.cert, &self.key)?;
        match self.current.write() {
            Ok(mut g) => *g = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
        Ok(())
    }

    fn acceptor(&self) -> TlsAcceptor {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// How a listener serves connections.
#[derive(Clone)]
pub struct ServeOptions {
    /// For logs: which listener this is (`public`, `admin`).
    pub name: &'static str,
    /// Deadline for the request head (and, before it, for the first byte).
    pub header_read_timeout: Duration,
    pub limits: Limits,
    /// Open connections beyond which a new one is closed at once.
    pub max_connections: usize,
    pub tls: Option<Arc<ReloadableTls>>,
}

/// The first bytes of every HTTP/2 connection (RFC 9113 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What every connection of one listener shares: built once, not cloned into each
/// connection's task.
struct PerListener {
    options: ServeOptions,
    /// Reads the first bytes apart to tell HTTP/2's preface (h2c by prior knowledge) from
    /// HTTP/1, then hands them back to the protocol's connection.
    sniffing: Builder<TokioExecutor>,
    /// HTTP/1 at once, for a connection already known to be HTTP/1 (its first bytes cannot
    /// open the preface, or TLS chose `http/1.1`). The sniffed bytes handed back first made
    /// hyper's read buffer grow to twice its first size for the rest of the head (16 KiB a
    /// connection instead of 8: a sixth of a held stream's memory) and cost a read.
    http1: http1::Builder,
}

/// How one connection is served.
#[derive(Clone, Copy)]
enum Serving<'a> {
    Sniffing(&'a Builder<TokioExecutor>),
    Http1(&'a http1::Builder),
}

impl PerListener {
    fn new(options: ServeOptions) -> Self {
        let sniffing = http_builder(&options);
        let http1 = http1_builder(&options);
        Self {
            options,
            sniffing,
            http1,
        }
    }

    /// The builder for a connection that opened with `first` (bytes peeked, not read) or
    /// whose TLS handshake chose `alpn`.
    fn builder(&self, first: &[u8], alpn: Option<&[u8]>) -> Serving<'_> {
        let http1 = match alpn {
            Some(protocol) => protocol == b"http/1.1",
            None => !H2_PREFACE.starts_with(first),
        };
        if http1 {
            Serving::Http1(&self.http1)
        } else {
            Serving::Sniffing(&self.sniffing)
        }
    }
}

/// HTTP/1 as [`http_builder`] serves it, with the head limit checked exactly (hyper's
/// `max_header_size`; `max_buf_size` alone is checked only when a read leaves the head
/// incomplete, and one read may take the buffer past it).
fn http1_builder(options: &ServeOptions) -> http1::Builder {
    let l = &options.limits;
    let head = l.max_head_bytes.max(crate::limits::MIN_HEAD_BYTES);
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(head)
        .max_header_size(head)
        .max_headers(l.max_headers);
    b
}

fn http_builder(options: &ServeOptions) -> Builder<TokioExecutor> {
    let l = &options.limits;
    let mut b = Builder::new(TokioExecutor::new());
    // Without a timer hyper cannot enforce the header-read timeout.
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(l.max_head_bytes.max(crate::limits::MIN_HEAD_BYTES))
        .max_headers(l.max_headers);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(l.h2_max_header_list_bytes)
        .max_concurrent_streams(l.h2_max_concurrent_streams)
        .initial_stream_window_size(l.h2_stream_window_bytes)
        .initial_connection_window_size(l.h2_connection_window_bytes)
        .max_pending_accept_reset_streams(l.h2_max_pending_accept_reset_streams);
    b
}

/// Serves `listener` until `stop_accepting` resolves; then closes the listening socket (new
/// connections are refused), asks every connection to finish its in-flight requests, waits up
/// to `grace`, and cuts whatever is still running (clients see a truncated response).
pub async fn serve(
    listener: TcpListener,
    service: ProxyService,
    options: ServeOptions,
    stop_accepting: impl Future<Output = ()>,
    grace: Duration,
) {
    let name = options.name;
    let shared = Arc::new(PerListener::new(options));
    let slots = Arc::new(Semaphore::new(shared.options.max_connections));
    let (close_tx, close_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(stop_accepting);
    loop {
        tokio::select! {
            _ = &mut stop_accepting => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    // Over the limit: closed at once, so the client learns now instead of
                    // waiting in a backlog the proxy would not drain.
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::debug!(listener = name, %remote, "connection limit reached; closing");
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let conn = connection(stream, remote, shared.clone(), service.clone(), close_rx.clone(), slot);
                    conns.spawn(conn);
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = close_tx.send(true);
    let open = conns.len();
    tracing::info!(
        listener = name,
        connections = open,
        grace_ms = grace.as_millis() as u64,
        "stopped accepting; draining connections"
    );
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            listener = name,
            connections = conns.len(),
            "grace period over; cutting remaining connections"
        );
        conns.shutdown().await;
    }
}

async fn connection(
    stream: TcpStream,
    remote: SocketAddr,
    shared: Arc<PerListener>,
    service: ProxyService,
    close_rx: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let options = &shared.options;
    // A client that sends nothing at all never reaches hyper's header timer; bound it here.
    // Nor does it need to wait for one while the proxy is shutting down. The bytes peeked
    // (not read) tell an HTTP/1 request from HTTP/2's preface.
    let mut first = [0u8; 4];
    let mut close = close_rx.clone();
    let n = tokio::select! {
        peeked = tokio::time::timeout(options.header_read_timeout, stream.peek(&mut first)) => {
            match peeked {
                Ok(Ok(n)) if n > 0 => n,
                _ => return,
            }
        }
        _ = closing(&mut close) => return,
    };
    drop(close);
    let Some(tls) = &options.tls else {
        let info = ConnInfo::new(remote, false);
        let builder = shared.builder(&first[..n], None);
        return serve_io(stream, info, builder, service, close_rx).await;
    };
    // Boxed: the handshake's state and rustls' connection are several kilobytes, and in place
    // they would size the task of every plain connection too (a task is as large as its
    // largest state, for as long as it runs: a held stream's whole life).
    Box::pin(serve_tls(stream, remote, &shared, tls, service, close_rx)).await;
}

async fn serve_tls(
    stream: TcpStream,
    remote: SocketAddr,
    shared: &PerListener,
    tls: &ReloadableTls,
    service: ProxyService,
    close_rx: watch::Receiver<bool>,
) {
    let deadline = shared.options.limits.tls_handshake_timeout;
    match tokio::time::timeout(deadline, tls.acceptor().accept(stream)).await {
        Ok(Ok(tls)) => {
            let info = ConnInfo::new(remote, true);
            // No ALPN: the client may still speak HTTP/2 by prior knowledge.
            let builder = match tls.get_ref().1.alpn_protocol() {
                Some(alpn) => shared.builder(&[], Some(alpn)),
                None => Serving::Sniffing(&shared.sniffing),
            };
            serve_io(tls, info, builder, service, close_rx).await;
        }
        Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
    }
}

/// Serves `io` with the builder chosen for it. Finishes the requests in flight on shutdown,
/// then closes (HTTP/1: no keep-alive; HTTP/2: GOAWAY).
async fn serve_io<I>(
    io: I,
    info: ConnInfo,
    serving: Serving<'_>,
    service: ProxyService,
    close_rx: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match serving {
        Serving::Http1(builder) => {
            let remote = info.remote;
            let service = per_connection(service, info);
            let conn = pin!(builder.serve_connection(TokioIo::new(io), service));
            until_closed(conn, close_rx, remote, |c| c.graceful_shutdown()).await
        }
        // Boxed: the sniffing connection can become HTTP/2, whose state is larger than
        // HTTP/1's; in place it would size every HTTP/1 connection's task as well.
        Serving::Sniffing(builder) => {
            Box::pin(serve_sniffing(io, info, builder, service, close_rx)).await
        }
    }
}

async fn serve_sniffing<I>(
    io: I,
    info: ConnInfo,
    builder: &Builder<TokioExecutor>,
    service: ProxyService,
    close_rx: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let remote = info.remote;
    let service = per_connection(service, info);
    let conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    until_closed(conn, close_rx, remote, |c| c.graceful_shutdown()).await
}

/// The stack as hyper serves one connection: each request carries the connection's facts.
fn per_connection(service: ProxyService, info: ConnInfo) -> PerConnection<ProxyService> {
    PerConnection {
        service: Mutex::new(service),
        info,
        lane: Lane::default(),
    }
}

/// One connection's stack, called in place. hyper calls a service by shared reference, so
/// hyper-util's `TowerToHyperService` cloned the whole stack for every request: a box per
/// stage, allocated and freed again (about 2k instructions a request). A tower service may be
/// called once it is ready: every stage of the stack is ready at once (each passes readiness
/// through, forwarding is always ready), and for a stage that is not, the request gets a
/// clone that waits for readiness, as before. The lock is never contended: one connection's
/// requests are called one at a time, from its own task, and `call` returns before any await.
pub(crate) struct PerConnection<S> {
    service: Mutex<S>,
    info: ConnInfo,
    /// The connection's own upstream connection, driven from this connection's task
    /// (`upstream::lane`); closed when the client connection ends.
    lane: Lane,
}

type Answer = crate::layer::BoxFuture<http::Response<crate::body::ProxyBody>, Infallible>;

impl<S, B> hyper::service::Service<Request<B>> for PerConnection<S>
where
    S: tower::Service<
            Request<B>,
            Response = http::Response<crate::body::ProxyBody>,
            Error = Infallible,
            Future = Answer,
        > + Clone
        + Send
        + 'static,
    B: Send + 'static,
{
    type Response = http::Response<crate::body::ProxyBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, mut req: Request<B>) -> Answer {
        req.extensions_mut().insert(self.info.clone());
        req.extensions_mut().insert(self.lane.clone());
        let mut service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
        let mut cx = Context::from_waker(Waker::noop());
        match service.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => service.call(req),
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => Box::pin(service.clone().oneshot(req)),
        }
    }
}

/// Runs `conn` to its end; on shutdown asks it to finish gracefully first. It takes the
/// connection pinned where its caller made it: taken by value, it would be stored twice in
/// the task (once as this function's argument, once pinned).
async fn until_closed<C, E>(
    mut conn: Pin<&mut C>,
    mut close_rx: watch::Receiver<bool>,
    remote: SocketAddr,
    graceful: impl FnOnce(Pin<&mut C>),
) where
    C: Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::select! {
        res = conn.as_mut() => log_conn_end(remote, res.map_err(Into::into)),
        _ = closing(&mut close_rx) => {
            graceful(conn.as_mut());
            log_conn_end(remote, conn.await.map_err(Into::into));
        }
    }
}

/// Resolves once shutdown has been signalled (or the signaller is gone).
async fn closing(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|closing| *closing).await;
}

fn log_conn_end(remote: SocketAddr, res: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(e) = res {
        tracing::debug!(%remote, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use hyper::body::Incoming;

    use super::*;

    fn options() -> ServeOptions {
        ServeOptions {
            name: "test",
            header_read_timeout: Duration::from_secs(1),
            limits: Limits::default(),
            max_connections: 1,
            tls: None,
        }
    }

    #[test]
    fn only_a_connection_known_to_be_http1_skips_the_sniffing() {
        let shared = PerListener::new(options());
        let http1 = |first: &[u8], alpn: Option<&[u8]>| {
            matches!(shared.builder(first, alpn), Serving::Http1(_))
        };
        for (first, alpn, want) in [
            (&b"POST"[..], None, true),
            (b"GET ", None, true),
            (b"G", None, true),
            (b"PRI ", None, false),
            // Too few bytes to tell POST, PUT or PATCH from the preface: sniffed.
            (b"P", None, false),
            (b"PR", None, false),
            (b"", Some(&b"http/1.1"[..]), true),
            (b"", Some(b"h2"), false),
        ] {
            assert_eq!(http1(first, alpn), want, "{first:?} {alpn:?}");
        }
    }

    /// A stage that counts its clones and answers whether the request carried the
    /// connection's facts; its first readiness check is pending when told so.
    struct Counting {
        clones: Arc<std::sync::atomic::AtomicUsize>,
        ready: bool,
    }

    impl Clone for Counting {
        fn clone(&self) -> Self {
            self.clones
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Counting {
                clones: self.clones.clone(),
                ready: self.ready,
            }
        }
    }

    impl tower::Service<Request<()>> for Counting {
        type Response = http::Response<crate::body::ProxyBody>;
        type Error = Infallible;
        type Future = Answer;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            if self.ready {
                return Poll::Ready(Ok(()));
            }
            self.ready = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }

        fn call(&mut self, req: Request<()>) -> Answer {
            let with_facts = req.extensions().get::<ConnInfo>().is_some();
            Box::pin(async move {
                let body = http_body_util::Full::new(bytes::Bytes::from(with_facts.to_string()))
                    .map_err(|never| match never {});
                Ok(http::Response::new(body.boxed_unsync()))
            })
        }
    }

    async fn answer(conn: &PerConnection<Counting>) -> String {
        let resp = hyper::service::Service::call(conn, Request::new(()))
            .await
            .unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_ready_stack_is_called_in_place_and_a_stack_not_ready_gets_a_clone() {
        let clones = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let info = ConnInfo::new("127.0.0.1:1".parse().unwrap(), false);
        let count = || clones.load(std::sync::atomic::Ordering::SeqCst);
        let conn = |ready| PerConnection {
            service: Mutex::new(Counting {
                clones: clones.clone(),
                ready,
            }),
            info: info.clone(),
            lane: Lane::default(),
        };
        let ready = conn(true);
        for _ in 0..3 {
            assert_eq!(answer(&ready).await, "true");
        }
        assert_eq!(count(), 0, "a ready stack is never cloned");
        let pending = conn(false);
        assert_eq!(answer(&pending).await, "true");
        assert_eq!(
            count(),
            1,
            "a stack not ready serves the request from a clone"
        );
        assert_eq!(answer(&pending).await, "true");
        assert_eq!(count(), 1, "ready again: called in place");
    }

    /// A task is as large as its largest state for its whole life (a held stream's): a plain
    /// connection's must not hold the sniffing connection (HTTP/2 among its states) or the
    /// TLS handshake and stream in place.
    #[tokio::test]
    async fn a_plain_connection_task_has_no_room_for_sniffing_or_tls() {
        // Futures sized, never polled: any connected sockets do.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let socket = || TcpStream::connect(addr);
        let (a, b, c) = (
            socket().await.unwrap(),
            socket().await.unwrap(),
            socket().await.unwrap(),
        );
        let service = ProxyService::new(tower::service_fn(|_: Request<Incoming>| async {
            let body = http_body_util::Empty::new().map_err(|never| match never {});
            Ok::<_, std::convert::Infallible>(http::Response::new(body.boxed_unsync()))
        }));
        let shared = Arc::new(PerListener::new(options()));
        let (_close, close_rx) = watch::channel(false);
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
        let tls =
            ReloadableTls::load(&fixtures.join("cert.pem"), &fixtures.join("key.pem")).unwrap();

        let info = ConnInfo::new(addr, false);
        let sniffing = serve_sniffing(a, info, &shared.sniffing, service.clone(), close_rx.clone());
        let sniffing = std::mem::size_of_val(&sniffing);
        let tls = serve_tls(b, addr, &shared, &tls, service.clone(), close_rx.clone());
        let tls = std::mem::size_of_val(&tls);
        let slot = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let task = connection(c, addr, shared.clone(), service, close_rx, slot);
        let task = std::mem::size_of_val(&task);
        assert!(task < sniffing, "task {task} B, sniffing {sniffing} B");
        assert!(task < tls, "task {task} B, TLS {tls} B");
    }
}
