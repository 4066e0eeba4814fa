//! What each request looks like (pure, seeded): API, model, prompt, max_tokens, stream flag, n,
//! logprobs, stream_options, ignore_eos, hang-up point and any extra header, drawn from the
//! phase's mix; and the JSON body that carries them.

use std::path::Path;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

use crate::scenario::{Api, Dist, HeaderShare, Mix, Scenario};

/// What `stream_options` asked for (`usage` in each record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageAsk {
    /// No `stream_options` (or not streaming).
    Off,
    /// `include_usage: true`: one usage chunk before `[DONE]`.
    Final,
    /// `include_usage` and `continuous_usage_stats`: usage on every chunk.
    Continuous,
    /// `include_usage: false, continuous_usage_stats: true` (vLLM then sends no usage).
    ContinuousOnly,
}

impl UsageAsk {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageAsk::Off => "off",
            UsageAsk::Final => "final",
            UsageAsk::Continuous => "continuous",
            UsageAsk::ContinuousOnly => "continuous_only",
        }
    }
    fn of(stream: bool, include: bool, continuous: bool) -> Self {
        match (stream, include, continuous) {
            (false, _, _) | (true, false, false) => UsageAsk::Off,
            (true, true, false) => UsageAsk::Final,
            (true, true, true) => UsageAsk::Continuous,
            (true, false, true) => UsageAsk::ContinuousOnly,
        }
    }
}

/// One planned request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestPlan {
    pub api: Api,
    pub model: String,
    pub prompt: String,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub stream: bool,
    /// `n` choices (1: the field is not sent).
    pub n: u32,
    /// Top logprobs asked for, if any.
    pub logprobs: Option<u32>,
    pub usage: UsageAsk,
    pub ignore_eos: bool,
    /// Hang up after this many SSE events (streaming requests only).
    pub hangup_after: Option<u64>,
    /// The extra header this request carries, if any.
    pub header: Option<HeaderShare>,
    /// The body offers [`TOOLS`] (chat only).
    pub tools: bool,
}

/// The function a request with tools offers (as the dashboard check's load does): a required
/// string and an `enum`, so a simulator's `schema-violation` has a value to break.
pub const TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","description":"Current weather at a place.","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}}]"#;

