//! The simulator's streams: shape, determinism, errors, non-streaming bodies.

use crate::support::raw_http::*;
use goodput_sim::SimConfig;

const CHAT: &str = "/v1/chat/completions";
const COMPL: &str = "/v1/completions";

#[tokio::test]
async fn chat_stream_has_role_chunk_tokens_finish_and_done() {
    let sim = start(SimConfig::fast()).await;
    let r = post(sim.local_addr(), CHAT, r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":5}"#).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(r.header("server"), Some("uvicorn"));
    assert_eq!(r.header("vary"), Some("Origin"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert!(r.complete);
    let ev = r.events();
    assert_eq!(ev.len(), 1 + 5 + 1);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let j = r.json_events();
    assert_eq!(j[0]["choices"][0]["delta"]["role"], "assistant");
    for (i, c) in j[1..].iter().enumerate() {
        let fr = &c["choices"][0]["finish_reason"];
        if i == 4 {
            assert_eq!(fr, "length");
        } else {
            assert!(fr.is_null());
        }
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn identical_requests_give_identical_bytes() {
    let sim = start(SimConfig::fast()).await;
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":20}"#;
    let a = post(sim.local_addr(), CHAT, body).await;
    let b = post(sim.local_addr(), CHAT, body).await;
    assert_eq!(a.body, b.body);
    let other = post(sim.local_addr(), CHAT, &body.replace("Hi", "Ho")).await;
    assert_ne!(a.body, other.body);
    // Another sim process with the same seed: same bytes except `created`.
    let sim2 = start(SimConfig::fast()).await;
    let c = post(sim2.local_addr(), CHAT, body).await;
    let strip = |r: &Resp| {
        r.json_events()
            .into_iter()
            .map(|mut v| {
                v["created"] = 0.into();
                v
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&a), strip(&c));
    sim.shutdown().await;
    sim2.shutdown().await;
}

#[tokio::test]
async fn completions_stream_has_no_role_chunk_and_usage_when_asked() {
    let sim = start(SimConfig::fast()).await;
    let r = post(sim.local_addr(), COMPL, r#"{"model":"tiny","prompt":"The quick brown fox","stream":true,"max_tokens":3,"stream_options":{"include_usage":true}}"#).await;
    let j = r.json_events();
    assert_eq!(j.len(), 3 + 1);
    assert!(j[0]["choices"][0]["text"].is_string());
    assert_eq!(j[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(j[3]["choices"].as_array().unwrap().len(), 0);
    assert_eq!(j[3]["usage"]["completion_tokens"], 3);
    assert_eq!(j[3]["system_fingerprint"], "vllm-0.32.0-f1283a03");
    assert!(j[2].get("system_fingerprint").is_none());
    sim.shutdown().await;
}

#[tokio::test]
async fn non_streaming_chat_and_completions_bodies() {
    let sim = start(SimConfig::fast()).await;
    let r = post(
        sim.local_addr(),
        CHAT,
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"n":2}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["usage"]["prompt_tokens"], 15);
    assert_eq!(v["usage"]["completion_tokens"], 16);
    let r = post(
        sim.local_addr(),
        COMPL,
        r#"{"model":"tiny","prompt":"x","max_tokens":4,"logprobs":1}"#,
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn stop_string_and_eos_finish_with_stop() {
    let sim = start(SimConfig::fast()).await;
    let r = post(sim.local_addr(), CHAT, r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":400,"stop":["e"]}"#).await;
    let j = r.json_events();
    let last = &j[j.len() - 1]["choices"][0];
    assert_eq!(last["finish_reason"], "stop");
    assert_eq!(last["stop_reason"], "e");
    let text: String = j[1..]
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(!text.contains('e'));

    let sim2 = start(SimConfig {
        stop_prob: 0.3,
        ..SimConfig::fast()
    })
    .await;
    let r = post(
        sim2.local_addr(),
        CHAT,
        r#"{"messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":1000}"#,
    )
    .await;
    let j = r.json_events();
    assert!(j.len() < 200);
    assert_eq!(j[j.len() - 1]["choices"][0]["finish_reason"], "stop");
    assert!(j[j.len() - 1]["choices"][0]["stop_reason"].is_null());
    sim.shutdown().await;
    sim2.shutdown().await;
}

#[tokio::test]
async fn errors_are_vllm_json_before_any_stream() {
    let sim = start(SimConfig::fast()).await;
    let a = sim.local_addr();
    let r = post(
        a,
        CHAT,
        r#"{"model":"no-such-model","messages":[{"role":"user","content":"Hello"}],"stream":true}"#,
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.text(),
        r#"{"error":{"message":"The model `no-such-model` does not exist. Valid aliases: tiny.","type":"NotFoundError","param":"model","code":404}}"#
    );
    let r = post(a, CHAT, r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":100000}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        r#"{"error":{"message":"max_tokens=100000 cannot be greater than max_model_len=2048. Please request fewer output tokens. (parameter=max_tokens, value=100000)","type":"BadRequestError","param":"max_tokens","code":400}}"#
    );
    // Request validation (pydantic) errors: "Bad Request", param = body.<loc>.
    for (body, param) in [
        (r#"{"model":"tiny","#, "body.16"),
        (r#"{"model":"tiny","stream":true}"#, "body.messages"),
    ] {
        let r = post(a, CHAT, body).await;
        assert_eq!(r.status, 400, "{body}");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["type"], "Bad Request", "{body}");
        assert_eq!(v["error"]["param"], param, "{body}");
        assert_eq!(v["error"]["code"], 400);
    }
    let r = get(a, "/nope").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"detail":"Not Found"}"#)
    );
    assert_eq!(sim.requests_started(), 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn info_endpoints() {
    let sim = start(SimConfig {
        models: vec!["tiny".into(), "big".into()],
        ..SimConfig::fast()
    })
    .await;
    let a = sim.local_addr();
    let r = get(a, "/v1/models").await;
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["data"][1]["id"], "big");
    assert_eq!(v["data"][0]["max_model_len"], 2048);
    let r = get(a, "/health").await;
    assert_eq!(
        (r.status, r.body.len(), r.header("content-length")),
        (200, 0, Some("0"))
    );
    assert_eq!(get(a, "/version").await.text(), r#"{"version":"0.32.0"}"#);
    assert_eq!(get(a, "/load").await.text(), r#"{"server_load":0}"#);
    let m = get(a, "/metrics").await;
    assert!(m
        .text()
        .contains("vllm:num_requests_running{engine=\"0\",model_name=\"big\"} 0.0"));
    sim.shutdown().await;
}
