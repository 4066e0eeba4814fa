//! The request rewriter (usage injection, `goodput_measure::usage::inject_include_usage`):
//! any body keeps the properties of `crates/measure/src/usage/props.rs` (a proptest in CI),
//! included by path: a rewrite changes exactly `stream_options.include_usage`, is idempotent,
//! never touches a non-stream or a non-JSON body, and a plain stream is always rewritten.
#![no_main]

use goodput_measure::agent::ToolSet;
use goodput_measure::request::{peek_request, RequestFields, RequestPeek};
use goodput_measure::usage::{inject_include_usage, injection};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/measure/src/usage/props.rs"]
#[allow(dead_code)]
mod props;

fuzz_target!(|body: &[u8]| {
    if let Err(e) = props::check(body) {
        panic!("{e}\nbody {:?}", String::from_utf8_lossy(body));
    }
});
