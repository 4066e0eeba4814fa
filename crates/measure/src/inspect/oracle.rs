//! The oracle of the scanner's differential test and of the fuzz target (`fuzz/`, which
//! includes this file by path): a full `serde_json::Value` parse of a payload, read by the
//! field rules of [`scan_event`]'s docs (and, for tool calls, of `inspect/calls.rs`'s). It shares no code with the scanner and names only
//! public items, through `super::` (the includer brings them into scope).
//!
//! Where the scanner is deliberately lax (see `scan.rs`: UTF-8 inside strings, unpaired
//! surrogate escapes, number magnitudes), [`lax`] rewrites the payload first so that `Value`
//! accepts it too, changing nothing the rules look at; the differential test pins that `lax`
//! only ever turns a text that `serde_json` skips as valid (`IgnoredAny`) into one it parses.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{
    inspect_response, inspect_response_logged, scan_event, scan_event_logged, ChoiceInfo,
    ChunkKind, FinishReason, LoggedCall, Phases, ResponseInfo, Span, TokenLog, Usage,
    MAX_CHOICES_PER_CHUNK,
};

/// What the scanner does not check, made acceptable to `serde_json::Value`: invalid UTF-8
/// replaced (U+FFFD), every surrogate escape replaced by `\uFFFD`, every exponent of three or
/// more digits by `e0`. None of these touches a key or value the rules compare (all ASCII
/// letters and `_`), an emptiness, or the grammar.
pub fn lax(data: &[u8]) -> Vec<u8> {
    let s = String::from_utf8_lossy(data).into_owned().into_bytes();
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'\\' => {
                let surrogate = s.get(i + 1) == Some(&b'u')
                    && s.get(i + 2..i + 6).is_some_and(|h| {
                        std::str::from_utf8(h)
                            .ok()
                            .and_then(|h| u16::from_str_radix(h, 16).ok())
                            .is_some_and(|v| (0xD800..=0xDFFF).contains(&v))
                    });
                if surrogate {
                    out.extend_from_slice(br"\uFFFD");
                    i += 6;
                } else if s.get(i + 1) == Some(&b'u') {
                    out.extend_from_slice(&s[i..(i + 6).min(s.len())]);
                    i += 6;
                } else {
                    out.extend_from_slice(&s[i..(i + 2).min(s.len())]);
                    i += 2;
                }
            }
            b'e' | b'E' if i > 0 && s[i - 1].is_ascii_digit() => {
                let mut j = i + 1;
                if matches!(s.get(j), Some(b'+' | b'-')) {
                    j += 1;
                }
                let digits = s[j..].iter().take_while(|b| b.is_ascii_digit()).count();
                if digits >= 3 {
                    out.extend_from_slice(b"e0");
                    i = j + digits;
                } else {
                    out.push(s[i]);
                    i += 1;
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// A `Value` object of the payload, if it is one.
fn parse(data: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice::<Value>(&lax(data)) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

fn non_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

/// `Some(None)` for absent or null, `Some(Some(n))` for an unsigned integer, `None` (refused)
/// for anything else.
fn opt_uint(v: Option<&Value>) -> Option<Option<u64>> {
    match v {
        None | Some(Value::Null) => Some(None),
        Some(v) => v.as_u64().map(Some),
    }
}

fn opt_len(v: Option<&Value>) -> Option<Option<u32>> {
    match v {
        None | Some(Value::Null) => Some(None),
        Some(Value::Array(a)) => Some(Some(u32::try_from(a.len()).unwrap_or(u32::MAX))),
        Some(_) => None,
    }
}

fn oracle_choice(v: &Value) -> Option<ChoiceInfo> {
    let c = v.as_object()?;
    let index = match c.get("index") {
        None => 0,
        Some(v) => u32::try_from(v.as_u64()?).ok()?,
    };
    let mut phases = Phases::default();
    match c.get("delta") {
        None | Some(Value::Null) => {}
        Some(Value::Object(d)) => {
            let any = |keys: &[&str]| keys.iter().any(|k| non_empty(d.get(*k)));
            phases = phases
                .with(Phases::ANSWER, any(&["content"]))
                .with(Phases::REASONING, any(&["reasoning_content", "reasoning"]))
                .with(Phases::TOOL_CALL, any(&["tool_calls"]));
        }
        Some(_) => return None,
    }
    let phases = phases.with(Phases::ANSWER, non_empty(c.get("text")));
    let output = !phases.is_empty();
    let finish = match c.get("finish_reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(FinishReason::parse(s.as_bytes())),
        Some(_) => return None,
    };
    let logprobs = match c.get("logprobs") {
        None | Some(Value::Null) => 0,
        Some(Value::Object(l)) => {
            let content = opt_len(l.get("content"))?;
            let tokens = opt_len(l.get("tokens"))?;
            content.or(tokens).unwrap_or(0)
        }
        Some(_) => return None,
    };
    Some(ChoiceInfo {
        index,
        output,
        tokens: if logprobs > 0 {
            logprobs
        } else {
            u32::from(output)
        },
        finish,
        phases,
    })
}

/// What the engine said beside the usage: cached prompt tokens and the top-level `metrics`.
fn oracle_engine(m: &Map<String, Value>, u: &Map<String, Value>) -> crate::engine::EngineView {
    let metrics = m.get("metrics").and_then(Value::as_object);
    let ms = |k: &str| {
        metrics
            .and_then(|o| o.get(k))
            .and_then(Value::as_f64)
            .and_then(crate::engine::from_ms)
    };
    crate::engine::EngineView {
        queue: ms("queue_time_ms"),
        ttft: ms("time_to_first_token_ms"),
        decode: ms("generation_time_ms"),
        mean_itl: ms("mean_itl_ms"),
        cached_prompt_tokens: u
            .get("prompt_tokens_details")
            .and_then(Value::as_object)
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64),
    }
}

/// llama.cpp's `timings`: an object's known fields (integers, finite non-negative numbers),
/// reported when any is there.
fn oracle_timings(m: &Map<String, Value>) -> Option<crate::engine_timings::TimingsReport> {
    let t = m.get("timings")?.as_object()?;
    let uint = |k: &str| t.get(k).and_then(Value::as_u64);
    let float = |k: &str| {
        t.get(k)
            .and_then(Value::as_f64)
            .filter(|f| f.is_finite() && *f >= 0.0)
    };
    crate::engine_timings::LlamaTimings {
        cache_n: uint("cache_n"),
        prompt_n: uint("prompt_n"),
        prompt_ms: float("prompt_ms"),
        predicted_n: uint("predicted_n"),
        predicted_ms: float("predicted_ms"),
        predicted_per_token_ms: float("predicted_per_token_ms"),
    }
    .report()
}

/// The top-level reading: (is error, choices, usage), `None` when a field is refused.
type Top = (bool, Option<Vec<ChoiceInfo>>, Option<Usage>);

fn oracle_top(m: &Map<String, Value>) -> Option<Top> {
    let choices = match m.get("choices") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(a.iter().map(oracle_choice).collect::<Option<Vec<_>>>()?),
        Some(_) => return None,
    };
    let usage = match m.get("usage") {
        None | Some(Value::Null) => None,
        Some(Value::Object(u)) => Some(Usage {
            prompt_tokens: opt_uint(u.get("prompt_tokens"))?,
            completion_tokens: opt_uint(u.get("completion_tokens"))?,
            reasoning_tokens: u
                .get("completion_tokens_details")
                .and_then(Value::as_object)
                .and_then(|d| d.get("reasoning_tokens"))
                .and_then(Value::as_u64),
            engine: oracle_engine(m, u),
        }),
        Some(_) => return None,
    };
    let error = m.get("error").is_some_and(|v| !v.is_null())
        || m.get("object").is_some_and(|v| v == "error");
    Some((error, choices, usage))
}

/// What a payload says, in public terms: what [`scan_event`] must return, compared by value.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub kind: ChunkKind,
    pub choice_count: u32,
    pub finished_count: u32,
    pub output: bool,
    pub tokens: u32,
    pub usage: Option<Usage>,
    /// The kept choices (at most [`MAX_CHOICES_PER_CHUNK`]).
    pub choices: Vec<ChoiceInfo>,
    /// The value of `system_fingerprint`, when the payload is a JSON object with one not null.
    pub fingerprint: Option<Value>,
    /// llama.cpp's `timings`, read (chunks only) and raw (when not null, as the fingerprint).
    pub timings: Option<crate::engine_timings::TimingsReport>,
    pub timings_raw: Option<Value>,
    /// What a traced scan logs (chunks only): every choice with tokens or output.
    pub log: Vec<LogChoice>,
    /// The tool-call entries an untraced scan logs (chunks only).
    pub calls: Vec<LogCall>,
}

/// A token in plain terms: logprob, text, alternatives (by text, the last of a repeated one).
pub type LogToken = (Option<f64>, Option<String>, BTreeMap<String, Option<f64>>);
/// A logged choice: index, phases, text length, tokens.
pub type LogChoice = (u32, Phases, u32, Vec<LogToken>);
/// A tool-call entry: choice index, call index, `id` present, name, arguments.
pub type LogCall = (u32, u32, bool, Option<String>, Option<String>);

/// Where [`lax`] changed the payload, the oracle's strings and numbers are not the payload's:
/// only their presence is compared.
fn blur(log: &mut [LogChoice]) {
    for (_, _, len, tokens) in log {
        *len = 0;
        for (lp, text, alts) in tokens.iter_mut() {
            *lp = lp.map(|_| 0.0);
            *text = text.as_ref().map(|_| String::new());
            *alts = if alts.is_empty() {
                BTreeMap::new()
            } else {
                BTreeMap::from([(String::new(), None)])
            };
        }
    }
}

/// The scanner's token log of `data`, in plain terms.
fn scanned_log(data: &[u8]) -> (ChunkKind, Vec<LogChoice>) {
    let mut log = TokenLog::new(true);
    let kind = scan_event_logged(data, &mut log).info.kind;
    if kind != ChunkKind::Chunk {
        return (kind, Vec::new());
    }
    let out = log
        .choices
        .iter()
        .map(|c| {
            let tokens = (c.tokens.start..c.tokens.end)
                .map(|i| {
                    let t = log.tokens[i as usize];
                    let alts = log
                        .alternatives
                        .iter()
                        .filter(|a| a.token == i)
                        .map(|a| (a.text.decode(data), a.logprob))
                        .collect();
                    (t.logprob, t.text.map(|s| s.decode(data)), alts)
                })
                .collect();
            (c.index, c.phases, c.text_len, tokens)
        })
        .collect();
    (kind, out)
}

fn text_len(v: Option<&Value>) -> u32 {
    v.and_then(Value::as_str).map_or(0, |s| s.len() as u32)
}

fn oracle_log_choice(c: &Map<String, Value>, info: &ChoiceInfo) -> Option<LogChoice> {
    let mut len = text_len(c.get("text"));
    if let Some(Value::Object(d)) = c.get("delta") {
        for k in ["content", "reasoning_content", "reasoning"] {
            len += text_len(d.get(k));
        }
        for call in d
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(Value::Object(f)) = call.get("function") {
                len += text_len(f.get("name")) + text_len(f.get("arguments"));
            }
        }
    }
    let mut tokens: Vec<LogToken> = Vec::new();
    if let Some(Value::Object(l)) = c.get("logprobs") {
        match l.get("content") {
            Some(Value::Array(entries)) => {
                for e in entries {
                    let alts = e
                        .get("top_logprobs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|a| {
                            let t = a.get("token")?.as_str()?.to_string();
                            Some((t, a.get("logprob").and_then(Value::as_f64)))
                        })
                        .collect();
                    let lp = e.get("logprob").and_then(Value::as_f64);
                    let text = e.get("token").and_then(Value::as_str).map(String::from);
                    tokens.push((lp, text, alts));
                }
            }
            _ => {
                let texts = l.get("tokens").and_then(Value::as_array);
                for (j, t) in texts.into_iter().flatten().enumerate() {
                    let lp = l
                        .get("token_logprobs")
                        .and_then(|v| v.as_array()?.get(j)?.as_f64());
                    let alts = l
                        .get("top_logprobs")
                        .and_then(|v| v.as_array()?.get(j)?.as_object())
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_f64()))
                        .collect();
                    tokens.push((lp, t.as_str().map(String::from), alts));
                }
            }
        }
    }
    (!tokens.is_empty() || !info.phases.is_empty()).then_some((
        info.index,
        info.phases,
        len,
        tokens,
    ))
}

