//! Reads the request body up front, bounded by `server.max_body_bytes` (413 beyond) and by the
//! body idle timeout (408 when the client pauses longer between two pieces), and writes what
//! the meter and request shaping need ([`RequestFacts`]) into the request context.
//!
//! Why collect: shaping must read `model` and `stream` (and may rewrite the JSON later), and a
//! connect failure can only be retried on another replica if the body can be sent again.
//! OpenAI request bodies are small next to the responses, so the cost is a copy of kilobytes.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response};
use http_body::Body;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use super::{Around, ResponseFuture, Wrapped};
use crate::body::BoxError;
use crate::body::ProxyBody;
use crate::context::{RequestContext, RequestFacts};
use crate::error::ProxyError;
use goodput_measure::agent::ToolSet;
use goodput_measure::request::{peek_request, RequestFields, RequestPeek};
use goodput_measure::usage::injection;

#[derive(Debug, Clone, Copy)]
pub struct CollectLayer {
    limit: u64,
    idle: Duration,
    facts: bool,
}

impl CollectLayer {
    /// At most `limit` bytes, and no pause longer than `idle` between two body frames.
    pub fn new(limit: u64, idle: Duration) -> Self {
        Self {
            limit,
            idle,
            facts: true,
        }
    }

    /// Whether to read the [`RequestFacts`] at all: only the meter and usage injection use
    /// them, so with metering off the body is read and forwarded without being parsed.
    pub fn with_facts(mut self, facts: bool) -> Self {
        self.facts = facts;
        self
    }
}

impl<S> Layer<S> for CollectLayer {
    type Service = Collect<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(*self, inner)
    }
}

pub type Collect<S> = Wrapped<CollectLayer, S>;

impl<S, B> Around<S, B> for CollectLayer
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = ProxyError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type InnerBody = Bytes;

    fn around(&self, inner: &mut S, req: Request<B>) -> ResponseFuture {
        // The ready service is the one that must be called (tower's contract).
        let clone = inner.clone();
        let mut inner = std::mem::replace(inner, clone);
        let (limit, idle, facts) = (self.limit, self.idle, self.facts);
        // Taken apart before the future is made, which then holds the parts once (taken apart
        // inside, the request was held twice: as captured and as its parts).
        let (parts, body) = req.into_parts();
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit) {
            return super::reject(ProxyError::BodyTooLarge { limit });
        }
        Box::pin(async move {
            let bytes = read_body(body, limit, idle).await?;
            if let Some(ctx) = RequestContext::of(&parts.extensions).filter(|_| facts) {
                ctx.set_facts(read_facts(&bytes));
            }
            inner.call(Request::from_parts(parts, bytes)).await
        })
    }
}

/// What the proxy reads from a request body: one pass over a UTF-8 body for the facts, the
/// tools and usage injection's rewrite (`RequestFields`); a body that is not UTF-8 (no JSON
/// to the engine, which answers 400; never rewritten) read by each reader's own pass.
fn read_facts(bytes: &Bytes) -> RequestFacts {
    let (peek, tools, usage_injection) = match std::str::from_utf8(bytes) {
        Ok(text) => match RequestFields::read(text) {
            Some(f) => (
                f.peek(),
                f.tools.and_then(ToolSet::from_raw),
                injection(text, &f),
            ),
            None => (RequestPeek::NOT_AN_OBJECT, None, None),
        },
        Err(_) => (peek_request(bytes), ToolSet::from_request(bytes), None),
    };
    let RequestPeek { model, stream, n } = peek;
    RequestFacts {
        model,
        stream,
        n,
        tools,
        usage_injection,
    }
}

/// The whole body, frame by frame: 413 as soon as it passes `limit`, 408 when no frame comes
/// within `idle` of the previous one (or of the head). Trailers are dropped (OpenAI requests
/// have none and the collected request is sent with a length).
async fn read_body<B>(body: B, limit: u64, idle: Duration) -> Result<Bytes, ProxyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    // Armed only while a frame is awaited, from the poll that found none: a frame that is
    // ready when asked for (a small body comes with the head) costs no clock read and no
    // timer. Boxed: most requests never make one.
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    let mut waiting = false;
    // Most bodies come in one frame: it is the body (no vector for it); more are joined.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<Bytes> = Vec::new();
    let mut total: u64 = 0;
    loop {
        let next = std::future::poll_fn(|cx| {
            if let Poll::Ready(frame) = body.as_mut().poll_frame(cx) {
                waiting = false;
                return Poll::Ready(Some(frame));
            }
            let by = Instant::now() + idle;
            let t = match timer.as_mut() {
                Some(t) if waiting => t,
                Some(t) => {
                    t.as_mut().reset(by);
                    t
                }
                None => timer.insert(Box::pin(tokio::time::sleep_until(by))),
            };
            waiting = true;
            t.as_mut().poll(cx).map(|()| None)
        });
        let frame = match next.await {
            None => {
                return Err(ProxyError::BodyTimeout {
                    ms: idle.as_millis() as u64,
                })
            }
            Some(None) => break,
            Some(Some(Err(e))) => return Err(ProxyError::ClientBody(e.into())),
            Some(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            total = total.saturating_add(data.len() as u64);
            if total > limit {
                return Err(ProxyError::BodyTooLarge { limit });
            }
            match first {
                None => first = Some(data),
                Some(_) => more.push(data),
            }
        }
    }
    Ok(match first {
        None => Bytes::new(),
        Some(one) if more.is_empty() => one,
        Some(one) => {
            let mut all = bytes::BytesMut::with_capacity(total as usize);
            all.extend_from_slice(&one);
            for p in more {
                all.extend_from_slice(&p);
            }
            all.freeze()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;

    fn chunks(parts: &[&'static str]) -> Vec<Result<Frame<Bytes>, BoxError>> {
        parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect()
    }

    #[tokio::test]
    async fn reads_every_frame_up_to_the_limit() {
        let body = StreamBody::new(futures_util::stream::iter(chunks(&["ab", "cd", "e"])));
        let got = read_body(body, 5, Duration::from_secs(1)).await.unwrap();
        assert_eq!(got, "abcde");
        let got = read_body(Full::new(Bytes::new()), 0, Duration::from_secs(1)).await;
        assert_eq!(got.unwrap(), "");
    }

    #[tokio::test]
    async fn one_byte_over_the_limit_is_413() {
        let body = StreamBody::new(futures_util::stream::iter(chunks(&["ab", "cd", "ef"])));
        let err = read_body(body, 5, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProxyError::BodyTooLarge { limit: 5 }),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_longer_than_idle_is_408_a_shorter_one_is_not() {
        use futures_util::StreamExt;
        let slow = |pause_ms: u64| {
            let s = futures_util::stream::iter(chunks(&["a", "b"])).then(move |f| async move {
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                f
            });
            StreamBody::new(s)
        };
        let idle = Duration::from_millis(100);
        assert_eq!(read_body(slow(99), 10, idle).await.unwrap(), "ab");
        let err = read_body(slow(101), 10, idle).await.unwrap_err();
        assert!(matches!(err, ProxyError::BodyTimeout { ms: 100 }), "{err}");
        assert_eq!(err.status(), http::StatusCode::REQUEST_TIMEOUT);
    }
}
