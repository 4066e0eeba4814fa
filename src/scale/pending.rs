//! The requests finished since the last tick, by (model, upstream).
//!
//! A finished request is only pushed (its label values are `Arc`s: two reference counts, no
//! hashing); the tick groups them. Label values are one `Arc` per model and per replica, so a
//! run of requests of one pair is grouped by pointer comparison and the pair's text is hashed
//! once per run, not once per request. The groups come out as a map filled request by request
//! would hold them: the same pairs (by text) in that map's iteration order, each pair's
//! requests in the order they finished, so the curves are fed in the same order (their sums
//! are of floats).

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::FixedState;

/// A (model, upstream) pair of label values.
pub(super) type Pair = (Arc<str>, Arc<str>);

/// See the module docs.
#[derive(Debug)]
pub(super) struct Pending<T> {
    done: Vec<(Pair, T)>,
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Self { done: Vec::new() }
    }
}

impl<T> Pending<T> {
    /// One finished request of (`model`, `upstream`).
    #[inline]
    pub(super) fn push(&mut self, model: &Arc<str>, upstream: &Arc<str>, finished: T) {
        self.done
            .push(((model.clone(), upstream.clone()), finished));
    }

    /// Everything pushed since the last call, grouped (see the module docs); keeps the room.
    pub(super) fn take_grouped(&mut self) -> Vec<(Pair, Vec<T>)> {
        // Keyed by text (Arcs of one text are one pair), iterated as a map keyed the same way
        // and filled in the same order of first appearance: its layout does not depend on
        // the values it holds.
        let mut index: HashMap<Pair, usize, FixedState> = HashMap::default();
        let mut groups: Vec<Vec<T>> = Vec::new();
        let mut last: Option<(Pair, usize)> = None;
        for (pair, finished) in self.done.drain(..) {
            let i = match &last {
                Some(((m, u), i)) if Arc::ptr_eq(m, &pair.0) && Arc::ptr_eq(u, &pair.1) => *i,
                _ => {
                    let n = groups.len();
                    let i = *index.entry(pair.clone()).or_insert(n);
                    if i == n {
                        groups.push(Vec::new());
                    }
                    last = Some((pair, i));
                    i
                }
            };
            if let Some(g) = groups.get_mut(i) {
                g.push(finished);
            }
        }
        index
            .into_iter()
            .map(|(pair, i)| {
                let g = groups.get_mut(i).map(std::mem::take).unwrap_or_default();
                (pair, g)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The map a request at a time: what the groups are held to.
    type Reference = HashMap<Pair, Vec<u32>, FixedState>;

    proptest! {
        #[test]
        fn groups_are_the_map_filled_request_by_request(
            ticks in prop::collection::vec(
                prop::collection::vec((0usize..6, 0usize..4, any::<bool>()), 0..200),
                1..4,
            ),
        ) {
            // Three models and two upstreams, each text in two Arcs (a label set replaced by
            // discovery hands out new Arcs of the same text).
            let text = ["m-a", "m-b", "m-c", "http://u-1", "http://u-2", "m-a"];
            let arcs: Vec<[Arc<str>; 2]> = text
                .iter()
                .map(|t| [Arc::from(*t), Arc::from(*t)])
                .collect();
            let mut pending = Pending::default();
            let mut seq = 0u32;
            for tick in ticks {
                let mut reference = Reference::default();
                for (m, u, other_arc) in tick {
                    let (m, u) = ([0, 1, 2, 5][m % 4], 3 + u % 2);
                    let model = &arcs[m][usize::from(other_arc)];
                    let upstream = &arcs[u][0];
                    seq += 1;
                    pending.push(model, upstream, seq);
                    reference
                        .entry((model.clone(), upstream.clone()))
                        .or_default()
                        .push(seq);
                }
                let got = pending.take_grouped();
                let want: Vec<(Pair, Vec<u32>)> = reference.into_iter().collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
