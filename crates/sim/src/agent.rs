//! Agent shapes: reasoning deltas and streamed tool calls, laid out as vLLM 0.32 streams them
//! (captures `stream-chat-tool-*.txt`, `stream-chat-reasoning.txt` in tests/fixtures/vllm-0.32/).
//!
//! What the captures show, and the simulator copies:
//! - a tool call opens with one delta carrying `id` (`chatcmpl-tool-<16 hex>`), `type`, `index`
//!   and `function.name`; each later token is one `function.arguments` fragment; the stream's
//!   text tokens before the arguments (vLLM's structural tag, `<tool_call>{"name": ...,
//!   "arguments": `) are counted in usage but never streamed: here, the opening delta is one
//!   token;
//! - with a named `tool_choice` (or `"required"`) the choice finishes with `stop`; with `auto`
//!   (the tool parser found a call) with `tool_calls`;
//! - reasoning tokens stream as `"delta":{"reasoning":...}` before the answer's `content`.
//!
//! The arguments are built from the function's JSON Schema (`tools[i].function.parameters`):
//! `tool-call=valid` satisfies it, `invalid-json` drops the closing `}`, `schema-violation`
//! puts a value outside an `enum` (or of the wrong type) into the first property that has one.
//! A choice whose `max_tokens` ends before the last fragment is cut there, as a real engine's.

use serde_json::{Map, Value};

use super::render::Finish;
use super::text::SplitMix;

/// `x-sim-fault: tool-call=KIND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallKind {
    Valid,
    InvalidJson,
    SchemaViolation,
}

impl ToolCallKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "valid" => Some(ToolCallKind::Valid),
            "invalid-json" => Some(ToolCallKind::InvalidJson),
            "schema-violation" => Some(ToolCallKind::SchemaViolation),
            _ => None,
        }
    }
}

/// How the request offered its tools: what a tool call is called and how its choice ends.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The function's `parameters` schema (`{}` when absent).
    pub parameters: Value,
    /// `tool_choice` named or `"required"`: vLLM constrains the output to the call.
    pub forced: bool,
}

impl ToolSpec {
    /// The tool a call goes to: the named `tool_choice`'s, else the first of `tools`. `None`
    /// without tools or with `tool_choice: "none"`.
    pub fn from_request(obj: &Map<String, Value>) -> Option<ToolSpec> {
        let tools = obj.get("tools")?.as_array()?;
        let (named, forced) = match obj.get("tool_choice") {
            Some(Value::String(s)) if s == "none" => return None,
            Some(Value::String(s)) => (None, s == "required"),
            Some(Value::Object(o)) => (
                o.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str),
                true,
            ),
            _ => (None, false),
        };
        let function = |t: &Value| t.get("function").cloned();
        let f = tools
            .iter()
            .filter_map(function)
            .find(|f| named.is_none_or(|n| f.get("name").and_then(Value::as_str) == Some(n)))?;
        Some(ToolSpec {
            name: f.get("name")?.as_str()?.to_string(),
            parameters: f
                .get("parameters")
                .cloned()
                .unwrap_or(Value::Object(Map::new())),
            forced,
        })
    }

    fn finish(&self) -> Finish {
        if self.forced {
            Finish::Stop(None)
        } else {
            Finish::ToolCalls
        }
    }
}

/// What one token of a choice carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    /// Answer text (the generated token's own text).
    Content,
    /// Reasoning text (the generated token's own text).
    Reasoning,
    /// The opening delta of the tool call: id, type, index, name.
    ToolOpen,
    /// An arguments fragment; `last` ends the call (and the choice).
    ToolArgs { fragment: &'a str, last: bool },
}

/// The agent plan of one choice.
#[derive(Debug, Clone)]
pub struct AgentPlan {
    /// Tokens of reasoning before anything else.
    pub reasoning: u64,
    pub tool: Option<ToolPlan>,
}

#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// `chatcmpl-tool-<16 hex>`.
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// Fragment ends (byte offsets into `arguments`, increasing, the last = its length).
    cuts: Vec<usize>,
    pub finish: Finish,
    /// `tool_choice` named or `"required"` (see [`ToolSpec::forced`]).
    pub forced: bool,
}

/// The plans of a request's choices: empty unless it asked for reasoning or a tool call
/// (chat only).
pub fn plans(
    req: &super::request::GenRequest,
    reasoning: Option<u64>,
    tool_call: Option<ToolCallKind>,
) -> Vec<Option<AgentPlan>> {
    if req.api != super::request::Api::Chat || (reasoning.is_none() && tool_call.is_none()) {
        return Vec::new();
    }
    (0..req.n)
        .map(|i| AgentPlan::new(reasoning, tool_call, req.tool.as_ref(), req.text_seed, i))
        .collect()
}