fn oracle_log(m: &Map<String, Value>) -> Vec<LogChoice> {
    let Some(Value::Array(choices)) = m.get("choices") else {
        return Vec::new();
    };
    choices
        .iter()
        .filter_map(|c| {
            let info = oracle_choice(c)?;
            oracle_log_choice(c.as_object()?, &info)
        })
        .collect()
}

impl Expected {
    fn of_kind(kind: ChunkKind, fingerprint: Option<Value>) -> Self {
        Expected {
            kind,
            choice_count: 0,
            finished_count: 0,
            output: false,
            tokens: 0,
            usage: None,
            choices: Vec::new(),
            fingerprint,
            timings: None,
            timings_raw: None,
            log: Vec::new(),
            calls: Vec::new(),
        }
    }

    /// The scanner's answer for `data` in the same terms (the fingerprint's range parsed).
    pub fn scanned(data: &[u8]) -> Self {
        let s = scan_event(data);
        let (kind, mut log) = scanned_log(data);
        assert_eq!(kind, s.info.kind, "a traced scan reads as an untraced one");
        if lax(data) != data {
            blur(&mut log);
        }
        Expected {
            kind: s.info.kind,
            choice_count: s.info.choice_count,
            finished_count: s.info.finished_count,
            output: s.info.output,
            tokens: s.info.tokens,
            usage: s.info.usage,
            choices: s.info.choices().to_vec(),
            fingerprint: s
                .fingerprint
                .map(|r| serde_json::from_slice::<Value>(&lax(&data[r])).unwrap_or(Value::Null)),
            timings: s.info.timings,
            timings_raw: s
                .timings
                .map(|r| serde_json::from_slice::<Value>(&lax(&data[r])).unwrap_or(Value::Null)),
            log,
            calls: scanned_calls(data),
        }
    }
}

