//! Response bodies: the incremental SSE parser (pure) and the metering body wrapper.

pub mod metered;
pub mod sse;

pub use metered::MeteredBody;
pub use sse::{SseEvent, SseParser};
