//! End to end: the loadtest against an in-process simulated engine on port 0 with known timings
//! and a share of requests carrying `x-sim-fault`. Bounded in count and time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use goodput_loadtest::metrics::LoadMetrics;
use goodput_loadtest::runner::{self, CompareTargets, RunConfig, RunResult};
use goodput_loadtest::scenario::Scenario;
use goodput_sim::{SimConfig, SimServer};

const TTFT_MS: f64 = 80.0;
const TPOT_MS: f64 = 5.0;

async fn sim() -> goodput_sim::SimHandle {
    let cfg = SimConfig {
        max_num_seqs: 1024,
        ..SimConfig::with_timing(TTFT_MS, TPOT_MS)
    };
    SimServer::bind(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .spawn()
}

async fn run(
    target: String,
    scenario: &str,
    metrics: Option<Arc<LoadMetrics>>,
    compare: CompareTargets,
) -> RunResult {
    let sc = Scenario::parse(scenario).unwrap();
    let cfg = RunConfig {
        target,
        scenario: sc,
        scenario_name: "test".into(),
        show_progress: false,
        metrics,
        compare,
        run_id: goodput_loadtest::request::run_id(),
    };
    tokio::time::timeout(Duration::from_secs(60), runner::run(cfg))
        .await
        .expect("run is bounded")
        .unwrap()
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("goodput-loadtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const FAULTS: &str = r#"
seed = 11
models = ["tiny"]
[mix]
prompt_tokens = { fixed = 16 }
max_tokens = { fixed = 12 }
ignore_eos = true
[[mix.headers]]
name = "x-sim-fault"
value = "error-after=3"
share = 0.2
[[mix.headers]]
name = "x-sim-fault"
value = "truncate-after=3"
share = 0.2
[[phases]]
name = "warm"
requests = 30
arrivals = { constant = { rate = 60 } }
[[phases]]
name = "burst"
requests = 50
arrivals = { poisson = { rate = 100 } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_equal_injected_faults_and_ttft_is_the_configured_one() {
    let _serial = crate::support::serial().await;
    let sim = sim().await;
    let names = vec!["warm".to_string(), "burst".to_string()];
    let metrics = Arc::new(LoadMetrics::new(&names).unwrap());
    let engine = CompareTargets {
        engine_metrics: vec![format!("{}/metrics", sim.base_url())],
        ..Default::default()
    };
    let res = run(sim.base_url(), FAULTS, Some(metrics.clone()), engine).await;
    let s = &res.summary;
    assert_eq!(res.records.len(), 80);
    assert_eq!(s.phases[0].requests, 30);
    assert_eq!(s.phases[1].requests, 50);

    // What was injected, counted from the records' tags, against what was measured.
    let tagged = |tag: &str| {
        res.records
            .iter()
            .filter(|r| r.tag.as_deref() == Some(tag))
            .count() as u64
    };
    let (errors, truncs) = (tagged("error-after=3"), tagged("truncate-after=3"));
    assert!(
        errors > 0 && truncs > 0,
        "the seeded mix injects both faults ({errors}, {truncs})"
    );
    let o = &s.overall.outcomes;
    assert_eq!(
        o.get("upstream_error").copied().unwrap_or(0),
        errors,
        "{o:?}"
    );
    assert_eq!(o.get("truncated").copied().unwrap_or(0), truncs, "{o:?}");
    assert_eq!(
        o.get("success").copied().unwrap_or(0),
        80 - errors - truncs,
        "{o:?}"
    );
    assert_eq!(o.values().sum::<u64>(), 80);
    let by_tag = &s.overall.outcomes_by_tag;
    assert_eq!(by_tag["error-after=3"].get("upstream_error"), Some(&errors));
    assert_eq!(by_tag["truncate-after=3"].get("truncated"), Some(&truncs));

    // Client TTFT p50 is the configured TTFT (plus loopback and scheduling noise).
    let ttft = s.overall.ttft_seconds.expect("streams produced tokens");
    let p50_ms = ttft.p50 * 1000.0;
    assert!(
        (TTFT_MS - 1.0..TTFT_MS + 40.0).contains(&p50_ms),
        "TTFT p50 {p50_ms} ms vs {TTFT_MS}"
    );
    // Successful streams carry exact usage: 12 tokens each, TPOT near the configured one.
    let ok: Vec<_> = res
        .records
        .iter()
        .filter(|r| r.outcome == "success")
        .collect();
    assert!(ok
        .iter()
        .all(|r| r.completion_tokens == Some(12) && r.finish_reason.as_deref() == Some("length")));
    let tpot = s.overall.tpot_seconds.unwrap().p50 * 1000.0;
    assert!(
        (TPOT_MS - 1.0..TPOT_MS + 20.0).contains(&tpot),
        "TPOT p50 {tpot} ms"
    );
    assert_eq!(
        s.overall.goodput.good,
        80 - errors - truncs,
        "fast successes are all good"
    );

    // The engine's own TTFT histogram, from bucket deltas over each phase, lands in the bucket
    // around the configured TTFT (vLLM grid: 0.06 < 0.08 <= 0.1).
    let cmp = s.comparison.as_ref().expect("comparison asked for");
    for phase in ["warm", "burst"] {
        let row = cmp
            .rows
            .iter()
            .find(|r| {
                r.phase == phase && r.metric == "ttft" && r.source.starts_with("engine histogram")
            })
            .unwrap_or_else(|| panic!("no engine TTFT row for {phase}: {:?}", cmp.rows));
        let p50 = row.p50.unwrap();
        assert!(
            (0.06..=0.1).contains(&p50),
            "{phase}: engine TTFT p50 estimate {p50}"
        );
        assert!(row.count.unwrap() >= 1.0);
        assert!(row.diff_p50.is_some());
    }

    // Request ids are unique and carried in the records.
    let mut ids: Vec<&str> = res.records.iter().map(|r| r.request_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 80);

    // The loadtest's own metrics counted every request once, by phase and outcome.
    let text = String::from_utf8(metrics.encode()).unwrap();
    let count = |phase: &str, outcome: &str| {
        let needle =
            format!("goodput_loadtest_requests_total{{outcome=\"{outcome}\",phase=\"{phase}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    let per_phase = |p: &str| {
        ["success", "upstream_error", "truncated"]
            .iter()
            .map(|o| count(p, o))
            .sum::<u64>()
    };
    assert_eq!(per_phase("warm"), 30);
    assert_eq!(per_phase("burst"), 50);
    assert!(text.contains("goodput_loadtest_requests_in_flight 0"));

    // Outputs: one JSONL line per request with the required keys, a summary, a report.
    let dir = out_dir("faults");
    goodput_loadtest::report::write_all(&dir, s, &res.windows, &res.records).unwrap();
    let lines = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 80);
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    for k in [
        "request_id",
        "phase",
        "outcome",
        "finish_reason",
        "ttft_seconds",
        "ttfc_seconds",
        "tpot_seconds",
        "e2e_seconds",
        "prompt_tokens",
        "completion_tokens",
    ] {
        assert!(first.get(k).is_some(), "requests.jsonl lacks {k}");
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["overall"]["requests"], 80);
    assert!(summary["phases"][0]["ttft_seconds"]["p999"].is_number());
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 7);
    let _ = std::fs::remove_dir_all(&dir);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_cap_holds_arrivals_back_and_says_so() {
    let _serial = crate::support::serial().await;
    let sim = sim().await;
    // 40/s for 20 requests of ~80 ms + 12*5 ms each: about 6 wanted in flight, the cap is 2.
    let sc = r#"
        max_in_flight = 2
        [mix]
        max_tokens = { fixed = 12 }
        ignore_eos = true
        [[phases]]
        name = "capped"
        requests = 20
        arrivals = { constant = { rate = 40 } }
    "#;
    let res = run(sim.base_url(), sc, None, CompareTargets::default()).await;
    let p = &res.summary.phases[0];
    assert_eq!(p.requests, 20);
    assert!(p.in_flight_peak <= 2, "peak {}", p.in_flight_peak);
    assert!(p.held_back > 0 && p.hold_max_seconds > 0.0, "{p:?}");
    let held = res.records.iter().filter(|r| r.held_back).count() as u64;
    assert_eq!(held, p.held_back);
    assert!(res
        .records
        .iter()
        .filter(|r| r.held_back)
        .all(|r| r.start_s > r.scheduled_s));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_does_not_wait_for_slow_responses() {
    let _serial = crate::support::serial().await;
    let sim = sim().await;
    // Each request takes >= 80 ms + 40*5 ms; arrivals every 20 ms must still go out on time.
    let sc = r#"
        [mix]
        max_tokens = { fixed = 40 }
        ignore_eos = true
        [[phases]]
        name = "open"
        requests = 15
        arrivals = { constant = { rate = 50 } }
        drain = true
        [[phases]]
        name = "closed"
        requests = 9
        arrivals = { concurrency = { n = 3 } }
    "#;
    let res = run(sim.base_url(), sc, None, CompareTargets::default()).await;
    let open: Vec<_> = res.records.iter().filter(|r| r.phase == "open").collect();
    assert_eq!(open.len(), 15);
    assert!(
        res.summary.phases[0].in_flight_peak >= 5,
        "open loop overlapped requests: {}",
        res.summary.phases[0].in_flight_peak
    );
    // Sent when scheduled (generous bound for a loaded machine), not when the previous ended.
    let late = open
        .iter()
        .map(|r| r.start_s - r.scheduled_s)
        .fold(0.0, f64::max);
    // Waiting for responses (>= 280 ms each) would put the last arrival seconds behind.
    assert!(late < 0.2, "an arrival went out {late} s late");
    let closed = &res.summary.phases[1];
    assert_eq!(closed.requests, 9);
    assert!(
        closed.in_flight_peak <= 3,
        "closed loop of 3: peak {}",
        closed.in_flight_peak
    );
    assert_eq!(closed.outcomes.get("success"), Some(&9));
    sim.shutdown().await;
}

/// `slo.max_stall_ms` judges each stream on its largest gap between output events, as the
/// proxy's stall SLO: the streams the simulator stalls (200 ms before every later token, the
/// usual gap being 5 ms) are not good, the others are, and TTFT/TPOT/E2E pass for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_slo_fails_exactly_the_stalled_streams() {
    let _serial = crate::support::serial().await;
    let sim = sim().await;
    let sc = r#"
        seed = 5
        [slo]
        ttft_ms = 5000
        tpot_ms = 1000
        max_stall_ms = 100
        [mix]
        max_tokens = { fixed = 4 }
        ignore_eos = true
        [[mix.headers]]
        name = "x-sim-fault"
        value = "stall-every=200"
        share = 0.5
        [[phases]]
        name = "stalls"
        requests = 16
        arrivals = { constant = { rate = 100 } }
    "#;
    let res = run(sim.base_url(), sc, None, CompareTargets::default()).await;
    assert_eq!(res.summary.slo.max_stall_ms, Some(100.0));
    let stalled = res.records.iter().filter(|r| r.tag.is_some()).count();
    assert!(
        stalled > 0 && stalled < 16,
        "the seeded share stalls some: {stalled}"
    );
    for r in &res.records {
        let itl_max = r.itl_max_seconds.expect("a 4-token stream has gaps");
        if r.tag.is_some() {
            assert!(
                !r.good && itl_max > 0.1,
                "stalled stream judged good: {r:?}"
            );
        } else {
            assert!(
                r.good && itl_max < 0.1,
                "smooth stream judged not good: {r:?}"
            );
        }
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_api_with_a_non_streaming_share() {
    let _serial = crate::support::serial().await;
    let sim = sim().await;
    let sc = r#"
        api = "completions"
        [mix]
        max_tokens = { fixed = 6 }
        stream_share = 0.5
        ignore_eos = true
        [[phases]]
        name = "mixed"
        requests = 30
        arrivals = { poisson = { rate = 100 } }
    "#;
    let res = run(sim.base_url(), sc, None, CompareTargets::default()).await;
    let p = &res.summary.phases[0];
    assert_eq!(p.outcomes.get("success"), Some(&30), "{:?}", p.outcomes);
    let streamed = res.records.iter().filter(|r| r.stream).count() as u64;
    assert!(
        streamed > 0 && streamed < 30,
        "both kinds drawn: {streamed}"
    );
    // Only streams have a TTFT; every request has usage and an E2E.
    assert_eq!(p.ttft_seconds.map_or(0, |s| s.count), streamed);
    assert!(res
        .records
        .iter()
        .all(|r| r.completion_tokens == Some(6) && r.tokens_exact));
    assert!(res
        .records
        .iter()
        .filter(|r| !r.stream)
        .all(|r| r.ttft_seconds.is_none() && r.e2e_seconds >= TTFT_MS / 1000.0));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mix_option_against_the_simulator() {
    let _serial = crate::support::serial().await;
    let sim = sim().await;
    // Every option of the real-engine scenario, against the simulator: each request shape is
    // accepted and measured, and the clients that hang up free their engine slot.
    let sc = r#"
        seed = 5
        [mix]
        prompt_tokens = { fixed = 16 }
        max_tokens = { fixed = 40 }
        completions_share = 0.5
        stream_share = 0.8
        logprobs_share = 0.4
        n_share = 0.3
        include_usage_share = 0.6
        continuous_usage_share = 0.3
        ignore_eos = true
        hangup_share = 0.3
        hangup_after_events = { fixed = 3 }
        [[phases]]
        name = "mix"
        requests = 60
        arrivals = { poisson = { rate = 80 } }
    "#;
    let res = run(sim.base_url(), sc, None, CompareTargets::default()).await;
    assert_eq!(res.records.len(), 60);
    let some =
        |f: &dyn Fn(&goodput_loadtest::record::RequestRecord) -> bool| res.records.iter().any(f);
    // The seeded mix drew every option.
    assert!(some(&|r| r.api == "completions") && some(&|r| r.api == "chat"));
    assert!(some(&|r| r.n == 2 && r.stream) && some(&|r| r.n == 2 && !r.stream));
    assert!(some(&|r| r.logprobs == Some(2)
        && r.api == "chat"
        && r.stream));
    assert!(some(&|r| r.logprobs == Some(2)
        && r.api == "completions"
        && r.stream));
    for u in ["off", "final", "continuous", "continuous_only"] {
        assert!(
            some(&|r| r.stream && r.usage == u),
            "no stream with usage={u}"
        );
    }
    for r in &res.records {
        if r.hung_up {
            assert_eq!(r.outcome, "client_abort", "{r:?}");
            continue;
        }
        assert_eq!(r.outcome, "success", "{r:?}");
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
        // Exact usage exactly when the engine sends it: non-streaming, or include_usage asked.
        let usage_sent = !r.stream || r.usage == "final" || r.usage == "continuous";
        assert_eq!(r.tokens_exact, usage_sent, "{r:?}");
        // ignore_eos: max_tokens per choice, usage summed over the n choices.
        if r.tokens_exact {
            assert_eq!(r.completion_tokens, Some(40 * u64::from(r.n)), "{r:?}");
        }
    }
    let hung = res.records.iter().filter(|r| r.hung_up).count() as u64;
    assert!(hung > 0);
    assert_eq!(
        res.summary.overall.outcomes.get("client_abort").copied(),
        Some(hung)
    );
    assert_eq!(
        res.summary.overall.outcomes_by_option["hung_up=true"]["client_abort"],
        hung
    );
    // The engine saw each hang-up as a disconnect and let go of the request.
    assert!(sim.wait_idle(Duration::from_secs(10)).await);
    assert_eq!(sim.requests_aborted(), hung);
    sim.shutdown().await;
}

const TOOL_CALLS: &str = r#"
seed = 5
models = ["tiny"]
[mix]
prompt_tokens = { fixed = 16 }
max_tokens = { fixed = 64 }
tools_share = 1.0
[[mix.headers]]
name = "x-sim-fault"
value = "tool-call=valid"
share = 0.2
[[mix.headers]]
name = "x-sim-fault"
value = "tool-call=invalid-json"
share = 0.2
[[mix.headers]]
name = "x-sim-fault"
value = "tool-call=schema-violation"
share = 0.2
[[mix.headers]]
name = "x-sim-fault"
value = "reasoning=4,tool-call=valid"
share = 0.2
[[phases]]
name = "agents"
requests = 60
arrivals = { constant = { rate = 100 } }
"#;

/// The report's tool-call section against the simulator: every request offers a function, and
/// the tool calls it asked for are counted under the outcome the simulator was told to produce,
/// with phase timings; the rest (no fault) answer text and count under no outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_section_counts_each_injected_kind() {
    let _serial = crate::support::serial().await;
    let sim = sim().await;
    let res = run(sim.base_url(), TOOL_CALLS, None, CompareTargets::default()).await;
    let tagged = |tag: &str| {
        res.records
            .iter()
            .filter(|r| r.tag.as_deref() == Some(tag))
            .count() as u64
    };
    let (valid, invalid, violating, reasoning) = (
        tagged("tool-call=valid"),
        tagged("tool-call=invalid-json"),
        tagged("tool-call=schema-violation"),
        tagged("reasoning=4,tool-call=valid"),
    );
    assert!(valid > 0 && invalid > 0 && violating > 0 && reasoning > 0);
    let plain = 60 - valid - invalid - violating - reasoning;
    assert!(plain > 0, "some requests asked for no tool call");
    assert!(res
        .records
        .iter()
        .all(|r| r.tools && r.outcome == "success"));

    let s = res.summary.phases[0]
        .tool_calls
        .as_ref()
        .expect("a tool-call section");
    assert_eq!(s.requests_with_tools, 60);
    assert_eq!(s.agent_requests, 60 - plain);
    let n = |k: &str| s.by_outcome[k].requests;
    assert_eq!(n("valid"), valid + reasoning, "{s:?}");
    assert_eq!(n("invalid_json"), invalid, "{s:?}");
    assert_eq!(n("schema_violation"), violating, "{s:?}");
    assert_eq!(n("unknown_function"), 0);
    assert!(s.reasoning_tokens >= 4 * reasoning, "{s:?}");
    for k in ["valid", "invalid_json", "schema_violation"] {
        let t = &s.by_outcome[k];
        let first = t.ttf_tool_call_seconds.expect("first tool-call token");
        assert_eq!(first.count, t.requests, "{k}");
        // The first tool-call delta is the first output: the configured TTFT or later.
        assert!(first.p50 * 1000.0 >= TTFT_MS - 1.0, "{k}: {first:?}");
        assert!(t.tool_call_seconds.is_some(), "{k}");
    }
    assert_eq!(
        s.all.ttf_reasoning_seconds.map(|r| r.count),
        Some(reasoning)
    );
    // An invalid call makes the request not good (the proxy's default, valid_tool_calls).
    for r in &res.records {
        let bad = matches!(
            r.tag.as_deref(),
            Some("tool-call=invalid-json" | "tool-call=schema-violation")
        );
        if bad {
            assert!(!r.good, "{r:?}");
        }
        let a = r.agent.as_ref();
        assert_eq!(a.is_some(), r.tag.is_some(), "{r:?}");
    }
    let s_json = serde_json::to_value(&res.summary).unwrap();
    assert_eq!(
        s_json["overall"]["tool_calls"]["by_outcome"]["invalid_json"]["requests"],
        invalid
    );
    let html = goodput_loadtest::report::html::render(&res.summary, &res.windows, &res.records);
    assert!(html.contains("agents · tool calls"));
    let text = goodput_loadtest::report::table::render(&res.summary);
    assert!(text.contains(&format!("invalid_json={invalid}")), "{text}");
    sim.shutdown().await;
}
