//! Token generation for the choices of one request: seeded, stop strings, EOS, logprobs.

use memchr::memmem;

use super::render::{Finish, TokLp, TokText, TokenLogprobs};
use super::request::{Api, GenRequest};
use super::text::{logprob, mix64, vocab, SplitMix};

/// One emitted token of one choice.
#[derive(Debug)]
pub struct TokenOut {
    pub text: TokText,
    pub logprobs: Option<TokenLogprobs>,
    pub finish: Option<Finish>,
    /// Tokens of this choice so far, this one included.
    pub count: u64,
}

#[derive(Debug)]
struct Choice {
    rng: SplitMix,
    count: u64,
    /// Characters emitted so far (legacy `text_offset`).
    chars: u64,
    /// Text so far, kept only when stop strings must be matched.
    text: Option<String>,
    finish: Option<Finish>,
}

/// The token streams of a request's `n` choices.
#[derive(Debug)]
pub struct Generation {
    api: Api,
    choices: Vec<Choice>,
    max_tokens: u64,
    stop: Vec<String>,
    stop_prob: f64,
    empty_prob: f64,
    logprobs: Option<u32>,
}

impl Generation {
    pub fn new(req: &GenRequest, stop_prob: f64, empty_prob: f64) -> Self {
        let choices = (0..req.n)
            .map(|i| Choice {
                rng: SplitMix::new(mix64(
                    req.text_seed ^ (i as u64).wrapping_mul(0x51_7cc1_b727_220a),
                )),
                count: 0,
                chars: 0,
                text: (!req.stop.is_empty()).then(String::new),
                finish: None,
            })
            .collect();
        Generation {
            api: req.api,
            choices,
            max_tokens: req.max_tokens,
            stop: req.stop.clone(),
            stop_prob: if req.ignore_eos { 0.0 } else { stop_prob },
            empty_prob,
            logprobs: req.logprobs,
        }
    }

    pub fn n(&self) -> u32 {
        self.choices.len() as u32
    }

    /// Whether the request asked for logprobs.
    pub fn logprobs(&self) -> bool {
        self.logprobs.is_some()
    }

    pub fn is_finished(&self, i: u32) -> bool {
        self.choices[i as usize].finish.is_some()
    }

    pub fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Choices still generating.
    pub fn active(&self) -> u64 {
        self.choices.iter().filter(|c| c.finish.is_none()).count() as u64
    }

    pub fn tokens(&self, i: u32) -> u64 {
        self.choices[i as usize].count
    }

    pub fn total_tokens(&self) -> u64 {
        self.choices.iter().map(|c| c.count).sum()
    }

    pub fn finish(&self, i: u32) -> Option<&Finish> {
        self.choices[i as usize].finish.as_ref()
    }

    /// No end-of-sequence draws from now on (a constrained tool call runs to its end).
    pub fn no_eos(&mut self) {
        self.stop_prob = 0.0;
    }

    /// Ends choice `i` now without a token (the engine gave up on it); false if it had
    /// already finished.
    pub fn end_early(&mut self, i: u32, finish: Finish) -> bool {
        let c = &mut self.choices[i as usize];
        if c.finish.is_some() {
            return false;
        }
        c.finish = Some(finish);
        true
    }

