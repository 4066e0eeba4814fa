//! The token-level trace and the logprob summary (`crate::trace`) as the meter builds them.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::Value;
use tokio::time::Instant;

use super::{Measurement, StreamMeter};
use crate::fixtures::capture;
use crate::outcome::{Ending, Outcome};
use crate::trace::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An independent reading of a capture with `serde_json::Value`: per token (choice, phase,
/// token text, logprob, alternatives).
type Want = (u32, Option<Phase>, String, f64, Vec<(String, f64)>);

fn oracle(body: &[u8]) -> Vec<Want> {
    let mut out = Vec::new();
    for line in body.split(|b| *b == b'\n') {
        let Some(d) = line.strip_prefix(b"data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<Value>(d) else {
            continue;
        };
        for c in v["choices"].as_array().into_iter().flatten() {
            let s = |x: &Value| x.as_str().is_some_and(|s| !s.is_empty());
            let d = &c["delta"];
            let tool = d["tool_calls"].as_array().is_some_and(|a| !a.is_empty());
            let phase = if tool {
                Some(Phase::ToolCall)
            } else if s(&d["reasoning"]) || s(&d["reasoning_content"]) {
                Some(Phase::Reasoning)
            } else if s(&d["content"]) || s(&c["text"]) {
                Some(Phase::Answer)
            } else {
                None
            };
            let index = c["index"].as_u64().unwrap() as u32;
            let lp = &c["logprobs"];
            if let Some(entries) = lp["content"].as_array() {
                for e in entries {
                    let top = e["top_logprobs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| {
                            let t = a["token"].as_str().unwrap().to_string();
                            (t, a["logprob"].as_f64().unwrap())
                        })
                        .collect();
                    let token = e["token"].as_str().unwrap().to_string();
                    out.push((index, phase, token, e["logprob"].as_f64().unwrap(), top));
                }
            } else if let Some(tokens) = lp["tokens"].as_array() {
                for (j, t) in tokens.iter().enumerate() {
                    let mut top: Vec<(String, f64)> = lp["top_logprobs"][j]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
                        .collect();
                    top.sort_by(|a, b| a.0.cmp(&b.0));
                    let lp = lp["token_logprobs"][j].as_f64().unwrap();
                    out.push((index, phase, t.as_str().unwrap().to_string(), lp, top));
                }
            }
        }
    }
    out
}

fn traced(body: &[u8], splits: &[usize], bounds: TraceBounds) -> Measurement {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).trace(bounds);
    m.on_head(t0, 200);
    let mut from = 0;
    for (k, at) in splits.iter().chain([&body.len()]).enumerate() {
        m.on_frame(t0 + ms(10 * (k as u64 + 1)), &body[from..*at], |_| {});
        from = *at;
    }
    m.finish(t0 + ms(1000), Ending::Complete)
}

fn got(t: &Trace, legacy: bool) -> Vec<Want> {
    t.tokens()
        .map(|(e, tok)| {
            let mut top: Vec<(String, f64)> = tok
                .top
                .iter()
                .map(|a| (a.token.to_string(), a.logprob.unwrap()))
                .collect();
            if legacy {
                top.sort_by(|a, b| a.0.cmp(&b.0));
            }
            let token = tok.token.as_deref().unwrap_or_default().to_string();
            (e.choice, e.phase, token, tok.logprob.unwrap(), top)
        })
        .collect()
}

#[test]
fn every_token_of_the_logprob_captures_is_traced_with_its_logprob() {
    for (name, legacy, tokens) in [
        ("stream-chat-logprobs.txt", false, 8),
        ("stream-completions-logprobs.txt", true, 4),
        ("stream-chat-tool-named-logprobs.txt", false, 0),
    ] {
        let body = capture(name).body;
        let want = oracle(body);
        assert!(!want.is_empty(), "{name}");
        if tokens > 0 {
            assert_eq!(want.len(), tokens, "{name}");
        }
        let m = traced(body, &[], TraceBounds::default());
        let trace = m.trace.as_ref().expect("a trace");
        assert_eq!(got(trace, legacy), want, "{name}");
        assert_eq!(trace.dropped_tokens, 0);
        // Summaries from the same tokens.
        let lps: Vec<f64> = want.iter().map(|w| w.3).collect();
        let s = m.logprobs.as_ref().expect("a summary");
        assert_eq!(s.tokens, lps.len() as u64, "{name}");
        let min = lps.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(s.min, min, "{name}");
        assert_eq!(lps[s.min_at as usize], min, "{name}");
        let mean = lps.iter().sum::<f64>() / lps.len() as f64;
        assert!((s.mean - mean).abs() < 1e-9, "{name}");
        // Offsets: the frame that served the event (one frame here).
        assert!(trace.events.iter().all(|e| e.offset_s == 0.01), "{name}");
    }
}

