//! Scenario files: the frozen load profile a team reruns before and after a change.
//!
//! Raw TOML structs use `deny_unknown_fields` so a typo fails loudly (toml's error names the key
//! and its line); `validate()` then checks values and names the offending field in its error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::Arrivals;

/// Which OpenAI-compatible endpoint the requests go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `POST /v1/chat/completions` with `messages`.
    #[default]
    Chat,
    /// `POST /v1/completions` with `prompt`.
    Completions,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
        }
    }
}

/// A token-count distribution, e.g. `{ fixed = 128 }`, `{ uniform = [64, 512] }`,
/// `{ normal = { mean = 256, std = 64 } }` (clamped to >= 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Dist {
    Fixed(u64),
    Uniform([u64; 2]),
    Normal { mean: f64, std: f64 },
}

impl Dist {
    fn validate(&self, field: &str) -> Result<(), ScenarioError> {
        match *self {
            Dist::Fixed(0) => Err(invalid(format!("{field}.fixed"), "must be >= 1")),
            Dist::Uniform([a, b]) if a == 0 || a > b => Err(invalid(
                format!("{field}.uniform"),
                "needs 1 <= low <= high",
            )),
            Dist::Normal { mean, std } if !(mean >= 1.0 && std >= 0.0 && std.is_finite()) => {
                Err(invalid(
                    format!("{field}.normal"),
                    "needs mean >= 1 and finite std >= 0",
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Service-level objectives used to count goodput (milliseconds; DESIGN.md defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloSpec {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    /// The largest gap allowed between two output events of a stream (the proxy's
    /// `slo.max_stall_ms`); off unless set, as on the proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_stall_ms: Option<f64>,
}

impl Default for SloSpec {
    fn default() -> Self {
        Self {
            ttft_ms: Some(2000.0),
            tpot_ms: Some(150.0),
            e2e_ms: Some(30000.0),
            max_stall_ms: None,
        }
    }
}

impl SloSpec {
    pub fn ttft(&self) -> Option<Duration> {
        self.ttft_ms.map(ms)
    }
    pub fn tpot(&self) -> Option<Duration> {
        self.tpot_ms.map(ms)
    }
    pub fn e2e(&self) -> Option<Duration> {
        self.e2e_ms.map(ms)
    }
    pub fn max_stall(&self) -> Option<Duration> {
        self.max_stall_ms.map(ms)
    }
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1000.0)
}

/// An extra header sent on a share of requests, e.g. a simulator fault
/// (`name = "x-sim-fault", value = "error-after=3", share = 0.1`). Its `tag` (default: the value)
/// is written into each request record so outcomes can be checked against what was injected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderShare {
    pub name: String,
    pub value: String,
    pub share: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl HeaderShare {
    pub fn tag(&self) -> &str {
        self.tag.as_deref().unwrap_or(&self.value)
    }
}

/// `ignore_eos = true` (every request), `false`, or a share such as `0.5`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BoolOrShare {
    Bool(bool),
    Share(f64),
}

impl BoolOrShare {
    pub fn share(self) -> f64 {
        match self {
            BoolOrShare::Bool(b) => f64::from(u8::from(b)),
            BoolOrShare::Share(s) => s,
        }
    }
}

/// What each request looks like. Every `*_share` is drawn per request from the run's seeded
/// generator; the shares marked "of streaming requests" only apply to requests that stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mix {
    pub prompt_tokens: Dist,
    pub max_tokens: Dist,
    /// Share of requests sent to `/v1/completions` (the rest go to chat). Unset: every request
    /// goes to the scenario's `api`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completions_share: Option<f64>,
    /// Share of requests sent with `"stream": true` (0..=1).
    pub stream_share: f64,
    /// Share of requests asking for logprobs: chat `logprobs: true, top_logprobs: N`,
    /// completions `logprobs: N` (N = `top_logprobs`).
    pub logprobs_share: f64,
    pub top_logprobs: u32,
    /// Share of requests sent with `"n": <n>` (several choices per request).
    pub n_share: f64,
    pub n: u32,
    /// Share of streaming requests with `stream_options.include_usage: true`.
    pub include_usage_share: f64,
    /// Share of streaming requests with `stream_options.continuous_usage_stats: true` (drawn
    /// independently; `include_usage` is then sent explicitly, true or false, because vLLM
    /// defaults it to true once `stream_options` is present).
    pub continuous_usage_share: f64,
    /// Ask the engine to ignore EOS so it generates exactly `max_tokens` (vLLM extension):
    /// `true`, `false` or a share.
    pub ignore_eos: BoolOrShare,
    /// Share of streaming requests whose client hangs up (drops the response) after
    /// `hangup_after_events` SSE events: the record's outcome is `client_abort`.
    pub hangup_share: f64,
    pub hangup_after_events: Dist,
    /// Optional JSONL of prompts: `{"prompt": "..."}` / `{"text": "..."}` lines or ShareGPT
    /// `{"conversations": [{"from": "human", "value": "..."}, ...]}` (first human turn).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<PathBuf>,
    /// Extra headers on a share of requests; shares are disjoint and sum to <= 1.
    pub headers: Vec<HeaderShare>,
    /// Share of chat requests that offer a function in `tools` (`get_weather`, see
    /// `request::TOOLS`); the client then judges any tool call against its JSON Schema, and
    /// the simulator answers `x-sim-fault: tool-call=...` only when tools were offered.
    pub tools_share: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            prompt_tokens: Dist::Fixed(128),
            max_tokens: Dist::Fixed(128),
            completions_share: None,
            stream_share: 1.0,
            logprobs_share: 0.0,
            top_logprobs: 2,
            n_share: 0.0,
            n: 2,
            // Exact completion token counts on the client side unless the scenario says otherwise.
            include_usage_share: 1.0,
            continuous_usage_share: 0.0,
            ignore_eos: BoolOrShare::Bool(false),
            hangup_share: 0.0,
            hangup_after_events: Dist::Fixed(4),
            dataset: None,
            headers: Vec::new(),
            tools_share: 0.0,
        }
    }
}

impl Mix {
    /// Check values; `at` is the field path of this mix (`mix` or `phases[i].mix`).
    fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        self.prompt_tokens
            .validate(&format!("{at}.prompt_tokens"))?;
        self.max_tokens.validate(&format!("{at}.max_tokens"))?;
        self.hangup_after_events
            .validate(&format!("{at}.hangup_after_events"))?;
        let shares = [
            ("completions_share", self.completions_share.unwrap_or(0.0)),
            ("stream_share", self.stream_share),
            ("logprobs_share", self.logprobs_share),
            ("n_share", self.n_share),
            ("include_usage_share", self.include_usage_share),
            ("continuous_usage_share", self.continuous_usage_share),
            ("ignore_eos", self.ignore_eos.share()),
            ("hangup_share", self.hangup_share),
            ("tools_share", self.tools_share),
        ];
        for (name, v) in shares {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(format!("{at}.{name}"), "must be within 0..=1"));
            }
        }
        if !(1..=20).contains(&self.top_logprobs) {
            return Err(invalid(
                format!("{at}.top_logprobs"),
                "must be within 1..=20",
            ));
        }
        if !(2..=16).contains(&self.n) {
            return Err(invalid(format!("{at}.n"), "must be within 2..=16"));
        }
        let mut total = 0.0;
        for (i, h) in self.headers.iter().enumerate() {
            if !(0.0..=1.0).contains(&h.share) {
                return Err(invalid(
                    format!("{at}.headers[{i}].share"),
                    "must be within 0..=1",
                ));
            }
            if http::HeaderName::from_bytes(h.name.as_bytes()).is_err() {
                return Err(invalid(
                    format!("{at}.headers[{i}].name"),
                    "not a valid header name",
                ));
            }
            if http::HeaderValue::from_str(&h.value).is_err() {
                return Err(invalid(
                    format!("{at}.headers[{i}].value"),
                    "not a valid header value",
                ));
            }
            total += h.share;
        }
        if total > 1.0 + 1e-9 {
            return Err(invalid(
                format!("{at}.headers"),
                "shares sum to more than 1",
            ));
        }
        Ok(())
    }
}

