//! `MeteredBody` with hand-made bodies: it returns the frames it got, timestamps them as they
//! are polled, and finishes exactly once (end, error, drop).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use goodput_measure::{Ending, Measurement, Outcome, StreamMeter};
use goodput_proxy::body::{MeteredBody, StripBody, StripReport};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, StreamBody};
use tokio::sync::mpsc;
use tokio::time::Instant;

type Finished = Arc<Mutex<Vec<Measurement>>>;

fn hook() -> (Finished, goodput_proxy::body::metered::OnFinish) {
    let got: Finished = Arc::default();
    let g = got.clone();
    (got, Box::new(move |m| g.lock().unwrap().push(m)))
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

fn meter(streaming: bool) -> StreamMeter {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, streaming);
    m.on_head(t0, 200);
    m
}

/// The proxy's composition when usage was injected: the strip body inside (it changes the
/// bytes), the metered body outside (it watches what the client gets), one report between.
fn stripped<B: Body<Data = Bytes>>(
    inner: B,
    meter: StreamMeter,
    on_finish: goodput_proxy::body::metered::OnFinish,
) -> MeteredBody<StripBody<B>> {
    let report = Arc::new(StripReport::default());
    MeteredBody::new(StripBody::new(inner, report.clone()), meter, on_finish)
        .with_strip_report(report)
}

type Item = Result<Frame<Bytes>, std::io::Error>;

/// A body fed through a channel, so the test decides when each frame exists.
struct ChannelBody(mpsc::UnboundedReceiver<Item>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
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

#[tokio::test]
async fn frames_pass_unchanged_and_the_request_finishes_once() {
    let body = fixture("stream-chat.txt");
    let frames = event_frames(&body);
    let inner = StreamBody::new(stream::iter(
        frames
            .clone()
            .into_iter()
            .map(|b| Ok::<_, Infallible>(Frame::data(b))),
    ));
    let (got, on_finish) = hook();
    let metered = MeteredBody::new(inner, meter(true), on_finish);
    let out = metered.collect().await.unwrap().to_bytes();
    assert_eq!(out, body);
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1, "exactly once");
    assert_eq!(got[0].outcome, Outcome::Success);
    assert_eq!(
        (got[0].output_events, got[0].completion_tokens),
        (16, Some(16))
    );
}

#[tokio::test]
async fn frames_are_timestamped_when_polled() {
    let (tx, inner) = channel_body();
    let (got, on_finish) = hook();
    let gaps = Arc::new(Mutex::new(Vec::new()));
    let g = gaps.clone();
    let mut body = MeteredBody::new(inner, meter(true), on_finish)
        .with_gap_observer(Box::new(move |d| g.lock().unwrap().push(d)));
    let chunk = |c: &str, f: &str| {
        Frame::data(Bytes::from(format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}},\"finish_reason\":{f}}}]}}\n\n"
        )))
    };
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
    let m = got.lock().unwrap().pop().unwrap();
    assert_eq!(m.outcome, Outcome::Success);
    let ttft = m.ttft.unwrap();
    assert!(
        ttft >= Duration::from_millis(60) && ttft <= e2e_bound,
        "{ttft:?}"
    );
    let gaps = gaps.lock().unwrap();
    assert_eq!(gaps.len(), 1);
    assert!(gaps[0] >= Duration::from_millis(40), "{:?}", gaps[0]);
    assert_eq!(m.itl_max, Some(gaps[0]));
}

#[tokio::test]
async fn dropping_mid_stream_is_a_client_abort() {
    let (tx, inner) = channel_body();
    let (got, on_finish) = hook();
    let mut body = MeteredBody::new(inner, meter(true), on_finish);
    tx.send(Ok(Frame::data(Bytes::from_static(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
    ))))
    .unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(
        got.lock().unwrap().is_empty(),
        "not finished while streaming"
    );
    drop(body);
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].outcome, Outcome::ClientAbort);
    assert!(got[0].ttft.is_some());
}

#[tokio::test]
async fn an_inner_error_is_passed_on_and_ends_the_request() {
    let (tx, inner) = channel_body();
    let (got, on_finish) = hook();
    let mut body = MeteredBody::new(inner, meter(true), on_finish);
    tx.send(Err(std::io::Error::other("reset"))).unwrap();
    assert!(body.frame().await.unwrap().is_err());
    drop(body);
    let got = got.lock().unwrap();
    assert_eq!(
        got.len(),
        1,
        "the drop after the error does not finish again"
    );
    assert_eq!(got[0].outcome, Outcome::Truncated);
}

