//! Response bodies: the usage strip body (changes the bytes) and the metered body outside it
//! (only watches). The SSE parser the meter feeds is `goodput_measure::sse`.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

pub mod metered;
pub mod strip;

pub use metered::{MeteredBody, OnFinish, OnGap};
pub use strip::{StripBody, StripReport};

/// The error of a boxed body or service: any error, sendable.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body the proxy returns: boxed so a wrapper (the meter) can be slotted in.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;