impl AgentPlan {
    /// The plan of choice `index`, or `None` when nothing agent-like was asked for.
    pub fn new(
        reasoning: Option<u64>,
        tool_call: Option<ToolCallKind>,
        spec: Option<&ToolSpec>,
        seed: u64,
        index: u32,
    ) -> Option<AgentPlan> {
        let mut rng = SplitMix::new(seed ^ 0x7001_ca11 ^ u64::from(index).wrapping_mul(0x9e37));
        let tool = match (tool_call, spec) {
            (Some(kind), Some(spec)) => Some(ToolPlan::new(kind, spec, &mut rng)),
            _ => None,
        };
        let reasoning = reasoning.unwrap_or(0);
        (reasoning > 0 || tool.is_some()).then_some(AgentPlan { reasoning, tool })
    }

    /// What token `k` (0-based) of the choice carries.
    pub fn part(&self, k: u64) -> Part<'_> {
        if k < self.reasoning {
            return Part::Reasoning;
        }
        let Some(t) = &self.tool else {
            return Part::Content;
        };
        match (k - self.reasoning) as usize {
            0 => Part::ToolOpen,
            j => match t.cuts.get(j - 1) {
                Some(&end) => {
                    let start = if j >= 2 { t.cuts[j - 2] } else { 0 };
                    Part::ToolArgs {
                        fragment: &t.arguments[start..end],
                        last: j == t.cuts.len(),
                    }
                }
                // Past the call (cannot happen: the last fragment ends the choice).
                None => Part::Content,
            },
        }
    }
}

impl ToolPlan {
    fn new(kind: ToolCallKind, spec: &ToolSpec, rng: &mut SplitMix) -> ToolPlan {
        let mut args = arguments_for(&spec.parameters, rng);
        match kind {
            ToolCallKind::Valid => {}
            ToolCallKind::SchemaViolation => violate(&spec.parameters, &mut args),
            ToolCallKind::InvalidJson => {}
        }
        let mut arguments = Value::Object(args).to_string();
        if kind == ToolCallKind::InvalidJson {
            arguments.pop(); // the closing `}`: a model that stopped one token short
        }
        let cuts = fragments(&arguments, rng);
        ToolPlan {
            id: format!("chatcmpl-tool-{:016x}", rng.next_u64()),
            name: spec.name.clone(),
            arguments,
            cuts,
            finish: spec.finish(),
            forced: spec.forced,
        }
    }
}

/// Fragment ends: 1 to 6 bytes each, on char boundaries (as a BPE vocabulary cuts text).
fn fragments(s: &str, rng: &mut SplitMix) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut at = 0;
    while at < s.len() {
        let mut end = (at + 1 + (rng.next_u64() % 6) as usize).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        cuts.push(end);
        at = end;
    }
    cuts
}

const WORDS: &[&str] = &["Paris", "Lyon", "Berlin", "Tokyo", "Lima", "Oslo"];

/// An object that satisfies `schema`: every property (required or not) with a value of its
/// type, the first `enum` value where there is one.
fn arguments_for(schema: &Value, rng: &mut SplitMix) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, p) in props {
            out.insert(name.clone(), value_for(p, rng, 0));
        }
    }
    out
}

fn value_for(p: &Value, rng: &mut SplitMix, depth: u32) -> Value {
    if let Some(first) = p
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let ty = p.get("type").and_then(Value::as_str).unwrap_or("string");
    match ty {
        "integer" => Value::from(1 + rng.next_u64() % 100),
        "number" => Value::from(0.5 + (rng.next_u64() % 100) as f64),
        "boolean" => Value::Bool(rng.next_u64() % 2 == 0),
        "array" => Value::Array(Vec::new()),
        "object" if depth < 4 => Value::Object(
            p.get("properties")
                .and_then(Value::as_object)
                .map(|props| {
                    props
                        .iter()
                        .map(|(k, v)| (k.clone(), value_for(v, rng, depth + 1)))
                        .collect()
                })
                .unwrap_or_default(),
        ),
        "null" => Value::Null,
        _ => Value::from(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]),
    }
}