#[tokio::test]
async fn an_error_can_be_mapped_to_a_timeout() {
    let (tx, inner) = channel_body();
    let (got, on_finish) = hook();
    let mut body =
        MeteredBody::new(inner, meter(true), on_finish).with_error_ending(|e: &std::io::Error| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                Ending::Timeout
            } else {
                Ending::BodyError
            }
        });
    tx.send(Err(std::io::ErrorKind::TimedOut.into())).unwrap();
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(got.lock().unwrap()[0].outcome, Outcome::Timeout);
}

#[tokio::test]
async fn an_empty_body_dropped_unpolled_completed() {
    let (got, on_finish) = hook();
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, false);
    m.on_head(t0, 502);
    let body = MeteredBody::new(Empty::<Bytes>::new(), m, on_finish);
    assert!(body.is_end_stream());
    drop(body);
    let got = got.lock().unwrap();
    assert_eq!((got.len(), got[0].outcome), (1, Outcome::UpstreamError));
}

#[tokio::test]
async fn usage_strip_gives_the_client_the_plain_bytes_and_the_meter_exact_tokens() {
    let usage = fixture("stream-chat-usage.txt");
    let plain = String::from_utf8(fixture("stream-chat.txt"))
        .unwrap()
        .replace("chatcmpl-a45afd70d01f6372", "chatcmpl-ba42e38baeaee861");
    let inner = StreamBody::new(stream::iter(
        event_frames(&usage)
            .into_iter()
            .map(|b| Ok::<_, Infallible>(Frame::data(b))),
    ));
    let (got, on_finish) = hook();
    let body = stripped(inner, meter(true), on_finish);
    let out = body.collect().await.unwrap().to_bytes();
    assert_eq!(out, plain.as_bytes());
    let m = got.lock().unwrap().pop().unwrap();
    assert_eq!(m.outcome, Outcome::Success);
    assert_eq!(
        (m.completion_tokens, m.prompt_tokens, m.tokens_exact),
        (Some(16), Some(32), true)
    );
}

#[tokio::test]
async fn non_streaming_json_body() {
    let body = fixture("nonstream-chat.txt");
    let (a, b) = body.split_at(300);
    let frames = vec![Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)];
    let inner = StreamBody::new(stream::iter(
        frames
            .into_iter()
            .map(|b| Ok::<_, Infallible>(Frame::data(b))),
    ));
    let (got, on_finish) = hook();
    let out = MeteredBody::new(inner, meter(false), on_finish)
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(out, body);
    let m = got.lock().unwrap().pop().unwrap();
    assert_eq!(
        (m.outcome, m.completion_tokens, m.ttft),
        (Outcome::Success, Some(8), None)
    );
}

#[test]
fn the_metered_body_can_be_boxed_send_and_sync() {
    fn boxable<B: Body<Data = Bytes> + Send + Sync + 'static>(_: &B) {}
    let (_got, on_finish) = hook();
    let body = stripped(
        http_body_util::Full::new(Bytes::new()),
        meter(false),
        on_finish,
    )
    .with_gap_observer(Box::new(|_| {}));
    boxable(&body);
    let _boxed = http_body_util::combinators::BoxBody::new(body);
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
            let inner = StreamBody::new(stream::iter(frames.into_iter().map(|b| Ok::<_, Infallible>(Frame::data(b)))));
            let (got, on_finish) = hook();
            let body = stripped(inner, meter(true), on_finish);
            let out = body.collect().now_or_never().unwrap().unwrap().to_bytes();
            prop_assert_eq!(&out[..], plain.as_bytes());
            let m = got.lock().unwrap().pop().unwrap();
            prop_assert_eq!(m.outcome, Outcome::Success);
            prop_assert_eq!((m.output_events, m.completion_tokens, m.tokens_exact), (16, Some(16), true));
        }
    }
}

#[tokio::test]
async fn trailers_after_held_bytes_keep_their_order() {
    // The stripper holds a finish chunk until it sees what follows; trailers that come then
    // must go out after the held bytes, never before them.
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
    let (got, on_finish) = hook();
    let mut b = stripped(StreamBody::new(stream::iter(items)), meter(true), on_finish);
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
    let m = got.lock().unwrap();
    assert_eq!(m.len(), 1);
    assert!(m[0].usage_injected && m[0].usage_stripped);
}
