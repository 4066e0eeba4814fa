//! One access line per request, written when the response body is finished or dropped, so the
//! duration covers the whole stream: request id, method, path, status, upstream, duration.
//!
//! The line's bytes and its writer: `logging::access`.
//!
//! Sits just inside the context layer: it needs the id and `t0`, and it must see the final
//! response, including the proxy's own errors.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::hold::Hold;
use super::BoxFuture;
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::logging::access::AccessLine;
use crate::upstream::forward::ServedBy;

#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLogLayer;

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AccessLog { inner }
    }
}

#[derive(Debug, Clone)]
pub struct AccessLog<S> {
    inner: S,
}

/// Emits the line on drop: the body is dropped when it ended or when the client went away.
struct Line {
    id: Option<Arc<str>>,
    method: Method,
    path: String,
    status: StatusCode,
    upstream: Option<Arc<str>>,
    t0: Instant,
}

impl Drop for Line {
    fn drop(&mut self) {
        AccessLine {
            request_id: self.id.as_deref().unwrap_or("-"),
            method: self.method.as_str(),
            path: &self.path,
            status: self.status.as_u16(),
            upstream: self.upstream.as_deref().unwrap_or("-"),
            duration_ms: self.t0.elapsed().as_secs_f64() * 1e3,
        }
        .write();
    }
}

