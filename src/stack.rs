//! The one tower stack, assembled in one place. Read it top to bottom: it is the order a
//! request travels, outermost first.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use tower::util::BoxCloneService;
use tower::ServiceBuilder;

use crate::config::Config;
use crate::error::BoxError;
use crate::layer::access_log::AccessLogLayer;
use crate::layer::collect::CollectLayer;
use crate::layer::error_response::ErrorResponseLayer;
use crate::layer::limit::InFlightLimitLayer;
use crate::layer::meter::{Meter, MeterLayer, RecordRejectionsLayer};
use crate::layer::request_id::RequestIdLayer;
use crate::layer::route::RouteLayer;
use crate::upstream::{Forward, Upstreams};

/// Every response body the proxy returns: boxed so a wrapper (the meter) can be slotted in.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The assembled stack as the listener sees it.
pub type ProxyService = BoxCloneService<Request<Incoming>, Response<ProxyBody>, Infallible>;

/// One boxed stage of the stack. Each layer is applied to a boxed inner service, so the type
/// checker proves each layer's bounds against one concrete type instead of the whole nest: the
/// nested `Wrapped<L, Wrapped<...>>` type made type-checking `build` take minutes of CPU and
/// gigabytes of memory (measured: about 10 CPU-minutes, 2.4 GB). A virtual call per layer per
/// request is noise next to the boxed future each layer already returns.
type Stage<B> = BoxCloneService<Request<B>, Response<ProxyBody>, crate::error::ProxyError>;

fn stage<S, B>(service: S) -> Stage<B>
where
    S: tower::Service<Request<B>, Response = Response<ProxyBody>, Error = crate::error::ProxyError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    BoxCloneService::new(service)
}

/// Builds the public stack for `config`, forwarding to `upstreams`, measured by `meter`.
/// Inner first (each stage boxes the one below, see [`Stage`]); read the comments bottom-up for
/// the order a request travels, outermost first.
pub fn build(config: &Config, upstreams: Arc<Upstreams>, meter: Arc<Meter>) -> ProxyService {
    use tower::Layer;
    let s = &config.server;
    // Innermost, around forwarding: it needs RequestFacts (model, stream) from collect,
    // may rewrite the collected body (usage injection), sees forwarding's typed errors
    // (connect failure, first-byte timeout), and wraps the upstream body as it leaves.
    let inner: Stage<Bytes> = stage(MeterLayer::new(meter.clone()).layer(Forward::new(upstreams)));
    // Bounded body read (413) + RequestFacts (model, stream, t0) for meter and shaping.
    let inner: Stage<Incoming> = stage(CollectLayer::new(s.max_body_bytes).layer(inner));
    // Unknown paths get 404 before the body is read or the upstream touched.
    let inner: Stage<Incoming> = stage(RouteLayer::new(&s.paths).layer(inner));
    // AUTH: an auth layer belongs here: after errors are mapped, before any work is spent.
    // Shed before reading the body; the permit lives until the response body ends.
    let inner: Stage<Incoming> =
        stage(InFlightLimitLayer::new(s.max_in_flight, s.retry_after.as_secs()).layer(inner));
    // Records what the layers below answer themselves (404, 413, 503 shed) as `rejected`:
    // inside the error mapping so it still sees the typed error, outside everything that
    // can reject. Requests the meter takes over are left to the meter.
    let inner: Stage<Incoming> = stage(RecordRejectionsLayer::new(meter).layer(inner));
    let service = ServiceBuilder::new()
        // Outermost: take t0 before anything spends time; stamp the id on every response.
        .layer(RequestIdLayer)
        // Sees the final status (errors included) and holds its line until the body ends.
        .layer(AccessLogLayer)
        // Turns every inner ProxyError into the one OpenAI-style error response.
        .layer(ErrorResponseLayer)
        .service(inner);
    BoxCloneService::new(service)
}
