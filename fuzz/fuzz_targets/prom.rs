//! The engine-metrics parser (`goodput_measure::prom::parse`): any text parses without a panic,
//! and a page it accepts survives being written back out unchanged: the property of
//! `crates/measure/src/prom/props.rs` (proptests in CI), included by path.
#![no_main]

use goodput_measure::prom::{parse, Family, Kind};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/measure/src/prom/props.rs"]
#[allow(dead_code)]
mod props;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = props::check(text) {
        panic!("{e}\ninput {text:?}");
    }
});