/// Draws request plans from a phase's mix with one seeded generator for the run.
pub struct Mixer {
    rng: SmallRng,
    models: Vec<String>,
    dataset: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("reading dataset {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("dataset {path} has no usable prompt (lines need `prompt`, `text` or ShareGPT `conversations`)")]
    Empty { path: String },
}

/// Load prompts from JSONL: `{"prompt": ..}` / `{"text": ..}` or ShareGPT-style
/// `{"conversations": [{"from": "human", "value": ..}, ..]}` (the first human turn).
pub fn load_dataset(path: &Path) -> Result<Vec<String>, DatasetError> {
    let text = std::fs::read_to_string(path).map_err(|source| DatasetError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let prompts: Vec<String> = text.lines().filter_map(prompt_of_line).collect();
    if prompts.is_empty() {
        return Err(DatasetError::Empty {
            path: path.display().to_string(),
        });
    }
    Ok(prompts)
}

fn prompt_of_line(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    for k in ["prompt", "text"] {
        if let Some(s) = v.get(k).and_then(|s| s.as_str()) {
            return Some(s.to_owned());
        }
    }
    let turns = v
        .get("conversations")
        .or_else(|| v.get("messages"))?
        .as_array()?;
    turns.iter().find_map(|t| {
        let who = t.get("from").or_else(|| t.get("role"))?.as_str()?;
        if matches!(who, "human" | "user") {
            Some(
                t.get("value")
                    .or_else(|| t.get("content"))?
                    .as_str()?
                    .to_owned(),
            )
        } else {
            None
        }
    })
}

impl Mixer {
    pub fn new(sc: &Scenario, seed: u64) -> Result<Self, DatasetError> {
        let dataset = match &sc.mix.dataset {
            Some(p) => load_dataset(p)?,
            None => Vec::new(),
        };
        Ok(Self {
            rng: SmallRng::seed_from_u64(seed),
            models: sc.models.clone(),
            dataset,
        })
    }

    fn draw(&mut self, d: &Dist) -> u64 {
        match *d {
            Dist::Fixed(n) => n,
            Dist::Uniform([a, b]) => self.rng.random_range(a..=b),
            Dist::Normal { mean, std } => match Normal::new(mean, std) {
                Ok(n) => n.sample(&mut self.rng).round().max(1.0) as u64,
                Err(_) => mean.round().max(1.0) as u64,
            },
        }
    }

    /// A Bernoulli draw; always consumes one number so one share never shifts the others.
    fn coin(&mut self, share: f64) -> bool {
        self.rng.random::<f64>() < share
    }

    /// The next request of a phase whose mix is `mix` (see `Scenario::phase_mix`).
    pub fn next_plan(&mut self, mix: &Mix) -> RequestPlan {
        let model = self.models[self.rng.random_range(0..self.models.len())].clone();
        let prompt_tokens = self.draw(&mix.prompt_tokens);
        let max_tokens = self.draw(&mix.max_tokens);
        let stream = self.coin(mix.stream_share);
        let u = self.rng.random::<f64>();
        let mut acc = 0.0;
        let mut header = None;
        for h in &mix.headers {
            acc += h.share;
            if u < acc {
                header = Some(h.clone());
                break;
            }
        }
        let api = if self.coin(mix.completions_share.unwrap_or(0.0)) {
            Api::Completions
        } else {
            Api::Chat
        };
        let logprobs = self.coin(mix.logprobs_share).then_some(mix.top_logprobs);
        let n = if self.coin(mix.n_share) { mix.n } else { 1 };
        let include = self.coin(mix.include_usage_share);
        let continuous = self.coin(mix.continuous_usage_share);
        let ignore_eos = self.coin(mix.ignore_eos.share());
        let hangup = self.coin(mix.hangup_share);
        let k = self.draw(&mix.hangup_after_events);
        // Drawn only when asked for, so scenarios without tools keep their request sequences.
        let tools = api == Api::Chat && mix.tools_share > 0.0 && self.coin(mix.tools_share);
        let prompt = if self.dataset.is_empty() {
            synth_prompt(prompt_tokens, self.rng.random())
        } else {
            self.dataset[self.rng.random_range(0..self.dataset.len())].clone()
        };
        RequestPlan {
            api,
            model,
            prompt,
            prompt_tokens,
            max_tokens,
            stream,
            n,
            logprobs,
            usage: UsageAsk::of(stream, include, continuous),
            ignore_eos,
            hangup_after: (stream && hangup).then_some(k),
            header,
            tools,
        }
    }
}

/// A prompt of about `tokens` tokens: one short common word per token, with a varying lead word
/// so prefix caches do not make every request free.
pub fn synth_prompt(tokens: u64, salt: u32) -> String {
    const WORDS: [&str; 8] = [
        "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
    ];
    let mut s = format!("w{salt}");
    for i in 1..tokens {
        s.push(' ');
        s.push_str(WORDS[(i as usize) % WORDS.len()]);
    }
    s
}

/// The JSON body of a plan, in the shape its API expects.
pub fn body(plan: &RequestPlan) -> Vec<u8> {
    let mut v = match plan.api {
        Api::Chat => serde_json::json!({
            "model": plan.model,
            "messages": [{"role": "user", "content": plan.prompt}],
            "max_tokens": plan.max_tokens,
            "stream": plan.stream,
        }),
        Api::Completions => serde_json::json!({
            "model": plan.model,
            "prompt": plan.prompt,
            "max_tokens": plan.max_tokens,
            "stream": plan.stream,
        }),
    };
    if plan.n > 1 {
        v["n"] = plan.n.into();
    }
    if let Some(k) = plan.logprobs {
        match plan.api {
            Api::Chat => {
                v["logprobs"] = true.into();
                v["top_logprobs"] = k.into();
            }
            Api::Completions => v["logprobs"] = k.into(),
        }
    }
    let (include, continuous) = match plan.usage {
        UsageAsk::Off => (false, false),
        UsageAsk::Final => (true, false),
        UsageAsk::Continuous => (true, true),
        UsageAsk::ContinuousOnly => (false, true),
    };
    if plan.stream && (include || continuous) {
        let mut so = serde_json::Map::new();
        // Always explicit: vLLM defaults `include_usage` to true once `stream_options` is
        // present, so `{"continuous_usage_stats": true}` alone would ask for usage after all.
        so.insert("include_usage".into(), include.into());
        if continuous {
            so.insert("continuous_usage_stats".into(), true.into());
        }
        v["stream_options"] = so.into();
    }
    if plan.ignore_eos {
        v["ignore_eos"] = true.into();
    }
    if plan.tools {
        if let Ok(tools) = serde_json::from_str::<serde_json::Value>(TOOLS) {
            v["tools"] = tools;
        }
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// A per-run id prefix from the wall clock (ids only need to be unique, not ordered).
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("lt{:x}", (nanos as u64) ^ u64::from(std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example scenario's dataset loads and has a few prompts.
    #[test]
    fn example_datasets_load() {
        let datasets: Vec<_> = crate::scenario::examples()
            .into_iter()
            .filter_map(|sc| sc.mix.dataset)
            .collect();
        assert!(!datasets.is_empty(), "no example scenario has a dataset");
        for ds in datasets {
            assert!(load_dataset(&ds).unwrap().len() >= 4, "{}", ds.display());
        }
    }

    fn scenario(extra: &str) -> Scenario {
        Scenario::parse(&format!(
            "models=['a','b']\n[mix]\nprompt_tokens={{uniform=[5,9]}}\nmax_tokens={{fixed=7}}\nstream_share=0.5\n{extra}\n[[phases]]\nname='p'\nrequests=1\narrivals={{constant={{rate=1}}}}"
        ))
        .unwrap()
    }

    #[test]
    fn mix_respects_distributions_and_shares() {
        let sc = scenario(
            "completions_share=0.3\nlogprobs_share=0.2\ntop_logprobs=3\nn_share=0.1\n\
             include_usage_share=0.6\ncontinuous_usage_share=0.25\nignore_eos=0.4\n\
             hangup_share=0.5\nhangup_after_events={uniform=[2,4]}\n\
             [[mix.headers]]\nname='x-sim-fault'\nvalue='error-after=2'\nshare=0.25",
        );
        let mix = sc.phase_mix(0).unwrap();
        let mut m = Mixer::new(&sc, 1).unwrap();
        const N: usize = 8000;
        let plans: Vec<RequestPlan> = (0..N).map(|_| m.next_plan(&mix)).collect();
        assert!(plans
            .iter()
            .all(|p| (5..=9).contains(&p.prompt_tokens) && p.max_tokens == 7));
        let share = |f: &dyn Fn(&RequestPlan) -> bool| {
            plans.iter().filter(|p| f(p)).count() as f64 / N as f64
        };
        // Shares of streaming requests are measured among them.
        let of_streams =
            |f: &dyn Fn(&RequestPlan) -> bool| share(&|p| p.stream && f(p)) / share(&|p| p.stream);
        let near = |got: f64, want: f64, what: &str| {
            assert!((got - want).abs() < 0.03, "{what}: {got} vs {want}");
        };
        near(share(&|p| p.stream), 0.5, "stream");
        near(share(&|p| p.header.is_some()), 0.25, "header");
        near(share(&|p| p.model == "a"), 0.5, "model");
        near(share(&|p| p.api == Api::Completions), 0.3, "completions");
        near(share(&|p| p.logprobs == Some(3)), 0.2, "logprobs");
        assert!(plans.iter().all(|p| p.logprobs.is_none_or(|k| k == 3)));
        near(share(&|p| p.n == 2), 0.1, "n");
        near(share(&|p| p.ignore_eos), 0.4, "ignore_eos");
        // include and continuous are independent draws: 0.6*0.75, 0.6*0.25, 0.4*0.25.
        near(of_streams(&|p| p.usage == UsageAsk::Final), 0.45, "final");
        near(
            of_streams(&|p| p.usage == UsageAsk::Continuous),
            0.15,
            "continuous",
        );
        near(
            of_streams(&|p| p.usage == UsageAsk::ContinuousOnly),
            0.10,
            "cont only",
        );
        near(of_streams(&|p| p.hangup_after.is_some()), 0.5, "hangup");
        assert!(plans
            .iter()
            .all(|p| p.stream || (p.usage == UsageAsk::Off && p.hangup_after.is_none())));
        assert!(plans
            .iter()
            .filter_map(|p| p.hangup_after)
            .all(|k| (2..=4).contains(&k)));
        // Same seed, same plans.
        let mut again = Mixer::new(&sc, 1).unwrap();
        assert_eq!(again.next_plan(&mix), plans[0]);
    }

    fn plan() -> RequestPlan {
        RequestPlan {
            api: Api::Chat,
            model: "m".into(),
            prompt: "hi".into(),
            prompt_tokens: 1,
            max_tokens: 3,
            stream: true,
            n: 1,
            logprobs: None,
            usage: UsageAsk::Final,
            ignore_eos: true,
            hangup_after: None,
            header: None,
            tools: false,
        }
    }

    fn json(p: &RequestPlan) -> serde_json::Value {
        serde_json::from_slice(&body(p)).unwrap()
    }

    #[test]
    fn body_shapes() {
        let chat = json(&plan());
        assert_eq!(chat["messages"][0]["content"], "hi");
        assert_eq!(chat["stream_options"]["include_usage"], true);
        assert!(chat["stream_options"]
            .get("continuous_usage_stats")
            .is_none());
        assert_eq!(chat["ignore_eos"], true);
        assert!(chat.get("n").is_none() && chat.get("logprobs").is_none());
        let comp = json(&RequestPlan {
            api: Api::Completions,
            stream: false,
            ignore_eos: false,
            ..plan()
        });
        assert_eq!(comp["prompt"], "hi");
        assert!(comp.get("stream_options").is_none() && comp.get("ignore_eos").is_none());
        assert_eq!(synth_prompt(4, 0).split(' ').count(), 4);
    }

    #[test]
    fn body_mix_options() {
        // Chat logprobs: a flag plus top_logprobs; completions: the count itself.
        let chat = json(&RequestPlan {
            logprobs: Some(2),
            n: 2,
            usage: UsageAsk::Continuous,
            ..plan()
        });
        assert_eq!(chat["logprobs"], true);
        assert_eq!(chat["top_logprobs"], 2);
        assert_eq!(chat["n"], 2);
        assert_eq!(
            chat["stream_options"],
            serde_json::json!({"include_usage": true, "continuous_usage_stats": true})
        );
        let comp = json(&RequestPlan {
            api: Api::Completions,
            logprobs: Some(2),
            usage: UsageAsk::ContinuousOnly,
            ..plan()
        });
        assert_eq!(comp["logprobs"], 2);
        assert!(comp.get("top_logprobs").is_none());
        assert_eq!(
            comp["stream_options"],
            serde_json::json!({"include_usage": false, "continuous_usage_stats": true})
        );
        let off = json(&RequestPlan {
            usage: UsageAsk::Off,
            ..plan()
        });
        assert!(off.get("stream_options").is_none());
        assert!(off.get("tools").is_none());
        let tools = json(&RequestPlan {
            tools: true,
            ..plan()
        });
        assert_eq!(tools["tools"][0]["function"]["name"], "get_weather");
        let set = goodput_measure::agent::ToolSet::from_request(&body(&RequestPlan {
            tools: true,
            ..plan()
        }))
        .expect("the client reads the tools it sent");
        assert_eq!(
            set.judge("get_weather", r#"{"location":"Paris","unit":"kelvin"}"#)
                .0,
            goodput_measure::agent::ToolCallOutcome::SchemaViolation
        );
    }

    #[test]
    fn tools_share_draws_chat_requests_only() {
        let with = scenario("completions_share=0.5\ntools_share=0.5");
        let mix = with.phase_mix(0).unwrap();
        let mut m = Mixer::new(&with, 3).unwrap();
        let plans: Vec<RequestPlan> = (0..2000).map(|_| m.next_plan(&mix)).collect();
        assert!(plans.iter().all(|p| !p.tools || p.api == Api::Chat));
        let chat = plans.iter().filter(|p| p.api == Api::Chat).count() as f64;
        let share = plans.iter().filter(|p| p.tools).count() as f64 / chat;
        assert!((share - 0.5).abs() < 0.05, "{share}");
    }

    #[test]
    fn dataset_lines() {
        assert_eq!(prompt_of_line(r#"{"prompt":"a"}"#).as_deref(), Some("a"));
        assert_eq!(prompt_of_line(r#"{"text":"b"}"#).as_deref(), Some("b"));
        assert_eq!(
            prompt_of_line(r#"{"conversations":[{"from":"system","value":"s"},{"from":"human","value":"c"},{"from":"gpt","value":"d"}]}"#).as_deref(),
            Some("c")
        );
        assert_eq!(prompt_of_line("nope"), None);
    }
}
