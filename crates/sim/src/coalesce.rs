//! Token packing: several tokens of one choice in one SSE event, as vLLM's output processor
//! merges the outputs a busy client has not taken yet. Each token still costs its decode step;
//! a packed event leaves when its last token is generated. Only the event boundaries change:
//! usage and the engine's metrics count every token.

use super::render::{Finish, TokText, TokenLogprobs};
use super::text::SplitMix;

/// When an event waits for the next token of its choice: vLLM's `--stream-interval K` (the
/// first token alone, then an event every K tokens, the rest with the finish), and on top of it
/// the merging of a busy client's untaken outputs.
#[derive(Debug)]
pub struct Packing {
    merge: Merge,
    /// `--stream-interval` (1: every token may go out at once).
    interval: u64,
}

#[derive(Debug)]
enum Merge {
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
        let merge = match fault {
            Some(k) if k > 1 => Merge::Every(k),
            Some(_) => Merge::Off,
            None if prob > 0.0 => Merge::Prob {
                p: prob,
                rng: SplitMix::new(
                    seed ^ 0xc0a1_e5ce_0000_0000 ^ arrival_no.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ),
            },
            None => Merge::Off,
        };
        Packing { merge, interval: 1 }
    }

    /// vLLM's `--stream-interval`: at most one event per `k` tokens after the first.
    pub fn stream_interval(mut self, k: u64) -> Self {
        self.interval = k.max(1);
        self
    }

    /// Whether an event already holding `held` tokens (its choice not finished) waits for
    /// the next token; `first` says no event of the choice went out yet (vLLM sends the first
    /// token at once whatever the interval).
    pub fn hold(&mut self, held: usize, first: bool) -> bool {
        if !first && (held as u64) < self.interval {
            return true;
        }
        match &mut self.merge {
            Merge::Off => false,
            Merge::Every(k) => (held as u64) < *k,
            Merge::Prob { p, rng } => rng.next_f64() < *p,
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
            if t == tokens || !p.hold(held, out.is_empty()) {
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
    fn stream_interval_sends_the_first_token_alone_then_every_k() {
        // interval4-stream-chat-usage.txt: 10 tokens in events of 1, 4, 4, 1.
        let table: &[(u64, usize, &[usize])] = &[
            (4, 10, &[1, 4, 4, 1]),
            (4, 5, &[1, 4]),
            (4, 1, &[1]),
            (4, 3, &[1, 2]),
            (1, 3, &[1, 1, 1]),
            (3, 7, &[1, 3, 3]),
        ];
        for &(k, tokens, want) in table {
            let mut p = Packing::new(None, 0.0, 0, 0).stream_interval(k);
            assert_eq!(sizes(&mut p, tokens), want, "interval {k}, {tokens} tokens");
        }
        // A merge on top packs further: every event at least the interval's.
        let mut p = Packing::new(Some(6), 0.0, 0, 0).stream_interval(4);
        assert_eq!(sizes(&mut p, 14), vec![6, 6, 2]);
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
