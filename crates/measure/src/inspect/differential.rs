//! The one-pass scanner against a full `serde_json::Value` parse of the same payload, over the
//! real vLLM captures, the simulator's output, and generated events.
//!
//! The oracle (`oracle.rs`, shared with the fuzz target) reads a `Value` and applies the field
//! rules of [`scan_event`]'s docs; it shares no code with the scanner.

use proptest::prelude::*;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::oracle::{differs, lax, oracle};
use super::*;
use crate::sse::SseParser;

/// Every data payload of every real capture, in capture order (parsed once).
pub(crate) fn captured_events() -> &'static [Vec<u8>] {
    static EVENTS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    EVENTS.get_or_init(|| {
        let mut out = Vec::new();
        for (_, raw) in crate::fixtures::CAPTURES {
            let body = crate::fixtures::parse_capture(raw).body;
            let mut p = SseParser::new();
            p.feed(body, |ev| out.push(ev.data.to_vec()));
            p.finish(|ev| out.push(ev.data.to_vec()));
        }
        out
    })
}

/// Scanner == oracle on one payload, and the whole [`ChunkInfo`] (stale entries past the kept
/// choices included) equal to one built from the oracle; returns the oracle's kind.
fn check(data: &[u8]) -> Result<ChunkKind, TestCaseError> {
    let shown = || String::from_utf8_lossy(data).into_owned();
    if let Some(diff) = differs(data) {
        return Err(TestCaseError::fail(format!(
            "{}\npayload {}",
            diff,
            shown()
        )));
    }
    let want = oracle(data);
    let mut built = ChunkInfo::of_kind(want.kind);
    (
        built.choice_count,
        built.finished_count,
        built.output,
        built.tokens,
        built.usage,
    ) = (
        want.choice_count,
        want.finished_count,
        want.output,
        want.tokens,
        want.usage,
    );
    built.choices[..want.choices.len()].copy_from_slice(&want.choices);
    built.kept = want.choices.len() as u8;
    built.timings = want.timings;
    prop_assert_eq!(inspect_chunk(data), built, "payload {}", shown());
    Ok(want.kind)
}

/// The data payloads of an SSE byte stream, and every line that is a JSON object (the
/// non-streaming bodies and error bodies of the captures).
fn payloads(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut p = SseParser::new();
    p.feed(bytes, |e| out.push(e.data.to_vec()));
    p.finish(|e| out.push(e.data.to_vec()));
    out.extend(
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| l.starts_with(b"{"))
            .map(<[u8]>::to_vec),
    );
    out
}

/// Kinds seen, and how many payloads carried output / a finish / usage / a fingerprint: the
/// corpora must exercise every reading, or a broken scanner could agree with a broken oracle
/// on nothing.
#[derive(Default, Debug)]
struct Seen {
    kinds: Vec<ChunkKind>,
    output: usize,
    finish: usize,
    usage: usize,
    fingerprint: usize,
    logprob_tokens: usize,
    /// Logged tokens with a logprob, with alternatives; logged choices with a text length.
    logprob_values: usize,
    alternatives: usize,
    text_lengths: usize,
    /// Tool-call entries logged (with a name, with arguments), non-streaming ones, usage
    /// reasoning counts.
    calls: usize,
    call_names: usize,
    call_arguments: usize,
    message_calls: usize,
    reasoning_tokens: usize,
}