#[test]
fn tool_call_arguments_have_their_own_minimum() {
    let body = capture("stream-chat-tool-named-logprobs.txt").body;
    let want = oracle(body);
    let tool_min = want
        .iter()
        .filter(|w| w.1 == Some(Phase::ToolCall))
        .map(|w| w.3)
        .fold(f64::INFINITY, f64::min);
    assert!(tool_min.is_finite(), "the capture has tool-call tokens");
    let m = traced(body, &[], TraceBounds::default());
    let s = m.logprobs.unwrap();
    assert_eq!(s.tool_call_min, Some(tool_min));
    // Untraced: the same summary, no trace.
    let t0 = Instant::now();
    let mut plain = StreamMeter::new(t0, true);
    plain.on_head(t0, 200);
    plain.on_frame(t0 + ms(1), body, |_| {});
    let p = plain.finish(t0 + ms(2), Ending::Complete);
    assert_eq!((p.logprobs.as_ref(), p.trace.as_ref()), (Some(&s), None));
}

#[test]
fn events_without_logprobs_are_traced_with_offset_phase_and_length() {
    let body = capture("stream-chat.txt").body;
    let mid = body.len() / 2;
    let m = traced(body, &[mid], TraceBounds::default());
    assert_eq!(m.outcome, Outcome::Success);
    let t = m.trace.unwrap();
    assert_eq!(t.events.len() as u64, m.output_events);
    assert!(t.events.iter().all(|e| e.tokens.is_empty()));
    assert!(t.events.iter().all(|e| e.phase == Some(Phase::Answer)));
    assert!(t.events.iter().all(|e| e.text_len > 0));
    let offsets: Vec<f64> = t.events.iter().map(|e| e.offset_s).collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert!(offsets.contains(&0.01) && offsets.contains(&0.02));
    assert!(m.logprobs.is_none(), "no logprobs, no summary");
    // Reasoning deltas.
    let m = traced(
        capture("stream-chat-reasoning.txt").body,
        &[],
        TraceBounds::default(),
    );
    let t = m.trace.unwrap();
    assert!(t.events.iter().any(|e| e.phase == Some(Phase::Reasoning)));
}

#[test]
fn bounds_are_enforced_and_counted() {
    let body = capture("stream-chat-logprobs.txt").body;
    let m = traced(body, &[], TraceBounds { max_tokens: 3 });
    let t = m.trace.unwrap();
    assert_eq!((t.kept_tokens, t.dropped_tokens), (3, 5));
    assert_eq!(t.tokens().count(), 3);
    assert_eq!(
        m.logprobs.unwrap().tokens,
        8,
        "the summary sees every token"
    );
    let m = traced(body, &[], TraceBounds { max_tokens: 0 });
    assert!(m.trace.unwrap().events.is_empty());
}

/// A chat stream with the given logprobs, one token per event.
fn stream_of(lps: &[f64]) -> String {
    let mut s = String::new();
    for lp in lps {
        s += &format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"x\"}},\"logprobs\":{{\"content\":[{{\"token\":\"x\",\"logprob\":{lp:?},\"top_logprobs\":[]}}]}}}}]}}\n\n"
        );
    }
    s + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
}

#[test]
fn summary_table() {
    // (logprobs, min, min_at, largest drop and where)
    type Case = (&'static [f64], f64, u64, Option<(f64, u64)>);
    let cases: &[Case] = &[
        (&[-1.0, -0.5, -3.0, -2.5], -3.0, 2, Some((2.5, 2))),
        (&[-0.25], -0.25, 0, None),
        (&[-2.0, -1.0, 0.0], -2.0, 0, None),
        (&[0.0, -1.0, -0.5, -4.0], -4.0, 3, Some((3.5, 3))),
    ];
    for (lps, min, min_at, drop) in cases {
        let m = traced(stream_of(lps).as_bytes(), &[], TraceBounds::default());
        let s = m.logprobs.unwrap();
        assert_eq!((s.min, s.min_at), (*min, *min_at), "{lps:?}");
        assert_eq!(
            s.largest_drop.zip(s.largest_drop_at),
            *drop,
            "{lps:?}: largest drop"
        );
        assert_eq!(s.mean, lps.iter().sum::<f64>() / lps.len() as f64);
        assert_eq!(s.tool_call_min, None);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The trace and the summary do not depend on how the bytes were framed.
    #[test]
    fn any_framing_gives_the_same_trace(a in any::<usize>(), b in any::<usize>()) {
        for name in ["stream-chat-logprobs.txt", "stream-completions-logprobs.txt", "stream-chat-tool-named-logprobs.txt"] {
            let body = capture(name).body;
            let (mut x, mut y) = (a % (body.len() + 1), b % (body.len() + 1));
            if x > y {
                std::mem::swap(&mut x, &mut y);
            }
            let whole = traced(body, &[], TraceBounds::default());
            let split = traced(body, &[x, y], TraceBounds::default());
            let strip = |m: &Measurement| {
                let mut t = (**m.trace.as_ref().unwrap()).clone();
                t.events.iter_mut().for_each(|e| e.offset_s = 0.0);
                t
            };
            prop_assert_eq!(strip(&whole), strip(&split), "{}", name);
            prop_assert_eq!(whole.logprobs, split.logprobs);
        }
    }
}
