//! Response bodies: the usage strip body (changes the bytes) and the metered body outside it
//! (only watches). The SSE parser the meter feeds is `goodput_measure::sse`.

pub mod metered;
pub mod strip;

pub use metered::{MeteredBody, OnFinish, OnGap};
pub use strip::{StripBody, StripReport};
