//! Byte layout of vLLM 0.32's responses. Stream chunks are written from per-request
//! pre-rendered templates into a reused buffer, so a token costs a few memcpys.
//!
//! Key orders follow the captures in `shared/fixtures/vllm-0.32/` exactly, including
//! `usage` keys (prompt, total, completion) and where `system_fingerprint` goes: on the finish
//! chunk without `include_usage`, on the final `"choices":[]` usage chunk with it.

use bytes::BytesMut;

use super::per_request::PerRequestMetrics;
use super::request::{Api, GenRequest};
use super::text::{push_json_str, Piece};

pub const SYSTEM_FINGERPRINT: &str = "vllm-0.32.0-f1283a03";
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Why a choice ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Length,
    /// End of sequence (stop_reason null) or a matched stop string (stop_reason = it).
    Stop(Option<String>),
    /// The engine gave up on the request (`x-sim-fault: finish=abort`).
    Abort,
    /// The engine failed the request (`x-sim-fault: finish=error`).
    Error,
    /// The tool parser found a call (`tool_choice` auto): the engine stopped, the API says
    /// `tool_calls`.
    ToolCalls,
}

impl Finish {
    pub fn reason(&self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop(_) => "stop",
            Finish::Abort => "abort",
            Finish::Error => "error",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// One alternative or sampled token with its logprob.
#[derive(Debug, Clone, Copy)]
pub struct TokLp {
    pub piece: &'static Piece,
    pub logprob: f64,
}

/// Logprobs of one output token: the sampled token, then the alternatives.
#[derive(Debug, Clone)]
pub struct TokenLogprobs {
    pub sampled: TokLp,
    /// Chat: the `top_logprobs` list (first is the sampled token). Completions: the
    /// alternatives besides the sampled token.
    pub top: Vec<TokLp>,
    /// Legacy completions `text_offset` of this token.
    pub text_offset: u64,
}

/// The text of one output token: a vocabulary piece, or an owned string (cut by a stop match).
#[derive(Debug, Clone)]
pub enum TokText {
    Piece(&'static Piece),
    Owned(String),
}

impl TokText {
    pub fn as_str(&self) -> &str {
        match self {
            TokText::Piece(p) => p.text,
            TokText::Owned(s) => s,
        }
    }
}

pub fn push_u64(buf: &mut BytesMut, mut v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    buf.extend_from_slice(&tmp[i..]);
}

fn push_f64(buf: &mut BytesMut, v: f64) {
    // Debug gives the shortest round-trip form, as Python's repr does for these values.
    buf.extend_from_slice(format!("{v:?}").as_bytes());
}

/// A float as Python's `repr` writes it (pydantic's JSON does the same): the shortest
/// round-trip digits, `.0` on whole numbers, and below 1e-4 or from 1e16 on the exponent with a
/// sign and at least two digits (`5e-05`, where Rust's `Debug` writes `5e-5`).
fn push_py_float(buf: &mut BytesMut, v: f64) {
    let text = format!("{v:?}");
    let Some((mantissa, exp)) = text.split_once('e') else {
        buf.extend_from_slice(text.as_bytes());
        return;
    };
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    buf.extend_from_slice(format!("{mantissa}e{sign}{digits:0>2}").as_bytes());
}

fn push_json(buf: &mut BytesMut, s: &str) {
    let mut tmp = String::with_capacity(s.len() + 2);
    push_json_str(&mut tmp, s);
    buf.extend_from_slice(tmp.as_bytes());
}

/// The texts of one event's tokens as one JSON string (a packed event concatenates them).
fn push_toks(buf: &mut BytesMut, toks: &[TokText]) {
    if let [TokText::Piece(p)] = toks {
        buf.extend_from_slice(p.json.as_bytes());
        return;
    }
    buf.extend_from_slice(b"\"");
    let mut tmp = String::new();
    for t in toks {
        match t {
            // A piece's JSON form is a quoted string: keep what is between the quotes.
            TokText::Piece(p) => buf.extend_from_slice(&p.json.as_bytes()[1..p.json.len() - 1]),
            TokText::Owned(s) => {
                tmp.clear();
                push_json_str(&mut tmp, s);
                buf.extend_from_slice(&tmp.as_bytes()[1..tmp.len() - 1]);
            }
        }
    }
    buf.extend_from_slice(b"\"");
}

/// `usage.prompt_tokens_details` when the engine reports it (vLLM's
/// `--enable-prompt-tokens-details`): prompt tokens found in the prefix cache, and prompt
/// tokens this request newly cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptDetails {
    pub cached_tokens: u64,
    pub created_cache_tokens: u64,
}

/// Everything in a request's chunks that does not change from token to token.
#[derive(Debug)]
pub struct Templates {
    api: Api,
    /// `data: {"id":..,"object":..,"created":..,"model":..,"choices":[`
    head: Vec<u8>,
    /// `{"id":..,"object":..,"created":..,"model":..,` for non-streaming bodies.
    json_head: String,
    prompt_tokens: u64,
    include_usage: bool,
    continuous_usage: bool,
    /// Choices of the request (`n`): vLLM reports per-request metrics only for one.
    choices: u32,
    /// `--enable-per-request-metrics`.
    per_request_metrics: bool,
    /// The engine's timings, once the request ended (see [`Templates::set_engine_metrics`]).
    engine_metrics: Option<PerRequestMetrics>,
    prompt_details: Option<PromptDetails>,
    /// llama.cpp's `timings` (its personality): asked for, and the object once known.
    reports_timings: bool,
    timings: Option<String>,
}

impl Templates {
    pub fn new(req: &GenRequest, model: &str, created: u64) -> Self {
        let (prefix, object, json_object) = match req.api {
            Api::Chat => ("chatcmpl-", "chat.completion.chunk", "chat.completion"),
            Api::Completions => ("cmpl-", "text_completion", "text_completion"),
        };
        let id = format!("{prefix}{:016x}", req.id_hash);
        let mut model_json = String::new();
        push_json_str(&mut model_json, model);
        let head = format!(
            "data: {{\"id\":\"{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},\"choices\":["
        )
        .into_bytes();
        let json_head = format!(
            "{{\"id\":\"{id}\",\"object\":\"{json_object}\",\"created\":{created},\"model\":{model_json},"
        );
        Templates {
            api: req.api,
            head,
            json_head,
            prompt_tokens: req.prompt_tokens,
            include_usage: req.include_usage,
            continuous_usage: req.include_usage && req.continuous_usage,
            choices: req.n,
            per_request_metrics: false,
            engine_metrics: None,
            prompt_details: None,
            reports_timings: false,
            timings: None,
        }
    }

    /// The request ends with llama.cpp's `timings`: on the usage chunk when one comes, else on
    /// the finish chunk, and on a JSON body (see `personality::timings`).
    pub fn with_timings(mut self, reports: bool) -> Self {
        self.reports_timings = reports;
        self
    }

    pub fn reports_timings(&self) -> bool {
        self.reports_timings
    }

    /// The `timings` object of the request, once it finished.
    pub fn set_timings(&mut self, timings: String) {
        self.timings = Some(timings);
    }

    fn push_timings(&self, buf: &mut BytesMut) {
        if let Some(t) = self.timings.as_ref().filter(|_| self.reports_timings) {
            buf.extend_from_slice(b",\"timings\":");
            buf.extend_from_slice(t.as_bytes());
        }
    }

    /// The API the chunks are for.
    pub fn api(&self) -> Api {
        self.api
    }

    /// `data: {"id":..,"object":..,"created":..,"model":..,"choices":[`: how every chunk of
    /// the stream begins.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The prompt's length in tokens.
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    /// The engine's options that change the stream: `--enable-force-include-usage` (usage on
    /// every chunk and the final usage chunk, whatever `stream_options` says) and
    /// `--enable-per-request-metrics` (`metrics` on the final usage chunk and JSON bodies).
    pub fn engine_options(mut self, force_include_usage: bool, per_request_metrics: bool) -> Self {
        if force_include_usage {
            self.include_usage = true;
            self.continuous_usage = true;
        }
        self.per_request_metrics = per_request_metrics;
        self
    }

    /// Whether the stream ends with a usage chunk (asked for, or forced by the engine).
    pub fn include_usage(&self) -> bool {
        self.include_usage
    }

    /// The engine's timings of the request, for its `metrics` (written only when the engine
    /// reports them and the request has one choice).
    pub fn set_engine_metrics(&mut self, m: PerRequestMetrics) {
        self.engine_metrics = Some(m);
    }

    fn reported_metrics(&self) -> Option<PerRequestMetrics> {
        self.engine_metrics
            .filter(|_| self.per_request_metrics && self.choices == 1)
    }

    /// What the final usage reports of the prompt (known once the engine admitted it).
    pub fn set_prompt_details(&mut self, details: Option<PromptDetails>) {
        self.prompt_details = details;
    }

    /// `,"prompt_tokens_details":...` as vLLM 0.32 writes it: streams leave out the unset keys
    /// (completions streams report only `cached_tokens`); JSON bodies keep every key, `null`
    /// for the object when details are off.
    fn push_prompt_details(&self, buf: &mut BytesMut, stream: bool) {
        let Some(d) = self.prompt_details else {
            if !stream {
                buf.extend_from_slice(b",\"prompt_tokens_details\":null");
            }
            return;
        };
        buf.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
        push_u64(buf, d.cached_tokens);
        match (self.api, stream) {
            (Api::Chat, _) => {
                buf.extend_from_slice(b",\"created_cache_tokens\":");
                push_u64(buf, d.created_cache_tokens);
            }
            (Api::Completions, true) => {}
            (Api::Completions, false) => buf.extend_from_slice(b",\"created_cache_tokens\":null"),
        }
        if !stream {
            buf.extend_from_slice(b",\"multimodal_tokens\":null");
        }
        buf.extend_from_slice(b"}");
    }

    fn push_continuous_usage(&self, buf: &mut BytesMut, completion: u64) {
        if self.continuous_usage {
            buf.extend_from_slice(b",\"usage\":{");
            push_usage_counts(buf, self.prompt_tokens, completion);
            // Completions' continuous usage has no such key (stream-completions-usage-continuous.txt).
            if self.api == Api::Chat {
                buf.extend_from_slice(b",\"completion_tokens_details\":null");
            }
            buf.extend_from_slice(b"}");
        }
    }

    /// The role-only first chunk of a chat choice (vLLM sends it with the first token).
    pub fn role_chunk(&self, buf: &mut BytesMut, index: u32) {
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(b"{\"index\":");
        push_u64(buf, index as u64);
        buf.extend_from_slice(
            b",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]",
        );
        self.push_continuous_usage(buf, 0);
        buf.extend_from_slice(b",\"prompt_token_ids\":null,\"prompt_text\":null}\n\n");
    }

    /// One event of choice `index` holding the tokens `texts` (one, or several packed into
    /// one event: their texts concatenated, one logprobs entry each; none for an early
    /// finish). `completion` is this choice's token count up to the event's last token.
    pub fn token_chunk(
        &self,
        buf: &mut BytesMut,
        index: u32,
        texts: &[TokText],
        logprobs: Option<&[TokenLogprobs]>,
        finish: Option<&Finish>,
        completion: u64,
    ) {
        let shape = match self.api {
            Api::Chat => &CHAT_DELTA,
            Api::Completions => &COMPLETION_CHUNK,
        };
        let delta = |buf: &mut BytesMut| push_toks(buf, texts);
        self.choice_chunk(buf, shape, index, delta, logprobs, finish, completion);
    }

    /// One chat event of choice `index` shaped by its agent plan (see `agent.rs`): reasoning
    /// and answer text, or a tool call's opening delta or arguments; otherwise as
    /// [`Templates::token_chunk`].
    pub fn agent_chunk(
        &self,
        buf: &mut BytesMut,
        index: u32,
        delta: &AgentDelta<'_>,
        logprobs: Option<&[TokenLogprobs]>,
        finish: Option<&Finish>,
        completion: u64,
    ) {
        let push = |buf: &mut BytesMut| delta.push(buf);
        self.choice_chunk(
            buf,
            &CHAT_AGENT_DELTA,
            index,
            push,
            logprobs,
            finish,
            completion,
        );
    }

    /// An event of one choice: the head, the choice of `shape` with the delta `push` writes,
    /// the continuous usage, and the fingerprint on a finish without a usage chunk to come.
    #[allow(clippy::too_many_arguments)]
    fn choice_chunk(
        &self,
        buf: &mut BytesMut,
        shape: &ChoiceShape,
        index: u32,
        push: impl FnOnce(&mut BytesMut),
        logprobs: Option<&[TokenLogprobs]>,
        finish: Option<&Finish>,
        completion: u64,
    ) {
        buf.extend_from_slice(&self.head);
        push_choice(buf, shape, index as u64, push, logprobs, finish);
        buf.extend_from_slice(b"]");
        self.push_continuous_usage(buf, completion);
        if finish.is_some() && !self.include_usage {
            push_fingerprint(buf);
            self.push_timings(buf);
        }
        buf.extend_from_slice(b"}\n\n");
    }

    /// The final `"choices":[]` usage chunk (only with `include_usage`); with `reasoning`,
    /// `"completion_tokens_details":{"reasoning_tokens":R}` as vLLM 0.32 sends it with a
    /// reasoning parser (capture `stream-chat-reasoning.txt`).
    pub fn usage_chunk(&self, buf: &mut BytesMut, completion: u64, reasoning: Option<u64>) {
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(b"],\"usage\":{");
        push_usage_counts(buf, self.prompt_tokens, completion);
        self.push_prompt_details(buf, true);
        if let Some(r) = reasoning {
            buf.extend_from_slice(b",\"completion_tokens_details\":{\"reasoning_tokens\":");
            push_u64(buf, r);
            buf.extend_from_slice(b"}");
        }
        buf.extend_from_slice(b"}");
        push_fingerprint(buf);
        if let Some(m) = self.reported_metrics() {
            push_metrics(buf, &m, true);
        }
        self.push_timings(buf);
        buf.extend_from_slice(b"}\n\n");
    }

    /// A data line whose JSON is cut short (the `malformed-after` fault).
    pub fn malformed_chunk(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(b"{\"index\":0,\"delta\":{\"content\":\"\n\n");
    }

    /// The whole non-streaming body.
    pub fn json_body(&self, choices: &[ChoiceResult]) -> Vec<u8> {
        let shape = match self.api {
            Api::Chat => &CHAT_MESSAGE,
            Api::Completions => &COMPLETION_BODY,
        };
        let mut b =
            BytesMut::with_capacity(512 + choices.iter().map(|c| c.text.len() * 2).sum::<usize>());
        b.extend_from_slice(self.json_head.as_bytes());
        b.extend_from_slice(b"\"choices\":[");
        push_joined(&mut b, choices.iter().enumerate(), |b, (i, c)| {
            match &c.agent {
                Some(a) if self.api == Api::Chat => push_choice(
                    b,
                    &CHAT_AGENT_MESSAGE,
                    i as u64,
                    |b| a.push_message(b, &c.text),
                    c.logprobs.as_deref(),
                    Some(&c.finish),
                ),
                _ => push_choice(
                    b,
                    shape,
                    i as u64,
                    |b| push_json(b, &c.text),
                    c.logprobs.as_deref(),
                    Some(&c.finish),
                ),
            }
        });
        let completion: u64 = choices.iter().map(|c| c.tokens).sum();
        let reasoning = choices
            .iter()
            .filter_map(|c| c.agent.as_ref()?.reasoning_tokens)
            .reduce(|a, b| a + b);
        b.extend_from_slice(b"],\"service_tier\":null");
        push_fingerprint(&mut b);
        b.extend_from_slice(b",\"usage\":{");
        push_usage_counts(&mut b, self.prompt_tokens, completion);
        self.push_prompt_details(&mut b, false);
        match (self.api, reasoning) {
            (Api::Chat, Some(r)) => {
                b.extend_from_slice(b",\"completion_tokens_details\":{\"reasoning_tokens\":");
                push_u64(&mut b, r);
                b.extend_from_slice(b"}},\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}");
            }
            (Api::Chat, None) => b.extend_from_slice(b",\"completion_tokens_details\":null},\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}"),
            (Api::Completions, _) => b.extend_from_slice(b",\"completion_tokens_details\":null},\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}"),
        }
        if let Some(m) = self.reported_metrics() {
            // Every layout above ends in `"metrics":null}`: the object takes the null's place.
            b.truncate(b.len() - b"null}".len());
            push_metrics(&mut b, &m, false);
            b.extend_from_slice(b"}");
        }
        if self.timings.is_some() {
            b.truncate(b.len() - 1);
            self.push_timings(&mut b);
            b.extend_from_slice(b"}");
        }
        b.to_vec()
    }
}

/// How one choice object is laid out; the four layouts differ only in these pieces.
struct ChoiceShape {
    /// Between the index and the text.
    text_open: &'static [u8],
    /// Between the text and `,"logprobs":`.
    text_close: &'static [u8],
    logprobs: fn(&mut BytesMut, &[TokenLogprobs]),
    /// Whether `stop_reason` is written before the choice finishes.
    always_stop_reason: bool,
    /// After the finish fields, closing the choice object.
    tail: &'static [u8],
}

const CHAT_DELTA: ChoiceShape = ChoiceShape {
    text_open: b",\"delta\":{\"content\":",
    text_close: b"}",
    logprobs: push_chat_logprobs,
    always_stop_reason: false,
    tail: b",\"token_ids\":null}",
};

/// A chat delta whose fields [`AgentDelta::push`] writes.
const CHAT_AGENT_DELTA: ChoiceShape = ChoiceShape {
    text_open: b",\"delta\":{",
    ..CHAT_DELTA
};

/// What one agent-shaped chat event carries (any part may be empty).
#[derive(Debug, Default)]
pub struct AgentDelta<'a> {
    pub reasoning: &'a [TokText],
    pub content: &'a [TokText],
    /// The tool call opens in this event: its id and function name.
    pub tool_open: Option<(&'a str, &'a str)>,
    /// Arguments fragments of this event, joined.
    pub arguments: String,
}

impl AgentDelta<'_> {
    /// The delta's fields, in vLLM's order: `reasoning` / `content`, or, for a tool call,
    /// `"content":null,"tool_calls":[...]`.
    fn push(&self, buf: &mut BytesMut) {
        if self.tool_open.is_some() || !self.arguments.is_empty() {
            buf.extend_from_slice(b"\"content\":null,\"tool_calls\":[{");
            if let Some((id, _)) = self.tool_open {
                buf.extend_from_slice(b"\"id\":");
                push_json(buf, id);
                buf.extend_from_slice(b",\"type\":\"function\",");
            }
            buf.extend_from_slice(b"\"index\":0,\"function\":{");
            if let Some((_, name)) = self.tool_open {
                buf.extend_from_slice(b"\"name\":");
                push_json(buf, name);
                if !self.arguments.is_empty() {
                    buf.extend_from_slice(b",");
                }
            }
            if !self.arguments.is_empty() {
                buf.extend_from_slice(b"\"arguments\":");
                push_json(buf, &self.arguments);
            }
            buf.extend_from_slice(b"}}]");
            return;
        }
        let mut sep = "";
        if !self.reasoning.is_empty() {
            buf.extend_from_slice(b"\"reasoning\":");
            push_toks(buf, self.reasoning);
            sep = ",";
        }
        if !self.content.is_empty() || sep.is_empty() {
            buf.extend_from_slice(sep.as_bytes());
            buf.extend_from_slice(b"\"content\":");
            push_toks(buf, self.content);
        }
    }
}

