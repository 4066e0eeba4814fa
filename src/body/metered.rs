//! `MeteredBody`: the response body the client polls, wrapped so that every data frame is
//! timestamped (`Instant::now()` inside `poll_frame`, i.e. when the client is served) and fed
//! to a [`StreamMeter`]. It only watches: the frames it returns are the frames it got, except
//! when usage stripping is on (see `measure::usage`). It finishes exactly once, on the end of
//! the stream, on an error, or on drop (the client went away), by calling the `on_finish` hook.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use goodput_measure::meter::{Measurement, StreamMeter};
use goodput_measure::outcome::Ending;
use goodput_measure::usage::UsageStripper;

/// Called once with the request's measurement (the proxy: metrics + record). `Sync` so that
/// the body stays `Sync` (e.g. for `http_body_util::combinators::BoxBody`).
pub type OnFinish = Box<dyn FnOnce(Measurement) + Send + Sync + 'static>;
/// Called for every ITL gap as it closes (the proxy: the ITL histogram).
pub type OnGap = Box<dyn FnMut(Duration) + Send + Sync + 'static>;

struct Active {
    meter: StreamMeter,
    on_finish: OnFinish,
}

pin_project! {
    /// See the module docs.
    pub struct MeteredBody<B: Body> {
        #[pin]
        inner: B,
        active: Option<Active>,
        on_gap: Option<OnGap>,
        strip: Option<UsageStripper>,
        // An inner error waiting behind the bytes the stripper released at the error.
        error: Option<B::Error>,
        // Trailers waiting behind the bytes the stripper released when they came.
        trailers: Option<Frame<Bytes>>,
        error_ending: fn(&B::Error) -> Ending,
        done: bool,
    }

    impl<B: Body> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(a) = this.active.take() {
                // A body that was already at its end and is dropped unpolled (hyper does that
                // for empty bodies) completed; anything else means the client went away.
                let ending = if this.inner.is_end_stream() {
                    Ending::Complete
                } else {
                    Ending::ClientGone
                };
                finish(a, ending, this.strip.as_ref());
            }
        }
    }
}

fn finish(mut a: Active, ending: Ending, strip: Option<&UsageStripper>) {
    let mut m = a.meter.finish(Instant::now(), ending);
    m.usage_injected = strip.is_some();
    m.usage_stripped = strip.is_some_and(|s| !s.gave_up());
    (a.on_finish)(m);
}

fn body_error<E>(_: &E) -> Ending {
    Ending::BodyError
}

impl<B: Body<Data = Bytes>> MeteredBody<B> {
    /// Wrap `inner`. `meter` already carries `t0` and the response head (`on_head`).
    pub fn new(inner: B, meter: StreamMeter, on_finish: OnFinish) -> Self {
        Self {
            inner,
            active: Some(Active { meter, on_finish }),
            on_gap: None,
            strip: None,
            error: None,
            trailers: None,
            error_ending: body_error::<B::Error>,
            done: false,
        }
    }

    /// Observe each ITL gap as it closes.
    pub fn with_gap_observer(mut self, on_gap: OnGap) -> Self {
        self.on_gap = Some(on_gap);
        self
    }

    /// Remove the injected usage chunk (the request had usage injected).
    pub fn with_usage_strip(mut self) -> Self {
        self.strip = Some(UsageStripper::new());
        self
    }

    /// How an inner error ends the request (default `BodyError`); a deadline wrapper inside
    /// this body can map its own timeout error to `Ending::Timeout`.
    pub fn with_error_ending(mut self, f: fn(&B::Error) -> Ending) -> Self {
        self.error_ending = f;
        self
    }
}

impl<B: Body<Data = Bytes>> Body for MeteredBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(e) = this.error.take() {
                return Poll::Ready(Some(Err(e)));
            }
            if let Some(t) = this.trailers.take() {
                return Poll::Ready(Some(Ok(t)));
            }
            if *this.done {
                return Poll::Ready(None);
            }
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let frame = match frame.into_data() {
                        Ok(data) => data,
                        Err(other) => {
                            // Trailers end the body: what the stripper holds goes out first.
                            let held = this.strip.as_mut().map(|s| s.finish()).unwrap_or_default();
                            if held.is_empty() {
                                return Poll::Ready(Some(Ok(other)));
                            }
                            *this.trailers = Some(other);
                            return Poll::Ready(Some(Ok(Frame::data(held))));
                        }
                    };
                    if let Some(a) = this.active.as_mut() {
                        let t = Instant::now();
                        match this.on_gap.as_mut() {
                            Some(g) => a.meter.on_frame(t, &frame, g),
                            None => a.meter.on_frame(t, &frame, |_| {}),
                        }
                    }
                    let out = match this.strip.as_mut() {
                        Some(s) => s.push(frame),
                        None => frame,
                    };
                    if out.is_empty() && this.strip.is_some() {
                        continue; // all held back or stripped: wait for more
                    }
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                Some(Err(e)) => {
                    let ending = (this.error_ending)(&e);
                    *this.done = true;
                    if let Some(a) = this.active.take() {
                        finish(a, ending, this.strip.as_ref());
                    }
                    let held = this.strip.as_mut().map(|s| s.finish()).unwrap_or_default();
                    if held.is_empty() {
                        return Poll::Ready(Some(Err(e)));
                    }
                    *this.error = Some(e);
                    return Poll::Ready(Some(Ok(Frame::data(held))));
                }
                None => {
                    *this.done = true;
                    let held = this.strip.as_mut().map(|s| s.finish()).unwrap_or_default();
                    if let Some(a) = this.active.take() {
                        finish(a, Ending::Complete, this.strip.as_ref());
                    }
                    if held.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(held))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.error.is_none()
            && self.trailers.is_none()
            && (self.done || (self.strip.is_none() && self.inner.is_end_stream()))
    }

    fn size_hint(&self) -> SizeHint {
        if self.strip.is_some() {
            SizeHint::default() // stripping changes the length
        } else {
            self.inner.size_hint()
        }
    }
}