impl Seen {
    fn add(&mut self, data: &[u8]) -> Result<(), TestCaseError> {
        let kind = check(data)?;
        if !self.kinds.contains(&kind) {
            self.kinds.push(kind);
        }
        let s = scan_event(data);
        self.output += usize::from(s.info.output);
        self.finish += usize::from(s.info.finished_count > 0);
        self.usage += usize::from(s.info.usage.is_some());
        self.fingerprint += usize::from(s.fingerprint.is_some());
        self.logprob_tokens += usize::from(s.info.choices().iter().any(|c| c.tokens > 1));
        let e = oracle(data);
        let tokens = || e.log.iter().flat_map(|c| c.3.iter());
        self.logprob_values += tokens().filter(|t| t.0.is_some()).count();
        self.alternatives += tokens().filter(|t| !t.2.is_empty()).count();
        self.text_lengths += e.log.iter().filter(|c| c.2 > 0).count();
        self.calls += e.calls.len();
        self.call_names += e.calls.iter().filter(|c| c.3.is_some()).count();
        self.call_arguments += e.calls.iter().filter(|c| c.4.is_some()).count();
        let mut log = TokenLog::new(false);
        if inspect_response_logged(data, &mut log).parsed {
            self.message_calls += log.calls.len();
        }
        let reasoning = s.info.usage.is_some_and(|u| u.reasoning_tokens.is_some());
        self.reasoning_tokens += usize::from(reasoning);
        Ok(())
    }

    /// The tool-call readings: calls in events and in non-streaming bodies, usage reasoning
    /// counts.
    fn assert_covers_calls(&self) {
        assert!(
            self.calls > 0 && self.call_names > 0 && self.call_arguments > 0,
            "tool calls: {self:?}"
        );
        assert!(
            self.message_calls > 0 && self.reasoning_tokens > 0,
            "tool calls: {self:?}"
        );
    }

    fn assert_covers(&self, kinds: &[ChunkKind]) {
        for k in kinds {
            assert!(self.kinds.contains(k), "no {k:?} payload: {self:?}");
        }
        assert!(
            self.output > 0 && self.finish > 0 && self.usage > 0 && self.fingerprint > 0,
            "{self:?}"
        );
        assert!(
            self.logprob_values > 0 && self.alternatives > 0 && self.text_lengths > 0,
            "the token log: {self:?}"
        );
    }
}

#[test]
fn every_real_capture() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/vllm-0.32"
    );
    let mut files = 0;
    let mut seen = Seen::default();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "txt") {
            files += 1;
            for data in payloads(&std::fs::read(&path).unwrap()) {
                seen.add(&data).unwrap();
            }
        }
    }
    assert!(files >= 29, "captures found: {files}");
    seen.assert_covers(&[ChunkKind::Chunk, ChunkKind::Done, ChunkKind::Error]);
    assert!(seen.logprob_tokens > 0, "{seen:?}");
    seen.assert_covers_calls();
}

/// The simulator's streams, rendered in-process: chat and completions, logprobs, `n`, usage,
/// continuous usage, stop strings, early finishes, the malformed chunk and the error event.
#[test]
fn the_simulators_output() {
    use bytes::BytesMut;
    use goodput_sim::errors::stream_error_event;
    use goodput_sim::gen::Generation;
    use goodput_sim::render::{Finish, Templates, DONE};
    use goodput_sim::request::{parse, Api};

    let requests: &[(Api, &str)] = &[
        (
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":12}"#,
        ),
        (
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":9,"n":2,"logprobs":true,"top_logprobs":3,"stream_options":{"include_usage":true}}"#,
        ),
        (
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":9,"stop":["e"],"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
        ),
        (
            Api::Completions,
            r#"{"prompt":"The quick","stream":true,"max_tokens":9,"n":3,"logprobs":2,"stream_options":{"include_usage":true}}"#,
        ),
        (
            Api::Completions,
            r#"{"prompt":"The quick","stream":true,"max_tokens":7}"#,
        ),
    ];
    let models = ["tiny".to_string()];
    let mut seen = Seen::default();
    for seed in 0..6u64 {
        for (api, body) in requests {
            let req = parse(*api, body.as_bytes(), &models, 2048, seed).unwrap();
            let t = Templates::new(&req, "tiny", 1795964150);
            let mut g = Generation::new(&req, 0.1, 0.1);
            let mut buf = BytesMut::new();
            if *api == Api::Chat {
                (0..g.n()).for_each(|i| t.role_chunk(&mut buf, i));
            }
            for step in 0.. {
                let mut any = false;
                for i in 0..g.n() {
                    if seed == 5 && step == 3 && g.end_early(i, Finish::Abort) {
                        t.token_chunk(&mut buf, i, &[], None, Some(&Finish::Abort), g.tokens(i));
                        continue;
                    }
                    if let Some(tok) = g.next(i) {
                        any = true;
                        let lp = tok.logprobs.as_ref().map(std::slice::from_ref);
                        let text = std::slice::from_ref(&tok.text);
                        t.token_chunk(&mut buf, i, text, lp, tok.finish.as_ref(), tok.count);
                    }
                }
                if !any {
                    break;
                }
            }
            if req.include_usage {
                t.usage_chunk(&mut buf, g.total_tokens(), None);
            }
            t.malformed_chunk(&mut buf);
            buf.extend_from_slice(stream_error_event("boom \"x\"\n").as_bytes());
            buf.extend_from_slice(DONE);
            for data in payloads(&buf) {
                seen.add(&data).unwrap();
            }
        }
    }
    seen.assert_covers(&[
        ChunkKind::Chunk,
        ChunkKind::Done,
        ChunkKind::Error,
        ChunkKind::Unknown,
    ]);
}

