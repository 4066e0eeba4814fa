//! The meter on each engine's stream: llama.cpp (real `llama-server` captures: prompt_progress
//! chunks, `timings` on the last chunk, usage on the finish chunk of a completion), SGLang
//! (usage the client did not ask for), TGI (role and first token in one chunk, keep-alive
//! comment frames), and chunks that are not events of the timeline (pings, `choices: []`
//! progress). Expected values come from an independent reading of each event with serde_json.
//! llama.cpp's `timings` count the tokens exactly (`predicted_n` is the count its usage reports)
//! and survive the usage strip: they move back to the finish chunk.

use super::*;
use crate::fixtures::parse_capture;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The SSE blocks of a body (each ends with a blank line).
fn blocks(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split_inclusive("\n\n")
        .map(str::to_string)
        .collect()
}

/// An independent reading: is this block a data event with output (DESIGN: non-empty
/// `delta.content` / `reasoning_content` / `tool_calls`, or `text`)? With a choices entry?
fn read(block: &str) -> (bool, bool, Option<u64>) {
    let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
        return (false, false, None);
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
        return (false, false, None);
    };
    let choices = v["choices"].as_array().cloned().unwrap_or_default();
    let nonempty = |x: &serde_json::Value| match x {
        serde_json::Value::String(s) => !s.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        _ => false,
    };
    let output = choices.iter().any(|c| {
        nonempty(&c["delta"]["content"])
            || nonempty(&c["delta"]["reasoning_content"])
            || nonempty(&c["delta"]["tool_calls"])
            || nonempty(&c["text"])
    });
    (
        !choices.is_empty(),
        output,
        v["usage"]["completion_tokens"]
            .as_u64()
            .or(v["timings"]["predicted_n"].as_u64()),
    )
}

struct Want {
    ttfc: Option<u64>,
    ttft: Option<u64>,
    tokens: Option<u64>,
    exact: bool,
    itl_count: u64,
}

/// Block i arrives at 100 + 10 i ms; the expected values from [`read`].
fn expected(blocks: &[String]) -> Want {
    let at = |i: usize| 100 + 10 * i as u64;
    let mut w = Want {
        ttfc: None,
        ttft: None,
        tokens: None,
        exact: false,
        itl_count: 0,
    };
    let mut events = 0;
    for (i, b) in blocks.iter().enumerate() {
        let (choice, output, usage) = read(b);
        if choice && w.ttfc.is_none() {
            w.ttfc = Some(at(i));
        }
        if output {
            w.ttft.get_or_insert(at(i));
            events += 1;
        }
        if usage.is_some() {
            w.tokens = usage;
            w.exact = true;
        }
    }
    if !w.exact && events > 0 {
        w.tokens = Some(events);
    }
    w.itl_count = events.saturating_sub(1);
    w
}

fn measure(blocks: &[String]) -> Measurement {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true);
    m.on_head(t0 + ms(5), 200);
    for (i, b) in blocks.iter().enumerate() {
        m.on_frame(t0 + ms(100 + 10 * i as u64), b.as_bytes(), |_| {});
    }
    m.finish(t0 + ms(100 + 10 * blocks.len() as u64), Ending::Complete)
}

fn capture(name: &str) -> Vec<String> {
    let raw: &'static [u8] = match name {
        "stream-chat-progress-usage.txt" => include_bytes!(
            "../../../../tests/engine_fixtures/llamacpp-0c1e570/stream-chat-progress-usage.txt"
        ),
        "stream-chat.txt" => {
            include_bytes!("../../../../tests/engine_fixtures/llamacpp-0c1e570/stream-chat.txt")
        }
        "stream-chat-usage.txt" => include_bytes!(
            "../../../../tests/engine_fixtures/llamacpp-0c1e570/stream-chat-usage.txt"
        ),
        "stream-completions-usage.txt" => include_bytes!(
            "../../../../tests/engine_fixtures/llamacpp-0c1e570/stream-completions-usage.txt"
        ),
        other => panic!("no capture {other}"),
    };
    blocks(parse_capture(raw).body)
}

