//! Upstream HTTPS: `https://` replicas verified against `upstream.tls_ca`,
//! optionally with a client certificate (mTLS), against an in-process TLS upstream built from
//! the fixture certificates. Pass: served through a CA that signed the upstream's certificate
//! (health probes over TLS too: `/readyz` turns 200); refused (502, the upstream never sees
//! the request) with a CA that did not; with an upstream that demands a client certificate,
//! served when the proxy presents the right one, 502 without one.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use crate::support::proxy::*;
use crate::support::tls::fixture;

/// An HTTPS upstream presenting `cert.pem` (localhost, 127.0.0.1); with `client_ca`, it
/// demands a client certificate issued by that fixture. Counts chat requests; answers each
/// with a JSON completion and `x-client-cert: yes|no`.
struct TlsUpstream {
    addr: SocketAddr,
    chats: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn certs(name: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(fixture(name))
        .unwrap()
        .map(|c| c.unwrap())
        .collect()
}

async fn tls_upstream(client_ca: Option<&str>) -> TlsUpstream {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ca) {
                roots.add(c).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let key = PrivateKeyDer::from_pem_file(fixture("key.pem")).unwrap();
    let mut config = builder.with_single_cert(certs("cert.pem"), key).unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let chats = Arc::new(AtomicUsize::new(0));
    let counted = chats.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, chats) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let client_cert = tls.get_ref().1.peer_certificates().is_some();
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let chats = chats.clone();
                    async move {
                        if req.uri().path() == "/v1/chat/completions" {
                            chats.fetch_add(1, Ordering::SeqCst);
                        }
                        let body = r#"{"id":"tls","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
                        let mut resp =
                            Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        let h = resp.headers_mut();
                        h.insert("content-type", "application/json".parse().unwrap());
                        let v = if client_cert { "yes" } else { "no" };
                        h.insert("x-client-cert", v.parse().unwrap());
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    TlsUpstream { addr, chats, task }
}

fn tls_config(
    up: &TlsUpstream,
    ca: &str,
    client: Option<(&str, &str)>,
) -> goodput_proxy::config::RawConfig {
    let mut c = test_config(&[format!("https://127.0.0.1:{}", up.addr.port())]);
    c.upstream.tls_ca = Some(fixture(ca));
    if let Some((cert, key)) = client {
        c.upstream.tls_client_cert = Some(fixture(cert));
        c.upstream.tls_client_key = Some(fixture(key));
    }
    c
}

async fn chat(proxy: &Proxy) -> (u16, Option<String>) {
    let req = post_json(
        &proxy.url("/v1/chat/completions"),
        r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let (parts, _) = send(&client(), req).await;
    let cert = parts
        .headers
        .get("x-client-cert")
        .map(|v| v.to_str().unwrap().to_string());
    (parts.status.as_u16(), cert)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_against_the_configured_ca() {
    let up = tls_upstream(None).await;
    let proxy = start_proxy(tls_config(&up, "cert.pem", None)).await;
    assert_eq!(chat(&proxy).await, (200, Some("no".into())));
    assert_eq!(up.chats.load(Ordering::SeqCst), 1);
    // Health probes go over TLS too: the replica becomes ready.
    let c = client();
    let mut ready = false;
    for _ in 0..100 {
        if send(&c, get(&proxy.admin_url("/readyz"))).await.0.status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        ready,
        "/readyz never 200: health probes did not reach the TLS replica"
    );

    // A CA that did not sign the upstream's certificate: 502, nothing reaches it.
    let proxy = start_proxy(tls_config(&up, "cert-b.pem", None)).await;
    assert_eq!(chat(&proxy).await.0, 502);
    assert_eq!(up.chats.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_upstreams_get_the_client_certificate() {
    let up = tls_upstream(Some("cert-b.pem")).await;
    let with = start_proxy(tls_config(
        &up,
        "cert.pem",
        Some(("cert-b.pem", "key-b.pem")),
    ))
    .await;
    assert_eq!(chat(&with).await, (200, Some("yes".into())));
    assert_eq!(up.chats.load(Ordering::SeqCst), 1);
    let without = start_proxy(tls_config(&up, "cert.pem", None)).await;
    assert_eq!(chat(&without).await.0, 502);
    // A certificate the upstream does not trust is refused the same way.
    let wrong = start_proxy(tls_config(&up, "cert.pem", Some(("cert.pem", "key.pem")))).await;
    assert_eq!(chat(&wrong).await.0, 502);
    assert_eq!(
        up.chats.load(Ordering::SeqCst),
        1,
        "only the authenticated request"
    );
}
