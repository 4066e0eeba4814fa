//! Non-streaming responses: the same engine run, collected into one JSON body. The response
//! future is dropped when the client goes away, which drops the run and frees its slots.

use std::time::Duration;

use bytes::Bytes;

use super::agent::{AgentPlan, Part};
use super::engine::Run;
use super::errors::ApiError;
use super::faults::Faults;
use super::per_request::PerRequestMetrics;
use super::render::{ChoiceResult, Finish, MessageAgent, MessageCall, Templates};

/// What the handler sends: a full JSON body, an error, or a body cut short.
pub enum NonStream {
    Json(Bytes),
    Error(ApiError),
    /// `truncate-after`: headers promise the full length, then only this prefix comes.
    Truncated {
        full_len: usize,
        prefix: Bytes,
    },
    /// `malformed-after`: the JSON is cut short but its length is declared correctly.
    Malformed(Bytes),
}

/// `agents`: each choice's reasoning / tool-call plan (empty when none was asked for), laid
/// out token by token as the stream would, then collected into the message.
pub async fn run(
    mut run: Run,
    tmpl: Templates,
    faults: Faults,
    logprobs: bool,
    agents: Vec<Option<AgentPlan>>,
) -> NonStream {
    let n = run.gen.n() as usize;
    if agents.iter().flatten().any(|a| a.tool.is_some()) {
        run.gen.no_eos();
    }
    let mut messages: Vec<Option<MessageAgent>> = (0..n)
        .map(|i| agents.get(i).and_then(Option::as_ref).map(message_of))
        .collect();
    let mut calls_done: Vec<u32> = Vec::new();
    let permit = match run.enqueue().await {
        Ok(p) => p,
        Err(_) => return NonStream::Error(ApiError::injected(503)),
    };
    let stall = Duration::from_millis(faults.stall_first_ms.unwrap_or(0));
    let prefill = run.admitted(permit, stall);
    sleep(prefill).await;
    let mut texts = vec![String::new(); n];
    let mut lps: Vec<Vec<_>> = vec![Vec::new(); n];
    loop {
        let steps = run.steps_done();
        if faults.error_after == Some(steps) {
            run.finish(true);
            return NonStream::Error(ApiError::injected(500));
        }
        if let Some(end) = faults.finish.filter(|f| f.after == steps) {
            // The engine gives up: the body has the text so far and that finish_reason.
            for i in 0..n as u32 {
                run.gen.end_early(i, end.reason.finish());
            }
            break;
        }
        run.step(|i, t| {
            lps[i as usize].extend(t.logprobs);
            let plan = agents.get(i as usize).and_then(Option::as_ref);
            let (Some(plan), Some(m)) = (plan, messages[i as usize].as_mut()) else {
                texts[i as usize].push_str(t.text.as_str());
                return;
            };
            match plan.part(t.count - 1) {
                Part::Content => texts[i as usize].push_str(t.text.as_str()),
                Part::Reasoning => m.reasoning.push_str(t.text.as_str()),
                // The call's opening token carries no text (vLLM's structural tag).
                Part::ToolOpen => {}
                Part::ToolArgs { fragment, last } => {
                    if let Some(c) = m.call.as_mut() {
                        c.arguments.push_str(fragment);
                    }
                    // The last fragment ends the choice (unless the engine's own limit ended
                    // it on this very token).
                    if last && t.finish.is_none() {
                        calls_done.push(i);
                    }
                }
            }
        });
        for i in calls_done.drain(..) {
            if let Some(tool) = agents
                .get(i as usize)
                .and_then(Option::as_ref)
                .and_then(|p| p.tool.as_ref())
            {
                run.gen.end_early(i, tool.finish.clone());
            }
        }
        if run.gen.all_finished() {
            break;
        }
        let stall = Duration::from_millis(faults.stall_every_ms.unwrap_or(0));
        let d = run.step_time(stall);
        if d.is_zero() {
            // Let other requests run on a busy runtime.
            if steps % 64 == 63 {
                tokio::task::yield_now().await;
            }
        } else {
            sleep(d).await;
        }
    }
    let choices: Vec<ChoiceResult> = texts
        .into_iter()
        .zip(lps)
        .zip(messages)
        .enumerate()
        .map(|(i, ((text, lp), mut agent))| {
            let tokens = run.gen.tokens(i as u32);
            if let (Some(a), Some(plan)) = (agent.as_mut(), agents.get(i).and_then(Option::as_ref))
            {
                a.reasoning_tokens = (plan.reasoning > 0).then(|| plan.reasoning.min(tokens));
                // A call whose opening token was never generated is no call.
                if tokens <= plan.reasoning {
                    a.call = None;
                }
            }
            ChoiceResult {
                text,
                tokens,
                finish: run.gen.finish(i as u32).cloned().unwrap_or(Finish::Length),
                logprobs: logprobs.then_some(lp),
                agent,
            }
        })
        .collect();
    let mut tmpl = tmpl;
    let tokens = choices.iter().map(|c| c.tokens).sum();
    tmpl.set_engine_metrics(PerRequestMetrics::new(&run.times(), tokens));
    tmpl.set_prompt_details(run.prompt_details());
    if tmpl.reports_timings() {
        let t = crate::personality::timings::llamacpp_timings(
            &run.times(),
            tmpl.prompt_tokens(),
            run.cached_tokens(),
            tokens,
        );
        tmpl.set_timings(t);
    }
    let body = Bytes::from(tmpl.json_body(&choices));
    if faults.truncate_after.is_some() {
        // Count it as an abort, as a real cut connection would be.
        drop(run);
        let cut = body.len() / 2;
        return NonStream::Truncated {
            full_len: body.len(),
            prefix: body.slice(..cut),
        };
    }
    run.finish(false);
    if faults.malformed_after.is_some() {
        return NonStream::Malformed(body.slice(..body.len() - 1));
    }
    NonStream::Json(body)
}

/// The message parts a plan starts with: no reasoning text yet, its call with no arguments.
fn message_of(plan: &AgentPlan) -> MessageAgent {
    MessageAgent {
        reasoning: String::new(),
        reasoning_tokens: None,
        call: plan.tool.as_ref().map(|t| MessageCall {
            id: t.id.clone(),
            name: t.name.clone(),
            arguments: String::new(),
            forced: t.forced,
        }),
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