/// What the scanner must say about `data`.
pub fn oracle(data: &[u8]) -> Expected {
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return Expected::of_kind(ChunkKind::Done, None);
    }
    let Some(m) = parse(data) else {
        return Expected::of_kind(ChunkKind::Unknown, None);
    };
    let Some((error, choices, usage)) = oracle_top(&m) else {
        return Expected::of_kind(ChunkKind::Unknown, None);
    };
    let fingerprint = m
        .get("system_fingerprint")
        .filter(|v| !v.is_null())
        .cloned();
    let timings_raw = m.get("timings").filter(|v| !v.is_null()).cloned();
    if error || (choices.is_none() && usage.is_none()) {
        let kind = if error {
            ChunkKind::Error
        } else {
            ChunkKind::Unknown
        };
        let mut e = Expected::of_kind(kind, fingerprint);
        e.timings_raw = timings_raw;
        return e;
    }
    let mut e = Expected::of_kind(ChunkKind::Chunk, fingerprint);
    e.timings = oracle_timings(&m);
    e.timings_raw = timings_raw;
    e.log = oracle_log(&m);
    e.calls = oracle_calls(&m, "delta");
    if lax(data) != data {
        blur(&mut e.log);
        blur_calls(&mut e.calls);
    }
    e.usage = usage;
    for c in choices.iter().flatten() {
        e.choice_count += 1;
        e.finished_count += u32::from(c.finish.is_some());
        e.output |= c.output;
        e.tokens = e.tokens.saturating_add(c.tokens);
        if e.choices.len() < MAX_CHOICES_PER_CHUNK {
            e.choices.push(*c);
        }
    }
    e
}

