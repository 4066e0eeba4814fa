//! The engine's own view of one request, and the TTFT split it allows.
//!
//! Engines that report timings per request say where the request spent its time inside the
//! engine: vLLM 0.32 started with `--enable-per-request-metrics` puts `"metrics":{
//! "queue_time_ms","time_to_first_token_ms","generation_time_ms","mean_itl_ms",...}` on the
//! final usage chunk of a stream (only when a usage chunk is sent, only for `n = 1`) and on the
//! JSON body, and with `--enable-prompt-tokens-details` its usage carries
//! `prompt_tokens_details.cached_tokens`; llama.cpp sends `timings` (its TTFT from the slot
//! taking the task, decode time, cached prompt tokens; no queue time: see `engine_timings`).
//! [`EngineView`] is that view whatever the engine said it in; the meter fills it from the
//! chunk it saw (the injected usage chunk the client never gets included).
//!
//! [`TtftSplit`]: the client's TTFT is the sum of `proxy` (t0 to the request handed to the
//! upstream connection), `queue` (the engine's queue time), `prefill` (the engine's TTFT, counted from
//! scheduling) and `rest` (network, the engine's HTTP front end, tokenization,
//! detokenization, the way back): what no engine histogram shows. The parts add up to the TTFT exactly, in whole
//! nanoseconds. The engine's clock is not the proxy's: when its parts exceed what is left of
//! the client's TTFT, they are cut to fit (queue first, then prefill), `rest` is 0, and
//! `clamped` says so; no part is ever negative. An engine that reports its TTFT but no queue
//! time (llama.cpp: a task waiting for a free slot is not timed) gets a split whose `queue` is
//! `None`: its wait, if any, is in `rest`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the engine reported about one request (each `None` when it did not say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineView {
    /// Queued to scheduled (vLLM `queue_time_ms`).
    #[serde(rename = "engine_queue_s", with = "crate::seconds::opt", default)]
    pub queue: Option<Duration>,
    /// Scheduled to the first token (vLLM `time_to_first_token_ms`: without the queue).
    #[serde(rename = "engine_ttft_s", with = "crate::seconds::opt", default)]
    pub ttft: Option<Duration>,
    /// First to last token (vLLM `generation_time_ms`).
    #[serde(rename = "engine_decode_s", with = "crate::seconds::opt", default)]
    pub decode: Option<Duration>,
    /// Decode time over the tokens after the first (vLLM `mean_itl_ms`).
    #[serde(rename = "engine_mean_itl_s", with = "crate::seconds::opt", default)]
    pub mean_itl: Option<Duration>,
    /// Prompt tokens served from the prefix cache (`prompt_tokens_details.cached_tokens`).
    #[serde(default)]
    pub cached_prompt_tokens: Option<u64>,
}

/// A duration from an engine's milliseconds: finite and not negative, else none (whole
/// nanoseconds, rounded).
pub fn from_ms(ms: f64) -> Option<Duration> {
    (ms.is_finite() && ms >= 0.0).then(|| Duration::from_nanos((ms * 1e6).round() as u64))
}

impl EngineView {
    /// The engine said nothing.
    pub fn is_empty(&self) -> bool {
        *self == EngineView::default()
    }

    /// A later report: each field it has replaces the one before (with continuous usage the
    /// last chunk's word is the final one).
    pub fn update(&mut self, later: &EngineView) {
        let keep = |a: &mut Option<Duration>, b: Option<Duration>| {
            if b.is_some() {
                *a = b;
            }
        };
        keep(&mut self.queue, later.queue);
        keep(&mut self.ttft, later.ttft);
        keep(&mut self.decode, later.decode);
        keep(&mut self.mean_itl, later.mean_itl);
        if later.cached_prompt_tokens.is_some() {
            self.cached_prompt_tokens = later.cached_prompt_tokens;
        }
    }
}