#[test]
fn lax_only_admits_what_serde_json_skips_as_valid() {
    let cases: &[&[u8]] = &[
        br#"{"a":"\ud800"}"#,
        br#"{"a":"\udc00\ud83d\ude00x"}"#,
        br#"{"a":1e400,"b":-2.5E+999,"c":1e-999}"#,
        b"{\"a\":\"\xff\xc3\"}",
        br#"{"a":"\\ud800"}"#,
        br#"{"a":"\u1e400"}"#,
        b"{\"a\":1e400x}",
        b"{\xff:1}",
        b"\xff",
    ];
    for data in cases {
        let skips = serde_json::from_slice::<IgnoredAny>(data).is_ok();
        let parses = serde_json::from_slice::<Value>(&lax(data)).is_ok();
        assert_eq!(skips, parses, "{}", String::from_utf8_lossy(data));
    }
}

/// A JSON tree for generated events; rendered with random whitespace and escapes.
#[derive(Debug, Clone)]
enum J {
    Raw(&'static str),
    Num(&'static str),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

/// A small deterministic generator (seeded by proptest; the agent meter's differential test
/// draws from it too).
pub(crate) struct Gen(pub(crate) u64);

impl Gen {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    pub(crate) fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())].clone()
    }

    fn number(&mut self) -> J {
        J::Num(self.pick(&[
            "0",
            "-0",
            "7",
            "12",
            "-12",
            "1.5",
            "-0.0",
            "1e5",
            "1E+5",
            "2.5e-3",
            "1e400",
            "-1e400",
            "4294967295",
            "4294967296",
            "18446744073709551615",
            "18446744073709551616",
            "123456789012345678901234567890",
            "0.000001",
        ]))
    }

    fn text(&mut self) -> String {
        let pieces = [
            "",
            "a",
            " will",
            "\n",
            "é",
            "日本",
            "😀",
            "\"",
            "\\",
            "/",
            "\u{0}",
            "\u{1f}",
            "\u{7f}",
            "\u{2028}",
            "finish_reason",
            "\"finish_reason\":\"stop\"",
            "usage",
            "stop",
            "null",
        ];
        (0..self.below(3)).map(|_| self.pick(&pieces)).collect()
    }

