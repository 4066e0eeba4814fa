//! Forwarding: bodies and streams pass through unchanged, headers as specified, routes.

use std::sync::atomic::Ordering;

use crate::support::proxy::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[tokio::test]
async fn stream_arrives_byte_identical_to_direct() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let c = client();
    let (direct, direct_body) = send(
        &c,
        fake_stream_request(&format!("{}/v1/chat/completions", fake.url()), 20, 1),
    )
    .await;
    let (via, via_body) = send(
        &c,
        fake_stream_request(&proxy.url("/v1/chat/completions"), 20, 1),
    )
    .await;
    assert_eq!(direct.status, 200);
    assert_eq!(via.status, 200);
    assert_eq!(via.headers["content-type"], "text/event-stream");
    assert_eq!(via_body, direct_body);
    assert!(via_body.ends_with(b"data: [DONE]\n\n"));
}

#[tokio::test]
async fn events_are_forwarded_as_they_come_not_buffered() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    // 5 events 300 ms apart: the first must arrive long before the stream ends.
    let resp = client()
        .request(fake_stream_request(
            &proxy.url("/v1/chat/completions"),
            5,
            300,
        ))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut body = resp.into_body();
    let first = read_events(&mut body, 1).await;
    let first_at = started.elapsed();
    assert!(first.starts_with(b"data: "));
    let rest = body.collect().await.unwrap().to_bytes();
    let total = started.elapsed();
    assert!(rest.ends_with(b"data: [DONE]\n\n"));
    assert!(
        total >= first_at + std::time::Duration::from_millis(900),
        "first {first_at:?} total {total:?}"
    );
}

#[tokio::test]
async fn headers_request_id_forwarded_and_hop_by_hop_stripped_both_ways() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let c = client();

    let mut req = post_json(
        &proxy.url("/v1/completions?x=1&y=two"),
        r#"{"model":"m","prompt":"hi"}"#,
    );
    let h = req.headers_mut();
    h.insert("x-fake-echo", "1".parse().unwrap());
    h.insert("x-request-id", "client-id-42".parse().unwrap());
    h.insert("connection", "x-client-hop".parse().unwrap());
    h.insert("x-client-hop", "secret".parse().unwrap());
    h.insert("proxy-authorization", "Basic abc".parse().unwrap());
    h.insert("te", "trailers".parse().unwrap());
    h.insert("x-forwarded-for", "10.1.2.3".parse().unwrap());
    h.insert("authorization", "Bearer sk-end-to-end".parse().unwrap());
    h.append("x-multi", "one".parse().unwrap());
    h.append("x-multi", "two".parse().unwrap());
    let (parts, body) = send(&c, req).await;
    assert_eq!(parts.status, 200);

    // Response side: upstream's hop-by-hop headers are gone, end-to-end ones kept, id returned.
    assert_eq!(parts.headers["x-request-id"], "client-id-42");
    assert!(parts.headers.get("x-up-hop").is_none());
    assert!(parts.headers.get("keep-alive").is_none());
    assert_eq!(parts.headers["x-up-end-to-end"], "kept");

    // Request side, as the upstream saw it.
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["uri"], "/v1/completions?x=1&y=two");
    assert_eq!(echo["body"], r#"{"model":"m","prompt":"hi"}"#);
    let seen: Vec<(String, String)> = serde_json::from_value(echo["headers"].clone()).unwrap();
    let get = |name: &str| {
        seen.iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    for hop in ["x-client-hop", "proxy-authorization", "te", "connection"] {
        assert!(get(hop).is_empty(), "{hop} leaked: {:?}", get(hop));
    }
    assert_eq!(get("authorization"), ["Bearer sk-end-to-end"]);
    assert_eq!(get("x-multi"), ["one", "two"], "every value, in order");
    assert_eq!(get("x-request-id"), ["client-id-42"]);
    // No proxy in front is trusted (the default): the client's own entry is dropped.
    assert_eq!(get("x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(get("x-forwarded-proto"), ["http"]);
    assert_eq!(get("x-forwarded-host"), [proxy.addr.to_string().as_str()]);
    assert_eq!(get("host"), [fake.addr.to_string().as_str()]);
    assert_eq!(get("content-length"), ["27"]);
}

#[tokio::test]
async fn request_id_is_generated_when_absent() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let c = client();
    let (a, _) = send(&c, get(&proxy.url("/v1/models"))).await;
    let (b, _) = send(&c, get(&proxy.url("/v1/models"))).await;
    let (ida, idb) = (&a.headers["x-request-id"], &b.headers["x-request-id"]);
    assert!(!ida.is_empty());
    assert_ne!(ida, idb);
}

#[tokio::test]
async fn unknown_paths_get_404_without_touching_upstream() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let c = client();
    for path in ["/metrics", "/healthz", "/readyz", "/stats", "/admin", "/"] {
        let (parts, body) = send(&c, get(&proxy.url(path))).await;
        assert_eq!(parts.status, 404, "{path}");
        assert_openai_error(404, &body);
    }
    assert_eq!(fake.stats.requests.load(Ordering::SeqCst), 0);
    for path in ["/health", "/version", "/tokenize", "/v1/models"] {
        let (parts, _) = send(&c, get(&proxy.url(path))).await;
        assert_eq!(parts.status, 200, "{path}");
    }
}

#[tokio::test]
async fn h2c_prior_knowledge_on_the_same_port() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let resp = h2
        .request(fake_stream_request(
            &proxy.url("/v1/chat/completions"),
            3,
            0,
        ))
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
}

