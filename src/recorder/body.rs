//! `MeteredBody`: the response body the client polls. Every data frame is timestamped
//! (`Instant::now()` inside `poll_frame`, i.e. when the client is served) and fed to the
//! request's [`StreamMeter`]; it finishes the request's record exactly once, on the end of the
//! stream, on an error, or on drop (the client went away).
//!
//! Two configurations, chosen when the response head arrives:
//! - watching (usage not injected): the frame it returns is the frame it got, and
//!   `is_end_stream` / `size_hint` are the inner body's;
//! - stripping (usage injected, [`StreamMeter::strip_usage`]): the meter's one pass over each
//!   upstream frame decides what the client gets (the injected usage chunk removed) and
//!   meters exactly that; the pieces go out one frame each, as the client polls.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::recording::{body_error_ending, Finish};
use crate::body::{BoxError, ProxyBody};
use crate::metrics::ItlBuffer;
use crate::upstream::goodput::Judging;
use crate::upstream::TokenProgress;
use goodput_measure::meter::StreamMeter;
use goodput_measure::outcome::Ending;

/// The request's meter, its ITL histogram buffer and what finishes its record.
struct Active {
    meter: StreamMeter,
    itl: ItlBuffer,
    finish: Finish,
    /// Its share of the replica's pending work, told what the client has been served, and
    /// the stream's early judgement for the replica's attainment.
    progress: Option<(Arc<TokenProgress>, Judging)>,
}

impl Active {
    /// The client has been served what the meter saw up to `t`.
    fn served(&mut self, t: Instant) {
        if let Some((p, judging)) = &mut self.progress {
            let n = self.meter.output_so_far();
            p.served(n);
            if judging.served(t, n) {
                p.judged_bad(t);
            }
        }
    }
}

/// What a stripping body still has to hand the client after the upstream body's end.
#[derive(Default)]
struct Stripping {
    /// What the meter let out and the client has not polled yet, one frame each (slices of
    /// the upstream frames: bytes that pass unchanged are never copied).
    out: VecDeque<Bytes>,
    /// An upstream error waiting behind the bytes released at the error.
    error: Option<BoxError>,
    /// Trailers waiting behind the bytes released when they came.
    trailers: Option<HeaderMap>,
    /// The upstream body said its last.
    done: bool,
}

/// See the module docs.
pub struct MeteredBody {
    inner: ProxyBody,
    /// `Some` until the record is finished. Boxed: the meter (a few kilobytes) is set up
    /// where it lives and never moved again. The box is made empty and then filled (see
    /// `MeteredBody::new`), hence the inner `Option`: it is `Some` from then on.
    active: Option<Box<Option<Active>>>,
    /// `Some` in the stripping configuration.
    stripping: Option<Box<Stripping>>,
}

impl MeteredBody {
    /// Wrap `inner`, metering from the request's start `t0`; `streaming`: the response is an
    /// SSE stream. `setup` sets the meter up in place and gives it the response head
    /// (`on_head`). When it then strips usage ([`StreamMeter::strips`]) the body is the
    /// stripping configuration.
    pub(super) fn new(
        inner: ProxyBody,
        t0: Instant,
        streaming: bool,
        finish: Finish,
        itl: ItlBuffer,
        setup: impl FnOnce(&mut StreamMeter),
    ) -> Self {
        let progress = finish.progress().map(|p| (p, finish.judging()));
        // The box is allocated first and the meter written into it: `Box::new(Active { .. })`
        // builds the value (2.7 KB) on the stack before it allocates, then copies it in.
        let mut slot: Box<Option<Active>> = Box::default();
        *slot = Some(Active {
            meter: StreamMeter::new(t0, streaming),
            itl,
            finish,
            progress,
        });
        let stripping = match slot.as_mut() {
            Some(a) => {
                setup(&mut a.meter);
                a.meter.strips().then(Box::default)
            }
            None => None,
        };
        Self {
            inner,
            active: Some(slot),
            stripping,
        }
    }

    fn finish(&mut self, ending: Ending) {
        // Taken first: a record is finished once, even if this call does not return.
        let Some(mut slot) = self.active.take() else {
            return;
        };
        let Some(a) = slot.as_mut() else {
            return;
        };
        // Finished in its box: moving the meter (about a kilobyte) or what finishes the record
        // out of it was a copy. The measurement is made in the call's argument (a `let` of it
        // was copied into the argument).
        let end = Instant::now();
        a.itl.finish(); // its buffered gaps reach the histogram before the record
        let Active { meter, finish, .. } = a;
        finish.record(meter.finish(end, ending), end);
    }

    /// The stripping configuration's poll: pieces the meter let out first, then what waits
    /// behind them, then the next upstream frame.
    fn poll_stripped(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            let Some(s) = self.stripping.as_deref_mut() else {
                return Poll::Ready(None);
            };
            if let Some(piece) = s.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            // An error or trailers come with the upstream body's end: one check a frame
            // until then.
            if s.done {
                if let Some(e) = s.error.take() {
                    self.finish(body_error_ending(&e));
                    return Poll::Ready(Some(Err(e)));
                }
                if let Some(t) = s.trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                self.finish(Ending::Complete);
                return Poll::Ready(None);
            }
            let polled = ready!(Pin::new(&mut self.inner).poll_frame(cx));
            let t = Instant::now();
            let Some(a) = active(&mut self.active) else {
                // Finished already (cannot happen before `done`): pass the rest through.
                return Poll::Ready(polled);
            };
            match polled {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let itl = &mut a.itl;
                        let whole = a.meter.strip_frame(t, data, &mut s.out, |g| itl.observe(g));
                        itl.settle();
                        a.served(t);
                        // `out` was empty: a frame that passes whole goes out at once.
                        if let Some(frame) = whole {
                            return Poll::Ready(Some(Ok(Frame::data(frame))));
                        }
                        continue;
                    }
                    // Trailers end the body: what the meter holds goes out first.
                    Err(frame) => s.trailers = frame.into_trailers().ok(),
                },
                Some(Err(e)) => s.error = Some(e),
                None => {}
            }
            let itl = &mut a.itl;
            a.meter.end_of_upstream(t, &mut s.out, |g| itl.observe(g));
            itl.settle();
            s.done = true;
        }
    }
}

/// The body's meter and what finishes its record, until the record is finished.
fn active(slot: &mut Option<Box<Option<Active>>>) -> Option<&mut Active> {
    slot.as_deref_mut().and_then(Option::as_mut)
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        // A body that was already at its end and is dropped unpolled (hyper does that for
        // empty bodies) completed; anything else means the client went away.
        let ending = if self.is_end_stream() {
            Ending::Complete
        } else {
            Ending::ClientGone
        };
        self.finish(ending);
    }
}

impl Body for MeteredBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.stripping.is_some() {
            return this.poll_stripped(cx);
        }
        let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let Some(a) = active(&mut this.active) else {
            return Poll::Ready(polled); // finished already: pass the rest through
        };
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let itl = &mut a.itl;
                    let t = Instant::now();
                    a.meter.on_data(t, data, |g| itl.observe(g));
                    itl.settle();
                    a.served(t);
                }
            }
            Some(Err(e)) => this.finish(body_error_ending(e)),
            None => this.finish(Ending::Complete),
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match self.stripping.as_deref() {
            // Held bytes are only known to be none once the upstream body has said its last.
            Some(s) => s.done && s.out.is_empty() && s.error.is_none() && s.trailers.is_none(),
            None => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.stripping {
            Some(_) => SizeHint::default(), // stripping changes the length
            None => self.inner.size_hint(),
        }
    }
}