    /// Any value, nested up to `depth`.
    fn junk(&mut self, depth: u32) -> J {
        match self.below(if depth == 0 { 4 } else { 6 }) {
            0 => J::Raw(self.pick(&["null", "true", "false"])),
            1 => self.number(),
            2 | 3 => J::Str(self.text()),
            4 => J::Arr((0..self.below(3)).map(|_| self.junk(depth - 1)).collect()),
            _ => {
                let keys = [
                    "finish_reason",
                    "usage",
                    "choices",
                    "text",
                    "content",
                    "x",
                    "",
                ];
                J::Obj(
                    (0..self.below(3))
                        .map(|_| (self.pick(&keys).to_string(), self.junk(depth - 1)))
                        .collect(),
                )
            }
        }
    }

    /// A field value: usually of the expected shape, sometimes null, sometimes anything.
    fn field(&mut self, expected: impl FnOnce(&mut Self) -> J) -> J {
        match self.below(10) {
            0 => J::Raw("null"),
            1 => self.junk(2),
            _ => expected(self),
        }
    }

    fn output(&mut self) -> J {
        match self.below(6) {
            0 => J::Arr(vec![]),
            1 => J::Obj(vec![]),
            _ => J::Str(self.text()),
        }
    }

    /// Argument fragments: JSON pieces cut anywhere, with keys the scanner reads elsewhere
    /// (`finish_reason`, `reasoning`, `usage`) as text, escapes and unicode.
    fn fragment(&mut self) -> String {
        let pieces = [
            r#"{"finish_reason":"stop"}"#,
            r#"{"usage":{"prompt_tokens":1},"choices":[]}"#,
            r#""reasoning": "#,
            r#"{"tool_calls":[{"index":3}]}"#,
            "{",
            "}",
            r#"{"location": "Z\u00fcrich"#,
            r#" \"old\" town"}"#,
            "日本 😀",
            r"\n\t",
            r"\",
            "\u{0}\u{1f}",
            ":",
            ", ",
        ];
        (0..self.below(3)).map(|_| self.pick(&pieces)).collect()
    }

    fn tool_calls(&mut self) -> J {
        let call = |g: &mut Self| {
            let mut f = Vec::new();
            if g.chance(50) {
                let v = g.field(|g| J::Str(g.pick(&["get_weather", "f", "", "日"]).into()));
                f.push(("name".to_string(), v));
            }
            if g.chance(80) {
                let v = g.field(|g| J::Str(g.fragment()));
                f.push(("arguments".to_string(), v));
            }
            g.duplicate(&mut f);
            let mut m = Vec::new();
            if g.chance(85) {
                let v = if g.chance(85) {
                    J::Num(g.pick(&["0", "1", "2"]))
                } else {
                    g.number()
                };
                m.push(("index".to_string(), v));
            }
            if g.chance(40) {
                let v = g.field(|_| J::Str("chatcmpl-tool-9f2a".into()));
                m.push(("id".to_string(), v));
                m.push(("type".to_string(), J::Str("function".into())));
            }
            if g.chance(90) {
                let v = g.field(|_| J::Obj(f));
                m.push(("function".to_string(), v));
            }
            g.duplicate(&mut m);
            if g.chance(5) {
                g.junk(1)
            } else {
                J::Obj(m)
            }
        };
        J::Arr((0..self.below(3)).map(|_| call(self)).collect())
    }

    fn delta(&mut self) -> J {
        let mut m: Vec<(String, J)> = Vec::new();
        if self.chance(30) {
            m.push(("role".into(), J::Str("assistant".into())));
        }
        for key in ["content", "reasoning_content", "reasoning"] {
            if self.chance(40) {
                let v = self.field(Self::output);
                m.push((key.into(), v));
            }
        }
        if self.chance(25) {
            let v = self.field(Self::tool_calls);
            m.push(("tool_calls".into(), v));
        }
        if self.chance(15) {
            m.push((
                "extra".into(),
                J::Obj(vec![
                    ("finish_reason".into(), J::Str("stop".into())),
                    ("content".into(), J::Str("x".into())),
                ]),
            ));
        }
        self.duplicate(&mut m);
        J::Obj(m)
    }