const CHAT_MESSAGE: ChoiceShape = ChoiceShape {
    text_open: b",\"message\":{\"role\":\"assistant\",\"content\":",
    text_close: b",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":null}",
    logprobs: push_chat_logprobs,
    always_stop_reason: true,
    tail: b",\"token_ids\":null,\"routed_experts\":null}",
};

/// A chat message whose content, tool calls and reasoning [`MessageAgent::push_message`] writes.
const CHAT_AGENT_MESSAGE: ChoiceShape = ChoiceShape {
    text_close: b"",
    ..CHAT_MESSAGE
};

const COMPLETION_CHUNK: ChoiceShape = ChoiceShape {
    text_open: b",\"text\":",
    text_close: b"",
    logprobs: push_legacy_logprobs,
    always_stop_reason: true,
    tail: b",\"prompt_token_ids\":null,\"token_ids\":null}",
};

const COMPLETION_BODY: ChoiceShape = ChoiceShape {
    tail: b",\"token_ids\":null,\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"routed_experts\":null}",
    ..COMPLETION_CHUNK
};

/// `{"index":..,<text>,"logprobs":..,"finish_reason":..<tail>` laid out by `shape`.
fn push_choice(
    buf: &mut BytesMut,
    shape: &ChoiceShape,
    index: u64,
    text: impl FnOnce(&mut BytesMut),
    logprobs: Option<&[TokenLogprobs]>,
    finish: Option<&Finish>,
) {
    buf.extend_from_slice(b"{\"index\":");
    push_u64(buf, index);
    buf.extend_from_slice(shape.text_open);
    text(buf);
    buf.extend_from_slice(shape.text_close);
    buf.extend_from_slice(b",\"logprobs\":");
    match logprobs {
        Some(lp) => (shape.logprobs)(buf, lp),
        None => buf.extend_from_slice(b"null"),
    }
    push_finish(buf, finish, shape.always_stop_reason);
    buf.extend_from_slice(shape.tail);
}

