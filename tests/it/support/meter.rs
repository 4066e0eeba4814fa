//! Helpers for the meter integration tests: the simulated engine as upstream, a proxy that
//! knows the model `tiny`, readers for `/stats` and `/metrics`, and a client that measures its
//! own timeline with the same definitions (`StreamMeter`) the proxy uses.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use goodput_measure::meter::{Measurement, StreamMeter};
use goodput_measure::outcome::Ending;
use goodput_proxy::config::RawConfig;
use goodput_sim::{SimConfig, SimHandle, SimServer};
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

use super::proxy::*;

pub const CHAT: &str = "/v1/chat/completions";
pub const COMPL: &str = "/v1/completions";

pub async fn start_sim(cfg: SimConfig) -> SimHandle {
    SimServer::bind(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .spawn()
}

/// A test proxy in front of `upstream` with `tiny` as a configured model.
pub fn meter_config(upstream: &str) -> RawConfig {
    let mut c = test_config(&[upstream.to_string()]);
    c.measure.models = vec!["tiny".into()];
    c
}

/// `meter_config` whose records also go to the JSONL sink, a `records.jsonl` in a fresh
/// temporary directory (returned).
pub fn meter_config_with_sink(upstream: &str, tag: &str) -> (RawConfig, super::TempSink) {
    let sink = super::TempSink::new(tag);
    let mut c = meter_config(upstream);
    c.measure.sink_path = Some(sink.to_path_buf());
    (c, sink)
}

pub fn chat_body(max_tokens: u32, extra: &str) -> String {
    format!(
        r#"{{"model":"tiny","messages":[{{"role":"user","content":"Hello there"}}],"stream":true,"max_tokens":{max_tokens}{extra}}}"#
    )
}

pub fn with_fault(mut req: Request<Full<Bytes>>, fault: &str) -> Request<Full<Bytes>> {
    req.headers_mut()
        .insert("x-sim-fault", fault.parse().unwrap());
    req
}

pub async fn get_text(url: &str) -> String {
    let (parts, body) = send(&client(), get(url)).await;
    assert!(parts.status.is_success(), "{url}: {}", parts.status);
    String::from_utf8(body.to_vec()).unwrap()
}

pub async fn stats(proxy: &Proxy, query: &str) -> serde_json::Value {
    let text = get_text(&proxy.admin_url(&format!("/stats?{query}"))).await;
    serde_json::from_str(&text).unwrap()
}

pub async fn metrics(proxy: &Proxy) -> String {
    get_text(&proxy.admin_url("/metrics")).await
}

/// Waits until `/stats` (60 s window) has counted `n` requests in all.
pub async fn wait_requests(proxy: &Proxy, n: u64) -> serde_json::Value {
    let deadline = Instant::now() + SLOW;
    loop {
        let s = stats(proxy, "window=600").await;
        if s["requests"].as_u64() == Some(n) || Instant::now() > deadline {
            assert_eq!(s["requests"].as_u64(), Some(n), "{s}");
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The JSONL sink's lines once it holds `n` whole ones (fails with what it holds after
/// [`SLOW`]). Whole: ended by their newline, since the sink's writer thread may be in the middle
/// of a line when the file is read (a last line counted without its end failed to parse).
pub async fn sink_lines(path: &Path, n: usize) -> Vec<String> {
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        eventually(SLOW, || read().matches('\n').count() == n).await,
        "{}",
        read()
    );
    read()
        .split_terminator('\n')
        .take(n)
        .map(String::from)
        .collect()
}

/// [`sink_lines`], each read as JSON.
pub async fn sink_records(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let lines = sink_lines(path, n).await;
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What a client saw: status, body bytes, whether the body broke, and its own measurement.
pub struct Seen {
    pub status: u16,
    pub body: Vec<u8>,
    pub broke: bool,
    pub m: Measurement,
}

/// Sends `req` and reads the whole response, timestamping every frame on arrival.
pub async fn observe(c: &TestClient, req: Request<Full<Bytes>>, stream: bool) -> Seen {
    let t0 = Instant::now();
    let resp = tokio::time::timeout(SLOW, c.request(req))
        .await
        .expect("head in time")
        .expect("response");
    let status = resp.status().as_u16();
    let mut meter = StreamMeter::new(t0, stream);
    meter.on_head(Instant::now(), status);
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    let mut broke = false;
    loop {
        match tokio::time::timeout(SLOW, body.frame())
            .await
            .expect("frame in time")
        {
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    meter.on_frame(Instant::now(), &d, |_| {});
                    bytes.extend_from_slice(&d);
                }
            }
            Some(Err(_)) => {
                broke = true;
                break;
            }
            None => break,
        }
    }
    let ending = if broke {
        Ending::BodyError
    } else {
        Ending::Complete
    };
    let m = meter.finish(Instant::now(), ending);
    Seen {
        status,
        body: bytes,
        broke,
        m,
    }
}
