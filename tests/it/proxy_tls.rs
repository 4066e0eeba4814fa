//! TLS on the public listener: rustls with ALPN (h2 and http/1.1), X-Forwarded-Proto https.

use crate::support::proxy::*;
use crate::support::tls::fixture;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn connector(alpn: &[u8]) -> TlsConnector {
    crate::support::tls::connector(&["cert.pem"], &[alpn])
}

/// Sends one echo request over TLS with the given ALPN; returns (negotiated ALPN, echo JSON).
async fn echo_over_tls(addr: std::net::SocketAddr, alpn: &[u8]) -> (Vec<u8>, serde_json::Value) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = connector(alpn)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let negotiated = tls.get_ref().1.alpn_protocol().unwrap_or_default().to_vec();
    let io = TokioIo::new(tls);
    let mut req = http::Request::post(format!("https://localhost:{}/v1/completions", addr.port()))
        .header("content-type", "application/json")
        .header("x-fake-echo", "1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = if negotiated == b"h2" {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        // HTTP/1.1 wants origin-form and a Host header.
        *req.uri_mut() = "/v1/completions".parse().unwrap();
        req.headers_mut()
            .insert("host", "localhost".parse().unwrap());
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (negotiated, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn tls_with_alpn_h2_and_http11() {
    let fake = start_fake().await;
    let mut config = test_config(&[fake.url()]);
    config.server.tls_cert = Some(fixture("cert.pem"));
    config.server.tls_key = Some(fixture("key.pem"));
    let proxy = start_proxy(config).await;
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (negotiated, echo) = echo_over_tls(proxy.addr, alpn).await;
        assert_eq!(negotiated, alpn);
        let headers: Vec<(String, String)> =
            serde_json::from_value(echo["headers"].clone()).unwrap();
        let proto: Vec<&str> = headers
            .iter()
            .filter(|(k, _)| k == "x-forwarded-proto")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(proto, ["https"]);
        let host: Vec<&str> = headers
            .iter()
            .filter(|(k, _)| k == "x-forwarded-host")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(host.len(), 1);
        assert!(host[0].starts_with("localhost"));
    }
}
