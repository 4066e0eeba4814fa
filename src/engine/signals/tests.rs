use super::*;
use crate::engine::parse::parse;

fn families(page: &str) -> Vec<Family> {
    match parse(page) {
        Ok(f) => f,
        Err(e) => panic!("{e}: {page:?}"),
    }
}

/// The body of a captured response (headers end at the first blank line).
fn body(raw: &str) -> String {
    raw[raw.find("\r\n\r\n").unwrap() + 4..].to_string()
}

fn load(waiting: Option<f64>, running: Option<f64>, kv: Option<f64>) -> EngineLoad {
    EngineLoad {
        waiting,
        running,
        kv_cache_usage: kv,
    }
}

/// One page per engine: real captures (vLLM 0.32, llama-server at llama.cpp 0c1e570, both
/// idle) and fixture pages shaped like each engine's exposition (from its source), read with
/// the kind detected.
#[test]
fn every_engine_page_maps_to_the_canonical_signals() {
    let vllm = body(include_str!(
        "../../../tests/sim_fixtures/vllm-0.32/metrics.txt"
    ));
    let llama = body(include_str!(
        "../../../tests/engine_fixtures/llamacpp-0c1e570/metrics.txt"
    ));
    let cases: &[(&str, &str, EngineKind, EngineLoad)] = &[
        (
            "vllm capture",
            &vllm,
            EngineKind::Vllm,
            load(Some(0.0), Some(0.0), Some(0.0)),
        ),
        (
            "llama-server capture",
            &llama,
            EngineKind::Llamacpp,
            load(Some(0.0), Some(0.0), None),
        ),
        (
            "sglang",
            include_str!("../../../tests/engine_fixtures/sglang.txt"),
            EngineKind::Sglang,
            load(Some(7.0), Some(12.0), Some(0.62)),
        ),
        (
            "llamacpp",
            include_str!("../../../tests/engine_fixtures/llamacpp.txt"),
            EngineKind::Llamacpp,
            load(Some(9.0), Some(4.0), None),
        ),
        (
            "tgi",
            include_str!("../../../tests/engine_fixtures/tgi.txt"),
            EngineKind::Tgi,
            load(Some(2.0), Some(6.0), None),
        ),
        (
            "trtllm",
            include_str!("../../../tests/engine_fixtures/trtllm.txt"),
            EngineKind::Trtllm,
            load(Some(11.0), Some(64.0), Some(0.71)),
        ),
    ];
    for (name, page, kind, want) in cases {
        let f = families(page);
        assert_eq!(detect(&f), Some(*kind), "{name}");
        let s = Signals::read(&f, None, None);
        assert_eq!(s.kind, Some(*kind), "{name}");
        assert_eq!(s.load, *want, "{name}");
        // Configured as what it is: the same reading.
        assert_eq!(Signals::read(&f, Some(*kind), None), s, "{name}");
        // What the families say beats a Server header naming another engine.
        let other = EngineKind::ALL.into_iter().find(|k| k != kind);
        assert_eq!(Signals::read(&f, None, other), s, "{name}");
    }
}

