//! A body that holds a value until the body is dropped: how a limit permit, a replica's
//! in-flight count or an access-log line live exactly as long as the response stream.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// Passes every frame of `inner` through unchanged; drops `value` with the body.
    pub struct Hold<B, T> {
        #[pin]
        inner: B,
        value: T,
    }
}

impl<B, T> Hold<B, T> {
    pub fn new(inner: B, value: T) -> Self {
        Self { inner, value }
    }
}

impl<B: Body, T> Body for Hold<B, T> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
