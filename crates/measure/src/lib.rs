//! goodput-measure, the pure measurement core that the proxy and the load generator share, so
//! that client and proxy measure by one definition (DESIGN.md, "Definitions"): the SSE parser,
//! chunk inspection, timelines, outcomes, SLOs and goodput, exact statistics, raw records, and
//! usage-injection support. Bytes and instants in, values out; no sockets.

pub mod agent;
pub mod engine;
pub mod engine_timings;
pub mod inspect;
pub mod meter;
pub mod outcome;
pub mod prom;
pub mod record;
pub mod request;
pub mod scan;
pub mod seconds;
pub mod slo;
pub mod sse;
pub mod stats;
pub mod trace;
pub mod usage;
pub mod window;

pub use inspect::{
    inspect_chunk, inspect_response, scan_event, scan_event_logged, ChoiceInfo, ChunkInfo,
    ChunkKind, EventScan, Phases, ResponseInfo, TokenLog, Usage,
};
pub use meter::{Measurement, StreamMeter};
pub use outcome::{Ending, FinishReason, Outcome};
pub use slo::{judge, Slo, SloTable, SloVerdict};
pub use stats::{percentile, summarize, Summary};

#[cfg(test)]
pub(crate) mod fixtures;

/// The meter's framing property, shared with the fuzz target `meter`.
#[cfg(test)]
mod meter_props;