/// One phase of the run: a name, a stop condition, and how requests arrive.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub name: String,
    /// Phase length in seconds; arrivals stop at this boundary.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Number of requests to send in this phase (with `duration_s`: whichever comes first).
    #[serde(default)]
    pub requests: Option<u64>,
    pub arrivals: Arrivals,
    /// Wait for this phase's requests to finish before the next phase starts.
    #[serde(default)]
    pub drain: bool,
    /// Keys that replace the global `[mix]`'s for this phase only (`[phases.mix]`).
    #[serde(default)]
    pub mix: Option<toml::Table>,
}

impl Phase {
    pub fn duration(&self) -> Option<Duration> {
        self.duration_s.map(Duration::from_secs_f64)
    }
}

/// A whole scenario file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Base URL of the proxy or engine (`--target` overrides).
    #[serde(default)]
    pub target: Option<String>,
    #[serde(default)]
    pub api: Api,
    /// Models to request; each request picks one uniformly at random.
    #[serde(default = "default_models")]
    pub models: Vec<String>,
    #[serde(default)]
    pub seed: u64,
    /// Cap on requests in flight; arrivals beyond it are held back (and counted).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Client-side deadline per request (seconds); past it the outcome is `timeout`.
    #[serde(default = "default_timeout")]
    pub request_timeout_s: f64,
    #[serde(default)]
    pub slo: SloSpec,
    #[serde(default)]
    pub mix: Mix,
    pub phases: Vec<Phase>,
}

