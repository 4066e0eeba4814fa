//! Reads the request body up front, bounded by `server.max_body_bytes` (413 beyond), and writes
//! what the meter and request shaping need ([`RequestFacts`]) into the request context.
//!
//! Why collect: shaping must read `model` and `stream` (and may rewrite the JSON later), and a
//! connect failure can only be retried on another replica if the body can be sent again.
//! OpenAI request bodies are small next to the responses, so the cost is a copy of kilobytes.

use bytes::Bytes;
use http::{header, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower::{Layer, Service};

use super::context::{RequestContext, RequestFacts};
use super::{Around, ResponseFuture, Wrapped};
use crate::error::{BoxError, ProxyError};
use crate::stack::ProxyBody;
use goodput_measure::request::{peek_request, RequestPeek};

#[derive(Debug, Clone, Copy)]
pub struct CollectLayer {
    limit: u64,
}

impl CollectLayer {
    pub fn new(limit: u64) -> Self {
        Self { limit }
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
        let limit = self.limit;
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let declared = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit) {
                return Err(ProxyError::BodyTooLarge { limit });
            }
            let max = usize::try_from(limit).unwrap_or(usize::MAX);
            let bytes = match Limited::new(body, max).collect().await {
                Ok(c) => c.to_bytes(),
                Err(e) if e.is::<LengthLimitError>() => {
                    return Err(ProxyError::BodyTooLarge { limit })
                }
                Err(e) => return Err(ProxyError::ClientBody(e)),
            };
            let RequestPeek { model, stream } = peek_request(&bytes);
            if let Some(ctx) = RequestContext::of(&parts.extensions) {
                ctx.set_facts(RequestFacts { model, stream });
            }
            inner.call(Request::from_parts(parts, bytes)).await
        })
    }
}