#[test]
fn pages_of_the_mapping_rules() {
    let cases: &[(&str, Option<EngineKind>, Signals)] = &[
        ("", None, Signals::default()),
        ("not_an_engine 1\n", None, Signals::default()),
        (
            "vllm:num_requests_waiting{engine=\"0\"} 3.0\n\
             vllm:num_requests_running{engine=\"0\"} 2.0\n\
             vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n",
            None,
            Signals {
                kind: Some(EngineKind::Vllm),
                load: load(Some(3.0), Some(2.0), Some(0.25)),
            },
        ),
        // vLLM data-parallel engines: queues add up, the fullest cache counts
        (
            "vllm:num_requests_waiting{engine=\"0\"} 3.0\n\
             vllm:num_requests_waiting{engine=\"1\"} 4.0\n\
             vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n\
             vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n",
            None,
            Signals {
                kind: Some(EngineKind::Vllm),
                load: load(Some(7.0), None, Some(0.75)),
            },
        ),
        // vLLM v0 cache name; NaN ignored
        (
            "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_waiting NaN\n",
            None,
            Signals {
                kind: Some(EngineKind::Vllm),
                load: load(Some(0.0), None, Some(0.5)),
            },
        ),
        // SGLang, two data-parallel ranks, each reported by two tensor-parallel workers
        // (--enable-metrics-for-all-schedulers): each rank once, ranks added
        (
            "sglang:num_queue_reqs{dp_rank=\"0\",tp_rank=\"0\"} 4.0\n\
             sglang:num_queue_reqs{dp_rank=\"0\",tp_rank=\"1\"} 4.0\n\
             sglang:num_queue_reqs{dp_rank=\"1\",tp_rank=\"0\"} 2.0\n\
             sglang:num_queue_reqs{dp_rank=\"1\",tp_rank=\"1\"} 2.0\n",
            None,
            Signals {
                kind: Some(EngineKind::Sglang),
                load: load(Some(6.0), None, None),
            },
        ),
        // SGLang priority scheduling: the total under priority="", its breakdown left out
        (
            "sglang:num_queue_reqs{priority=\"\",tp_rank=\"0\"} 5.0\n\
             sglang:num_queue_reqs{priority=\"0\",tp_rank=\"0\"} 2.0\n\
             sglang:num_queue_reqs{priority=\"1\",tp_rank=\"0\"} 3.0\n\
             sglang:num_running_reqs{priority=\"\",tp_rank=\"0\"} 1.0\n\
             sglang:token_usage{tp_rank=\"0\"} 0.9\n",
            None,
            Signals {
                kind: Some(EngineKind::Sglang),
                load: load(Some(5.0), Some(1.0), Some(0.9)),
            },
        ),
        // llama.cpp without --metrics serves no page at all; with it, no KV family
        (
            "llamacpp:requests_deferred 0\nllamacpp:requests_processing 1\n",
            None,
            Signals {
                kind: Some(EngineKind::Llamacpp),
                load: load(Some(0.0), Some(1.0), None),
            },
        ),
        // an older llama-server that still serves its KV ratio
        (
            "llamacpp:requests_deferred 1\nllamacpp:kv_cache_usage_ratio 0.4\n",
            None,
            Signals {
                kind: Some(EngineKind::Llamacpp),
                load: load(Some(1.0), None, Some(0.4)),
            },
        ),
        // configured as TGI: read as TGI even though only a counter is served
        (
            "tgi_request_count 3\n",
            Some(EngineKind::Tgi),
            Signals {
                kind: Some(EngineKind::Tgi),
                load: load(None, None, None),
            },
        ),
        // configured kind wins over what the page looks like
        (
            "vllm:num_requests_waiting 3\n",
            Some(EngineKind::Sglang),
            Signals {
                kind: Some(EngineKind::Sglang),
                load: load(None, None, None),
            },
        ),
        // a negative reading is no queue
        (
            "trtllm_num_requests_waiting -2\n",
            None,
            Signals {
                kind: Some(EngineKind::Trtllm),
                load: load(Some(0.0), None, None),
            },
        ),
    ];
    for (page, configured, want) in cases {
        let s = Signals::read(&families(page), *configured, None);
        assert_eq!(&s, want, "{page:?} {configured:?}");
    }
}

#[test]
fn detection() {
    let cases: &[(&str, Option<EngineKind>)] = &[
        ("", None),
        (
            "python_gc_objects_collected_total 1\nprocess_cpu_seconds_total 2\n",
            None,
        ),
        // signal families decide
        ("sglang:num_queue_reqs 1\n", Some(EngineKind::Sglang)),
        ("tgi_queue_size 0\n", Some(EngineKind::Tgi)),
        // no signal family: the prefix most families carry
        (
            "tgi_request_count 1\ntgi_request_success 1\nvllm:iteration_tokens_total 1\n",
            Some(EngineKind::Tgi),
        ),
        (
            "llamacpp:prompt_tokens_total 5\n",
            Some(EngineKind::Llamacpp),
        ),
        // a page carrying two engines' families: the one with more signal families wins
        (
            "vllm:num_requests_waiting 1\nsglang:num_queue_reqs 1\nsglang:token_usage 0.1\n",
            Some(EngineKind::Sglang),
        ),
        // a tie goes to the earlier row
        (
            "sglang:num_queue_reqs 1\nvllm:num_requests_waiting 1\n",
            Some(EngineKind::Vllm),
        ),
    ];
    for (page, want) in cases {
        assert_eq!(detect(&families(page)), *want, "{page:?}");
    }
}

