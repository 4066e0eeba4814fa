//! Per-tenant limits (`[auth.tenants.NAME] max_in_flight`, `tokens_per_minute`; the rules are
//! in `auth::tenant`): a tenant over one gets 429 with `Retry-After` at once, before the body
//! is read. Requests without a tenant (auth off) pass untouched.
//!
//! Outside the global in-flight cap, so a tenant's refused request takes no global permit;
//! the tenant's permit lives in the response body, until the stream ends.

use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::hold::Hold;
use super::{reject, Around, ResponseFuture, Wrapped};
use crate::auth::tenant::Refusal;
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::error::ProxyError;

#[derive(Debug, Clone)]
pub struct TenantLimitLayer {
    /// `Retry-After` of an in-flight refusal (`server.retry_after_s`, as the global cap's).
    retry_after_s: u64,
}

impl TenantLimitLayer {
    pub fn new(retry_after_s: u64) -> Self {
        Self { retry_after_s }
    }
}

impl<S> Layer<S> for TenantLimitLayer {
    type Service = TenantLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(self.clone(), inner)
    }
}

pub type TenantLimit<S> = Wrapped<TenantLimitLayer, S>;

impl<S, B> Around<S, B> for TenantLimitLayer
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type InnerBody = B;

    fn around(&self, inner: &mut S, req: Request<B>) -> ResponseFuture {
        let tenant = RequestContext::of(req.extensions()).and_then(|c| c.tenant().cloned());
        let Some(tenant) = tenant else {
            let fut = inner.call(req);
            return Box::pin(fut);
        };
        let admission = match tenant.admit(Instant::now()) {
            Ok(a) => a,
            Err(refusal) => {
                let retry_after_s = match refusal {
                    Refusal::InFlight { .. } => self.retry_after_s.max(1),
                    Refusal::Tokens { retry_after_s, .. } => retry_after_s,
                };
                return reject(ProxyError::RateLimited {
                    tenant: tenant.name.clone(),
                    refusal,
                    retry_after_s,
                });
            }
        };
        let fut = inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|b| Hold::new(b, admission).boxed_unsync()))
        })
    }
}
