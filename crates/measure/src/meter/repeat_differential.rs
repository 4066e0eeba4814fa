//! The meter with its repeat cache against the meter without it (every event scanned, every
//! event shown to the agent meter): equal measurements on every stream capture, split into
//! frames in several ways, and on generated streams whose texts vary in the ways the cache
//! must notice (quotes, escapes, control bytes, empty text, texts that name a key the scan
//! reads, reasoning and tool-call deltas between plain ones).

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{Measurement, StreamMeter};
use crate::fixtures::{capture, CAPTURES};
use crate::outcome::Ending;

/// One request measured from `frames`, served 1 ms apart; `cached`: with the repeat cache.
fn measure(frames: &[&[u8]], cached: bool) -> Measurement {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).keep_gaps(1 << 14);
    m.tl.repeat_off = !cached;
    m.on_head(t0, 200);
    let mut t = t0;
    for f in frames {
        t += Duration::from_millis(1);
        m.on_frame(t, f, |_| {});
    }
    m.finish(t + Duration::from_millis(1), Ending::Complete)
}

fn events(body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.windows(2).position(|w| w == b"\n\n") {
        out.push(&rest[..at + 2]);
        rest = &rest[at + 2..];
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[test]
fn captures_measure_the_same_with_and_without_the_cache() {
    let mut streams = 0;
    for (name, _) in CAPTURES.iter().filter(|(n, _)| n.starts_with("stream")) {
        let body = capture(name).body;
        let per_event = events(body);
        let whole: &[&[u8]] = &[body];
        for frames in [whole, per_event.as_slice()] {
            assert_eq!(measure(frames, true), measure(frames, false), "{name}");
        }
        streams += 1;
    }
    assert!(streams > 10, "{streams} stream captures");
}

fn chat(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
    )
}

fn event() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        "[a-z ]{0,6}",
        Just("reasoning".to_string()),
        Just("reasoning is".to_string()),
        Just("tool_calls".to_string()),
        "[a-z\"\\\\\u{1}\u{e9} ]{0,4}"
            .prop_map(|t| t.replace('"', "\\\"").replace('\u{1}', "\\u0001")),
        "[a-z\"\\\\:{} ]{0,4}",
    ];
    let delta = prop_oneof![
        4 => text.clone().prop_map(|t| format!("{{\"content\":\"{t}\"}}")),
        1 => text.clone().prop_map(|t| format!("{{\"reasoning\":\"{t}\"}}")),
        1 => text.prop_map(|t| format!("{{\"reasoning_content\":\"{t}\",\"content\":null}}")),
        1 => Just(r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}}]}"#.to_string()),
        1 => Just(r#"{"role":"assistant","content":""}"#.to_string()),
    ];
    let finish = prop_oneof![8 => Just("null"), 1 => Just("\"stop\""), 1 => Just("\"length\"")];
    (delta, finish).prop_map(|(d, f)| chat(&d, f))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    #[test]
    fn generated_streams_measure_the_same_with_and_without_the_cache(
        mut evs in proptest::collection::vec(event(), 1..40),
    ) {
        evs.push("data: [DONE]\n\n".to_string());
        let frames: Vec<&[u8]> = evs.iter().map(|e| e.as_bytes()).collect();
        prop_assert_eq!(measure(&frames, true), measure(&frames, false));
    }
}
