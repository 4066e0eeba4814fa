//! The usage strip in the meter's pass: the client gets the stream it would have got without
//! injection, for any framing and line ends, with the fast path (the repeat cache) on and off.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use tokio::time::Instant;

use super::repeat_differential::split;
use super::{Measurement, StreamMeter};
use crate::fixtures::capture;
use crate::outcome::{Ending, Outcome};
use crate::sse::MAX_LINE_BYTES;

/// What the client got from `frames`, and the measurement (every ITL gap kept); `fast`: with
/// the repeat cache. The gaps handed to the histogram are the measurement's, one by one.
fn strip_by(frames: &[&[u8]], fast: bool) -> (Vec<u8>, Measurement) {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage().keep_gaps(1 << 14);
    if !fast {
        m = m.without_repeat_cache();
    }
    m.on_head(t0, 200);
    let mut out = VecDeque::new();
    let mut observed = Vec::new();
    let mut t = t0;
    for f in frames {
        t += Duration::from_millis(1);
        let on_gap = |g: Duration| observed.push(g.as_secs_f32());
        m.on_upstream_frame(t, Bytes::copy_from_slice(f), &mut out, on_gap);
    }
    m.end_of_upstream(t, &mut out, |g| observed.push(g.as_secs_f32()));
    let bytes = out.iter().flat_map(|b| b.iter().copied()).collect();
    let measured = m.finish(t, Ending::Complete);
    assert_eq!(observed, measured.itl_gaps, "the histogram's gaps");
    (bytes, measured)
}

/// The usage capture with the plain capture's id, so the two differ only by injection.
fn chat_pair() -> (Vec<u8>, Vec<u8>) {
    let plain = capture("stream-chat.txt").body.to_vec();
    let usage = capture("stream-chat-usage.txt").body;
    let usage = String::from_utf8(usage.to_vec())
        .unwrap()
        .replace("chatcmpl-ba42e38baeaee861", "chatcmpl-a45afd70d01f6372");
    (usage.into_bytes(), plain)
}

