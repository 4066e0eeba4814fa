use super::*;
use crate::fixtures::capture;
use crate::inspect::{inspect_response_logged, scan_event_logged, ChunkKind, TokenLog};
use crate::sse::SseParser;

/// One event through the scan and into the meter, as the stream meter feeds it.
fn feed(m: &mut AgentMeter, t: Instant, data: &[u8]) {
    let mut log = TokenLog::default();
    let info = scan_event_logged(data, &mut log).info;
    if info.kind == ChunkKind::Chunk {
        if let Some(u) = info.usage {
            m.on_usage(&u);
        }
        m.on_chunk(t, &info, &log.calls, data);
    }
}

/// A non-streaming body's agent summary, as the stream meter reads it.
fn body_agent(body: &[u8], tools: Option<&ToolSet>) -> Option<AgentSummary> {
    let mut log = TokenLog::default();
    let info = inspect_response_logged(body, &mut log);
    response_agent(&log.calls, info.usage.as_ref(), body, tools)
}

const WEATHER: &str = r#"{"model":"tiny","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}}],"messages":[]}"#;

fn tools() -> Arc<ToolSet> {
    ToolSet::from_request(WEATHER.as_bytes()).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A vLLM-shaped stream: the call's opening delta, then one event per fragment.
fn call_events(name: &str, fragments: &[&str]) -> Vec<String> {
    let mut ev = vec![format!(
        r#"{{"choices":[{{"index":0,"delta":{{"content":null,"tool_calls":[{{"id":"chatcmpl-tool-1","type":"function","index":0,"function":{{"name":"{name}"}}}}]}},"logprobs":null,"finish_reason":null}}]}}"#
    )];
    for f in fragments {
        let arg = serde_json::to_string(f).unwrap();
        ev.push(format!(
            r#"{{"choices":[{{"index":0,"delta":{{"content":null,"tool_calls":[{{"index":0,"function":{{"arguments":{arg}}}}}]}},"logprobs":null,"finish_reason":null}}]}}"#
        ));
    }
    ev
}

fn summary(events: &[String], tools: Option<&ToolSet>) -> AgentSummary {
    let t0 = Instant::now();
    let mut m = AgentMeter::new(t0);
    for (i, e) in events.iter().enumerate() {
        feed(&mut m, t0 + ms(10 * (i as u64 + 1)), e.as_bytes());
    }
    m.finish(tools)
}

#[test]
fn arguments_split_anywhere_assemble_to_the_same_call() {
    let t = tools();
    let args = r#"{"location": "Z\u00fcrich \"old town\"", "unit": "celsius"}"#;
    for a in 0..=args.len() {
        for b in a..=args.len() {
            if !(args.is_char_boundary(a) && args.is_char_boundary(b)) {
                continue;
            }
            let s = summary(
                &call_events("get_weather", &[&args[..a], &args[a..b], &args[b..]]),
                Some(&t),
            );
            assert_eq!(s.tool_calls, 1);
            assert_eq!(
                s.tool_call_outcome,
                Some(ToolCallOutcome::Valid),
                "{a} {b}: {s:?}"
            );
        }
    }
}

#[test]
fn schema_checks() {
    let t = tools();
    for (args, want, path) in [
        (r#"{"location":"Paris"}"#, ToolCallOutcome::Valid, None),
        (
            r#"{"location":"Paris","unit":"kelvin"}"#,
            ToolCallOutcome::SchemaViolation,
            Some("/unit"),
        ),
        (
            r#"{"unit":"celsius"}"#,
            ToolCallOutcome::SchemaViolation,
            Some("/"),
        ),
        (
            r#"{"location":7}"#,
            ToolCallOutcome::SchemaViolation,
            Some("/location"),
        ),
        ("6e40223000012", ToolCallOutcome::SchemaViolation, Some("/")),
        (r#"{"location":"Paris""#, ToolCallOutcome::InvalidJson, None),
        ("Infinity", ToolCallOutcome::InvalidJson, None),
        ("", ToolCallOutcome::InvalidJson, None),
    ] {
        let (got, why) = t.judge("get_weather", args);
        assert_eq!(got, want, "{args}: {why:?}");
        if let Some(p) = path {
            let why = why.unwrap();
            assert!(why.starts_with(&format!("{p}: ")), "{args}: {why}");
        }
    }
    let (got, why) = t.judge("get_time", "{}");
    assert_eq!(got, ToolCallOutcome::UnknownFunction);
    assert!(why.unwrap().contains("get_time"));
    // Violations are bounded in the record.
    let long = format!(r#"{{"location":"Paris","unit":"{}"}}"#, "x".repeat(5000));
    assert!(t.judge("get_weather", &long).1.unwrap().len() <= MAX_VIOLATION_BYTES);
}

#[test]
fn the_worst_call_names_the_request() {
    let t = tools();
    let mut ev = call_events("get_weather", &[r#"{"location":"Paris"}"#]);
    // A second call (index 1) to an unknown function.
    ev.push(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"x","type":"function","index":1,"function":{"name":"nope","arguments":"{}"}}]}}]}"#.into());
    let s = summary(&ev, Some(&t));
    assert_eq!(s.tool_calls, 2);
    assert_eq!(s.tool_call_outcome, Some(ToolCallOutcome::UnknownFunction));
    assert!(s.tool_call_failed());
    // Without the request's tools only the JSON is judged.
    let s = summary(&call_events("anything", &["{\"a\":", "1}"]), None);
    assert_eq!(s.tool_call_outcome, Some(ToolCallOutcome::Valid));
    let s = summary(&call_events("anything", &["{\"a\":"]), None);
    assert_eq!(s.tool_call_outcome, Some(ToolCallOutcome::InvalidJson));
}

#[test]
fn phases_and_the_reasoning_answer_split() {
    let t0 = Instant::now();
    let mut m = AgentMeter::new(t0);
    let ev = [
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":"so"}}]}"#,
        // "reasoning" inside answer text must not count as reasoning.
        r#"{"choices":[{"index":0,"delta":{"content":"\"reasoning\" is"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"done"}}]}"#,
    ];
    for (i, e) in ev.iter().enumerate() {
        feed(&mut m, t0 + ms(10 * (i as u64 + 1)), e.as_bytes());
    }
    let s = m.finish(None);
    assert_eq!(s.ttf_reasoning, Some(ms(20)));
    assert_eq!(s.ttf_answer, Some(ms(40)));
    assert_eq!(s.reasoning_tokens, Some(2));
    assert_eq!(
        (s.ttf_tool_call, s.tool_calls, s.tool_call_outcome),
        (None, 0, None)
    );
    // A plain stream: answer only, nothing parsed.
    let mut m = AgentMeter::new(t0);
    feed(
        &mut m,
        t0 + ms(5),
        br#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#,
    );
    let s = m.finish(None);
    assert_eq!((s.ttf_answer, s.reasoning_tokens), (Some(ms(5)), None));
    // Tool-call timing: first to last tool event.
    let s = summary(&call_events("get_weather", &["{", "}"]), None);
    assert_eq!(
        (s.ttf_tool_call, s.tool_call_duration),
        (Some(ms(10)), Some(ms(20)))
    );
    assert_eq!(s.ttf_answer, None);
}

/// Every event of a capture through the meter.
fn captured(name: &str, tools: Option<&ToolSet>) -> AgentSummary {
    let t0 = Instant::now();
    let mut m = AgentMeter::new(t0);
    let mut p = SseParser::new();
    let mut i = 0;
    let c = capture(name);
    let mut each = |data: &[u8]| {
        i += 1;
        feed(&mut m, t0 + ms(i), data);
    };
    p.feed(c.body, |e| each(e.data));
    p.finish(|e| each(e.data));
    m.finish(tools)
}

#[test]
fn real_captures() {
    let t = tools();
    // Named tool_choice: the fragments "6" "e40223" "00" "0012" make a JSON number, not the
    // object the schema asks for.
    let s = captured("stream-chat-tool-named.txt", Some(&t));
    assert_eq!(s.tool_calls, 1);
    assert_eq!(
        s.tool_call_outcome,
        Some(ToolCallOutcome::SchemaViolation),
        "{s:?}"
    );
    assert_eq!(
        (s.ttf_tool_call, s.tool_call_duration),
        (Some(ms(2)), Some(ms(4)))
    );
    assert_eq!(s.ttf_answer, None);
    let s = captured("stream-chat-tool-named-logprobs.txt", Some(&t));
    assert_eq!(s.tool_calls, 1, "{s:?}");
    // auto: the random model wrote no call, plain answer text.
    let s = captured("stream-chat-tool-auto.txt", Some(&t));
    assert_eq!((s.tool_calls, s.ttf_answer), (0, Some(ms(2))));
    // Reasoning: 11 reasoning events, usage says 0 (no `<think>` ever came): the events win.
    let s = captured("stream-chat-reasoning.txt", None);
    assert_eq!(s.ttf_reasoning, Some(ms(2)));
    assert_eq!(s.ttf_answer, None);
    let body = capture("stream-chat-reasoning.txt").body;
    let events = body
        .split(|b| *b == b'\n')
        .filter(|l| l.starts_with(b"data: "))
        .count();
    assert!(s.reasoning_tokens.unwrap() >= 10 && s.reasoning_tokens.unwrap() < events as u64);
    // Non-streaming: "Infinity" is not JSON.
    let b = body_agent(capture("nonstream-chat-tool-named.txt").body, Some(&t)).unwrap();
    assert_eq!(b.tool_call_outcome, Some(ToolCallOutcome::InvalidJson));
    assert_eq!(b.ttf_answer, None);
    assert!(body_agent(capture("nonstream-chat.txt").body, Some(&t)).is_none());
}
