use super::*;

const START: &str = "# TYPE vllm:time_to_first_token_seconds histogram\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"tiny\"} 1.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.2\",model_name=\"tiny\"} 2.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"tiny\"} 2.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"big\"} 50.0\n\
vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"tiny\"} 2.0\n";
const END: &str = "# TYPE vllm:time_to_first_token_seconds histogram\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"tiny\"} 1.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.2\",model_name=\"tiny\"} 102.0\n\
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"tiny\"} 102.0\n";

#[test]
fn histogram_delta_and_quantile() {
    let s = histogram(
        START,
        "vllm:time_to_first_token_seconds",
        &["model_name"],
        Some("tiny"),
    )
    .unwrap();
    let e = histogram(
        END,
        "vllm:time_to_first_token_seconds",
        &["model_name"],
        Some("tiny"),
    )
    .unwrap();
    let d = delta(Some(&s), &e);
    assert_eq!(d, vec![(0.1, 0.0), (0.2, 100.0), (f64::INFINITY, 100.0)]);
    // All 100 in (0.1, 0.2]: p50 interpolates to the middle.
    assert!((quantile(&d, 0.5).unwrap() - 0.15).abs() < 1e-12);
    assert!((quantile(&d, 0.99).unwrap() - 0.199).abs() < 1e-12);
    assert!(histogram(
        START,
        "vllm:time_to_first_token_seconds",
        &["model_name"],
        Some("nope")
    )
    .is_none());
}

