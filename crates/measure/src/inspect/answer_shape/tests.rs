//! The shapes held to the scan: one [`AnswerShapes`] that keeps shapes against one that scans
//! every answer, on the same answers in the same order (captures, the simulator's answers,
//! generated answers and their edits).

use proptest::prelude::*;

use super::*;
use crate::fixtures::{capture, CAPTURES};
use crate::inspect::differential::Gen;
use crate::inspect::repeat::text_len;

/// An answer's reading: what the scan returns and what it logged.
fn read(shapes: &mut AnswerShapes, body: &[u8]) -> (ResponseInfo, String) {
    let mut log = TokenLog::new(false);
    let info = shapes.inspect_logged(body, &mut log);
    let logged = format!(
        "{:?} {:?} {:?} {:?} lead {} body {}",
        log.choices, log.tokens, log.alternatives, log.calls, log.lead, log.body
    );
    (info, logged)
}

/// Reads `bodies` in order with shapes kept and without; every reading the same. Returns the
/// readings and which a shape answered.
fn same_readings(bodies: &[Vec<u8>]) -> Result<Vec<(ResponseInfo, bool)>, TestCaseError> {
    let (mut on, mut off) = (AnswerShapes::new(true), AnswerShapes::new(false));
    let mut out = Vec::new();
    for b in bodies {
        let before = on.answered();
        let (got, want) = (read(&mut on, b), read(&mut off, b));
        let answered = on.answered() > before;
        prop_assert_eq!(
            &got,
            &want,
            "answered by a shape: {}\n{}",
            answered,
            String::from_utf8_lossy(b)
        );
        out.push((got.0, answered));
    }
    prop_assert_eq!(off.answered(), 0);
    Ok(out)
}

/// The simulator's chat and completions answers (one choice or several, every finish).
fn simulated_answers() -> Vec<Vec<u8>> {
    use goodput_sim::render::{ChoiceResult, Finish, Templates};
    use goodput_sim::request::{parse, Api};
    let requests: &[(Api, &str)] = &[
        (
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":12}"#,
        ),
        (
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":9,"n":2}"#,
        ),
        (Api::Completions, r#"{"prompt":"The quick","max_tokens":7}"#),
    ];
    let finishes = [
        Finish::Length,
        Finish::Stop(None),
        Finish::Stop(Some("e".into())),
        Finish::Abort,
        Finish::Error,
        Finish::ToolCalls,
    ];
    let texts = ["", "Hello", " a \"quoted\"\n\u{1}text é 中文", "x"];
    let models = ["tiny".to_string()];
    let mut out = Vec::new();
    for seed in 0..4u64 {
        for (api, body) in requests {
            let req = parse(*api, body.as_bytes(), &models, 2048, seed).unwrap();
            let t = Templates::new(&req, "tiny", 1795964150 + seed * 977);
            for (k, f) in finishes.iter().enumerate() {
                let choices: Vec<ChoiceResult> = (0..req.n.max(1) as usize)
                    .map(|i| ChoiceResult {
                        text: texts[(k + i + seed as usize) % texts.len()].to_string(),
                        tokens: (seed * 1000 + k as u64 * 37 + i as u64) % 4096,
                        finish: if i == 1 { Finish::Length } else { f.clone() },
                        logprobs: None,
                        agent: None,
                    })
                    .collect();
                out.push(t.json_body(&choices));
            }
        }
    }
    out
}

/// The captured answers and the simulator's, twice over: every reading the scan's, and the
/// repeats answered by shapes (a bench load's answers differ in id, time, text and counts).
#[test]
fn captured_and_simulated_answers_read_as_the_scan() {
    let mut bodies: Vec<Vec<u8>> = CAPTURES
        .iter()
        .filter(|(n, _)| !n.starts_with("options/force-stream"))
        .map(|(n, _)| capture(n).body.to_vec())
        .collect();
    let sim = simulated_answers();
    bodies.extend(sim.iter().cloned());
    bodies.extend(bodies.clone());
    let readings = same_readings(&bodies).unwrap();
    let answered = readings.iter().filter(|r| r.1).count();
    // Every simulated answer after the first of its kind is a repeat but for its values.
    assert!(
        answered >= sim.len(),
        "{answered} answered of {} bodies",
        bodies.len()
    );
}

/// A bench answer and the same with other values: answered by its shape, with the values
/// read from its own bytes.
#[test]
fn a_repeat_is_answered_with_its_own_counts_and_finish() {
    let a = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1796316919,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"a b","refusal":null},"logprobs":null,"finish_reason":"length","stop_reason":null}],"system_fingerprint":"fp","usage":{"prompt_tokens":15,"total_tokens":79,"completion_tokens":64,"prompt_tokens_details":null},"metrics":null}"#;
    let b = br#"{"id":"chatcmpl-22","object":"chat.completion","created":1796316920,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"\"quoted\" \u00e9 and more","refusal":null},"logprobs":null,"finish_reason":"abort","stop_reason":null}],"system_fingerprint":"fp2","usage":{"prompt_tokens":7,"total_tokens":1000,"completion_tokens":9999999999999999999,"prompt_tokens_details":null},"metrics":null}"#;
    let mut on = AnswerShapes::new(true);
    let (first, _) = read(&mut on, a);
    assert_eq!(on.answered(), 0);
    let (second, _) = read(&mut on, b);
    assert_eq!(on.answered(), 1, "a repeat but for its values");
    assert_eq!(second, read(&mut AnswerShapes::new(false), b).0);
    assert_eq!(first.finish_reason, Some(FinishReason::Length));
    assert_eq!(second.finish_reason, Some(FinishReason::Abort));
    assert_eq!(second.failed_count, 1);
    let u = second.usage.unwrap();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens),
        (Some(7), Some(9_999_999_999_999_999_999))
    );
    // Twenty digits may overflow: scanned, not answered.
    let c = String::from_utf8_lossy(b).replace("9999999999999999999", "99999999999999999999");
    let (third, _) = read(&mut on, c.as_bytes());
    assert_eq!(on.answered(), 1);
    assert_eq!(third, read(&mut AnswerShapes::new(false), c.as_bytes()).0);
}

