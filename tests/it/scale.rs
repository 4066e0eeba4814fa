//! The autoscaling signals end to end: streams through an in-process proxy in front of a
//! simulated engine land in the attainment windows (per model, tenant, replica) of the admin
//! `/metrics`; headroom and desired replicas stay absent while no load has broken the target;
//! the balancer's token count is served per replica, and split by the work still to do
//! (prefill until the first token, then decode as the output is served); a bad `[scale]`
//! value names its field.

use std::time::Duration;

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_sim::SimConfig;

#[tokio::test]
async fn attainment_windows_fill_and_headroom_waits_for_the_limit() {
    let sim = start_sim(SimConfig::with_timing(5.0, 2.0)).await;
    let mut c = test_config(&[sim.base_url()]);
    c.measure.models = vec!["tiny".into()];
    c.scale.tick_ms = 20;
    c.scale.load_window_ms = 100;
    let proxy = start_proxy(c).await;
    let client = client();
    for _ in 0..4 {
        let (parts, _) = send(&client, post_json(&proxy.url(CHAT), &chat_body(4, ""))).await;
        assert_eq!(parts.status, 200);
    }
    let up_url = sim.base_url();
    let up = up_url.as_str();
    let want: [(&str, &[(&str, &str)]); 6] = [
        (
            "goodput_proxy_slo_attainment",
            &[("window", "30s"), ("model", "tiny")],
        ),
        (
            "goodput_proxy_slo_attainment",
            &[("window", "5m"), ("model", "tiny")],
        ),
        (
            "goodput_proxy_slo_attainment_by_tenant",
            &[("window", "30s"), ("tenant", "none")],
        ),
        (
            "goodput_proxy_slo_attainment_by_tenant",
            &[("window", "5m"), ("tenant", "none")],
        ),
        (
            "goodput_proxy_slo_attainment_by_upstream",
            &[("window", "30s"), ("upstream", up)],
        ),
        (
            "goodput_proxy_slo_attainment_by_upstream",
            &[("window", "5m"), ("upstream", up)],
        ),
    ];
    let page = metrics(&proxy).await;
    for (name, labels) in want {
        assert_eq!(metric(&page, name, labels), 1.0, "{name} {labels:?}");
    }
    // Every request met its SLOs: the limit was never seen, so nothing is estimated.
    for name in [
        "goodput_proxy_headroom_streams",
        "goodput_proxy_headroom_tokens_per_second",
        "goodput_proxy_capacity_streams",
        "goodput_proxy_desired_replicas",
    ] {
        assert_eq!(series(&page, name).count(), 0, "{name}:\n{page}");
    }
    // The balancer's token count, per replica: nothing in flight once the streams ended.
    let mut page = metrics(&proxy).await;
    let deadline = tokio::time::Instant::now() + SLOW;
    while try_metric(
        &page,
        "goodput_proxy_upstream_tokens_in_flight",
        &[("upstream", up)],
    )
    .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tokens-in-flight series:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        page = metrics(&proxy).await;
    }
    assert_eq!(
        metric(
            &page,
            "goodput_proxy_upstream_tokens_in_flight",
            &[("upstream", up)]
        ),
        0.0
    );
}

/// One stream against an engine slow to its first token and slow per token: its prompt is
/// pending prefill until the first token, then its output is pending decode, falling as the
/// tokens are served; nothing is left once it ended.
#[tokio::test]
async fn pending_tokens_move_from_prefill_to_decode() {
    let sim = start_sim(SimConfig::with_timing(1_500.0, 150.0)).await;
    let mut c = test_config(&[sim.base_url()]);
    c.measure.models = vec!["tiny".into()];
    c.scale.tick_ms = 10;
    c.scale.load_window_ms = 100;
    let proxy = start_proxy(c).await;
    let up_url = sim.base_url();
    let up = up_url.as_str();
    let pending = |page: &str, phase: &str| {
        try_metric(
            page,
            "goodput_proxy_upstream_tokens_pending",
            &[("upstream", up), ("phase", phase)],
        )
    };
    let client = client();
    let req = post_json(&proxy.url(CHAT), &chat_body(16, ""));
    let stream = tokio::spawn(async move { send(&client, req).await });
    // (prefill, decode) as seen while the stream runs, in order.
    let mut seen: Vec<(f64, f64)> = Vec::new();
    let deadline = tokio::time::Instant::now() + SLOW;
    while !stream.is_finished() {
        assert!(tokio::time::Instant::now() < deadline, "stream too slow");
        let page = metrics(&proxy).await;
        if let (Some(p), Some(d)) = (pending(&page, "prefill"), pending(&page, "decode")) {
            seen.push((p, d));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (parts, _) = stream.await.unwrap();
    assert_eq!(parts.status, 200);
    // Waiting for its first token: the prompt's estimate, all 16 output tokens to come
    // (before it reached the replica, nothing was pending).
    let started = seen.iter().position(|&(p, _)| p > 0.0);
    let seen = &seen[started.unwrap_or(seen.len())..];
    assert!(
        seen.first().is_some_and(|&(p, d)| p > 0.0 && d == 16.0),
        "never seen in prefill: {seen:?}"
    );
    // Then decoding: no prefill left, part of the output served.
    assert!(
        seen.iter().any(|&(p, d)| p == 0.0 && d > 0.0 && d < 16.0),
        "never seen decoding: {seen:?}"
    );
    // Prefill never comes back once it was gone, and decode only falls.
    let first_decoding = seen.iter().position(|&(p, _)| p == 0.0).unwrap_or(0);
    assert!(
        seen[first_decoding..].iter().all(|&(p, _)| p == 0.0),
        "{seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[1].1 <= w[0].1), "{seen:?}");
    // Ended: nothing pending (polled: the tick sets the gauge).
    let deadline = tokio::time::Instant::now() + SLOW;
    loop {
        let page = metrics(&proxy).await;
        if pending(&page, "prefill") == Some(0.0) && pending(&page, "decode") == Some(0.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still pending:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_bad_scale_value_names_its_field() {
    let mut c = test_config(&[]);
    c.scale.target = 2.0;
    c.scale.long_window_s = 10;
    let err = c.check().unwrap_err().to_string();
    assert!(
        err.contains("scale.target") && err.contains("scale.long_window_s"),
        "{err}"
    );
}