/// `"metrics":{...}` as vLLM 0.32 writes it: in a stream's usage chunk `,"metrics":` follows
/// the fingerprint and absent values are left out; a JSON body keeps them as `null` and adds
/// `"speculative_decoding":null` (captures `options/metrics-*`).
fn push_metrics(buf: &mut BytesMut, m: &PerRequestMetrics, stream: bool) {
    if stream {
        buf.extend_from_slice(b",\"metrics\":{");
    } else {
        buf.extend_from_slice(b"{");
    }
    let fields = [
        ("time_to_first_token_ms", m.time_to_first_token_ms),
        ("generation_time_ms", m.generation_time_ms),
        ("queue_time_ms", m.queue_time_ms),
        ("mean_itl_ms", m.mean_itl_ms),
        ("tokens_per_second", m.tokens_per_second),
    ];
    let mut first = true;
    for (key, value) in fields {
        if value.is_none() && stream {
            continue;
        }
        if !first {
            buf.extend_from_slice(b",");
        }
        first = false;
        buf.extend_from_slice(b"\"");
        buf.extend_from_slice(key.as_bytes());
        buf.extend_from_slice(b"\":");
        match value {
            Some(v) => push_py_float(buf, v),
            None => buf.extend_from_slice(b"null"),
        }
    }
    if !stream {
        buf.extend_from_slice(b",\"speculative_decoding\":null");
    }
    buf.extend_from_slice(b"}");
}

