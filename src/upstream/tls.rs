//! Upstream HTTPS: replicas named `https://...` are reached over TLS (rustls, http/1.1 by
//! ALPN), verified against the CA bundle `upstream.tls_ca`, optionally presenting a client
//! certificate (`upstream.tls_client_cert` / `tls_client_key`: mTLS). `http://` replicas are
//! unchanged. One connector serves forwarding, health probes, engine scrapes and model
//! learning (they share the pooled client). A failed handshake is a connect error: nothing
//! was sent, so forwarding retries it once like a refused connect.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::Scheme;
use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tower::{Service, ServiceExt};

use crate::config::UpstreamTls;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection to a replica: plain TCP or TLS over it.
#[derive(Debug)]
pub enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A plain connection as the pooled client takes it (tests wrap hyper-util's connector).
pub fn plain(io: TokioIo<TcpStream>) -> TokioIo<UpstreamStream> {
    TokioIo::new(UpstreamStream::Plain(io.into_inner()))
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        match self {
            UpstreamStream::Plain(s) => s.connected(),
            UpstreamStream::Tls(s) => s.get_ref().0.connected(),
        }
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The rustls client configuration of `upstream.tls_*`; errors name the file.
pub fn client_config(tls: &UpstreamTls) -> Result<rustls::ClientConfig, String> {
    let certs = |path: &Path| -> Result<Vec<CertificateDer<'static>>, String> {
        let list = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if list.is_empty() {
            return Err(format!("{}: no certificate in it", path.display()));
        }
        Ok(list)
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(&tls.ca)? {
        roots
            .add(c)
            .map_err(|e| format!("tls_ca {}: {e}", tls.ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match &tls.client {
        Some((cert, key)) => {
            let chain = certs(cert)?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    // The pooled client speaks HTTP/1.1 to replicas.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// hyper-util's TCP connector, plus TLS for `https://` replicas when `tls` is configured.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    tls: Option<tokio_rustls::TlsConnector>,
    /// The handshake's own deadline (`upstream.connect_timeout_ms`, as the TCP connect's).
    handshake_timeout: Duration,
}

impl Connector {
    pub fn new(
        mut http: HttpConnector,
        tls: Option<rustls::ClientConfig>,
        handshake_timeout: Duration,
    ) -> Connector {
        // https URIs reach this connector only when TLS is configured (the config check).
        http.enforce_http(tls.is_none());
        Connector {
            http,
            tls: tls.map(|c| tokio_rustls::TlsConnector::from(Arc::new(c))),
            handshake_timeout,
        }
    }
}

impl Service<Uri> for Connector {
    type Response = TokioIo<UpstreamStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let http = self.http.clone();
        let tls = self.tls.clone();
        let deadline = self.handshake_timeout;
        Box::pin(async move {
            let https = uri.scheme() == Some(&Scheme::HTTPS);
            let host = uri.host().unwrap_or("").to_string();
            let tcp = http.oneshot(uri).await?.into_inner();
            if !https {
                return Ok(TokioIo::new(UpstreamStream::Plain(tcp)));
            }
            let tls = tls.ok_or("an https replica needs upstream.tls_ca")?;
            let name = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(name.to_string())
                .map_err(|e| format!("TLS server name `{name}`: {e}"))?;
            let stream = tokio::time::timeout(deadline, tls.connect(name, tcp))
                .await
                .map_err(|_| format!("TLS handshake not done within {deadline:?}"))??;
            Ok(TokioIo::new(UpstreamStream::Tls(Box::new(stream))))
        })
    }
}
