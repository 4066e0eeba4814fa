//! ClickHouse's HTTP interface, the two calls the proxy makes: an INSERT with a body, and a
//! query whose answer is read whole. Authentication by the `X-ClickHouse-User` /
//! `X-ClickHouse-Key` headers (understood since 18.x). Plain HTTP only.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderValue, Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Why a call failed: the server did not answer (down, refused, timed out), or it answered
/// with an error (its message, e.g. `Code: 60 ... Table goodput.x doesn't exist`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChError {
    #[error("no answer from ClickHouse: {0}")]
    Unreachable(String),
    #[error("ClickHouse answered {status}: {message}")]
    Refused { status: u16, message: String },
}

/// Largest answer read (a query's result, an error message).
const MAX_ANSWER: usize = 64 << 20;

#[derive(Clone)]
pub struct ChHttp {
    client: Client<HttpConnector, Full<Bytes>>,
    /// Scheme, authority and path prefix (no trailing `/`).
    base: String,
    user: HeaderValue,
    key: HeaderValue,
    timeout: Duration,
}

impl std::fmt::Debug for ChHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChHttp")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ChHttp {
    /// `url`: `http://host:port[/prefix]`. The password never appears in logs or `Debug`.
    pub fn new(url: &str, user: &str, password: &str, timeout: Duration) -> Result<Self, String> {
        let uri = crate::upstream::parse_base_url(url)?;
        let header = |v: &str, what: &str| {
            let mut h =
                HeaderValue::from_str(v).map_err(|_| format!("{what}: not a header value"))?;
            h.set_sensitive(true);
            Ok::<_, String>(h)
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        Ok(Self {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(5))
                .build(connector),
            base: format!(
                "http://{}{}",
                uri.authority().map_or("", |a| a.as_str()),
                uri.path().trim_end_matches('/')
            ),
            user: header(user, "user")?,
            key: header(password, "password")?,
            timeout,
        })
    }

    /// `INSERT INTO db.table FORMAT JSONEachRow` with `body` (gzip-compressed when `gzip`).
    /// Unknown JSON keys are skipped, so a newer proxy can write into an older schema.
    pub async fn insert(
        &self,
        db: &str,
        table: &str,
        body: Bytes,
        gzip: bool,
    ) -> Result<(), ChError> {
        let query = format!("INSERT INTO {db}.{table} FORMAT JSONEachRow");
        let uri = format!(
            "{}/?input_format_skip_unknown_fields=1&query={}",
            self.base,
            goodput_net::query_value(&query)
        );
        let mut req = self.request(&uri, body)?;
        if gzip {
            req.headers_mut()
                .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        self.call(req).await.map(drop)
    }

    /// Runs `sql` (sent as the POST body) and returns the whole answer.
    pub async fn query(&self, sql: &str) -> Result<Bytes, ChError> {
        let req = self.request(&format!("{}/", self.base), Bytes::from(sql.to_owned()))?;
        self.call(req).await
    }

    fn request(&self, uri: &str, body: Bytes) -> Result<Request<Full<Bytes>>, ChError> {
        let uri: Uri = uri
            .parse()
            .map_err(|e| ChError::Unreachable(format!("bad URI: {e}")))?;
        let mut req = Request::post(uri)
            .body(Full::new(body))
            .map_err(|e| ChError::Unreachable(e.to_string()))?;
        let h = req.headers_mut();
        h.insert("x-clickhouse-user", self.user.clone());
        h.insert("x-clickhouse-key", self.key.clone());
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Ok(req)
    }

    async fn call(&self, req: Request<Full<Bytes>>) -> Result<Bytes, ChError> {
        let page = goodput_net::fetch(&self.client, req, self.timeout, MAX_ANSWER)
            .await
            .map_err(|e| ChError::Unreachable(e.to_string()))?;
        if page.status.is_success() {
            Ok(page.body)
        } else {
            let body = &page.body[..page.body.len().min(2048)];
            Err(ChError::Refused {
                status: page.status.as_u16(),
                message: String::from_utf8_lossy(body).trim().to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_the_password() {
        let c = ChHttp::new("http://h:8123/", "u", "secret", Duration::from_secs(1)).unwrap();
        assert_eq!(c.base, "http://h:8123");
        assert!(!format!("{c:?}").contains("secret"));
        assert!(ChHttp::new("https://h", "u", "p", Duration::from_secs(1)).is_err());
        assert!(ChHttp::new("http://h", "u", "bad\npassword", Duration::from_secs(1)).is_err());
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let c = ChHttp::new(&format!("http://{addr}"), "u", "", Duration::from_secs(2)).unwrap();
        assert!(matches!(
            c.query("SELECT 1").await,
            Err(ChError::Unreachable(_))
        ));
    }
}
