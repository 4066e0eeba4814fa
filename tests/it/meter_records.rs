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
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
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