    /// A logprob: usually a number, sometimes anything.
    fn logprob(&mut self) -> J {
        if self.chance(85) {
            J::Num(self.pick(&[
                "-7.624619960784912",
                "0.0",
                "-9999.0",
                "-0.5",
                "-1e-3",
                "-2",
                "1e400",
            ]))
        } else {
            self.junk(1)
        }
    }

    /// Chat entries `{"token", "logprob", "bytes", "top_logprobs": [...]}`.
    fn chat_entries(&mut self) -> J {
        let alt = |g: &mut Self| {
            let mut m = vec![
                ("token".to_string(), J::Str(g.text())),
                ("logprob".to_string(), g.logprob()),
            ];
            g.duplicate(&mut m);
            if g.chance(5) {
                g.junk(1)
            } else {
                J::Obj(m)
            }
        };
        let entry = |g: &mut Self| {
            let mut m = vec![("token".to_string(), J::Str(g.text()))];
            if g.chance(85) {
                m.push(("logprob".into(), g.logprob()));
            }
            m.push(("bytes".into(), J::Arr(vec![J::Num("83"), J::Num("69")])));
            if g.chance(60) {
                let v = g.field(|g| J::Arr((0..g.below(4)).map(|_| alt(g)).collect()));
                m.push(("top_logprobs".into(), v));
            }
            g.duplicate(&mut m);
            if g.chance(5) {
                g.junk(1)
            } else {
                J::Obj(m)
            }
        };
        J::Arr((0..self.below(4)).map(|_| entry(self)).collect())
    }

    /// Completions arrays: `tokens`, `token_logprobs`, `top_logprobs` ({token: logprob}).
    fn legacy(&mut self, m: &mut Vec<(String, J)>) {
        let n = self.below(4);
        let v = self.field(|g| J::Arr((0..n).map(|_| J::Str(g.text())).collect()));
        m.push(("tokens".into(), v));
        if self.chance(80) {
            let v = self.field(|g| J::Arr((0..n).map(|_| g.logprob()).collect()));
            m.push(("token_logprobs".into(), v));
        }
        if self.chance(60) {
            let v = self.field(|g| {
                J::Arr(
                    (0..n)
                        .map(|_| {
                            let k = g.below(3);
                            J::Obj((0..k).map(|_| (g.text(), g.logprob())).collect())
                        })
                        .collect(),
                )
            });
            m.push(("top_logprobs".into(), v));
        }
    }

    fn logprobs(&mut self) -> J {
        let mut m = Vec::new();
        if self.chance(50) {
            let v = self.field(Self::chat_entries);
            m.push(("content".to_string(), v));
        }
        if self.chance(50) {
            self.legacy(&mut m);
        }
        if self.chance(10) {
            m.push(("top_logprobs".into(), self.junk(2)));
        }
        self.duplicate(&mut m);
        J::Obj(m)
    }

    fn choice(&mut self) -> J {
        let mut m: Vec<(String, J)> = Vec::new();
        if self.chance(90) {
            let v = if self.chance(80) {
                J::Num(self.pick(&["0", "1", "2", "15"]))
            } else {
                self.junk(1)
            };
            m.push(("index".into(), v));
        }
        if self.chance(15) {
            // A non-streaming body's choice.
            let v = self.field(|g| {
                let mut m = vec![("role".to_string(), J::Str("assistant".into()))];
                if g.chance(70) {
                    let v = g.field(Self::tool_calls);
                    m.push(("tool_calls".into(), v));
                }
                m.push(("content".into(), g.output()));
                g.duplicate(&mut m);
                J::Obj(m)
            });
            m.push(("message".into(), v));
        }
        if self.chance(70) {
            let v = self.field(Self::delta);
            m.push(("delta".into(), v));
        } else {
            let v = self.field(Self::output);
            m.push(("text".into(), v));
        }
        if self.chance(40) {
            let v = self.field(Self::logprobs);
            m.push(("logprobs".into(), v));
        }
        if self.chance(85) {
            let v = self.field(|g| {
                J::Str(
                    g.pick(&[
                        "stop",
                        "length",
                        "tool_calls",
                        "abort",
                        "error",
                        "weird",
                        "repetition",
                        "content_filter",
                        "function_call",
                        "",
                    ])
                    .to_string(),
                )
            });
            m.push(("finish_reason".into(), v));
        }
        if self.chance(30) {
            m.push(("stop_reason".into(), self.junk(1)));
        }
        self.duplicate(&mut m);
        J::Obj(m)
    }

