//! What each request looks like (pure, seeded): model, prompt, max_tokens, stream flag and any
//! extra header, drawn from the scenario's mix; and the JSON body that carries them.

use std::path::Path;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

use crate::scenario::{Api, Dist, HeaderShare, Scenario};

/// One planned request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestPlan {
    pub model: String,
    pub prompt: String,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub stream: bool,
    /// Index into the scenario's `mix.headers`, if this request carries one.
    pub header: Option<usize>,
}

/// Draws request plans from a scenario's mix with its own seeded generator.
pub struct Mixer {
    rng: SmallRng,
    models: Vec<String>,
    mix: crate::scenario::Mix,
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
            mix: sc.mix.clone(),
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

    pub fn next_plan(&mut self) -> RequestPlan {
        let model = self.models[self.rng.random_range(0..self.models.len())].clone();
        let prompt_tokens = self.draw(&self.mix.prompt_tokens.clone());
        let max_tokens = self.draw(&self.mix.max_tokens.clone());
        let stream = self.rng.random::<f64>() < self.mix.stream_share;
        let u = self.rng.random::<f64>();
        let mut acc = 0.0;
        let mut header = None;
        for (i, h) in self.mix.headers.iter().enumerate() {
            acc += h.share;
            if u < acc {
                header = Some(i);
                break;
            }
        }
        let prompt = if self.dataset.is_empty() {
            synth_prompt(prompt_tokens, self.rng.random())
        } else {
            self.dataset[self.rng.random_range(0..self.dataset.len())].clone()
        };
        RequestPlan {
            model,
            prompt,
            prompt_tokens,
            max_tokens,
            stream,
            header,
        }
    }

    pub fn header(&self, i: usize) -> &HeaderShare {
        &self.mix.headers[i]
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

/// The JSON body for `api`.
pub fn body(api: Api, plan: &RequestPlan, ignore_eos: bool) -> Vec<u8> {
    let mut v = match api {
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
    if plan.stream {
        // Exact completion token counts on the client side too.
        v["stream_options"] = serde_json::json!({"include_usage": true});
    }
    if ignore_eos {
        v["ignore_eos"] = serde_json::Value::Bool(true);
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(extra: &str) -> Scenario {
        Scenario::parse(&format!(
            "models=['a','b']\n[mix]\nprompt_tokens={{uniform=[5,9]}}\nmax_tokens={{fixed=7}}\nstream_share=0.5\n{extra}\n[[phases]]\nname='p'\nrequests=1\narrivals={{constant={{rate=1}}}}"
        ))
        .unwrap()
    }

    #[test]
    fn mix_respects_distributions_and_shares() {
        let sc = scenario("[[mix.headers]]\nname='x-sim-fault'\nvalue='error-after=2'\nshare=0.25");
        let mut m = Mixer::new(&sc, 1).unwrap();
        let plans: Vec<RequestPlan> = (0..4000).map(|_| m.next_plan()).collect();
        assert!(plans
            .iter()
            .all(|p| (5..=9).contains(&p.prompt_tokens) && p.max_tokens == 7));
        let share = |f: &dyn Fn(&RequestPlan) -> bool| {
            plans.iter().filter(|p| f(p)).count() as f64 / 4000.0
        };
        assert!((share(&|p| p.stream) - 0.5).abs() < 0.04);
        assert!((share(&|p| p.header == Some(0)) - 0.25).abs() < 0.04);
        assert!((share(&|p| p.model == "a") - 0.5).abs() < 0.04);
        // Same seed, same plans.
        let mut again = Mixer::new(&sc, 1).unwrap();
        assert_eq!(again.next_plan(), plans[0]);
    }

    #[test]
    fn body_shapes() {
        let plan = RequestPlan {
            model: "m".into(),
            prompt: "hi".into(),
            prompt_tokens: 1,
            max_tokens: 3,
            stream: true,
            header: None,
        };
        let chat: serde_json::Value =
            serde_json::from_slice(&body(Api::Chat, &plan, true)).unwrap();
        assert_eq!(chat["messages"][0]["content"], "hi");
        assert_eq!(chat["stream_options"]["include_usage"], true);
        assert_eq!(chat["ignore_eos"], true);
        let comp: serde_json::Value = serde_json::from_slice(&body(
            Api::Completions,
            &RequestPlan {
                stream: false,
                ..plan
            },
            false,
        ))
        .unwrap();
        assert_eq!(comp["prompt"], "hi");
        assert!(comp.get("stream_options").is_none() && comp.get("ignore_eos").is_none());
        assert_eq!(synth_prompt(4, 0).split(' ').count(), 4);
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
