//! Engines' streams through the proxy: usage an engine adds unasked (SGLang's
//! `--stream-response-default-include-usage`) reaches the client as it would straight from the
//! engine when the replica is listed in `engine.usage_unasked`, and the record counts it
//! exactly.

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_sim::{Personality, SimConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_the_engine_adds_unasked_is_never_stripped() {
    let sim = start_sim(SimConfig {
        personality: Personality::Sglang,
        stream_response_default_include_usage: true,
        seed: 3,
        ..SimConfig::with_timing(1.0, 0.5)
    })
    .await;
    let mut config = meter_config(&sim.base_url());
    config.engine.usage_unasked = vec![sim.base_url()];
    let proxy = start_proxy(config).await;
    let c = client();
    // No stream_options: the proxy injects include_usage, the engine would have sent it anyway.
    let body = chat_body(12, r#","seed":1"#);
    let direct = observe(
        &c,
        post_json(&format!("{}{CHAT}", sim.base_url()), &body),
        true,
    )
    .await;
    let via = observe(&c, post_json(&proxy.url(CHAT), &body), true).await;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let tail = |s: &str| s[s.len().saturating_sub(700)..].to_string();
    assert!(
        text(&direct.body).contains("\"usage\""),
        "{}",
        text(&direct.body)
    );
    assert!(
        via.body == direct.body,
        "proxy vs engine (ends):\n{}\n---\n{}",
        tail(&text(&via.body)),
        tail(&text(&direct.body))
    );
    let page = metrics(&proxy).await;
    assert_eq!(
        metric(&page, "goodput_proxy_generation_tokens_total", &[]),
        12.0
    );
    sim.shutdown().await;
}
