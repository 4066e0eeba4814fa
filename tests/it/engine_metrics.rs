//! The engine scraper end to end: simulated vLLM engines behind an in-process proxy. The admin
//! `/metrics` serves the proxy's families and every engine's, relabelled `upstream`, as one
//! valid page; a queued engine gets no new requests; a dead engine is counted and left out;
//! models the engines serve are labelled from the first request.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use crate::support::meter::*;
use crate::support::prom::*;
use crate::support::proxy::*;
use goodput_proxy::config::{RawConfig, UpstreamLabel};
use goodput_proxy::engine::parse::{parse, Kind};
use goodput_proxy::metrics::TTFT_BUCKETS;
use goodput_sim::{SimConfig, SimHandle};

/// Proxy config in front of `upstreams`, scraping every 100 ms.
fn engine_config(upstreams: &[String]) -> RawConfig {
    let mut c = test_config(upstreams);
    c.engine.scrape_interval_ms = 100;
    c.engine.scrape_timeout_ms = 2_000;
    c
}

/// Polls the admin `/metrics` until `cond` holds on the page; panics after `SLOW`.
async fn metrics_until(proxy: &Proxy, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + SLOW;
    loop {
        let m = metrics(proxy).await;
        if cond(&m) {
            return m;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}:\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn chat(model: &str, max_tokens: u32) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"Hi"}}],"max_tokens":{max_tokens}}}"#
    )
}

/// An independent reading of the text format, line by line (no shared code with the parser):
/// every line is a HELP, a TYPE or a sample; each family's HELP and TYPE come at most once and
/// before its samples; a family's samples form one group; a histogram's samples are
/// `_bucket` (with `le`), `_sum`, `_count`. Returns the TYPE of every family.
fn check_grammar(page: &str) -> HashMap<String, String> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helps: HashSet<String> = HashSet::new();
    let mut closed: HashSet<String> = HashSet::new();
    let mut current: Option<(String, String)> = None;
    let name_ok = |n: &str| {
        !n.is_empty()
            && !n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for (i, line) in page.lines().enumerate() {
        let at = format!("line {}: {line}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(name_ok(name), "{at}");
            assert!(helps.insert(name.to_string()), "second HELP, {at}");
            assert!(
                !closed.contains(name),
                "HELP after the family's group, {at}"
            );
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect(&at);
            assert!(name_ok(name), "{at}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{at}"
            );
            assert!(
                types.insert(name.into(), kind.into()).is_none(),
                "second TYPE, {at}"
            );
            if let Some((prev, _)) = current.take() {
                closed.insert(prev);
            }
            current = Some((name.into(), kind.into()));
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment, {at}");
        // name{labels} value [timestamp]
        let name_end = line.find(['{', ' ']).expect(&at);
        let name = &line[..name_end];
        assert!(name_ok(name), "{at}");
        let rest = &line[name_end..];
        let after_labels = if rest.starts_with('{') {
            let close = rest.rfind('}').expect(&at);
            for pair in split_labels(&rest[1..close]) {
                let (k, v) = pair.split_once('=').expect(&at);
                assert!(name_ok(k) && !k.contains(':'), "{at}");
                assert!(
                    v.len() >= 2 && v.starts_with('"') && v.ends_with('"'),
                    "{at}"
                );
            }
            &rest[close + 1..]
        } else {
            rest
        };
        let mut fields = after_labels.split_whitespace();
        let value = fields.next().expect(&at);
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "{at}"
        );
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().expect(&at);
        }
        assert!(fields.next().is_none(), "{at}");
        let (family, kind) = current.as_ref().expect("sample before any TYPE");
        let suffix = name.strip_prefix(family.as_str()).expect(&at);
        match kind.as_str() {
            "histogram" => {
                assert!(["_bucket", "_sum", "_count"].contains(&suffix), "{at}");
                if suffix == "_bucket" {
                    assert!(rest.contains("le=\""), "{at}");
                }
            }
            "summary" => assert!(["", "_sum", "_count"].contains(&suffix), "{at}"),
            _ => assert_eq!(suffix, "", "{at}"),
        }
    }
    types
}