    fn usage(&mut self) -> J {
        let mut m = Vec::new();
        for key in ["prompt_tokens", "total_tokens", "completion_tokens"] {
            if self.chance(85) {
                let v = if self.chance(85) {
                    J::Num(self.pick(&["0", "16", "32", "1000000"]))
                } else {
                    self.junk(1)
                };
                m.push((key.to_string(), v));
            }
        }
        if self.chance(40) {
            let v = self.field(|g| {
                let mut d = vec![(
                    "reasoning_tokens".to_string(),
                    g.field(|g| J::Num(g.pick(&["0", "11", "4294967296"]))),
                )];
                g.duplicate(&mut d);
                J::Obj(d)
            });
            m.push(("completion_tokens_details".into(), v));
        }
        self.duplicate(&mut m);
        J::Obj(m)
    }

    fn chunk(&mut self) -> J {
        let mut m: Vec<(String, J)> = vec![
            ("id".into(), J::Str("chatcmpl-a45afd70d01f6372".into())),
            (
                "object".into(),
                J::Str(
                    self.pick(&["chat.completion.chunk", "text_completion", "error"])
                        .into(),
                ),
            ),
            ("created".into(), J::Num("1795964150")),
            ("model".into(), J::Str(self.text())),
        ];
        if self.chance(85) {
            let v = self.field(|g| {
                let n = if g.chance(5) { 20 } else { g.below(3) };
                J::Arr((0..n).map(|_| g.choice()).collect())
            });
            m.push(("choices".into(), v));
        }
        if self.chance(30) {
            let v = self.field(Self::usage);
            m.push(("usage".into(), v));
        }
        if self.chance(8) {
            let v = self.field(|g| J::Obj(vec![("message".into(), J::Str(g.text()))]));
            m.push(("error".into(), v));
        }
        if self.chance(35) {
            let v = self.field(|_| J::Str("vllm-0.32.0-f1283a03".into()));
            m.push(("system_fingerprint".into(), v));
        }
        if self.chance(15) {
            // llama.cpp's `timings`: known fields with odd values too, and unknown ones.
            let v = self.field(|g| {
                let mut t: Vec<(String, J)> = Vec::new();
                for key in [
                    "cache_n",
                    "prompt_n",
                    "prompt_ms",
                    "prompt_per_second",
                    "predicted_n",
                    "predicted_ms",
                    "predicted_per_token_ms",
                    "draft_n",
                ] {
                    if g.chance(70) {
                        // No exponent `lax` rewrites: the oracle would read another number.
                        let v = match g.below(10) {
                            0 => J::Raw("null"),
                            1 => J::Str("x".into()),
                            _ => J::Num(
                                g.pick(&["0", "1", "5", "63", "0.242", "1.5e2", "-1", "2.0"]),
                            ),
                        };
                        t.push((key.into(), v));
                    }
                }
                J::Obj(t)
            });
            m.push(("timings".into(), v));
        }
        for _ in 0..self.below(3) {
            let key = self.pick(&["prompt_token_ids", "Choices", "usage_", "finish_reason"]);
            m.push((key.into(), self.junk(3)));
        }
        self.duplicate(&mut m);
        let order = (0..m.len()).map(|_| self.next()).collect::<Vec<_>>();
        let mut keyed: Vec<_> = order.into_iter().zip(m).collect();
        if self.chance(70) {
            keyed.sort_by_key(|(k, _)| *k);
        }
        J::Obj(keyed.into_iter().map(|(_, kv)| kv).collect())
    }

