//! Request smuggling over raw sockets. Every message two parsers could frame differently is
//! refused with 400: exactly one response, nothing reaches the upstream. The one exception is
//! RFC 9112 6.1's: Content-Length with Transfer-Encoding is framed by Transfer-Encoding alone
//! and the connection closed after the answer, so the request hidden behind it is never read.
//! The proxy never forwards bytes as they came: it reads the body and sends it upstream with
//! its own Content-Length, so a message it accepts cannot desynchronise the upstream either.

use std::sync::atomic::Ordering;

use super::*;
use crate::support::proxy::*;
use crate::support::raw_http::parse;

/// The request a smuggler hides after the first one's body.
const HIDDEN: &str = "GET /version HTTP/1.1\r\nhost: x\r\n\r\n";

struct Case {
    name: &'static str,
    bytes: String,
}

fn cases() -> Vec<Case> {
    let post = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n";
    let c = |name, bytes: String| Case { name, bytes };
    vec![
        c(
            "two different CLs",
            format!("{post}content-length: 2\r\ncontent-length: 38\r\n\r\n{{}}{HIDDEN}"),
        ),
        c(
            "CL list",
            format!("{post}content-length: 2, 38\r\n\r\n{{}}{HIDDEN}"),
        ),
        c(
            "TE: gzip (chunked not last)",
            format!("{post}transfer-encoding: gzip\r\n\r\n{{}}\r\n{HIDDEN}"),
        ),
        c(
            "TE: chunked, gzip",
            format!("{post}transfer-encoding: chunked, gzip\r\n\r\n0\r\n\r\n{HIDDEN}"),
        ),
        c(
            "obs-fold in TE",
            format!(
                "{post}transfer-encoding:\r\n chunked\r\ncontent-length: 2\r\n\r\n{{}}{HIDDEN}"
            ),
        ),
        c(
            "obs-fold in an ordinary field",
            format!("{post}x-folded: a\r\n b\r\ncontent-length: 2\r\n\r\n{{}}{HIDDEN}"),
        ),
        c(
            "space before the colon",
            format!("{post}transfer-encoding : chunked\r\ncontent-length: 2\r\n\r\n{{}}{HIDDEN}"),
        ),
        c(
            "bare LF in a chunk size line",
            format!("{post}transfer-encoding: chunked\r\n\r\n2\n{{}}\r\n0\r\n\r\n{HIDDEN}"),
        ),
        c(
            "bad chunk size",
            format!("{post}transfer-encoding: chunked\r\n\r\n-2\r\n{{}}\r\n0\r\n\r\n{HIDDEN}"),
        ),
        c(
            "NUL in a field value",
            format!("{post}x-nul: a\0b\r\ncontent-length: 2\r\n\r\n{{}}{HIDDEN}"),
        ),
    ]
}

#[tokio::test]
async fn ambiguous_framing_is_400_and_nothing_reaches_the_upstream() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let mut failed = Vec::new();
    for case in cases() {
        let before = fake.stats.requests.load(Ordering::SeqCst);
        let raw = exchange(proxy.addr, case.bytes.as_bytes(), QUICK).await;
        let after = fake.stats.requests.load(Ordering::SeqCst);
        let (st, n) = (status(&raw), responses(&raw));
        if st != Some(400) || n != 1 || after != before {
            failed.push(format!(
                "{}: status {st:?}, {n} responses, {} upstream requests",
                case.name,
                after - before
            ));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// CL+TE and TE+CL: framed by Transfer-Encoding (an empty chunked body here), answered once,
/// the connection closed; the upstream sees the POST with an empty body and never the request
/// hidden behind it.
#[tokio::test]
async fn content_length_with_transfer_encoding_is_framed_by_te_and_closed() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let post = "POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-fake-echo: 1\r\n";
    for (name, framing) in [
        ("CL+TE", "content-length: 40\r\ntransfer-encoding: chunked"),
        ("TE+CL", "transfer-encoding: chunked\r\ncontent-length: 40"),
    ] {
        let before = fake.stats.requests.load(Ordering::SeqCst);
        let bytes = format!("{post}{framing}\r\n\r\n0\r\n\r\n{HIDDEN}");
        // exchange returns at EOF: the proxy closed the connection (else it waits QUICK).
        let started = tokio::time::Instant::now();
        let raw = exchange(proxy.addr, bytes.as_bytes(), QUICK).await;
        assert!(started.elapsed() < QUICK, "{name}: connection kept open");
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(responses(&raw), 1, "{name}: {text}");
        let forwarded = fake.stats.requests.load(Ordering::SeqCst) - before;
        match status(&raw) {
            Some(400) => assert_eq!(forwarded, 0, "{name}"),
            Some(200) => {
                assert_eq!(forwarded, 1, "{name}: the hidden request was forwarded");
                let echo: serde_json::Value = serde_json::from_slice(&parse(&raw).body).unwrap();
                assert_eq!(echo["uri"], "/v1/completions", "{name}");
                assert_eq!(echo["body"], "", "{name}: body not framed by TE");
            }
            other => panic!("{name}: status {other:?}: {text}"),
        }
    }
}

/// A head with bare LF line ends is one well-framed message (RFC 9112 2.2 lets a recipient
/// accept it): served once, forwarded once, re-framed by the proxy.
#[tokio::test]
async fn a_bare_lf_head_is_one_request_not_two() {
    let fake = start_fake().await;
    let proxy = start_proxy(test_config(&[fake.url()])).await;
    let raw = exchange(
        proxy.addr,
        b"GET /version HTTP/1.1\nhost: x\nconnection: close\n\n",
        QUICK,
    )
    .await;
    let st = status(&raw);
    let forwarded = fake.stats.requests.load(Ordering::SeqCst);
    // Either refused outright, or served exactly once.
    assert!(
        (st == Some(400) && forwarded == 0) || (st == Some(200) && forwarded == 1),
        "status {st:?}, forwarded {forwarded}"
    );
    assert_eq!(responses(&raw), 1);
}
