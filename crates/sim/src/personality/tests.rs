use super::*;

fn engine(p: Personality) -> EngineMetrics {
    let m = EngineMetrics::with_grids(&["tiny".to_string()], 100, false, 1.5e9, p.grids());
    let mm = &m.models[0];
    mm.running.store(3, Relaxed);
    mm.waiting.store(5, Relaxed);
    m.kv_tokens.store(40, Relaxed);
    mm.ttft.observe(0.05);
    mm.e2e.observe(0.7);
    m
}

/// The line of `name` (with labels) in `page`, its value.
fn value(page: &str, series: &str) -> String {
    let line = page
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("{series} not in\n{page}"));
    line[series.len() + 1..].to_string()
}

#[test]
fn every_personality_serves_its_own_signal_families() {
    let cases: &[(Personality, &[(&str, &str)])] = &[
        (
            Personality::Vllm,
            &[
                ("vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"}", "5.0"),
                ("vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"}", "3.0"),
                ("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"}", "0.4"),
            ],
        ),
        (
            Personality::Sglang,
            &[
                ("sglang:num_queue_reqs{engine_type=\"unified\",model_name=\"tiny\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"}", "5.0"),
                ("sglang:num_running_reqs{engine_type=\"unified\",model_name=\"tiny\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"}", "3.0"),
                ("sglang:token_usage{engine_type=\"unified\",model_name=\"tiny\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"}", "0.4"),
                // TTFT grid starts at 0.1: 0.05 falls in the first bucket
                ("sglang:time_to_first_token_seconds_bucket{engine_type=\"unified\",is_streaming=\"true\",le=\"0.1\",model_name=\"tiny\"}", "1.0"),
            ],
        ),
        (
            Personality::Llamacpp,
            &[
                ("llamacpp:requests_deferred", "5"),
                ("llamacpp:requests_processing", "3"),
            ],
        ),
        (
            Personality::Tgi,
            &[
                ("tgi_queue_size", "5"),
                ("tgi_batch_current_size", "3"),
                ("tgi_request_duration_count", "1"),
            ],
        ),
        (
            Personality::Trtllm,
            &[
                ("trtllm_num_requests_waiting{engine_type=\"trtllm\",model_name=\"tiny\"}", "5.0"),
                ("trtllm_num_requests_running{engine_type=\"trtllm\",model_name=\"tiny\"}", "3.0"),
                ("trtllm_kv_cache_utilization{engine_type=\"trtllm\",model_name=\"tiny\"}", "0.4"),
                ("trtllm_time_to_first_token_seconds_bucket{engine_type=\"trtllm\",le=\"0.06\",model_name=\"tiny\"}", "1.0"),
            ],
        ),
    ];
    for (p, series) in cases {
        let page = p.render_metrics(&engine(*p));
        for (s, want) in *series {
            assert_eq!(value(&page, s), *want, "{p:?} {s}");
        }
        // Only its own families: no other engine's prefix on the page.
        for other in Personality::ALL.iter().filter(|o| *o != p) {
            let prefix = match other {
                Personality::Vllm => "vllm:",
                Personality::Sglang => "sglang:",
                Personality::Llamacpp => "llamacpp:",
                Personality::Tgi => "tgi_",
                Personality::Trtllm => "trtllm_",
            };
            assert!(!page.contains(prefix), "{p:?} page has {prefix}");
        }
    }
}

#[test]
fn sglang_has_no_finished_reason_and_no_created_series() {
    let page = Personality::Sglang.render_metrics(&engine(Personality::Sglang));
    assert!(!page.contains("finished_reason"));
    assert!(!page.contains("_created"));
    let trt = Personality::Trtllm.render_metrics(&engine(Personality::Trtllm));
    assert!(trt.contains("finished_reason=\"stop\""));
    assert!(trt.contains("trtllm_time_to_first_token_seconds_created{"));
}

#[test]
fn tgi_durations_share_one_geometric_grid() {
    let grid = Personality::Tgi.grids();
    assert_eq!(grid.e2e.len(), 35);
    assert!((grid.e2e[0] - 0.00015).abs() < 1e-12);
    for w in grid.e2e.windows(2) {
        assert!((w[1] / w[0] - 1.5).abs() < 1e-9);
    }
    let page = Personality::Tgi.render_metrics(&engine(Personality::Tgi));
    assert!(page.contains("tgi_request_duration_bucket{le=\"+Inf\"} 1\n"));
    assert!(
        !page.contains("time_to_first_token"),
        "TGI has no TTFT histogram"
    );
}

#[test]
fn trtllm_serves_prometheus_text_elsewhere() {
    assert_eq!(Personality::Trtllm.metrics_path(), "/prometheus/metrics");
    for p in [
        Personality::Vllm,
        Personality::Sglang,
        Personality::Llamacpp,
        Personality::Tgi,
    ] {
        assert_eq!(p.metrics_path(), "/metrics");
    }
}

#[test]
fn doubles_print_as_cpp_streams_print_them() {
    let table = [
        (0.0, "0"),
        (4.0, "4"),
        (2.381, "2.381"),
        (83.6, "83.6"),
        (1874.0, "1874"),
        (123456.0, "123456"),
        (1234567.0, "1.23457e+06"),
        (0.0001, "0.0001"),
        (0.00001234, "1.234e-05"),
        (1.0 / 3.0, "0.333333"),
    ];
    for (v, want) in table {
        assert_eq!(cpp_double(v), want, "{v}");
    }
}
