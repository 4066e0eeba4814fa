//! Usage injection: for a streaming generation request whose client did not ask for usage, the
//! collected body with `stream_options.include_usage` (see `measure::usage` for when it
//! applies) is offered to forwarding ([`UsageOffer`]), which sends it or the client's body by
//! the engine of the replica it picked (`upstream::usage::usage_for`) and says which in the
//! response's extensions ([`Offered`](crate::upstream::forward::Offered): `Injected` for a 2xx
//! answer to an injected request): the recorder's body then strips the usage chunk again, so
//! the client gets the stream it asked for and the meter exact token counts. The response
//! passes this layer untouched (no future of its own).
//!
//! Innermost, after collect (it rewrites the collected body) and right before forwarding.

use bytes::Bytes;
use http::{Request, Response};
use tower::{Layer, Service};

use super::measure::is_generation;
use super::{Around, ResponseFuture, Wrapped};
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::error::ProxyError;
use crate::upstream::usage::UsageOffer;

#[derive(Debug, Clone)]
pub struct UsageLayer {
    /// `[measure] usage_injection = "auto"`.
    inject: bool,
}

impl UsageLayer {
    pub fn new(inject: bool) -> Self {
        Self { inject }
    }
}

impl<S> Layer<S> for UsageLayer {
    type Service = UsageInjection<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Wrapped::new(self.clone(), inner)
    }
}

pub type UsageInjection<S> = Wrapped<UsageLayer, S>;

impl<S> Around<S, Bytes> for UsageLayer
where
    S: Service<
        Request<Bytes>,
        Response = Response<ProxyBody>,
        Error = ProxyError,
        Future = ResponseFuture,
    >,
{
    type InnerBody = Bytes;

    fn around(&self, inner: &mut S, mut req: Request<Bytes>) -> ResponseFuture {
        let Some(ctx) = RequestContext::of(req.extensions()).cloned() else {
            return inner.call(req);
        };
        let injected = match ctx.facts() {
            Some(f) if self.inject && f.stream && is_generation(req.uri().path()) => {
                f.usage_injection.map(|i| i.apply(req.body()))
            }
            _ => None,
        };
        let Some(body) = injected else {
            return inner.call(req);
        };
        req.extensions_mut().insert(UsageOffer(Bytes::from(body)));
        inner.call(req)
    }
}
