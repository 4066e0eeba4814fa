//! The SSE response body: a poll-driven state machine (queue -> prefill -> decode steps ->
//! trailer) that writes chunks into one reused buffer. Tokens may be packed several to an
//! event ([`Packing`]); an early-finish fault ends the choices with `abort` or `error`. With zero decode time it emits many
//! steps per frame; otherwise it sleeps on one re-armed timer per stream. Dropping the body
//! (client disconnect) drops the [`Run`], which frees the decode slots at once. With vLLM's
//! `--sse-keep-alive-interval` a `: keep-alive` comment goes out whenever the stream has been
//! idle that long (queued, in prefill, or between tokens). llama.cpp's `prompt_progress`
//! chunks, when asked for, go out while the prompt is decoded (`personality::progress`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::agent::{AgentPlan, Part};
use super::coalesce::{Packing, Pending};
use super::engine::{Acquire, Run};
use super::errors::stream_error_event;
use super::faults::Faults;
use super::per_request::PerRequestMetrics;
use super::personality::progress::Progress;
use super::render::{AgentDelta, Templates, DONE};
use super::request::Api;

/// Steps written into one frame when decode time is zero.
const BATCH_STEPS: u32 = 64;
/// Flush a frame once the buffer holds this much.
const FLUSH_BYTES: usize = 32 * 1024;
/// vLLM's `SSE_KEEP_ALIVE_COMMENT`.
const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// The error that cuts a response body short (`truncate-after`): hyper then closes the
/// connection without the final chunk.
#[derive(Debug, thiserror::Error)]
#[error("simulated truncation")]
pub struct Truncated;

enum State {
    Queued(Acquire),
    /// Decoding the prompt batch by batch, a progress chunk after each.
    Prefill,
    Sleeping,
    Step,
    Trailer,
    Truncate,
    Done,
}

pub struct SseBody {
    run: Run,
    tmpl: Templates,
    faults: Faults,
    api: Api,
    include_usage: bool,
    state: State,
    sleep: Pin<Box<Sleep>>,
    deadline: Instant,
    buf: BytesMut,
    malformed_sent: bool,
    cut_yielded: bool,
    packing: Packing,
    /// Per choice: tokens generated, not yet sent.
    pending: Vec<Pending>,
    /// Choices whose event goes out after this step, in index order.
    ready: Vec<u32>,
    /// Per choice: its reasoning / tool-call plan (empty when none was asked for).
    agents: Vec<Option<AgentPlan>>,
    /// Choices whose tool call ended in this step.
    calls_done: Vec<u32>,
    /// `--sse-keep-alive-interval`, and the timer re-armed by every frame sent.
    keep_alive: Option<(Duration, Pin<Box<Sleep>>)>,
    /// llama.cpp's `return_progress` was asked for; the prompt's progress once admitted.
    wants_progress: bool,
    progress: Option<Progress>,
}

impl SseBody {
    pub fn new(
        mut run: Run,
        tmpl: Templates,
        faults: Faults,
        api: Api,
        include_usage: bool,
        packing: Packing,
        agents: Vec<Option<AgentPlan>>,
    ) -> Self {
        if agents.iter().flatten().any(|a| a.tool.is_some()) {
            run.gen.no_eos();
        }
        let acquire = run.enqueue();
        let n = run.gen.n() as usize;
        let now = Instant::now();
        SseBody {
            run,
            tmpl,
            faults,
            api,
            include_usage,
            state: State::Queued(acquire),
            sleep: Box::pin(tokio::time::sleep_until(now)),
            deadline: now,
            buf: BytesMut::with_capacity(4096),
            malformed_sent: false,
            cut_yielded: false,
            packing,
            pending: (0..n).map(|_| Pending::default()).collect(),
            ready: Vec::with_capacity(n),
            agents,
            calls_done: Vec::new(),
            keep_alive: None,
            wants_progress: false,
            progress: None,
        }
    }

    /// Sends llama.cpp's `prompt_progress` chunks before the first token.
    pub fn prompt_progress(mut self, wanted: bool) -> Self {
        self.wants_progress = wanted;
        self
    }

