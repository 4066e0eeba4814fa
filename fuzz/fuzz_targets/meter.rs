//! The event inspection as the meter applies it: any body, streamed or JSON (first byte),
//! framed anywhere (the next bytes pick the cuts), measures the same as in one frame: the
//! property of `crates/measure/src/meter_props.rs` (a proptest in CI), included by path.
#![no_main]

use goodput_measure::{Ending, Measurement, StreamMeter};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/measure/src/meter_props.rs"]
#[allow(dead_code)]
mod props;

fuzz_target!(|input: &[u8]| {
    let [mode, c1, c2, c3, body @ ..] = input else {
        return;
    };
    let cuts = [usize::from(*c1) * 7, usize::from(*c2) * 31, usize::from(*c3) * 131];
    if let Err(e) = props::check(mode & 1 == 1, body, &cuts) {
        panic!("{e}");
    }
});
