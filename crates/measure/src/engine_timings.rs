//! llama.cpp's own per-request timings: the `timings` object `llama-server` puts on the last
//! chunk of a stream (and on a JSON answer), its prefill / decode split measured inside the
//! engine. Read with the cursor of [`crate::scan`], so the inspection pass that meets the
//! `timings` key can read it in place ([`read_llamacpp_timings`]); plain values out.
//!
//! `prompt_ms` runs from the slot taking the task to the first token (it comes from the
//! prompt's last batch): the engine's time to first token after admission. `predicted_ms` runs
//! from the first to the last token, over `predicted_n - 1` decode steps (`server_slot_stats`
//! in `tools/server/server-common.h` at llama.cpp 0c1e570). llama.cpp reports no queue time (a
//! task deferred for want of a slot is not timed) and no scheduling instant.
//!
//! [`TimingsReport`] is what the meter takes from it: the engine's view (TTFT, decode, mean
//! ITL, cached prompt tokens, as vLLM's per-request `metrics` say them) and the token counts:
//! `predicted_n` is the counter llama-server's `usage.completion_tokens` reports (`n_decoded`,
//! `slot.stats.n_gen`), and `cache_n + prompt_n` its `usage.prompt_tokens`, so a stream with
//! `timings` and no usage chunk is counted exactly.

use crate::engine::{from_ms, EngineView};
use crate::scan::{Cursor, Scan};

/// `timings` as `llama-server` writes it (`server_slot_stats::to_json`); a missing or
/// non-numeric field reads as `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LlamaTimings {
    /// Prompt tokens reused from the cache.
    pub cache_n: Option<u64>,
    /// Prompt tokens computed.
    pub prompt_n: Option<u64>,
    /// Prefill time, ms: slot start to the prompt's last batch.
    pub prompt_ms: Option<f64>,
    /// Tokens generated.
    pub predicted_n: Option<u64>,
    /// Generation time, ms: first to last token.
    pub predicted_ms: Option<f64>,
    /// Mean time per generated token after the first, ms.
    pub predicted_per_token_ms: Option<f64>,
}

impl LlamaTimings {
    /// Nothing was read (no known field).
    pub fn is_empty(&self) -> bool {
        *self == LlamaTimings::default()
    }

    /// What the meter takes from these timings (see the module docs); `None` when empty.
    pub fn report(&self) -> Option<TimingsReport> {
        if self.is_empty() {
            return None;
        }
        let ms = |v: Option<f64>| v.and_then(from_ms);
        // vLLM's mean ITL: decode time over the gaps between tokens (llama.cpp 0c1e570's
        // `predicted_per_token_ms` is the same; older builds divided by every token).
        let mean_itl = match (self.predicted_ms, self.predicted_n) {
            (Some(d), Some(n)) if n >= 2 => from_ms(d / (n - 1) as f64),
            _ => None,
        };
        Some(TimingsReport {
            view: EngineView {
                queue: None,
                ttft: ms(self.prompt_ms),
                decode: ms(self.predicted_ms),
                mean_itl,
                cached_prompt_tokens: self.cache_n,
            },
            completion_tokens: self.predicted_n,
            prompt_tokens: self.cache_n.zip(self.prompt_n).map(|(c, p)| c + p),
        })
    }
}

/// llama.cpp's `timings` in the meter's terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimingsReport {
    /// The engine's view: TTFT (`prompt_ms`), decode (`predicted_ms`), mean ITL, cached
    /// prompt tokens (`cache_n`); no queue time.
    pub view: EngineView,
    /// Output tokens (`predicted_n`): exact.
    pub completion_tokens: Option<u64>,
    /// Prompt tokens (`cache_n + prompt_n`).
    pub prompt_tokens: Option<u64>,
}

/// Reads the `timings` value at the cursor (an object); other shapes are skipped and read as
/// empty timings, as unknown fields are.
pub fn read_llamacpp_timings(c: &mut Cursor<'_>) -> Scan<LlamaTimings> {
    let mut t = LlamaTimings::default();
    let read = c.read_or_skip(|c| {
        c.object(|c, key| {
            let uint = |c: &mut Cursor<'_>| c.read_or_skip(Cursor::uint).map(Result::ok);
            let float = |c: &mut Cursor<'_>| {
                c.read_or_skip(Cursor::float)
                    .map(|v| v.ok().filter(|f| f.is_finite() && *f >= 0.0))
            };
            match key.one_of(&[
                b"cache_n",
                b"prompt_n",
                b"prompt_ms",
                b"predicted_n",
                b"predicted_ms",
                b"predicted_per_token_ms",
            ]) {
                Some(0) => t.cache_n = uint(c)?,
                Some(1) => t.prompt_n = uint(c)?,
                Some(2) => t.prompt_ms = float(c)?,
                Some(3) => t.predicted_n = uint(c)?,
                Some(4) => t.predicted_ms = float(c)?,
                Some(5) => t.predicted_per_token_ms = float(c)?,
                _ => c.skip()?,
            }
            Ok(())
        })
    })?;
    Ok(if read.is_ok() {
        t
    } else {
        LlamaTimings::default()
    })
}