/// `"prompt_tokens":..,"total_tokens":..,"completion_tokens":..`, vLLM's key order.
fn push_usage_counts(buf: &mut BytesMut, prompt: u64, completion: u64) {
    buf.extend_from_slice(b"\"prompt_tokens\":");
    push_u64(buf, prompt);
    buf.extend_from_slice(b",\"total_tokens\":");
    push_u64(buf, prompt + completion);
    buf.extend_from_slice(b",\"completion_tokens\":");
    push_u64(buf, completion);
}

fn push_fingerprint(buf: &mut BytesMut) {
    buf.extend_from_slice(b",\"system_fingerprint\":\"");
    buf.extend_from_slice(SYSTEM_FINGERPRINT.as_bytes());
    buf.extend_from_slice(b"\"");
}

/// Writes each item with `push`, comma-separated.
fn push_joined<T>(
    buf: &mut BytesMut,
    items: impl IntoIterator<Item = T>,
    mut push: impl FnMut(&mut BytesMut, T),
) {
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(b",");
        }
        push(buf, item);
    }
}

/// One finished choice of a non-streaming response.
#[derive(Debug, Clone)]
pub struct ChoiceResult {
    pub text: String,
    pub tokens: u64,
    pub finish: Finish,
    pub logprobs: Option<Vec<TokenLogprobs>>,
    /// Reasoning and the tool call, when the choice had an agent plan (chat only).
    pub agent: Option<MessageAgent>,
}

/// The agent parts of a chat message (captures `nonstream-chat-tool-named.txt`,
/// `nonstream-chat-reasoning.txt`).
#[derive(Debug, Clone, Default)]
pub struct MessageAgent {
    /// `message.reasoning` (`null` when empty).
    pub reasoning: String,
    /// Reasoning tokens, when reasoning was asked for (usage `completion_tokens_details`).
    pub reasoning_tokens: Option<u64>,
    pub call: Option<MessageCall>,
}

/// One tool call of a message: `{"id","type","function":{"name","arguments"}}` (no `index`).
#[derive(Debug, Clone)]
pub struct MessageCall {
    pub id: String,
    pub name: String,
    /// The fragments generated (cut short when `max_tokens` ended the choice first).
    pub arguments: String,
    /// Named or `"required"` `tool_choice`: vLLM answers `"content":""`; with `auto` the tool
    /// parser leaves no text before the call, so `"content":null`.
    pub forced: bool,
}

