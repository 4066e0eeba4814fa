//! One request on its way to its record (see the module docs of `recorder`).

use std::sync::Arc;

use http::Response;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::body::MeteredBody;
use super::{unix_ms_at, Recorder, GAPS_KEPT_PER_REQUEST};
use crate::auth::Tenant;
use crate::body::{BoxError, ProxyBody};
use crate::context::RequestContext;
use crate::error::ProxyError;
use crate::metrics::RequestMetrics;
use crate::upstream::deadline::DeadlineError;
use crate::upstream::forward::{Offered, Routed};
use crate::upstream::goodput::Judging;
use crate::upstream::usage::Unasked;
use goodput_measure::meter::{Measurement, MeterSetup};
use goodput_measure::outcome::{rejected_by_client, Ending, Outcome};
use goodput_measure::record::RequestRecord;
use goodput_measure::slo::{judge, Slo};

/// A request's record until the response head or an error arrives. Dropped unfinished: the
/// client went away before the head.
pub struct Recording {
    open: Option<Open>,
}

struct Open {
    recorder: Arc<Recorder>,
    ctx: Arc<RequestContext>,
    /// Generation requests are timed from their body; other paths are recorded only when the
    /// proxy answered them itself (404, 413, 503: they never reached an engine).
    generation: bool,
    /// The client sent `x-goodput-trace: 1`.
    trace_asked: bool,
    /// Counted in flight, under its model's label, from the moment collect has read it.
    started: Option<Started>,
}

/// A request counted in flight: its metric handles and what its record is judged by.
struct Started {
    rm: RequestMetrics,
    slo: Slo,
    tenant: Option<Arc<Tenant>>,
    start_unix_ms: u64,
}

/// What finishes a generation request's record once its response body is done: the
/// [`MeteredBody`] holds it and calls [`Finish::record`] exactly once.
pub struct Finish {
    recorder: Arc<Recorder>,
    id: Arc<str>,
    started: Started,
    upstream: Option<Arc<str>>,
    /// How the replica that answered was chosen (absent when none did).
    routed: Option<Routed>,
    /// The stream was left alone to learn whether its engine adds usage unasked.
    learns_unasked: bool,
    /// The request's start.
    t0: Instant,
}

impl Recording {
    pub(super) fn new(
        recorder: Arc<Recorder>,
        ctx: Arc<RequestContext>,
        generation: bool,
        trace_asked: bool,
    ) -> Self {
        Self {
            open: Some(Open {
                recorder,
                ctx,
                generation,
                trace_asked,
                started: None,
            }),
        }
    }

    /// The inner service is still working: once collect has read a generation request's
    /// model (it hands the request on to forwarding in the same poll), the request is counted
    /// in flight under its model's label, while it waits for the engine's head.
    pub fn poll_pending(&mut self) {
        if let Some(open) = self.open.as_mut() {
            if open.generation && open.started.is_none() && open.ctx.facts().is_some() {
                open.started = Some(open.start());
            }
        }
    }

    /// A typed error from a layer inside the measure layer, or from forwarding.
    pub fn failed(mut self, e: &ProxyError) {
        if let Some(open) = self.open.take() {
            if open.generation || e.answered_by_proxy() {
                open.without_body(e.outcome(), Some(e.status().as_u16()));
            }
        }
    }

    /// The response head: a generation request's record is finished by its body from here.
    /// When usage was injected ([`Offered::Injected`]), the body strips the injected usage
    /// chunk on its way to the client.
    pub fn respond(mut self, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        match self.open.take() {
            Some(open) if open.generation => open.respond(resp),
            _ => resp,
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(open) = self.open.take() {
            if open.generation {
                open.without_body(Outcome::ClientAbort, None);
            }
        }
    }
}

impl Open {
    fn start(&self) -> Started {
        let recorder = &self.recorder;
        let ctx = &self.ctx;
        let model = ctx.facts().and_then(|f| f.model.as_deref());
        let rm = recorder.metrics.for_request(model.unwrap_or(""));
        recorder.saw_model(model, rm.model());
        Started {
            slo: *recorder.slo.for_model(rm.model()),
            rm,
            tenant: ctx.tenant().cloned(),
            start_unix_ms: unix_ms_at(ctx.t0),
        }
    }

    fn finish(self) -> Finish {
        let started = match self.started {
            Some(s) => s,
            None => self.start(),
        };
        Finish {
            recorder: self.recorder,
            id: self.ctx.id.clone(),
            started,
            upstream: None,
            routed: None,
            learns_unasked: false,
            t0: self.ctx.t0,
        }
    }

    fn without_body(self, outcome: Outcome, status: Option<u16>) {
        let end = Instant::now();
        let e2e = end.saturating_duration_since(self.ctx.t0);
        let m = Measurement::without_body(outcome, status, e2e);
        self.finish().record(m, end);
    }

