//! Any bytes as an SSE data payload: the one-pass scanner (`scan_event`, `inspect_response`,
//! their token logs and tool-call entries) must say what the `serde_json::Value` oracle of the
//! differential test says (the same file, included by path), and the meter's usage strip must
//! lose no byte of a stream without a usage chunk.
#![no_main]

use bytes::Bytes;
use goodput_measure::inspect::{
    inspect_response, inspect_response_logged, scan_event, scan_event_logged, ChoiceInfo,
    ChunkKind, LoggedCall, Phases, ResponseInfo, Span, TokenLog, Usage, MAX_CHOICES_PER_CHUNK,
};
use goodput_measure::{FinishReason, StreamMeter};
// The oracle names the engine view's types as `crate::engine` / `crate::engine_timings`, as it
// does inside goodput-measure: here they are brought to this crate's root.
use goodput_measure::{engine, engine_timings};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/measure/src/inspect/oracle.rs"]
#[allow(dead_code)]
mod oracle;

fuzz_target!(|data: &[u8]| {
    if let Some(diff) = oracle::differs(data) {
        panic!("{diff}\npayload {:?}", String::from_utf8_lossy(data));
    }
    // The same bytes as one SSE event (one line: no CR or LF in them): the stripper passes
    // them unchanged unless they are a usage chunk.
    if data.iter().any(|b| matches!(b, b'\n' | b'\r')) {
        return;
    }
    let mut event = b"data: ".to_vec();
    event.extend_from_slice(data);
    event.extend_from_slice(b"\n\n");
    let t0 = tokio::time::Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage();
    m.on_head(t0, 200);
    let mut pieces = std::collections::VecDeque::new();
    m.on_upstream_frame(t0, Bytes::from(event.clone()), &mut pieces, |_| {});
    m.end_of_upstream(t0, &mut pieces, |_| {});
    let out: Vec<u8> = pieces.iter().flat_map(|b| b.iter().copied()).collect();
    let usage_chunk = {
        let info = scan_event(data).info;
        info.kind == ChunkKind::Chunk && info.choice_count == 0 && info.usage.is_some()
    };
    if !usage_chunk {
        assert_eq!(out, event, "bytes lost or changed by the strip");
    }
});
