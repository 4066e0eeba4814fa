use super::*;
use crate::engine::parse::parse;

/// A page with the proxy's three histograms and the engine's, for one model on two upstreams.
/// `n` requests per upstream, each 0.05 s TTFT, 0.02 s TPOT, 0.4 s E2E on upstream a and
/// twice that on b; the engine saw the same minus a little.
fn page(n: f64, legacy: bool) -> Vec<Family> {
    let mut s = String::new();
    let hist = |s: &mut String, name: &str, labels: &str, grid: &[f64], v: f64, n: f64| {
        s.push_str(&format!("# TYPE {name} histogram\n"));
        for le in grid {
            let c = if v <= *le { n } else { 0.0 };
            s.push_str(&format!("{name}_bucket{{{labels},le=\"{le}\"}} {c}\n"));
        }
        s.push_str(&format!("{name}_bucket{{{labels},le=\"+Inf\"}} {n}\n"));
        s.push_str(&format!(
            "{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {n}\n",
            v * n
        ));
    };
    let grid = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
    let tpot_engine = if legacy {
        "vllm:time_per_output_token_seconds"
    } else {
        "vllm:request_time_per_output_token_seconds"
    };
    // One family block per name, series for both upstreams in it (as the proxy merges them).
    for (name, v, engine_side) in [
        ("goodput_proxy_time_to_first_token_seconds", 0.05, false),
        ("goodput_proxy_time_per_output_token_seconds", 0.02, false),
        ("goodput_proxy_e2e_request_latency_seconds", 0.4, false),
        ("vllm:time_to_first_token_seconds", 0.04, true),
        (tpot_engine, 0.02, true),
        ("vllm:e2e_request_latency_seconds", 0.39, true),
    ] {
        let mut block = String::new();
        for (up, k) in [("a", 1.0), ("b", 2.0)] {
            let labels = if engine_side {
                format!("model_name=\"tiny\",upstream=\"{up}\"")
            } else {
                format!("model=\"tiny\",upstream=\"{up}\"")
            };
            let mut one = String::new();
            hist(&mut one, name, &labels, &grid, v * k, n);
            // Keep a single TYPE line per family.
            let body: String = one.lines().skip(1).map(|l| format!("{l}\n")).collect();
            block.push_str(&body);
        }
        s.push_str(&format!("# TYPE {name} histogram\n{block}"));
    }
    s.push_str("# TYPE goodput_proxy_records_dropped_total counter\ngoodput_proxy_records_dropped_total 0\n");
    s.push_str("# TYPE vllm:request_success_total counter\n");
    for up in ["a", "b"] {
        s.push_str(&format!(
            "vllm:request_success_total{{finished_reason=\"length\",model_name=\"tiny\",upstream=\"{up}\"}} {n}\n\
             vllm:request_success_total{{finished_reason=\"stop\",model_name=\"tiny\",upstream=\"{up}\"}} 0\n"
        ));
    }
    // The replica's running batch as the proxy read it through the engine mapping.
    s.push_str("# TYPE goodput_proxy_upstream_running gauge\n");
    for up in ["a", "b"] {
        s.push_str(&format!(
            "goodput_proxy_upstream_running{{upstream=\"{up}\"}} {}\n",
            n.min(8.0)
        ));
    }
    parse(&s).unwrap()
}

fn window(start: f64, end: f64, legacy: bool) -> Window {
    let mut w = Window {
        seconds: 10.0,
        start: page(start, legacy),
        end: page(end, legacy),
        ..Window::default()
    };
    let (s, e) = (w.start.clone(), w.end.clone());
    fold_gauges(&mut w, &s);
    fold_gauges(&mut w, &e);
    w
}

fn exact(ttft: f64) -> BTreeMap<&'static str, Exact> {
    let mut m = BTreeMap::new();
    for (name, v) in [("ttft", ttft), ("tpot", 0.02), ("e2e", 0.4)] {
        m.insert(
            name,
            Exact {
                count: 10,
                values: [Some(v), Some(v), Some(v)],
            },
        );
    }
    m
}