#[tokio::test]
async fn a_slow_client_slows_the_upstream_instead_of_buffering() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let chunks = 4096u64; // 256 MiB in total
    let mut req = get(&proxy.url("/v1/files/big"));
    req.headers_mut().insert("x-fake-bulk", chunks.into());
    let resp = client().request(req).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    // The client stops reading. Only socket buffers (a few MiB per hop) may fill up.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let produced = fake.stats.bulk_bytes.load(Ordering::SeqCst);
    let total = chunks as usize * BULK_CHUNK;
    assert!(
        produced < total / 4,
        "upstream produced {produced} of {total} bytes for a stalled client"
    );
    // Reading resumes and everything arrives.
    let mut received = first.into_data().unwrap().len();
    while let Some(frame) = body.frame().await {
        received += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    assert_eq!(received, total);
}

/// A replica that names, in each answer's `x-upstream-conn`, the connection it came on.
async fn start_conn_naming_replica() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0u64;
        while let Ok((io, _)) = l.accept().await {
            n += 1;
            let svc = hyper::service::service_fn(move |_req| async move {
                let resp = http::Response::builder()
                    .header("content-type", "application/json")
                    .header("x-upstream-conn", n)
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(resp)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(io), svc),
            );
        }
    });
    format!("http://{addr}")
}

/// Each client connection's requests go on its own upstream connection (its lane), driven by
/// that connection's task: two clients taking turns never share one, as they would through a
/// pool whose one idle connection each would take in turn.
#[tokio::test]
async fn each_client_connection_keeps_its_own_upstream_connection() {
    let upstream = start_conn_naming_replica().await;
    let proxy = start_proxy(test_config(&[upstream])).await;
    let mut clients = Vec::new();
    for _ in 0..2 {
        let io = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .unwrap();
        tokio::spawn(conn);
        clients.push(send);
    }
    let mut seen = [Vec::new(), Vec::new()];
    for round in 0..6 {
        let i = round % 2;
        let req = post_json(&proxy.url("/v1/chat/completions"), r#"{"model":"m"}"#);
        let resp = tokio::time::timeout(SLOW, clients[i].send_request(req))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), 200);
        let conn = resp.headers()["x-upstream-conn"]
            .to_str()
            .unwrap()
            .to_string();
        resp.into_body().collect().await.unwrap();
        seen[i].push(conn);
    }
    for s in &seen {
        assert!(s.iter().all(|c| *c == s[0]), "{seen:?}");
    }
    assert_ne!(seen[0][0], seen[1][0], "{seen:?}");
}

/// HTTP/2 requests of one client connection at once: one takes the lane, the others the
/// pooled client; every stream completes.
#[tokio::test]
async fn concurrent_http2_requests_of_one_connection_all_complete() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let url = proxy.url("/v1/chat/completions");
    let streams = (0..4).map(|_| {
        let (h2, url) = (h2.clone(), url.clone());
        async move {
            let resp = h2.request(fake_stream_request(&url, 3, 20)).await.unwrap();
            assert_eq!(resp.version(), http::Version::HTTP_2);
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap().to_bytes()
        }
    });
    let bodies = tokio::time::timeout(SLOW, futures_util::future::join_all(streams))
        .await
        .unwrap();
    for body in bodies {
        assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
    }
}