/// Breaks the schema in the first property where it can be broken: a value outside its
/// `enum`, else a value of another type; with no properties, a property the schema forbids
/// is not guaranteed, so the object becomes a bare string (not an object at all).
fn violate(schema: &Value, args: &mut Map<String, Value>) {
    let props = schema.get("properties").and_then(Value::as_object);
    let pick = props.and_then(|p| {
        p.iter()
            .find(|(_, s)| s.get("enum").is_some())
            .or_else(|| p.iter().next())
    });
    match pick {
        Some((name, s)) if s.get("enum").is_some() => {
            args.insert(name.clone(), Value::from("not-in-enum"));
        }
        Some((name, s)) => {
            let wrong = match s.get("type").and_then(Value::as_str) {
                Some("string") => Value::from(12345),
                _ => Value::from("wrong-type"),
            };
            args.insert(name.clone(), wrong);
        }
        None => {
            args.clear();
            args.insert("unexpected".into(), Value::Null);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> ToolSpec {
        let req: Value = serde_json::from_str(
            r#"{"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}}}"#,
        )
        .unwrap();
        ToolSpec::from_request(req.as_object().unwrap()).unwrap()
    }

    fn joined(plan: &AgentPlan) -> String {
        let mut out = String::new();
        for k in 0.. {
            match plan.part(k) {
                Part::ToolArgs { fragment, last } => {
                    out.push_str(fragment);
                    if last {
                        break;
                    }
                }
                Part::Content => break,
                _ => {}
            }
        }
        out
    }

    #[test]
    fn tool_choice_forms() {
        let parse = |s: &str| {
            let v: Value = serde_json::from_str(s).unwrap();
            ToolSpec::from_request(v.as_object().unwrap())
        };
        let tools = r#""tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}]"#;
        let named = parse(&format!(
            r#"{{{tools},"tool_choice":{{"type":"function","function":{{"name":"b"}}}}}}"#
        ))
        .unwrap();
        assert_eq!((named.name.as_str(), named.forced), ("b", true));
        let auto = parse(&format!(r#"{{{tools},"tool_choice":"auto"}}"#)).unwrap();
        assert_eq!((auto.name.as_str(), auto.forced), ("a", false));
        assert_eq!(auto.finish(), Finish::ToolCalls);
        assert!(
            parse(&format!(r#"{{{tools},"tool_choice":"required"}}"#))
                .unwrap()
                .forced
        );
        assert_eq!(parse(&format!(r#"{{{tools},"tool_choice":"none"}}"#)), None);
        assert_eq!(parse(r#"{"tool_choice":"auto"}"#), None);
        assert_eq!(parse(&format!(r#"{{{tools}}}"#)).unwrap().name, "a");
    }

    #[test]
    fn each_kind_of_call_says_what_it_promises() {
        let spec = weather();
        for seed in 0..50 {
            let plan = |kind| AgentPlan::new(None, Some(kind), Some(&spec), seed, 0).unwrap();
            let valid: Value = serde_json::from_str(&joined(&plan(ToolCallKind::Valid))).unwrap();
            assert!(valid["location"].is_string(), "{valid}");
            assert_eq!(valid["unit"], "celsius");
            let broken = joined(&plan(ToolCallKind::InvalidJson));
            assert!(serde_json::from_str::<Value>(&broken).is_err(), "{broken}");
            let bad: Value =
                serde_json::from_str(&joined(&plan(ToolCallKind::SchemaViolation))).unwrap();
            assert_eq!(bad["unit"], "not-in-enum");
        }
    }

    #[test]
    fn parts_follow_reasoning_then_the_call() {
        let spec = weather();
        let plan = AgentPlan::new(Some(3), Some(ToolCallKind::Valid), Some(&spec), 7, 0).unwrap();
        assert_eq!(plan.part(0), Part::Reasoning);
        assert_eq!(plan.part(2), Part::Reasoning);
        assert_eq!(plan.part(3), Part::ToolOpen);
        assert!(matches!(plan.part(4), Part::ToolArgs { last: false, .. }));
        let t = plan.tool.as_ref().unwrap();
        assert!(
            t.id.starts_with("chatcmpl-tool-") && t.id.len() == 30,
            "{}",
            t.id
        );
        assert_eq!(t.finish, Finish::Stop(None));
        let only_reasoning = AgentPlan::new(Some(2), None, None, 1, 0).unwrap();
        assert_eq!(only_reasoning.part(1), Part::Reasoning);
        assert_eq!(only_reasoning.part(2), Part::Content);
        assert!(AgentPlan::new(None, None, Some(&spec), 1, 0).is_none());
    }

    #[test]
    fn fragments_cover_the_text_on_char_boundaries() {
        let mut rng = SplitMix::new(3);
        let s = r#"{"location":"Zürich → Genève","n":1}"#;
        let cuts = fragments(s, &mut rng);
        assert_eq!(cuts.last(), Some(&s.len()));
        let mut at = 0;
        for &c in &cuts {
            assert!(c > at && s.is_char_boundary(c));
            at = c;
        }
    }
}
