//! One bounded exchange with a small HTTP resource (an engine's `/metrics`, a replica's
//! `/v1/models`, a proxy's `/stats`): the whole answer within a deadline, its body within a
//! size limit. Every caller that reads such a page goes through [`fetch`], so none of them can
//! forget the deadline or buffer whatever a misbehaving peer sends.

use std::error::Error as StdError;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use hyper_util::client::legacy::connect::Connect;
use hyper_util::client::legacy::Client;

/// The answer: its status, headers and whole body (any status: the caller decides what fails).
#[derive(Debug, Clone)]
pub struct Fetched {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Fetched {
    /// The body as text, when it is UTF-8.
    pub fn text(self) -> Result<String, FetchError> {
        String::from_utf8(Vec::from(self.body)).map_err(|_| FetchError::NotUtf8)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No complete answer (head and body) within the deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Connecting, sending or reading the head failed; the message holds the error's chain.
    #[error("{0}")]
    Request(String),
    #[error("body larger than {max} bytes")]
    TooLarge { max: usize },
    /// The body broke off; the message holds the error's chain.
    #[error("body failed: {0}")]
    Body(String),
    #[error("body is not UTF-8")]
    NotUtf8,
}

/// Sends `req` and reads the whole answer within `timeout`, its body within `max_bytes`.
pub async fn fetch<C, B>(
    client: &Client<C, B>,
    req: Request<B>,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Fetched, FetchError>
where
    C: Connect + Clone + Send + Sync + 'static,
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| FetchError::Request(error_chain(&e)))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = Limited::new(resp.into_body(), max_bytes)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    FetchError::TooLarge { max: max_bytes }
                } else {
                    FetchError::Body(error_chain(&*e))
                }
            })?
            .to_bytes();
        Ok(Fetched {
            status,
            headers,
            body,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| FetchError::Timeout(timeout))?
}

/// An error and its sources, `outer: inner: ...` (hyper's own message is often just
/// "client error (Connect)"; the cause is further down).
pub fn error_chain(e: &dyn StdError) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Everything but RFC 3986's unreserved characters is escaped in a query value.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes a query-string value (model names and upstream URLs carry `:`, `/`, `#`;
/// SQL carries spaces).
pub fn query_value(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, QUERY_VALUE).to_string()
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    use super::*;

    /// A one-route server on port 0: `/slow` answers after 5 s, `/big` with 4 KiB, anything
    /// else with `404 "nope"`.
    async fn server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let (status, body) = match req.uri().path() {
                            "/slow" => {
                                tokio::time::sleep(Duration::from_secs(5)).await;
                                (200, Bytes::new())
                            }
                            "/big" => (200, Bytes::from(vec![b'x'; 4096])),
                            "/bin" => (200, Bytes::from_static(&[0xff, 0xfe])),
                            _ => (404, Bytes::from_static(b"nope")),
                        };
                        let resp = http::Response::builder()
                            .status(status)
                            .header("server", "test")
                            .body(Full::new(body));
                        Ok::<_, Infallible>(resp.unwrap())
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        addr
    }

    fn get(addr: std::net::SocketAddr, path: &str) -> Request<Full<Bytes>> {
        Request::get(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    #[test]
    fn query_values_keep_only_unreserved_characters() {
        assert_eq!(query_value("http://e:1/x#2"), "http%3A%2F%2Fe%3A1%2Fx%232");
        assert_eq!(
            query_value("INSERT INTO a.b FORMAT JSONEachRow"),
            "INSERT%20INTO%20a.b%20FORMAT%20JSONEachRow"
        );
        assert_eq!(query_value("A-z_0.9~"), "A-z_0.9~");
        assert_eq!(query_value("é&="), "%C3%A9%26%3D");
    }

    #[tokio::test]
    async fn bounds_time_size_and_reports_status() {
        let addr = server().await;
        let client = Client::builder(TokioExecutor::new()).build_http();
        let t = Duration::from_secs(2);

        let nope = fetch(&client, get(addr, "/x"), t, 1024).await.unwrap();
        assert_eq!(nope.status, 404);
        assert_eq!(nope.headers["server"], "test", "headers of any status");
        assert_eq!(nope.text().unwrap(), "nope");

        let big = fetch(&client, get(addr, "/big"), t, 4096).await.unwrap();
        assert_eq!(big.body.len(), 4096, "a body of exactly the limit is whole");
        let over = fetch(&client, get(addr, "/big"), t, 4095)
            .await
            .unwrap_err();
        assert!(
            matches!(over, FetchError::TooLarge { max: 4095 }),
            "{over:?}"
        );

        let bin = fetch(&client, get(addr, "/bin"), t, 1024).await.unwrap();
        assert!(matches!(bin.text(), Err(FetchError::NotUtf8)));

        let slow = fetch(
            &client,
            get(addr, "/slow"),
            Duration::from_millis(100),
            1024,
        )
        .await;
        assert!(matches!(slow, Err(FetchError::Timeout(_))), "{slow:?}");

        // Nothing listens on the port of a dropped listener: a connect error with its cause.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = closed.local_addr().unwrap();
        drop(closed);
        match fetch(&client, get(gone, "/"), t, 1024).await {
            Err(FetchError::Request(msg)) => assert!(msg.contains("onnect"), "{msg}"),
            other => panic!("expected a connect error, got {other:?}"),
        }
    }
}
