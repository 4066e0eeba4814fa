//! Byte layout of vLLM 0.32's responses. Stream chunks are written from per-request
//! pre-rendered templates into a reused buffer, so a token costs a few memcpys.
//!
//! Key orders follow the captures in `shared/fixtures/vllm-0.32/` exactly, including
//! `usage` keys (prompt, total, completion) and where `system_fingerprint` goes: on the finish
//! chunk without `include_usage`, on the final `"choices":[]` usage chunk with it.

use bytes::BytesMut;

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
}

impl Finish {
    pub fn reason(&self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop(_) => "stop",
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

fn push_json(buf: &mut BytesMut, s: &str) {
    let mut tmp = String::with_capacity(s.len() + 2);
    push_json_str(&mut tmp, s);
    buf.extend_from_slice(tmp.as_bytes());
}

fn push_tok(buf: &mut BytesMut, t: &TokText) {
    match t {
        TokText::Piece(p) => buf.extend_from_slice(p.json.as_bytes()),
        TokText::Owned(s) => push_json(buf, s),
    }
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
        }
    }

    fn push_continuous_usage(&self, buf: &mut BytesMut, completion: u64) {
        if self.continuous_usage {
            buf.extend_from_slice(b",\"usage\":{\"prompt_tokens\":");
            push_u64(buf, self.prompt_tokens);
            buf.extend_from_slice(b",\"total_tokens\":");
            push_u64(buf, self.prompt_tokens + completion);
            buf.extend_from_slice(b",\"completion_tokens\":");
            push_u64(buf, completion);
            buf.extend_from_slice(b",\"completion_tokens_details\":null}");
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

    /// One token's chunk. `completion` is this choice's token count including this token.
    pub fn token_chunk(
        &self,
        buf: &mut BytesMut,
        index: u32,
        text: &TokText,
        logprobs: Option<&TokenLogprobs>,
        finish: Option<&Finish>,
        completion: u64,
    ) {
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(b"{\"index\":");
        push_u64(buf, index as u64);
        match self.api {
            Api::Chat => {
                buf.extend_from_slice(b",\"delta\":{\"content\":");
                push_tok(buf, text);
                buf.extend_from_slice(b"},\"logprobs\":");
                match logprobs {
                    Some(lp) => push_chat_logprobs(buf, std::slice::from_ref(lp)),
                    None => buf.extend_from_slice(b"null"),
                }
                push_finish(buf, finish, false);
                buf.extend_from_slice(b",\"token_ids\":null}]");
            }
            Api::Completions => {
                buf.extend_from_slice(b",\"text\":");
                push_tok(buf, text);
                buf.extend_from_slice(b",\"logprobs\":");
                match logprobs {
                    Some(lp) => push_legacy_logprobs(buf, std::slice::from_ref(lp)),
                    None => buf.extend_from_slice(b"null"),
                }
                push_finish(buf, finish, true);
                buf.extend_from_slice(b",\"prompt_token_ids\":null,\"token_ids\":null}]");
            }
        }
        self.push_continuous_usage(buf, completion);
        if finish.is_some() && !self.include_usage {
            buf.extend_from_slice(b",\"system_fingerprint\":\"");
            buf.extend_from_slice(SYSTEM_FINGERPRINT.as_bytes());
            buf.extend_from_slice(b"\"");
        }
        buf.extend_from_slice(b"}\n\n");
    }

    /// The final `"choices":[]` usage chunk (only with `include_usage`).
    pub fn usage_chunk(&self, buf: &mut BytesMut, completion: u64) {
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(b"],\"usage\":{\"prompt_tokens\":");
        push_u64(buf, self.prompt_tokens);
        buf.extend_from_slice(b",\"total_tokens\":");
        push_u64(buf, self.prompt_tokens + completion);
        buf.extend_from_slice(b",\"completion_tokens\":");
        push_u64(buf, completion);
        buf.extend_from_slice(b"},\"system_fingerprint\":\"");
        buf.extend_from_slice(SYSTEM_FINGERPRINT.as_bytes());
        buf.extend_from_slice(b"\"}\n\n");
    }

    /// A data line whose JSON is cut short (the `malformed-after` fault).
    pub fn malformed_chunk(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(b"{\"index\":0,\"delta\":{\"content\":\"\n\n");
    }

    /// The whole non-streaming body.
    pub fn json_body(&self, choices: &[ChoiceResult]) -> Vec<u8> {
        let mut b =
            BytesMut::with_capacity(512 + choices.iter().map(|c| c.text.len() * 2).sum::<usize>());
        b.extend_from_slice(self.json_head.as_bytes());
        b.extend_from_slice(b"\"choices\":[");
        for (i, c) in choices.iter().enumerate() {
            if i > 0 {
                b.extend_from_slice(b",");
            }
            b.extend_from_slice(b"{\"index\":");
            push_u64(&mut b, i as u64);
            match self.api {
                Api::Chat => {
                    b.extend_from_slice(b",\"message\":{\"role\":\"assistant\",\"content\":");
                    push_json(&mut b, &c.text);
                    b.extend_from_slice(b",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":null},\"logprobs\":");
                    match &c.logprobs {
                        Some(lp) => push_chat_logprobs(&mut b, lp),
                        None => b.extend_from_slice(b"null"),
                    }
                    push_finish(&mut b, Some(&c.finish), true);
                    b.extend_from_slice(b",\"token_ids\":null,\"routed_experts\":null}");
                }
                Api::Completions => {
                    b.extend_from_slice(b",\"text\":");
                    push_json(&mut b, &c.text);
                    b.extend_from_slice(b",\"logprobs\":");
                    match &c.logprobs {
                        Some(lp) => push_legacy_logprobs(&mut b, lp),
                        None => b.extend_from_slice(b"null"),
                    }
                    push_finish(&mut b, Some(&c.finish), true);
                    b.extend_from_slice(
                        b",\"token_ids\":null,\"prompt_logprobs\":null,\"prompt_token_ids\":null}",
                    );
                }
            }
        }
        let completion: u64 = choices.iter().map(|c| c.tokens).sum();
        b.extend_from_slice(b"],\"service_tier\":null,\"system_fingerprint\":\"");
        b.extend_from_slice(SYSTEM_FINGERPRINT.as_bytes());
        b.extend_from_slice(b"\",\"usage\":{\"prompt_tokens\":");
        push_u64(&mut b, self.prompt_tokens);
        b.extend_from_slice(b",\"total_tokens\":");
        push_u64(&mut b, self.prompt_tokens + completion);
        b.extend_from_slice(b",\"completion_tokens\":");
        push_u64(&mut b, completion);
        match self.api {
            Api::Chat => b.extend_from_slice(b",\"prompt_tokens_details\":null,\"completion_tokens_details\":null},\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}"),
            Api::Completions => b.extend_from_slice(b",\"prompt_tokens_details\":null},\"kv_transfer_params\":null}"),
        }
        b.to_vec()
    }
}

/// One finished choice of a non-streaming response.
#[derive(Debug, Clone)]
pub struct ChoiceResult {
    pub text: String,
    pub tokens: u64,
    pub finish: Finish,
    pub logprobs: Option<Vec<TokenLogprobs>>,
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
    for (i, lp) in toks.iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(b",");
        }
        push_chat_entry(buf, &lp.sampled);
        buf.extend_from_slice(b",\"top_logprobs\":[");
        for (j, t) in lp.top.iter().enumerate() {
            if j > 0 {
                buf.extend_from_slice(b",");
            }
            push_chat_entry(buf, t);
            buf.extend_from_slice(b"}");
        }
        buf.extend_from_slice(b"]}");
    }
    buf.extend_from_slice(b"]}");
}

fn push_legacy_logprobs(buf: &mut BytesMut, toks: &[TokenLogprobs]) {
    buf.extend_from_slice(b"{\"text_offset\":[");
    for (i, lp) in toks.iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(b",");
        }
        push_u64(buf, lp.text_offset);
    }
    buf.extend_from_slice(b"],\"token_logprobs\":[");
    for (i, lp) in toks.iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(b",");
        }
        push_f64(buf, lp.sampled.logprob);
    }
    buf.extend_from_slice(b"],\"tokens\":[");
    for (i, lp) in toks.iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(b",");
        }
        buf.extend_from_slice(lp.sampled.piece.json.as_bytes());
    }
    buf.extend_from_slice(b"],\"top_logprobs\":[");
    for (i, lp) in toks.iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(b",");
        }
        buf.extend_from_slice(b"{");
        for (j, t) in std::iter::once(&lp.sampled)
            .chain(lp.top.iter())
            .enumerate()
        {
            if j > 0 {
                buf.extend_from_slice(b",");
            }
            buf.extend_from_slice(t.piece.json.as_bytes());
            buf.extend_from_slice(b":");
            push_f64(buf, t.logprob);
        }
        buf.extend_from_slice(b"}");
    }
    buf.extend_from_slice(b"]}");
}