pub fn oracle_response(body: &[u8]) -> ResponseInfo {
    let mut info = ResponseInfo {
        parsed: false,
        error: false,
        choice_count: 0,
        finished_count: 0,
        failed_count: 0,
        finish_reason: None,
        usage: None,
        timings: None,
    };
    let Some((error, choices, usage)) = parse(body.trim_ascii()).as_ref().and_then(oracle_top)
    else {
        return info;
    };
    info.parsed = true;
    info.error = error;
    info.usage = usage;
    info.timings = parse(body.trim_ascii()).as_ref().and_then(oracle_timings);
    if let Some(c) = choices {
        let finish = |c: &ChoiceInfo| c.finish;
        info.choice_count = c.len() as u32;
        info.finished_count = c.iter().filter(|c| c.finish.is_some()).count() as u32;
        info.failed_count = c
            .iter()
            .filter(|c| c.finish.is_some_and(FinishReason::engine_gave_up))
            .count() as u32;
        let kept = &c[..c.len().min(MAX_CHOICES_PER_CHUNK)];
        info.finish_reason = kept
            .iter()
            .filter_map(finish)
            .find(|f| f.engine_gave_up())
            .or_else(|| kept.iter().find_map(finish));
    }
    info
}

/// Scanner == oracle, chunk and response readings; a message saying where they differ.
pub fn differs(data: &[u8]) -> Option<String> {
    let (got, want) = (Expected::scanned(data), oracle(data));
    if got != want {
        return Some(format!("scan {got:?}\noracle {want:?}"));
    }
    let (got, want) = (inspect_response(data), oracle_response(data));
    if got != want {
        return Some(format!("response: scan {got:?}\noracle {want:?}"));
    }
    let (got, want) = (scanned_response_calls(data), oracle_response_calls(data));
    (got != want).then(|| format!("response calls: scan {got:?}\noracle {want:?}"))
}

