//! The simulator under vLLM's stream options against the real captures of those options
//! (`tests/fixtures/vllm-0.32/options/`, see its README): chunk structure as in
//! `sim_fidelity` (keys in order, value types, the values that carry meaning), event counts
//! where they do not depend on timing, keep-alive comments where the capture has them.

use super::sim_fidelity::{
    fixed_headers, header_names, replay_with, sim_head, skeleton, stream_shape,
};
use goodput_sim::SimConfig;

/// Replays each capture against a sim started with `cfg` and compares the streams; `counts`:
/// the number of events must match too (packing by the interval, not by timing).
async fn streams_match(cfg: &SimConfig, names: &[&str], counts: bool) {
    for name in names {
        let (cap, r) = replay_with(&format!("options/{name}"), cfg.clone()).await;
        // vLLM's fingerprint hashes part of the engine's configuration (`--max-num-seqs 1`
        // gave `755e1373`); the sim has the default one.
        let want = cap
            .resp_body
            .replace("vllm-0.32.0-755e1373", "vllm-0.32.0-f1283a03");
        let head = sim_head(&r);
        assert_eq!(header_names(&head), header_names(&cap.head), "{name}");
        assert_eq!(fixed_headers(&head), fixed_headers(&cap.head), "{name}");
        assert!(r.complete, "{name}");
        assert_eq!(
            stream_shape(&r.text()),
            stream_shape(&want),
            "{name}: chunk structure"
        );
        if counts {
            assert_eq!(
                r.text().matches("\n\n").count(),
                want.matches("\n\n").count(),
                "{name}: event count"
            );
        }
    }
}

#[tokio::test]
async fn stream_interval_packs_as_vllm_does() {
    let cfg = SimConfig {
        stream_interval: 4,
        ..SimConfig::fast()
    };
    let names = [
        "interval4-stream-chat.txt",
        "interval4-stream-chat-usage.txt",
        "interval4-stream-chat-usage-continuous.txt",
        "interval4-stream-chat-logprobs-usage.txt",
        "interval4-stream-chat-n2-usage.txt",
        "interval4-stream-chat-max1.txt",
        "interval4-stream-completions.txt",
        "interval4-stream-completions-usage.txt",
    ];
    streams_match(&cfg, &names, true).await;
}

#[tokio::test]
async fn forced_usage_rides_on_every_chunk_and_ends_the_stream() {
    let cfg = SimConfig {
        enable_force_include_usage: true,
        ..SimConfig::fast()
    };
    let names = [
        "force-stream-chat.txt",
        "force-stream-chat-usage.txt",
        "force-stream-chat-options-empty.txt",
        "force-stream-chat-usage-continuous.txt",
        "force-stream-chat-max1.txt",
        "force-stream-completions.txt",
        "force-stream-completions-usage.txt",
        "force-stream-completions-logprobs.txt",
    ];
    // (The `n2` and `logprobs` captures are left out: their interleaving and packing came
    // from the engine's timing.)
    streams_match(&cfg, &names, false).await;
    // JSON answers do not change.
    for name in [
        "force-nonstream-chat.txt",
        "force-nonstream-completions.txt",
    ] {
        let (cap, r) = replay_with(&format!("options/{name}"), cfg.clone()).await;
        assert_eq!(skeleton(&r.text()), skeleton(&cap.resp_body), "{name}");
    }
}

#[tokio::test]
async fn keep_alive_comments_go_out_while_the_stream_waits() {
    // The capture's stream waited in the queue; here a long prefill makes the same wait.
    let cfg = SimConfig {
        sse_keep_alive_interval: 0.05,
        ..SimConfig::with_timing(180.0, 0.0)
    };
    let names = [
        "keepalive-stream-chat-queued.txt",
        "keepalive-stream-chat-queued-usage.txt",
    ];
    streams_match(&cfg, &names, false).await;
}

#[tokio::test]
async fn per_request_metrics_and_prompt_details_ride_where_vllm_puts_them() {
    // The CPU engine's blocks are 128 tokens (the captures' `created_cache_tokens`).
    let cfg = SimConfig {
        enable_per_request_metrics: true,
        enable_prompt_tokens_details: true,
        block_size: 128,
        ..SimConfig::with_timing(1.0, 0.5)
    };
    let names = [
        "metrics-stream-chat.txt",
        "metrics-stream-chat-usage.txt",
        "metrics-stream-chat-options-empty.txt",
        "metrics-stream-chat-usage-continuous.txt",
        "metrics-stream-chat-logprobs-usage.txt",
        "metrics-stream-chat-max1.txt",
        "metrics-stream-completions.txt",
        "metrics-stream-completions-usage.txt",
    ];
    streams_match(&cfg, &names, false).await;
    // `n = 2`: no metrics on the usage chunk (the choices' interleaving was the engine's timing).
    let name = "options/metrics-stream-chat-n2-usage.txt";
    let (cap, r) = replay_with(name, cfg.clone()).await;
    let last = |s: &str| {
        stream_shape(s)
            .iter()
            .rev()
            .take(2)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(last(&r.text()), last(&cap.resp_body), "{name}");
    assert!(!r.text().contains("\"metrics\""), "{name}");
    for name in [
        "metrics-nonstream-chat.txt",
        "metrics-nonstream-chat-n2.txt",
        "metrics-nonstream-completions.txt",
    ] {
        let (cap, r) = replay_with(&format!("options/{name}"), cfg.clone()).await;
        assert_eq!(skeleton(&r.text()), skeleton(&cap.resp_body), "{name}");
    }
}
