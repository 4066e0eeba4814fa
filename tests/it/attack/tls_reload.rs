//! TLS certificate reload on SIGHUP, against the real binary: the files are
//! swapped under it and SIGHUP sent. Pass: a new connection presents the new certificate, a
//! stream that was running over the old one finishes to `[DONE]`, and a reload from a broken
//! file keeps the certificate in use.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::*;
use crate::support::binary;
use crate::support::proxy::*;
use crate::support::tls::fixture;

fn der(path: &Path) -> Vec<u8> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// A client trusting both test certificates, h2 only.
fn connector() -> TlsConnector {
    crate::support::tls::connector(&["cert.pem", "cert-b.pem"], &[b"h2"])
}

async fn connect(addr: SocketAddr) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    connector()
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

fn presented(tls: &TlsStream<TcpStream>) -> Vec<u8> {
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Waits for a stderr line of the binary containing `what`.
fn wait_line(bin: &binary::Binary, what: &str) -> bool {
    let deadline = tokio::time::Instant::now() + QUICK;
    while tokio::time::Instant::now() < deadline {
        if let Ok(line) = bin.lines.recv_timeout(Duration::from_millis(100)) {
            if line.contains(what) {
                return true;
            }
        }
    }
    false
}

#[tokio::test]
async fn sighup_reloads_the_certificate_without_dropping_live_streams() {
    let fake = start_fake().await;
    let dir = crate::support::temp_dir("tls-reload");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(fixture("cert.pem"), &cert).unwrap();
    std::fs::copy(fixture("key.pem"), &key).unwrap();
    let bin = binary::spawn(
        &fake.url(),
        &[
            ("GOODPUT_PROXY_SERVER_TLS_CERT", cert.display().to_string()),
            ("GOODPUT_PROXY_SERVER_TLS_KEY", key.display().to_string()),
        ],
    );

    // A stream of 30 events at 100 ms over the first certificate.
    let old = connect(bin.addr).await;
    assert_eq!(presented(&old), der(&fixture("cert.pem")));
    let (mut send_req, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(old))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = fake_stream_request(
        &format!("https://localhost:{}/v1/chat/completions", bin.addr.port()),
        30,
        100,
    );
    *req.body_mut() = Full::new(Bytes::from_static(br#"{"model":"tiny","stream":true}"#));
    let resp = send_req.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let stream =
        tokio::spawn(async move { resp.into_body().collect().await.map(|c| c.to_bytes()) });

    // Swap the files, SIGHUP: new connections get the new certificate.
    std::fs::copy(fixture("cert-b.pem"), &cert).unwrap();
    std::fs::copy(fixture("key-b.pem"), &key).unwrap();
    bin.signal("HUP");
    assert!(
        wait_line(&bin, "TLS certificate and key reloaded"),
        "no reload logged"
    );
    assert_eq!(
        presented(&connect(bin.addr).await),
        der(&fixture("cert-b.pem"))
    );

    // A broken file: the reload fails, the certificate in use stays.
    std::fs::write(&key, "not a key").unwrap();
    bin.signal("HUP");
    assert!(wait_line(&bin, "TLS reload failed"), "no failure logged");
    assert_eq!(
        presented(&connect(bin.addr).await),
        der(&fixture("cert-b.pem"))
    );

    // The stream over the old certificate ran through all of it.
    let body = tokio::time::timeout(QUICK, stream)
        .await
        .expect("stream finishes")
        .unwrap()
        .expect("stream completes without error");
    assert!(body.ends_with(b"data: [DONE]\n\n"));
}
