//! Token packing: several tokens of one choice in one SSE event, as vLLM's output processor
//! merges the outputs a busy client has not taken yet. Each token still costs its decode step;
//! a packed event leaves when its last token is generated. Only the event boundaries change:
//! usage and the engine's metrics count every token.

use super::render::{Finish, TokText, TokenLogprobs};
use super::text::SplitMix;

/// When an event waits for the next token of its choice.
#[derive(Debug)]
pub enum Packing {
    /// One token per event.
    Off,
    /// `x-sim-fault: coalesce=K`: K tokens per event (the last event of a choice may hold
    /// fewer).
    Every(u64),
    /// `coalesce_prob`: after each token the event waits for the next one with probability
    /// `p` (seeded per request).
    Prob { p: f64, rng: SplitMix },
}

impl Packing {
    /// The packing of one request: the fault wins over the configured probability. The draws
    /// are seeded by `seed` and the arrival number, as the configured faults are.
    pub fn new(fault: Option<u64>, prob: f64, seed: u64, arrival_no: u64) -> Self {
        match fault {
            Some(k) if k > 1 => Packing::Every(k),
            Some(_) => Packing::Off,
            None if prob > 0.0 => Packing::Prob {
                p: prob,
                rng: SplitMix::new(
                    seed ^ 0xc0a1_e5ce_0000_0000 ^ arrival_no.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ),
            },
            None => Packing::Off,
        }
    }

    /// Whether an event already holding `held` tokens (its choice not finished) waits for
    /// the next token.
    pub fn hold(&mut self, held: usize) -> bool {
        match self {
            Packing::Off => false,
            Packing::Every(k) => (held as u64) < *k,
            Packing::Prob { p, rng } => rng.next_f64() < *p,
        }
    }
}

/// The tokens of one choice generated but not sent yet, and what its next event says.
#[derive(Debug, Default)]
pub struct Pending {
    pub texts: Vec<TokText>,
    pub logprobs: Vec<TokenLogprobs>,
    /// Tokens of the choice up to the last held one (continuous usage counts them).
    pub count: u64,
    pub finish: Option<Finish>,
    /// The chat role chunk went out (it goes with the choice's first event).
    pub role_sent: bool,
}

impl Pending {
    /// Clears the held tokens after their event was written.
    pub fn sent(&mut self) {
        self.texts.clear();
        self.logprobs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Event sizes for `tokens` tokens of one choice.
    fn sizes(p: &mut Packing, tokens: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut held = 0;
        for t in 1..=tokens {
            held += 1;
            if t == tokens || !p.hold(held) {
                out.push(held);
                held = 0;
            }
        }
        out
    }

    #[test]
    fn every_k_packs_k_tokens_and_the_rest_last() {
        let mut p = Packing::new(Some(3), 0.9, 0, 0);
        assert_eq!(sizes(&mut p, 8), vec![3, 3, 2]);
        assert_eq!(
            sizes(&mut Packing::new(Some(1), 0.9, 0, 0), 3),
            vec![1, 1, 1]
        );
        assert_eq!(sizes(&mut Packing::new(None, 0.0, 0, 0), 3), vec![1, 1, 1]);
        assert_eq!(sizes(&mut Packing::new(Some(10), 0.0, 0, 0), 4), vec![4]);
    }

    #[test]
    fn probability_is_seeded_and_near_its_rate() {
        let a = sizes(&mut Packing::new(None, 0.25, 7, 3), 4000);
        let b = sizes(&mut Packing::new(None, 0.25, 7, 3), 4000);
        assert_eq!(a, b, "same seed and arrival, same boundaries");
        assert_ne!(a, sizes(&mut Packing::new(None, 0.25, 7, 4), 4000));
        assert_eq!(a.iter().sum::<usize>(), 4000);
        // Each boundary is merged with probability 0.25: about 3000 events.
        assert!((2850..3150).contains(&a.len()), "{}", a.len());
        assert_eq!(sizes(&mut Packing::new(None, 1.0, 0, 0), 50), vec![50]);
    }
}