const SGLANG: &[&str] = &[
    "data: {\"id\":\"a1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"a1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":\"Hel\",\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"a1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":\"lo\",\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"a1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":null,\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":\"length\",\"matched_stop\":null}],\"usage\":null}\n\n",
    // --stream-response-default-include-usage: asked for or not
    "data: {\"id\":\"a1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":12,\"completion_tokens\":3,\"prompt_tokens_details\":null}}\n\n",
    "data: [DONE]\n\n",
];

/// TGI: the role arrives with the first token; axum's keep-alive sends empty comments.
const TGI: &[&str] = &[
    "data: {\"object\":\"chat.completion.chunk\",\"id\":\"\",\"created\":1,\"model\":\"m\",\"system_fingerprint\":\"3.3.0-native\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    ":\n\n",
    "data: {\"object\":\"chat.completion.chunk\",\"id\":\"\",\"created\":1,\"model\":\"m\",\"system_fingerprint\":\"3.3.0-native\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\" there\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    ":\n\n",
    "data: {\"object\":\"chat.completion.chunk\",\"id\":\"\",\"created\":1,\"model\":\"m\",\"system_fingerprint\":\"3.3.0-native\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":null}\n\n",
    "data: [DONE]\n\n",
];

/// Chunks that are not events of the timeline before the first token: an older llama.cpp's
/// progress chunk with `choices: []`, a ping event, an SSE comment.
const NOT_EVENTS: &[&str] = &[
    "data: {\"choices\":[],\"object\":\"chat.completion.chunk\",\"prompt_progress\":{\"total\":63,\"cache\":0,\"processed\":32,\"time_ms\":4}}\n\n",
    "event: ping\ndata: {\"type\":\"ping\"}\n\n",
    ": keep-alive\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"y\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

#[test]
fn every_engines_stream_is_metered_by_one_definition() {
    let own = |s: &[&str]| s.iter().map(|b| b.to_string()).collect::<Vec<_>>();
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "llama.cpp progress + usage",
            capture("stream-chat-progress-usage.txt"),
        ),
        ("llama.cpp plain", capture("stream-chat.txt")),
        ("llama.cpp usage", capture("stream-chat-usage.txt")),
        (
            "llama.cpp completions, usage on the finish chunk",
            capture("stream-completions-usage.txt"),
        ),
        ("sglang, usage unasked", own(SGLANG)),
        ("tgi, keep-alive comments", own(TGI)),
        ("not events before the first token", own(NOT_EVENTS)),
    ];
    for (name, blocks) in cases {
        let want = expected(&blocks);
        let m = measure(&blocks);
        assert_eq!(m.outcome, Outcome::Success, "{name}");
        assert_eq!(m.ttfc, want.ttfc.map(ms), "{name}: ttfc");
        assert_eq!(m.ttft, want.ttft.map(ms), "{name}: ttft");
        assert!(m.ttft.is_some(), "{name}: a stream with output has a TTFT");
        assert_eq!(m.completion_tokens, want.tokens, "{name}: tokens");
        assert_eq!(m.tokens_exact, want.exact, "{name}: exact");
        assert_eq!(m.itl_count, want.itl_count, "{name}: itl");
    }
}

