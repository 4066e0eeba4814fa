//! `StripBody`: the upstream body of a request whose usage was injected, with the injected
//! usage chunk removed (the pure [`UsageStripper`] does the work, see `measure::usage`). It
//! changes the bytes, so it sits inside the metered body, which then sees exactly what the
//! client gets; the usage it removed reaches the meter through a [`StripReport`].

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use goodput_measure::inspect::Usage;
use goodput_measure::usage::UsageStripper;

/// What a strip body tells the meter: the usage it removed (the client never sees that chunk)
/// and whether it gave up stripping at its memory bound. Shared by the strip body (writer) and
/// the metered body outside it (reader, when the request finishes).
#[derive(Debug, Default)]
pub struct StripReport {
    usage: Mutex<Option<Usage>>,
    gave_up: AtomicBool,
}

impl StripReport {
    /// The usage of the last chunk removed, if any.
    pub fn usage(&self) -> Option<Usage> {
        *self.usage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The stripper stopped stripping: the rest of the stream, usage chunk included, passed.
    pub fn gave_up(&self) -> bool {
        self.gave_up.load(Ordering::Acquire)
    }

    fn removed(&self, usage: Usage) {
        *self.usage.lock().unwrap_or_else(PoisonError::into_inner) = Some(usage);
    }
}

pin_project! {
    /// See the module docs.
    pub struct StripBody<B: Body> {
        #[pin]
        inner: B,
        stripper: UsageStripper,
        // What the stripper let out and the client has not polled yet, one frame each (slices
        // of the upstream frame: the stripper never copies what passes unchanged).
        out: VecDeque<Bytes>,
        report: std::sync::Arc<StripReport>,
        // An inner error waiting behind the bytes the stripper released at the error.
        error: Option<B::Error>,
        // Trailers waiting behind the bytes the stripper released when they came.
        trailers: Option<Frame<Bytes>>,
        done: bool,
    }
}

impl<B: Body<Data = Bytes>> StripBody<B> {
    pub fn new(inner: B, report: std::sync::Arc<StripReport>) -> Self {
        Self {
            inner,
            stripper: UsageStripper::new(),
            out: VecDeque::new(),
            report,
            error: None,
            trailers: None,
            done: false,
        }
    }
}

/// Reports what the stripper learnt from the last push.
fn report(stripper: &mut UsageStripper, report: &StripReport) {
    if let Some(u) = stripper.take_removed_usage() {
        report.removed(u);
    }
    if stripper.gave_up() {
        report.gave_up.store(true, Ordering::Release);
    }
}

impl<B: Body<Data = Bytes>> Body for StripBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(piece) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            if let Some(e) = this.error.take() {
                return Poll::Ready(Some(Err(e)));
            }
            if let Some(t) = this.trailers.take() {
                return Poll::Ready(Some(Ok(t)));
            }
            if *this.done {
                return Poll::Ready(None);
            }
            let held = match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.stripper.push_into(data, this.out);
                        report(this.stripper, this.report);
                        continue; // what it let out goes first; none: wait for more
                    }
                    // Trailers end the body: what the stripper holds goes out first.
                    Err(trailers) => {
                        *this.trailers = Some(trailers);
                        this.stripper.finish()
                    }
                },
                Some(Err(e)) => {
                    *this.error = Some(e);
                    this.stripper.finish()
                }
                None => this.stripper.finish(),
            };
            *this.done = true;
            if !held.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(held))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Held bytes are only known to be none once the inner body has said its last.
        self.done && self.out.is_empty() && self.error.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default() // stripping changes the length
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    /// A vLLM 0.32 capture's response body (after the HTTP head).
    fn capture(raw: &'static [u8]) -> &'static [u8] {
        let at = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a capture");
        &raw[at + 4..]
    }

    fn frames(body: &[u8]) -> impl Body<Data = Bytes, Error = Infallible> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = body
            .split_inclusive(|b| *b == b'\n')
            .map(|l| Ok(Frame::data(Bytes::copy_from_slice(l))))
            .collect();
        StreamBody::new(stream::iter(frames))
    }

    #[tokio::test]
    async fn strips_the_usage_chunk_and_reports_its_usage() {
        let body = capture(include_bytes!(
            "../../tests/fixtures/vllm-0.32/stream-chat-usage.txt"
        ));
        let report = Arc::new(StripReport::default());
        let out = StripBody::new(frames(body), report.clone())
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(!text.contains(r#""choices":[]"#), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"));
        let want = Usage {
            prompt_tokens: Some(32),
            completion_tokens: Some(16),
            reasoning_tokens: None,
        };
        assert_eq!((report.usage(), report.gave_up()), (Some(want), false));
    }

    #[tokio::test]
    async fn a_stream_without_usage_passes_and_reports_none() {
        let body = capture(include_bytes!(
            "../../tests/fixtures/vllm-0.32/stream-chat.txt"
        ));
        let report = Arc::new(StripReport::default());
        let out = StripBody::new(frames(body), report.clone())
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&out[..], body);
        assert_eq!(report.usage(), None);
    }
}