impl<S, B> Service<Request<B>> for AccessLog<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = S::Error;
    type Future = BoxFuture<Response<ProxyBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let ctx = RequestContext::of(req.extensions());
        let id = ctx.map(|c| c.id.clone());
        let t0 = ctx.map_or_else(Instant::now, |c| c.t0);
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            let line = Line {
                id,
                method,
                path,
                status: resp.status(),
                upstream: resp.extensions().get::<ServedBy>().map(|s| s.0.clone()),
                t0,
            };
            Ok(resp.map(|b| Hold::new(b, line).boxed_unsync()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LogFormat;
    use crate::logging::capture::{Capture, FixedTime};
    use crate::logging::dispatch;
    use std::time::Duration;
    use tracing_subscriber::EnvFilter;

    const STAMP: &str = "2026-12-03T11:58:47.123456Z";

    /// A line as the layer makes it: `elapsed` after `t0` (paused time) when it drops.
    async fn line_after(
        id: Option<&str>,
        method: Method,
        path: &str,
        status: u16,
        upstream: Option<&str>,
        elapsed: Duration,
    ) -> Line {
        let t0 = Instant::now();
        tokio::time::advance(elapsed).await;
        Line {
            id: id.map(Arc::from),
            method,
            path: path.to_string(),
            status: StatusCode::from_u16(status).unwrap(),
            upstream: upstream.map(Arc::from),
            t0,
        }
    }

    /// What the subscriber of `format` (ANSI styling or not) under `filter` writes for `line`.
    fn written(format: LogFormat, ansi: bool, filter: &str, line: Line) -> String {
        let out = Capture::default();
        let d = dispatch(
            format,
            ansi,
            EnvFilter::new(filter),
            out.clone(),
            FixedTime(STAMP.into()),
        );
        tracing::dispatcher::with_default(&d, || drop(line));
        out.text()
    }

    /// A line's values (`us`: its duration in microseconds) and what each format writes.
    type Case = (
        Option<&'static str>,
        Method,
        &'static str,
        u16,
        Option<&'static str>,
        u64,
        &'static str,
        &'static str,
    );

    /// Operators parse these lines: every byte of both formats is pinned, values with spaces,
    /// quotes and backslashes included (a client's `x-request-id` is any visible ASCII).
    #[tokio::test(start_paused = true)]
    async fn the_lines_are_pinned_byte_for_byte() {
        let cases: [Case; 4] = [
            (
                Some("0123456789abcdef0123456789abcdef"),
                Method::POST,
                "/v1/chat/completions",
                200,
                Some("http://127.0.0.1:8000"),
                12_345,
                "2026-12-03T11:58:47.123456Z  INFO goodput_proxy::access: access request_id=\"0123456789abcdef0123456789abcdef\" method=POST path=/v1/chat/completions status=200 upstream=\"http://127.0.0.1:8000\" duration_ms=12.3\n",
                "{\"timestamp\":\"2026-12-03T11:58:47.123456Z\",\"level\":\"INFO\",\"message\":\"access\",\"request_id\":\"0123456789abcdef0123456789abcdef\",\"method\":\"POST\",\"path\":\"/v1/chat/completions\",\"status\":200,\"upstream\":\"http://127.0.0.1:8000\",\"duration_ms\":\"12.3\",\"target\":\"goodput_proxy::access\"}\n",
            ),
            (
                None,
                Method::GET,
                "/v1/models",
                404,
                None,
                50,
                "2026-12-03T11:58:47.123456Z  INFO goodput_proxy::access: access request_id=\"-\" method=GET path=/v1/models status=404 upstream=\"-\" duration_ms=0.1\n",
                "{\"timestamp\":\"2026-12-03T11:58:47.123456Z\",\"level\":\"INFO\",\"message\":\"access\",\"request_id\":\"-\",\"method\":\"GET\",\"path\":\"/v1/models\",\"status\":404,\"upstream\":\"-\",\"duration_ms\":\"0.1\",\"target\":\"goodput_proxy::access\"}\n",
            ),
            (
                Some("a\"b\\c'd{e}"),
                Method::from_bytes(b"PURGE").unwrap(),
                "/v1/a b\"c\\d/é",
                503,
                Some("http://[::1]:9/x y\"z"),
                1_234_567_891,
                "2026-12-03T11:58:47.123456Z  INFO goodput_proxy::access: access request_id=\"a\\\"b\\\\c'd{e}\" method=PURGE path=/v1/a b\"c\\d/é status=503 upstream=\"http://[::1]:9/x y\\\"z\" duration_ms=1234567.9\n",
                "{\"timestamp\":\"2026-12-03T11:58:47.123456Z\",\"level\":\"INFO\",\"message\":\"access\",\"request_id\":\"a\\\"b\\\\c'd{e}\",\"method\":\"PURGE\",\"path\":\"/v1/a b\\\"c\\\\d/é\",\"status\":503,\"upstream\":\"http://[::1]:9/x y\\\"z\",\"duration_ms\":\"1234567.9\",\"target\":\"goodput_proxy::access\"}\n",
            ),
            (
                Some("tab\there\u{1b}[31m\u{7f}ü"),
                Method::DELETE,
                "/\u{1}\n",
                499,
                Some(""),
                0,
                "2026-12-03T11:58:47.123456Z  INFO goodput_proxy::access: access request_id=\"tab\\there\\u{1b}[31m\\u{7f}ü\" method=DELETE path=/\u{1}\n status=499 upstream=\"\" duration_ms=0.0\n",
                "{\"timestamp\":\"2026-12-03T11:58:47.123456Z\",\"level\":\"INFO\",\"message\":\"access\",\"request_id\":\"tab\\there\\u001b[31m\u{7f}ü\",\"method\":\"DELETE\",\"path\":\"/\\u0001\\n\",\"status\":499,\"upstream\":\"\",\"duration_ms\":\"0.0\",\"target\":\"goodput_proxy::access\"}\n",
            ),
        ];
        for (id, method, path, status, upstream, us, text, json) in cases {
            let d = Duration::from_micros(us);
            let line = line_after(id, method.clone(), path, status, upstream, d).await;
            assert_eq!(written(LogFormat::Text, false, "info", line), text);
            let line = line_after(id, method, path, status, upstream, d).await;
            assert_eq!(written(LogFormat::Json, false, "info", line), json);
        }
    }

    /// At a terminal the text line is styled (tracing-subscriber's colours).
    #[tokio::test(start_paused = true)]
    async fn the_terminal_line_is_pinned() {
        let line = line_after(
            Some("r1"),
            Method::POST,
            "/v1/completions",
            200,
            Some("http://u:1"),
            Duration::from_micros(2_050),
        )
        .await;
        assert_eq!(
            written(LogFormat::Text, true, "info", line),
            "\u{1b}[2m2026-12-03T11:58:47.123456Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[2mgoodput_proxy::access\u{1b}[0m\u{1b}[2m:\u{1b}[0m access \u{1b}[3mrequest_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"r1\" \u{1b}[3mmethod\u{1b}[0m\u{1b}[2m=\u{1b}[0mPOST \u{1b}[3mpath\u{1b}[0m\u{1b}[2m=\u{1b}[0m/v1/completions \u{1b}[3mstatus\u{1b}[0m\u{1b}[2m=\u{1b}[0m200 \u{1b}[3mupstream\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"http://u:1\" \u{1b}[3mduration_ms\u{1b}[0m\u{1b}[2m=\u{1b}[0m2.1\n"
        );
    }

    /// The line is written when the filter (`[log] level` or `RUST_LOG`) lets the target's
    /// INFO through, in either format.
    #[tokio::test(start_paused = true)]
    async fn the_level_filter_decides() {
        for (filter, shown) in [
            ("info", true),
            ("warn", false),
            ("info,goodput_proxy::access=off", false),
            ("warn,goodput_proxy::access=info", true),
            ("goodput_proxy=info", true),
            ("off", false),
            ("trace", true),
        ] {
            for format in [LogFormat::Text, LogFormat::Json] {
                let line = line_after(None, Method::GET, "/", 200, None, Duration::ZERO).await;
                let out = written(format, false, filter, line);
                assert_eq!(!out.is_empty(), shown, "{filter} {format:?}: {out}");
            }
        }
    }
}
