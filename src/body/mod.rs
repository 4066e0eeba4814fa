//! Response bodies: the metering body wrapper (the SSE parser it feeds is `goodput_measure::sse`).

pub mod metered;

pub use metered::{MeteredBody, OnFinish, OnGap};
