//! The meter with its repeat cache against the meter without it (every event scanned, every
//! event shown to the agent meter): equal measurements on every stream capture, split into
//! frames in several ways, and on generated streams whose texts vary in the ways the cache
//! must notice (quotes, escapes, control bytes, empty text, texts that name a key the scan
//! reads, reasoning and tool-call deltas between plain ones). The streams are split into
//! frames anywhere, with LF, CRLF and CR line ends: with the cache, an event that repeats the
//! template where an event starts is framed by the template, not by the SSE parser.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{Measurement, StreamMeter};
use crate::fixtures::{capture, CAPTURES};
use crate::outcome::Ending;

/// One request measured from `frames`, served 1 ms apart; `cached`: with the repeat cache.
/// The gaps handed to the histogram are the measurement's, one by one.
fn measure(frames: &[&[u8]], cached: bool) -> Measurement {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).keep_gaps(1 << 14);
    if !cached {
        m = m.without_repeat_cache();
    }
    m.on_head(t0, 200);
    let mut observed = Vec::new();
    let mut t = t0;
    for f in frames {
        t += Duration::from_millis(1);
        m.on_frame(t, f, |g| observed.push(g.as_secs_f32()));
    }
    let measured = m.finish(t + Duration::from_millis(1), Ending::Complete);
    assert_eq!(observed, measured.itl_gaps, "the histogram's gaps");
    measured
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

/// The events of `body` the meter framed by its template.
fn framed_by_template(body: &[u8]) -> usize {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true);
    m.on_head(t0, 200);
    m.on_frame(t0, body, |_| {});
    m.tl.one_look as usize
}

/// A second stream of one engine on a thread: the events its template does not answer (its
/// first output and finish chunks, the usage chunk when asked) are framed and read by the
/// shapes the first stream left, in one pass, and measure as the reference does.
#[test]
fn a_second_stream_frames_what_the_template_misses_by_the_shapes() {
    // A thread of its own: no shape kept before the first stream.
    std::thread::spawn(|| {
        // Its role chunk (the stream's first event, past the last stream's prefix), first
        // output and finish chunks, and the usage chunk when asked.
        for (name, least) in [("stream-chat.txt", 3), ("stream-chat-usage.txt", 4)] {
            let body = capture(name).body;
            let by_shapes = || {
                let t0 = Instant::now();
                let mut m = StreamMeter::new(t0, true);
                m.on_head(t0, 200);
                m.on_frame(t0, body, |_| {});
                m.tl.shape_framed
            };
            by_shapes();
            let framed = by_shapes();
            assert!(framed >= least, "{name}: {framed}");
            let whole: &[&[u8]] = &[body];
            assert_eq!(measure(whole, true), measure(whole, false), "{name}");
        }
    })
    .join()
    .unwrap();
}

/// A stream that opens with a UTF-8 BOM (dropped by the parser), in one frame or with the BOM
/// split anywhere, and one whose first byte only looks like a BOM's: the fast paths, which
/// frame from the first event on once the first byte settles the BOM, measure as the
/// reference, on a thread whose shapes and prefix are warm.
#[test]
fn a_stream_that_opens_with_a_bom_measures_as_the_reference() {
    std::thread::spawn(|| {
        let body = capture("stream-chat-usage.txt").body;
        let whole: &[&[u8]] = &[body];
        measure(whole, true);
        for lead in [&b"\xEF\xBB\xBF"[..], b"\xEF", b"\xEF\xBB", b"\xEF\n"] {
            let mut stream = lead.to_vec();
            stream.extend_from_slice(body);
            for split in 0..=lead.len() + 1 {
                let frames: &[&[u8]] = &[&stream[..split], &stream[split..]];
                assert_eq!(
                    measure(frames, true),
                    measure(frames, false),
                    "{lead:?} {split}"
                );
            }
        }
    })
    .join()
    .unwrap();
}

#[test]
fn most_events_of_a_plain_stream_are_framed_by_the_template() {
    let body = capture("stream-chat.txt").body;
    let events = events(body).len();
    let framed = framed_by_template(body);
    assert!(framed * 10 > events * 7, "{framed} of {events}");
    let crlf = String::from_utf8(body.to_vec())
        .unwrap()
        .replace('\n', "\r\n");
    assert_eq!(framed_by_template(crlf.as_bytes()), framed, "CRLF");
    let cr = String::from_utf8(body.to_vec())
        .unwrap()
        .replace('\n', "\r");
    assert_eq!(
        framed_by_template(cr.as_bytes()),
        0,
        "CR alone: the parser frames"
    );
}

