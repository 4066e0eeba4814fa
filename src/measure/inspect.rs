//! Chunk inspection: what one SSE data payload (or one non-streaming JSON body) says about
//! output, finish and usage. Borrowed serde structs that read only the fields needed; strings
//! are looked at as raw JSON (`&RawValue`) so nothing is unescaped or allocated per chunk.

use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::measure::outcome::FinishReason;

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
    pub finish_reason: Option<FinishReason>,
    pub usage: Option<Usage>,
}

impl ResponseInfo {
    /// Success by DESIGN.md: `choices` present and every choice has a `finish_reason`.
    pub fn is_complete(&self) -> bool {
        self.parsed && !self.error && self.choice_count > 0 && self.finished_count == self.choice_count
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
        info.finish_reason = c.items[..c.kept as usize].iter().find_map(|c| c.finish);
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
                    output: false,
                    tokens: 0,
                };
                while let Some(raw) = seq.next_element::<RawChoice<'de>>()? {
                    let s = raw.summary();
                    c.total = c.total.saturating_add(1);
                    c.finished += u32::from(s.finish.is_some());
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
