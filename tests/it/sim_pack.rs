//! Packed events (`x-sim-fault: coalesce=K`, `coalesce_prob`), through the sim alone: shaped
//! like the packed events of `tests/fixtures/vllm-0.32/stream-chat-coalesced.txt`, K logprobs
//! entries, exact usage, ceil(tokens / K) events per choice, timing and `/metrics` per token,
//! seeded repeatability.

use std::time::Duration;

use crate::support::prom::sample;
use crate::support::raw_http::*;
use goodput_sim::{SimConfig, SimHandle, FAULT_HEADER};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHAT: &str = "/v1/chat/completions";
const COMPL: &str = "/v1/completions";
const CAPTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/vllm-0.32/stream-chat-coalesced.txt"
);

fn chat(extra: &str) -> String {
    format!(
        r#"{{"model":"tiny","messages":[{{"role":"user","content":"Hello"}}],"stream":true,"seed":1{extra}}}"#
    )
}

fn compl(extra: &str) -> String {
    format!(r#"{{"model":"tiny","prompt":"The quick brown fox","stream":true,"seed":1{extra}}}"#)
}

async fn stream(sim: &SimHandle, path: &str, fault: Option<&str>, body: &str) -> Resp {
    let headers: Vec<(&str, &str)> = fault.map(|f| (FAULT_HEADER, f)).into_iter().collect();
    let r = send(sim.local_addr(), "POST", path, &headers, body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.complete, "{}", r.text());
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    r
}

/// Events of choice `i` that carry tokens or a finish (the chat role chunk excluded).
fn content_events(r: &Resp, i: u64) -> Vec<Value> {
    r.json_events()
        .into_iter()
        .filter(|e| {
            let c = &e["choices"][0];
            e["choices"].as_array().is_some_and(|a| !a.is_empty())
                && c["index"] == i
                && c["delta"]["role"].is_null()
        })
        .collect()
}

fn text(ev: &Value) -> &str {
    let c = &ev["choices"][0];
    c["delta"]["content"]
        .as_str()
        .or_else(|| c["text"].as_str())
        .unwrap_or_else(|| panic!("no text: {ev}"))
}

/// Replaces the values of `id`, `created`, `content` and `text` (strings or numbers) so that
/// two events can be compared byte for byte on everything else: keys, order, other values.
fn mask(ev: &str) -> String {
    let mut out = ev.to_string();
    for key in ["\"id\":", "\"created\":", "\"content\":", "\"text\":"] {
        let mut from = 0;
        while let Some(p) = out[from..].find(key) {
            let start = from + p + key.len();
            let b = out.as_bytes();
            let end = if b[start] == b'"' {
                let mut j = start + 1;
                while b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                j + 1
            } else if b[start].is_ascii_digit() {
                start + b[start..].iter().take_while(|c| c.is_ascii_digit()).count()
            } else {
                from = start;
                continue;
            };
            out.replace_range(start..end, "\"~\"");
            from = start + 3;
        }
    }
    out
}

/// (request body, data payloads) of the capture.
fn capture() -> (String, Vec<String>) {
    let raw = std::fs::read_to_string(CAPTURE).unwrap();
    let body = raw
        .lines()
        .find_map(|l| l.strip_prefix("### request body: "))
        .unwrap()
        .to_string();
    let (_, resp) = raw.split_once("\r\n\r\n").unwrap();
    let events = resp
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap().to_string())
        .collect();
    (body, events)
}

#[tokio::test]
async fn packed_events_are_shaped_like_the_capture_with_the_texts_concatenated() {
    let (body, cap) = capture();
    // The capture: role, 44 content events for 48 tokens, usage, [DONE].
    assert_eq!(cap.len(), 47);
    let cap_plain = mask(&cap[1]);
    let cap_finish = mask(&cap[cap.len() - 3]);
    assert!(cap_finish.contains("\"finish_reason\":\"length\""));
    let sim = start(SimConfig::fast()).await;
    let plain = stream(&sim, CHAT, None, &body).await;
    for k in [2usize, 3, 5] {
        let packed = stream(&sim, CHAT, Some(&format!("coalesce={k}")), &body).await;
        let ev = packed.events();
        let events = 48usize.div_ceil(k);
        assert_eq!(ev.len(), 1 + events + 1 + 1, "coalesce={k}: {ev:?}");
        // Role chunk, usage chunk: the capture's bytes but for id and created.
        assert_eq!(mask(&ev[0]), mask(&cap[0]), "coalesce={k}");
        assert_eq!(
            mask(&ev[ev.len() - 2]),
            mask(&cap[cap.len() - 2]),
            "coalesce={k}: usage exact"
        );
        // Each packed event: an ordinary token chunk of the capture, byte for byte but for
        // the text, which is the concatenation of the K tokens' texts.
        let unpacked: Vec<String> = content_events(&plain, 0)
            .iter()
            .map(|e| text(e).to_string())
            .collect();
        assert_eq!(unpacked.len(), 48);
        let got = content_events(&packed, 0);
        for (j, e) in got.iter().enumerate() {
            let raw = &ev[1 + j];
            let want = if j + 1 == events {
                &cap_finish
            } else {
                &cap_plain
            };
            assert_eq!(&mask(raw), want, "coalesce={k} event {j}");
            let end = ((j + 1) * k).min(48);
            assert_eq!(
                text(e),
                unpacked[j * k..end].concat(),
                "coalesce={k} event {j}"
            );
        }
    }
    sim.shutdown().await;
}

