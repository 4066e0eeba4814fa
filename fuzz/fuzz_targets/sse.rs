//! The SSE parser: any bytes, cut anywhere (the first byte picks the cut stride), give the same
//! events and the same discard count as in one chunk and byte by byte; nothing panics. The
//! same property as the proptest `sse::tests::any_split_yields_the_same_events` (in CI).
#![no_main]

use goodput_measure::sse::SseParser;
use libfuzzer_sys::fuzz_target;

type Ev = (Option<Vec<u8>>, Vec<u8>);

fn events(chunks: &[&[u8]]) -> (Vec<Ev>, u64) {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, |e| out.push((e.event.map(<[u8]>::to_vec), e.data.to_vec())));
    }
    p.finish(|e| out.push((e.event.map(<[u8]>::to_vec), e.data.to_vec())));
    (out, p.discarded())
}

fuzz_target!(|input: &[u8]| {
    let Some((&stride, data)) = input.split_first() else {
        return;
    };
    let whole = events(&[data]);
    let cut: Vec<&[u8]> = data.chunks(usize::from(stride).max(1)).collect();
    assert_eq!(events(&cut), whole, "cut every {stride} bytes");
    let bytes: Vec<&[u8]> = data.chunks(1).collect();
    assert_eq!(events(&bytes), whole, "byte by byte");
});
