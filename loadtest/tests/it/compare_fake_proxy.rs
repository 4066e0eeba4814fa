//! The comparison against a stand-in for the proxy: an SSE server that measures each request on
//! its side (as the proxy would), writes a JSONL record keyed by `x-request-id`, and serves
//! `/metrics` (a `goodput_proxy_time_to_first_token_seconds` histogram on vLLM's grid) and
//! `/stats` (exact percentiles). The real proxy's test lives with the proxy.

use std::convert::Infallible;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;

use goodput_loadtest::runner::{self, CompareTargets, RunConfig, RunResult};
use goodput_loadtest::scenario::Scenario;

const TTFT: Duration = Duration::from_millis(70);
const GAP: Duration = Duration::from_millis(5);
const TTFT_GRID: [f64; 10] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5];

#[derive(Default)]
struct Seen {
    ttfts: Vec<f64>,
}

struct Fake {
    seen: Mutex<Seen>,
    sink: PathBuf,
}

type Body = BoxBody<Bytes, Infallible>;

fn text(s: String) -> Response<Body> {
    Response::new(Full::new(Bytes::from(s)).boxed())
}

fn metrics(seen: &Seen) -> String {
    let mut out = String::from("# TYPE goodput_proxy_time_to_first_token_seconds histogram\n");
    for le in TTFT_GRID {
        let c = seen.ttfts.iter().filter(|t| **t <= le).count();
        out.push_str(&format!(
            "goodput_proxy_time_to_first_token_seconds_bucket{{model=\"tiny\",le=\"{le}\"}} {c}\n"
        ));
    }
    out.push_str(&format!(
        "goodput_proxy_time_to_first_token_seconds_bucket{{model=\"tiny\",le=\"+Inf\"}} {}\n",
        seen.ttfts.len()
    ));
    out
}

async fn handle(
    fake: Arc<Fake>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Infallible> {
    let t0 = Instant::now();
    match req.uri().path() {
        "/metrics" => return Ok(text(metrics(&fake.seen.lock().unwrap()))),
        "/stats" => {
            let mut v = fake.seen.lock().unwrap().ttfts.clone();
            let s = goodput_measure::summarize(&mut v).unwrap();
            return Ok(text(serde_json::json!({"ttft_seconds": s}).to_string()));
        }
        _ => {}
    }
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    // 0: role, 1..=3: tokens, then finish, usage-less [DONE].
    let step = move |k: usize| -> Option<(Duration, String)> {
        match k {
            0 => Some((Duration::ZERO, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n".into())),
            1..=3 => Some((if k == 1 { TTFT } else { GAP }, format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{k}\"}}}}]}}\n\n"))),
            4 => Some((Duration::ZERO, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n".into())),
            5 => Some((Duration::ZERO, "data: [DONE]\n\n".into())),
            _ => None,
        }
    };
    let body = stream::unfold((0usize, None::<f64>), move |(k, ttft)| {
        let (fake, id) = (fake.clone(), id.clone());
        async move {
            let (wait, s) = step(k)?;
            tokio::time::sleep(wait).await;
            let ttft = if k == 1 {
                Some(t0.elapsed().as_secs_f64())
            } else {
                ttft
            };
            if k == 5 {
                // The record is written before the last chunk goes out, so it exists by the
                // time the client has its whole response.
                let t = ttft.unwrap_or_default();
                fake.seen.lock().unwrap().ttfts.push(t);
                // A record as the proxy's JSONL sink writes it (the join reads that type).
                let line = serde_json::json!({"id": id, "model": "tiny", "upstream": null,
                    "stream": true, "status": 200, "outcome": "success", "finish_reason": "stop",
                    "start_unix_ms": 0, "ttft_s": t, "ttfc_s": t, "tpot_s": null,
                    "e2e_s": t0.elapsed().as_secs_f64(), "itl_count": 0, "itl_max_s": null,
                    "prompt_tokens": null, "completion_tokens": null, "tokens_exact": false,
                    "usage_injected": false, "usage_stripped": false,
                    "slo": {"ttft_ok": null, "tpot_ok": null, "e2e_ok": null, "good": true},
                    "instance": ""});
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&fake.sink)
                    .unwrap();
                // One write per line: `writeln!` on a File is two writes (the text, then the
                // newline), and two handlers appending at once interleaved them into one
                // unreadable line (the join then missed both requests).
                f.write_all(format!("{line}\n").as_bytes()).unwrap();
            }
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from(s))),
                (k + 1, ttft),
            ))
        }
    });
    Ok(Response::builder()
        .header("content-type", "text/event-stream")
        .body(StreamBody::new(body).boxed())
        .unwrap())
}

