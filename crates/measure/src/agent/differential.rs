//! The agent meter as the stream meter feeds it now (from the one-pass scan, through the
//! repeat cache) against the serde reading it replaced (`reference.rs`): equal summaries on
//! every stream and body of the real captures, on the simulator's tool-call and reasoning
//! streams, and on generated streams (escapes and unicode in arguments, odd whitespace, key
//! orders, argument text holding `"finish_reason"` or `"reasoning"`, fragments and frames split
//! anywhere, several calls and choices).
//!
//! The generated events are well-formed (no key twice, no escaped key, valid UTF-8): where
//! an event is not, the two readings differ by design (the serde parse dropped the whole
//! event, the scan reads it field by field), and the `Value` oracle of
//! `inspect/differential.rs` pins the scan's reading instead.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{reference, AgentMeter, AgentSummary, ToolSet};
use crate::fixtures::parse_capture;
use crate::inspect::differential::Gen;
use crate::inspect::{inspect_chunk, inspect_response, ChunkKind};
use crate::outcome::Ending;
use crate::sse::SseParser;
use crate::StreamMeter;

const TOOLS: &str = r#"{"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}},{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}}}}}]}"#;

fn tools() -> Arc<ToolSet> {
    ToolSet::from_request(TOOLS.as_bytes()).unwrap()
}

fn at(t0: Instant, i: usize) -> Instant {
    t0 + Duration::from_millis(i as u64 + 1)
}

/// The stream meter's agent summary of `frames`, the i-th served at `at(t0, i)`.
fn scanned(
    t0: Instant,
    frames: &[&[u8]],
    streaming: bool,
    tools: &Arc<ToolSet>,
) -> Option<AgentSummary> {
    let mut m = StreamMeter::new(t0, streaming).with_tools(Some(tools.clone()));
    m.on_head(t0, 200);
    for (i, f) in frames.iter().enumerate() {
        m.on_frame(at(t0, i), f, |_| {});
    }
    m.finish(at(t0, frames.len()), Ending::Complete)
        .agent
        .map(|a| *a)
}

/// The same frames read the old way: each chunk event to [`reference::on_event`] at the
/// instant of the frame that completed it.
fn referenced(
    t0: Instant,
    frames: &[&[u8]],
    streaming: bool,
    tools: &Arc<ToolSet>,
) -> Option<AgentSummary> {
    if !streaming {
        let body = frames.concat();
        return inspect_response(&body)
            .parsed
            .then(|| reference::response_agent(&body, Some(tools)))
            .flatten();
    }
    let mut m = AgentMeter::new(t0);
    let mut p = SseParser::new();
    let mut on = |t: Instant, ev: crate::sse::SseEvent<'_>| {
        let info = inspect_chunk(ev.data);
        if ev.event != Some(b"error") && info.kind == ChunkKind::Chunk {
            reference::on_event(&mut m, t, ev.data, info.output);
        }
    };
    for (i, f) in frames.iter().enumerate() {
        p.feed(f, |ev| on(at(t0, i), ev));
    }
    p.finish(|ev| on(at(t0, frames.len().saturating_sub(1)), ev));
    let s = m.finish(Some(tools));
    (s.tool_calls > 0 || s.reasoning_tokens.is_some()).then_some(s)
}

/// Both readings of one response, framed as given; the summary.
fn same(frames: &[&[u8]], streaming: bool, what: &str) -> Option<AgentSummary> {
    let (t0, tools) = (Instant::now(), tools());
    let new = scanned(t0, frames, streaming, &tools);
    let old = referenced(t0, frames, streaming, &tools);
    assert_eq!(new, old, "{what}");
    new
}

/// A response body framed three ways: whole, one event per frame, and cut every `step` bytes.
fn same_framed(body: &[u8], streaming: bool, step: usize, what: &str) -> Option<AgentSummary> {
    let whole = same(&[body], streaming, what);
    if streaming {
        let mut events = Vec::new();
        let mut rest = body;
        while let Some(at) = rest.windows(2).position(|w| w == b"\n\n") {
            events.push(&rest[..at + 2]);
            rest = &rest[at + 2..];
        }
        events.push(rest);
        same(&events, true, what);
        let cut: Vec<&[u8]> = body.chunks(step.max(1)).collect();
        same(&cut, true, what);
    }
    whole
}

#[test]
fn every_real_capture() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/vllm-0.32"
    );
    let (mut streams, mut bodies, mut agent) = (0, 0, 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let streaming = name.starts_with("stream-");
        if !(streaming || name.starts_with("nonstream-")) {
            continue;
        }
        let raw: &'static [u8] = Vec::leak(std::fs::read(&path).unwrap());
        let body = parse_capture(raw).body;
        for step in [1, 7, 64] {
            agent += usize::from(same_framed(body, streaming, step, &name).is_some());
        }
        *if streaming { &mut streams } else { &mut bodies } += 1;
    }
    assert!(
        streams >= 20 && bodies >= 6,
        "{streams} streams, {bodies} bodies"
    );
    // Not vacuous: the tool-call and reasoning captures have an agent summary.
    assert!(agent >= 3 * 6, "{agent} summaries");
}