#[test]
fn quantile_edge_cases() {
    assert_eq!(quantile(&vec![(1.0, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
    // Rank in +Inf: the highest finite bound (as PromQL).
    assert_eq!(
        quantile(&vec![(1.0, 0.0), (f64::INFINITY, 4.0)], 0.5),
        Some(1.0)
    );
    // First bucket interpolates from 0.
    assert_eq!(
        quantile(&vec![(2.0, 4.0), (f64::INFINITY, 4.0)], 0.5),
        Some(1.0)
    );
    // Counter reset: the end snapshot alone.
    let d = delta(
        Some(&vec![(1.0, 9.0), (f64::INFINITY, 9.0)]),
        &vec![(1.0, 2.0), (f64::INFINITY, 3.0)],
    );
    assert_eq!(d, vec![(1.0, 2.0), (f64::INFINITY, 3.0)]);
}

#[test]
fn series_sums_counters_and_gauges() {
    let t = "# TYPE vllm:generation_tokens_total counter\n\
vllm:generation_tokens_total{engine=\"0\",model_name=\"tiny\"} 83.0\n\
vllm:generation_tokens_total{engine=\"1\",model_name=\"tiny\"} 17\n\
vllm:generation_tokens_created{engine=\"0\"} 1.7e9\n\
plain_gauge 4\n";
    assert_eq!(series_sum(t, "vllm:generation_tokens_total"), Some(100.0));
    assert_eq!(series_sum(t, "plain_gauge"), Some(4.0));
    assert_eq!(series_sum(t, "plain"), None, "a prefix is not the family");
    assert_eq!(series_sum(t, "vllm:num_requests_running"), None);
}

#[test]
fn counters_and_token_check_per_phase_and_overall() {
    let engine = |gen: u32, running: u32| {
        format!("vllm:generation_tokens_total{{model_name=\"m\"}} {gen}\nvllm:num_requests_running{{model_name=\"m\"}} {running}\n")
    };
    let proxy = |gen: u32| format!("goodput_proxy_generation_tokens_total{{model=\"m\"}} {gen}\n");
    let snap = |t: f64, p: u32, e: u32, r: u32| Snapshot {
        t_s: t,
        proxy_asked: true,
        proxy_metrics: Some(proxy(p)),
        engines: vec![("E".into(), Some(engine(e, r)))],
        ..Snapshot::default()
    };
    let win = |name: &str, a: f64, b: f64| PhaseWindow {
        name: name.into(),
        arrivals: String::new(),
        start_s: a,
        end_s: b,
        held_back: 0,
        hold_max_seconds: 0.0,
    };
    let snaps = vec![
        PhaseSnapshots {
            phase: "a".into(),
            start: snap(0.0, 100, 200, 0),
            end: snap(1.0, 110, 210, 2),
            settled: None,
        },
        PhaseSnapshots {
            phase: "b".into(),
            start: snap(1.0, 110, 210, 2),
            end: snap(2.0, 125, 225, 1),
            settled: Some(snap(3.0, 125, 225, 0)),
        },
    ];
    let mut r1 = crate::record::sample("a", 0.1, 0.5, Some(0.1), "success");
    r1.completion_tokens = Some(10);
    let mut r2 = crate::record::sample("b", 1.1, 0.5, Some(0.1), "success");
    r2.completion_tokens = Some(15);
    r2.tokens_exact = false;
    let c = build(
        &[win("a", 0.0, 1.0), win("b", 1.0, 2.0)],
        &[r1, r2],
        &snaps,
        None,
    );
    assert_eq!(
        c.counters.len(),
        10,
        "2 sources x (2 instants x 2 phases + settled)"
    );
    let end = &c.counters[7];
    assert_eq!(
        (end.phase.as_str(), end.at.as_str(), end.source.as_str()),
        ("b", "end", "E")
    );
    assert!(end.after_all_requests);
    assert_eq!(end.num_requests_running, Some(1.0));
    let last = c.counters.last().unwrap();
    assert_eq!((last.at.as_str(), last.t_s), ("settled", 3.0));
    assert_eq!(last.num_requests_running, Some(0.0));
    assert_eq!(c.counters[3].num_requests_running, Some(2.0));
    let t: Vec<_> = c.tokens.iter().map(|t| t.phase.as_str()).collect();
    assert_eq!(t, ["a", "b", "overall"]);
    let all = &c.tokens[2];
    assert_eq!(
        (
            all.client_completion_tokens,
            all.client_completion_from_usage,
            all.client_requests_with_usage
        ),
        (25, 10, 1)
    );
    assert_eq!(all.proxy_generation_tokens, Some(25.0));
    assert_eq!(all.engine_generation_tokens["E"], Some(25.0));
    assert_eq!(c.tokens[0].engine_generation_tokens["E"], Some(10.0));
}

#[test]
fn label_values_with_escapes_and_non_ascii_match_as_written() {
    let t = "# TYPE h histogram\n\
h_bucket{model=\"mod\u{e8}le-\u{6a21}\u{578b}\",le=\"0.5\"} 1\n\
h_bucket{model=\"mod\u{e8}le-\u{6a21}\u{578b}\",le=\"+Inf\"} 2\n\
h_bucket{model=\"x\\\"y\",le=\"0.5\"} 5\n\
h_bucket{model=\"x\\\"y\",le=\"+Inf\"} 5\n\
h_sum{model=\"x\\\"y\"} 1\nh_count{model=\"x\\\"y\"} 5\n\
h_sum{model=\"mod\u{e8}le-\u{6a21}\u{578b}\"} 1\nh_count{model=\"mod\u{e8}le-\u{6a21}\u{578b}\"} 2\n";
    let b = histogram(t, "h", &["model"], Some("mod\u{e8}le-\u{6a21}\u{578b}")).unwrap();
    assert_eq!(b, vec![(0.5, 1.0), (f64::INFINITY, 2.0)]);
    let b = histogram(t, "h", &["model"], Some("x\"y")).unwrap();
    assert_eq!(b, vec![(0.5, 5.0), (f64::INFINITY, 5.0)]);
    assert_eq!(histogram(t, "h", &["model"], Some("z")), None);
    assert_eq!(histogram(t, "h", &[], None).unwrap().len(), 2);
}

#[test]
fn reads_the_proxys_own_sink_records() {
    use goodput_measure::record::RequestRecord as ProxyRec;
    use goodput_measure::{judge, Measurement, Outcome, Slo};
    use std::time::Duration;
    let mut m =
        Measurement::without_body(Outcome::Truncated, Some(200), Duration::from_millis(900));
    m.streaming = true;
    m.ttft = Some(Duration::from_millis(120));
    let v = judge(&m, &Slo::default());
    let rec = ProxyRec::new(
        "lt1-0000007".into(),
        "tiny".into(),
        None,
        0,
        tokio::time::Instant::now(),
        m,
        v,
    );
    let line = serde_json::to_string(&rec).unwrap();
    let got = parse_proxy_records(&line);
    assert_eq!(
        got,
        vec![ProxyRecord {
            id: "lt1-0000007".into(),
            model: Some("tiny".into()),
            outcome: Some("truncated".into()),
            ttft: Some(0.12),
            tpot: None,
            e2e: Some(0.9),
            completion_tokens: None,
            ttft_split: None,
            split_clamped: false,
            engine_mean_itl: None,
        }]
    );
}

/// One line of the proxy's JSONL sink: a real `RequestRecord`, serialized as the sink does.
fn proxy_line(
    id: &str,
    outcome: goodput_measure::Outcome,
    ttft: f64,
    e2e: f64,
    tokens: Option<u64>,
) -> String {
    use goodput_measure::{judge, Measurement, Slo};
    use std::time::Duration;
    let mut m = Measurement::without_body(outcome, Some(200), Duration::from_secs_f64(e2e));
    m.streaming = true;
    m.ttft = Some(Duration::from_secs_f64(ttft));
    m.completion_tokens = tokens;
    let v = judge(&m, &Slo::default());
    let rec = goodput_measure::record::RequestRecord::new(
        id.into(),
        "tiny".into(),
        None,
        0,
        tokio::time::Instant::now(),
        m,
        v,
    );
    serde_json::to_string(&rec).unwrap()
}

#[test]
fn join_by_request_id() {
    use goodput_measure::Outcome;
    let mut a = crate::record::sample("p", 0.0, 1.0, Some(0.100), "success");
    a.request_id = "r1".into();
    let mut b = crate::record::sample("p", 0.0, 2.0, Some(0.200), "truncated");
    b.request_id = "r2".into();
    let sink = format!(
        "{}\n{}\nnot json\n{{\"id\":\"r4\",\"ttft_seconds\":1}}\n",
        proxy_line("r1", Outcome::Success, 0.098, 0.997, Some(4)),
        proxy_line("r2", Outcome::UpstreamError, 0.199, 1.999, None),
    );
    let proxy = parse_proxy_records(&sink);
    assert_eq!(proxy.len(), 2);
    let w = PhaseWindow {
        name: "p".into(),
        arrivals: String::new(),
        start_s: 0.0,
        end_s: 2.0,
        held_back: 0,
        hold_max_seconds: 0.0,
    };
    let mut lost = crate::record::sample("p", 1.0, 1.0, None, "success");
    lost.request_id = "r3".into();
    let c = build(&[w], &[a, b, lost], &[], Some(&proxy));
    assert_eq!(c.joins.len(), 2, "the phase and overall");
    assert_eq!(c.joins[1].phase, "overall");
    let j = &c.joins[0];
    assert_eq!(
        (
            j.client_requests,
            j.matched,
            j.outcomes_agree,
            j.outcomes_disagree
        ),
        (3, 2, 1, 1)
    );
    assert_eq!(j.disagreements["truncated -> upstream_error"], 1);
    assert_eq!(
        j.disagreeing,
        vec![Disagreement {
            request_id: "r2".into(),
            client: "truncated".into(),
            proxy: Some("upstream_error".into()),
        }]
    );
    assert_eq!(j.unmatched_ids, ["r3"]);
    // Tokens are compared on successes only (r1: the client counted 5, the proxy 4).
    assert_eq!((j.tokens_compared, j.tokens_agree), (1, 0));
    assert_eq!(
        (
            j.tokens_disagreeing[0].client,
            j.tokens_disagreeing[0].proxy
        ),
        (5, 4)
    );
    let t = j.ttft_proxy_minus_client.as_ref().unwrap();
    assert!((t.max - -0.001).abs() < 1e-9 && (t.min - -0.002).abs() < 1e-9);
    let exact = c
        .rows
        .iter()
        .find(|r| r.source == "proxy exact" && r.metric == "ttft")
        .unwrap();
    assert_eq!(exact.count, Some(2.0));
}

/// Engines other than vLLM, each read by its own names (the engine told from its page):
/// SGLang's and llama.cpp's token counters, queues and running batches; TGI's E2E histogram,
/// whose series name no model (one engine, one model: read whole).
#[test]
fn other_engines_are_read_by_their_own_names() {
    let sglang = |gen: u32, q: u32| {
        format!(
            "sglang:generation_tokens_total{{is_streaming=\"true\",model_name=\"m\"}} {gen}\n\
             sglang:num_queue_reqs{{model_name=\"m\",tp_rank=\"0\"}} {q}\n\
             sglang:num_running_reqs{{model_name=\"m\",tp_rank=\"0\"}} 1\n"
        )
    };
    let llama = |gen: u32, q: u32| {
        format!(
            "llamacpp:tokens_predicted_total {gen}\nllamacpp:requests_deferred {q}\n\
             llamacpp:requests_processing 1\n"
        )
    };
    let tgi = |n: u32| {
        format!(
            "# TYPE tgi_request_duration histogram\n\
             tgi_request_duration_bucket{{le=\"0.5\"}} 0\ntgi_request_duration_bucket{{le=\"1\"}} {n}\n\
             tgi_request_duration_bucket{{le=\"+Inf\"}} {n}\n\
             tgi_request_duration_sum {n}\ntgi_request_duration_count {n}\ntgi_queue_size 0\n"
        )
    };
    let snap = |t: f64, g: u32, q: u32| Snapshot {
        t_s: t,
        engines: vec![
            ("S".into(), Some(sglang(g, q))),
            ("L".into(), Some(llama(2 * g, q))),
            ("T".into(), Some(tgi(g))),
        ],
        ..Snapshot::default()
    };
    let win = PhaseWindow {
        name: "a".into(),
        arrivals: String::new(),
        start_s: 0.0,
        end_s: 1.0,
        held_back: 0,
        hold_max_seconds: 0.0,
    };
    let snaps = vec![PhaseSnapshots {
        phase: "a".into(),
        start: snap(0.0, 10, 0),
        end: snap(1.0, 30, 3),
        settled: None,
    }];
    let r = crate::record::sample("a", 0.1, 0.5, Some(0.1), "success");
    let c = build(&[win], &[r], &snaps, None);
    let at_end = |src: &str| {
        c.counters
            .iter()
            .find(|x| x.at == "end" && x.source == src)
            .unwrap()
            .clone()
    };
    let (s, l) = (at_end("S"), at_end("L"));
    assert_eq!(
        (
            s.generation_tokens_total,
            s.num_requests_waiting,
            s.num_requests_running
        ),
        (Some(30.0), Some(3.0), Some(1.0))
    );
    assert_eq!(
        (
            l.generation_tokens_total,
            l.num_requests_waiting,
            l.num_requests_running
        ),
        (Some(60.0), Some(3.0), Some(1.0))
    );
    assert_eq!(at_end("T").num_requests_waiting, Some(0.0));
    let tokens = &c.tokens[0].engine_generation_tokens;
    assert_eq!((tokens["S"], tokens["L"]), (Some(20.0), Some(40.0)));
    let tgi_e2e = c
        .rows
        .iter()
        .find(|r| r.metric == "e2e" && r.source == "engine histogram (T)")
        .expect("TGI's E2E row");
    assert_eq!(tgi_e2e.count, Some(20.0));
}
