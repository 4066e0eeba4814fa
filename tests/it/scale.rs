//! The autoscaling signals end to end: streams through an in-process proxy in front of a
//! simulated engine land in the attainment windows (per model, tenant, replica) of the admin
//! `/metrics`; headroom and desired replicas stay absent while no load has broken the target;
//! the balancer's token count is served per replica; a bad `[scale]` value names its field.

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
