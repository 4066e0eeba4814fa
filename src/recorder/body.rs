//! `MeteredBody`: the response body the client polls, wrapped so that every data frame is
//! timestamped (`Instant::now()` inside `poll_frame`, i.e. when the client is served) and fed
//! to the request's [`StreamMeter`]. It only watches: the frame it returns is the frame it
//! got, and `is_end_stream` / `size_hint` are the inner body's. It finishes the request's
//! record exactly once, on the end of the stream, on an error, or on drop (the client went
//! away). When usage was injected, the inner body is a [`StripBody`] that removed the usage
//! chunk before this body saw the stream; its [`StripFacts`] are read off it at the end.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::recording::{body_error_ending, Finish};
use crate::body::strip::{StripBody, StripFacts};
use crate::body::{BoxError, ProxyBody};
use crate::metrics::ItlBuffer;
use goodput_measure::meter::StreamMeter;
use goodput_measure::outcome::Ending;

/// The upstream body as the client gets it: as it came, or with the injected usage stripped
/// (boxed: the stripper's state is large, and most bodies are plain).
enum Upstream {
    Plain(ProxyBody),
    Stripped(Box<StripBody<ProxyBody>>),
}

impl Upstream {
    fn strip_facts(&self) -> Option<StripFacts> {
        match self {
            Upstream::Plain(_) => None,
            Upstream::Stripped(s) => Some(s.facts()),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Upstream::Plain(b) => b.is_end_stream(),
            Upstream::Stripped(b) => b.is_end_stream(),
        }
    }
}

/// The request's meter, its ITL histogram buffer and what finishes its record.
struct Active {
    meter: StreamMeter,
    itl: ItlBuffer,
    finish: Finish,
}

/// See the module docs.
pub struct MeteredBody {
    inner: Upstream,
    active: Option<Active>,
}

impl MeteredBody {
    /// Wrap `inner`. `meter` already carries `t0` and the response head (`on_head`).
    pub(super) fn new(
        inner: ProxyBody,
        meter: StreamMeter,
        finish: Finish,
        itl: ItlBuffer,
    ) -> Self {
        Self::with(Upstream::Plain(inner), meter, finish, itl)
    }

    /// Wrap `inner` with its injected usage chunk stripped.
    pub(super) fn stripped(
        inner: ProxyBody,
        meter: StreamMeter,
        finish: Finish,
        itl: ItlBuffer,
    ) -> Self {
        Self::with(
            Upstream::Stripped(Box::new(StripBody::new(inner))),
            meter,
            finish,
            itl,
        )
    }

    fn with(inner: Upstream, meter: StreamMeter, finish: Finish, itl: ItlBuffer) -> Self {
        Self {
            inner,
            active: Some(Active { meter, itl, finish }),
        }
    }

    fn finish(&mut self, ending: Ending) {
        let Some(mut a) = self.active.take() else {
            return;
        };
        let t_end = Instant::now();
        let strip = self.inner.strip_facts();
        if let Some(u) = strip.and_then(|s| s.usage) {
            a.meter.on_usage(u);
        }
        let m = a.meter.finish(t_end, ending);
        drop(a.itl); // its buffered gaps reach the histogram before the record
        a.finish.record(m, strip);
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        // A body that was already at its end and is dropped unpolled (hyper does that for
        // empty bodies) completed; anything else means the client went away.
        let ending = if self.inner.is_end_stream() {
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
        let polled = ready!(match &mut this.inner {
            Upstream::Plain(b) => Pin::new(b).poll_frame(cx),
            Upstream::Stripped(b) => Pin::new(&mut **b).poll_frame(cx),
        });
        let Some(a) = this.active.as_mut() else {
            return Poll::Ready(polled); // finished already: pass the rest through
        };
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let itl = &mut a.itl;
                    a.meter.on_frame(Instant::now(), data, |g| itl.observe(g));
                }
            }
            Some(Err(e)) => this.finish(body_error_ending(e)),
            None => this.finish(Ending::Complete),
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Upstream::Plain(b) => b.size_hint(),
            Upstream::Stripped(b) => b.size_hint(),
        }
    }
}
