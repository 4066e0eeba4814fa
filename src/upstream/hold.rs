//! Holding a stream's response head until its first event: an engine at its admission cap may
//! answer 200 and then reject inside the stream (vLLM 0.32: one event
//! `{"error": {..., "code": 503}}` then `[DONE]`, when requests race past its first check).
//! Nothing was generated, so another replica may serve the request, but only while the client
//! has seen nothing: the forwarder reads the body up to its first data event, and either
//! retries elsewhere or hands the client the held frames followed by the rest of the body,
//! unchanged.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use memchr::memmem;

/// Most bytes held while waiting for the first event; past it the head goes out as is.
pub const MAX_HELD: usize = 64 * 1024;

/// The frames read before the first data event was complete (or the body ended).
#[derive(Debug, Default)]
pub struct Held {
    pub frames: VecDeque<Frame<Bytes>>,
    /// Data bytes held, in order.
    bytes: Vec<u8>,
    pub ended: bool,
}

impl Held {
    /// The first data event's bytes (up to and without its blank line), once complete.
    pub fn first_event(&self) -> Option<&[u8]> {
        first_data_event(&self.bytes)
    }

    /// The first event is an engine's admission rejection (a 503 error before any output).
    pub fn is_rejection(&self) -> bool {
        self.first_event().is_some_and(is_rejection_event)
    }
}

/// Reads `body` until its first data event is complete, it ends, it fails, or [`MAX_HELD`]
/// bytes are held.
pub async fn first_event<B>(body: &mut B) -> Result<Held, B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut held = Held::default();
    loop {
        match body.frame().await {
            None => {
                held.ended = true;
                return Ok(held);
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    held.bytes.extend_from_slice(d);
                }
                held.frames.push_back(frame);
                if held.first_event().is_some() || held.bytes.len() >= MAX_HELD {
                    return Ok(held);
                }
            }
        }
    }
}

/// The first complete event of an SSE text that has a `data:` line (comment-only blocks such
/// as `: keep-alive` are skipped).
fn first_data_event(text: &[u8]) -> Option<&[u8]> {
    let mut rest = text;
    loop {
        let (end, sep) = [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"]
            .iter()
            .filter_map(|sep| memmem::find(rest, sep).map(|at| (at, sep.len())))
            .min()?;
        let event = &rest[..end];
        if event
            .split(|&c| c == b'\n' || c == b'\r')
            .any(|line| line.starts_with(b"data:"))
        {
            return Some(event);
        }
        rest = &rest[end + sep..];
    }
}

/// `data: {"error": {... "code": 503 ...}}`, with or without spaces after the colons.
pub fn is_rejection_event(event: &[u8]) -> bool {
    let data = event
        .split(|&c| c == b'\n')
        .find_map(|l| l.strip_prefix(b"data:"))
        .unwrap_or_default();
    let data = data.trim_ascii_start();
    data.starts_with(b"{\"error\"")
        && (memmem::find(data, b"\"code\": 503").is_some()
            || memmem::find(data, b"\"code\":503").is_some())
}

/// The held frames, then the rest of the body.
pub struct Prefixed<B> {
    held: VecDeque<Frame<Bytes>>,
    inner: Option<B>,
}

impl<B> Prefixed<B> {
    /// `ended`: the body already ended while held (`inner` is not polled again).
    pub fn new(held: Held, inner: B) -> Self {
        Prefixed {
            inner: (!held.ended).then_some(inner),
            held: held.frames,
        }
    }
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(f) = self.held.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        match self.inner.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(b) if self.held.is_empty() => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    const INBAND: &str = "data: {\"error\": {\"message\": \"The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.\", \"type\": \"Service Unavailable\", \"param\": null, \"code\": 503}}\n\ndata: [DONE]\n\n";

    fn body(chunks: &[&str]) -> impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c.as_bytes()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[test]
    fn rejection_events_are_told_from_others() {
        let cases: &[(&str, bool)] = &[
            (INBAND, true),
            ("data: {\"error\":{\"message\":\"x\",\"code\":503}}\n\n", true),
            (
                "data: {\"error\": {\"message\": \"boom\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\n",
                false,
            ),
            ("data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"503\"}}]}\n\n", false),
            (": keep-alive\n\ndata: {\"error\": {\"code\": 503}}\n\n", true),
            ("data: {\"error\": {\"code\": 503}}", false),
        ];
        for &(text, want) in cases {
            let got = first_data_event(text.as_bytes()).is_some_and(is_rejection_event);
            assert_eq!(got, want, "{text:?}");
        }
    }

    #[tokio::test]
    async fn the_first_event_is_held_across_any_split_and_replayed_unchanged() {
        let stream =
            "data: {\"id\":\"a\",\"choices\":[]}\n\ndata: {\"id\":\"b\"}\n\ndata: [DONE]\n\n";
        for cut in 1..stream.len() - 1 {
            let (a, b) = stream.split_at(cut);
            let mut inner = body(&[a, b]);
            let held = first_event(&mut inner).await.unwrap();
            assert!(!held.is_rejection());
            let got = Prefixed::new(held, inner)
                .collect()
                .await
                .unwrap()
                .to_bytes();
            assert_eq!(got, stream.as_bytes(), "cut {cut}");
        }
        let mut inner = body(&[&INBAND[..40], &INBAND[40..]]);
        let held = first_event(&mut inner).await.unwrap();
        assert!(held.is_rejection());
        // A body that ends before any event is handed over as it is.
        let mut inner = body(&["data: {\"x\""]);
        let held = first_event(&mut inner).await.unwrap();
        assert!(held.ended && held.first_event().is_none());
        let got = Prefixed::new(held, inner)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(got, "data: {\"x\"".as_bytes());
    }
}
