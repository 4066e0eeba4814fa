//! Parse + inspect throughput on capture-shaped streams (events/s and MB/s).
//!
//! Run: `cargo bench -p goodput-measure --bench sse -- --quick` (figures in docs/measure.md).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use goodput_measure::sse::SseParser;
use goodput_measure::{inspect_chunk, Ending, StreamMeter};
use tokio::time::Instant;

const EVENTS: usize = 1000;

/// A vLLM-0.32-shaped chat stream: role chunk, EVENTS content chunks, finish, usage, [DONE].
fn chat_stream(logprobs: bool) -> Vec<Vec<u8>> {
    let id = "chatcmpl-a45afd70d01f6372";
    let head = format!(
        r#"{{"id":"{id}","object":"chat.completion.chunk","created":1795964150,"model":"tiny","choices":[{{"index":0,"#
    );
    let mut frames = vec![format!(
        "data: {head}\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"prompt_token_ids\":null,\"prompt_text\":null}}\n\n"
    )];
    for i in 0..EVENTS {
        let lp = if logprobs {
            r#"{"content":[{"token":" will","logprob":-7.6246185302734375,"bytes":[32,119,105,108,108],"top_logprobs":[{"token":" will","logprob":-7.6246185302734375,"bytes":[32,119,105,108,108]},{"token":"ial","logprob":-7.6246161460876465,"bytes":[105,97,108]}]}]}"#
        } else {
            "null"
        };
        let finish = if i + 1 == EVENTS {
            r#""length","stop_reason":null"#
        } else {
            "null"
        };
        frames.push(format!(
            "data: {head}\"delta\":{{\"content\":\" will\\n\"}},\"logprobs\":{lp},\"finish_reason\":{finish},\"token_ids\":null}}]}}\n\n"
        ));
    }
    frames.push(format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[],\"usage\":{{\"prompt_tokens\":32,\"total_tokens\":1032,\"completion_tokens\":{EVENTS}}},\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}}\n\n"
    ));
    frames.push("data: [DONE]\n\n".to_string());
    frames.into_iter().map(String::into_bytes).collect()
}

/// The same bytes cut into fixed-size frames (events split across frames).
fn rechunk(frames: &[Vec<u8>], size: usize) -> Vec<Vec<u8>> {
    frames.concat().chunks(size).map(<[u8]>::to_vec).collect()
}

fn bench(c: &mut Criterion) {
    let shapes = [
        ("chat/event-frames", chat_stream(false)),
        ("chat/16KiB-frames", rechunk(&chat_stream(false), 16 * 1024)),
        ("chat-logprobs/event-frames", chat_stream(true)),
    ];
    for unit in ["bytes", "events"] {
        let mut g = c.benchmark_group(format!("sse_{unit}"));
        g.measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));
        for (name, frames) in &shapes {
            let bytes: usize = frames.iter().map(Vec::len).sum();
            let events = EVENTS as u64 + 3;
            g.throughput(if unit == "bytes" {
                Throughput::Bytes(bytes as u64)
            } else {
                Throughput::Elements(events)
            });
            g.bench_with_input(BenchmarkId::new("parse", name), frames, |b, frames| {
                let mut p = SseParser::new();
                b.iter(|| {
                    let mut n = 0usize;
                    for f in frames {
                        p.feed(f, |e| n += e.data.len());
                    }
                    p.finish(|e| n += e.data.len());
                    black_box(n)
                })
            });
            g.bench_with_input(
                BenchmarkId::new("parse+inspect", name),
                frames,
                |b, frames| {
                    let mut p = SseParser::new();
                    b.iter(|| {
                        let mut tokens = 0u32;
                        for f in frames {
                            p.feed(f, |e| tokens += inspect_chunk(e.data).tokens);
                        }
                        p.finish(|e| tokens += inspect_chunk(e.data).tokens);
                        black_box(tokens)
                    })
                },
            );
            g.bench_with_input(
                BenchmarkId::new("stream_meter", name),
                frames,
                |b, frames| {
                    b.iter(|| {
                        let t0 = Instant::now();
                        let mut m = StreamMeter::new(t0, true);
                        m.on_head(t0, 200);
                        for f in frames {
                            m.on_frame(t0, f, |g| {
                                black_box(g);
                            });
                        }
                        black_box(m.finish(t0, Ending::Complete))
                    })
                },
            );
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
