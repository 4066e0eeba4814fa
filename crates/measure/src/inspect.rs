//! Chunk inspection: what one SSE data payload (or one non-streaming JSON body) says about
//! output, finish and usage. Borrowed serde structs that read only the fields needed; strings
//! are looked at as raw JSON (`&RawValue`) so nothing is unescaped or allocated per chunk.

use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::outcome::FinishReason;

/// Choices kept per chunk. vLLM and OpenAI send one choice per streamed chunk; a chunk with
/// more keeps the first ones here and counts all of them in [`ChunkInfo::choice_count`].
pub const MAX_CHOICES_PER_CHUNK: usize = 16;

/// What one choice entry of a chunk carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoiceInfo {
    pub index: u32,
    /// Non-empty `delta.content` / `delta.reasoning_content` / `delta.reasoning` /
    /// `delta.tool_calls`, or `text` (completions).
    pub output: bool,
    /// Tokens this choice carries: `logprobs.content` (or legacy `logprobs.tokens`) entries when
    /// present, else 1 when it carries output.
    pub tokens: u32,
    pub finish: Option<FinishReason>,
}

/// What kind of payload an SSE data event was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkKind {
    /// `[DONE]`.
    Done,
    /// A completion chunk (chat or text).
    Chunk,
    /// An in-band error object (`{"error":{...}}` or `{"object":"error",...}`).
    Error,
    /// Not JSON, or JSON of no known shape.
    Unknown,
}

/// `usage` as reported by the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

/// The summary of one SSE data payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub kind: ChunkKind,
    /// Number of entries in `choices` (all of them, even past [`MAX_CHOICES_PER_CHUNK`]).
    pub choice_count: u32,
    /// Number of choices with a non-null `finish_reason`.
    pub finished_count: u32,
    /// Any choice carries output.
    pub output: bool,
    /// Sum of [`ChoiceInfo::tokens`] over the choices.
    pub tokens: u32,
    pub usage: Option<Usage>,
    choices: [ChoiceInfo; MAX_CHOICES_PER_CHUNK],
    kept: u8,
}

impl ChunkInfo {
    fn of_kind(kind: ChunkKind) -> Self {
        Self {
            kind,
            choice_count: 0,
            finished_count: 0,
            output: false,
            tokens: 0,
            usage: None,
            choices: [ChoiceInfo::default(); MAX_CHOICES_PER_CHUNK],
            kept: 0,
        }
    }

    /// The choice entries (at most [`MAX_CHOICES_PER_CHUNK`]).
    pub fn choices(&self) -> &[ChoiceInfo] {
        &self.choices[..self.kept as usize]
    }

    /// The first finish reason in this chunk, if any.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.choices().iter().find_map(|c| c.finish)
    }
}

/// The summary of a non-streaming JSON response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseInfo {
    /// The body was a JSON object.
    pub parsed: bool,
    /// It carried an `error` object.
    pub error: bool,
    pub choice_count: u32,
    pub finished_count: u32,
    /// Choices that finished with `abort` or `error` (the engine gave up on them).
    pub failed_count: u32,
    /// The first choice's finish reason, or the first `abort` / `error` one when a choice has it.
    pub finish_reason: Option<FinishReason>,
    pub usage: Option<Usage>,
}

impl ResponseInfo {
    /// Success by DESIGN.md: `choices` present and every choice has a `finish_reason` other
    /// than `abort` / `error`.
    pub fn is_complete(&self) -> bool {
        self.parsed
            && !self.error
            && self.choice_count > 0
            && self.finished_count == self.choice_count
            && self.failed_count == 0
    }
}

/// Inspect one SSE data payload (the joined `data:` lines, or `[DONE]`).
pub fn inspect_chunk(data: &[u8]) -> ChunkInfo {
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return ChunkInfo::of_kind(ChunkKind::Done);
    }
    let Ok(raw) = serde_json::from_slice::<RawBody<'_>>(data) else {
        return ChunkInfo::of_kind(ChunkKind::Unknown);
    };
    if raw.is_error() {
        return ChunkInfo::of_kind(ChunkKind::Error);
    }
    let mut info = ChunkInfo::of_kind(if raw.choices.is_some() || raw.usage.is_some() {
        ChunkKind::Chunk
    } else {
        ChunkKind::Unknown
    });
    info.usage = raw.usage;
    if let Some(c) = raw.choices {
        info.choice_count = c.total;
        info.finished_count = c.finished;
        info.output = c.output;
        info.tokens = c.tokens;
        info.choices = c.items;
        info.kept = c.kept;
    }
    info
}

