//! llama.cpp's `timings` object, as `llama-server` (0c1e570) writes it at the end of a request
//! (`server_slot_stats::to_json`, `tools/server/server-common.cpp`): on the usage chunk when the
//! stream ends with one, else on the finish chunk (`to_json_oaicompat_chat_stream`), and on a
//! JSON answer. Its clocks are the slot's: `prompt_ms` from the slot taking the task to the
//! first token, `predicted_ms` from the first to the last token; a task that waited for a slot
//! is not timed before it got one.

use crate::metrics::py_float;
use crate::per_request::EngineTimes;

fn ms(from: Option<tokio::time::Instant>, to: Option<tokio::time::Instant>) -> f64 {
    match (from, to) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64() * 1000.0,
        _ => 0.0,
    }
}

/// The object for a request with `prompt` prompt tokens (`cached` of them from the cache) that
/// generated `generated` tokens, at the engine's instants `t` (the simulator's scheduling is
/// the slot taking the task).
pub fn llamacpp_timings(t: &EngineTimes, prompt: u64, cached: u64, generated: u64) -> String {
    let prompt_n = prompt.saturating_sub(cached);
    let prompt_ms = ms(t.scheduled, t.first_token);
    // The first token comes from the prompt's last batch: `generated - 1` decode steps, and at
    // least 1 us once generation started (`t_gen_us`).
    let steps = generated.saturating_sub(1);
    let predicted_ms = match t.first_token.zip(t.last_token) {
        Some(_) => ms(t.first_token, t.last_token).max(0.001),
        None => 0.0,
    };
    let per = |n: u64, v: f64| if n > 0 { v / n as f64 } else { 0.0 };
    let rate = |n: u64, v: f64| if v > 0.0 { 1e3 / v * n as f64 } else { 0.0 };
    format!(
        "{{\"cache_n\":{cached},\"prompt_n\":{prompt_n},\"prompt_ms\":{},\"prompt_per_token_ms\":{},\"prompt_per_second\":{},\"predicted_n\":{generated},\"predicted_ms\":{},\"predicted_per_token_ms\":{},\"predicted_per_second\":{}}}",
        py_float(prompt_ms),
        py_float(per(prompt_n, prompt_ms)),
        py_float(rate(prompt_n, prompt_ms)),
        py_float(predicted_ms),
        py_float(per(steps, predicted_ms)),
        py_float(rate(steps, predicted_ms)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn shaped_as_the_real_servers() {
        let q = Instant::now();
        let at = |us: u64| Some(q + Duration::from_micros(us));
        let t = EngineTimes {
            queued: q,
            scheduled: at(1000),
            first_token: at(2500),
            last_token: at(2810),
        };
        let got = llamacpp_timings(&t, 63, 62, 5);
        // Keys and order of the capture llamacpp-0c1e570/stream-chat-usage.txt.
        assert_eq!(
            got,
            r#"{"cache_n":62,"prompt_n":1,"prompt_ms":1.5,"prompt_per_token_ms":1.5,"prompt_per_second":666.6666666666666,"predicted_n":5,"predicted_ms":0.31,"predicted_per_token_ms":0.0775,"predicted_per_second":12903.225806451614}"#
        );
        // Cut before the first token: no prompt or generation time yet.
        let cut = EngineTimes {
            first_token: None,
            last_token: None,
            ..t
        };
        assert!(llamacpp_timings(&cut, 4, 0, 0).contains(r#""prompt_ms":0.0,"#));
    }
}
