#![forbid(unsafe_code)]
pub mod scenario;
pub mod schedule;
