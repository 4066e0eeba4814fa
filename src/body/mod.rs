//! The response body type every layer returns (boxed, so the recorder's metered body can be
//! slotted in) and its error. The metered body is the recorder's (`recorder::body`); the SSE
//! parser and the usage strip it drives are `goodput_measure`'s (`sse`, `meter::strip`).

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

/// The error of a boxed body or service: any error, sendable.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body the proxy returns: boxed so a wrapper (the meter) can be slotted in.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;
