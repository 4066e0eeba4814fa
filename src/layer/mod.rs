//! Tower layers, one concern each. `stack.rs` says in which order they run and why.
//!
//! The layers that can answer on their own (route, limit, collect) and usage injection share
//! one service shape, [`Wrapped`]: readiness passes through to the inner service and `call`
//! is the layer's [`Around::around`]; an early answer is a [`reject`] future. The context,
//! access log, error mapping and measure layers have their own service types.

use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use crate::body::ProxyBody;
use crate::error::ProxyError;

pub mod access_log;
pub mod auth;
pub mod collect;
pub mod context;
pub mod error_response;
pub mod hold;
pub mod limit;
pub mod measure;
pub mod route;
pub mod tenant_limit;
pub mod usage;

/// The boxed future every layer here returns: layers are small and the box keeps their types
/// readable; one allocation per layer per request is noise next to a network hop.
pub type BoxFuture<T, E> = futures_util::future::BoxFuture<'static, Result<T, E>>;

/// What every [`Wrapped`] service's `call` returns.
pub type ResponseFuture = BoxFuture<Response<ProxyBody>, ProxyError>;

/// What one layer does with a request around its inner service `S`.
pub trait Around<S, B> {
    /// The request body `S` takes (collect turns any body into `Bytes`; the others pass `B`).
    type InnerBody;

    /// Either answers itself (a [`reject`]) or calls `inner`, which is ready.
    fn around(&self, inner: &mut S, req: Request<B>) -> ResponseFuture;
}

/// A layer `L` (its configuration and shared state) applied to the inner service `S`.
#[derive(Debug, Clone)]
pub struct Wrapped<L, S> {
    layer: L,
    inner: S,
}

impl<L, S> Wrapped<L, S> {
    pub fn new(layer: L, inner: S) -> Self {
        Self { layer, inner }
    }
}

impl<L, S, B> Service<Request<B>> for Wrapped<L, S>
where
    L: Around<S, B>,
    S: Service<Request<L::InnerBody>, Error = ProxyError>,
{
    type Response = Response<ProxyBody>;
    type Error = ProxyError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> ResponseFuture {
        self.layer.around(&mut self.inner, req)
    }
}

/// The answer of a layer that does not call its inner service: the typed error, for the
/// error layer to map.
pub fn reject(err: ProxyError) -> ResponseFuture {
    Box::pin(std::future::ready(Err(err)))
}
