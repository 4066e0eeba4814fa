//! Instructions per SSE event of the metering path, counted by callgrind (stable on a shared,
//! noisy machine, where wall time is not). One vLLM-0.32-shaped chat stream with usage
//! (role chunk, content chunks, finish chunk, usage chunk, `[DONE]`), one event per frame, fed
//! to one of:
//! - `inspect`: the SSE parser and `inspect_chunk` per event;
//! - `repeat`: the SSE parser and `RepeatCache::inspect` (what the meter calls) per event;
//! - `meter`: `StreamMeter::on_frame` (parser, inspection, timeline);
//! - `strip`: `StreamMeter::on_upstream_frame` with the usage strip (what runs when the proxy
//!   injected usage: one pass frames, strips and meters);
//! - `streams`: the proxy benchmark's stream (`scripts/bench-instructions.sh`), per request: a
//!   fresh stripping meter, 64 tokens with usage packed into one frame (the zero-cost
//!   simulator's), the end of upstream and `finish`; the count is streams, not events;
//! - `json`: the same for a non-streaming body of 64 tokens (one frame, `finish` scans it).
//!
//! ```text
//! cargo bench -p goodput-measure --bench event_cost --no-run
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='*event_cost::run*' target/release/deps/event_cost-<hash> meter 20000
//! ```
//! Instructions per event = the `Collected` count / (events + 3); `streams` and `json`:
//! per request = `Collected` / the count. Without valgrind it prints
//! the wall time per event (noisy here; callgrind's count is the figure to compare).

use std::hint::black_box;

use bytes::Bytes;
use goodput_measure::inspect::RepeatCache;
use goodput_measure::sse::SseParser;
use goodput_measure::{inspect_chunk, Ending, StreamMeter};
use tokio::time::Instant;

fn chat_stream(events: usize) -> Vec<Bytes> {
    let id = "chatcmpl-a45afd70d01f6372";
    let head = format!(
        r#"{{"id":"{id}","object":"chat.completion.chunk","created":1795964150,"model":"tiny","choices":[{{"index":0,"#
    );
    let mut frames = vec![format!(
        "data: {head}\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"prompt_token_ids\":null,\"prompt_text\":null}}\n\n"
    )];
    // Real token texts differ from event to event (the repeat cache must compare, not match).
    const WORDS: [&str; 8] = [" will", " the", "ing", ",", " model", " a", " stream", "."];
    for i in 0..events {
        let word = WORDS[i % WORDS.len()];
        let finish = if i + 1 == events {
            r#""length","stop_reason":null"#
        } else {
            "null"
        };
        frames.push(format!(
            "data: {head}\"delta\":{{\"content\":\"{word}\"}},\"logprobs\":null,\"finish_reason\":{finish},\"token_ids\":null}}]}}\n\n"
        ));
    }
    frames.push(format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[],\"usage\":{{\"prompt_tokens\":32,\"total_tokens\":{},\"completion_tokens\":{events}}},\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}}\n\n",
        32 + events
    ));
    frames.push("data: [DONE]\n\n".to_string());
    frames.into_iter().map(Bytes::from).collect()
}

/// A vLLM-0.32-shaped non-streaming chat response of `tokens` tokens (the simulator's shape).
fn json_body(tokens: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = [
        " will", " the", "ing", ",", " model", " a", " stream", "\\n",
    ];
    let text: String = (0..tokens).map(|i| WORDS[i % WORDS.len()]).collect();
    format!(
        r#"{{"id":"chatcmpl-33293d87547d86d8","object":"chat.completion","created":1796281789,"model":"tiny","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null}},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-f1283a03","usage":{{"prompt_tokens":15,"total_tokens":{},"completion_tokens":{tokens},"prompt_tokens_details":null,"completion_tokens_details":null}},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}}"#,
        15 + tokens
    )
    .into_bytes()
}

#[inline(never)]
fn run(mode: &str, frames: &[Bytes], count: usize) -> u64 {
    match mode {
        "inspect" => {
            let mut p = SseParser::new();
            let mut tokens = 0u64;
            for f in frames {
                p.feed(f, |e| tokens += u64::from(inspect_chunk(e.data).tokens));
            }
            p.finish(|e| tokens += u64::from(inspect_chunk(e.data).tokens));
            tokens
        }
        "repeat" => {
            let mut p = SseParser::new();
            let mut c = RepeatCache::new();
            let mut tokens = 0u64;
            for f in frames {
                p.feed(f, |e| tokens += u64::from(c.inspect(e.data).0.tokens));
            }
            p.finish(|e| tokens += u64::from(c.inspect(e.data).0.tokens));
            tokens
        }
        "meter" => {
            let t0 = Instant::now();
            let mut m = StreamMeter::new(t0, true);
            m.on_head(t0, 200);
            for f in frames {
                m.on_frame(t0, f, |g| {
                    black_box(g);
                });
            }
            black_box(m.finish(t0, Ending::Complete));
            0
        }
        "strip" => {
            let t0 = Instant::now();
            let mut m = StreamMeter::new(t0, true).strip_usage();
            m.on_head(t0, 200);
            let mut out = std::collections::VecDeque::new();
            let mut bytes = 0u64;
            for f in frames {
                m.on_upstream_frame(t0, f.clone(), &mut out, |g| {
                    black_box(g);
                });
                bytes += out.drain(..).map(|b| b.len() as u64).sum::<u64>();
            }
            m.end_of_upstream(t0, &mut out, |_| {});
            black_box(m.finish(t0, Ending::Complete));
            bytes + out.drain(..).map(|b| b.len() as u64).sum::<u64>()
        }
        "streams" => {
            let frame: Bytes = frames.concat().into();
            let t0 = Instant::now();
            let mut out = std::collections::VecDeque::new();
            let mut bytes = 0u64;
            for _ in 0..count {
                let mut m = StreamMeter::new(t0, true).strip_usage();
                m.on_head(t0, 200);
                if let Some(whole) = m.strip_frame(t0, frame.clone(), &mut out, |g| {
                    black_box(g);
                }) {
                    bytes += whole.len() as u64;
                }
                m.end_of_upstream(t0, &mut out, |_| {});
                black_box(m.finish(t0, Ending::Complete));
                bytes += out.drain(..).map(|b| b.len() as u64).sum::<u64>();
            }
            bytes
        }
        "json" => {
            let body = json_body(64);
            let t0 = Instant::now();
            for _ in 0..count {
                let mut m = StreamMeter::new(t0, false);
                m.on_head(t0, 200);
                m.on_frame(t0, &body, |_| {});
                black_box(m.finish(t0, Ending::Complete));
            }
            0
        }
        other => {
            eprintln!("unknown mode {other}: inspect, repeat, meter, strip, streams or json");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let mode = args.first().map_or("meter", String::as_str);
    let events: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let per_request = matches!(mode, "streams" | "json");
    let frames = chat_stream(if per_request { 64 } else { events });
    let start = Instant::now();
    let out = run(mode, &frames, events);
    let wall = start.elapsed().as_nanos() as f64;
    if per_request {
        let per = wall / events as f64;
        println!("{mode}: {events} requests, {per:.0} ns/request (wall), {out}");
    } else {
        let per_event = wall / frames.len() as f64;
        println!(
            "{mode}: {} events, {per_event:.0} ns/event (wall), {out}",
            frames.len()
        );
    }
}