/// The `timings` of one chunk or JSON body (a top-level key), `None` when it has none or is
/// not a JSON object. A pass of its own: for callers outside the meter's inspection pass.
pub fn llamacpp_timings(payload: &[u8]) -> Option<LlamaTimings> {
    let mut c = Cursor::new(payload);
    let mut found = None;
    c.object(|c, key| {
        if key.is(b"timings") {
            found = Some(read_llamacpp_timings(c)?);
            Ok(())
        } else {
            c.skip()
        }
    })
    .ok()?;
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_of_chunks() {
        let real = r#"{"choices":[],"created":1796198037,"id":"chatcmpl-B","model":"tiny","object":"chat.completion.chunk","usage":{"completion_tokens":5,"prompt_tokens":63,"total_tokens":68},"timings":{"cache_n":0,"prompt_n":63,"prompt_ms":1.546,"prompt_per_token_ms":0.024539682539682542,"prompt_per_second":40750.3234152652,"predicted_n":5,"predicted_ms":0.342,"predicted_per_token_ms":0.0855,"predicted_per_second":11695.906432748538}}"#;
        let cases: &[(&str, Option<LlamaTimings>)] = &[
            (
                real,
                Some(LlamaTimings {
                    cache_n: Some(0),
                    prompt_n: Some(63),
                    prompt_ms: Some(1.546),
                    predicted_n: Some(5),
                    predicted_ms: Some(0.342),
                    predicted_per_token_ms: Some(0.0855),
                }),
            ),
            // no timings: a chunk before the last
            (r#"{"choices":[{"index":0,"delta":{"content":"b"}}]}"#, None),
            // odd values read as absent, unknown keys skipped, the rest kept
            (
                r#"{"timings":{"cache_n":-1,"prompt_ms":"x","predicted_n":3,"draft_n":2}}"#,
                Some(LlamaTimings {
                    predicted_n: Some(3),
                    ..LlamaTimings::default()
                }),
            ),
            // not an object
            (r#"{"timings":[1,2]}"#, Some(LlamaTimings::default())),
            ("not json", None),
            (r#"{"timings":{"prompt_ms":1"#, None),
        ];
        for (payload, want) in cases {
            assert_eq!(llamacpp_timings(payload.as_bytes()), *want, "{payload}");
        }
        assert!(LlamaTimings::default().is_empty());
    }

    #[test]
    fn reports_of_timings() {
        let ms = |v: u64| Some(std::time::Duration::from_micros(v));
        let full = LlamaTimings {
            cache_n: Some(62),
            prompt_n: Some(1),
            prompt_ms: Some(0.242),
            predicted_n: Some(5),
            predicted_ms: Some(0.31),
            predicted_per_token_ms: Some(0.0775),
        };
        let cases: Vec<(LlamaTimings, Option<TimingsReport>)> = vec![
            // The real capture (stream-chat-usage.txt): usage said 63 prompt, 5 completion,
            // 62 cached.
            (
                full,
                Some(TimingsReport {
                    view: EngineView {
                        queue: None,
                        ttft: ms(242),
                        decode: ms(310),
                        mean_itl: Some(std::time::Duration::from_nanos(77_500)),
                        cached_prompt_tokens: Some(62),
                    },
                    completion_tokens: Some(5),
                    prompt_tokens: Some(63),
                }),
            ),
            // One token: no gap, no mean ITL.
            (
                LlamaTimings {
                    predicted_n: Some(1),
                    predicted_ms: Some(0.001),
                    ..LlamaTimings::default()
                },
                Some(TimingsReport {
                    view: EngineView {
                        decode: ms(1),
                        ..EngineView::default()
                    },
                    completion_tokens: Some(1),
                    prompt_tokens: None,
                }),
            ),
            // A prompt count without the cache count: no prompt total.
            (
                LlamaTimings {
                    prompt_n: Some(3),
                    ..LlamaTimings::default()
                },
                Some(TimingsReport::default()),
            ),
            (LlamaTimings::default(), None),
        ];
        for (t, want) in cases {
            assert_eq!(t.report(), want, "{t:?}");
        }
    }
}