    /// Sometimes a key twice, the copy with any value: the last one counts.
    fn duplicate(&mut self, m: &mut Vec<(String, J)>) {
        if self.chance(10) && !m.is_empty() {
            let key = self.pick(m).0;
            let at = self.below(m.len() + 1);
            let v = self.junk(2);
            m.insert(at, (key, v));
        }
    }

    fn ws(&mut self, out: &mut Vec<u8>) {
        if self.chance(15) {
            out.extend_from_slice(self.pick(&[" ", "\n", "\t", "\r\n", "  "]).as_bytes());
        }
    }

    fn string(&mut self, s: &str, out: &mut Vec<u8>) {
        out.push(b'"');
        for ch in s.chars() {
            let escape = self.chance(8);
            match ch {
                '"' => out.extend_from_slice(br#"\""#),
                '\\' => out.extend_from_slice(br"\\"),
                '\n' if !escape => out.extend_from_slice(br"\n"),
                '/' if escape => out.extend_from_slice(br"\/"),
                c if escape || (c as u32) < 0x20 => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        let hex = if self.chance(50) {
                            format!("\\u{u:04x}")
                        } else {
                            format!("\\u{u:04X}")
                        };
                        out.extend_from_slice(hex.as_bytes());
                    }
                }
                c => {
                    let mut b = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
        if self.chance(3) {
            out.extend_from_slice(
                self.pick(&[r"\ud800", r"\udc00", r"\ud83d\ude00"])
                    .as_bytes(),
            );
        }
        out.push(b'"');
    }

    fn render(&mut self, j: &J, out: &mut Vec<u8>) {
        self.ws(out);
        match j {
            J::Raw(s) | J::Num(s) => out.extend_from_slice(s.as_bytes()),
            J::Str(s) => self.string(s, out),
            J::Arr(items) => {
                out.push(b'[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.render(v, out);
                }
                self.ws(out);
                out.push(b']');
            }
            J::Obj(members) => {
                out.push(b'{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.ws(out);
                    self.string(k, out);
                    self.ws(out);
                    out.push(b':');
                    self.render(v, out);
                    self.ws(out);
                }
                self.ws(out);
                out.push(b'}');
            }
        }
    }

    /// Sometimes break the text: cut it, or change, insert or remove one byte.
    fn mutate(&mut self, out: &mut Vec<u8>) {
        if out.is_empty() || !self.chance(20) {
            return;
        }
        let at = self.below(out.len());
        let byte = self.pick(b"\"\\{}[]:,x0 \x01\xff\xc3\x80e.-");
        match self.below(4) {
            0 => out.truncate(at),
            1 => out[at] = byte,
            2 => out.insert(at, byte),
            _ => {
                out.remove(at);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6000))]
    #[test]
    fn generated_events(seed in any::<u64>()) {
        let mut g = Gen(seed);
        let tree = g.chunk();
        let mut data = Vec::new();
        g.render(&tree, &mut data);
        g.ws(&mut data);
        g.mutate(&mut data);
        check(&data)?;
    }
}

/// The generator reaches every reading, valid and refused (so the property above is not
/// vacuous).
#[test]
fn generated_events_cover_every_reading() {
    let mut seen = Seen::default();
    for seed in 0..3000 {
        let mut g = Gen(seed);
        let tree = g.chunk();
        let mut data = Vec::new();
        g.render(&tree, &mut data);
        g.mutate(&mut data);
        seen.add(&data).unwrap();
    }
    seen.assert_covers(&[ChunkKind::Chunk, ChunkKind::Error, ChunkKind::Unknown]);
    seen.assert_covers_calls();
}
