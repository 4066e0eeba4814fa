//! Every engine option passes through exactly: for each vLLM option that changes the stream
//! (per-request metrics, prompt token details, forced usage, stream interval, keep-alive
//! comments, an admission rejection, and combinations),
//! and each way a client may ask for usage, the bytes a client gets through the proxy (usage
//! injection on) equal the bytes the simulated engine sends it directly for the same request.
//! Only what differs from one response to the next is masked: the engine's timings in
//! `metrics`, and how many keep-alive comments fit in a wait.

use crate::support::meter::*;
use crate::support::proxy::*;
use goodput_sim::SimConfig;

/// The numbers inside every `"metrics":{...}` object become `#` (timings differ per response;
/// the keys, their order and which are present stay compared).
fn mask_metrics(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\"metrics\":{") {
        let open = at + "\"metrics\":{".len();
        out.push_str(&rest[..open]);
        let close = open + rest[open..].find('}').expect("metrics object closes");
        let mut in_number = false;
        for c in rest[open..close].chars() {
            let numeric = c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-');
            // A number starts after `:`; key letters (e in "time") are inside quotes.
            if numeric && (in_number || out.ends_with(':')) {
                if !in_number {
                    out.push('#');
                }
                in_number = true;
            } else {
                in_number = false;
                out.push(c);
            }
        }
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// Runs of keep-alive comments become one (how many fit in a wait is timing).
fn collapse_keep_alives(text: &str) -> String {
    const KA: &str = ": keep-alive\n\n";
    let mut out = text.to_string();
    while out.contains(&KA.repeat(2)) {
        out = out.replace(&KA.repeat(2), KA);
    }
    out
}

fn masked(body: &[u8]) -> String {
    collapse_keep_alives(&mask_metrics(
        std::str::from_utf8(body).expect("UTF-8 body"),
    ))
}

/// What clients send: every way of asking (or not) for usage, `n = 2`, completions, JSON.
fn requests() -> Vec<(&'static str, String)> {
    let opts = [
        "",
        r#","stream_options":{"include_usage":true}"#,
        r#","stream_options":{}"#,
        r#","stream_options":{"include_usage":false}"#,
        r#","stream_options":null"#,
        r#","stream_options":{"include_usage":true,"continuous_usage_stats":true}"#,
        r#","stream_options":{"continuous_usage_stats":true}"#,
    ];
    let mut out: Vec<(&str, String)> = opts
        .iter()
        .map(|o| (CHAT, chat_body(9, &format!(r#","seed":1{o}"#))))
        .collect();
    out.push((CHAT, chat_body(6, r#","n":2,"seed":2"#)));
    out.push((
        CHAT,
        chat_body(
            6,
            r#","n":2,"seed":2,"stream_options":{"include_usage":true}"#,
        ),
    ));
    out.push((
        CHAT,
        chat_body(7, r#","logprobs":true,"top_logprobs":1,"seed":3"#),
    ));
    out.push((CHAT, chat_body(1, r#","seed":4"#)));
    for o in ["", r#","stream_options":{"include_usage":true}"#] {
        out.push((
            COMPL,
            format!(
                r#"{{"model":"tiny","prompt":"Once upon","stream":true,"max_tokens":9,"seed":5{o}}}"#
            ),
        ));
    }
    out.push((
        CHAT,
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"seed":6}"#
            .to_string(),
    ));
    out.push((
        COMPL,
        r#"{"model":"tiny","prompt":"Hi","max_tokens":5,"n":2,"seed":7}"#.to_string(),
    ));
    out
}

/// The engine configurations: each option alone, then together.
fn engines() -> Vec<(&'static str, SimConfig)> {
    let base = SimConfig::with_timing(2.0, 1.0);
    let metrics = SimConfig {
        enable_per_request_metrics: true,
        ..base.clone()
    };
    let force = SimConfig {
        enable_force_include_usage: true,
        ..base.clone()
    };
    let interval = SimConfig {
        stream_interval: 4,
        ..base.clone()
    };
    // Prefill long enough for comments before the first event, and between tokens.
    let keep_alive = SimConfig {
        sse_keep_alive_interval: 0.04,
        ..SimConfig::with_timing(130.0, 2.0)
    };
    let details = SimConfig {
        enable_prompt_tokens_details: true,
        ..base.clone()
    };
    // Every request over the cap: 503 JSON, or for streams the in-band error event.
    let rejected = SimConfig {
        max_num_queued_reqs: Some(0),
        ..base.clone()
    };
    let rejected_inband = SimConfig {
        admission_inband_prob: 1.0,
        ..rejected.clone()
    };
    let all = SimConfig {
        enable_per_request_metrics: true,
        enable_prompt_tokens_details: true,
        enable_force_include_usage: true,
        stream_interval: 3,
        ..keep_alive.clone()
    };
    let metrics_interval = SimConfig {
        enable_per_request_metrics: true,
        stream_interval: 2,
        ..base.clone()
    };
    vec![
        ("plain", base),
        ("per-request metrics", metrics),
        ("prompt tokens details", details),
        ("force include usage", force),
        ("admission rejection", rejected),
        ("admission rejection in-band", rejected_inband),
        ("stream interval 4", interval),
        ("keep-alive", keep_alive),
        ("metrics + interval", metrics_interval),
        ("all", all),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_gets_the_engines_bytes_under_every_engine_option() {
    let c = client();
    for (engine, cfg) in engines() {
        let keep_alive = cfg.sse_keep_alive_interval > 0.0;
        let sim = start_sim(cfg).await;
        let proxy = start_proxy(meter_config(&sim.base_url())).await;
        let mut comments = 0;
        for (path, body) in requests() {
            let stream = body.contains(r#""stream":true"#);
            let direct = observe(
                &c,
                post_json(&format!("{}{path}", sim.base_url()), &body),
                stream,
            )
            .await;
            let via = observe(&c, post_json(&proxy.url(path), &body), stream).await;
            assert_eq!(via.status, direct.status, "{engine}: {body}");
            assert_eq!(
                masked(&via.body),
                masked(&direct.body),
                "{engine}: {path} {body}"
            );
            comments += masked(&via.body).matches(": keep-alive").count();
        }
        if keep_alive {
            assert!(
                comments > 0,
                "{engine}: the engine sent keep-alive comments"
            );
        }
        sim.shutdown().await;
    }
}

#[test]
fn masks_hide_only_what_differs_per_response() {
    let a = r#"data: {"usage":{"prompt_tokens":4},"metrics":{"time_to_first_token_ms":1.5,"queue_time_ms":5e-05,"mean_itl_ms":2.0}}"#;
    let b = r#"data: {"usage":{"prompt_tokens":4},"metrics":{"time_to_first_token_ms":0.25,"queue_time_ms":0.0,"mean_itl_ms":12.75}}"#;
    assert_eq!(mask_metrics(a), mask_metrics(b));
    assert_eq!(
        mask_metrics(a),
        r#"data: {"usage":{"prompt_tokens":4},"metrics":{"time_to_first_token_ms":#,"queue_time_ms":#,"mean_itl_ms":#}}"#
    );
    // A key missing on one side still differs, and so does anything outside metrics.
    let c = r#"data: {"usage":{"prompt_tokens":4},"metrics":{"time_to_first_token_ms":1.5,"queue_time_ms":0.0}}"#;
    assert_ne!(mask_metrics(a), mask_metrics(c));
    assert_ne!(
        mask_metrics(a),
        mask_metrics(&a.replace("\"prompt_tokens\":4", "\"prompt_tokens\":5"))
    );
    assert_eq!(
        collapse_keep_alives(": keep-alive\n\n: keep-alive\n\ndata: x\n\n: keep-alive\n\n"),
        ": keep-alive\n\ndata: x\n\n: keep-alive\n\n"
    );
}