    /// Sends `: keep-alive` after every `interval` without a frame (zero: never).
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        if !interval.is_zero() {
            let sleep = Box::pin(tokio::time::sleep(interval));
            self.keep_alive = Some((interval, sleep));
        }
        self
    }

    /// Before answering `Pending`: a keep-alive comment when the stream was idle long enough
    /// (the timer is polled, so it wakes the body when it fires).
    fn idle(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Truncated>>> {
        let fired = match &mut self.keep_alive {
            Some((_, sleep)) => sleep.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if !fired {
            return Poll::Pending;
        }
        self.buf.extend_from_slice(KEEP_ALIVE);
        self.take_frame()
    }

    /// Reasoning tokens generated over all choices, when reasoning was asked for (the usage
    /// chunk's `completion_tokens_details`, as vLLM adds it with a reasoning parser).
    fn reasoning_tokens(&self) -> Option<u64> {
        let mut any = false;
        let mut n = 0;
        for (i, plan) in self.agents.iter().enumerate() {
            if let Some(p) = plan.as_ref().filter(|p| p.reasoning > 0) {
                any = true;
                n += p.reasoning.min(self.run.gen.tokens(i as u32));
            }
        }
        any.then_some(n)
    }

    fn take_frame(&mut self) -> Poll<Option<Result<Frame<Bytes>, Truncated>>> {
        if let Some((interval, sleep)) = &mut self.keep_alive {
            sleep.as_mut().reset(Instant::now() + *interval);
        }
        Poll::Ready(Some(Ok(Frame::data(self.buf.split().freeze()))))
    }

    /// Arms the timer for `d` after the previous deadline (so per-token times do not drift).
    fn wait(&mut self, d: Duration, from_now: bool) {
        let now = Instant::now();
        self.deadline = if from_now {
            now + d
        } else {
            (self.deadline + d).max(now - Duration::from_millis(50))
        };
        self.sleep.as_mut().reset(self.deadline);
        self.state = State::Sleeping;
    }

    /// One generation step into the buffer; applies the step-count faults first.
    fn step(&mut self) {
        let steps = self.run.steps_done();
        if self.faults.error_after == Some(steps) {
            self.buf.extend_from_slice(
                stream_error_event("Simulated engine error (x-sim-fault: error-after)").as_bytes(),
            );
            self.buf.extend_from_slice(DONE);
            self.run.finish(true);
            self.state = State::Done;
            return;
        }
        if self.faults.truncate_after == Some(steps) {
            self.state = State::Truncate;
            return;
        }
        if self.faults.malformed_after == Some(steps) && !self.malformed_sent {
            self.malformed_sent = true;
            self.tmpl.malformed_chunk(&mut self.buf);
        }
        if let Some(end) = self.faults.finish.filter(|f| f.after == steps) {
            // The engine gives up: every unfinished choice gets one last event with what it
            // still holds (possibly no token) and the finish_reason.
            for i in 0..self.run.gen.n() {
                let finish = end.reason.finish();
                if self.run.gen.end_early(i, finish.clone()) {
                    let p = &mut self.pending[i as usize];
                    p.finish = Some(finish);
                    p.count = self.run.gen.tokens(i);
                    self.ready.push(i);
                }
            }
            self.flush_ready();
            self.state = State::Trailer;
            return;
        }
        let (pending, packing, ready) = (&mut self.pending, &mut self.packing, &mut self.ready);
        let (agents, calls_done) = (&self.agents, &mut self.calls_done);
        self.run.step(|i, t| {
            let p = &mut pending[i as usize];
            p.texts.push(t.text);
            p.logprobs.extend(t.logprobs);
            p.count = t.count;
            p.finish = t.finish;
            // The call's last arguments fragment ends the choice (unless the engine's own
            // limit ended it on this very token).
            if let Some(plan) = agents.get(i as usize).and_then(Option::as_ref) {
                let call_ends = matches!(plan.part(t.count - 1), Part::ToolArgs { last: true, .. });
                if let (true, None, Some(tool)) = (call_ends, &p.finish, &plan.tool) {
                    p.finish = Some(tool.finish.clone());
                    calls_done.push(i);
                }
            }
            let last = p.finish.is_some();
            let first = p.count == p.texts.len() as u64;
            if last || !packing.hold(p.texts.len(), first) {
                ready.push(i);
            }
        });
        for i in self.calls_done.drain(..) {
            if let Some(f) = self.pending[i as usize].finish.clone() {
                self.run.gen.end_early(i, f);
            }
        }
        self.flush_ready();
        self.state = if self.run.gen.all_finished() {
            State::Trailer
        } else {
            State::Step
        };
    }

    /// Writes the events of the ready choices (chat: each choice's role chunk before its
    /// first event, all role chunks of a step first, as vLLM orders them).
    fn flush_ready(&mut self) {
        let logprobs = self.run.gen.logprobs();
        let finishing = self
            .ready
            .iter()
            .any(|&i| self.pending[i as usize].finish.is_some());
        if finishing && self.tmpl.reports_timings() {
            let timings = crate::personality::timings::llamacpp_timings(
                &self.run.times(),
                self.tmpl.prompt_tokens(),
                self.run.cached_tokens(),
                self.run.gen.total_tokens(),
            );
            self.tmpl.set_timings(timings);
        }
        if self.api == Api::Chat {
            for &i in &self.ready {
                let p = &mut self.pending[i as usize];
                if !p.role_sent {
                    p.role_sent = true;
                    self.tmpl.role_chunk(&mut self.buf, i);
                }
            }
        }
        for &i in &self.ready {
            let p = &mut self.pending[i as usize];
            let lp = logprobs.then_some(&p.logprobs[..]);
            match self.agents.get(i as usize).and_then(Option::as_ref) {
                Some(plan) => {
                    let delta = agent_delta(plan, p);
                    let finish = p.finish.as_ref();
                    self.tmpl
                        .agent_chunk(&mut self.buf, i, &delta, lp, finish, p.count);
                }
                None => self.tmpl.token_chunk(
                    &mut self.buf,
                    i,
                    &p.texts,
                    lp,
                    p.finish.as_ref(),
                    p.count,
                ),
            }
            p.sent();
        }
        self.ready.clear();
    }
}

/// The delta of one pending event of a choice with an agent plan: its tokens are the
/// choice's tokens `count - texts.len() .. count`, each shaped by the plan.
fn agent_delta<'a>(plan: &'a AgentPlan, p: &'a Pending) -> AgentDelta<'a> {
    let first = p.count.saturating_sub(p.texts.len() as u64);
    let reasoning = (plan.reasoning.saturating_sub(first) as usize).min(p.texts.len());
    let mut delta = AgentDelta {
        reasoning: &p.texts[..reasoning],
        ..AgentDelta::default()
    };
    if plan.tool.is_none() {
        delta.content = &p.texts[reasoning..];
        return delta;
    }
    for k in first + reasoning as u64..p.count {
        match plan.part(k) {
            Part::ToolOpen => {
                delta.tool_open = plan.tool.as_ref().map(|t| (t.id.as_str(), t.name.as_str()))
            }
            Part::ToolArgs { fragment, .. } => delta.arguments.push_str(fragment),
            Part::Content | Part::Reasoning => {}
        }
    }
    delta
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Truncated;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let mut steps_in_frame = 0u32;
        loop {
            match &mut this.state {
                State::Queued(acquire) => match acquire.as_mut().poll(cx) {
                    Poll::Pending => return this.idle(cx),
                    Poll::Ready(Ok(permit)) => {
                        let stall = Duration::from_millis(this.faults.stall_first_ms.unwrap_or(0));
                        let prefill = this.run.admitted(permit, stall);
                        if this.wants_progress {
                            let (total, cache) =
                                (this.tmpl.prompt_tokens(), this.run.cached_tokens());
                            let (p, next) =
                                Progress::start(&this.tmpl, &mut this.buf, total, cache, prefill);
                            this.progress = Some(p);
                            if let Some(d) = next {
                                this.wait(d, true);
                                this.state = State::Prefill;
                                return this.take_frame();
                            }
                            this.state = State::Step;
                        } else if prefill.is_zero() {
                            this.state = State::Step;
                        } else {
                            this.wait(prefill, true);
                        }
                    }
                    // The semaphore is never closed; end the body if it ever is.
                    Poll::Ready(Err(_)) => this.state = State::Done,
                },
                State::Prefill => {
                    if this.sleep.as_mut().poll(cx).is_pending() {
                        return this.idle(cx);
                    }
                    let next = match &mut this.progress {
                        Some(p) => p.batch_done(&this.tmpl, &mut this.buf),
                        None => None,
                    };
                    match next {
                        Some(d) => {
                            this.wait(d, false);
                            this.state = State::Prefill;
                            return this.take_frame();
                        }
                        // The last progress chunk goes out with the first token.
                        None => this.state = State::Step,
                    }
                }
                State::Sleeping => {
                    if this.sleep.as_mut().poll(cx).is_pending() {
                        return if this.buf.is_empty() {
                            this.idle(cx)
                        } else {
                            this.take_frame()
                        };
                    }
                    this.state = State::Step;
                }
                State::Step => {
                    this.step();
                    if matches!(this.state, State::Step) {
                        let stall = Duration::from_millis(this.faults.stall_every_ms.unwrap_or(0));
                        let d = this.run.step_time(stall);
                        if !d.is_zero() {
                            let from_now = this.run.steps_done() == 1;
                            this.wait(d, from_now);
                            // A step whose tokens are all held sends nothing.
                            if !this.buf.is_empty() {
                                return this.take_frame();
                            }
                            continue;
                        }
                        steps_in_frame += 1;
                        if steps_in_frame >= BATCH_STEPS || this.buf.len() >= FLUSH_BYTES {
                            return this.take_frame();
                        }
                    }
                }
                State::Trailer => {
                    this.run.finish(false);
                    if this.include_usage {
                        let total = this.run.gen.total_tokens();
                        let times = this.run.times();
                        this.tmpl
                            .set_engine_metrics(PerRequestMetrics::new(&times, total));
                        let reasoning = this.reasoning_tokens();
                        this.tmpl.set_prompt_details(this.run.prompt_details());
                        this.tmpl.usage_chunk(&mut this.buf, total, reasoning);
                    }
                    if !this.faults.no_done {
                        this.buf.extend_from_slice(DONE);
                    }
                    this.state = State::Done;
                }
                State::Truncate => {
                    if !this.buf.is_empty() {
                        return this.take_frame();
                    }
                    // Yield once so hyper flushes what was sent before the cut.
                    if !this.cut_yielded {
                        this.cut_yielded = true;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(Truncated)));
                }
                State::Done => {
                    return if this.buf.is_empty() {
                        Poll::Ready(None)
                    } else {
                        this.take_frame()
                    };
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done) && self.buf.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
