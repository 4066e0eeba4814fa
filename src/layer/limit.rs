//! The in-flight limit: beyond `server.max_in_flight` requests (counted until their response
//! body ends, so long streams count), new requests get 503 with `Retry-After` at once.
//!
//! Shedding happens before the body is read, so an overloaded proxy spends nothing on them.

use std::sync::Arc;

use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use super::hold::Hold;
use super::{reject, Around, ResponseFuture, Wrapped};
use crate::body::ProxyBody;
use crate::error::ProxyError;

#[derive(Debug, Clone)]
pub struct InFlightLimitLayer {
    permits: Arc<Semaphore>,
    limit: usize,
    retry_after_s: u64,
}

impl InFlightLimitLayer {
    pub fn new(limit: usize, retry_after_s: u64) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            retry_after_s,
        }
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(self.clone(), inner)
    }
}

pub type InFlightLimit<S> = Wrapped<InFlightLimitLayer, S>;

impl<S, B> Around<S, B> for InFlightLimitLayer
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type InnerBody = B;

    fn around(&self, inner: &mut S, req: Request<B>) -> ResponseFuture {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return reject(ProxyError::Overloaded {
                limit: self.limit,
                retry_after_s: self.retry_after_s,
            });
        };
        let fut = inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|b| Hold::new(b, permit).boxed_unsync()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::{service_fn, ServiceExt};

    fn ok_service() -> impl Service<
        Request<()>,
        Response = Response<ProxyBody>,
        Error = ProxyError,
        Future = impl Send + 'static,
    > + Clone {
        service_fn(|_req: Request<()>| async {
            let body = Full::new(Bytes::from_static(b"hi"))
                .map_err(|never| match never {})
                .boxed_unsync();
            Ok::<_, ProxyError>(Response::new(body))
        })
    }

    #[tokio::test]
    async fn the_permit_lives_as_long_as_the_response_body() {
        let svc = InFlightLimitLayer::new(1, 4).layer(ok_service());
        let first = svc.clone().oneshot(Request::new(())).await.unwrap();
        match svc.clone().oneshot(Request::new(())).await {
            Err(ProxyError::Overloaded {
                limit: 1,
                retry_after_s: 4,
            }) => {}
            other => panic!("expected Overloaded, got {:?}", other.map(|r| r.status())),
        }
        drop(first);
        assert!(svc.oneshot(Request::new(())).await.is_ok());
    }
}