/// What a record keeps of the engine's report: its view and the TTFT split it allowed, and the
/// stream's stalls (boxed in the record: most requests of most engines carry none of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineReport {
    #[serde(flatten)]
    pub view: EngineView,
    #[serde(flatten)]
    pub split: TtftSplit,
    /// Gaps between the stream's output events longer than the stall threshold.
    #[serde(default)]
    pub stalls: u32,
}

/// Where a request's TTFT went (see the module docs); all `None` when it cannot be split: no
/// client TTFT, or the engine did not report its TTFT. `queue` is `None` also when the engine
/// reports no queue time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtftSplit {
    #[serde(rename = "ttft_proxy_s", with = "crate::seconds::opt", default)]
    pub proxy: Option<Duration>,
    #[serde(rename = "ttft_queue_s", with = "crate::seconds::opt", default)]
    pub queue: Option<Duration>,
    #[serde(rename = "ttft_prefill_s", with = "crate::seconds::opt", default)]
    pub prefill: Option<Duration>,
    #[serde(rename = "ttft_rest_s", with = "crate::seconds::opt", default)]
    pub rest: Option<Duration>,
    /// The engine's parts exceeded what the client saw (two processes' clocks): they were cut
    /// to fit and `rest` is 0.
    #[serde(rename = "ttft_split_clamped", default)]
    pub clamped: bool,
}

impl TtftSplit {
    /// The split of `client_ttft`, given the proxy's own time before forwarding and what the
    /// engine reported.
    pub fn of(client_ttft: Option<Duration>, proxy: Option<Duration>, e: &EngineView) -> Self {
        let (Some(ttft), Some(prefill)) = (client_ttft, e.ttft) else {
            return TtftSplit::default();
        };
        let proxy = proxy.unwrap_or_default();
        let mut left = ttft;
        let mut clamped = false;
        let mut take = |part: Duration| {
            let got = part.min(left);
            clamped |= got < part;
            left -= got;
            got
        };
        let (proxy, queue, prefill) = (take(proxy), e.queue.map(&mut take), take(prefill));
        TtftSplit {
            proxy: Some(proxy),
            queue,
            prefill: Some(prefill),
            rest: Some(left),
            clamped,
        }
    }