/// Per event: how many tokens it holds (from its logprobs entries).
fn chat_entries(ev: &Value) -> Vec<Value> {
    ev["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs: {ev}"))
        .clone()
}

#[tokio::test]
async fn packed_events_carry_one_logprobs_entry_per_token() {
    let sim = start(SimConfig::fast()).await;
    // Chat: K `logprobs.content` entries, the same entries as one token per event.
    let body = chat(r#","max_tokens":10,"logprobs":true,"top_logprobs":2"#);
    let plain = stream(&sim, CHAT, None, &body).await;
    let packed = stream(&sim, CHAT, Some("coalesce=4"), &body).await;
    let events = content_events(&packed, 0);
    let sizes: Vec<usize> = events.iter().map(|e| chat_entries(e).len()).collect();
    assert_eq!(sizes, vec![4, 4, 2]);
    for e in &events {
        let joined: String = chat_entries(e)
            .iter()
            .map(|t| t["token"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(text(e), joined, "the text is the tokens' texts");
        assert!(chat_entries(e)
            .iter()
            .all(|t| t["top_logprobs"].as_array().unwrap().len() == 2));
    }
    let flat = |evs: &[Value]| evs.iter().flat_map(chat_entries).collect::<Vec<_>>();
    assert_eq!(flat(&events), flat(&content_events(&plain, 0)));

    // Legacy completions: K entries in each of the four lists, offsets continuing.
    let body = compl(r#","max_tokens":10,"logprobs":2"#);
    let plain = stream(&sim, COMPL, None, &body).await;
    let packed = stream(&sim, COMPL, Some("coalesce=4"), &body).await;
    let events = content_events(&packed, 0);
    let list = |e: &Value, k: &str| e["choices"][0]["logprobs"][k].as_array().unwrap().clone();
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        let sizes: Vec<usize> = events.iter().map(|e| list(e, key).len()).collect();
        assert_eq!(sizes, vec![4, 4, 2], "{key}");
        let flat = |evs: &[Value]| evs.iter().flat_map(|e| list(e, key)).collect::<Vec<_>>();
        assert_eq!(flat(&events), flat(&content_events(&plain, 0)), "{key}");
    }
    let mut offset = 0;
    for e in &events {
        assert_eq!(list(e, "text_offset")[0], offset);
        offset += text(e).chars().count() as u64;
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn usage_stays_exact_and_continuous_usage_counts_tokens() {
    let sim = start(SimConfig::fast()).await;
    let body = chat(
        r#","max_tokens":10,"stream_options":{"include_usage":true,"continuous_usage_stats":true}"#,
    );
    let r = stream(&sim, CHAT, Some("coalesce=3"), &body).await;
    let counts: Vec<u64> = content_events(&r, 0)
        .iter()
        .map(|e| e["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, vec![3, 6, 9, 10]);
    let j = r.json_events();
    let last = &j[j.len() - 1];
    assert_eq!(last["choices"], serde_json::json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 10);
    assert_eq!(
        last["usage"]["total_tokens"],
        last["usage"]["prompt_tokens"].as_u64().unwrap() + 10
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn each_choice_gets_ceil_tokens_over_k_events() {
    let sim = start(SimConfig::fast()).await;
    // (path, n, max_tokens, K)
    let cases: [(&str, u64, u64, usize); 9] = [
        (CHAT, 1, 5, 1),
        (CHAT, 1, 5, 2),
        (CHAT, 1, 5, 5),
        (CHAT, 1, 5, 6),
        (CHAT, 1, 1, 3),
        (CHAT, 2, 7, 3),
        (CHAT, 3, 8, 4),
        (COMPL, 1, 9, 4),
        (COMPL, 3, 5, 2),
    ];
    for (path, n, max, k) in cases {
        let extra =
            format!(r#","n":{n},"max_tokens":{max},"stream_options":{{"include_usage":true}}"#);
        let body = if path == CHAT {
            chat(&extra)
        } else {
            compl(&extra)
        };
        let r = stream(&sim, path, Some(&format!("coalesce={k}")), &body).await;
        let case = format!("{path} n={n} max_tokens={max} coalesce={k}");
        for i in 0..n {
            let evs = content_events(&r, i);
            assert_eq!(evs.len(), (max as usize).div_ceil(k), "{case} choice {i}");
            let (last, rest) = evs.split_last().unwrap();
            assert_eq!(last["choices"][0]["finish_reason"], "length", "{case}");
            assert!(rest
                .iter()
                .all(|e| e["choices"][0]["finish_reason"].is_null()));
        }
        if path == CHAT {
            // Each choice's role chunk comes before its first content event.
            let j = r.json_events();
            for i in 0..n {
                let role = j.iter().position(|e| {
                    e["choices"][0]["index"] == i && e["choices"][0]["delta"]["role"] == "assistant"
                });
                let first = j.iter().position(|e| {
                    e["choices"][0]["index"] == i && e["choices"][0]["delta"]["role"].is_null()
                });
                assert!(role.unwrap() < first.unwrap(), "{case}");
            }
        }
        let j = r.json_events();
        assert_eq!(
            j[j.len() - 1]["usage"]["completion_tokens"],
            n * max,
            "{case}"
        );
    }
    sim.shutdown().await;
}

/// Event sizes of one stream, from continuous usage.
fn sizes(r: &Resp) -> Vec<u64> {
    let mut prev = 0;
    content_events(r, 0)
        .iter()
        .map(|e| {
            let c = e["usage"]["completion_tokens"].as_u64().unwrap();
            let d = c - prev;
            prev = c;
            d
        })
        .collect()
}

async fn prob_run(seed: u64, fault: Option<&str>) -> Vec<Vec<u64>> {
    let sim = start(SimConfig {
        coalesce_prob: 0.5,
        seed,
        ..SimConfig::fast()
    })
    .await;
    let body = chat(
        r#","max_tokens":40,"stream_options":{"include_usage":true,"continuous_usage_stats":true}"#,
    );
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(sizes(&stream(&sim, CHAT, fault, &body).await));
    }
    sim.shutdown().await;
    out
}

#[tokio::test]
async fn coalesce_prob_is_seeded_and_the_header_overrides_it() {
    let a = prob_run(5, None).await;
    for s in &a {
        assert_eq!(s.iter().sum::<u64>(), 40, "{s:?}");
        // 39 boundaries, each merged with probability 1/2.
        assert!((8..=32).contains(&s.len()), "{s:?}");
    }
    assert_ne!(a[0], a[1], "each arrival draws its own boundaries");
    assert_eq!(prob_run(5, None).await, a, "same seed, same arrival order");
    assert_ne!(prob_run(6, None).await, a, "another seed");
    let off = prob_run(5, Some("coalesce=1")).await;
    assert!(off
        .iter()
        .all(|s| s.len() == 40 && s.iter().all(|&x| x == 1)));
    let fixed = prob_run(5, Some("coalesce=8")).await;
    assert!(fixed.iter().all(|s| *s == vec![8; 5]));
}

#[tokio::test]
async fn a_packed_event_leaves_with_its_last_token_and_metrics_count_tokens() {
    const TPOT_MS: u64 = 20;
    let sim = start(SimConfig::with_timing(0.0, TPOT_MS as f64)).await;
    let mut s = tokio::net::TcpStream::connect(sim.local_addr())
        .await
        .unwrap();
    let body = chat(r#","max_tokens":8"#);
    let sent = tokio::time::Instant::now();
    s.write_all(&request_bytes(
        "POST",
        CHAT,
        &[(FAULT_HEADER, "coalesce=4")],
        &body,
    ))
    .await
    .unwrap();
    // Arrival time of each content event (counted by `"token_ids":null` in the bytes).
    let mut raw = Vec::new();
    let mut arrivals = Vec::new();
    let mut buf = [0u8; 16384];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
            let seen = memchr::memmem::find_iter(&raw, b"\"token_ids\":null").count();
            while arrivals.len() < seen {
                arrivals.push(sent.elapsed());
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(arrivals.len(), 2, "{}", String::from_utf8_lossy(&raw));
    // Tokens 1..4 then 5..8: each event waits for its 4th token, 3 and 7 steps after the first.
    let step = Duration::from_millis(TPOT_MS);
    assert!(arrivals[0] >= step * 3, "{arrivals:?}");
    assert!(arrivals[1] >= step * 7, "{arrivals:?}");
    // The engine counts tokens and steps, not events.
    let m = sim.metrics_text();
    let l = |f: &str| format!("vllm:{f}{{engine=\"0\",model_name=\"tiny\"}}");
    assert_eq!(sample(&m, &l("generation_tokens_total")), 8.0);
    assert_eq!(sample(&m, &l("inter_token_latency_seconds_count")), 7.0);
    let tpot = sample(&m, &l("request_time_per_output_token_seconds_sum"));
    assert!(tpot >= 0.020, "TPOT over 7 steps, not 1 gap: {tpot}");
    sim.shutdown().await;
}
