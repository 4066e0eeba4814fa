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

/// A schema violation where this build judges schemas, else a valid call.
fn violation() -> ToolCallOutcome {
    if JUDGES_SCHEMAS {
        ToolCallOutcome::SchemaViolation
    } else {
        ToolCallOutcome::Valid
    }
}

#[test]
fn schema_checks() {
    let t = tools();
    for (args, want, path) in [
        (r#"{"location":"Paris"}"#, ToolCallOutcome::Valid, None),
        (
            r#"{"location":"Paris","unit":"kelvin"}"#,
            violation(),
            Some("/unit"),
        ),
        (r#"{"unit":"celsius"}"#, violation(), Some("/")),
        (r#"{"location":7}"#, violation(), Some("/location")),
        ("6e40223000012", violation(), Some("/")),
        (r#"{"location":"Paris""#, ToolCallOutcome::InvalidJson, None),
        ("Infinity", ToolCallOutcome::InvalidJson, None),
        ("", ToolCallOutcome::InvalidJson, None),
    ] {
        let (got, why) = t.judge("get_weather", args);
        assert_eq!(got, want, "{args}: {why:?}");
        if let Some(p) = path.filter(|_| JUDGES_SCHEMAS) {
            let why = why.unwrap();
            assert!(why.starts_with(&format!("{p}: ")), "{args}: {why}");
        }
    }
    let (got, why) = t.judge("get_time", "{}");
    assert_eq!(got, ToolCallOutcome::UnknownFunction);
    assert!(why.unwrap().contains("get_time"));
    // Violations are bounded in the record.
    let long = format!(r#"{{"location":"Paris","unit":"{}"}}"#, "x".repeat(5000));
    let why = t.judge("get_weather", &long).1;
    assert!(why.map_or(!JUDGES_SCHEMAS, |w| w.len() <= MAX_VIOLATION_BYTES));
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
    assert_eq!(s.tool_call_outcome, Some(violation()), "{s:?}");
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

/// `text` as a JSON string with every non-ASCII character (and `/`) written as `\u` escapes.
fn ascii_json(text: &str) -> String {
    let mut out = String::from("\"");
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii() && c != '/' && c >= ' ' => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

/// The calls a meter assembled: (choice, index, name, arguments).
fn assembled(m: &AgentMeter) -> Vec<(u32, u32, &str, &str)> {
    m.calls
        .iter()
        .map(|c| (c.choice, c.index, c.name.as_str(), c.arguments.as_str()))
        .collect()
}

#[test]
fn the_assembled_text_is_the_arguments_however_they_are_split_and_written() {
    let args = "{\"location\": \"Z\u{fc}rich \\\"old\\\" town/\u{1F600}\", \"n\": [1, 2]}";
    let bounds: Vec<usize> = (0..=args.len())
        .filter(|i| args.is_char_boundary(*i))
        .collect();
    let t0 = Instant::now();
    for &a in &bounds {
        for &b in bounds.iter().filter(|b| **b >= a) {
            for escaped in [false, true] {
                let write = |s: &str| {
                    if escaped {
                        ascii_json(s)
                    } else {
                        serde_json::to_string(s).unwrap()
                    }
                };
                let mut m = AgentMeter::new(t0);
                for (i, piece) in [&args[..a], &args[a..b], &args[b..]].iter().enumerate() {
                    let name = ["get_", "weather", ""][i];
                    let ev = format!(
                        r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"name":{},"arguments":{}}}}}]}}}}]}}"#,
                        write(name),
                        write(piece)
                    );
                    feed(&mut m, t0 + ms(i as u64), ev.as_bytes());
                }
                assert_eq!(
                    assembled(&m),
                    [(0, 0, "get_weather", args)],
                    "{a} {b} {escaped}"
                );
            }
        }
    }
}