/// Where [`lax`] changed the payload, only the presence of names and arguments is compared.
fn blur_calls(calls: &mut [LogCall]) {
    for c in calls {
        c.3 = c.3.as_ref().map(|_| String::new());
        c.4 = c.4.as_ref().map(|_| String::new());
    }
}

fn plain_calls(log: &[LoggedCall], data: &[u8]) -> Vec<LogCall> {
    let mut calls: Vec<LogCall> = log
        .iter()
        .map(|c| {
            let text = |s: Option<Span>| s.map(|s| s.decode(data));
            (c.choice, c.index, c.id, text(c.name), text(c.arguments))
        })
        .collect();
    if lax(data) != data {
        blur_calls(&mut calls);
    }
    calls
}

/// The tool-call entries an untraced scan of `data` logs (none unless it is a chunk).
fn scanned_calls(data: &[u8]) -> Vec<LogCall> {
    let mut log = TokenLog::new(false);
    if scan_event_logged(data, &mut log).info.kind != ChunkKind::Chunk {
        return Vec::new();
    }
    plain_calls(&log.calls, data)
}

/// The `message.tool_calls` entries the scan of a non-streaming body logs (none unless it
/// parsed).
fn scanned_response_calls(data: &[u8]) -> Vec<LogCall> {
    let mut log = TokenLog::new(false);
    if !inspect_response_logged(data, &mut log).parsed {
        return Vec::new();
    }
    plain_calls(&log.calls, data)
}

fn oracle_response_calls(data: &[u8]) -> Vec<LogCall> {
    let Some(m) = parse(data.trim_ascii()) else {
        return Vec::new();
    };
    if oracle_top(&m).is_none() {
        return Vec::new();
    }
    let mut calls = oracle_calls(&m, "message");
    if lax(data) != data {
        blur_calls(&mut calls);
    }
    calls
}

/// The calls of every choice's `key` (`delta`, or a body's `message`, whose calls are indexed
/// by position), by the rules of `inspect/calls.rs`'s docs.
fn oracle_calls(m: &Map<String, Value>, key: &str) -> Vec<LogCall> {
    let Some(Value::Array(choices)) = m.get("choices") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for c in choices {
        let Some(info) = oracle_choice(c) else {
            continue;
        };
        let calls = c
            .get(key)
            .and_then(Value::as_object)
            .and_then(|d| d.get("tool_calls"))
            .and_then(Value::as_array);
        for (at, e) in calls.into_iter().flatten().enumerate() {
            let Some(e) = e.as_object() else { continue };
            let index = match (key, e.get("index")) {
                ("message", _) => at as u32,
                (_, None) => 0,
                (_, Some(v)) => match v.as_u64().and_then(|v| u32::try_from(v).ok()) {
                    Some(i) => i,
                    None => continue,
                },
            };
            let text = |v: Option<&Value>| match v {
                None | Some(Value::Null) => Some(None),
                Some(Value::String(s)) => Some(Some(s.clone())),
                Some(_) => None,
            };
            let (name, arguments) = match e.get("function") {
                None | Some(Value::Null) => (None, None),
                Some(Value::Object(f)) => match (text(f.get("name")), text(f.get("arguments"))) {
                    (Some(n), Some(a)) => (n, a),
                    _ => continue,
                },
                Some(_) => continue,
            };
            let id = e.get("id").is_some_and(|v| !v.is_null());
            out.push((info.index, index, id, name, arguments));
        }
    }
    out
}
