//! The recorder's response body with hand-made upstream bodies, through the shipped path
//! (`Recorder::open`, then `Recording::respond`): it returns the frames it got, timestamps
//! them as they are polled, strips injected usage, and finishes the record exactly once (end,
//! error, drop).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use goodput_measure::record::Entry;
use goodput_measure::slo::SloTable;
use goodput_measure::{Measurement, Outcome};
use goodput_proxy::body::{BoxError, ProxyBody};
use goodput_proxy::context::{RequestContext, RequestFacts};
use goodput_proxy::metrics::{Metrics, ModelLabels};
use goodput_proxy::recorder::Recorder;
use goodput_proxy::sink::Sinks;
use goodput_proxy::upstream::deadline::DeadlineError;
use goodput_proxy::upstream::forward::Offered;
use http::Response;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, StreamBody};
use tokio::sync::mpsc;
use tokio::time::Instant;

fn recorder() -> Arc<Recorder> {
    let metrics = Metrics::register(&prometheus::Registry::new(), ModelLabels::default()).unwrap();
    Arc::new(Recorder::new(
        metrics,
        SloTable::default(),
        64,
        Sinks::default(),
        false,
    ))
}

/// The body the client gets for one generation request answered with `status` and `inner`;
/// `injected`: usage injection marked the response (the body strips the usage chunk).
fn respond<B>(rec: &Arc<Recorder>, stream: bool, status: u16, inner: B, injected: bool) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let ctx = Arc::new(RequestContext::new(Arc::from("req"), Instant::now(), None));
    ctx.set_facts(RequestFacts {
        model: Some("tiny".into()),
        stream,
        n: 1,
        tools: None,
        usage_injection: None,
    });
    let recording = rec.open(ctx, true, false);
    let mut resp = Response::new(inner.map_err(Into::into).boxed_unsync());
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
    if injected {
        resp.extensions_mut().insert(Offered::Injected);
    }
    recording.respond(resp).into_body()
}

/// The records finished so far, with their kept ITL gaps.
fn entries(rec: &Recorder) -> Vec<Entry> {
    rec.ring()
        .snapshot(Instant::now(), Duration::from_secs(3600))
}

fn finished(rec: &Recorder) -> Vec<Measurement> {
    entries(rec)
        .iter()
        .map(|e| e.record.measured.clone())
        .collect()
}

fn fixture(name: &str) -> Vec<u8> {
    let raw = std::fs::read(format!(
        "{}/tests/fixtures/vllm-0.32/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    raw[at + 4..].to_vec()
}

/// One frame per SSE event, as vLLM sends them.
fn event_frames(body: &[u8]) -> Vec<Bytes> {
    let text = std::str::from_utf8(body).unwrap();
    text.split_inclusive("\n\n")
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}

fn frames_body(frames: Vec<Bytes>) -> impl Body<Data = Bytes, Error = Infallible> + Send {
    StreamBody::new(stream::iter(
        frames
            .into_iter()
            .map(|b| Ok::<_, Infallible>(Frame::data(b))),
    ))
}

type Item = Result<Frame<Bytes>, BoxError>;

/// A body fed through a channel, so the test decides when each frame exists.
struct ChannelBody(mpsc::UnboundedReceiver<Item>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Item>> {
        self.0.poll_recv(cx)
    }
}

fn channel_body() -> (mpsc::UnboundedSender<Item>, ChannelBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, ChannelBody(rx))
}

fn chunk(c: &str, f: &str) -> Frame<Bytes> {
    Frame::data(Bytes::from(format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}},\"finish_reason\":{f}}}]}}\n\n"
    )))
}

#[tokio::test]
async fn frames_pass_unchanged_and_the_request_finishes_once() {
    let rec = recorder();
    let body = fixture("stream-chat.txt");
    let out = respond(&rec, true, 200, frames_body(event_frames(&body)), false)
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(out, body);
    let got = finished(&rec);
    assert_eq!(got.len(), 1, "exactly once");
    assert_eq!(got[0].outcome, Outcome::Success);
    assert_eq!(
        (got[0].output_events, got[0].completion_tokens),
        (16, Some(16))
    );
}