    /// The next token of choice `i`, or `None` once it has finished.
    pub fn next(&mut self, i: u32) -> Option<TokenOut> {
        let v = vocab();
        let api = self.api;
        let (max_tokens, stop_prob, empty_prob, lp_k) = (
            self.max_tokens,
            self.stop_prob,
            self.empty_prob,
            self.logprobs,
        );
        let c = &mut self.choices[i as usize];
        if c.finish.is_some() {
            return None;
        }
        c.count += 1;
        let r = c.rng.next_u64();
        let piece = &v[(r % v.len() as u64) as usize];
        let eos = stop_prob > 0.0 && c.rng.next_f64() < stop_prob;
        let empty = !eos && empty_prob > 0.0 && c.rng.next_f64() < empty_prob;
        let mut text = if eos || empty {
            TokText::Owned(String::new())
        } else {
            TokText::Piece(piece)
        };
        let mut finish = eos.then_some(Finish::Stop(None));
        if let (Some(acc), None) = (c.text.as_mut(), &finish) {
            let start = acc.len();
            acc.push_str(text.as_str());
            let from =
                start.saturating_sub(self.stop.iter().map(String::len).max().unwrap_or(1) - 1);
            let hit = self
                .stop
                .iter()
                .filter_map(|s| {
                    memmem::find(&acc.as_bytes()[from..], s.as_bytes()).map(|p| (from + p, s))
                })
                .min_by_key(|(p, _)| *p);
            if let Some((pos, s)) = hit {
                let cut = if pos >= start {
                    acc[start..pos].to_string()
                } else {
                    String::new()
                };
                acc.truncate(pos);
                text = TokText::Owned(cut);
                finish = Some(Finish::Stop(Some(s.clone())));
            }
        }
        if finish.is_none() && c.count >= max_tokens {
            finish = Some(Finish::Length);
        }
        let logprobs = lp_k.map(|k| {
            let sampled = TokLp {
                piece,
                logprob: logprob(&mut c.rng),
            };
            let mut top = Vec::with_capacity(k as usize + 1);
            if api == Api::Chat && k > 0 {
                top.push(sampled);
            }
            let alts = if api == Api::Chat {
                k.saturating_sub(1)
            } else {
                k
            };
            let base = (r % v.len() as u64) as usize;
            for j in 0..alts as usize {
                // Distinct from the sampled piece and each other: consecutive vocab entries.
                let alt = &v[(base + 1 + j + (r as usize >> 17) % 7) % v.len()];
                let alt = if std::ptr::eq(alt, piece) {
                    &v[(base + v.len() - 1) % v.len()]
                } else {
                    alt
                };
                top.push(TokLp {
                    piece: alt,
                    logprob: logprob(&mut c.rng),
                });
            }
            TokenLogprobs {
                sampled,
                top,
                text_offset: c.chars,
            }
        });
        c.chars += text.as_str().chars().count() as u64;
        c.finish = finish.clone();
        Some(TokenOut {
            text,
            logprobs,
            finish,
            count: c.count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    fn req(body: &str) -> GenRequest {
        parse(Api::Chat, body.as_bytes(), &["tiny".to_string()], 2048, 0).unwrap()
    }

    fn run(g: &mut Generation) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new(); g.n() as usize];
        while !g.all_finished() {
            for i in 0..g.n() {
                if let Some(t) = g.next(i) {
                    out[i as usize].push(t.text.as_str().to_string());
                }
            }
        }
        out
    }

    /// Choice 0's whole text and how it ended.
    fn text_and_finish(g: &mut Generation) -> (String, Option<Finish>) {
        let mut text = String::new();
        let mut last = None;
        while let Some(t) = g.next(0) {
            text.push_str(t.text.as_str());
            last = t.finish;
        }
        (text, last)
    }

    #[test]
    fn length_is_max_tokens_and_text_is_seeded() {
        let r =
            req(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":7,"n":2,"seed":1}"#);
        let a = run(&mut Generation::new(&r, 0.0, 0.0));
        let b = run(&mut Generation::new(&r, 0.0, 0.0));
        assert_eq!(a, b);
        assert_eq!(a[0].len(), 7);
        assert_ne!(a[0], a[1]);
    }

    #[test]
    fn stop_string_cuts_the_text_and_sets_stop_reason() {
        let r = req(
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":500,"stop":["e"],"seed":3}"#,
        );
        let (text, last) = text_and_finish(&mut Generation::new(&r, 0.0, 0.0));
        assert!(!text.contains('e'), "{text}");
        assert_eq!(last, Some(Finish::Stop(Some("e".into()))));
    }

    #[test]
    fn eos_probability_ends_early_unless_ignore_eos() {
        let r = req(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1000}"#);
        let mut g = Generation::new(&r, 0.5, 0.0);
        let n = run(&mut g)[0].len();
        assert!(n < 100, "{n}");
        assert_eq!(g.finish(0), Some(&Finish::Stop(None)));
        let r = req(
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":50,"ignore_eos":true}"#,
        );
        assert_eq!(run(&mut Generation::new(&r, 0.5, 0.0))[0].len(), 50);
    }

    #[test]
    fn end_early_finishes_only_unfinished_choices() {
        let r =
            req(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"n":2,"seed":1}"#);
        let mut g = Generation::new(&r, 0.0, 0.0);
        assert!(g.next(0).is_some());
        assert!(
            !g.end_early(0, Finish::Abort),
            "choice 0 already ended (length)"
        );
        assert!(g.end_early(1, Finish::Abort));
        assert!(g.all_finished());
        assert_eq!(g.finish(0), Some(&Finish::Length));
        assert_eq!(g.finish(1), Some(&Finish::Abort));
        assert_eq!(g.tokens(1), 0);
        assert!(g.next(1).is_none());
    }

    #[test]
    fn logprobs_have_k_alternatives() {
        let r = req(
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"logprobs":true,"top_logprobs":2}"#,
        );
        let mut g = Generation::new(&r, 0.0, 0.0);
        let t = g.next(0).unwrap();
        let lp = t.logprobs.unwrap();
        assert_eq!(lp.top.len(), 2);
        assert!(std::ptr::eq(lp.top[0].piece, lp.sampled.piece));
        assert!(!std::ptr::eq(lp.top[1].piece, lp.sampled.piece));
    }

    proptest::proptest! {
        /// Whatever the stop strings and seed, the emitted text never contains one, and the
        /// finish says which one cut it.
        #[test]
        fn emitted_text_never_contains_a_stop_string(
            stops in proptest::collection::vec("[a-z ]{1,3}", 1..3),
            seed in 0u64..1000,
        ) {
            let body = serde_json::json!({
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 200, "seed": seed, "stop": stops,
            });
            let r = req(&body.to_string());
            let mut g = Generation::new(&r, 0.0, 0.0);
            let (text, last) = text_and_finish(&mut g);
            for s in &stops {
                proptest::prop_assert!(!text.contains(s.as_str()), "{:?} in {:?}", s, text);
            }
            match last {
                Some(Finish::Stop(Some(s))) => proptest::prop_assert!(stops.contains(&s)),
                Some(Finish::Length) => proptest::prop_assert_eq!(g.tokens(0), 200),
                other => proptest::prop_assert!(false, "{:?}", other),
            }
        }
    }
}