fn stream_event() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        4 => "[a-z ]{0,6}",
        1 => "[a-z\"\\\\\u{1}\u{e9} ]{0,4}"
            .prop_map(|t| t.replace('"', "\\\"").replace('\u{1}', "\\u0001")),
        1 => "[a-z\"\\\\:{} ]{0,4}",
    ];
    let chunk = |delta: String, finish: &str, tail: &str| {
        format!("data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{delta}\"}},\"finish_reason\":{finish}}}]{tail}}}\n\n")
    };
    prop_oneof![
        8 => text.clone().prop_map(move |t| chunk(t, "null", "")),
        1 => text.clone().prop_map(move |t| chunk(t, "\"stop\"", "")),
        1 => text.prop_map(move |t| chunk(t, "\"length\"", r#","system_fingerprint":"fp""#)),
        1 => Just(r#"data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4},"system_fingerprint":"fp"}"#.to_string() + "\n\n"),
        1 => Just("data: [DONE]\n\n".to_string()),
        1 => Just(": ping\n\n".to_string()),
        1 => Just("\n".to_string()),
    ]
}

#[test]
fn the_usage_capture_strips_to_the_plain_capture() {
    let (usage, plain) = chat_pair();
    for fast in [true, false] {
        let (out, m) = strip_by(&[&usage], fast);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            String::from_utf8(plain.clone()).unwrap()
        );
        assert_eq!(m.outcome, Outcome::Success);
        assert_eq!(
            (m.prompt_tokens, m.completion_tokens, m.tokens_exact),
            (Some(32), Some(16), true)
        );
        assert!(m.usage_injected && m.usage_stripped);
    }
}

/// What the client got, fast path on (the shipped default), checked against it off.
fn strip_all(frames: &[&[u8]]) -> Vec<u8> {
    let (fast, m) = strip_by(frames, true);
    let (slow, m_slow) = strip_by(frames, false);
    assert_eq!(fast, slow, "fast path and parser alone");
    assert_eq!(m, m_slow);
    fast
}

/// Completions: the same transformation written out by hand (no plain capture exists).
fn completions_pair() -> (Vec<u8>, Vec<u8>) {
    let usage = capture("stream-completions.txt").body;
    let text = std::str::from_utf8(usage).unwrap();
    let fp = r#","system_fingerprint":"vllm-0.32.0-f1283a03""#;
    let usage_line = text
        .lines()
        .find(|l| l.contains(r#""choices":[]"#))
        .unwrap();
    let plain = text
        .replace(&format!("{usage_line}\n\n"), "")
        .replace(r#""finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}"#,
            &format!(r#""finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}}]{fp}}}"#));
    (usage.to_vec(), plain.into_bytes())
}

/// The events of an SSE body, each with its blank line.
fn events(body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(at) = memchr::memmem::find(rest, b"\n\n") {
        out.push(&rest[..at + 2]);
        rest = &rest[at + 2..];
    }
    out
}

#[test]
fn stripping_the_usage_capture_gives_the_plain_capture_byte_for_byte() {
    for (usage, plain) in [chat_pair(), completions_pair()] {
        assert_ne!(usage, plain);
        assert_eq!(strip_all(&[&usage]), plain);
        let frames: Vec<&[u8]> = usage.split_inclusive(|b| *b == b'\n').collect();
        assert_eq!(strip_all(&frames), plain, "line frames");
        let bytes: Vec<&[u8]> = usage.chunks(1).collect();
        assert_eq!(strip_all(&bytes), plain, "byte frames");
    }
}

#[test]
fn crlf_and_cr_framing_strip_alike() {
    let (usage, plain) = chat_pair();
    for eol in ["\r\n", "\r"] {
        let conv = |b: &[u8]| {
            String::from_utf8(b.to_vec())
                .unwrap()
                .replace('\n', eol)
                .into_bytes()
        };
        let (u, p) = (conv(&usage), conv(&plain));
        assert_eq!(strip_all(&[&u]), p, "{eol:?}");
        let bytes: Vec<&[u8]> = u.chunks(1).collect();
        assert_eq!(strip_all(&bytes), p, "{eol:?} byte frames");
        // Empty frames (a body may yield them) between every byte: a `\r` at the end of a
        // frame must still pair with a `\n` that comes after an empty frame.
        let with_empty: Vec<&[u8]> = u.chunks(1).flat_map(|b| [b, &[][..]]).collect();
        assert_eq!(
            strip_all(&with_empty),
            p,
            "{eol:?} byte frames with empty ones"
        );
    }
}

#[test]
fn streams_without_an_injected_usage_chunk_pass_unchanged() {
    for name in ["stream-chat.txt", "stream-completions-logprobs.txt"] {
        let body = capture(name).body;
        assert_eq!(strip_all(&[body]), body, "{name}");
        let frames: Vec<&[u8]> = body.split_inclusive(|b| *b == b'\n').collect();
        assert_eq!(strip_all(&frames), body, "{name}");
    }
    // Cut right after a finish chunk: the held chunk is released at the end, unchanged.
    let (usage, _) = chat_pair();
    let text = std::str::from_utf8(&usage).unwrap();
    let cut = text.find(r#"{"id":"chatcmpl-a45afd70d01f6372","object":"chat.completion.chunk","created":1795964150,"model":"tiny","choices":[],"#).unwrap() - "data: ".len();
    assert_eq!(strip_all(&[&usage[..cut]]), &usage[..cut]);
    // Garbage and half events are never lost either.
    assert_eq!(
        strip_all(&[b"data: {nope\n\n", b"data: half"]),
        b"data: {nope\n\ndata: half"
    );
}

#[test]
fn most_events_of_a_capture_pass_by_the_one_look_path() {
    let (usage, plain) = chat_pair();
    let lines: Vec<&[u8]> = usage.split_inclusive(|b| *b == b'\n').collect();
    for frames in [vec![&usage[..]], lines] {
        let t0 = Instant::now();
        let mut m = StreamMeter::new(t0, true).strip_usage();
        m.on_head(t0, 200);
        let mut out = VecDeque::new();
        for f in &frames {
            m.on_upstream_frame(t0, Bytes::copy_from_slice(f), &mut out, |_| {});
        }
        m.end_of_upstream(t0, &mut out, |_| {});
        let got: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(got, plain);
        let events = events(&usage).len() as u64;
        let one_look = m.tl.one_look;
        if frames.len() == 1 {
            assert!(one_look * 10 > events * 7, "{one_look} of {events}");
        } else {
            assert_eq!(one_look, 0, "a frame that splits the event is parsed");
        }
    }
}

/// A second stream on a thread: its first output chunk, its finish chunk (held) and the
/// injected usage chunk (dropped) are framed and read by the shapes the first stream left,
/// and the client gets what the reference strip gives, measured alike.
#[test]
fn a_second_stream_strips_what_the_shapes_frame_as_the_reference() {
    // A thread of its own: no shape kept before the first stream.
    std::thread::spawn(|| {
        let (usage, plain) = chat_pair();
        let by_shapes = || {
            let t0 = Instant::now();
            let mut m = StreamMeter::new(t0, true).strip_usage();
            m.on_head(t0, 200);
            let mut out = VecDeque::new();
            m.on_upstream_frame(t0, Bytes::copy_from_slice(&usage), &mut out, |_| {});
            m.end_of_upstream(t0, &mut out, |_| {});
            let got: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
            assert_eq!(got, plain);
            m.tl.shape_framed
        };
        by_shapes();
        let framed = by_shapes();
        // The role chunk (the stream's first event), the first output, finish and usage
        // chunks.
        assert!(framed >= 4, "{framed}");
        let whole: &[&[u8]] = &[&usage];
        assert_eq!(strip_by(whole, true), strip_by(whole, false));
    })
    .join()
    .unwrap();
}

/// A stream that opens with a UTF-8 BOM, whole or split anywhere in its first bytes, strips
/// and measures as the reference (the client gets the BOM too: only the meter's parser drops
/// it), on a thread whose shapes and prefix are warm.
#[test]
fn a_stream_that_opens_with_a_bom_strips_as_the_reference() {
    std::thread::spawn(|| {
        let (usage, plain) = chat_pair();
        strip_by(&[&usage], true);
        let mut stream = b"\xEF\xBB\xBF".to_vec();
        stream.extend_from_slice(&usage);
        let mut want = b"\xEF\xBB\xBF".to_vec();
        want.extend_from_slice(&plain);
        for split in 0..6 {
            let frames: &[&[u8]] = &[&stream[..split], &stream[split..]];
            let fast = strip_by(frames, true);
            assert_eq!(fast.0, want, "{split}");
            assert_eq!(fast, strip_by(frames, false), "{split}");
        }
    })
    .join()
    .unwrap();
}

#[test]
fn whole_event_frames_pass_without_copy() {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage();
    m.on_head(t0, 200);
    let frame = Bytes::from_static(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
    );
    let mut out = VecDeque::new();
    m.on_upstream_frame(t0, frame.clone(), &mut out, |_| {});
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].as_ptr(), out[0].len()),
        (frame.as_ptr(), frame.len())
    );
}

#[test]
fn events_that_never_repeat_pass_unchanged_and_are_each_metered() {
    // Logprobs on every chunk: each event differs from the last outside its text.
    let mut body = Vec::new();
    for i in 0..200 {
        body.extend_from_slice(
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t\"}},\
                 \"logprobs\":{{\"content\":[{{\"token\":\"t\",\"logprob\":-0.{i}}}]}}}}]}}\n\n"
            )
            .as_bytes(),
        );
    }
    let (out, m) = strip_by(&[&body], true);
    assert_eq!(out, body, "passed unchanged");
    assert_eq!((m.output_events, m.completion_tokens), (200, Some(200)));
    assert_eq!(m.logprobs.map(|l| l.tokens), Some(200));
}

#[test]
fn n2_usage_stream_releases_the_earlier_finish_chunk() {
    let body = capture("stream-chat-n2.txt").body;
    let out = strip_all(&[body]);
    let text = std::str::from_utf8(&out).unwrap();
    assert!(!text.contains(r#""choices":[]"#), "usage chunk removed");
    assert_eq!(
        text.matches("system_fingerprint").count(),
        1,
        "on the last finish chunk"
    );
    assert!(text.ends_with("\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}\n\ndata: [DONE]\n\n"));
}

#[test]
fn held_bytes_are_bounded_by_the_line_limit() {
    let (usage, plain) = chat_pair();
    // An event that never ends: once it passes the limit, everything goes out unchanged.
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage();
    m.on_head(t0, 200);
    let mut out = VecDeque::new();
    m.on_upstream_frame(
        t0,
        Bytes::copy_from_slice(&usage[..usage.len() / 2]),
        &mut out,
        |_| {},
    );
    let piece = Bytes::from(vec![b'x'; 1 << 20]);
    let mut sent = usage[..usage.len() / 2].to_vec();
    for _ in 0..(MAX_LINE_BYTES / piece.len() + 2) {
        m.on_upstream_frame(t0, piece.clone(), &mut out, |_| {});
        sent.extend_from_slice(&piece);
        let strip = m.strip.as_ref().unwrap();
        assert!(strip.partial.len() <= MAX_LINE_BYTES, "held bytes bounded");
    }
    // After giving up, a usage chunk is no longer removed: the stream passes as it is.
    let tail = Bytes::copy_from_slice(&usage);
    m.on_upstream_frame(t0, tail.clone(), &mut out, |_| {});
    sent.extend_from_slice(&tail);
    m.end_of_upstream(t0, &mut out, |_| {});
    let got: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(got, sent, "nothing lost, nothing reordered");
    let measured = m.finish(t0, Ending::Complete);
    assert!(
        measured.usage_injected && !measured.usage_stripped,
        "gave up, and says so"
    );
    // Below the limit the strip strips.
    assert_eq!(strip_all(&[&usage]), plain);
}

#[test]
fn a_held_finish_chunk_is_metered_when_the_client_gets_it() {
    let (usage, _) = chat_pair();
    let text = std::str::from_utf8(&usage).unwrap();
    let usage_at = text.find("data: {\"id\":\"chatcmpl-a45afd70d01f6372\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[],").unwrap();
    // Everything up to the usage chunk at 1 ms (the finish chunk is held), the rest at 9 ms.
    let (head, tail) = usage.split_at(usage_at);
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage().keep_gaps(64);
    m.on_head(t0, 200);
    let mut out = VecDeque::new();
    let ms = Duration::from_millis;
    m.on_upstream_frame(t0 + ms(1), Bytes::copy_from_slice(head), &mut out, |_| {});
    let before: usize = out.iter().map(Bytes::len).sum();
    assert!(before < head.len(), "the finish chunk waits");
    m.on_upstream_frame(t0 + ms(9), Bytes::copy_from_slice(tail), &mut out, |_| {});
    let got = m.finish(t0 + ms(10), Ending::Complete);
    assert_eq!(got.outcome, Outcome::Success);
    assert_eq!(
        got.itl_max,
        Some(ms(8)),
        "the finish chunk's gap ends when it went out"
    );
}

#[test]
fn a_comment_between_the_finish_and_usage_chunks_waits_behind_the_finish_chunk() {
    // Asked directly, the engine sends the finish chunk with its fingerprint, then the comment.
    let fin = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\n";
    let fin_fp = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}],\"system_fingerprint\":\"fp\"}\n\n";
    let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1},\"system_fingerprint\":\"fp\"}\n\n";
    let body = format!("{fin}: keep-alive\n\n: keep-alive\n\n{usage}data: [DONE]\n\n");
    let want = format!("{fin_fp}: keep-alive\n\n: keep-alive\n\ndata: [DONE]\n\n");
    for frames in framings(body.as_bytes()) {
        let (out, m) = strip_by(&frames, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            want,
            "{} frames",
            frames.len()
        );
        assert_eq!((m.completion_tokens, m.tokens_exact), (Some(1), true));
    }
    // A stream cut while they wait: everything held goes out unchanged, in order.
    let cut = format!("{fin}: keep-alive\n\n");
    assert_eq!(strip_all(&[cut.as_bytes()]), cut.as_bytes());
}

/// Every way of cutting `body` into frames the tests use: whole, per line, per byte.
fn framings(body: &[u8]) -> Vec<Vec<&[u8]>> {
    vec![
        vec![body],
        body.split_inclusive(|b| *b == b'\n').collect(),
        body.chunks(1).collect(),
    ]
}

#[test]
fn keep_alive_comments_pass_in_place_around_a_stripped_usage_chunk() {
    let (usage, plain) = chat_pair();
    const KA: &str = ": keep-alive\n\n";
    // Before the first event, between events, and between the finish chunk and the usage
    // chunk (where the finish chunk is held): each comment stays where it was.
    let put = |body: &[u8], before_last: &str| {
        let text = std::str::from_utf8(body).unwrap();
        let first = text.find("data: ").unwrap();
        let second = first + text[first..].find("\n\n").unwrap() + 2;
        let last = text.rfind(before_last).unwrap();
        format!(
            "{KA}{}{KA}{}{KA}{KA}{}",
            &text[..second],
            &text[second..last],
            &text[last..]
        )
        .into_bytes()
    };
    let usage = put(&usage, "data: {\"id\":\"chatcmpl-a45afd70d01f6372\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[],");
    let plain = put(&plain, "data: [DONE]");
    for frames in framings(&usage) {
        for fast in [true, false] {
            assert_eq!(
                String::from_utf8(strip_by(&frames, fast).0).unwrap(),
                String::from_utf8(plain.clone()).unwrap(),
                "{} frames, fast {fast}",
                frames.len()
            );
        }
    }
    // The real queued stream: comments before the first event, nothing to strip.
    let body = capture("options/keepalive-stream-chat-queued.txt").body;
    for frames in framings(body) {
        assert_eq!(strip_all(&frames), body);
    }
}

#[test]
fn an_engine_that_forces_usage_keeps_its_usage_chunk() {
    // `--enable-force-include-usage`: the engine sends usage on every chunk and the final
    // usage chunk whatever the request says, so the injected request gets exactly what the
    // client would have got directly; nothing may be removed, and the count is exact.
    for name in [
        "options/force-stream-chat.txt",
        "options/force-stream-chat-options-empty.txt",
        "options/force-stream-completions.txt",
        "options/force-stream-chat-logprobs-usage.txt",
        "options/all-stream-chat.txt",
        "options/all-stream-chat-queued.txt",
    ] {
        let body = capture(name).body;
        for frames in framings(body) {
            for fast in [true, false] {
                let (out, m) = strip_by(&frames, fast);
                assert_eq!(out, body, "{name}, {} frames, fast {fast}", frames.len());
                assert!(m.tokens_exact, "{name}");
            }
        }
    }
}

#[test]
fn an_error_event_passes_and_is_an_upstream_error() {
    let body = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\nevent: error\ndata: {\"error\":{}}\n\ndata: [DONE]\n\n";
    let (out, m) = strip_by(&[body], true);
    assert_eq!(out, body);
    assert_eq!(m.outcome, Outcome::UpstreamError);
}

#[test]
fn an_error_body_is_not_stripped() {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage();
    m.on_head(t0, 500);
    let body = Bytes::from_static(b"{\"error\":{\"message\":\"x\"}}");
    let mut out = VecDeque::new();
    m.on_upstream_frame(t0, body.clone(), &mut out, |_| {});
    m.end_of_upstream(t0, &mut out, |_| {});
    assert_eq!(out, [body]);
    assert_eq!(
        m.finish(t0, Ending::Complete).outcome,
        Outcome::UpstreamError
    );
}

#[test]
fn json_requests_have_no_strip() {
    let m = StreamMeter::new(Instant::now(), false).strip_usage();
    assert!(!m.strips(), "usage is injected into streams only");
    assert!(StreamMeter::new(Instant::now(), true)
        .strip_usage()
        .strips());
}

fn splits() -> impl Strategy<Value = (usize, Vec<usize>)> {
    (0usize..2, proptest::collection::vec(0usize..5000, 0..20))
}

proptest! {
    #[test]
    fn any_split_strips_to_the_plain_stream((which, cuts) in splits()) {
        let (usage, plain) = if which == 0 { chat_pair() } else { completions_pair() };
        let frames = split(&usage, &cuts);
        let (out, m) = strip_by(&frames, true);
        prop_assert_eq!(out, plain);
        // The usage chunks of the captures (`stream-chat-usage.txt`, `stream-completions.txt`).
        let (prompt, completion) = if which == 0 { (32, 16) } else { (10, 16) };
        prop_assert_eq!((m.prompt_tokens, m.completion_tokens, m.tokens_exact), (Some(prompt), Some(completion), true));
    }

    /// The fast path (an event that repeats the template is framed, judged and metered in one
    /// look) against the parser and a scan for every event: the same bytes out and the same
    /// measurement, on generated streams with any line ends, split anywhere.
    #[test]
    fn fast_path_strips_and_meters_as_the_parser_alone(
        evs in proptest::collection::vec(stream_event(), 1..40),
        cuts in proptest::collection::vec(0usize..20_000, 0..12),
        eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
    ) {
        let body = evs.concat().replace('\n', eol);
        let whole: &[&[u8]] = &[body.as_bytes()];
        prop_assert_eq!(strip_by(whole, true), strip_by(whole, false));
        let frames = split(body.as_bytes(), &cuts);
        prop_assert_eq!(strip_by(&frames, true), strip_by(&frames, false));
    }

    /// An engine that paces its tokens: each event in a frame of its own, served at its own
    /// instant (a frame of only repeats passes whole; its one event leaves nothing to count
    /// after it), and whole events grouped into frames of a few; with any line ends.
    #[test]
    fn paced_frames_strip_and_meter_as_the_parser_alone(
        evs in proptest::collection::vec(stream_event(), 1..40),
        groups in proptest::collection::vec(1usize..4, 1..40),
        eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
    ) {
        let evs: Vec<String> = evs.iter().map(|e| e.replace('\n', eol)).collect();
        let frames: Vec<&[u8]> = evs.iter().map(|e| e.as_bytes()).collect();
        prop_assert_eq!(strip_by(&frames, true), strip_by(&frames, false));
        let mut grouped = Vec::new();
        let mut rest = &evs[..];
        for n in groups.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (head, tail) = rest.split_at((*n).min(rest.len()));
            grouped.push(head.concat());
            rest = tail;
        }
        let frames: Vec<&[u8]> = grouped.iter().map(|e| e.as_bytes()).collect();
        prop_assert_eq!(strip_by(&frames, true), strip_by(&frames, false));
    }

    /// The same with continuous usage (an engine that forces usage: its usage chunk passes),
    /// whose output chunks repeat a template with count spans.
    #[test]
    fn fast_path_strips_and_meters_continuous_usage_as_the_parser_alone(
        evs in proptest::collection::vec(super::repeat_differential::continuous_event(), 1..40),
        cuts in proptest::collection::vec(0usize..20_000, 0..12),
        eol in prop_oneof![Just("\n"), Just("\r\n")],
    ) {
        let body = (evs.concat() + "data: [DONE]\n\n").replace('\n', eol);
        let whole: &[&[u8]] = &[body.as_bytes()];
        prop_assert_eq!(strip_by(whole, true), strip_by(whole, false));
        let frames = split(body.as_bytes(), &cuts);
        prop_assert_eq!(strip_by(&frames, true), strip_by(&frames, false));
    }

    /// Without a usage chunk nothing changes: the client gets the upstream bytes and the
    /// meter measures as it does when usage was not injected (only the record's flags differ).
    #[test]
    fn without_a_usage_chunk_stripping_changes_nothing(
        evs in proptest::collection::vec(stream_event().prop_filter("no usage", |e| !e.contains("usage")), 1..30),
        cuts in proptest::collection::vec(0usize..20_000, 0..8),
    ) {
        let body = evs.concat();
        let frames = split(body.as_bytes(), &cuts);
        let (out, mut stripped) = strip_by(&frames, true);
        prop_assert_eq!(&out, &body.as_bytes().to_vec());
        let t0 = Instant::now();
        let mut m = StreamMeter::new(t0, true);
        m.on_head(t0, 200);
        let mut t = t0;
        for f in &frames {
            t += Duration::from_millis(1);
            m.on_frame(t, f, |_| {});
        }
        let watched = m.finish(t, Ending::Complete);
        stripped.usage_injected = false;
        stripped.usage_stripped = false;
        // A held finish chunk is timed when it is released (later than it arrived): compare
        // what does not depend on when.
        let facts = |m: &Measurement| (m.outcome, m.finish_reason, m.output_events, m.completion_tokens, m.choices);
        prop_assert_eq!(facts(&stripped), facts(&watched));
    }

    #[test]
    fn arbitrary_bytes_are_never_lost_without_a_usage_chunk(chunks in proptest::collection::vec(proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), any::<u8>()], 0..40), 0..10)) {
        let whole: Vec<u8> = chunks.concat();
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(strip_all(&refs), whole);
    }
}

