//! Raw records: one per request in the `/stats` ring and in the optional JSONL sink, carrying
//! the request id and the replica that served it; `/stats` query errors name the parameter.

use std::time::Duration;

use crate::support::meter::*;
use crate::support::proxy::*;
use goodput_sim::SimConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_reach_the_jsonl_sink_with_id_and_upstream() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let (config, path) = meter_config_with_sink(&sim.base_url(), "meter-records");
    let proxy = start_proxy(config).await;
    let c = client();
    for i in 0..3 {
        let mut req = post_json(&proxy.url(CHAT), &chat_body(4, ""));
        req.headers_mut()
            .insert("x-request-id", format!("rec-{i}").parse().unwrap());
        observe(&c, req, true).await;
    }
    let (parts, _) = send(&c, post_json(&proxy.url("/nope"), "{}")).await;
    assert_eq!(parts.status, 404);
    wait_requests(&proxy, 4).await;
    let lines = sink_records(&path, 4).await;
    for (i, r) in lines[..3].iter().enumerate() {
        assert_eq!(r["id"], format!("rec-{i}"), "{r}");
        assert_eq!(r["model"], "tiny", "{r}");
        assert_eq!(r["upstream"], sim.base_url(), "{r}");
        assert_eq!(r["outcome"], "success", "{r}");
        assert_eq!(r["finish_reason"], "length", "{r}");
        assert_eq!(r["stream"], true, "{r}");
        assert_eq!(r["completion_tokens"], 4, "{r}");
        assert_eq!(r["tokens_exact"], true, "{r}");
        assert!(r["ttft_s"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["slo"]["good"], true, "{r}");
    }
    assert_eq!(lines[3]["outcome"], "rejected");
    assert_eq!(lines[3]["status"], 404);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_filters_by_model_and_window_and_names_bad_parameters() {
    let sim = start_sim(SimConfig::with_timing(5.0, 1.0)).await;
    let proxy = start_proxy(meter_config(&sim.base_url())).await;
    let c = client();
    observe(&c, post_json(&proxy.url(CHAT), &chat_body(4, "")), true).await;
    let s = wait_requests(&proxy, 1).await;
    assert_eq!(s["window_seconds"], 600.0);
    assert_eq!(stats(&proxy, "window=600&model=tiny").await["requests"], 1);
    assert_eq!(stats(&proxy, "model=other").await["requests"], 0);
    // Without a window: the default (60 s).
    let s = stats(&proxy, "").await;
    assert_eq!(s["window_seconds"], 60.0, "{s}");
    assert_eq!(s["requests"], 1, "{s}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stats(&proxy, "window=0.1").await["requests"], 0);

    for (query, param) in [
        ("window=abc", "window"),
        ("window=0", "window"),
        ("window=-5", "window"),
        ("window=60&mdl=tiny", "mdl"),
    ] {
        let (parts, body) = send(&c, get(&proxy.admin_url(&format!("/stats?{query}")))).await;
        assert_eq!(parts.status, 400, "{query}");
        assert_eq!(parts.headers["content-type"], "application/json");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["param"], param, "{query}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{v}"
        );
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_id_still_reaches_the_upstream_through_the_meter() {
    let fake = start_fake().await;
    let proxy = start_proxy(meter_config(&fake.url())).await;
    let mut req = post_json(&proxy.url(CHAT), &chat_body(4, ""));
    req.headers_mut()
        .insert("x-request-id", "id-through-meter".parse().unwrap());
    req.headers_mut()
        .insert("x-fake-echo", "1".parse().unwrap());
    let (parts, body) = send(&client(), req).await;
    assert_eq!(parts.status, 200);
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let headers = echo["headers"].as_array().unwrap();
    assert!(
        headers
            .iter()
            .any(|h| h[0] == "x-request-id" && h[1] == "id-through-meter"),
        "{echo}"
    );
    // The injected usage option went upstream too (a streaming request without usage).
    assert!(
        echo["body"]
            .as_str()
            .unwrap()
            .ends_with(r#","stream_options":{"include_usage":true}}"#),
        "{echo}"
    );
}

/// The TTFT split through the whole stack: `proxy` is t0 until forwarding handed the request to
/// the upstream client (carried up with the response head), and the four parts add up to the
/// client's TTFT exactly, in whole nanoseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttft_split_starts_with_the_proxys_own_time_and_adds_up() {
    let mut cfg = SimConfig::with_timing(5.0, 1.0);
    cfg.enable_per_request_metrics = true;
    let sim = start_sim(cfg).await;
    let (config, path) = meter_config_with_sink(&sim.base_url(), "meter-split");
    let proxy = start_proxy(config).await;
    let c = client();
    for _ in 0..3 {
        observe(&c, post_json(&proxy.url(CHAT), &chat_body(4, "")), true).await;
    }
    let ns = |r: &serde_json::Value, k: &str| -> u64 {
        let s = r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
        (s * 1e9).round() as u64
    };
    for r in sink_records(&path, 3).await {
        assert_eq!(r["outcome"], "success", "{r}");
        let proxy_ns = ns(&r, "ttft_proxy_s");
        assert!(proxy_ns > 0, "the proxy's own time is measured: {r}");
        let parts =
            proxy_ns + ns(&r, "ttft_queue_s") + ns(&r, "ttft_prefill_s") + ns(&r, "ttft_rest_s");
        assert_eq!(parts, ns(&r, "ttft_s"), "{r}");
    }
    let m = metrics(&proxy).await;
    assert!(
        m.contains("goodput_proxy_overhead_seconds_count 3"),
        "one observation a request"
    );
    sim.shutdown().await;
}
