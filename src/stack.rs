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

/// Builds the public stack for `config`, forwarding to `upstreams`, measured by `meter`.
pub fn build(config: &Config, upstreams: Arc<Upstreams>, meter: Arc<Meter>) -> ProxyService {
    let s = &config.server;
    let service = ServiceBuilder::new()
        // Outermost: take t0 before anything spends time; stamp the id on every response.
        .layer(RequestIdLayer)
        // Sees the final status (errors included) and holds its line until the body ends.
        .layer(AccessLogLayer)
        // Turns every inner ProxyError into the one OpenAI-style error response.
        .layer(ErrorResponseLayer)
        // Records what the layers below answer themselves (404, 413, 503 shed) as `rejected`:
        // inside the error mapping so it still sees the typed error, outside everything that
        // can reject. Requests the meter takes over are left to the meter.
        .layer(RecordRejectionsLayer::new(meter.clone()))
        // AUTH: an auth layer belongs here: after errors are mapped, before any work is spent.
        // Shed before reading the body; the permit lives until the response body ends.
        .layer(InFlightLimitLayer::new(s.max_in_flight, s.retry_after_s))
        // Unknown paths get 404 before the body is read or the upstream touched.
        .layer(RouteLayer::new(&s.paths))
        // Bounded body read (413) + RequestFacts (model, stream, t0) for meter and shaping.
        .layer(CollectLayer::new(s.max_body_bytes))
        // Innermost, around forwarding: it needs RequestFacts (model, stream) from collect,
        // may rewrite the collected body (usage injection), sees forwarding's typed errors
        // (connect failure, first-byte timeout), and wraps the upstream body as it leaves.
        .layer(MeterLayer::new(meter))
        .service(Forward::new(upstreams));
    BoxCloneService::new(service)
}