/// A frame of events that repeat the template, with nothing held, is handed back whole (the
/// body passes it on without the queue) and metered; a frame that is not is queued in pieces.
#[test]
fn a_frame_of_template_repeats_is_handed_back_whole() {
    let event = |text: &str| {
        format!("data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n")
    };
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage();
    m.on_head(t0, 200);
    let mut out = VecDeque::new();
    let first = Bytes::from(event("a"));
    let whole = m.strip_frame(t0, first.clone(), &mut out, |_| {});
    assert_eq!(
        whole.as_deref(),
        Some(&first[..]),
        "the first event is scanned, and passes"
    );
    let run = Bytes::from(event("b") + &event("cd") + &event("e"));
    let mut gaps = Vec::new();
    let t1 = t0 + Duration::from_millis(5);
    let whole = m.strip_frame(t1, run.clone(), &mut out, |g| gaps.push(g));
    let whole = whole.expect("three repeats: the frame itself");
    assert_eq!(whole.as_ptr(), run.as_ptr(), "not a copy");
    assert!(out.is_empty());
    assert_eq!(
        gaps,
        [Duration::from_millis(5), Duration::ZERO, Duration::ZERO]
    );
    // A finish chunk after a repeat: the repeat passes, the finish chunk is held.
    let fin = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"f\"},\"finish_reason\":\"stop\"}]}\n\n";
    let mixed = Bytes::from(event("g") + fin);
    assert!(m.strip_frame(t1, mixed, &mut out, |_| {}).is_none());
    assert_eq!(out.iter().map(Bytes::len).sum::<usize>(), event("g").len());
    let m = m.finish(t1, Ending::Complete);
    assert_eq!((m.output_events, m.itl_count), (5, 4));
}

/// A whole stream in one frame: what the client gets goes out in two pieces, the frame up to
/// the finish chunk (a slice of it, not a copy) and the finish chunk as the strip rewrote it
/// with the `[DONE]` event after it copied into its spare room (one write less).
#[test]
fn a_whole_stream_goes_out_in_two_pieces() {
    let (usage, plain) = chat_pair();
    let frame = Bytes::from(usage);
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage();
    m.on_head(t0, 200);
    let mut out = VecDeque::new();
    assert!(m.strip_frame(t0, frame.clone(), &mut out, |_| {}).is_none());
    m.end_of_upstream(t0, &mut out, |_| {});
    let got: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(got, plain);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].as_ptr(), frame.as_ptr(), "not a copy");
    assert!(out[1].ends_with(b"data: [DONE]\n\n"));
}
