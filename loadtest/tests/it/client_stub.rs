//! The client against a hand-made SSE server with exact, known timings: a first token after
//! `TTFT`, then a token every `GAP`; `x-test-truncate` closes the body without `[DONE]`.
//! Independent of the simulator, so a client regression shows here first.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use goodput_loadtest::runner::{self, CompareTargets, RunConfig};
use goodput_loadtest::scenario::Scenario;

const TTFT: Duration = Duration::from_millis(60);
const GAP: Duration = Duration::from_millis(10);
const TOKENS: usize = 5;

/// Streams the server had to drop before their end (the client hung up).
static DROPPED_EARLY: AtomicUsize = AtomicUsize::new(0);

struct EndGuard {
    done: bool,
}

impl EndGuard {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if !self.done {
            DROPPED_EARLY.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn chunk(s: String) -> Result<Frame<Bytes>, Infallible> {
    Ok(Frame::data(Bytes::from(s)))
}

async fn serve_one(
    req: Request<hyper::body::Incoming>,
) -> Result<Response<http_body_util::combinators::BoxBody<Bytes, Infallible>>, Infallible> {
    let truncate = req.headers().contains_key("x-test-truncate");
    let events: Vec<(Duration, String)> = {
        let mut v = vec![(
            Duration::ZERO,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"
                .to_string(),
        )];
        for i in 0..TOKENS {
            let wait = if i == 0 { TTFT } else { GAP };
            v.push((wait, format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n")));
        }
        if !truncate {
            v.push((
                Duration::ZERO,
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
                    .into(),
            ));
            v.push((
                Duration::ZERO,
                format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{TOKENS},\"total_tokens\":{}}}}}\n\n", TOKENS + 3),
            ));
            v.push((Duration::ZERO, "data: [DONE]\n\n".into()));
        }
        v
    };
    // The guard rides in the stream's state: dropped with the body, it tells whether the
    // server saw the whole stream out or the client went away first.
    let guard = EndGuard { done: false };
    let body = stream::unfold((events.into_iter(), guard), |(mut it, g)| async move {
        let Some((wait, s)) = it.next() else {
            g.finish();
            return None;
        };
        tokio::time::sleep(wait).await;
        Some((chunk(s), (it, g)))
    });
    Ok(Response::builder()
        .header("content-type", "text/event-stream")
        .body(StreamBody::new(body).boxed())
        .unwrap())
}

async fn stub() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), service_fn(serve_one))
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_measures_known_timings() {
    let target = stub().await;
    let sc = Scenario::parse(
        r#"
        [mix]
        max_tokens = { fixed = 5 }
        [[mix.headers]]
        name = "x-test-truncate"
        value = "1"
        share = 0.3
        [[phases]]
        name = "p"
        requests = 20
        arrivals = { constant = { rate = 50 } }
    "#,
    )
    .unwrap();
    let res = tokio::time::timeout(
        Duration::from_secs(30),
        runner::run(RunConfig {
            target,
            scenario: sc,
            scenario_name: "stub".into(),
            show_progress: false,
            metrics: None,
            compare: CompareTargets::default(),
            run_id: "stub".into(),
        }),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(res.records.len(), 20);
    let truncated = res.records.iter().filter(|r| r.tag.is_some()).count() as u64;
    assert!(truncated > 0);
    let o = &res.summary.overall.outcomes;
    assert_eq!(o.get("truncated").copied().unwrap_or(0), truncated, "{o:?}");
    assert_eq!(
        o.get("success").copied().unwrap_or(0),
        20 - truncated,
        "{o:?}"
    );
    for r in &res.records {
        let ttft = r.ttft_seconds.unwrap();
        assert!(
            ttft >= TTFT.as_secs_f64() && ttft < TTFT.as_secs_f64() + 0.04,
            "ttft {ttft}"
        );
        assert!(r.ttfc_seconds.unwrap() < ttft, "the role chunk comes first");
        assert_eq!(r.itl_count, TOKENS as u64 - 1);
        if r.outcome == "success" {
            assert_eq!(
                (r.completion_tokens, r.tokens_exact),
                (Some(TOKENS as u64), true)
            );
            assert_eq!(r.finish_reason.as_deref(), Some("length"));
            let tpot = r.tpot_seconds.unwrap();
            assert!(
                tpot >= GAP.as_secs_f64() * 0.9 && tpot < GAP.as_secs_f64() + 0.02,
                "tpot {tpot}"
            );
            assert!(r.good);
        }
    }
    let itl = res.summary.overall.itl_seconds.unwrap();
    assert_eq!(itl.count, 20 * (TOKENS as u64 - 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_phase_and_counts() {
    use goodput_loadtest::metrics::{serve, LoadMetrics};
    use std::sync::Arc;
    let target = stub().await;
    let sc = Scenario::parse("[[phases]]\nname='one'\nrequests=4\narrivals={constant={rate=100}}\n[[phases]]\nname='two'\nrequests=2\narrivals={concurrency={n=2}}").unwrap();
    let m = Arc::new(LoadMetrics::new(&["one".into(), "two".into()]).unwrap());
    let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), m.clone())
        .await
        .unwrap();
    let res = runner::run(RunConfig {
        target,
        scenario: sc,
        scenario_name: "stub".into(),
        show_progress: false,
        metrics: Some(m),
        compare: CompareTargets::default(),
        run_id: "m".into(),
    })
    .await
    .unwrap();
    assert_eq!(res.records.len(), 6);
    let c = goodput_loadtest::client::http_client(1);
    let text = goodput_loadtest::client::get_text(
        &c,
        &format!("http://{addr}/metrics"),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert!(
        crate::support::has_line(
            &text,
            "goodput_loadtest_requests_total{outcome=\"success\",phase=\"one\"} 4"
        ),
        "{text}"
    );
    assert!(
        crate::support::has_line(
            &text,
            "goodput_loadtest_requests_total{outcome=\"success\",phase=\"two\"} 2"
        ),
        "{text}"
    );
    // After the run no phase is marked running.
    assert!(
        crate::support::has_line(&text, "goodput_loadtest_phase{phase=\"two\"} 0"),
        "{text}"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_drop_the_stream() {
    let target = stub().await;
    // Half the streams hang up after 3 SSE events (role, t0, t1): mid-stream, 3 tokens early.
    let sc = Scenario::parse(
        r#"
        seed = 3
        [mix]
        hangup_share = 0.5
        hangup_after_events = { fixed = 3 }
        [[phases]]
        name = "p"
        requests = 24
        arrivals = { constant = { rate = 40 } }
    "#,
    )
    .unwrap();
    let before = DROPPED_EARLY.load(Ordering::SeqCst);
    let res = tokio::time::timeout(
        Duration::from_secs(30),
        runner::run(RunConfig {
            target,
            scenario: sc,
            scenario_name: "stub".into(),
            show_progress: false,
            metrics: None,
            compare: CompareTargets::default(),
            run_id: "hang".into(),
        }),
    )
    .await
    .unwrap()
    .unwrap();
    let planned: Vec<_> = res.records.iter().filter(|r| r.hangup.is_some()).collect();
    assert!(
        !planned.is_empty() && planned.len() < 24,
        "{}",
        planned.len()
    );
    for r in &res.records {
        if r.hangup == Some(3) {
            assert!(r.hung_up);
            assert_eq!(r.outcome, "client_abort", "{r:?}");
            // Two tokens arrived (t0, t1): TTFT measured, one gap, no usage.
            assert!(r.ttft_seconds.is_some());
            assert_eq!((r.itl_count, r.tokens_exact), (1, false));
            assert!(r.e2e_seconds < TTFT.as_secs_f64() + 3.0 * GAP.as_secs_f64() + 0.04);
        } else {
            assert!(!r.hung_up);
            assert_eq!(r.outcome, "success", "{r:?}");
        }
    }
    let by = &res.summary.overall.outcomes_by_option;
    assert_eq!(by["hung_up=true"]["client_abort"], planned.len() as u64);
    // The server saw every hang-up as a stream dropped before its end. Its body is dropped when
    // the connection closes, which can trail the client's return a little.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while DROPPED_EARLY.load(Ordering::SeqCst) - before < planned.len()
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(DROPPED_EARLY.load(Ordering::SeqCst) - before, planned.len());
}
