//! The load generator's integration tests, in ONE binary (one link instead of one per file).
//! Add a test file as a module here. The headless-Chromium test is `#[ignore]`d; run it alone
//! with `cargo test -p goodput-loadtest --test it chromium -- --ignored`. The ClickHouse tests
//! are `#[ignore]`d too (they need a server): `.ci/run` runs them as
//! `cargo test -p goodput-loadtest --test it clickhouse:: -- --ignored --test-threads=1`.

// Test code through and through: its helpers unwrap too (clippy's allow-unwrap-in-tests covers
// only `#[test]` functions and `#[cfg(test)]` modules).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod chromium;
mod clickhouse;
mod client_stub;
mod compare_fake_proxy;
mod proxy_e2e;
mod proxy_stats_agree;
mod sim_e2e;
mod support;
