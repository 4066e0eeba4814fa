//! Identity: what the upstream learns about the client cannot be forged by
//! the client, and no request reaches anything but a configured replica: not by an
//! absolute-form URI, a Host or `:authority` naming another server, nor by CONNECT.

use std::sync::atomic::Ordering;

use hyper_util::rt::TokioExecutor;

use super::*;
use crate::support::proxy::*;
use crate::support::raw_http::parse;

/// The upstream's view of one raw request: (status, echoed uri, echoed headers).
async fn echoed(addr: SocketAddr, bytes: &[u8]) -> (u16, serde_json::Value) {
    let raw = exchange(addr, bytes, QUICK).await;
    let resp = parse(&raw);
    let echo = serde_json::from_slice(&resp.body).unwrap_or(serde_json::Value::Null);
    (resp.status, echo)
}

fn header_values(echo: &serde_json::Value, name: &str) -> Vec<String> {
    echo["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|kv| kv[0] == name)
        .map(|kv| kv[1].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn absolute_form_host_and_authority_never_leave_the_replica_set() {
    let replica = start_fake().await;
    let elsewhere = start_fake().await;
    let proxy = start_proxy(test_config(&[replica.url()])).await;
    let other = elsewhere.addr;
    let cases = [
        format!("GET http://{other}/version HTTP/1.1\r\nhost: {other}\r\nx-fake-echo: 1\r\nconnection: close\r\n\r\n"),
        format!("GET /version HTTP/1.1\r\nhost: {other}\r\nx-fake-echo: 1\r\nconnection: close\r\n\r\n"),
        format!("GET http://{other}/version HTTP/1.1\r\nhost: {}\r\nx-fake-echo: 1\r\nconnection: close\r\n\r\n", proxy.addr),
    ];
    for req in &cases {
        let (status, echo) = echoed(proxy.addr, req.as_bytes()).await;
        assert_eq!(status, 200, "{req}");
        assert_eq!(echo["uri"], "/version", "{req}");
        assert_eq!(
            header_values(&echo, "host"),
            [replica.addr.to_string()],
            "{req}"
        );
    }
    // CONNECT is not tunnelled anywhere.
    let connect = format!("CONNECT {other} HTTP/1.1\r\nhost: {other}\r\n\r\n");
    let raw = exchange(proxy.addr, connect.as_bytes(), QUICK).await;
    assert!(
        matches!(status(&raw), Some(400..=499)),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    // HTTP/2 with a foreign :authority.
    let mut req = get(&format!("http://{}/version", proxy.addr));
    req.headers_mut()
        .insert("x-fake-echo", "1".parse().unwrap());
    // The client connects to the proxy, but the request names the other server.
    *req.uri_mut() = format!("http://{other}/version").parse().unwrap();
    let conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut send_h2, driver) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(conn),
    )
    .await
    .unwrap();
    tokio::spawn(driver);
    let resp = send_h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(elsewhere.stats.requests.load(Ordering::SeqCst), 0);
    assert_eq!(
        replica.stats.requests.load(Ordering::SeqCst),
        cases.len() + 1
    );
}

#[tokio::test]
async fn x_forwarded_for_keeps_only_the_trusted_part_of_the_chain() {
    let fake = start_fake().await;
    let req = "GET /version HTTP/1.1\r\nhost: x\r\nx-fake-echo: 1\r\nconnection: close\r\n\
               x-forwarded-for: 6.6.6.6, 10.0.0.1\r\nx-forwarded-proto: https\r\n\r\n";
    for (trusted, want, proto) in [
        (0, "127.0.0.1", "http"),
        (1, "10.0.0.1, 127.0.0.1", "https"),
        (5, "6.6.6.6, 10.0.0.1, 127.0.0.1", "https"),
    ] {
        let mut config = test_config(&[fake.url()]);
        config.server.trusted_proxies = trusted;
        let proxy = start_proxy(config).await;
        let (status, echo) = echoed(proxy.addr, req.as_bytes()).await;
        assert_eq!(status, 200);
        assert_eq!(
            header_values(&echo, "x-forwarded-for"),
            [want],
            "trusted {trusted}"
        );
        assert_eq!(
            header_values(&echo, "x-forwarded-proto"),
            [proto],
            "trusted {trusted}"
        );
    }
}