fn default_models() -> Vec<String> {
    vec!["tiny".to_string()]
}
fn default_max_in_flight() -> usize {
    1024
}
fn default_timeout() -> f64 {
    120.0
}

/// Why a scenario could not be loaded; always names the file or the field.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("reading scenario {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing scenario {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid scenario field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Scenario {
    /// Read, parse and validate a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut sc = Self::parse(&text).map_err(|e| match e {
            ScenarioError::Parse { source, .. } => ScenarioError::Parse {
                path: path.to_owned(),
                source,
            },
            other => other,
        })?;
        // A relative dataset path is relative to the scenario file, not the working directory.
        if let (Some(ds), Some(dir)) = (sc.mix.dataset.as_mut(), path.parent()) {
            if ds.is_relative() {
                *ds = dir.join(&*ds);
            }
        }
        Ok(sc)
    }

    /// Parse and validate scenario text.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let sc: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: PathBuf::from("<text>"),
            source: Box::new(e),
        })?;
        sc.validate()?;
        Ok(sc)
    }

    pub fn validate(&self) -> Result<(), ScenarioError> {
        if self.models.is_empty() || self.models.iter().any(|m| m.is_empty()) {
            return Err(invalid("models", "needs at least one non-empty model name"));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("max_in_flight", "must be >= 1"));
        }
        if !(self.request_timeout_s > 0.0 && self.request_timeout_s.is_finite()) {
            return Err(invalid("request_timeout_s", "must be > 0"));
        }
        for (name, v) in [
            ("slo.ttft_ms", self.slo.ttft_ms),
            ("slo.tpot_ms", self.slo.tpot_ms),
            ("slo.e2e_ms", self.slo.e2e_ms),
        ] {
            if v.is_some_and(|v| !(v >= 0.0 && v.is_finite())) {
                return Err(invalid(name, "must be >= 0"));
            }
        }
        // As the proxy's `slo.max_stall_ms`: 0 would make every stream with two events a miss.
        if self
            .slo
            .max_stall_ms
            .is_some_and(|v| !(v > 0.0 && v.is_finite()))
        {
            return Err(invalid(
                "slo.max_stall_ms",
                "must be > 0 (leave it out to turn it off)",
            ));
        }
        self.mix.validate("mix")?;
        if self.phases.is_empty() {
            return Err(invalid("phases", "needs at least one [[phases]] entry"));
        }
        for (i, p) in self.phases.iter().enumerate() {
            let f = |k: &str| format!("phases[{i}].{k}");
            if p.name.is_empty() {
                return Err(invalid(f("name"), "must not be empty"));
            }
            if self.phases[..i].iter().any(|q| q.name == p.name) {
                return Err(invalid(
                    f("name"),
                    format!("duplicate phase name {:?}", p.name),
                ));
            }
            match (p.duration_s, p.requests) {
                (None, None) => {
                    return Err(invalid(
                        f("duration_s"),
                        "set duration_s or requests (or both)",
                    ))
                }
                (Some(d), _) if !(d > 0.0 && d.is_finite()) => {
                    return Err(invalid(f("duration_s"), "must be > 0"))
                }
                (_, Some(0)) => return Err(invalid(f("requests"), "must be >= 1")),
                _ => {}
            }
            p.arrivals
                .validate(&f("arrivals"), p.duration_s.is_some())
                .map_err(|(field, reason)| invalid(field, reason))?;
            self.phase_mix(i)?;
        }
        Ok(())
    }

    /// The mix of phase `i`: the global `[mix]` with the phase's own keys replacing it, and
    /// `completions_share` filled in from `api` when unset.
    pub fn phase_mix(&self, i: usize) -> Result<Mix, ScenarioError> {
        let at = format!("phases[{i}].mix");
        let mut mix = match self.phases.get(i).and_then(|p| p.mix.as_ref()) {
            None => self.mix.clone(),
            Some(over) => {
                if over.contains_key("dataset") {
                    return Err(invalid(
                        format!("{at}.dataset"),
                        "set the dataset in the global [mix]",
                    ));
                }
                let mut base =
                    toml::Table::try_from(&self.mix).map_err(|e| invalid("mix", e.to_string()))?;
                for (k, v) in over {
                    base.insert(k.clone(), v.clone());
                }
                let mut m: Mix = toml::Value::Table(base)
                    .try_into()
                    .map_err(|e: toml::de::Error| invalid(&at, e.message().to_owned()))?;
                m.dataset.clone_from(&self.mix.dataset);
                m.validate(&at)?;
                m
            }
        };
        if mix.completions_share.is_none() {
            mix.completions_share = Some(match self.api {
                Api::Chat => 0.0,
                Api::Completions => 1.0,
            });
        }
        Ok(mix)
    }

    /// Every phase's mix, in order (see [`Scenario::phase_mix`]).
    pub fn phase_mixes(&self) -> Result<Vec<Mix>, ScenarioError> {
        (0..self.phases.len()).map(|i| self.phase_mix(i)).collect()
    }

    /// Total planned run time when every phase has a duration (for progress bars).
    pub fn planned_duration(&self) -> Option<Duration> {
        self.phases.iter().map(|p| p.duration()).sum()
    }
}

