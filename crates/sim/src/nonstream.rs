//! Non-streaming responses: the same engine run, collected into one JSON body. The response
//! future is dropped when the client goes away, which drops the run and frees its slots.

use std::time::Duration;

use bytes::Bytes;

use super::engine::Run;
use super::errors::ApiError;
use super::faults::Faults;
use super::render::{ChoiceResult, Finish, Templates};

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

pub async fn run(mut run: Run, tmpl: Templates, faults: Faults, logprobs: bool) -> NonStream {
    let n = run.gen.n() as usize;
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
            texts[i as usize].push_str(t.text.as_str());
            lps[i as usize].extend(t.logprobs);
        });
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
        .enumerate()
        .map(|(i, (text, lp))| ChoiceResult {
            text,
            tokens: run.gen.tokens(i as u32),
            finish: run.gen.finish(i as u32).cloned().unwrap_or(Finish::Length),
            logprobs: logprobs.then_some(lp),
        })
        .collect();
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

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
