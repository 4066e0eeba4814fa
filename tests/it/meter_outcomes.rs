//! Every simulator fault (and every way a request can end) maps to its outcome, in `/stats` and
//! in `goodput_proxy_requests_total`, exactly once per request.

use std::time::Duration;

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_measure::outcome::Outcome;
use goodput_sim::SimConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// The outcome counts in `/stats` (600 s window).
async fn outcomes(proxy: &Proxy) -> serde_json::Value {
    stats(proxy, "window=600").await["outcomes"].clone()
}

/// Waits for the record of request number `n` and returns the outcome it added.
async fn outcome_of_request(proxy: &Proxy, before: &serde_json::Value, n: u64) -> String {
    let s = wait_requests(proxy, n).await;
    let after = &s["outcomes"];
    let changed: Vec<&str> = Outcome::ALL
        .iter()
        .map(|o| o.as_str())
        .filter(|o| after[o] != before[o])
        .collect();
    assert_eq!(changed.len(), 1, "before {before} after {after}");
    changed[0].to_string()
}

/// `/stats` outcomes agree with `goodput_proxy_requests_total` per outcome.
async fn assert_metrics_agree(proxy: &Proxy) {
    let s = stats(proxy, "window=600").await;
    let m = metrics(proxy).await;
    for o in Outcome::ALL {
        let want = s["outcomes"][o.as_str()].as_f64().unwrap();
        // An outcome that did not happen has no series yet; the family must exist.
        let got = metric_in_family(
            &m,
            "goodput_proxy_requests_total",
            &[("outcome", o.as_str())],
        );
        assert_eq!(got, want, "{}: {s}", o.as_str());
    }
    assert_eq!(metric(&m, "goodput_proxy_requests_in_flight", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_simulator_fault_maps_to_its_outcome() {
    let sim = start_sim(SimConfig::with_timing(10.0, 2.0)).await;
    let mut config = meter_config(&sim.base_url());
    config.upstream.first_byte_timeout_ms = 600;
    config.upstream.stream_idle_timeout_ms = 300;
    let proxy = start_proxy(config).await;
    let c = client();
    let json_body =
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":8}"#;
    // (fault, streaming, expected outcome)
    let cases: &[(&str, bool, &str)] = &[
        ("", true, "success"),
        ("", false, "success"),
        ("status=503", true, "upstream_error"),
        ("status=400", true, "rejected"),
        ("error-after=3", true, "upstream_error"),
        ("error-after=3", false, "upstream_error"),
        ("truncate-after=3", true, "truncated"),
        ("truncate-after=3", false, "truncated"),
        // The head comes at once; the first frame misses the first-byte deadline.
        ("stall-first=3000", true, "timeout"),
        // Silence between tokens beyond the idle deadline.
        ("stall-every=1500", true, "timeout"),
        ("no-done", true, "truncated"),
        // A cut JSON line is not an error object: the stream still completes with every
        // finish_reason and [DONE], which is what DESIGN.md calls success.
        ("malformed-after=3", true, "success"),
    ];
    let mut n = 0;
    for &(fault, stream, want) in cases {
        let before = outcomes(&proxy).await;
        let body = if stream {
            chat_body(8, "")
        } else {
            json_body.to_string()
        };
        let mut req = post_json(&proxy.url(CHAT), &body);
        if !fault.is_empty() {
            req = with_fault(req, fault);
        }
        let seen = observe(&c, req, stream).await;
        n += 1;
        let got = outcome_of_request(&proxy, &before, n).await;
        assert_eq!(got, want, "fault {fault:?} stream {stream}");
        if fault == "error-after=3" && stream {
            // Not a success even though the stream ends with [DONE].
            let text = String::from_utf8_lossy(&seen.body);
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            assert!(text.contains("\"error\""), "{text}");
        }
        if want == "timeout" {
            assert!(seen.broke, "the proxy cut the stream: {fault}");
        }
    }
    assert_metrics_agree(&proxy).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hangs_disconnects_and_connect_failures() {
    let sim = start_sim(SimConfig::with_timing(10.0, 5.0)).await;
    let mut config = meter_config(&sim.base_url());
    config.upstream.first_byte_timeout_ms = 500;
    let proxy = start_proxy(config).await;
    let c = client();

    // hang, the client gives up before the first-byte deadline: client_abort.
    let before = outcomes(&proxy).await;
    let req = with_fault(post_json(&proxy.url(CHAT), &chat_body(8, "")), "hang");
    assert!(
        tokio::time::timeout(Duration::from_millis(150), c.request(req))
            .await
            .is_err()
    );
    assert_eq!(outcome_of_request(&proxy, &before, 1).await, "client_abort");

    // hang, the client waits: the proxy answers 504 at the first-byte deadline: timeout.
    let before = outcomes(&proxy).await;
    let req = with_fault(post_json(&proxy.url(CHAT), &chat_body(8, "")), "hang");
    let (parts, _) = send(&c, req).await;
    assert_eq!(parts.status, 504);
    assert_eq!(outcome_of_request(&proxy, &before, 2).await, "timeout");

    // The client disconnects mid-stream: client_abort, and the engine aborts too.
    let before = outcomes(&proxy).await;
    let resp = c
        .request(post_json(&proxy.url(CHAT), &chat_body(1000, "")))
        .await
        .unwrap();
    let mut body = resp.into_body();
    read_events(&mut body, 3).await;
    drop(body);
    assert_eq!(outcome_of_request(&proxy, &before, 3).await, "client_abort");
    assert!(sim.wait_idle(SLOW).await, "the engine aborted the stream");

    // The client leaves while its body is still being read: client_abort, before the meter
    // ever saw the request.
    let before = outcomes(&proxy).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 500\r\n\r\n{\"model\":\"tiny\",",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(s);
    assert_eq!(outcome_of_request(&proxy, &before, 4).await, "client_abort");
    assert_metrics_agree(&proxy).await;
    sim.shutdown().await;

    // Nothing listens upstream: the connect fails, 502, upstream_error.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let proxy = start_proxy(meter_config(&dead_url)).await;
    let (parts, _) = send(&c, post_json(&proxy.url(CHAT), &chat_body(8, ""))).await;
    assert_eq!(parts.status, 502);
    let s = wait_requests(&proxy, 1).await;
    assert_eq!(s["outcomes"]["upstream_error"], 1, "{s}");
    assert_metrics_agree(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_own_rejections_are_recorded_once() {
    let sim = start_sim(SimConfig::with_timing(10.0, 5.0)).await;
    let mut config = meter_config(&sim.base_url());
    config.server.max_body_bytes = 1000;
    config.server.max_in_flight = 1;
    let proxy = start_proxy(config).await;
    let c = client();

    let (parts, _) = send(&c, post_json(&proxy.url("/nope"), "{}")).await;
    assert_eq!(parts.status, 404);
    let big = chat_body(8, &format!(r#","user":"{}""#, "x".repeat(2000)));
    let (parts, _) = send(&c, post_json(&proxy.url(CHAT), &big)).await;
    assert_eq!(parts.status, 413);
    // One stream holds the only in-flight slot; the next request is shed with 503.
    let resp = c
        .request(post_json(&proxy.url(CHAT), &chat_body(1000, "")))
        .await
        .unwrap();
    let (parts, _) = send(&c, post_json(&proxy.url(CHAT), &chat_body(8, ""))).await;
    assert_eq!(parts.status, 503);
    let s = wait_requests(&proxy, 3).await;
    assert_eq!(s["outcomes"]["rejected"], 3, "{s}");
    drop(resp); // the held stream: the client leaves
    let s = wait_requests(&proxy, 4).await;
    assert_eq!(s["outcomes"]["client_abort"], 1, "{s}");
    // 404 and 413 are the client's doing; the 503 shed and the abort count against goodput.
    assert_eq!(s["goodput"]["good"], 0, "{s}");
    assert_metrics_agree(&proxy).await;
    let m = metrics(&proxy).await;
    assert_eq!(
        metric(
            &m,
            "goodput_proxy_requests_total",
            &[("model", "other"), ("outcome", "rejected")]
        ),
        3.0,
        "404, 413 and the shed 503 come before the body is read: no model"
    );
    // Rejections are counted, not timed.
    assert_eq!(
        metric(&m, "goodput_proxy_e2e_request_latency_seconds_count", &[]),
        1.0
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_token_is_a_success_but_not_good() {
    let sim = start_sim(SimConfig {
        models: vec!["tiny".into(), "strict".into()],
        ..SimConfig::with_timing(300.0, 2.0)
    })
    .await;
    let mut config = meter_config(&sim.base_url());
    // Only `strict` has a TTFT SLO below the engine's 300 ms; it is labelled from the first
    // request because it has its own SLOs.
    config.slo.models.insert(
        "strict".into(),
        goodput_proxy::config::SloOverride {
            ttft_ms: Some(goodput_proxy::config::Limit::Ms(100)),
            ..Default::default()
        },
    );
    let proxy = start_proxy(config).await;
    let c = client();
    let strict = chat_body(8, "").replace(r#""model":"tiny""#, r#""model":"strict""#);
    let seen = observe(&c, post_json(&proxy.url(CHAT), &strict), true).await;
    assert_eq!(seen.status, 200);
    let s = wait_requests(&proxy, 1).await;
    assert_eq!(s["outcomes"]["success"], 1, "{s}");
    assert_eq!(s["goodput"]["good"], 0, "{s}");
    assert_eq!(s["goodput"]["ratio"], 0.0, "{s}");
    let m = metrics(&proxy).await;
    assert_eq!(
        metric(
            &m,
            "goodput_proxy_slo_violations_total",
            &[("model", "strict"), ("slo", "ttft")]
        ),
        1.0
    );
    assert_eq!(metric(&m, "goodput_proxy_goodput_requests_total", &[]), 0.0);
    // The same timing is good under the global 2 s default.
    observe(&c, post_json(&proxy.url(CHAT), &chat_body(8, "")), true).await;
    let s = wait_requests(&proxy, 2).await;
    assert_eq!(s["goodput"]["good"], 1, "{s}");
    assert_eq!(
        stats(&proxy, "window=600&model=strict").await["goodput"]["good"],
        0
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_streams_and_non_streaming_requests() {
    let sim = start_sim(SimConfig::with_timing(10.0, 2.0)).await;
    let proxy = start_proxy(meter_config(&sim.base_url())).await;
    let c = client();
    let seen = observe(
        &c,
        post_json(&proxy.url(CHAT), &chat_body(6, r#","n":2"#)),
        true,
    )
    .await;
    assert_eq!(seen.status, 200);
    let json_body =
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":7}"#;
    let seen = observe(&c, post_json(&proxy.url(CHAT), json_body), false).await;
    assert_eq!(seen.status, 200);
    let completions = r#"{"model":"tiny","prompt":"Once","max_tokens":5,"stream":true}"#;
    observe(&c, post_json(&proxy.url(COMPL), completions), true).await;
    let s = wait_requests(&proxy, 3).await;
    assert_eq!(s["outcomes"]["success"], 3, "{s}");
    assert_eq!(s["goodput"]["good"], 3, "{s}");
    // TTFT only for the two streams.
    assert_eq!(s["ttft_seconds"]["count"], 2, "{s}");
    assert_eq!(s["e2e_seconds"]["count"], 3, "{s}");
    let m = metrics(&proxy).await;
    // Usage is exact (injected for the streams): 2 x 6 + 7 + 5.
    assert_eq!(
        metric(
            &m,
            "goodput_proxy_generation_tokens_total",
            &[("model", "tiny")]
        ),
        24.0
    );
    sim.shutdown().await;
}