#[test]
fn one_group_per_model_from_the_bucket_deltas() {
    let mut w = window(5.0, 15.0, false);
    let key = GroupKey {
        model: "tiny".into(),
        upstream: None,
    };
    w.exact.insert(key.clone(), exact(0.05));
    check_families(&w.end, "page", true).unwrap();
    let t = build(&w, false);
    assert_eq!(t.groups.len(), 1);
    let g = &t.groups[0];
    assert_eq!((g.model.as_str(), g.upstream.as_deref()), ("tiny", None));
    let ttft = &g.rows[0];
    assert_eq!(ttft.quantity, "ttft");
    // 10 new requests per upstream between the scrapes.
    assert_eq!(
        (ttft.exact_count, ttft.proxy_count, ttft.engine_count),
        (10, 20.0, 20.0)
    );
    // p50 of a 0.05 (a) + 0.1 (b) mix: rank 10 of 20 is the top of bucket (0.025, 0.05].
    let p50 = ttft.cells[0];
    assert_eq!(p50.quantile, 0.5);
    assert_eq!(p50.proxy_hist, Some(0.05));
    assert_eq!(p50.exact, Some(0.05));
    assert_eq!(p50.proxy_minus_exact, Some(0.0));
    assert_eq!(p50.bucket_width, Some(0.025));
    // Engine 0.04 / 0.08 land in (0.025, 0.05] and (0.05, 0.1] too.
    assert_eq!(p50.engine_hist, Some(0.05));
    assert_eq!(p50.proxy_minus_engine, Some(0.0));
    let e = &g.engine;
    assert_eq!(e.finished_reason.get("length"), Some(&20.0));
    assert_eq!(e.finished_reason.get("stop"), Some(&0.0));
    assert_eq!(e.requests_per_s, 2.0);
    // Running: 5 then 8 per upstream, summed over both: max 16.
    assert_eq!(e.max_running, Some(16.0));
    assert_eq!(e.max_waiting, None);
}

#[test]
fn by_upstream_splits_the_groups_and_v0_names_work() {
    let w = window(0.0, 4.0, true);
    let t = build(&w, true);
    let keys: Vec<_> = t
        .groups
        .iter()
        .map(|g| (g.model.as_str(), g.upstream.as_deref()))
        .collect();
    assert_eq!(keys, [("tiny", Some("a")), ("tiny", Some("b"))]);
    let tpot_b = &t.groups[1].rows[1];
    assert_eq!(tpot_b.quantity, "tpot");
    assert_eq!(tpot_b.engine_count, 4.0);
    // No exact figures given: those cells are empty, the estimates are not.
    assert_eq!(tpot_b.cells[2].exact, None);
    assert!(tpot_b.cells[2].engine_hist.is_some());
    assert_eq!(t.groups[0].engine.max_running, Some(4.0));
}

#[test]
fn a_model_without_requests_in_the_window_has_no_group() {
    let w = window(7.0, 7.0, false);
    assert!(build(&w, false).groups.is_empty());
    assert!(render::text(&build(&w, false)).contains("no request finished"));
}

#[test]
fn missing_families_are_named() {
    let p = parse("# TYPE vllm:num_requests_running gauge\n").unwrap();
    let e = check_families(&p, "http://x/metrics", false).unwrap_err();
    assert!(e
        .to_string()
        .contains("no `goodput_proxy_records_dropped_total` family"));
    // Proxy families present, engine ones missing: the hint names engine scraping.
    let w = window(0.0, 1.0, false);
    let proxy_only: Vec<Family> = w
        .end
        .into_iter()
        .filter(|f| f.name.starts_with("goodput_proxy_"))
        .collect();
    check_families(&proxy_only, "p", false).unwrap();
    let e = check_families(&proxy_only, "p", true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vllm:time_to_first_token_seconds") && e.contains("engine.scrape"),
        "{e}"
    );
}

