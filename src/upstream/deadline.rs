//! The response body deadlines: first frame, idle (longest wait for the next frame) and an
//! optional total.
//!
//! The first frame may take as long as the first-byte deadline allows: engines send the head
//! of a stream at once and the first event only after prefill, and long prompts are normal.
//! After that, the idle clock starts when the client asks for the next frame, not when the
//! previous one was produced, so a slow reader (backpressure) never looks like a silent upstream.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;

/// Why the proxy cut a response body. The meter can downcast the body error to this to
/// classify the outcome as `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeadlineError {
    #[error("upstream sent no body frame within the first-byte deadline")]
    FirstByte,
    #[error("upstream stream idle for more than {0:?}")]
    Idle(Duration),
    #[error("response exceeded the total deadline of {0:?}")]
    Total(Duration),
}

pin_project! {
    /// Wraps an upstream body; yields its frames unchanged and fails it when a deadline fires.
    /// `G` is held until the body is dropped (e.g. a replica's in-flight guard).
    pub struct DeadlineBody<B, G> {
        #[pin]
        inner: B,
        idle: Duration,
        // Armed only while a frame is awaited: a body whose frames are ready when asked for
        // (a JSON answer read with its head) never registers a timer.
        timer: Option<Pin<Box<Sleep>>>,
        // Until the first frame arrives: the first-byte deadline.
        first_frame_by: Option<Instant>,
        // True while a frame was asked for and has not arrived yet.
        waiting: bool,
        total: Option<(Duration, Pin<Box<Sleep>>)>,
        done: bool,
        _guard: G,
    }
}

impl<B, G> DeadlineBody<B, G> {
    /// `first_frame_by`: the first-byte deadline (the first frame gets at least `idle` too).
    pub fn new(
        inner: B,
        first_frame_by: Instant,
        idle: Duration,
        total: Option<Duration>,
        guard: G,
    ) -> Self {
        let total = total.map(|t| (t, Box::pin(tokio::time::sleep_until(Instant::now() + t))));
        Self {
            inner,
            idle,
            first_frame_by: Some(first_frame_by),
            timer: None,
            waiting: false,
            total,
            done: false,
            _guard: guard,
        }
    }

    /// As [`new`](Self::new), going on with the `timer` that waited for the response head
    /// (set for `first_frame_by`, see [`until`]): one timer serves the head and the body,
    /// where two would each be registered and cancelled again.
    pub fn with_timer(
        inner: B,
        first_frame_by: Instant,
        idle: Duration,
        total: Option<Duration>,
        guard: G,
        timer: Pin<Box<Sleep>>,
    ) -> Self {
        let mut body = Self::new(inner, first_frame_by, idle, total, guard);
        body.timer = Some(timer);
        body
    }
}

/// `fut`'s output, or `None` when `timer` fires first: `tokio::time::timeout_at` with the
/// caller's timer, which outlives the wait (a response body's deadlines go on with it,
/// [`DeadlineBody::with_timer`]). The future is polled first, so one that is ready wins.
/// Both are pinned where the caller keeps them: taken by value, the future (forwarding's send,
/// about 1.5 KiB) was moved into this wait and again into its pinned place, two copies a
/// request, and held twice in the caller's own state.
pub fn until<'a, F: Future + ?Sized>(
    mut fut: Pin<&'a mut F>,
    mut timer: Pin<&'a mut Sleep>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
}