/// The cases the table rests on, pinned by hand (so the independent reading cannot drift with
/// the meter): llama.cpp's progress chunks are role deltas whose `content` is null.
#[test]
fn progress_chunks_and_comments_never_start_ttft() {
    let b = capture("stream-chat-progress-usage.txt");
    assert!(b[0].contains("prompt_progress") && b[1].contains("prompt_progress"));
    let first_token = b.iter().position(|x| read(x).1).unwrap();
    assert_eq!(
        first_token, 3,
        "two progress chunks and the role chunk come first"
    );
    let m = measure(&b);
    assert_eq!(m.ttfc, Some(ms(100)));
    assert_eq!(m.ttft, Some(ms(130)));
    let m = measure(&NOT_EVENTS.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(m.ttfc, Some(ms(130)));
    assert_eq!(m.ttft, Some(ms(130)));
    assert_eq!(m.completion_tokens, Some(2));
}

/// The capture's id and every value inside `timings` masked: what differs between two
/// responses to the same request.
fn masked(body: &str) -> String {
    let mut out = String::new();
    for line in body.split_inclusive('\n') {
        let mut line = line.to_string();
        if let Some(at) = line.find("chatcmpl-") {
            let end = at + line[at..].find('"').unwrap();
            line.replace_range(at..end, "chatcmpl-ID");
        }
        if let Some(at) = line.find("\"timings\":{") {
            let end = at + line[at..].find('}').unwrap();
            line.replace_range(at..=end, "\"timings\":{T}");
        }
        out.push_str(&line);
    }
    out
}

/// Strips `body` as the proxy does after injecting usage, in frames of `frame` bytes.
fn stripped(body: &[u8], frame: usize) -> (String, Measurement) {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true).strip_usage();
    m.on_head(t0, 200);
    let mut out = std::collections::VecDeque::new();
    for (i, f) in body.chunks(frame).enumerate() {
        let t = t0 + ms(1 + i as u64);
        m.on_upstream_frame(t, bytes::Bytes::copy_from_slice(f), &mut out, |_| {});
    }
    let end = t0 + ms(1000);
    m.end_of_upstream(end, &mut out, |_| {});
    let bytes: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
    (
        String::from_utf8(bytes).unwrap(),
        m.finish(end, Ending::Complete),
    )
}

#[test]
fn llamacpp_timings_move_back_to_the_finish_chunk_when_usage_is_stripped() {
    let usage = capture("stream-chat-usage.txt").concat();
    let plain = capture("stream-chat.txt").concat();
    // The same timings, where llama-server puts them without usage: the finish chunk's end.
    let usage_line = usage
        .lines()
        .find(|l| l.contains("\"choices\":[]"))
        .unwrap();
    let timings = &usage_line[usage_line.find(",\"timings\":").unwrap()..usage_line.len() - 1];
    let finish_line = usage
        .lines()
        .find(|l| l.contains("\"finish_reason\":\"length\""))
        .unwrap();
    let want = usage.replace(&format!("{usage_line}\n\n"), "").replace(
        finish_line,
        &format!("{}{timings}}}", &finish_line[..finish_line.len() - 1]),
    );
    for frame in [usage.len(), 64, 7, 1] {
        let (got, m) = stripped(usage.as_bytes(), frame);
        assert_eq!(got, want, "frames of {frame}");
        // And the real stream without usage has that shape.
        assert_eq!(masked(&got), masked(&plain), "frames of {frame}");
        assert!(m.usage_injected && m.usage_stripped);
        assert_eq!(
            (m.prompt_tokens, m.completion_tokens, m.tokens_exact),
            (Some(63), Some(5), true)
        );
        assert_eq!(m.engine_view().cached_prompt_tokens, Some(62));
        assert_eq!(m.engine_view().ttft, Some(Duration::from_micros(242)));
    }
}

#[test]
fn llamacpp_timings_count_the_tokens_and_tell_the_engines_view() {
    // No usage chunk (the proxy does not inject for llama.cpp): `timings` on the finish chunk.
    let m = measure(&capture("stream-chat.txt"));
    assert_eq!(
        (m.prompt_tokens, m.completion_tokens, m.tokens_exact),
        (Some(63), Some(5), true)
    );
    let v = m.engine_view();
    assert_eq!(v.queue, None, "llama.cpp reports no queue time");
    assert_eq!(v.ttft, Some(Duration::from_micros(1496)));
    assert_eq!(v.decode, Some(Duration::from_micros(530)));
    assert_eq!(v.mean_itl, Some(Duration::from_nanos(132_500)));
    assert_eq!(v.cached_prompt_tokens, Some(0));
    // A usage chunk without timings would have been stripped; one with them and no finish
    // chunk held passes whole.
    let lone = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":0},\"timings\":{\"predicted_n\":0}}\n\ndata: [DONE]\n\n";
    let (got, m) = stripped(lone.as_bytes(), lone.len());
    assert_eq!(got, lone);
    assert_eq!(m.completion_tokens, Some(0));
}