/// Inspect a whole non-streaming JSON response body.
pub fn inspect_response(body: &[u8]) -> ResponseInfo {
    let mut info = ResponseInfo {
        parsed: false,
        error: false,
        choice_count: 0,
        finished_count: 0,
        failed_count: 0,
        finish_reason: None,
        usage: None,
    };
    let Ok(raw) = serde_json::from_slice::<RawBody<'_>>(body.trim_ascii()) else {
        return info;
    };
    info.parsed = true;
    info.error = raw.is_error();
    info.usage = raw.usage;
    if let Some(c) = raw.choices {
        info.choice_count = c.total;
        info.finished_count = c.finished;
        info.failed_count = c.failed;
        let kept = &c.items[..c.kept as usize];
        info.finish_reason = kept
            .iter()
            .find_map(|c| c.finish.filter(|f| f.engine_gave_up()))
            .or_else(|| kept.iter().find_map(|c| c.finish));
    }
    info
}

#[derive(Deserialize)]
struct RawBody<'a> {
    #[serde(default)]
    choices: Option<Choices>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
}

impl RawBody<'_> {
    fn is_error(&self) -> bool {
        self.error.is_some() || self.object.is_some_and(|o| o.get() == "\"error\"")
    }
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    delta: Option<RawDelta<'a>>,
    #[serde(default, borrow)]
    text: Option<&'a RawValue>,
    #[serde(default)]
    finish_reason: Option<Finish>,
    #[serde(default)]
    logprobs: Option<RawLogprobs>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    reasoning: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tool_calls: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawLogprobs {
    /// Chat: one entry per token.
    #[serde(default)]
    content: Option<CountSeq>,
    /// Completions (legacy): one entry per token.
    #[serde(default)]
    tokens: Option<CountSeq>,
}

/// A JSON value that carries something: not null, not `""`, not `[]`, not `{}`.
fn non_empty(v: Option<&RawValue>) -> bool {
    v.is_some_and(|v| !matches!(v.get(), "null" | "\"\"" | "[]" | "{}"))
}

impl RawChoice<'_> {
    fn summary(&self) -> ChoiceInfo {
        let output = non_empty(self.text)
            || self.delta.as_ref().is_some_and(|d| {
                non_empty(d.content)
                    || non_empty(d.reasoning_content)
                    || non_empty(d.reasoning)
                    || non_empty(d.tool_calls)
            });
        let logprob_tokens = self
            .logprobs
            .as_ref()
            .and_then(|l| l.content.or(l.tokens))
            .map_or(0, |c| c.0);
        let tokens = if logprob_tokens > 0 {
            logprob_tokens
        } else {
            u32::from(output)
        };
        ChoiceInfo {
            index: self.index,
            output,
            tokens,
            finish: self.finish_reason.map(|f| f.0),
        }
    }
}

/// A sequence, counted without keeping its elements.
#[derive(Clone, Copy)]
struct CountSeq(u32);

impl<'de> Deserialize<'de> for CountSeq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CountSeq;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CountSeq, A::Error> {
                let mut n = 0u32;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n = n.saturating_add(1);
                }
                Ok(CountSeq(n))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A `finish_reason` string folded into [`FinishReason`] without allocating.
#[derive(Clone, Copy)]
struct Finish(FinishReason);

