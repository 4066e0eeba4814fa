//! `StripBody`: the upstream body of a request whose usage was injected, with the injected
//! usage chunk removed (the pure [`UsageStripper`] does the work, see `measure::usage`). It
//! changes the bytes, so it sits inside the metered body, which then sees exactly what the
//! client gets; what it removed is read off it by the metered body ([`StripBody::facts`]).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use goodput_measure::inspect::Usage;
use goodput_measure::usage::UsageStripper;

/// What a strip body did: the usage of the last chunk it removed (the client never sees that
/// chunk, the meter takes its usage from here) and whether it gave up stripping at its memory
/// bound (the rest of the stream, usage chunk included, passed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StripFacts {
    pub usage: Option<Usage>,
    pub gave_up: bool,
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
        facts: StripFacts,
        // An inner error waiting behind the bytes the stripper released at the error.
        error: Option<B::Error>,
        // Trailers waiting behind the bytes the stripper released when they came.
        trailers: Option<Frame<Bytes>>,
        done: bool,
    }
}

impl<B: Body<Data = Bytes>> StripBody<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            stripper: UsageStripper::new(),
            out: VecDeque::new(),
            facts: StripFacts::default(),
            error: None,
            trailers: None,
            done: false,
        }
    }
}

impl<B: Body> StripBody<B> {
    /// What it removed so far, and whether it gave up.
    pub fn facts(&self) -> StripFacts {
        self.facts
    }
}

/// Notes what the stripper learnt from the last push.
fn note(stripper: &mut UsageStripper, facts: &mut StripFacts) {
    if let Some(u) = stripper.take_removed_usage() {
        facts.usage = Some(u);
    }
    facts.gave_up |= stripper.gave_up();
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
                        note(this.stripper, this.facts);
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
        let mut strip = StripBody::new(frames(body));
        let mut out = Vec::new();
        while let Some(f) = strip.frame().await {
            out.extend_from_slice(&f.unwrap().into_data().unwrap());
        }
        let text = std::str::from_utf8(&out).unwrap();
        assert!(!text.contains(r#""choices":[]"#), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"));
        let want = Usage {
            prompt_tokens: Some(32),
            completion_tokens: Some(16),
            reasoning_tokens: None,
        };
        let facts = strip.facts();
        assert_eq!((facts.usage, facts.gave_up), (Some(want), false));
    }

    #[tokio::test]
    async fn a_stream_without_usage_passes_and_reports_none() {
        let body = capture(include_bytes!(
            "../../tests/fixtures/vllm-0.32/stream-chat.txt"
        ));
        let mut strip = StripBody::new(frames(body));
        let mut out = Vec::new();
        while let Some(f) = strip.frame().await {
            out.extend_from_slice(&f.unwrap().into_data().unwrap());
        }
        assert_eq!(&out[..], body);
        assert_eq!(strip.facts(), StripFacts::default());
    }
}
