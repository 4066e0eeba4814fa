//! Response bodies shared by the layers: the boxed body every response is, and the usage
//! strip body (changes the bytes). The metered body that wraps it is the recorder's
//! (`recorder::body`); the SSE parser the meter feeds is `goodput_measure::sse`.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

pub mod strip;

pub use strip::{StripBody, StripFacts};

/// The error of a boxed body or service: any error, sendable.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body the proxy returns: boxed so a wrapper (the meter) can be slotted in.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;