/// Splits `a="x",b="y,z"` at the commas outside quotes.
fn split_labels(s: &str) -> Vec<&str> {
    let (mut out, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// The `le` values of `name`'s series matching every label in `labels`.
fn le_values(page: &str, name: &str, labels: &[(&str, &str)]) -> BTreeSet<String> {
    series(page, name)
        .filter(|(l, _)| has_labels(l, labels))
        .filter_map(|(l, _)| l.into_iter().find_map(|(k, v)| (k == "le").then_some(v)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_metrics_serve_every_engine_relabelled_on_one_valid_page() {
    let a = start_sim(SimConfig {
        seed: 1,
        ..SimConfig::fast()
    })
    .await;
    let b = start_sim(SimConfig {
        seed: 2,
        models: vec!["tiny".into(), "big".into()],
        ..SimConfig::fast()
    })
    .await;
    let (ua, ub) = (a.base_url(), b.base_url());
    let proxy = start_proxy(engine_config(&[ua.clone(), ub.clone()])).await;
    const THROUGH_PROXY: usize = 4;
    let c = client();
    for _ in 0..THROUGH_PROXY {
        let (parts, _) = send(&c, post_json(&proxy.url(CHAT), &chat("tiny", 3))).await;
        assert_eq!(parts.status, 200);
    }
    // Both engines served something (so their histograms have data) before the check.
    for sim in [&a, &b] {
        let (parts, _) = send(
            &c,
            post_json(&format!("{}{CHAT}", sim.base_url()), &chat("tiny", 3)),
        )
        .await;
        assert_eq!(parts.status, 200);
    }
    // Every request succeeded, so the engines' E2E histograms count each one once.
    let served = THROUGH_PROXY + 2;
    let page = metrics_until(&proxy, "both engines scraped after the requests", |m| {
        [&ua, &ub].iter().all(|u| {
            try_metric(m, "goodput_proxy_engine_up", &[("upstream", u)]) == Some(1.0)
                && try_metric(
                    m,
                    "vllm:e2e_request_latency_seconds_count",
                    &[("upstream", u)],
                )
                .is_some_and(|n| n > 0.0)
        }) && try_metric(m, "vllm:e2e_request_latency_seconds_count", &[]) == Some(served as f64)
    })
    .await;

    // Our parser reads the whole page; every family once; every engine sample relabelled.
    let fams = parse(&page).expect("the page parses");
    let mut names = HashSet::new();
    for f in &fams {
        assert!(names.insert(f.name.as_str()), "family {} twice", f.name);
    }
    for f in fams
        .iter()
        .filter(|f| !f.name.starts_with("goodput_proxy_"))
    {
        for s in &f.samples {
            let up = s.label("upstream");
            assert!(up == Some(&ua) || up == Some(&ub), "{s:?}");
        }
    }
    // The independent line-grammar check agrees on the families and their types.
    let types = check_grammar(&page);
    assert_eq!(types.len(), fams.len());
    for f in &fams {
        assert_eq!(types[&f.name], f.kind.as_str(), "{}", f.name);
    }
    let help_lines = page.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(help_lines, fams.iter().filter(|f| f.help.is_some()).count());

    // The proxy's own families come first, then the engines'.
    let first_engine = page.find("# HELP vllm:").expect("engine families");
    assert!(page[first_engine..]
        .lines()
        .all(|l| !l.contains("goodput_proxy_")));
    assert!(page[..first_engine].contains("# TYPE goodput_proxy_requests_total counter"));

    // Both engines' series sit under one HELP/TYPE, each with its upstream.
    let waiting = fams
        .iter()
        .find(|f| f.name == "vllm:num_requests_waiting")
        .unwrap();
    assert_eq!(waiting.kind, Kind::Gauge);
    let ups: BTreeSet<&str> = waiting
        .samples
        .iter()
        .filter_map(|s| s.label("upstream"))
        .collect();
    assert_eq!(ups, BTreeSet::from([ua.as_str(), ub.as_str()]));
    // b serves two models: one series per model_name, all labelled b.
    assert_eq!(
        series(&page, "vllm:num_requests_waiting")
            .filter(|(l, _)| has_labels(l, &[("upstream", ub.as_str())]))
            .count(),
        2
    );

    // Proxy and engine TTFT histograms share the bucket grid, bucket by bucket.
    let grid: BTreeSet<String> = TTFT_BUCKETS
        .iter()
        .map(|b| format!("{b}"))
        .chain(["+Inf".to_string()])
        .collect();
    let proxy_le = le_values(
        &page,
        "goodput_proxy_time_to_first_token_seconds_bucket",
        &[],
    );
    assert_eq!(proxy_le.len(), TTFT_BUCKETS.len() + 1);
    for u in [&ua, &ub] {
        let engine_le = le_values(
            &page,
            "vllm:time_to_first_token_seconds_bucket",
            &[("upstream", u), ("model_name", "tiny")],
        );
        let as_f64 = |s: &BTreeSet<String>| -> Vec<f64> {
            let mut v: Vec<f64> = s.iter().map(|x| x.parse().unwrap()).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        assert_eq!(as_f64(&engine_le), as_f64(&proxy_le), "{u}");
        assert_eq!(as_f64(&engine_le), as_f64(&grid));
    }
    for u in [&ua, &ub] {
        assert_eq!(
            metric(
                &page,
                "goodput_proxy_engine_scrape_errors_total",
                &[("upstream", u)]
            ),
            0.0
        );
        assert!(page.contains(&format!(
            "goodput_proxy_engine_scrape_errors_total{{upstream=\"{u}\"}} 0"
        )));
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// Streams `n` long requests straight to `sim` (not through the proxy); they hold its single
/// slot and queue behind it until the returned tasks are aborted.
pub(crate) fn occupy(sim: &SimHandle, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let url = format!("{}{CHAT}", sim.base_url());
            tokio::spawn(async move {
                let body = chat_body(2_000, "");
                let resp = client().request(post_json(&url, &body)).await;
                if let Ok(resp) = resp {
                    use http_body_util::BodyExt;
                    let _ = resp.into_body().collect().await;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_engine_shows_in_queue_depth_and_gets_no_new_requests() {
    const QUEUED: usize = 3;
    const REQUESTS: u64 = 20;
    // `busy` runs one sequence at a time, slowly; `free` is instant.
    let busy = start_sim(SimConfig {
        max_num_seqs: 1,
        ..SimConfig::with_timing(5.0, 50.0)
    })
    .await;
    let free = start_sim(SimConfig::fast()).await;
    let (ub, uf) = (busy.base_url(), free.base_url());
    let proxy = start_proxy(engine_config(&[ub.clone(), uf.clone()])).await;
    let hogs = occupy(&busy, QUEUED + 1);
    assert!(
        eventually(SLOW, || busy.running() == 1 && busy.waiting() == QUEUED).await,
        "busy engine: one running, {QUEUED} waiting"
    );
    let page = metrics_until(&proxy, "queue depth scraped", |m| {
        try_metric(
            m,
            "goodput_proxy_upstream_queue_depth",
            &[("upstream", &ub)],
        ) == Some(QUEUED as f64)
            && try_metric(
                m,
                "goodput_proxy_upstream_queue_depth",
                &[("upstream", &uf)],
            ) == Some(0.0)
            && try_metric(m, "goodput_proxy_engine_up", &[("upstream", &uf)]) == Some(1.0)
    })
    .await;
    assert_eq!(
        metric(
            &page,
            "goodput_proxy_upstream_running",
            &[("upstream", &ub)]
        ),
        1.0
    );
    // Nothing in flight through the proxy: demand is the engines' backlog.
    assert_eq!(metric(&page, "goodput_proxy_demand", &[]), QUEUED as f64);
    // Both replicas answer their health probes, so only the engine queue tells them apart:
    // with in-flight alone, p2c would send about half the requests to `busy`.
    metrics_until(&proxy, "both replicas healthy", |m| {
        try_metric(m, "goodput_proxy_upstream_healthy", &[]) == Some(2.0)
    })
    .await;

    let busy_before = busy.requests_started();
    let c = client();
    for _ in 0..REQUESTS {
        let (parts, _) = send(&c, post_json(&proxy.url(CHAT), &chat("tiny", 1))).await;
        assert_eq!(parts.status, 200);
    }
    assert_eq!(
        busy.requests_started(),
        busy_before,
        "no request went to the queued engine"
    );
    assert_eq!(free.requests_served(), REQUESTS);
    for h in hogs {
        h.abort();
    }
    assert!(busy.wait_idle(SLOW).await);
    busy.shutdown().await;
    free.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_scrapes_are_counted_and_their_families_left_out() {
    let live = start_sim(SimConfig::fast()).await;
    let dying = start_sim(SimConfig {
        seed: 9,
        ..SimConfig::fast()
    })
    .await;
    let dead = crate::support::dead_url();
    let mut config = engine_config(&[live.base_url(), dead.url.clone(), dying.base_url()]);
    // Index labels: "0" live, "1" dead from the start, "2" dies during the test.
    config.engine.upstream_label = UpstreamLabel::Index;
    let proxy = start_proxy(config).await;
    let has_engine_series = |m: &str, up: &str| {
        m.lines()
            .any(|l| l.starts_with("vllm:") && l.contains(&format!("upstream=\"{up}\"")))
    };
    let page = metrics_until(&proxy, "dead replica counted, the others scraped", |m| {
        try_metric(
            m,
            "goodput_proxy_engine_scrape_errors_total",
            &[("upstream", "1")],
        )
        .is_some_and(|n| n >= 2.0)
            && has_engine_series(m, "0")
            && has_engine_series(m, "2")
    })
    .await;
    assert!(!has_engine_series(&page, "1"));
    assert_eq!(
        metric(&page, "goodput_proxy_engine_up", &[("upstream", "1")]),
        0.0
    );
    assert!(page.contains("goodput_proxy_engine_up{upstream=\"1\"} 0"));
    assert_eq!(
        metric(
            &page,
            "goodput_proxy_engine_scrape_errors_total",
            &[("upstream", "0")]
        ),
        0.0
    );
    parse(&page).expect("valid page");
    check_grammar(&page);

    // A replica that goes away: counted from then on, its families gone, its age growing.
    dying.shutdown().await;
    let page = metrics_until(&proxy, "replica 2 left out after it died", |m| {
        try_metric(
            m,
            "goodput_proxy_engine_scrape_errors_total",
            &[("upstream", "2")],
        )
        .is_some_and(|n| n >= 1.0)
            && !has_engine_series(m, "2")
    })
    .await;
    assert!(has_engine_series(&page, "0"));
    assert_eq!(
        metric(&page, "goodput_proxy_engine_up", &[("upstream", "2")]),
        0.0
    );
    let age = |m: &str, up: &str| {
        metric(
            m,
            "goodput_proxy_engine_scrape_age_seconds",
            &[("upstream", up)],
        )
    };
    let later = metrics_until(&proxy, "age of replica 2 grows", |m| {
        age(m, "2") > age(&page, "2") + 0.2
    })
    .await;
    assert!(age(&later, "0") < 5.0, "live replica stays fresh");
    parse(&later).expect("valid page");
    check_grammar(&later);
    live.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_of_a_served_model_gets_its_label() {
    let sim = start_sim(SimConfig {
        models: vec!["tiny".into(), "big".into()],
        ..SimConfig::fast()
    })
    .await;
    // No configured models: both must come from the sim's /v1/models, before serving.
    let proxy = start_proxy(test_config(&[sim.base_url()])).await;
    let (parts, _) = send(&client(), post_json(&proxy.url(CHAT), &chat("big", 2))).await;
    assert_eq!(parts.status, 200);
    wait_requests(&proxy, 1).await;
    let m = metrics(&proxy).await;
    assert_eq!(
        metric(&m, "goodput_proxy_requests_total", &[("model", "big")]),
        1.0
    );
    assert_eq!(
        metric_in_family(&m, "goodput_proxy_requests_total", &[("model", "other")]),
        0.0
    );
    sim.shutdown().await;
}