/// The `Server` header as each engine's HTTP server sends it: only llama-server's names its
/// engine (the real captures, `tests/engine_fixtures/llamacpp-0c1e570/*.txt`, carry
/// `Server: llama.cpp` on streams, JSON answers and `/metrics`).
#[test]
fn the_server_header_names_llama_cpp_only() {
    let cases: &[(&str, Option<EngineKind>)] = &[
        ("llama.cpp", Some(EngineKind::Llamacpp)),
        ("Llama.CPP ", Some(EngineKind::Llamacpp)),
        ("uvicorn", None), // vLLM, SGLang, TensorRT-LLM
        ("", None),
        ("llama.cpp/b1", None),
        ("nginx", None),
    ];
    for (value, want) in cases {
        assert_eq!(from_server(value), *want, "{value:?}");
    }
    let capture = include_str!("../../../tests/engine_fixtures/llamacpp-0c1e570/metrics.txt");
    let server = capture
        .lines()
        .find_map(|l| l.strip_prefix("Server: "))
        .map(str::trim);
    assert_eq!(server.and_then(from_server), Some(EngineKind::Llamacpp));
}

/// A page without any engine's families (llama-server's 501 for `/metrics` without
/// `--metrics` has none at all) is read as the engine its `Server` header named: the kind is
/// known, its load is not.
#[test]
fn the_server_header_tells_the_kind_when_the_families_do_not() {
    let cases: &[(&str, Option<EngineKind>, Option<EngineKind>, Signals)] = &[
        (
            "",
            None,
            Some(EngineKind::Llamacpp),
            Signals {
                kind: Some(EngineKind::Llamacpp),
                load: load(None, None, None),
            },
        ),
        (
            "process_cpu_seconds_total 1\n",
            None,
            Some(EngineKind::Llamacpp),
            Signals {
                kind: Some(EngineKind::Llamacpp),
                load: load(None, None, None),
            },
        ),
        // the configured kind first, the families next
        (
            "",
            Some(EngineKind::Vllm),
            Some(EngineKind::Llamacpp),
            Signals {
                kind: Some(EngineKind::Vllm),
                load: load(None, None, None),
            },
        ),
        (
            "llamacpp:requests_deferred 3\n",
            None,
            None,
            Signals {
                kind: Some(EngineKind::Llamacpp),
                load: load(Some(3.0), None, None),
            },
        ),
    ];
    for (page, configured, server, want) in cases {
        assert_eq!(
            Signals::read(&families(page), *configured, *server),
            *want,
            "{page:?} {configured:?} {server:?}"
        );
    }
}

#[test]
fn every_kind_has_one_row_and_the_rows_own_their_prefix() {
    for kind in EngineKind::ALL {
        let rows: Vec<&Mapping> = TABLE.iter().filter(|m| m.kind == kind).collect();
        assert_eq!(rows.len(), 1, "{kind:?}");
        let m = rows[0];
        assert_eq!(mapping(kind).kind, kind);
        // The engine's names are the table's row of the same engine.
        assert_eq!(m.names.kind, kind.as_str());
    }
}

#[test]
fn queue_and_demand() {
    for (waiting, queue) in [(None, 0), (Some(0.0), 0), (Some(2.0), 2), (Some(2.6), 3)] {
        let s = Signals {
            kind: None,
            load: load(waiting, None, None),
        };
        assert_eq!(s.queue(), queue, "{waiting:?}");
    }
    assert_eq!(demand(0, []), 0.0);
    assert_eq!(demand(3, [2.0, 5.0]), 10.0);
    assert_eq!(demand(1, [f64::NAN, 4.0]), 5.0);
}