impl<B, G> Body for DeadlineBody<B, G>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            *this.waiting = false;
            *this.first_frame_by = None;
            if frame.is_none() {
                *this.done = true;
            }
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        // The idle clock starts when the frame was first asked for and did not come (this
        // poll); later polls while it is still awaited leave the deadline where it is.
        let timer = match this.timer {
            Some(timer) if *this.waiting => timer,
            timer => {
                *this.waiting = true;
                let idle_by = Instant::now() + *this.idle;
                let by = this
                    .first_frame_by
                    .map_or(idle_by, |first| first.max(idle_by));
                match timer {
                    Some(timer) => {
                        timer.as_mut().reset(by);
                        timer
                    }
                    None => timer.insert(Box::pin(tokio::time::sleep_until(by))),
                }
            }
        };
        if let Some((total, sleep)) = this.total.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                *this.done = true;
                return Poll::Ready(Some(Err(DeadlineError::Total(*total).into())));
            }
        }
        ready!(timer.as_mut().poll(cx));
        *this.done = true;
        let err = match this.first_frame_by {
            Some(_) => DeadlineError::FirstByte,
            None => DeadlineError::Idle(*this.idle),
        };
        Poll::Ready(Some(Err(err.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};
    use std::pin::pin;

    type Item = Result<Frame<Bytes>, std::convert::Infallible>;

    /// A body whose frames arrive after the given delays.
    fn delayed(delays_ms: &[u64]) -> impl Body<Data = Bytes, Error = std::convert::Infallible> {
        let delays = delays_ms.to_vec();
        StreamBody::new(Box::pin(stream::unfold(0usize, move |i| {
            let delays = delays.clone();
            async move {
                let d = *delays.get(i)?;
                tokio::time::sleep(Duration::from_millis(d)).await;
                Some((
                    Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(format!("{i}")))),
                    i + 1,
                ))
            }
        }))
            as Pin<Box<dyn futures_util::Stream<Item = Item> + Send>>)
    }

    /// The body's frames and error; with `timer`, the body goes on with the timer that
    /// waited for the head (as forwarding makes it), else it makes its own.
    async fn run(
        delays: &[u64],
        first: u64,
        idle: u64,
        total: Option<u64>,
        timer: bool,
    ) -> (usize, Option<DeadlineError>) {
        let first_by = Instant::now() + Duration::from_millis(first);
        let (idle, total) = (
            Duration::from_millis(idle),
            total.map(Duration::from_millis),
        );
        let mut body = if timer {
            let mut timer = Box::pin(tokio::time::sleep_until(first_by));
            // The head came at once: the timer was polled (registered) and is still running.
            let head = until(pin!(std::future::ready(())), timer.as_mut()).await;
            assert_eq!(head, Some(()));
            DeadlineBody::with_timer(delayed(delays), first_by, idle, total, (), timer)
        } else {
            DeadlineBody::new(delayed(delays), first_by, idle, total, ())
        };
        let mut frames = 0;
        while let Some(f) = body.frame().await {
            match f {
                Ok(_) => frames += 1,
                Err(e) => return (frames, e.downcast_ref::<DeadlineError>().copied()),
            }
        }
        (frames, None)
    }

    #[tokio::test(start_paused = true)]
    async fn table() {
        let idle = |ms| Some(DeadlineError::Idle(Duration::from_millis(ms)));
        let total = |ms| Some(DeadlineError::Total(Duration::from_millis(ms)));
        let first = Some(DeadlineError::FirstByte);
        // (frame delays, first-byte ms, idle ms, total ms, (frames seen, error))
        type Case = (
            &'static [u64],
            u64,
            u64,
            Option<u64>,
            (usize, Option<DeadlineError>),
        );
        let cases: Vec<Case> = vec![
            (&[10, 10, 10], 0, 50, None, (3, None)),
            (&[10, 100, 10], 0, 50, None, (1, idle(50))),
            (&[40, 40, 40, 40], 0, 50, None, (4, None)),
            (&[40, 40, 40, 40], 0, 50, Some(100), (2, total(100))),
            (&[], 0, 50, Some(1), (0, None)),
            // A slow first frame (prefill) is covered by the first-byte deadline ...
            (&[400, 10], 500, 50, None, (2, None)),
            // ... up to that deadline,
            (&[600, 10], 500, 50, None, (0, first)),
            // and never less than one idle period.
            (&[40, 10], 0, 50, None, (2, None)),
            // After the first frame, idle applies again.
            (&[400, 100], 500, 50, None, (1, idle(50))),
        ];
        for (delays, f, i, t, want) in cases {
            for timer in [false, true] {
                assert_eq!(
                    run(delays, f, i, t, timer).await,
                    want,
                    "{delays:?} first={f} idle={i} total={t:?} timer={timer}"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn until_is_the_future_unless_the_timer_fires_first() {
        let by = |ms| Instant::now() + Duration::from_millis(ms);
        let mut timer = Box::pin(tokio::time::sleep_until(by(50)));
        let slow = tokio::time::sleep(Duration::from_millis(60));
        assert_eq!(until(pin!(slow), timer.as_mut()).await, None);
        let mut timer = Box::pin(tokio::time::sleep_until(by(50)));
        let quick = async {
            tokio::time::sleep(Duration::from_millis(40)).await;
            7
        };
        assert_eq!(until(pin!(quick), timer.as_mut()).await, Some(7));
        // A ready future wins over a timer that has fired already.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            until(pin!(std::future::ready(8)), timer.as_mut()).await,
            Some(8)
        );
        assert_eq!(
            until(pin!(std::future::pending::<u8>()), timer.as_mut()).await,
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_reader_is_not_idle() {
        let mut body = DeadlineBody::new(
            delayed(&[1, 1, 1]),
            Instant::now(),
            Duration::from_millis(50),
            None,
            (),
        );
        let mut n = 0;
        while let Some(f) = body.frame().await {
            f.unwrap();
            n += 1;
            // The client stalls far longer than the idle deadline between reads.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(n, 3);
    }
}