#[tokio::test]
async fn frames_are_timestamped_when_polled() {
    let rec = recorder();
    let (tx, inner) = channel_body();
    let mut body = respond(&rec, true, 200, inner, false);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(60)).await;
    tx.send(Ok(chunk("a", "null"))).unwrap();
    body.frame().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    tx.send(Ok(chunk("b", "\"stop\""))).unwrap();
    tx.send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))))
        .unwrap();
    drop(tx);
    while body.frame().await.is_some() {}
    let e2e_bound = started.elapsed();
    let e = entries(&rec).pop().unwrap();
    let m = &e.record.measured;
    assert_eq!(m.outcome, Outcome::Success);
    let ttft = m.ttft.unwrap();
    assert!(
        ttft >= Duration::from_millis(60) && ttft <= e2e_bound,
        "{ttft:?}"
    );
    let gaps = e.gaps.expect("the gap is kept beside the record");
    assert_eq!(gaps.len(), 1);
    assert!(gaps[0] >= 0.04, "{:?}", gaps[0]);
    assert_eq!(m.itl_max.map(|d| d.as_secs_f32()), Some(gaps[0]));
}

#[tokio::test]
async fn dropping_mid_stream_is_a_client_abort() {
    let rec = recorder();
    let (tx, inner) = channel_body();
    let mut body = respond(&rec, true, 200, inner, false);
    tx.send(Ok(chunk("a", "null"))).unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(finished(&rec).is_empty(), "not finished while streaming");
    drop(body);
    let got = finished(&rec);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].outcome, Outcome::ClientAbort);
    assert!(got[0].ttft.is_some());
}

#[tokio::test]
async fn an_inner_error_is_passed_on_and_ends_the_request() {
    let rec = recorder();
    let (tx, inner) = channel_body();
    let mut body = respond(&rec, true, 200, inner, false);
    tx.send(Err(std::io::Error::other("reset").into())).unwrap();
    assert!(body.frame().await.unwrap().is_err());
    drop(body);
    let got = finished(&rec);
    assert_eq!(
        got.len(),
        1,
        "the drop after the error does not finish again"
    );
    assert_eq!(got[0].outcome, Outcome::Truncated);
}

#[tokio::test]
async fn a_stream_deadline_error_is_a_timeout() {
    let rec = recorder();
    let (tx, inner) = channel_body();
    let mut body = respond(&rec, true, 200, inner, false);
    tx.send(Err(DeadlineError::Idle(Duration::from_secs(1)).into()))
        .unwrap();
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(finished(&rec)[0].outcome, Outcome::Timeout);
}

#[tokio::test]
async fn an_empty_body_dropped_unpolled_completed() {
    let rec = recorder();
    let body = respond(&rec, false, 502, Empty::<Bytes>::new(), false);
    assert!(body.is_end_stream());
    drop(body);
    let got = finished(&rec);
    assert_eq!((got.len(), got[0].outcome), (1, Outcome::UpstreamError));
}

#[tokio::test]
async fn usage_strip_gives_the_client_the_plain_bytes_and_the_meter_exact_tokens() {
    let rec = recorder();
    let usage = fixture("stream-chat-usage.txt");
    let plain = String::from_utf8(fixture("stream-chat.txt"))
        .unwrap()
        .replace("chatcmpl-a45afd70d01f6372", "chatcmpl-ba42e38baeaee861");
    let body = respond(&rec, true, 200, frames_body(event_frames(&usage)), true);
    let out = body.collect().await.unwrap().to_bytes();
    assert_eq!(out, plain.as_bytes());
    let m = finished(&rec).pop().unwrap();
    assert_eq!(m.outcome, Outcome::Success);
    assert_eq!(
        (m.completion_tokens, m.prompt_tokens, m.tokens_exact),
        (Some(16), Some(32), true)
    );
}

