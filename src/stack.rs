//! The one tower stack, assembled in one place. Read it top to bottom: it is the order a
//! request travels, outermost first.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use hyper::body::Incoming;
use tower::util::Either;
use tower::Service;

use crate::auth::Auth;
use crate::body::ProxyBody;
use crate::config::Config;
use crate::error::ProxyError;
use crate::layer::access_log::AccessLogLayer;
use crate::layer::auth::AuthLayer;
use crate::layer::collect::CollectLayer;
use crate::layer::context::ContextLayer;
use crate::layer::error_response::ErrorResponseLayer;
use crate::layer::limit::InFlightLimitLayer;
use crate::layer::measure::MeasureLayer;
use crate::layer::route::RouteLayer;
use crate::layer::tenant_limit::TenantLimitLayer;
use crate::layer::usage::UsageLayer;
use crate::layer::BoxFuture;
use crate::limits::Limits;
use crate::recorder::Recorder;
use crate::upstream::forward::Readers;
use crate::upstream::headers::Forwarded;
use crate::upstream::{Forward, Upstreams};

/// The assembled stack as the listener sees it.
pub type ProxyService = Boxed<Incoming, Infallible>;

/// One boxed stage of the stack. Each layer is applied to a boxed inner service, so the type
/// checker proves each layer's bounds against one concrete type instead of the whole nest: the
/// nested `Wrapped<L, Wrapped<...>>` type made type-checking `build` take minutes of CPU and
/// gigabytes of memory (measured: about 10 CPU-minutes, 2.4 GB). A virtual call per layer per
/// request is noise next to the boxed future each layer already returns.
type Stage<B> = Boxed<B, ProxyError>;

/// A cloneable boxed service whose future is the boxed future every layer returns anyway.
/// Like tower's `BoxCloneService`, except that it does not box that future a second time
/// (`BoxCloneService::new` boxes whatever future it is given: one more allocation per stage
/// per request).
pub struct Boxed<B, E>(Box<dyn CloneService<B, E>>);

type Answer<E> = BoxFuture<Response<ProxyBody>, E>;

trait CloneService<B, E>:
    Service<Request<B>, Response = Response<ProxyBody>, Error = E, Future = Answer<E>> + Send
{
    fn clone_box(&self) -> Box<dyn CloneService<B, E>>;
}

impl<S, B, E> CloneService<B, E> for S
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = E, Future = Answer<E>>
        + Clone
        + Send
        + 'static,
{
    fn clone_box(&self) -> Box<dyn CloneService<B, E>> {
        Box::new(self.clone())
    }
}

impl<B, E> Clone for Boxed<B, E> {
    fn clone(&self) -> Self {
        Self(self.0.clone_box())
    }
}

impl<B, E> Service<Request<B>> for Boxed<B, E> {
    type Response = Response<ProxyBody>;
    type Error = E;
    type Future = Answer<E>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Answer<E> {
        self.0.call(req)
    }
}

impl<B: 'static, E: 'static> Boxed<B, E> {
    /// Boxes any service, boxing its future (as `BoxCloneService::new` does): for services
    /// whose future is not [`Answer`] already, e.g. the admin routes.
    pub fn new<S>(service: S) -> Self
    where
        S: Service<Request<B>, Response = Response<ProxyBody>, Error = E> + Clone + Send + 'static,
        S::Future: Send + 'static,
    {
        use tower::ServiceExt;
        stage(service.map_future(|f| Box::pin(f) as Answer<E>))
    }
}

fn stage<S, B, E>(service: S) -> Boxed<B, E>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = E, Future = Answer<E>>
        + Clone
        + Send
        + 'static,
{
    Boxed(Box::new(service))
}

/// Builds the public stack for `config`, forwarding to `upstreams`, measured by `recorder`.
/// Inner first (each stage boxes the one below, see [`Stage`]); read the comments bottom-up for
/// the order a request travels, outermost first. With `[measure] enabled = false` the measure
/// and usage stages are left out: the proxy forwards without metering. `auth`: the live keys
/// and tenants, `None` when `[auth]` is off (the auth and tenant stages are left out).
pub fn build(
    config: &Config,
    limits: &Limits,
    forwarded: Forwarded,
    upstreams: Arc<Upstreams>,
    recorder: Arc<Recorder>,
    auth: Option<Arc<Auth>>,
) -> ProxyService {
    use tower::Layer;
    let s = &config.server;
    let measured = recorder.enabled();
    // Forwarding tells in the response what only the recorder and the access log read.
    let readers = Readers {
        recorder: measured,
        access_log: config.log.access,
    };
    let forward = Forward::new(upstreams, forwarded, readers);
    // Innermost, right before forwarding: it rewrites the collected body (usage injection);
    // forwarding tells the recorder whether it was sent (`Routed`). Not a boxed stage:
    // collect clones its inner service for every request (it calls it after the body is
    // read), and a clone of these two is a reference count, where a boxed stage's clone is an
    // allocation (freed again at the request's end).
    let inner = if measured {
        let usage = UsageLayer::new(recorder.usage_injection());
        Either::Left(usage.layer(forward))
    } else {
        Either::Right(forward)
    };
    // Bounded body read (413, 408 on a stalled upload); model and stream into the context for
    // measure and shaping (not read when nothing is measured).
    let collect = CollectLayer::new(s.max_body_bytes, limits.body_idle_timeout);
    let inner: Stage<Incoming> = stage(collect.with_facts(measured).layer(inner));
    // Unknown paths get 404 before the body is read or the upstream touched.
    let inner: Stage<Incoming> = stage(RouteLayer::new(&s.paths).layer(inner));
    // Shed before reading the body; the permit lives until the response body ends.
    let inner: Stage<Incoming> =
        stage(InFlightLimitLayer::new(s.max_in_flight, s.retry_after.as_secs()).layer(inner));
    // Per-tenant limits (429), beside the in-flight cap and outside it (a tenant's refused
    // request takes no global permit); they need auth's tenant, so they sit inside auth.
    // Auth: inside measure (a 401 is recorded `rejected` from its typed error, tenant
    // `none`), before any other work is spent on the request: no permit, no route, no body.
    let inner: Stage<Incoming> = match auth {
        Some(auth) => {
            let limited = stage(TenantLimitLayer::new(s.retry_after.as_secs()).layer(inner));
            stage(AuthLayer::new(auth).layer(limited))
        }
        None => inner,
    };
    // The one place that records: inside the error mapping so it sees every typed error
    // (rejections of the layers below, forwarding errors), outside everything that can answer
    // on its own; it wraps the response body to finish the record at its end or drop.
    let inner: Stage<Incoming> = if measured {
        stage(MeasureLayer::new(recorder).layer(inner))
    } else {
        inner
    };
    // Turns every inner ProxyError into the one OpenAI-style error response.
    let inner: ProxyService = stage(ErrorResponseLayer.layer(inner));
    // Sees the final status (errors included) and holds its line until the body ends; left
    // out with `[log] access = false`.
    let inner: ProxyService = if config.log.access {
        stage(AccessLogLayer.layer(inner))
    } else {
        inner
    };
    // Outermost: take t0 before anything spends time, create the request context (the one
    // extension every layer reads); stamp the id on every response.
    stage(ContextLayer.layer(inner))
}