#[test]
fn interleaved_calls_and_choices_assemble_apart() {
    let t0 = Instant::now();
    let mut m = AgentMeter::new(t0);
    let events = [
        // Two calls opened in one delta, then their fragments interleaved; choice 1 too.
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"get_weather"}},{"index":1,"id":"b","function":{"name":"get_time","arguments":"{"}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"}"}}]},"index":1}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"zone\":\"utc\"}"}},{"index":0,"function":{"arguments":"{\"location\""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":\"Paris\"}"}}]}}]}"#,
    ];
    for (i, e) in events.iter().enumerate() {
        feed(&mut m, t0 + ms(i as u64), e.as_bytes());
    }
    assert_eq!(
        assembled(&m),
        [
            (0, 0, "get_weather", r#"{"location":"Paris"}"#),
            (0, 1, "get_time", r#"{"zone":"utc"}"#),
            (1, 1, "", "}"),
        ]
    );
    let s = m.finish(Some(&tools()));
    assert_eq!(s.tool_calls, 3);
    // Choice 1's call names no function the request offered.
    assert_eq!(s.tool_call_outcome, Some(ToolCallOutcome::UnknownFunction));
}

#[test]
fn a_stream_cut_into_frames_anywhere_assembles_the_same_calls() {
    let events = call_events("get_weather", &["{\"loc", "ation\": \"Z\u{fc}", "rich\"}"]);
    let body: String = events
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .chain(["data: [DONE]\n\n".to_string()])
        .collect();
    let body = body.as_bytes();
    let t0 = Instant::now();
    let measure = |frames: &[&[u8]]| {
        let mut m = crate::StreamMeter::new(t0, true).with_tools(Some(tools()));
        for f in frames {
            m.on_frame(t0 + ms(1), f, |_| {});
        }
        m.finish(t0 + ms(2), crate::Ending::Complete).agent
    };
    let whole = measure(&[body]);
    assert_eq!(
        whole.as_ref().map(|a| (a.tool_calls, a.tool_call_outcome)),
        Some((1, Some(ToolCallOutcome::Valid)))
    );
    for cut in 0..=body.len() {
        assert_eq!(
            measure(&[&body[..cut], &body[cut..]]),
            whole,
            "cut at {cut}"
        );
    }
}

#[test]
fn reasoning_tokens_of_a_stripped_usage_chunk_count() {
    // The proxy injected usage and the strip removed its chunk: the meter hears the usage
    // through `on_usage`, reasoning count included.
    let t0 = Instant::now();
    let mut m = crate::StreamMeter::new(t0, true);
    let ev = br#"data: {"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}

"#;
    m.on_frame(t0 + ms(1), ev, |_| {});
    m.on_usage(crate::inspect::Usage {
        prompt_tokens: Some(3),
        completion_tokens: Some(12),
        reasoning_tokens: Some(9),
        ..Default::default()
    });
    let a = m.finish(t0 + ms(2), crate::Ending::Complete).agent.unwrap();
    assert_eq!(a.reasoning_tokens, Some(9));
}

#[cfg(feature = "tool-schema")]
#[test]
fn requests_with_the_same_schema_share_one_compiled_validator() {
    let compiled = |t: &ToolSet| t.functions[0].schema.compiled().unwrap();
    // The cache is the process's: tests beside this one fill it with their own schemas, and a
    // full cache is emptied, which may fall between the two requests below (it did once in
    // CI at eight test threads). Sharing must show in one of a few tries; without it, none does.
    let shared = (0..5).any(|_| {
        let (a, b) = (tools(), tools());
        for t in [&a, &b] {
            let (got, _) = t.judge("get_weather", r#"{"location":"x","unit":"kelvin"}"#);
            assert_eq!(got, ToolCallOutcome::SchemaViolation);
        }
        Arc::ptr_eq(&compiled(&a), &compiled(&b))
    });
    assert!(
        shared,
        "two requests with one schema never shared its validator"
    );
    // A schema that does not compile is cached too: the calls are judged on their JSON.
    let bad = r#"{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"no-such-type"}}}]}"#;
    for _ in 0..2 {
        let t = ToolSet::from_request(bad.as_bytes()).unwrap();
        assert_eq!(t.judge("f", "{}").0, ToolCallOutcome::Valid);
        assert_eq!(t.judge("f", "{").0, ToolCallOutcome::InvalidJson);
    }
}