#[test]
fn text_and_json_show_every_column() {
    let mut w = window(0.0, 10.0, false);
    w.exact.insert(
        GroupKey {
            model: "tiny".into(),
            upstream: None,
        },
        exact(0.05),
    );
    let t = build(&w, false);
    let text = render::text(&t);
    for col in render::COLUMNS.iter().filter(|c| !c.is_empty()) {
        assert!(text.contains(col), "{col}\n{text}");
    }
    assert!(
        text.contains("ttft") && text.contains("p99") && text.contains("length 20"),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_str(&render::json(&t)).unwrap();
    assert_eq!(doc["groups"][0]["rows"][0]["cells"][0]["proxy_hist"], 0.05);
    assert_eq!(doc["groups"][0]["engine"]["requests_per_s"], 2.0);
}

#[test]
fn where_ttft_goes_comes_from_stats_and_is_shown_per_group() {
    let key = GroupKey {
        model: "tiny".into(),
        upstream: None,
    };
    let doc = serde_json::json!({
        "tpot_seconds": {"count": 2, "p50": 0.02, "p99": 0.03},
        "engine": {"mean_itl_seconds": {"count": 2, "p50": 0.015, "p99": 0.025}},
        "ttft_split": {
            "requests": 2, "clamped": 1,
            "proxy_seconds": {"count": 2, "p50": 0.0001, "p99": 0.0002},
            "queue_seconds": {"count": 2, "p50": 0.01, "p99": 0.5},
            "prefill_seconds": {"count": 2, "p50": 0.04, "p99": 0.06},
            "rest_seconds": {"count": 2, "p50": 0.003, "p99": 0.2},
        },
    });
    let split = super::admin::split_from_stats(&doc);
    assert_eq!((split.requests, split.clamped), (2, 1));
    assert_eq!(split.engine_queue.p99, Some(0.5));
    assert_eq!(split.engine_mean_itl.p50, Some(0.015));
    let mut w = window(0.0, 10.0, false);
    w.exact.insert(key.clone(), exact(0.05));
    w.ttft_split.insert(key.clone(), split);
    let t = build(&w, false);
    assert_eq!(t.groups[0].ttft_split, Some(split));
    let text = render::text(&t);
    assert!(
        text.contains("where TTFT goes (p50/p99 ms, 2 requests the engine reported, 1 clamped): proxy 0.10/0.20, engine queue 10.00/500.00, engine prefill 40.00/60.00, rest 3.00/200.00"),
        "{text}"
    );
    assert!(
        text.contains("decode (p50/p99 ms): client TPOT 20.00/30.00, engine mean ITL 15.00/25.00"),
        "{text}"
    );
    // A proxy or engine without them: no such lines.
    w.ttft_split
        .insert(key, super::admin::split_from_stats(&serde_json::json!({})));
    assert!(!render::text(&build(&w, false)).contains("where TTFT goes"));
}

#[test]
fn grids_say_what_is_compared() {
    let vllm = vec![0.001, 0.005, 0.1];
    let sglang = vec![0.1, 0.2, 0.4];
    let cases = [
        (vec![vllm.clone()], vec![vllm.clone()], Grid::Same),
        (
            vec![vllm.clone()],
            vec![sglang.clone()],
            Grid::EngineDiffers,
        ),
        (
            vec![vllm.clone()],
            vec![vllm.clone(), sglang.clone()],
            Grid::EnginesDiffer,
        ),
        (vec![vllm.clone()], vec![], Grid::NoEngine),
    ];
    for (proxy, engine, want) in cases {
        let g = Grid::of(&proxy, &engine);
        assert_eq!(g, want, "{proxy:?} {engine:?}");
        assert_eq!(
            g.note().is_some(),
            matches!(want, Grid::EngineDiffers | Grid::EnginesDiffer)
        );
    }
}

/// A page for model `tiny` on upstreams `a` (SGLang: its own TTFT family and grid), `b`
/// (llama.cpp: no latency histogram), `c` (TGI: E2E only, no model label), and optionally `d`
/// (vLLM), with `n` requests each.
fn fleet_page(n: f64, with_vllm: bool) -> Vec<Family> {
    let mut s = String::new();
    let mut hist = |name: &str, series: &[(String, f64)], grid: &[f64]| {
        s.push_str(&format!("# TYPE {name} histogram\n"));
        for (labels, v) in series {
            let sep = if labels.is_empty() { "" } else { "," };
            for le in grid {
                let c = if v <= le { n } else { 0.0 };
                s.push_str(&format!("{name}_bucket{{{labels}{sep}le=\"{le}\"}} {c}\n"));
            }
            s.push_str(&format!("{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {n}\n"));
            s.push_str(&format!(
                "{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {n}\n",
                v * n
            ));
        }
    };
    let proxy_grid = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
    let ups: Vec<&str> = if with_vllm {
        vec!["a", "b", "c", "d"]
    } else {
        vec!["a", "b", "c"]
    };
    for (name, v) in [
        ("goodput_proxy_time_to_first_token_seconds", 0.05),
        ("goodput_proxy_time_per_output_token_seconds", 0.02),
        ("goodput_proxy_e2e_request_latency_seconds", 0.4),
    ] {
        let series: Vec<(String, f64)> = ups
            .iter()
            .map(|u| (format!("model=\"tiny\",upstream=\"{u}\""), v))
            .collect();
        hist(name, &series, &proxy_grid);
    }
    let sglang = vec![(
        "engine_type=\"unified\",model_name=\"tiny\",upstream=\"a\"".to_string(),
        0.15,
    )];
    hist(
        "sglang:time_to_first_token_seconds",
        &sglang,
        &[0.1, 0.2, 0.4, 0.6],
    );
    hist(
        "tgi_request_duration",
        &[("upstream=\"c\"".to_string(), 0.4)],
        &proxy_grid,
    );
    if with_vllm {
        let vllm = vec![("model_name=\"tiny\",upstream=\"d\"".to_string(), 0.05)];
        hist("vllm:time_to_first_token_seconds", &vllm, &proxy_grid);
    }
    s.push_str("# TYPE goodput_proxy_records_dropped_total counter\ngoodput_proxy_records_dropped_total 0\n");
    s.push_str("# TYPE goodput_proxy_engine_kind gauge\n");
    for (u, k) in [
        ("a", "sglang"),
        ("b", "llamacpp"),
        ("c", "tgi"),
        ("d", "vllm"),
    ] {
        if ups.contains(&u) {
            s.push_str(&format!(
                "goodput_proxy_engine_kind{{kind=\"{k}\",upstream=\"{u}\"}} 1\n"
            ));
        }
    }
    parse(&s).unwrap()
}

#[test]
fn each_engine_is_read_by_its_own_names() {
    let row = |t: &Table, up: Option<&str>, q: &str| {
        let g = t
            .groups
            .iter()
            .find(|g| g.upstream.as_deref() == up)
            .unwrap();
        g.rows.iter().find(|r| r.quantity == q).unwrap().clone()
    };
    let w = Window {
        seconds: 10.0,
        start: fleet_page(0.0, false),
        end: fleet_page(10.0, false),
        ..Window::default()
    };
    check_families(&w.end, "page", true).unwrap();
    let t = build(&w, true);
    // (upstream, quantity) -> (engine read, grid, engines without such a histogram, count)
    type Want = (Option<&'static str>, Grid, Vec<&'static str>, f64);
    let cases: Vec<(&str, &str, Want)> = vec![
        (
            "a",
            "ttft",
            (Some("sglang"), Grid::EngineDiffers, vec![], 10.0),
        ),
        ("a", "tpot", (None, Grid::NoEngine, vec![], 0.0)),
        ("b", "ttft", (None, Grid::NoEngine, vec!["llamacpp"], 0.0)),
        ("b", "e2e", (None, Grid::NoEngine, vec!["llamacpp"], 0.0)),
        ("c", "ttft", (None, Grid::NoEngine, vec!["tgi"], 0.0)),
        // TGI's series name no model: read for the replica the proxy sent the model to.
        ("c", "e2e", (Some("tgi"), Grid::Same, vec![], 10.0)),
    ];
    for (up, q, (engine, grid, none, count)) in cases {
        let r = row(&t, Some(up), q);
        assert_eq!(
            (r.engine, r.grid, r.no_histogram.clone(), r.engine_count),
            (engine, grid, none, count),
            "{up} {q}"
        );
    }
    let text = render::text(&t);
    assert!(
        text.contains("ttft: llamacpp exports no such histogram: no engine estimate"),
        "{text}"
    );
    // Per model: SGLang's TTFT is the only one (the other replicas said so); two engines with
    // a TTFT histogram are not added.
    let t = build(&w, false);
    let r = row(&t, None, "ttft");
    assert_eq!(
        (r.engine, r.no_histogram.clone()),
        (Some("sglang"), vec!["llamacpp", "tgi"])
    );
    let w = Window {
        seconds: 10.0,
        start: fleet_page(0.0, true),
        end: fleet_page(10.0, true),
        ..Window::default()
    };
    let t = build(&w, false);
    let r = row(&t, None, "ttft");
    assert_eq!(
        (r.engine, r.grid, r.engine_count),
        (None, Grid::MixedEngines, 0.0)
    );
    assert_eq!(
        row(&build(&w, true), Some("d"), "ttft").engine,
        Some("vllm")
    );
    // A llama.cpp-only proxy page is comparable (its rows say why there is no engine column).
    let only_kinds: Vec<Family> = fleet_page(1.0, false)
        .into_iter()
        .filter(|f| f.name.starts_with("goodput_proxy_"))
        .collect();
    check_families(&only_kinds, "p", true).unwrap();
}

/// A page of four replicas of different engines, `n` requests finished on each: the proxy's
/// E2E histogram per upstream, each engine's own finished counter (SGLang and TGI: a total;
/// TensorRT-LLM: by reason; llama.cpp: none) and the replica gauges the proxy read through the
/// mapping, `waiting` queued on each.
fn counters_page(n: f64, waiting: f64) -> Vec<Family> {
    let ups = ["a", "b", "c", "e"];
    let mut s = String::from("# TYPE goodput_proxy_e2e_request_latency_seconds histogram\n");
    for u in ups {
        let l = format!("model=\"tiny\",upstream=\"{u}\"");
        s.push_str(&format!(
            "goodput_proxy_e2e_request_latency_seconds_bucket{{{l},le=\"1\"}} {n}\n\
             goodput_proxy_e2e_request_latency_seconds_bucket{{{l},le=\"+Inf\"}} {n}\n\
             goodput_proxy_e2e_request_latency_seconds_sum{{{l}}} {}\n\
             goodput_proxy_e2e_request_latency_seconds_count{{{l}}} {n}\n",
            n * 0.4
        ));
    }
    s.push_str(&format!(
        "# TYPE sglang:num_requests_total counter\n\
         sglang:num_requests_total{{engine_type=\"unified\",model_name=\"tiny\",upstream=\"a\"}} {n}\n\
         # TYPE tgi_request_success counter\ntgi_request_success{{upstream=\"c\"}} {n}\n\
         # TYPE trtllm_request_success_total counter\n\
         trtllm_request_success_total{{engine_type=\"trtllm\",finished_reason=\"stop\",model_name=\"tiny\",upstream=\"e\"}} {}\n\
         trtllm_request_success_total{{engine_type=\"trtllm\",finished_reason=\"length\",model_name=\"tiny\",upstream=\"e\"}} {}\n",
        n - 1.0,
        1.0
    ));
    for (name, v) in [
        ("goodput_proxy_upstream_running", 1.0),
        ("goodput_proxy_upstream_queue_depth", waiting),
    ] {
        s.push_str(&format!("# TYPE {name} gauge\n"));
        for u in ups {
            s.push_str(&format!("{name}{{upstream=\"{u}\"}} {v}\n"));
        }
    }
    parse(&s).unwrap()
}

#[test]
fn engine_counters_read_each_engines_names() {
    let mut w = Window {
        seconds: 10.0,
        start: counters_page(1.0, 0.0),
        end: counters_page(11.0, 3.0),
        ..Window::default()
    };
    let (s, e) = (w.start.clone(), w.end.clone());
    fold_gauges(&mut w, &s);
    fold_gauges(&mut w, &e);
    let t = build(&w, true);
    let counters = |up: &str| -> EngineCounters {
        t.groups
            .iter()
            .find(|g| g.upstream.as_deref() == Some(up))
            .unwrap()
            .engine
            .clone()
    };
    let reasons = |c: &EngineCounters| -> Vec<(String, f64)> {
        c.finished_reason
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    // SGLang and TGI: one total; TensorRT-LLM: by reason; llama.cpp: none.
    assert_eq!(reasons(&counters("a")), [("(all)".to_string(), 10.0)]);
    assert_eq!(reasons(&counters("b")), []);
    assert_eq!(reasons(&counters("c")), [("(all)".to_string(), 10.0)]);
    assert_eq!(
        reasons(&counters("e")),
        [("length".to_string(), 0.0), ("stop".to_string(), 10.0)]
    );
    // Every replica's queue, whatever its engine (llama.cpp's too).
    for up in ["a", "b", "c", "e"] {
        let c = counters(up);
        assert_eq!(
            (c.max_running, c.max_waiting),
            (Some(1.0), Some(3.0)),
            "{up}"
        );
    }
    let t = build(&w, false);
    let all = &t.groups[0].engine;
    assert_eq!(all.finished_reason.get("(all)"), Some(&20.0));
    assert_eq!(all.requests_per_s, 3.0);
    assert_eq!((all.max_running, all.max_waiting), (Some(4.0), Some(12.0)));
}