/// Scenario built from command-line flags for the common one-phase case.
#[derive(Debug, Clone)]
pub struct QuickSpec {
    pub rate: Option<f64>,
    pub concurrency: Option<usize>,
    pub duration_s: Option<f64>,
    pub requests: Option<u64>,
    pub model: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub max_tokens: Option<u64>,
    pub stream: Option<bool>,
    pub seed: Option<u64>,
    pub api: Option<Api>,
    pub max_in_flight: Option<usize>,
}

impl Scenario {
    /// One phase named `main` from flags: `--rate` (Poisson) or `--concurrency` (closed loop).
    pub fn from_quick(q: &QuickSpec) -> Result<Self, ScenarioError> {
        let arrivals = match (q.rate, q.concurrency) {
            (Some(_), Some(_)) => return Err(invalid("--rate/--concurrency", "pick one")),
            (Some(rate), None) => Arrivals::Poisson { rate },
            (None, Some(n)) => Arrivals::Concurrency { n },
            (None, None) => Arrivals::Concurrency { n: 1 },
        };
        let (duration_s, requests) = match (q.duration_s, q.requests) {
            (None, None) => (None, Some(100)),
            other => other,
        };
        let mut sc = Scenario {
            target: None,
            api: Api::Chat,
            models: default_models(),
            seed: q.seed.unwrap_or(0),
            max_in_flight: default_max_in_flight(),
            request_timeout_s: default_timeout(),
            slo: SloSpec::default(),
            mix: Mix::default(),
            phases: vec![Phase {
                name: "main".into(),
                duration_s,
                requests,
                arrivals,
                drain: false,
                mix: None,
            }],
        };
        sc.apply_overrides(q);
        sc.validate()?;
        Ok(sc)
    }

