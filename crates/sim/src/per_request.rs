//! The engine's own timings of one request, as vLLM 0.32 reports them with
//! `--enable-per-request-metrics` (`build_per_request_timing_metrics`): queue time (queued to
//! scheduled), time to first token counted from scheduling (so without the queue), generation
//! time (first to last token), mean inter-token latency over the request's tokens, and tokens
//! per second over scheduling to the last token. Each value is absent when a timestamp it
//! needs is missing (a request cut before its first token) or, for the mean ITL, with fewer
//! than two tokens.

use tokio::time::Instant;

/// When the engine queued, scheduled, and produced the first and last token of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineTimes {
    pub queued: Instant,
    pub scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
}

/// The `metrics` object's values, milliseconds (tokens per second for the last).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PerRequestMetrics {
    pub time_to_first_token_ms: Option<f64>,
    pub generation_time_ms: Option<f64>,
    pub queue_time_ms: Option<f64>,
    pub mean_itl_ms: Option<f64>,
    pub tokens_per_second: Option<f64>,
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

impl PerRequestMetrics {
    /// `tokens`: the request's generated tokens (one choice: vLLM suppresses the metrics for
    /// `n > 1`, whose timings belong to one child only).
    pub fn new(t: &EngineTimes, tokens: u64) -> Self {
        let span = |a: Option<Instant>, b: Option<Instant>| Some(ms(a?, b?));
        let generation = span(t.first_token, t.last_token);
        let inference = span(t.scheduled, t.last_token);
        PerRequestMetrics {
            time_to_first_token_ms: span(t.scheduled, t.first_token),
            generation_time_ms: generation,
            queue_time_ms: t.scheduled.map(|s| ms(t.queued, s)),
            mean_itl_ms: generation
                .filter(|_| tokens > 1)
                .map(|g| g / (tokens - 1) as f64),
            tokens_per_second: inference
                .filter(|i| *i > 0.0)
                .map(|i| tokens as f64 / i * 1000.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn values_follow_vllms_definitions() {
        let q = Instant::now();
        let at = |ms: u64| Some(q + Duration::from_millis(ms));
        let full = EngineTimes {
            queued: q,
            scheduled: at(30),
            first_token: at(50),
            last_token: at(130),
        };
        let cases: Vec<(EngineTimes, u64, PerRequestMetrics)> = vec![
            (
                full,
                5,
                PerRequestMetrics {
                    time_to_first_token_ms: Some(20.0),
                    generation_time_ms: Some(80.0),
                    queue_time_ms: Some(30.0),
                    mean_itl_ms: Some(20.0),
                    tokens_per_second: Some(50.0),
                },
            ),
            // One token: no mean ITL.
            (
                EngineTimes {
                    last_token: at(50),
                    ..full
                },
                1,
                PerRequestMetrics {
                    time_to_first_token_ms: Some(20.0),
                    generation_time_ms: Some(0.0),
                    queue_time_ms: Some(30.0),
                    mean_itl_ms: None,
                    tokens_per_second: Some(50.0),
                },
            ),
            // Cut while queued: nothing but what the timestamps allow.
            (
                EngineTimes {
                    scheduled: None,
                    first_token: None,
                    last_token: None,
                    ..full
                },
                0,
                PerRequestMetrics::default(),
            ),
            // All at once (a zero-cost engine): no rate over a zero span.
            (
                EngineTimes {
                    queued: q,
                    scheduled: Some(q),
                    first_token: Some(q),
                    last_token: Some(q),
                },
                3,
                PerRequestMetrics {
                    time_to_first_token_ms: Some(0.0),
                    generation_time_ms: Some(0.0),
                    queue_time_ms: Some(0.0),
                    mean_itl_ms: Some(0.0),
                    tokens_per_second: None,
                },
            ),
        ];
        for (times, tokens, want) in cases {
            assert_eq!(PerRequestMetrics::new(&times, tokens), want, "{times:?}");
        }
    }
}
