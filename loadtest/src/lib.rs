//! goodput-loadtest: phased, open-loop load with exact client-side percentiles, an HTML report
//! and a client / proxy / engine comparison. The binary (`main.rs`) is a thin shell
//! over this library so integration tests can drive a run in-process.

pub mod autoscale;
pub mod bench;
pub mod cli;
pub mod client;
pub mod metrics;
pub mod progress;
pub mod record;
pub mod report;
pub mod request;
pub mod runner;
pub mod scenario;
pub mod schedule;
pub mod soak;
