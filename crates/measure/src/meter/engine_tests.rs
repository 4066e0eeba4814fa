//! The engine's view and the TTFT split read from real vLLM 0.32 streams and bodies, wherever
//! they arrive (the injected usage chunk the client never gets, a usage chunk the client asked
//! for, continuous usage, a JSON body); stalls between output events.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{Measurement, StreamMeter};
use crate::engine::{EngineView, TtftSplit};
use crate::fixtures::capture;
use crate::outcome::{Ending, Outcome};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Each `(delay_ms, bytes)` frame served `delay` after the previous one (t0 first).
fn run(stream: bool, strip: bool, frames: &[(u64, &[u8])]) -> (Vec<u8>, Measurement) {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, stream)
        .proxy_time(Some(ms(1)))
        .stall_threshold(ms(100));
    if strip {
        m = m.strip_usage();
    }
    m.on_head(t0, 200);
    let mut out = VecDeque::new();
    let mut t = t0;
    for (delay, f) in frames {
        t += ms(*delay);
        m.on_upstream_frame(t, Bytes::copy_from_slice(f), &mut out, |_| {});
    }
    m.end_of_upstream(t, &mut out, |_| {});
    let bytes = out.iter().flat_map(|b| b.iter().copied()).collect();
    (bytes, m.finish(t, Ending::Complete))
}

/// The capture's events, one frame each, `gap` ms apart (the first `first` ms after t0).
fn events(body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.windows(2).position(|w| w == b"\n\n") {
        out.push(&rest[..at + 2]);
        rest = &rest[at + 2..];
    }
    out
}

fn timed(body: &[u8], first: u64, gap: u64) -> Vec<(u64, &[u8])> {
    events(body)
        .into_iter()
        .enumerate()
        .map(|(i, e)| (if i == 0 { first } else { gap }, e))
        .collect()
}

/// The capture's usage chunk reports: time_to_first_token_ms 4.278464999970311,
/// generation_time_ms 92.29625700004362, queue_time_ms 0.02717400002438808, mean_itl_ms
/// 10.255139666671512, cached_tokens 0.
fn metrics_capture_view() -> EngineView {
    EngineView {
        queue: Some(Duration::from_nanos(27_174)),
        ttft: Some(Duration::from_nanos(4_278_465)),
        decode: Some(Duration::from_nanos(92_296_257)),
        mean_itl: Some(Duration::from_nanos(10_255_140)),
        cached_prompt_tokens: Some(0),
    }
}

#[test]
fn the_injected_usage_chunk_tells_the_engine_view_and_the_client_never_sees_it() {
    let body = capture("options/metrics-stream-chat-usage.txt").body;
    // The client did not ask: the proxy injected usage, the strip removes the chunk (with its
    // metrics) and the meter still reads them.
    let (out, m) = run(true, true, &timed(body, 20, 5));
    assert!(!String::from_utf8(out).unwrap().contains("\"metrics\""));
    assert_eq!(m.outcome, Outcome::Success);
    assert_eq!(m.engine_view(), metrics_capture_view());
    let split = m.ttft_split();
    let parts = split.parts().expect("split");
    assert_eq!(parts.iter().sum::<Duration>(), m.ttft.unwrap());
    assert_eq!(m.ttft, Some(ms(20 + 5)), "the role chunk is no output");
    assert_eq!(parts[0], ms(1));
    assert_eq!(
        (parts[1], parts[2]),
        (
            Duration::from_nanos(27_174),
            Duration::from_nanos(4_278_465)
        )
    );
    assert!(!split.clamped);
}

#[test]
fn a_client_asked_usage_chunk_continuous_usage_and_json_bodies_tell_it_too() {
    // The client asked for usage: nothing is stripped, the chunk passes and is read.
    let body = capture("options/metrics-stream-chat-usage.txt").body;
    let (out, m) = run(true, false, &timed(body, 20, 5));
    assert_eq!(out, body);
    assert_eq!(m.engine_view(), metrics_capture_view());
    // Continuous usage: per-chunk usage has no details; the final chunk's word counts.
    let body = capture("options/metrics-stream-chat-usage-continuous.txt").body;
    let (_, m) = run(true, false, &timed(body, 20, 5));
    assert_eq!(m.engine_view().cached_prompt_tokens, Some(0));
    assert!(m.engine_view().queue.is_some() && m.engine_view().mean_itl.is_some());
    // A repeated long prefix: its cached tokens.
    let body = capture("options/metrics-stream-chat-prefix-again.txt").body;
    let (_, m) = run(true, false, &timed(body, 20, 5));
    assert_eq!(m.engine_view().cached_prompt_tokens, Some(1920));
    // JSON: the engine's view, no TTFT and so no split.
    let body = capture("options/metrics-nonstream-chat.txt").body;
    let (_, m) = run(false, false, &[(90, body)]);
    assert_eq!(m.outcome, Outcome::Success);
    assert_eq!(m.engine_view().ttft, Some(Duration::from_nanos(11_348_519)));
    assert_eq!(m.engine_view().cached_prompt_tokens, Some(0));
    assert_eq!(m.ttft_split(), TtftSplit::default());
}

#[test]
fn no_metrics_no_split_and_n2_has_only_cached_tokens() {
    // vLLM suppresses the metrics for n > 1: only the usage's details.
    let body = capture("options/metrics-stream-chat-n2-usage.txt").body;
    let (_, m) = run(true, false, &timed(body, 20, 5));
    assert_eq!(
        m.engine_view(),
        EngineView {
            cached_prompt_tokens: Some(0),
            ..EngineView::default()
        }
    );
    assert_eq!(m.ttft_split(), TtftSplit::default());
    // No usage at all (the engine not started with the options): nothing.
    let body = capture("stream-chat.txt").body;
    let (_, m) = run(true, false, &timed(body, 20, 5));
    assert!(m.engine_view().is_empty());
    assert_eq!(m.ttft_split().parts(), None);
}

#[test]
fn an_engine_ttft_longer_than_the_clients_is_clamped_not_negative() {
    // The client saw its first token 2 ms after t0; the engine claims 4.3 ms of prefill.
    let body = capture("options/metrics-stream-chat-usage.txt").body;
    let mut frames = timed(body, 1, 5);
    frames[1].0 = 1;
    let (_, m) = run(true, true, &frames);
    let parts = m.ttft_split().parts().expect("split");
    assert_eq!(m.ttft, Some(ms(2)));
    assert_eq!(parts.iter().sum::<Duration>(), ms(2));
    assert_eq!(parts[3], Duration::ZERO);
    assert!(m.ttft_split().clamped);
}

#[test]
fn stalls_are_gaps_between_output_events_and_comments_do_not_end_them() {
    let body = capture("stream-chat.txt").body;
    let evs = events(body);
    // role, t1 .. : a 300 ms wait before the third token, with keep-alive comments in it.
    let mut frames: Vec<(u64, &[u8])> = Vec::new();
    for (i, e) in evs.iter().enumerate() {
        if i == 3 {
            frames.push((100, b": keep-alive\n\n"));
            frames.push((100, b": keep-alive\n\n"));
            frames.push((100, e));
        } else {
            frames.push((10, e));
        }
    }
    let (out, m) = run(true, false, &frames);
    assert_eq!(out.len(), body.len() + 2 * b": keep-alive\n\n".len());
    assert_eq!(m.itl_max, Some(ms(300)));
    assert_eq!(m.stalls(), 1);
    // No gap over the threshold: none.
    let (_, m) = run(true, false, &timed(body, 10, 10));
    assert_eq!((m.itl_max, m.stalls()), (Some(ms(10)), 0));
}