    /// Flags given alongside `--scenario` override the file's values.
    pub fn apply_overrides(&mut self, q: &QuickSpec) {
        if let Some(m) = &q.model {
            self.models = vec![m.clone()];
        }
        if let Some(n) = q.prompt_tokens {
            self.mix.prompt_tokens = Dist::Fixed(n);
        }
        if let Some(n) = q.max_tokens {
            self.mix.max_tokens = Dist::Fixed(n);
        }
        if let Some(s) = q.stream {
            self.mix.stream_share = if s { 1.0 } else { 0.0 };
        }
        if let Some(s) = q.seed {
            self.seed = s;
        }
        if let Some(a) = q.api {
            self.api = a;
            // `--api` means every request goes there.
            self.mix.completions_share = None;
        }
        if let Some(n) = q.max_in_flight {
            self.max_in_flight = n;
        }
    }
}

/// Every scenario of `loadtest/scenarios/`, loaded (a broken one panics with its path).
#[cfg(test)]
pub(crate) fn examples() -> Vec<Scenario> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            out.push(Scenario::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
        target = "http://127.0.0.1:8080"
        api = "completions"
        models = ["a", "b"]
        seed = 7
        max_in_flight = 64
        [slo]
        ttft_ms = 500
        [mix]
        prompt_tokens = { uniform = [16, 64] }
        max_tokens = { normal = { mean = 100, std = 10 } }
        stream_share = 0.5
        ignore_eos = true
        [[mix.headers]]
        name = "x-sim-fault"
        value = "error-after=3"
        share = 0.1
        [[phases]]
        name = "warm"
        duration_s = 5
        arrivals = { constant = { rate = 2 } }
        [[phases]]
        name = "ramp"
        duration_s = 10
        arrivals = { ramp = { from = 1, to = 20 } }
        [[phases]]
        name = "burst"
        requests = 50
        arrivals = { concurrency = { n = 8 } }
    "#;

    #[test]
    fn parses_a_full_scenario() {
        let sc = Scenario::parse(FULL).unwrap();
        assert_eq!(sc.api, Api::Completions);
        assert_eq!(sc.models, ["a", "b"]);
        assert_eq!(sc.slo.ttft_ms, Some(500.0));
        assert_eq!(
            sc.slo.tpot_ms,
            Some(150.0),
            "an SLO not set keeps its DESIGN.md default"
        );
        assert_eq!(sc.mix.prompt_tokens, Dist::Uniform([16, 64]));
        assert_eq!(sc.mix.headers[0].tag(), "error-after=3");
        assert_eq!(
            sc.phases[1].arrivals,
            Arrivals::Ramp {
                from: 1.0,
                to: 20.0
            }
        );
        assert_eq!(sc.phases[2].arrivals, Arrivals::Concurrency { n: 8 });
        assert_eq!(sc.planned_duration(), None);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("seed = 1\nrat = 3\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "rat"),
            ("[[phases]]\nname='a'\nrequests=1\narrivals={poisson={rat=1}}", "rat"),
            ("[[phases]]\nname='a'\nrequests=1\narrivals={poisson={rate=0}}", "phases[0].arrivals.poisson.rate"),
            ("[[phases]]\nname='a'\narrivals={poisson={rate=1}}", "phases[0].duration_s"),
            ("[[phases]]\nname='a'\nrequests=3\narrivals={ramp={from=1,to=2}}", "phases[0].arrivals.ramp"),
            ("[[phases]]\nname='a'\nrequests=0\narrivals={constant={rate=1}}", "phases[0].requests"),
            ("[mix]\nstream_share=2\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "mix.stream_share"),
            ("[mix]\nmax_tokens={uniform=[5,2]}\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "mix.max_tokens.uniform"),
            ("phases = []", "phases"),
            ("[slo]\nmax_stall_ms=0\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "slo.max_stall_ms"),
            ("[mix]\nhangup_share=1.5\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "mix.hangup_share"),
            ("[mix]\nignore_eos=2\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "mix.ignore_eos"),
            ("[mix]\nn=1\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "mix.n"),
            ("[mix]\nhangup_after_events={fixed=0}\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}", "mix.hangup_after_events.fixed"),
            ("[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}\nmix={logprobs_share=-0.1}", "phases[0].mix.logprobs_share"),
            ("[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}\nmix={n_shar=0.1}", "phases[0].mix"),
            ("[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}\nmix={dataset='x.jsonl'}", "phases[0].mix.dataset"),
            ("[[phases]]\nname='a'\nrequests=1\narrivals={concurrency={n=0}}", "phases[0].arrivals.concurrency.n"),
            (
                "[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}\n[[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}",
                "phases[1].name",
            ),
        ];
        for (text, field) in cases {
            let err = Scenario::parse(text).unwrap_err().to_string();
            assert!(
                err.contains(field),
                "error for {text:?} should name {field:?}: {err}"
            );
        }
    }

    #[test]
    fn phase_mix_replaces_only_its_keys() {
        let sc = Scenario::parse(
            "api='completions'\n[mix]\nmax_tokens={fixed=9}\nstream_share=0.5\nignore_eos=true\n\
             [[mix.headers]]\nname='x-a'\nvalue='1'\nshare=0.1\n\
             [[phases]]\nname='a'\nrequests=1\narrivals={constant={rate=1}}\n\
             [[phases]]\nname='b'\nrequests=1\narrivals={constant={rate=1}}\n\
             [phases.mix]\nstream_share=1\nhangup_share=0.25\ncompletions_share=0.5\nheaders=[]",
        )
        .unwrap();
        let a = sc.phase_mix(0).unwrap();
        assert_eq!(a.stream_share, 0.5);
        assert_eq!(a.completions_share, Some(1.0), "unset: from `api`");
        assert_eq!(a.headers.len(), 1);
        let b = sc.phase_mix(1).unwrap();
        assert_eq!((b.stream_share, b.hangup_share), (1.0, 0.25));
        assert_eq!(b.completions_share, Some(0.5));
        assert_eq!(b.max_tokens, Dist::Fixed(9), "kept from the global mix");
        assert_eq!(b.ignore_eos, BoolOrShare::Bool(true));
        assert!(b.headers.is_empty());
    }

    #[test]
    fn quick_spec_builds_one_phase() {
        let q = QuickSpec {
            rate: Some(5.0),
            concurrency: None,
            duration_s: Some(3.0),
            requests: None,
            model: Some("m".into()),
            prompt_tokens: Some(10),
            max_tokens: Some(20),
            stream: Some(false),
            seed: Some(9),
            api: None,
            max_in_flight: None,
        };
        let sc = Scenario::from_quick(&q).unwrap();
        assert_eq!(sc.phases.len(), 1);
        assert_eq!(sc.phases[0].arrivals, Arrivals::Poisson { rate: 5.0 });
        assert_eq!(sc.models, ["m"]);
        assert_eq!(sc.mix.stream_share, 0.0);
        assert_eq!(sc.planned_duration(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn example_scenarios_load() {
        assert!(examples().len() >= 4);
    }
}
