//! `MeteredBody`: the response body the client polls, wrapped so that every data frame is
//! timestamped (`Instant::now()` inside `poll_frame`, i.e. when the client is served) and fed
//! to a [`StreamMeter`]. It only watches: the frame it returns is the frame it got, and
//! `is_end_stream` / `size_hint` are the inner body's. It finishes exactly once, on the end of
//! the stream, on an error, or on drop (the client went away), by calling the `on_finish` hook.
//! When usage was injected, the strip body inside it removed the usage chunk before this body
//! saw the stream; its [`StripReport`] hands the meter that usage when the request finishes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use sync_wrapper::SyncWrapper;
use tokio::time::Instant;

use super::strip::StripReport;
use goodput_measure::meter::{Measurement, StreamMeter};
use goodput_measure::outcome::Ending;

/// Called once with the request's measurement (the proxy: metrics + record). `Sync` so that
/// the body stays `Sync` (e.g. for `http_body_util::combinators::BoxBody`).
pub type OnFinish = Box<dyn FnOnce(Measurement) + Send + Sync + 'static>;
/// Called for every ITL gap as it closes (the proxy: the ITL histogram, buffered per request).
/// Dropped right before `on_finish` runs, so a buffering observer flushes before the record.
/// Needs no `Sync`: the body holds it in a `SyncWrapper` (only ever called through `&mut`), so
/// an observer owns its buffer and takes no lock per gap.
pub type OnGap = Box<dyn FnMut(Duration) + Send + 'static>;

struct Active {
    meter: StreamMeter,
    on_gap: Option<SyncWrapper<OnGap>>,
    on_finish: OnFinish,
}

pin_project! {
    /// See the module docs.
    pub struct MeteredBody<B: Body> {
        #[pin]
        inner: B,
        active: Option<Active>,
        report: Option<Arc<StripReport>>,
        error_ending: fn(&B::Error) -> Ending,
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
                finish(a, ending, this.report.as_deref());
            }
        }
    }
}

fn finish(mut a: Active, ending: Ending, report: Option<&StripReport>) {
    let t_end = Instant::now();
    if let Some(u) = report.and_then(StripReport::usage) {
        a.meter.on_usage(u);
    }
    let mut m = a.meter.finish(t_end, ending);
    m.usage_injected = report.is_some();
    m.usage_stripped = report.is_some_and(|r| !r.gave_up());
    drop(a.on_gap); // its buffered gaps reach the histogram before the record
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
            active: Some(Active {
                meter,
                on_gap: None,
                on_finish,
            }),
            report: None,
            error_ending: body_error::<B::Error>,
        }
    }

    /// Observe each ITL gap as it closes.
    pub fn with_gap_observer(mut self, on_gap: OnGap) -> Self {
        if let Some(a) = self.active.as_mut() {
            a.on_gap = Some(SyncWrapper::new(on_gap));
        }
        self
    }

    /// The inner body is a strip body (usage was injected): take the usage it removed, and
    /// say in the record that usage was injected and whether it was stripped.
    pub fn with_strip_report(mut self, report: Arc<StripReport>) -> Self {
        self.report = Some(report);
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
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        let Some(a) = this.active.as_mut() else {
            return Poll::Ready(polled); // finished already: pass the rest through
        };
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let t = Instant::now();
                    match a.on_gap.as_mut() {
                        Some(g) => a.meter.on_frame(t, data, g.get_mut()),
                        None => a.meter.on_frame(t, data, |_| {}),
                    }
                }
            }
            Some(Err(e)) => {
                let ending = (this.error_ending)(e);
                if let Some(a) = this.active.take() {
                    finish(a, ending, this.report.as_deref());
                }
            }
            None => {
                if let Some(a) = this.active.take() {
                    finish(a, Ending::Complete, this.report.as_deref());
                }
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