    fn respond(self, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        let ctx = self.ctx.clone();
        let (recorder, trace_asked) = (self.recorder.clone(), self.trace_asked);
        let mut finish = self.finish();
        let facts = ctx.facts();
        let stream = facts.is_some_and(|f| f.stream);
        let (mut parts, body) = resp.into_parts();
        let tools = facts.and_then(|f| f.tools.clone());
        finish.routed = parts.extensions.remove::<Routed>();
        // The replica that answered, by its URL (what the access log reads as `ServedBy`).
        finish.upstream = finish.routed.as_ref().map(|r| r.replica.url.clone());
        // Usage is only ever offered for a stream (the usage layer): a JSON answer is not
        // looked up for the mark.
        let offered = if stream {
            parts.extensions.get::<Offered>().copied()
        } else {
            None
        };
        finish.learns_unasked = offered == Some(Offered::Learns);
        // The proxy's own time: t0 until forwarding handed the attempt that answered to the
        // upstream client (its part of the TTFT split).
        let proxy_time = finish
            .routed
            .as_ref()
            .map(|r| r.sent.saturating_duration_since(ctx.t0));
        if let Some(d) = proxy_time {
            recorder.metrics.observe_overhead(d);
        }
        let setup = MeterSetup {
            // A JSON answer has no gaps: no room for them (an allocation a request).
            keep_gaps: if stream { GAPS_KEPT_PER_REQUEST } else { 0 },
            tools,
            proxy_time,
            stall: recorder.stall,
            // Only streams have events to trace (a JSON body is one moment).
            trace: (stream && recorder.traced(trace_asked)).then_some(recorder.trace_bounds),
            strip_usage: offered == Some(Offered::Injected),
        };
        let (t_head, status) = (Instant::now(), parts.status.as_u16());
        if let Some(u) = &finish.upstream {
            finish.started.rm.set_upstream(u);
        }
        let itl = finish.started.rm.itl_buffer();
        let body = MeteredBody::new(body, ctx.t0, stream, finish, itl, |sm| {
            sm.setup(setup);
            sm.on_head(t_head, status);
        })
        .boxed_unsync();
        Response::from_parts(parts, body)
    }
}

impl Finish {
    /// The request's share of its replica's pending work (absent when no replica answered).
    pub(super) fn progress(&self) -> Option<Arc<crate::upstream::TokenProgress>> {
        self.routed.as_ref().map(|r| r.progress.clone())
    }

    /// The stream's early judgement against its SLOs, from the request's start.
    pub(super) fn judging(&self) -> Judging {
        Judging::new(self.t0, self.started.slo)
    }

    /// The request's record: metrics, the tenant's token budget, the balancer's view of its
    /// replica, sinks and the ring. `end`: when the request finished (the meter's end).
    /// Called once; by reference, so that the body finishes it in its box (moving it out
    /// was a copy of a few hundred bytes).
    pub fn record(&mut self, mut m: Measurement, end: Instant) {
        let Started {
            rm,
            slo,
            tenant,
            start_unix_ms,
        } = &mut self.started;
        let v = judge(&m, slo);
        let tenant_name = tenant.as_ref().map(|t| t.name.clone());
        let tokens = m.prompt_tokens.unwrap_or(0) + m.completion_tokens.unwrap_or(0);
        if let Some(t) = &tenant {
            // The token budget is charged with what the request used (see auth::tenant).
            t.charge(tokens, end);
        }
        let recorder = &*self.recorder;
        recorder.metrics.tenant_finished(
            tenant_name.as_ref().unwrap_or(&recorder.no_tenant),
            m.outcome,
            tokens,
        );
        let model = rm.model().clone();
        let by_client = rejected_by_client(m.outcome, m.status);
        if let Some(scale) = &recorder.scale {
            let tenant = tenant.as_ref().map(|t| &t.name);
            scale.finished(
                &model,
                tenant,
                rm.upstream(),
                !by_client,
                v.good,
                // `end - e2e`, the meter's E2E being `end - t0` (saturating): the same
                // instant without the arithmetic.
                self.t0.min(end),
                end,
            );
        }
        rm.finish(&m, &v, end);
        let (route_reason, retried_from) = match &mut self.routed {
            Some(r) => {
                // What this replica's clients got feeds the balancer's goodput view.
                if !by_client {
                    let secs = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
                    let stats = &r.replica.route.stats;
                    if !r.progress.judged_early() {
                        stats.judge(v.good, end);
                    }
                    stats.observe(secs(m.ttft), secs(m.tpot));
                }
                if let (Some(cached), Some(prompt)) =
                    (m.engine_view().cached_prompt_tokens, m.prompt_tokens)
                {
                    r.learn(cached, prompt);
                }
                if self.learns_unasked && m.outcome == Outcome::Success {
                    // The client asked for no usage and got the engine's stream as it came:
                    // usage in it (exact tokens) was the engine's own.
                    let learned = if m.tokens_exact {
                        Unasked::Yes
                    } else {
                        Unasked::No
                    };
                    r.replica.set_usage_unasked(learned);
                }
                (
                    Some(r.reason),
                    std::mem::take(&mut r.earlier).into_boxed_slice(),
                )
            }
            None => (None, Box::default()),
        };
        // The ring keeps the gaps and the trace beside the record (see `Recorder::store`).
        let gaps = std::mem::take(&mut m.itl_gaps);
        let trace = m.trace.take();
        // Built whole, in one expression, in its `Arc`: a record built step by step
        // (`RequestRecord::new` and its `with_*` builders) was copied at each step, and one
        // handed on by value was copied again into the `Arc`.
        let rec = Arc::new(RequestRecord {
            id: self.id.clone(),
            model,
            upstream: self.upstream.take(),
            start_unix_ms: *start_unix_ms,
            measured: m,
            slo: v,
            instance: recorder.instance.clone(),
            tenant: tenant_name,
            route_reason,
            retried_from,
            end,
        });
        recorder.store(rec, gaps, trace);
    }
}

/// A body error from the proxy's own stream deadlines is a timeout; any other is a break.
pub(super) fn body_error_ending(e: &BoxError) -> Ending {
    if e.downcast_ref::<DeadlineError>().is_some() {
        Ending::Timeout
    } else {
        Ending::BodyError
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn deadline_errors_are_timeouts() {
        let e: BoxError = DeadlineError::Idle(Duration::from_secs(1)).into();
        assert_eq!(body_error_ending(&e), Ending::Timeout);
        let e: BoxError = DeadlineError::FirstByte.into();
        assert_eq!(body_error_ending(&e), Ending::Timeout);
        let e: BoxError = "connection reset".into();
        assert_eq!(body_error_ending(&e), Ending::BodyError);
    }
}
