//! The per-event path allocates nothing of its own: SSE parsing, chunk inspection and the
//! StreamMeter, once warm (serde_json's skip stack aside, see below). Counted per thread by
//! allocation-counter's global allocator (see [`allocations`]).

use goodput_measure::sse::SseParser;
use goodput_measure::{inspect_chunk, Ending, Outcome, StreamMeter};
use tokio::time::Instant;

/// Allocations made by `f` on this thread (`f` must not hand work to other threads). Linking
/// allocation-counter makes its counting allocator this binary's global allocator; it counts
/// per thread, so the other tests of this binary allocate freely on theirs meanwhile.
fn allocations(f: impl FnOnce()) -> u64 {
    allocation_counter::measure(f).count_total
}

fn frames() -> Vec<Vec<u8>> {
    let head = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":0,"#;
    let mut v = vec![format!("data: {head}\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"finish_reason\":null}}]}}\n\n")];
    for i in 0..1000 {
        // Escapes and logprobs on some chunks: still nothing to unescape or keep.
        let lp = if i % 2 == 0 {
            r#"{"content":[{"token":"a\"b","logprob":-1.0,"bytes":[97],"top_logprobs":[]}]}"#
        } else {
            "null"
        };
        v.push(format!("data: {head}\"delta\":{{\"content\":\"x\\n\\u00e9\"}},\"logprobs\":{lp},\"finish_reason\":null}}]}}\n\n"));
    }
    v.push(format!(
        "data: {head}\"delta\":{{\"content\":\"y\"}},\"finish_reason\":\"length\"}}]}}\n\n"
    ));
    v.push(
        r#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1001}}"#.to_string()
            + "\n\n",
    );
    v.push("data: [DONE]\n\n".to_string());
    v.into_iter().map(String::into_bytes).collect()
}

#[test]
fn the_per_event_path_does_not_allocate() {
    let frames = frames();
    let whole = frames.concat();
    let small: Vec<&[u8]> = whole.chunks(37).collect();

    // The counter counts (else every `== 0` below would pass whatever the code does).
    assert_eq!(allocations(|| drop(std::hint::black_box(vec![1u8; 64]))), 1);

    // Parser, events whole inside frames: borrowed, no buffer at all.
    let mut p = SseParser::new();
    let mut n = 0;
    let a = allocations(|| {
        for f in &frames {
            p.feed(f, |_| n += 1);
        }
    });
    assert_eq!((a, n), (0, frames.len()));

    // Parser, events split across frames: the reused buffers, once grown.
    let mut p = SseParser::new();
    for f in &small {
        p.feed(f, |_| {});
    }
    let a = allocations(|| {
        for f in &small {
            p.feed(f, |_| {});
        }
    });
    assert_eq!(a, 0, "split events once warm");

    // Inspection: nothing for content chunks (even with escapes), usage, [DONE] and errors.
    // serde_json skips a nested array/object in an ignored field with an internal scratch
    // stack, allocated once per document: so a chunk with logprobs entries costs one.
    let (plain, with_logprobs): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) = frames
        .iter()
        .partition(|f| !f.windows(11).any(|w| w == b"\"content\":["));
    assert_eq!(with_logprobs.len(), 500);
    let inspect_all = |frames: &[&Vec<u8>]| {
        let mut p = SseParser::new();
        for f in frames {
            p.feed(f, |e| {
                std::hint::black_box(inspect_chunk(e.data));
            });
        }
    };
    let a = allocations(|| {
        inspect_all(&plain);
        std::hint::black_box(inspect_chunk(
            br#"{"error":{"message":"boom \"x\"","code":500}}"#,
        ));
    });
    assert_eq!(a, 0, "inspect_chunk");
    let a = allocations(|| inspect_all(&with_logprobs));
    assert!(
        a <= with_logprobs.len() as u64,
        "at most one per logprobs chunk: {a}"
    );

    // The StreamMeter, after the first chunk.
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true);
    m.on_head(t0, 200);
    m.on_frame(t0, &frames[0], |_| {});
    let mut gaps = 0;
    let a = allocations(|| {
        for f in &frames[1..] {
            m.on_frame(t0, f, |_| gaps += 1);
        }
    });
    assert!(
        a <= with_logprobs.len() as u64,
        "StreamMeter::on_frame: only serde_json's scratch: {a}"
    );
    assert_eq!(gaps, 1000);
    let got = m.finish(t0, Ending::Complete);
    assert_eq!(
        (got.outcome, got.completion_tokens),
        (Outcome::Success, Some(1001))
    );

    // Without logprobs, a whole request's frames: not one allocation.
    let mut m = StreamMeter::new(t0, true);
    m.on_head(t0, 200);
    let a = allocations(|| {
        for f in &plain {
            m.on_frame(t0, f, |_| {});
        }
    });
    assert_eq!(a, 0, "StreamMeter::on_frame without logprobs");
    assert_eq!(m.finish(t0, Ending::Complete).outcome, Outcome::Success);
}