    /// The four parts, when the TTFT was split and the engine reported its queue time.
    pub fn parts(&self) -> Option<[Duration; 4]> {
        Some([self.proxy?, self.queue?, self.prefill?, self.rest?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn view(queue: Option<u64>, ttft: Option<u64>) -> EngineView {
        EngineView {
            queue: queue.map(ms),
            ttft: ttft.map(ms),
            ..EngineView::default()
        }
    }

    #[test]
    fn the_parts_add_up_to_the_client_ttft() {
        // (client TTFT, proxy, engine queue, engine TTFT) -> (proxy, queue, prefill, rest, clamped)
        type Row = (Option<u64>, Option<u64>, EngineView, Option<[u64; 4]>, bool);
        let table: Vec<Row> = vec![
            // The usual case: rest is what no engine histogram shows.
            (
                Some(100),
                Some(2),
                view(Some(30), Some(50)),
                Some([2, 30, 50, 18]),
                false,
            ),
            // Exactly used up: rest 0, nothing cut.
            (
                Some(82),
                Some(2),
                view(Some(30), Some(50)),
                Some([2, 30, 50, 0]),
                false,
            ),
            // Skew: the engine's parts exceed what is left; prefill is cut, rest 0, flagged.
            (
                Some(60),
                Some(2),
                view(Some(30), Some(50)),
                Some([2, 30, 28, 0]),
                true,
            ),
            // Worse skew: the queue alone exceeds it.
            (
                Some(20),
                Some(2),
                view(Some(30), Some(50)),
                Some([2, 18, 0, 0]),
                true,
            ),
            // The proxy's own time alone exceeds it (a TTFT shorter than forwarding: cut too).
            (
                Some(1),
                Some(2),
                view(Some(0), Some(0)),
                Some([1, 0, 0, 0]),
                true,
            ),
            // No proxy time known: counted as 0.
            (
                Some(100),
                None,
                view(Some(30), Some(50)),
                Some([0, 30, 50, 20]),
                false,
            ),
            // Missing engine fields: no split of four (without a queue time, see below).
            (Some(100), Some(2), view(None, Some(50)), None, false),
            (Some(100), Some(2), view(Some(30), None), None, false),
            (Some(100), Some(2), EngineView::default(), None, false),
            // No client TTFT (a JSON answer, or no output token): no split.
            (None, Some(2), view(Some(30), Some(50)), None, false),
        ];
        for (ttft, proxy, engine, want, clamped) in table {
            let s = TtftSplit::of(ttft.map(ms), proxy.map(ms), &engine);
            assert_eq!(
                s.parts(),
                want.map(|w| w.map(ms)),
                "{ttft:?} {proxy:?} {engine:?}"
            );
            assert_eq!(s.clamped, clamped, "{ttft:?} {proxy:?} {engine:?}");
            if let (Some(p), Some(t)) = (s.parts(), ttft) {
                assert_eq!(p.iter().sum::<Duration>(), ms(t), "exact sum");
            }
        }
    }

    #[test]
    fn an_engine_without_a_queue_time_splits_in_three() {
        // (client TTFT, proxy, engine TTFT) -> (proxy, prefill, rest, clamped); llama.cpp.
        let table = [
            (100, 2, 50, [2, 50, 48], false),
            (52, 2, 50, [2, 50, 0], false),
            (40, 2, 50, [2, 38, 0], true),
        ];
        for (ttft, proxy, prefill, want, clamped) in table {
            let s = TtftSplit::of(Some(ms(ttft)), Some(ms(proxy)), &view(None, Some(prefill)));
            assert_eq!(
                [s.proxy, s.prefill, s.rest],
                want.map(|w| Some(ms(w))),
                "{ttft} {proxy} {prefill}"
            );
            assert_eq!((s.queue, s.clamped, s.parts()), (None, clamped, None));
        }
        // No engine TTFT: nothing.
        let s = TtftSplit::of(Some(ms(100)), Some(ms(2)), &view(Some(30), None));
        assert_eq!(s, TtftSplit::default());
    }

    #[test]
    fn sums_are_exact_in_nanoseconds_with_engine_floats() {
        let e = EngineView {
            queue: from_ms(0.02717400002438808),
            ttft: from_ms(4.278464999970311),
            ..EngineView::default()
        };
        let client = Duration::from_nanos(7_123_457);
        let s = TtftSplit::of(Some(client), Some(Duration::from_nanos(81_001)), &e);
        let p = s.parts().unwrap();
        assert_eq!(p.iter().sum::<Duration>(), client);
        assert_eq!(p[1], Duration::from_nanos(27_174));
        assert_eq!(p[2], Duration::from_nanos(4_278_465));
        assert!(!s.clamped);
    }

    #[test]
    fn milliseconds_from_an_engine_are_checked() {
        assert_eq!(from_ms(1.5), Some(Duration::from_micros(1500)));
        assert_eq!(from_ms(0.0), Some(Duration::ZERO));
        assert_eq!(from_ms(-0.001), None);
        assert_eq!(from_ms(f64::NAN), None);
        assert_eq!(from_ms(f64::INFINITY), None);
    }

    #[test]
    fn a_later_report_replaces_field_by_field() {
        let mut v = EngineView {
            queue: Some(ms(1)),
            cached_prompt_tokens: Some(16),
            ..EngineView::default()
        };
        v.update(&EngineView {
            ttft: Some(ms(2)),
            cached_prompt_tokens: Some(32),
            ..EngineView::default()
        });
        assert_eq!(
            v,
            EngineView {
                queue: Some(ms(1)),
                ttft: Some(ms(2)),
                cached_prompt_tokens: Some(32),
                ..EngineView::default()
            }
        );
        assert!(EngineView::default().is_empty() && !v.is_empty());
    }
}