/// Raw HTTP/1.1 against the simulator: the response body (chunked encoding undone).
async fn post(addr: std::net::SocketAddr, body: &str, fault: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\nx-sim-fault: {fault}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let shown = || String::from_utf8_lossy(&raw[end..]).into_owned();
    assert!(head.starts_with("http/1.1 200"), "{head}{}", shown());
    if !head.contains("transfer-encoding: chunked") {
        return raw[end..].to_vec();
    }
    let (mut out, mut rest) = (Vec::new(), &raw[end..]);
    loop {
        let line = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = std::str::from_utf8(&rest[..line]).unwrap();
        let n = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&rest[line + 2..line + 2 + n]);
        rest = &rest[line + 2 + n + 2..];
    }
}

#[tokio::test]
async fn the_simulators_streams_and_bodies() {
    let sim = goodput_sim::SimServer::bind(
        goodput_sim::SimConfig::fast(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap()
    .spawn();
    let tools = &TOOLS[1..TOOLS.len() - 1];
    let named = r#""tool_choice":{"type":"function","function":{"name":"get_weather"}}"#;
    let mut agent = 0;
    for fault in [
        "tool-call=valid",
        "tool-call=invalid-json",
        "tool-call=schema-violation",
        "reasoning=3",
        "reasoning=4,tool-call=valid",
    ] {
        for extra in [
            format!(r#"{tools},{named}"#),
            format!(r#"{tools},"tool_choice":"auto","n":2"#),
            format!(r#"{tools},{named},"logprobs":true,"top_logprobs":2"#),
        ] {
            for stream in [true, false] {
                let usage = if stream {
                    r#","stream_options":{"include_usage":true}"#
                } else {
                    ""
                };
                let body = format!(
                    r#"{{"model":"tiny","messages":[{{"role":"user","content":"hi"}}],"max_tokens":40,"stream":{stream},{extra}{usage}}}"#
                );
                let got = post(sim.local_addr(), &body, fault).await;
                let what = format!("{fault} {body}");
                agent += usize::from(same_framed(&got, stream, 5, &what).is_some());
            }
        }
    }
    assert_eq!(agent, 5 * 3 * 2, "every response has an agent summary");
    sim.shutdown().await;
}

/// A JSON string of `text`, some characters written as escapes.
fn string(g: &mut Gen, text: &str) -> String {
    let mut out = String::from("\"");
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || g.chance(10) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            '/' if g.chance(30) => out.push_str("\\/"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An object of rendered members, in a random order half of the time, with odd whitespace.
fn object(g: &mut Gen, mut members: Vec<(&str, String)>) -> String {
    if g.chance(50) {
        for i in (1..members.len()).rev() {
            members.swap(i, g.below(i + 1));
        }
    }
    // No line end: it would end the SSE line.
    let ws = |g: &mut Gen| g.pick(&["", "", "", " ", "  ", "\t"]);
    let inner: Vec<String> = members
        .into_iter()
        .map(|(k, v)| format!("{}\"{k}\"{}:{}{v}{}", ws(g), ws(g), ws(g), ws(g)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// `text` cut at random character boundaries into 1-5 pieces (empty ones too).
fn fragments(g: &mut Gen, text: &str) -> Vec<String> {
    let bounds: Vec<usize> = (0..=text.len())
        .filter(|i| text.is_char_boundary(*i))
        .collect();
    let mut cuts: Vec<usize> = (0..g.below(5)).map(|_| g.pick(&bounds)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut from = 0;
    for c in cuts.into_iter().chain([text.len()]) {
        out.push(text[from..c].to_string());
        from = c;
    }
    out
}

const ARGUMENTS: &[&str] = &[
    r#"{"location": "Paris", "unit": "celsius"}"#,
    r#"{"location":"Z\u00fcrich \"old town\"","unit":"kelvin"}"#,
    r#"{"location": "東京 😀", "note": "\"finish_reason\":\"stop\""}"#,
    r#"{"reasoning": "\"reasoning\": \"tool_calls\"", "location": "x"}"#,
    r#"{"zone": "a\\b\/c\n"}"#,
    r#"{"location": "unclosed"#,
    "6e40223000012",
    "",
];

const TEXTS: &[&str] = &[
    "Hello",
    " \"reasoning\" is",
    "tool_calls",
    "finish_reason",
    "é 日本 😀",
    "a\\b\n",
    "",
];

/// One choice's delta events: reasoning, then answer text, then tool calls (each call's
/// opening delta carries id, type, index and name, maybe a first fragment).
fn choice_events(g: &mut Gen) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..g.below(3) {
        let key = g.pick(&["reasoning", "reasoning_content"]);
        let t = g.pick(TEXTS);
        let v = string(g, t);
        out.push(object(g, vec![(key, v)]));
    }
    for _ in 0..g.below(3) {
        let t = g.pick(TEXTS);
        let v = string(g, t);
        out.push(object(g, vec![("content", v)]));
    }
    for index in 0..g.below(3) {
        let name = g.pick(&["get_weather", "get_time", "nope"]);
        let args = g.pick(ARGUMENTS);
        let mut pieces = fragments(g, args);
        let mut function = vec![("name", string(g, name))];
        if g.chance(30) {
            let first = pieces.remove(0);
            function.push(("arguments", string(g, &first)));
        }
        let call = vec![
            ("id", string(g, "chatcmpl-tool-9f2a")),
            ("type", string(g, "function")),
            ("index", index.to_string()),
            ("function", object(g, function)),
        ];
        let call = object(g, call);
        out.push(object(
            g,
            vec![
                ("content", "null".into()),
                ("tool_calls", format!("[{call}]")),
            ],
        ));
        for p in pieces {
            let v = string(g, &p);
            let f = object(g, vec![("arguments", v)]);
            let call = object(g, vec![("index", index.to_string()), ("function", f)]);
            out.push(object(g, vec![("tool_calls", format!("[{call}]"))]));
        }
    }
    out
}

/// A whole stream: role chunks, the choices' deltas interleaved, finish chunks, maybe a usage
/// chunk with a reasoning count, `[DONE]`.
fn stream(g: &mut Gen) -> String {
    let n = 1 + g.below(2);
    let chunk = |g: &mut Gen, i: usize, delta: String, finish: &str| {
        let choice = vec![
            ("index", i.to_string()),
            ("delta", delta),
            ("logprobs", "null".into()),
            ("finish_reason", finish.to_string()),
        ];
        let choice = object(g, choice);
        let ev = vec![
            ("id", string(g, "chatcmpl-1")),
            ("object", string(g, "chat.completion.chunk")),
            ("created", "1".into()),
            ("model", string(g, "tiny")),
            ("choices", format!("[{choice}]")),
        ];
        format!("data: {}\n\n", object(g, ev))
    };
    let mut out = String::new();
    let mut plans: Vec<std::collections::VecDeque<String>> = Vec::new();
    for i in 0..n {
        let role = vec![("role", string(g, "assistant")), ("content", string(g, ""))];
        let role = object(g, role);
        out.push_str(&chunk(g, i, role, "null"));
        plans.push(choice_events(g).into());
    }
    while plans.iter().any(|p| !p.is_empty()) {
        let i = g.below(n);
        if let Some(d) = plans[i].pop_front() {
            out.push_str(&chunk(g, i, d, "null"));
        }
    }
    for i in 0..n {
        let finish = g.pick(&["\"stop\"", "\"tool_calls\"", "\"length\""]);
        out.push_str(&chunk(g, i, "{}".into(), finish));
    }
    if g.chance(50) {
        let details = g.pick(&[
            "null",
            r#"{"reasoning_tokens":7}"#,
            r#"{"reasoning_tokens":0}"#,
        ]);
        let usage = object(
            g,
            vec![
                ("prompt_tokens", "5".into()),
                ("completion_tokens", "9".into()),
                ("completion_tokens_details", details.into()),
            ],
        );
        let ev = object(g, vec![("choices", "[]".into()), ("usage", usage)]);
        out.push_str(&format!("data: {ev}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]
    #[test]
    fn generated_streams(seed in any::<u64>(), cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let mut g = Gen(seed);
        let body = stream(&mut g);
        let body = body.as_bytes();
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        at.sort_unstable();
        let mut frames = Vec::new();
        let mut from = 0;
        for c in at {
            frames.push(&body[from..c]);
            from = c;
        }
        frames.push(&body[from..]);
        let (t0, tools) = (Instant::now(), tools());
        let new = scanned(t0, &frames, true, &tools);
        let old = referenced(t0, &frames, true, &tools);
        prop_assert_eq!(new, old, "{}", String::from_utf8_lossy(body));
    }
}

/// The generated streams reach every reading (calls of each outcome, reasoning, answers).
#[test]
fn generated_streams_cover_every_outcome() {
    let tools = tools();
    let mut outcomes = std::collections::BTreeSet::new();
    let (mut reasoning, mut answers, mut usage) = (0, 0, 0);
    for seed in 0..400 {
        let body = stream(&mut Gen(seed));
        let s = scanned(Instant::now(), &[body.as_bytes()], true, &tools);
        if let Some(s) = s {
            outcomes.extend(s.tool_call_outcome);
            reasoning += usize::from(s.ttf_reasoning.is_some());
            answers += usize::from(s.ttf_answer.is_some());
            usage += usize::from(s.reasoning_tokens == Some(7));
        }
    }
    // Without the schema judge a violation reads as a valid call.
    let judged = if super::JUDGES_SCHEMAS { 4 } else { 3 };
    assert_eq!(outcomes.len(), judged, "{outcomes:?}");
    assert!(
        reasoning > 20 && answers > 20 && usage > 5,
        "{reasoning} {answers} {usage}"
    );
}
