//! Response bodies: the incremental SSE parser (pure), the usage strip body (changes the
//! bytes) and the metered body outside it (only watches).

pub mod metered;
pub mod sse;
pub mod strip;

pub use metered::{MeteredBody, OnFinish, OnGap};
pub use sse::{SseEvent, SseParser};
pub use strip::{StripBody, StripReport};
