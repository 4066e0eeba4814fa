//! The root crate's integration tests, in ONE binary (one link instead of one per file).
//! Add a test file as a module here; shared helpers live in `support/`.

// Test code through and through: its helpers unwrap too (clippy's allow-unwrap-in-tests covers
// only `#[test]` functions and `#[cfg(test)]` modules).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod admin_auth;

mod attack;

mod compare_live;
mod dashboard;
mod discovery;
mod engine_fleet;
mod engine_metrics;
mod engine_streams;
mod measure_alloc;
mod measure_body;
mod meter_agent;
mod meter_contract;
mod meter_models;
mod meter_outcomes;
mod meter_records;
mod meter_timing;
mod meter_usage;
mod proxy_cli;
mod proxy_engine_options;
mod proxy_errors;
mod proxy_forward;
mod proxy_lifecycle;
mod proxy_sim;
mod proxy_tls;
mod route;
mod scale;
mod sim_agent;
mod sim_cache;
mod sim_cli;
mod sim_engine;
mod sim_faults;
mod sim_fidelity;
mod sim_options;
mod sim_pack;
mod sim_stream;
mod trace;
mod upstream_tls;