impl MessageAgent {
    /// `"content":..` through the message's closing `}`, in vLLM's key order: `tool_calls`
    /// after `function_call`, `reasoning` last.
    fn push_message(&self, buf: &mut BytesMut, text: &str) {
        match &self.call {
            Some(c) if c.forced => buf.extend_from_slice(b"\"\""),
            Some(_) => buf.extend_from_slice(b"null"),
            None if text.is_empty() => buf.extend_from_slice(b"null"),
            None => push_json(buf, text),
        }
        buf.extend_from_slice(
            b",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null",
        );
        if let Some(c) = &self.call {
            buf.extend_from_slice(b",\"tool_calls\":[{\"id\":");
            push_json(buf, &c.id);
            buf.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
            push_json(buf, &c.name);
            buf.extend_from_slice(b",\"arguments\":");
            push_json(buf, &c.arguments);
            buf.extend_from_slice(b"}}]");
        }
        buf.extend_from_slice(b",\"reasoning\":");
        if self.reasoning.is_empty() {
            buf.extend_from_slice(b"null");
        } else {
            push_json(buf, &self.reasoning);
        }
        buf.extend_from_slice(b"}");
    }
}

/// `,"finish_reason":..` and, on a finish (or always for completions), `,"stop_reason":..`.
fn push_finish(buf: &mut BytesMut, finish: Option<&Finish>, always_stop_reason: bool) {
    buf.extend_from_slice(b",\"finish_reason\":");
    match finish {
        None => buf.extend_from_slice(b"null"),
        Some(f) => {
            buf.extend_from_slice(b"\"");
            buf.extend_from_slice(f.reason().as_bytes());
            buf.extend_from_slice(b"\"");
        }
    }
    if finish.is_some() || always_stop_reason {
        buf.extend_from_slice(b",\"stop_reason\":");
        match finish {
            Some(Finish::Stop(Some(s))) => push_json(buf, s),
            _ => buf.extend_from_slice(b"null"),
        }
    }
}

fn push_chat_entry(buf: &mut BytesMut, t: &TokLp) {
    buf.extend_from_slice(b"{\"token\":");
    buf.extend_from_slice(t.piece.json.as_bytes());
    buf.extend_from_slice(b",\"logprob\":");
    push_f64(buf, t.logprob);
    buf.extend_from_slice(b",\"bytes\":");
    buf.extend_from_slice(t.piece.bytes_json.as_bytes());
}

fn push_chat_logprobs(buf: &mut BytesMut, toks: &[TokenLogprobs]) {
    buf.extend_from_slice(b"{\"content\":[");
    push_joined(buf, toks, |buf, lp| {
        push_chat_entry(buf, &lp.sampled);
        buf.extend_from_slice(b",\"top_logprobs\":[");
        push_joined(buf, &lp.top, |buf, t| {
            push_chat_entry(buf, t);
            buf.extend_from_slice(b"}");
        });
        buf.extend_from_slice(b"]}");
    });
    buf.extend_from_slice(b"]}");
}

fn push_legacy_logprobs(buf: &mut BytesMut, toks: &[TokenLogprobs]) {
    buf.extend_from_slice(b"{\"text_offset\":[");
    push_joined(buf, toks, |buf, lp| push_u64(buf, lp.text_offset));
    buf.extend_from_slice(b"],\"token_logprobs\":[");
    push_joined(buf, toks, |buf, lp| push_f64(buf, lp.sampled.logprob));
    buf.extend_from_slice(b"],\"tokens\":[");
    push_joined(buf, toks, |buf, lp| {
        buf.extend_from_slice(lp.sampled.piece.json.as_bytes())
    });
    buf.extend_from_slice(b"],\"top_logprobs\":[");
    push_joined(buf, toks, |buf, lp| {
        buf.extend_from_slice(b"{");
        push_joined(
            buf,
            std::iter::once(&lp.sampled).chain(&lp.top),
            |buf, t| {
                buf.extend_from_slice(t.piece.json.as_bytes());
                buf.extend_from_slice(b":");
                push_f64(buf, t.logprob);
            },
        );
        buf.extend_from_slice(b"}");
    });
    buf.extend_from_slice(b"]}");
}

#[cfg(test)]
mod tests {
    //! Byte-exact against lines of the real captures, given the captured id, created and text.
    use super::*;
    use crate::request::parse;
    use crate::text::vocab;