async fn fake_proxy(name: &str) -> (String, Arc<Fake>) {
    let sink = std::env::temp_dir().join(format!(
        "goodput-loadtest-{name}-{}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&sink);
    let fake = Arc::new(Fake {
        seen: Mutex::new(Seen::default()),
        sink,
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let f = fake.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let f = f.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(f.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), fake)
}

async fn run(target: &str, compare: CompareTargets) -> RunResult {
    let sc =
        Scenario::parse("[[phases]]\nname='p'\nrequests=20\narrivals={poisson={rate=80}}").unwrap();
    let cfg = RunConfig {
        target: target.into(),
        scenario: sc,
        scenario_name: "fake".into(),
        show_progress: false,
        metrics: None,
        compare,
        run_id: goodput_loadtest::request::run_id(),
    };
    tokio::time::timeout(Duration::from_secs(30), runner::run(cfg))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_proxy_join_by_request_id() {
    let (url, fake) = fake_proxy("join").await;
    let compare = CompareTargets {
        proxy_admin: Some(url.clone()),
        engine_metrics: vec![],
        proxy_records: Some(fake.sink.clone()),
        settle_s: Some(0.0),
    };
    let res = run(&url, compare).await;
    let c = res.summary.comparison.as_ref().unwrap();
    let j = &c.joins[0];
    assert_eq!(
        (
            j.client_requests,
            j.matched,
            j.outcomes_agree,
            j.outcomes_disagree
        ),
        (20, 20, 20, 0)
    );
    // The server sees its first token before the client does, by a loopback hop.
    let d = j.ttft_proxy_minus_client.as_ref().unwrap();
    assert!(
        d.p50 <= 0.0 && d.p50 > -0.005,
        "proxy - client TTFT p50 {}",
        d.p50
    );
    let e = j.e2e_proxy_minus_client.as_ref().unwrap();
    assert!(
        e.max <= 0.0,
        "the server's end precedes the client's: {}",
        e.max
    );

    let row = |source: &str| {
        c.rows
            .iter()
            .find(|r| r.metric == "ttft" && r.source == source)
            .unwrap_or_else(|| panic!("no {source} row: {:?}", c.rows))
    };
    let client = row("client exact");
    let exact = row("proxy exact");
    assert_eq!(exact.count, Some(20.0));
    assert!(
        exact.diff_p50.unwrap().abs() < 0.005,
        "{exact:?} vs {client:?}"
    );
    // Histogram estimate: all 20 in the (0.06, 0.08] bucket.
    let hist = row("proxy histogram");
    assert_eq!(hist.count, Some(20.0));
    assert!((0.06..=0.08).contains(&hist.p50.unwrap()), "{hist:?}");
    let _ = std::fs::remove_file(&fake.sink);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_records_the_proxy_exact_row_comes_from_stats() {
    let (url, fake) = fake_proxy("stats").await;
    let compare = CompareTargets {
        proxy_admin: Some(url.clone()),
        ..Default::default()
    };
    let res = run(&url, compare).await;
    let c = res.summary.comparison.as_ref().unwrap();
    assert!(c.joins.is_empty());
    let stats = c
        .rows
        .iter()
        .find(|r| r.metric == "ttft" && r.source == "proxy exact (/stats)")
        .expect("a /stats row");
    assert_eq!(stats.count, Some(20.0));
    assert!(stats.diff_p50.unwrap().abs() < 0.005, "{stats:?}");
    let text = goodput_loadtest::report::compare::render_text(c);
    assert!(text.contains("proxy exact (/stats)") && text.contains("proxy histogram"));
    let _ = std::fs::remove_file(&fake.sink);
}