/// A key the scan reads, twice in its object: its last value counts, so no shape is kept.
#[test]
fn a_key_read_twice_is_not_learned() {
    let a = br#"{"choices":[{"index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens":3}}"#;
    let mut on = AnswerShapes::new(true);
    for _ in 0..3 {
        assert_eq!(read(&mut on, a), read(&mut AnswerShapes::new(false), a));
    }
    assert_eq!(on.answered(), 0);
}

/// A JSON value of a generated answer: leaves are raw JSON text of a kind.
#[derive(Debug, Clone)]
enum J {
    Leaf(Kind, String),
    Obj(Vec<(String, J)>),
    Arr(Vec<J>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Number,
    Reason,
    Other,
}

const TEXTS: &[&str] = &[
    "",
    "a",
    "hello world",
    "chatcmpl-33293d87547d86d8",
    "\\n",
    "\\\"",
    "\\\\",
    "\\/",
    "\\u00e9",
    "\\ud83d\\ude00",
    "é中文",
    "stop",
    "error",
    "\\x",
    "\\u12",
    "\u{1}",
    "a\"b",
    "\\",
    "\",\"usage\":{\"prompt_tokens\":1},\"x\":\"",
];
const NUMBERS: &[&str] = &[
    "0",
    "7",
    "15",
    "64",
    "1796316919",
    "007",
    "-1",
    "1.5",
    "1e3",
    "9999999999999999999",
    "10000000000000000000",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
];
const REASONS: &[&str] = &[
    "stop",
    "length",
    "abort",
    "error",
    "tool_calls",
    "repetition",
    "st\\u006fp",
    "\\u0061bort",
    "other",
    "",
];
const OTHERS: &[&str] = &[
    "null",
    "true",
    "false",
    "{}",
    "[]",
    "{\"a\":1}",
    "[1,\"x\"]",
    "1.5",
    "-1",
    "\"x\"",
];

fn text(g: &mut Gen) -> J {
    J::Leaf(Kind::Text, format!("\"{}\"", g.pick(TEXTS)))
}

fn number(g: &mut Gen, max: u64) -> J {
    J::Leaf(Kind::Number, (g.next() % max).to_string())
}

fn null() -> J {
    J::Leaf(Kind::Other, "null".into())
}

fn obj(members: &[(&str, J)]) -> J {
    J::Obj(
        members
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

/// A choice as vLLM writes one (chat's `message` or completions' `text`).
fn choice(g: &mut Gen, index: u64, chat: bool) -> J {
    let finish = if g.chance(10) {
        null()
    } else {
        J::Leaf(Kind::Reason, format!("\"{}\"", g.pick(REASONS)))
    };
    let logprobs = match g.below(10) {
        0 => J::Leaf(Kind::Other, r#"{"content":null}"#.into()),
        1 => J::Leaf(
            Kind::Other,
            r#"{"content":[{"token":"a","logprob":-0.5}]}"#.into(),
        ),
        _ => null(),
    };
    let mut message = vec![
        ("role", J::Leaf(Kind::Text, "\"assistant\"".into())),
        ("content", text(g)),
        ("refusal", null()),
        ("reasoning", if g.chance(20) { text(g) } else { null() }),
    ];
    if g.chance(10) {
        let call = r#"[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]"#;
        message.push(("tool_calls", J::Leaf(Kind::Other, call.into())));
    }
    let body = if chat {
        ("message", obj(&message))
    } else {
        ("text", text(g))
    };
    let stop = match g.below(3) {
        0 => null(),
        1 => number(g, 100),
        _ => text(g),
    };
    obj(&[
        ("index", J::Leaf(Kind::Other, index.to_string())),
        body,
        ("logprobs", logprobs),
        ("finish_reason", finish),
        ("stop_reason", stop),
        ("token_ids", null()),
    ])
}

/// An answer as vLLM writes one, with some of its variations (several choices, details in
/// usage, metrics, transfer parameters, an error).
fn answer(g: &mut Gen) -> J {
    let chat = g.chance(70);
    let n = 1 + g.below(3) as u64;
    let choices = J::Arr((0..n).map(|i| choice(g, i, chat)).collect());
    let details = |g: &mut Gen, key: &str| {
        if g.chance(70) {
            null()
        } else {
            J::Obj(vec![(key.to_string(), number(g, 50))])
        }
    };
    let usage = obj(&[
        ("prompt_tokens", number(g, 4096)),
        ("total_tokens", number(g, 8192)),
        ("completion_tokens", number(g, 4096)),
        ("prompt_tokens_details", details(g, "cached_tokens")),
        ("completion_tokens_details", details(g, "reasoning_tokens")),
    ]);
    let metrics = if g.chance(20) {
        J::Leaf(
            Kind::Other,
            r#"{"queue_time_ms":1.5,"time_to_first_token_ms":20,"generation_time_ms":300.25,"mean_itl_ms":4.5}"#.into(),
        )
    } else {
        null()
    };
    let kv = if g.chance(20) {
        obj(&[
            ("remote", text(g)),
            ("block_ids", J::Arr(vec![number(g, 9), number(g, 99)])),
        ])
    } else {
        null()
    };
    let object = if g.chance(5) {
        "error"
    } else {
        "chat.completion"
    };
    let mut top = vec![
        ("id", text(g)),
        ("object", J::Leaf(Kind::Other, format!("\"{object}\""))),
        ("created", number(g, 2_000_000_000)),
        ("model", text(g)),
        ("choices", choices),
        ("service_tier", null()),
        ("system_fingerprint", text(g)),
        ("usage", usage),
        ("prompt_logprobs", null()),
        ("kv_transfer_params", kv),
        ("metrics", metrics),
    ];
    if g.chance(5) {
        top.push(("error", J::Leaf(Kind::Other, r#"{"message":"x"}"#.into())));
    }
    obj(&top)
}

/// `j` with some leaves replaced by values of the same kind; `wild`: also by invalid ones and
/// values of another kind, and members rarely moved, doubled or their keys written with an
/// escape.
fn edit(j: &J, g: &mut Gen, wild: bool) -> J {
    match j {
        J::Leaf(kind, raw) => {
            if !g.chance(35) {
                return j.clone();
            }
            let other = wild && g.chance(10);
            let valid =
                |t: &&str| wild || serde_json::from_str::<String>(&format!("\"{t}\"")).is_ok();
            let texts: Vec<&str> = TEXTS.iter().copied().filter(valid).collect();
            let numbers: Vec<&str> = NUMBERS
                .iter()
                .copied()
                .filter(|n| {
                    wild || (n.bytes().all(|b| b.is_ascii_digit())
                        && (n.len() == 1 || !n.starts_with('0')))
                })
                .collect();
            let raw = match (kind, other) {
                (Kind::Text, false) => format!("\"{}\"", g.pick(&texts)),
                (Kind::Number, false) => g.pick(&numbers).to_string(),
                (Kind::Reason, false) => format!("\"{}\"", g.pick(REASONS)),
                (Kind::Other, false) => raw.clone(),
                _ => g.pick(OTHERS).to_string(),
            };
            J::Leaf(*kind, raw)
        }
        J::Arr(items) => J::Arr(items.iter().map(|i| edit(i, g, wild)).collect()),
        J::Obj(members) => {
            let mut m: Vec<(String, J)> = members
                .iter()
                .map(|(k, v)| (k.clone(), edit(v, g, wild)))
                .collect();
            if wild && !m.is_empty() && g.chance(4) {
                let (a, b) = (g.below(m.len()), g.below(m.len()));
                m.swap(a, b);
            }
            if wild && !m.is_empty() && g.chance(3) {
                let copy = m[g.below(m.len())].clone();
                m.insert(g.below(m.len() + 1), copy);
            }
            if wild && !m.is_empty() && g.chance(3) {
                let k = g.below(m.len());
                let key = m[k].0.clone();
                m[k].0 = key.replacen('e', "\\u0065", 1).replacen('_', "\\u005f", 1);
            }
            J::Obj(m)
        }
    }
}

fn render(j: &J, space: &str, out: &mut String) {
    match j {
        J::Leaf(_, raw) => out.push_str(raw),
        J::Arr(items) => {
            out.push('[');
            for (k, i) in items.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                    out.push_str(space);
                }
                render(i, space, out);
            }
            out.push(']');
        }
        J::Obj(members) => {
            out.push('{');
            for (k, (key, v)) in members.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                    out.push_str(space);
                }
                out.push_str(&format!("\"{key}\":{space}"));
                render(v, space, out);
            }
            out.push('}');
        }
    }
}

/// A generated answer, then edits of it, twice over (`seed` drives a deterministic generator).
fn generated(seed: u64) -> (Vec<Vec<u8>>, usize) {
    let mut g = Gen(seed);
    let base = answer(&mut g);
    let space = if g.chance(15) { " " } else { "" };
    let rendered = |j: &J, g: &mut Gen| {
        let mut s = String::new();
        if g.chance(5) {
            s.push_str("\n ");
        }
        render(j, space, &mut s);
        let mut b = s.into_bytes();
        if g.chance(5) {
            let at = g.below(b.len() + 1);
            let what = g.pick(&["", " ", "\"", ",", "0", "}", "\\"]);
            let end = (at + g.below(3)).min(b.len());
            b.splice(at..end, what.bytes());
        }
        b
    };
    let mut bodies = vec![rendered(&base, &mut g)];
    for _ in 0..6 {
        let wild = g.chance(40);
        let e = edit(&base, &mut g, wild);
        bodies.push(rendered(&e, &mut g));
    }
    let n = bodies.len();
    bodies.extend(bodies.clone());
    (bodies, n)
}

/// Over many generated answers the shapes answer a good part of the edits (so the property
/// below holds them to the scan, not only the scan to itself), many with readings (counts,
/// finish reasons) other than their shape's.
#[test]
fn generated_edits_are_answered_by_shapes() {
    let (mut answered, mut other, mut total) = (0, 0, 0);
    for seed in 0..300 {
        let (bodies, n) = generated(seed);
        let readings = same_readings(&bodies).unwrap();
        answered += readings.iter().filter(|r| r.1).count();
        other += readings
            .iter()
            .filter(|r| r.1 && r.0 != readings[0].0)
            .count();
        total += n;
    }
    assert!(answered * 10 > total, "{answered} of {total}");
    assert!(other * 2 > answered, "{other} of {answered}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]
    /// The long texts' reader and the template's (`text_len`, eight bytes a step) give the
    /// same length on any text: plain stretches short and long (whole blocks and remainders),
    /// every escape (`\uXXXX` with either case of hex digits), broken escapes, quotes, control
    /// and non-ASCII bytes (valid UTF-8 or not), the text closed, followed by JSON or cut short.
    #[test]
    fn long_texts_read_as_text_len(
        parts in proptest::collection::vec(prop_oneof![
            4 => "[ !#-\\[\\]-~]{0,24}".prop_map(String::into_bytes),
            2 => "[ !#-\\[\\]-~]{16,300}".prop_map(String::into_bytes),
            2 => prop::sample::select(vec![
                "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t",
            ]).prop_map(|s| s.as_bytes().to_vec()),
            1 => "\\\\u[0-9a-fA-F]{4}".prop_map(String::into_bytes),
            1 => prop::sample::select(vec![
                "\\", "\\x", "\\U0041", "\\u", "\\u1", "\\u12", "\\u123", "\\u12g4", "\\uGGGG",
                "\\ ", "\\\n", "\\'",
            ]).prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::sample::select(vec![
                "\"", "\u{0}", "\u{1}", "\u{1e}", "\u{1f}", "\n", "\t", "\u{7f}",
            ]).prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::sample::select(vec!["é", "中文", "😀", "\u{2028}"])
                .prop_map(|s| s.as_bytes().to_vec()),
            1 => proptest::collection::vec(any::<u8>(), 0..4),
        ], 0..16),
        end in prop::sample::select(vec![&b""[..], b"\"", b"\",\"index\":0}", b"\"}],\"usage\":{"]),
    ) {
        let mut s = parts.concat();
        s.extend_from_slice(end);
        prop_assert_eq!(long_text_len(&s), text_len(&s), "{:?}", String::from_utf8_lossy(&s));
    }

    /// Generated answers and their edits (values of the same kind or another, members moved or
    /// doubled, keys with escapes, bytes spliced in): the shapes read every one as the scan.
    #[test]
    fn generated_answers_read_as_the_scan(seed in any::<u64>()) {
        let (bodies, _) = generated(seed);
        same_readings(&bodies)?;
    }
}
