//! The simulator's agent shapes: `x-sim-fault: tool-call=...` streams one tool call
//! laid out as vLLM 0.32 streams it (tests/fixtures/vllm-0.32/stream-chat-tool-named.txt), and
//! `reasoning=N` streams N reasoning deltas before the answer.

use crate::support::raw_http::*;
use goodput_sim::{SimConfig, FAULT_HEADER};
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";

fn body(tool_choice: &str, max_tokens: u32) -> String {
    format!(
        r#"{{"model":"tiny","messages":[{{"role":"user","content":"Weather?"}}],"tools":[{{"type":"function","function":{{"name":"get_weather","parameters":{{"type":"object","properties":{{"location":{{"type":"string"}},"unit":{{"type":"string","enum":["celsius","fahrenheit"]}}}},"required":["location"]}}}}}}],"tool_choice":{tool_choice},"stream":true,"max_tokens":{max_tokens},"stream_options":{{"include_usage":true}}}}"#
    )
}

/// The stream's events as JSON (without `[DONE]`), the assembled call (name, arguments), the
/// finish reasons, and the usage's completion tokens.
struct Streamed {
    events: Vec<Value>,
    name: Option<String>,
    arguments: String,
    finish: Vec<String>,
    completion_tokens: u64,
}

fn read(r: &Resp) -> Streamed {
    assert_eq!(r.status, 200);
    assert!(r.complete);
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let events: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut s = Streamed {
        events: events.clone(),
        name: None,
        arguments: String::new(),
        finish: Vec::new(),
        completion_tokens: 0,
    };
    for e in &events {
        for c in e["choices"].as_array().unwrap() {
            for call in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(call["index"], 0);
                if let Some(n) = call["function"]["name"].as_str() {
                    assert!(call["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
                    assert_eq!(call["type"], "function");
                    s.name = Some(n.to_string());
                }
                if let Some(a) = call["function"]["arguments"].as_str() {
                    s.arguments.push_str(a);
                }
            }
            if let Some(f) = c["finish_reason"].as_str() {
                s.finish.push(f.to_string());
            }
        }
        if let Some(n) = e["usage"]["completion_tokens"].as_u64() {
            s.completion_tokens = n;
        }
    }
    s
}

async fn run(fault: &str, body: &str) -> Streamed {
    let sim = start(SimConfig::fast()).await;
    let r = send(
        sim.local_addr(),
        "POST",
        CHAT,
        &[(FAULT_HEADER, fault)],
        body,
    )
    .await;
    sim.shutdown().await;
    read(&r)
}

#[tokio::test]
async fn each_kind_of_tool_call_streams_what_it_says() {
    let named = r#"{"type":"function","function":{"name":"get_weather"}}"#;
    let valid = run("tool-call=valid", &body(named, 200)).await;
    assert_eq!(valid.name.as_deref(), Some("get_weather"));
    let args: Value = serde_json::from_str(&valid.arguments).unwrap();
    assert!(args["location"].is_string(), "{args}");
    assert_eq!(args["unit"], "celsius");
    // Named tool_choice: the choice finishes `stop` (as captured) with the last fragment;
    // one token opens the call, one per fragment follows.
    assert_eq!(valid.finish, vec!["stop"]);
    let fragments = valid
        .events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].is_string())
        .count() as u64;
    assert_eq!(valid.completion_tokens, 1 + fragments);

    let broken = run("tool-call=invalid-json", &body(named, 200)).await;
    assert!(
        serde_json::from_str::<Value>(&broken.arguments).is_err(),
        "{}",
        broken.arguments
    );
    let bad = run("tool-call=schema-violation", &body(named, 200)).await;
    let args: Value = serde_json::from_str(&bad.arguments).unwrap();
    assert_eq!(args["unit"], "not-in-enum");

    // auto: the tool parser found a call, so `tool_calls`.
    let auto = run("tool-call=valid", &body(r#""auto""#, 200)).await;
    assert_eq!(auto.finish, vec!["tool_calls"]);
    // max_tokens before the call's end cuts it, as a real engine's limit does.
    let cut = run("tool-call=valid", &body(named, 4)).await;
    assert_eq!(cut.finish, vec!["length"]);
    assert_eq!(cut.completion_tokens, 4);
    assert!(serde_json::from_str::<Value>(&cut.arguments).is_err());
}

#[tokio::test]
async fn reasoning_tokens_come_first() {
    let plain = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":8,"ignore_eos":true}"#;
    let s = run("reasoning=3", plain).await;
    let deltas: Vec<&Value> = s.events[1..]
        .iter()
        .map(|e| &e["choices"][0]["delta"])
        .collect();
    assert_eq!(deltas.len(), 8, "{:?}", s.events);
    for d in &deltas[..3] {
        assert!(
            d["reasoning"].is_string() && d.get("content").is_none(),
            "{d}"
        );
    }
    for d in &deltas[3..] {
        assert!(
            d["content"].is_string() && d.get("reasoning").is_none(),
            "{d}"
        );
    }
    let plain_usage = plain.replace(
        r#""ignore_eos":true"#,
        r#""ignore_eos":true,"stream_options":{"include_usage":true}"#,
    );
    let s = run("reasoning=3", &plain_usage).await;
    let usage = &s.events.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"], 3,
        "{usage}"
    );
    // Packed: one event may hold the last reasoning token and the first answer token.
    let s = run("reasoning=3,coalesce=2", plain).await;
    let second = &s.events[2]["choices"][0]["delta"];
    assert!(
        second["reasoning"].is_string() && second["content"].is_string(),
        "{second}"
    );
}