    fn piece(t: &str) -> &'static Piece {
        vocab().iter().find(|p| p.text == t).unwrap()
    }

    fn templates(api: Api, body: &str, id: u64) -> Templates {
        let mut req = parse(api, body.as_bytes(), &["tiny".to_string()], 2048, 0).unwrap();
        req.id_hash = id;
        Templates::new(&req, "tiny", 1795964150)
    }

    fn line(buf: &BytesMut) -> String {
        String::from_utf8(buf.to_vec()).unwrap()
    }

    /// Choice 0's chunk for the vocabulary piece `text`.
    fn piece_chunk(
        t: &Templates,
        text: &str,
        lp: Option<&TokenLogprobs>,
        finish: Option<&Finish>,
        completion: u64,
    ) -> String {
        let mut b = BytesMut::new();
        t.token_chunk(
            &mut b,
            0,
            &[TokText::Piece(piece(text))],
            lp.map(std::slice::from_ref),
            finish,
            completion,
        );
        line(&b)
    }

    #[test]
    fn chat_chunks_match_stream_chat_txt() {
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"Hello, how are you?"}],"stream":true,"max_tokens":16,"seed":1}"#,
            0xa45afd70d01f6372,
        );
        let mut b = BytesMut::new();
        t.role_chunk(&mut b, 0);
        assert_eq!(line(&b), "data: {\"id\":\"chatcmpl-a45afd70d01f6372\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"prompt_token_ids\":null,\"prompt_text\":null}\n\n");
        assert_eq!(piece_chunk(&t, " will", None, None, 2), "data: {\"id\":\"chatcmpl-a45afd70d01f6372\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" will\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":null}]}\n\n");
        assert_eq!(piece_chunk(&t, "ow", None, Some(&Finish::Length), 16), "data: {\"id\":\"chatcmpl-a45afd70d01f6372\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ow\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null,\"token_ids\":null}],\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}\n\n");
    }

    #[test]
    fn usage_moves_the_fingerprint_as_in_stream_chat_usage_txt() {
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, how are you?"}],"stream":true,"max_tokens":16,"seed":1,"stream_options":{"include_usage":true}}"#,
            0xba42e38baeaee861,
        );
        assert_eq!(piece_chunk(&t, "ow", None, Some(&Finish::Length), 16), "data: {\"id\":\"chatcmpl-ba42e38baeaee861\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ow\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null,\"token_ids\":null}]}\n\n");
        let mut b = BytesMut::new();
        t.usage_chunk(&mut b, 16, None);
        assert_eq!(line(&b), "data: {\"id\":\"chatcmpl-ba42e38baeaee861\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":32,\"total_tokens\":48,\"completion_tokens\":16},\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}\n\n");
    }

    #[test]
    fn continuous_usage_matches_stream_chat_usage_continuous_txt() {
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":6,"seed":1,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
            0xafdf1806bfc29444,
        );
        let mut b = BytesMut::new();
        t.role_chunk(&mut b, 0);
        assert_eq!(line(&b), "data: {\"id\":\"chatcmpl-afdf1806bfc29444\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":15,\"total_tokens\":15,\"completion_tokens\":0,\"completion_tokens_details\":null},\"prompt_token_ids\":null,\"prompt_text\":null}\n\n");
        assert_eq!(piece_chunk(&t, "def", None, Some(&Finish::Length), 6), "data: {\"id\":\"chatcmpl-afdf1806bfc29444\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"def\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null,\"token_ids\":null}],\"usage\":{\"prompt_tokens\":15,\"total_tokens\":21,\"completion_tokens\":6,\"completion_tokens_details\":null}}\n\n");
    }

    #[test]
    fn chat_logprobs_match_stream_chat_logprobs_txt() {
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"Hello, how are you?"}],"stream":true,"max_tokens":8,"seed":1,"logprobs":true,"top_logprobs":2,"stream_options":{"include_usage":true}}"#,
            0xb7239243a2a4dc2a,
        );
        let se = TokLp {
            piece: piece("SE"),
            logprob: -7.624619960784912,
        };
        let lp = TokenLogprobs {
            sampled: se,
            top: vec![
                se,
                TokLp {
                    piece: piece("test"),
                    logprob: -7.624616622924805,
                },
            ],
            text_offset: 0,
        };
        assert_eq!(piece_chunk(&t, "SE", Some(&lp), None, 1), "data: {\"id\":\"chatcmpl-b7239243a2a4dc2a\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"SE\"},\"logprobs\":{\"content\":[{\"token\":\"SE\",\"logprob\":-7.624619960784912,\"bytes\":[83,69],\"top_logprobs\":[{\"token\":\"SE\",\"logprob\":-7.624619960784912,\"bytes\":[83,69]},{\"token\":\"test\",\"logprob\":-7.624616622924805,\"bytes\":[116,101,115,116]}]}]},\"finish_reason\":null,\"token_ids\":null}]}\n\n");
    }

    #[test]
    fn completions_chunks_match_the_captures() {
        let t = templates(
            Api::Completions,
            r#"{"prompt":"The quick brown fox","stream":true,"max_tokens":4,"seed":1,"logprobs":2}"#,
            0xb2060b05d902fdd1,
        );
        let lp = TokenLogprobs {
            sampled: TokLp {
                piece: piece("SE"),
                logprob: -7.6246209144592285,
            },
            top: vec![
                TokLp {
                    piece: piece(" end"),
                    logprob: -7.624615669250488,
                },
                TokLp {
                    piece: piece("gra"),
                    logprob: -7.624615669250488,
                },
            ],
            text_offset: 0,
        };
        assert_eq!(piece_chunk(&t, "SE", Some(&lp), None, 1), "data: {\"id\":\"cmpl-b2060b05d902fdd1\",\"object\":\"text_completion\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"SE\",\"logprobs\":{\"text_offset\":[0],\"token_logprobs\":[-7.6246209144592285],\"tokens\":[\"SE\"],\"top_logprobs\":[{\"SE\":-7.6246209144592285,\" end\":-7.624615669250488,\"gra\":-7.624615669250488}]},\"finish_reason\":null,\"stop_reason\":null,\"prompt_token_ids\":null,\"token_ids\":null}]}\n\n");
        let t = templates(
            Api::Completions,
            r#"{"prompt":"The quick brown fox","stream":true,"max_tokens":16,"seed":1,"stream_options":{"include_usage":true}}"#,
            0x9a7207426ef199bb,
        );
        assert_eq!(piece_chunk(&t, "ow", None, Some(&Finish::Length), 16), "data: {\"id\":\"cmpl-9a7207426ef199bb\",\"object\":\"text_completion\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\"ow\",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null,\"prompt_token_ids\":null,\"token_ids\":null}]}\n\n");
    }

    /// The packed event of `stream-chat-coalesced.txt` ("def" + "sage" in one event), byte
    /// for byte: an ordinary token chunk with the texts concatenated.
    #[test]
    fn packed_event_matches_stream_chat_coalesced_txt() {
        let mut req = parse(
            Api::Chat,
            br#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":48,"seed":1,"stream_options":{"include_usage":true}}"#,
            &["tiny".to_string()],
            2048,
            0,
        )
        .unwrap();
        req.id_hash = 0x95a49db66b9b67cb;
        let t = Templates::new(&req, "tiny", 1795967336);
        let mut b = BytesMut::new();
        let toks = [TokText::Piece(piece("def")), TokText::Piece(piece("sage"))];
        t.token_chunk(&mut b, 0, &toks, None, None, 7);
        assert_eq!(line(&b), "data: {\"id\":\"chatcmpl-95a49db66b9b67cb\",\"object\":\"chat.completion.chunk\",\"created\":1795967336,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"defsage\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":null}]}\n\n");
        // Owned (stop-cut, empty) texts join the same string, escaped once.
        b.clear();
        let toks = [
            TokText::Owned(String::new()),
            TokText::Piece(piece("def")),
            TokText::Owned("a\"b".into()),
        ];
        t.token_chunk(&mut b, 0, &toks, None, None, 3);
        assert!(
            line(&b).contains(r#""delta":{"content":"defa\"b"}"#),
            "{}",
            line(&b)
        );
    }

    #[test]
    fn packed_logprobs_have_one_entry_per_token() {
        let lp = |p: &str, off: u64| TokenLogprobs {
            sampled: TokLp {
                piece: piece(p),
                logprob: -7.5,
            },
            top: vec![],
            text_offset: off,
        };
        let lps = [lp("def", 0), lp("sage", 3)];
        let toks = [TokText::Piece(piece("def")), TokText::Piece(piece("sage"))];
        let mut b = BytesMut::new();
        let t = templates(
            Api::Completions,
            r#"{"prompt":"x","stream":true,"logprobs":0}"#,
            1,
        );
        t.token_chunk(&mut b, 0, &toks, Some(&lps), None, 2);
        assert!(line(&b).contains(r#""text":"defsage","logprobs":{"text_offset":[0,3],"token_logprobs":[-7.5,-7.5],"tokens":["def","sage"],"top_logprobs":[{"def":-7.5},{"sage":-7.5}]}"#), "{}", line(&b));
        b.clear();
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"x"}],"stream":true,"logprobs":true}"#,
            1,
        );
        t.token_chunk(&mut b, 0, &toks, Some(&lps), None, 2);
        assert!(line(&b).contains(r#""logprobs":{"content":[{"token":"def","logprob":-7.5,"bytes":[100,101,102],"top_logprobs":[]},{"token":"sage","logprob":-7.5,"bytes":[115,97,103,101],"top_logprobs":[]}]}"#), "{}", line(&b));
    }

    /// An early finish carries no token: empty text, empty logprobs, the reason, a null
    /// stop_reason, and the fingerprint as on any finish chunk without usage.
    #[test]
    fn early_finish_chunk_has_no_token_and_its_reason() {
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"x"}],"stream":true}"#,
            1,
        );
        let mut b = BytesMut::new();
        t.token_chunk(&mut b, 1, &[], None, Some(&Finish::Abort), 3);
        assert_eq!(line(&b), "data: {\"id\":\"chatcmpl-0000000000000001\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":1,\"delta\":{\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"abort\",\"stop_reason\":null,\"token_ids\":null}],\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}\n\n");
        b.clear();
        t.token_chunk(&mut b, 0, &[], Some(&[]), Some(&Finish::Error), 0);
        assert!(line(&b).contains(r#""delta":{"content":""},"logprobs":{"content":[]},"finish_reason":"error","stop_reason":null"#), "{}", line(&b));
    }

    /// The `data:` lines of a capture (without the trailing blank line).
    fn capture_events(text: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("data: "))
            .map(|l| format!("{l}\n\n"))
            .collect()
    }

    #[test]
    fn tool_call_chunks_match_stream_chat_tool_named_txt() {
        let cap = include_str!("../../../tests/fixtures/vllm-0.32/stream-chat-tool-named.txt");
        let body = cap
            .lines()
            .find_map(|l| l.strip_prefix("### request body: "))
            .unwrap();
        let mut req = parse(Api::Chat, body.as_bytes(), &["tiny".to_string()], 2048, 0).unwrap();
        req.id_hash = 0x87ee9d7e54ea1013;
        let t = Templates::new(&req, "tiny", 1796142667);
        let want = capture_events(cap);
        let tool = req.tool.as_ref().unwrap();
        assert_eq!((tool.name.as_str(), tool.forced), ("get_weather", true));
        let id = "chatcmpl-tool-a82d1baabf0d5419";
        let mut b = BytesMut::new();
        let open = AgentDelta {
            tool_open: Some((id, &tool.name)),
            ..AgentDelta::default()
        };
        t.agent_chunk(&mut b, 0, &open, None, None, 1);
        assert_eq!(line(&b), want[1]);
        let frags = ["6", "e40223", "00", "0012"];
        for (k, frag) in frags.iter().enumerate() {
            let last = k + 1 == frags.len();
            let d = AgentDelta {
                arguments: frag.to_string(),
                ..AgentDelta::default()
            };
            b.clear();
            let fin = Finish::Stop(None);
            t.agent_chunk(&mut b, 0, &d, None, last.then_some(&fin), 2 + k as u64);
            assert_eq!(line(&b), want[2 + k], "fragment {k}");
        }
        // Everything else of the capture is shaped as any chat stream's.
        assert!(want[0].contains(r#""delta":{"role":"assistant","content":""}"#));
        assert!(want[6].contains(r#""choices":[],"usage""#));
        // Reasoning and answer text: the delta's own keys, reasoning first.
        let r = [TokText::Owned("hm".into())];
        let c = [TokText::Owned("ok".into())];
        for (delta, want) in [
            (
                AgentDelta {
                    reasoning: &r,
                    ..AgentDelta::default()
                },
                r#""delta":{"reasoning":"hm"}"#,
            ),
            (
                AgentDelta {
                    reasoning: &r,
                    content: &c,
                    ..AgentDelta::default()
                },
                r#""delta":{"reasoning":"hm","content":"ok"}"#,
            ),
            (
                AgentDelta {
                    content: &c,
                    ..AgentDelta::default()
                },
                r#""delta":{"content":"ok"}"#,
            ),
        ] {
            b.clear();
            t.agent_chunk(&mut b, 0, &delta, None, None, 1);
            assert!(line(&b).contains(want), "{}", line(&b));
        }
    }

    #[test]
    fn reasoning_chunks_match_stream_chat_reasoning_txt() {
        let cap = include_str!("../../../tests/fixtures/vllm-0.32/stream-chat-reasoning.txt");
        let body = cap
            .lines()
            .find_map(|l| l.strip_prefix("### request body: "))
            .unwrap();
        let mut req = parse(Api::Chat, body.as_bytes(), &["tiny".to_string()], 2048, 0).unwrap();
        req.id_hash = 0xad489793bfa48721;
        // The simulator estimates prompt tokens from the text; the engine's tokenizer said 25.
        req.prompt_tokens = 25;
        let t = Templates::new(&req, "tiny", 1796143633);
        let want = capture_events(cap);
        let mut b = BytesMut::new();
        let r = [TokText::Piece(piece(" will"))];
        let d = AgentDelta {
            reasoning: &r,
            ..AgentDelta::default()
        };
        t.agent_chunk(&mut b, 0, &d, None, None, 2);
        assert_eq!(line(&b), want[2]);
        // The fingerprint of that engine differs (its config had a reasoning parser): compare
        // up to it.
        b.clear();
        t.usage_chunk(&mut b, 12, Some(0));
        let cut = |s: &str| s[..s.find("\"system_fingerprint\"").unwrap()].to_string();
        assert_eq!(cut(&line(&b)), cut(&want[want.len() - 2]));
    }

    #[test]
    fn stop_chunk_matches_stream_chat_stop_txt() {
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":64,"seed":3,"stop":["e"],"stream_options":{"include_usage":true}}"#,
            0x93fdfd0f0fb21559,
        );
        let mut b = BytesMut::new();
        let fin = Finish::Stop(Some("e".into()));
        t.token_chunk(
            &mut b,
            0,
            &[TokText::Owned("yp".into())],
            None,
            Some(&fin),
            1,
        );
        assert_eq!(line(&b), "data: {\"id\":\"chatcmpl-93fdfd0f0fb21559\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"yp\"},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":\"e\",\"token_ids\":null}]}\n\n");
        b.clear();
        t.usage_chunk(&mut b, 1, None);
        assert_eq!(line(&b), "data: {\"id\":\"chatcmpl-93fdfd0f0fb21559\",\"object\":\"chat.completion.chunk\",\"created\":1795964150,\"model\":\"tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":15,\"total_tokens\":16,\"completion_tokens\":1},\"system_fingerprint\":\"vllm-0.32.0-f1283a03\"}\n\n");
    }

    #[test]
    fn nonstream_chat_body_matches_nonstream_chat_txt() {
        let t = templates(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"seed":1}"#,
            0x8bb1f8ade54c1043,
        );
        let body = t.json_body(&[ChoiceResult {
            text: "SE willravered licensedefsagestrip".into(),
            tokens: 8,
            finish: Finish::Length,
            logprobs: None,
            agent: None,
        }]);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"id":"chatcmpl-8bb1f8ade54c1043","object":"chat.completion","created":1795964150,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"SE willravered licensedefsagestrip","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-f1283a03","usage":{"prompt_tokens":15,"total_tokens":23,"completion_tokens":8,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}"#
        );
    }

    /// The capture's request, id and body line (its engine's fingerprint replaced by ours).
    fn nonstream_capture(cap: &str, id: u64, created: u64) -> (Templates, String) {
        let body = cap
            .lines()
            .find_map(|l| l.strip_prefix("### request body: "))
            .unwrap();
        let mut req = parse(Api::Chat, body.as_bytes(), &["tiny".to_string()], 2048, 0).unwrap();
        req.id_hash = id;
        // The simulator estimates prompt tokens from the text; the engine's tokenizer said 25.
        req.prompt_tokens = 25;
        let want = cap.lines().last().unwrap();
        let at = want.find("\"system_fingerprint\":\"").unwrap() + 22;
        let want = format!(
            "{}{}",
            &want[..at],
            &want[at..].replacen(&want[at..at + 20], SYSTEM_FINGERPRINT, 1)
        );
        (Templates::new(&req, "tiny", created), want)
    }

    #[test]
    fn nonstream_tool_call_matches_nonstream_chat_tool_named_txt() {
        let cap = include_str!("../../../tests/fixtures/vllm-0.32/nonstream-chat-tool-named.txt");
        let (t, want) = nonstream_capture(cap, 0x8c12ae3796793e84, 1796142674);
        let call = MessageCall {
            id: "chatcmpl-tool-9da52b669c43bf58".into(),
            name: "get_weather".into(),
            arguments: "Infinity".into(),
            forced: true,
        };
        let choice = ChoiceResult {
            text: String::new(),
            tokens: 49,
            finish: Finish::Stop(None),
            logprobs: None,
            agent: Some(MessageAgent {
                call: Some(call.clone()),
                ..MessageAgent::default()
            }),
        };
        let body = t.json_body(std::slice::from_ref(&choice));
        assert_eq!(String::from_utf8(body).unwrap(), want);
        // `tool_choice: "auto"`: the tool parser leaves no text, `content` is null.
        let auto = ChoiceResult {
            finish: Finish::ToolCalls,
            agent: Some(MessageAgent {
                call: Some(MessageCall {
                    forced: false,
                    ..call
                }),
                ..MessageAgent::default()
            }),
            ..choice
        };
        let body = String::from_utf8(t.json_body(&[auto])).unwrap();
        assert!(
            body.contains(r#""message":{"role":"assistant","content":null,"refusal":null"#)
                && body.contains(r#""finish_reason":"tool_calls""#),
            "{body}"
        );
    }

    #[test]
    fn nonstream_reasoning_matches_nonstream_chat_reasoning_txt() {
        let cap = include_str!("../../../tests/fixtures/vllm-0.32/nonstream-chat-reasoning.txt");
        let (t, want) = nonstream_capture(cap, 0xad436873358391e2, 1796143636);
        let body = t.json_body(&[ChoiceResult {
            text: String::new(),
            tokens: 12,
            finish: Finish::Length,
            logprobs: None,
            agent: Some(MessageAgent {
                reasoning: "SE willravered licensedefsagestrip{help lython".into(),
                // That engine said 0 (the model never closed `<think>`); ours counts them.
                reasoning_tokens: Some(0),
                call: None,
            }),
        }]);
        assert_eq!(String::from_utf8(body).unwrap(), want);
    }

    proptest::proptest! {
        /// Any text (stop-cut tokens are arbitrary strings) yields one valid JSON event whose
        /// content is that text, on one line.
        #[test]
        fn any_text_renders_as_one_valid_event(text in "\\PC*", idx in 0u32..4, done in proptest::bool::ANY) {
            let t = templates(Api::Chat, r#"{"messages":[{"role":"user","content":"x"}],"stream":true}"#, 1);
            let mut b = BytesMut::new();
            let fin = Finish::Stop(Some(text.clone()));
            t.token_chunk(&mut b, idx, &[TokText::Owned(text.clone())], None, done.then_some(&fin), 1);
            let s = line(&b);
            let json = s.strip_prefix("data: ").unwrap().strip_suffix("\n\n").unwrap();
            proptest::prop_assert!(!json.contains('\n'));
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            proptest::prop_assert_eq!(v["choices"][0]["delta"]["content"].as_str().unwrap(), text.as_str());
            proptest::prop_assert_eq!(v["choices"][0]["index"].as_u64().unwrap(), idx as u64);
            if done {
                proptest::prop_assert_eq!(v["choices"][0]["stop_reason"].as_str().unwrap(), text.as_str());
            }
        }
    }
}