#[tokio::test]
async fn the_record_says_whether_usage_was_injected_and_stripped() {
    for injected in [false, true] {
        let rec = recorder();
        let usage = fixture("stream-chat-usage.txt");
        let body = respond(&rec, true, 200, frames_body(event_frames(&usage)), injected);
        let out = body.collect().await.unwrap().to_bytes();
        assert_eq!(
            out.len() < usage.len(),
            injected,
            "stripped only when injected"
        );
        let m = finished(&rec).pop().unwrap();
        assert_eq!((m.usage_injected, m.usage_stripped), (injected, injected));
        assert_eq!(m.completion_tokens, Some(16), "usage seen either way");
    }
}

#[tokio::test]
async fn non_streaming_json_body() {
    let rec = recorder();
    let body = fixture("nonstream-chat.txt");
    let (a, b) = body.split_at(300);
    let frames = vec![Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)];
    let out = respond(&rec, false, 200, frames_body(frames), false)
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(out, body);
    let m = finished(&rec).pop().unwrap();
    assert_eq!(
        (m.outcome, m.completion_tokens, m.ttft),
        (Outcome::Success, Some(8), None)
    );
}

mod split {
    use super::*;
    use futures_util::FutureExt;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// However the upstream frames the usage stream, the client gets the plain bytes and
        /// the meter the same measurement.
        #[test]
        fn metered_and_stripped_alike_for_any_framing(mut cuts in proptest::collection::vec(0usize..5000, 0..24)) {
            let usage = fixture("stream-chat-usage.txt");
            let plain = String::from_utf8(fixture("stream-chat.txt"))
                .unwrap()
                .replace("chatcmpl-a45afd70d01f6372", "chatcmpl-ba42e38baeaee861");
            cuts.iter_mut().for_each(|c| *c %= usage.len() + 1);
            cuts.sort_unstable();
            let mut frames = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([usage.len()]) {
                frames.push(Bytes::copy_from_slice(&usage[at..c]));
                at = c;
            }
            let rec = recorder();
            let body = respond(&rec, true, 200, frames_body(frames), true);
            let out = body.collect().now_or_never().unwrap().unwrap().to_bytes();
            prop_assert_eq!(&out[..], plain.as_bytes());
            let m = finished(&rec).pop().unwrap();
            prop_assert_eq!(m.outcome, Outcome::Success);
            prop_assert_eq!((m.output_events, m.completion_tokens, m.tokens_exact), (16, Some(16), true));
        }
    }
}

#[tokio::test]
async fn trailers_after_held_bytes_keep_their_order() {
    // The stripper holds a finish chunk until it sees what follows; trailers that come then
    // must go out after the held bytes, never before them.
    let rec = recorder();
    let body = fixture("stream-chat-usage.txt");
    let frames = event_frames(&body);
    let finish_at = frames
        .iter()
        .position(|f| {
            let s = std::str::from_utf8(f).unwrap();
            s.contains("\"finish_reason\":\"") && !s.contains("\"choices\":[]")
        })
        .expect("a finish chunk");
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-end", "1".parse().unwrap());
    let mut items: Vec<Result<Frame<Bytes>, Infallible>> = frames[..=finish_at]
        .iter()
        .cloned()
        .map(|b| Ok(Frame::data(b)))
        .collect();
    items.push(Ok(Frame::trailers(trailers)));
    let mut b = respond(&rec, true, 200, StreamBody::new(stream::iter(items)), true);
    let mut data = Vec::new();
    let mut saw_trailers = false;
    while let Some(f) = b.frame().await {
        let f = f.unwrap();
        if f.is_trailers() {
            saw_trailers = true;
            continue;
        }
        assert!(!saw_trailers, "data after trailers");
        data.extend_from_slice(&f.into_data().unwrap());
    }
    assert!(saw_trailers);
    let want: Vec<u8> = frames[..=finish_at].concat();
    assert_eq!(
        data, want,
        "the held finish chunk went out before the trailers"
    );
    let m = finished(&rec);
    assert_eq!(m.len(), 1);
    assert!(m[0].usage_injected && m[0].usage_stripped);
}
