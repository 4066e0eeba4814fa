//! llama.cpp's prompt-processing progress: with `"stream": true` and `"return_progress": true`,
//! llama-server (0c1e570; the same at 00efb3e) sends chunks before the first token that carry a
//! `prompt_progress` object (`result_prompt_progress::to_json`: `total`, `cache`, `processed`,
//! `time_ms`) and no output: one when the slot takes the task (`processed` = the cached
//! prefix), then one after each batch of the prompt is decoded (`update_slots`, progress sent
//! for every slot still processing its prompt), the last one with `processed` = `total`, just
//! before the first token. A chat progress chunk is a role delta with `"content":null`
//! (`to_json_oaicompat_chat`: `first || is_progress`); a completions one has `"text":""`.
//! `time_ms` counts from the slot taking the task, in whole milliseconds.
//!
//! The simulator decodes the prompt in batches of llama-server's default `n_batch` (2048
//! tokens), its prefill time split evenly over them.

use std::time::Duration;

use bytes::BytesMut;
use tokio::time::Instant;

use crate::render::Templates;
use crate::request::Api;

/// llama-server's default logical batch (`-b`, `n_batch`).
pub const N_BATCH: u64 = 2048;

/// Whether a request body asks for progress: llama-server reads `return_progress` as a JSON
/// boolean (`json_value(data, "return_progress", false)`: anything else is the default).
pub fn asked(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("return_progress")?.as_bool())
        .unwrap_or(false)
}

/// The progress of one streamed request's prompt.
#[derive(Debug)]
pub struct Progress {
    total: u64,
    cache: u64,
    processed: u64,
    started: Instant,
    /// Prefill time per batch.
    per_batch: Duration,
}

impl Progress {
    /// The slot took the task: `total` prompt tokens, `cache` of them cached, `prefill` to
    /// decode the rest. Writes the first chunk (0 % of the uncached part) into `buf` and
    /// returns the time to the end of the first batch (`None`: nothing left to decode, the
    /// last chunk is written too).
    pub fn start(
        tmpl: &Templates,
        buf: &mut BytesMut,
        total: u64,
        cache: u64,
        prefill: Duration,
    ) -> (Progress, Option<Duration>) {
        let cache = cache.min(total);
        let batches = (total - cache).div_ceil(N_BATCH).max(1);
        let mut p = Progress {
            total,
            cache,
            processed: cache,
            started: Instant::now(),
            per_batch: prefill / batches as u32,
        };
        p.chunk(tmpl, buf);
        if prefill.is_zero() {
            p.processed = total;
            p.chunk(tmpl, buf);
            return (p, None);
        }
        let first = p.per_batch;
        (p, Some(first))
    }

    /// A batch was decoded: writes its chunk; returns the time to the end of the next batch,
    /// `None` once the prompt is done (the first token comes next).
    pub fn batch_done(&mut self, tmpl: &Templates, buf: &mut BytesMut) -> Option<Duration> {
        self.processed = (self.processed + N_BATCH).min(self.total);
        self.chunk(tmpl, buf);
        (self.processed < self.total).then_some(self.per_batch)
    }

    /// One progress chunk, shaped as the simulator's other chunks (the choice as
    /// llama-server writes it, then `prompt_progress`).
    fn chunk(&self, tmpl: &Templates, buf: &mut BytesMut) {
        let choice: &[u8] = match tmpl.api() {
            Api::Chat => {
                b"{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}"
            }
            Api::Completions => {
                b"{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}"
            }
        };
        let ms = self.started.elapsed().as_millis();
        buf.extend_from_slice(tmpl.head());
        buf.extend_from_slice(choice);
        buf.extend_from_slice(
            format!(
                "],\"prompt_progress\":{{\"total\":{},\"cache\":{},\"processed\":{},\"time_ms\":{ms}}}}}\n\n",
                self.total, self.cache, self.processed
            )
            .as_bytes(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_progress_is_a_json_boolean() {
        for (body, want) in [
            (r#"{"return_progress":true}"#, true),
            (r#"{"return_progress":false}"#, false),
            (r#"{"return_progress":"true"}"#, false),
            (r#"{"return_progress":1}"#, false),
            (r#"{}"#, false),
            ("not json", false),
        ] {
            assert_eq!(asked(body.as_bytes()), want, "{body}");
        }
    }
}