#[test]
fn captures_measure_the_same_with_and_without_the_cache() {
    let mut streams = 0;
    for (name, _) in CAPTURES.iter().filter(|(n, _)| n.starts_with("stream")) {
        let body = capture(name).body;
        let per_event = events(body);
        let whole: &[&[u8]] = &[body];
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        let sevens: Vec<&[u8]> = body.chunks(7).collect();
        for frames in [whole, &per_event, &bytes, &sevens] {
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

/// A count of a continuous usage: mostly a plain one (growing by one digit now and then), else
/// a value a template's count span must not take as one (a leading zero, a fraction, `null`,
/// a sign, more than 19 digits).
fn count() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => (0u64..2000).prop_map(|n| n.to_string()),
        1 => Just("0".to_string()),
        1 => "0[0-9]",
        1 => Just("1.5".to_string()),
        1 => Just("null".to_string()),
        1 => Just("-1".to_string()),
        1 => "[1-9][0-9]{17,20}",
    ]
}

/// An event of a stream with continuous usage (usage on every chunk with choices, vLLM's
/// `continuous_usage_stats`): mostly output chunks that differ in text and counts, some
/// without output, finishing or without usage, and the final `"choices":[]` usage chunk.
pub(super) fn continuous_event() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        4 => "[a-z ]{0,6}",
        1 => "[a-z\"\\\\\u{1}\u{e9} ]{0,4}"
            .prop_map(|t| t.replace('"', "\\\"").replace('\u{1}', "\\u0001")),
    ];
    let finish = prop_oneof![10 => Just("null"), 1 => Just("\"stop\"")];
    let usage = || {
        (count(), count(), count()).prop_map(|(p, t, c)| {
            format!(",\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{t},\"completion_tokens\":{c},\"completion_tokens_details\":null}}")
        })
    };
    let with_usage = prop_oneof![10 => usage(), 1 => Just(String::new())];
    prop_oneof![
        12 => (text, finish, with_usage).prop_map(|(t, f, u)| format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"logprobs\":null,\"finish_reason\":{f}}}]{u}}}\n\n"
        )),
        1 => usage().prop_map(|u| format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[]{u}}}\n\n"
        )),
    ]
}

#[test]
fn most_events_of_a_continuous_usage_stream_are_framed_by_the_template() {
    for name in [
        "stream-chat-usage-continuous.txt",
        "options/metrics-stream-chat-usage-continuous.txt",
    ] {
        let body = capture(name).body;
        let events = events(body).len();
        let framed = framed_by_template(body);
        // All but the role chunk, the first output chunk (the template), the finish chunk,
        // the final usage chunk and `[DONE]`.
        assert!(
            framed > 0 && framed + 5 >= events,
            "{name}: {framed} of {events}"
        );
    }
}

/// `body` cut at `cuts` (offsets taken modulo its length, in any order).
pub(super) fn split<'a>(body: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let mut frames = Vec::new();
    let mut at = 0;
    for c in cuts {
        frames.push(&body[at..c]);
        at = c;
    }
    frames.push(&body[at..]);
    frames
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    #[test]
    fn generated_streams_measure_the_same_with_and_without_the_cache(
        mut evs in proptest::collection::vec(event(), 1..40),
        cuts in proptest::collection::vec(0usize..20_000, 0..12),
        eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        noise in prop_oneof![4 => Just(""), 1 => Just(": ping\n\n"), 1 => Just("\n"), 1 => Just("event: x\n")],
    ) {
        evs.push("data: [DONE]\n\n".to_string());
        let frames: Vec<&[u8]> = evs.iter().map(|e| e.as_bytes()).collect();
        prop_assert_eq!(measure(&frames, true), measure(&frames, false));
        // The same stream as one body split anywhere, its line ends written as `eol`, with
        // something that is not a repeat (a comment, a blank line, an event name) before
        // every third event.
        let body: String = evs
            .iter()
            .enumerate()
            .map(|(i, e)| if i % 3 == 2 { format!("{noise}{e}") } else { e.clone() })
            .collect::<String>()
            .replace('\n', eol);
        let frames = split(body.as_bytes(), &cuts);
        prop_assert_eq!(measure(&frames, true), measure(&frames, false), "{:?}", body);
    }

    /// Continuous usage: the template's count spans take other digits, never a value that
    /// reads otherwise; the same measurement as a scan of every event, split anywhere.
    #[test]
    fn continuous_usage_streams_measure_the_same_with_and_without_the_cache(
        mut evs in proptest::collection::vec(continuous_event(), 1..40),
        cuts in proptest::collection::vec(0usize..20_000, 0..12),
        eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
    ) {
        evs.push("data: [DONE]\n\n".to_string());
        let frames: Vec<&[u8]> = evs.iter().map(|e| e.as_bytes()).collect();
        prop_assert_eq!(measure(&frames, true), measure(&frames, false));
        let body = evs.concat().replace('\n', eol);
        let frames = split(body.as_bytes(), &cuts);
        prop_assert_eq!(measure(&frames, true), measure(&frames, false), "{:?}", body);
    }
}