impl<'de> Deserialize<'de> for Finish {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Finish;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a finish reason string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Finish, E> {
                Ok(Finish(FinishReason::parse(v.as_bytes())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The `choices` array folded into a fixed-size summary (no `Vec` per chunk).
struct Choices {
    items: [ChoiceInfo; MAX_CHOICES_PER_CHUNK],
    kept: u8,
    total: u32,
    finished: u32,
    failed: u32,
    output: bool,
    tokens: u32,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Choices;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
                let mut c = Choices {
                    items: [ChoiceInfo::default(); MAX_CHOICES_PER_CHUNK],
                    kept: 0,
                    total: 0,
                    finished: 0,
                    failed: 0,
                    output: false,
                    tokens: 0,
                };
                while let Some(raw) = seq.next_element::<RawChoice<'de>>()? {
                    let s = raw.summary();
                    c.total = c.total.saturating_add(1);
                    c.finished += u32::from(s.finish.is_some());
                    c.failed += u32::from(s.finish.is_some_and(FinishReason::engine_gave_up));
                    c.output |= s.output;
                    c.tokens = c.tokens.saturating_add(s.tokens);
                    if (c.kept as usize) < MAX_CHOICES_PER_CHUNK {
                        c.items[c.kept as usize] = s;
                        c.kept += 1;
                    }
                }
                Ok(c)
            }
        }
        d.deserialize_seq(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::capture;
    use crate::sse::SseParser;
    use FinishReason::*;

    /// (payload, kind, choices, output, tokens, finish, usage (prompt, completion))
    type Case = (
        &'static str,
        ChunkKind,
        u32,
        bool,
        u32,
        Option<FinishReason>,
        Option<(u64, u64)>,
    );

    #[test]
    fn table() {
        use ChunkKind::*;
        let cases: &[Case] = &[
            ("[DONE]", Done, 0, false, 0, None, None),
            (" [DONE]\n", Done, 0, false, 0, None, None),
            (
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
                Chunk,
                1,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"SE"},"finish_reason":null}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":1,"delta":{"content":""},"finish_reason":null}]}"#,
                Chunk,
                1,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"\n"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"think"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}"#,
                Chunk,
                1,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
                Chunk,
                1,
                false,
                0,
                Some(ToolCalls),
                None,
            ),
            (
                r#"{"choices":[{"index":0,"text":"ab","finish_reason":null}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}"#,
                Chunk,
                1,
                false,
                0,
                Some(Stop),
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"abc"},"logprobs":{"content":[{"token":"a"},{"token":"b"},{"token":"c"}]}}]}"#,
                Chunk,
                1,
                true,
                3,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"text":"ab","logprobs":{"text_offset":[0,1],"token_logprobs":[-1,-1],"tokens":["a","b"],"top_logprobs":null}}]}"#,
                Chunk,
                1,
                true,
                2,
                None,
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"},{"index":1,"delta":{"content":"y"},"finish_reason":"stop"}]}"#,
                Chunk,
                2,
                true,
                2,
                Some(Length),
                None,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"weird"}]}"#,
                Chunk,
                1,
                true,
                1,
                Some(Other),
                None,
            ),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":32,"total_tokens":48,"completion_tokens":16}}"#,
                Chunk,
                0,
                false,
                0,
                None,
                Some((32, 16)),
            ),
            (
                r#"{"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}"#,
                Error,
                0,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}"#,
                Error,
                0,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"object":"error","message":"old style","type":"x","code":500}"#,
                Error,
                0,
                false,
                0,
                None,
                None,
            ),
            (
                r#"{"error":null,"choices":[{"index":0,"delta":{"content":"a"}}]}"#,
                Chunk,
                1,
                true,
                1,
                None,
                None,
            ),
            ("{}", Unknown, 0, false, 0, None, None),
            ("[]", Unknown, 0, false, 0, None, None),
            ("not json", Unknown, 0, false, 0, None, None),
            ("\u{1}\u{2}", Unknown, 0, false, 0, None, None),
            (
                r#"{"choices":[{"index":0,"delta":{"content":"a"}}"#,
                Unknown,
                0,
                false,
                0,
                None,
                None,
            ),
            (r#"{"choices":"nope"}"#, Unknown, 0, false, 0, None, None),
        ];
        for (payload, kind, choices, output, tokens, finish, usage) in cases {
            let i = inspect_chunk(payload.as_bytes());
            let got = (
                i.kind,
                i.choice_count,
                i.output,
                i.tokens,
                i.finish_reason(),
                i.usage
                    .map(|u| (u.prompt_tokens.unwrap(), u.completion_tokens.unwrap())),
            );
            assert_eq!(
                got,
                (*kind, *choices, *output, *tokens, *finish, *usage),
                "{payload}"
            );
        }
        assert_eq!(inspect_chunk(b"\xff\xfe{").kind, ChunkKind::Unknown);
    }

    #[test]
    fn choices_beyond_the_kept_ones_are_still_counted() {
        let one = r#"{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}"#;
        let body = format!(r#"{{"choices":[{}]}}"#, vec![one; 40].join(","));
        let i = inspect_chunk(body.as_bytes());
        assert_eq!((i.choice_count, i.finished_count, i.tokens), (40, 40, 40));
        assert_eq!(i.choices().len(), MAX_CHOICES_PER_CHUNK);
    }

    /// Everything a capture's stream says, chunk by chunk.
    fn chunks(name: &str) -> Vec<ChunkInfo> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(capture(name).body, |e| out.push(inspect_chunk(e.data)));
        p.finish(|e| out.push(inspect_chunk(e.data)));
        out
    }

    /// An independent oracle over serde_json::Value: output events per data payload.
    fn oracle_outputs(name: &str) -> usize {
        let body = capture(name).body;
        body.split(|b| *b == b'\n')
            .filter_map(|l| l.strip_prefix(b"data: "))
            .filter(|d| *d != b"[DONE]")
            .map(|d| serde_json::from_slice::<serde_json::Value>(d).unwrap())
            .filter(|v| {
                v["choices"].as_array().unwrap().iter().any(|c| {
                    let s = |x: &serde_json::Value| x.as_str().is_some_and(|s| !s.is_empty());
                    s(&c["delta"]["content"]) || s(&c["text"])
                })
            })
            .count()
    }

    #[test]
    fn real_captures() {
        // (capture, chunks incl. [DONE], output events, tokens, finish, usage)
        type Case = (
            &'static str,
            usize,
            usize,
            u32,
            FinishReason,
            Option<(u64, u64)>,
        );
        let cases: &[Case] = &[
            ("stream-chat.txt", 18, 16, 16, Length, None),
            ("stream-chat-usage.txt", 19, 16, 16, Length, Some((32, 16))),
            (
                "stream-chat-usage-continuous.txt",
                9,
                6,
                6,
                Length,
                Some((15, 6)),
            ),
            ("stream-chat-logprobs.txt", 11, 8, 8, Length, Some((20, 8))),
            ("stream-chat-stop.txt", 4, 1, 1, Stop, Some((15, 1))),
            ("stream-chat-n2.txt", 12, 7, 7, Length, Some((15, 8))),
            ("stream-completions.txt", 18, 16, 16, Length, Some((10, 16))),
            ("stream-completions-logprobs.txt", 5, 4, 4, Length, None),
        ];
        for (name, n, outputs, tokens, finish, usage) in cases {
            let c = chunks(name);
            assert_eq!(c.len(), *n, "{name}: chunks");
            assert_eq!(c.last().unwrap().kind, ChunkKind::Done, "{name}");
            assert!(
                c[..c.len() - 1].iter().all(|i| i.kind == ChunkKind::Chunk),
                "{name}"
            );
            let out = c.iter().filter(|i| i.output).count();
            assert_eq!(out, *outputs, "{name}: outputs");
            assert_eq!(out, oracle_outputs(name), "{name}: oracle");
            assert_eq!(
                c.iter().map(|i| i.tokens).sum::<u32>(),
                *tokens,
                "{name}: tokens"
            );
            let finishes: Vec<_> = c.iter().filter_map(|i| i.finish_reason()).collect();
            assert!(finishes.iter().all(|f| f == finish), "{name}: finish");
            let last_usage = c.iter().rev().find_map(|i| i.usage);
            let got = last_usage.map(|u| (u.prompt_tokens.unwrap(), u.completion_tokens.unwrap()));
            assert_eq!(got, *usage, "{name}: usage");
        }
        // Chat streams open with a role-only chunk: a choice, no output.
        let first = chunks("stream-chat.txt")[0];
        assert_eq!((first.choice_count, first.output), (1, false));
        // n=2: one role chunk per index, and both indices finish.
        let n2 = chunks("stream-chat-n2.txt");
        let finished: Vec<u32> = n2
            .iter()
            .flat_map(|i| {
                i.choices()
                    .iter()
                    .filter(|c| c.finish.is_some())
                    .map(|c| c.index)
            })
            .collect();
        assert_eq!(finished, vec![0, 1]);
    }

    #[test]
    fn non_streaming_bodies() {
        let ok = inspect_response(capture("nonstream-chat.txt").body);
        assert!(ok.is_complete());
        assert_eq!(
            (ok.choice_count, ok.finished_count, ok.finish_reason),
            (1, 1, Some(Length))
        );
        assert_eq!(
            ok.usage,
            Some(Usage {
                prompt_tokens: Some(15),
                completion_tokens: Some(8)
            })
        );
        for (name, status) in [
            ("error-too-long.txt", 400),
            ("error-unknown-model.txt", 404),
        ] {
            assert_eq!(capture(name).status, status);
            let e = inspect_response(capture(name).body);
            assert!(e.parsed && e.error && !e.is_complete(), "{name}");
        }
        let cut = &capture("nonstream-chat.txt").body[..100];
        assert!(!inspect_response(cut).parsed);
        let unfinished = br#"{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":"stop"},{"index":1,"message":{"content":"b"},"finish_reason":null}]}"#;
        let u = inspect_response(unfinished);
        assert_eq!(
            (u.choice_count, u.finished_count, u.is_complete()),
            (2, 1, false)
        );
        assert!(!inspect_response(br#"{"choices":[]}"#).is_complete());
    }
}
