//! The requests finished since the last tick, by (model, upstream).
//!
//! A finished request is put in its pair's group at once: label values are one `Arc` per
//! model and per replica, so its group is found by pointer comparison (the last group first:
//! runs of one pair are the rule), no reference count is touched and nothing is hashed; a
//! pair of new `Arc`s is compared by text with the groups there are (another `Arc` of a known
//! text joins that text's group, in finish order) and then found by pointer too. The tick takes
//! the groups out as a map filled request by request would hold them: the same pairs (by
//! text) in that map's iteration order, each pair's requests in the order they finished, so
//! the curves are fed in the same order (their sums are of floats).

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::FixedState;

/// A (model, upstream) pair of label values.
pub(super) type Pair = (Arc<str>, Arc<str>);

/// See the module docs.
#[derive(Debug)]
pub(super) struct Pending<T> {
    /// Each pair's requests, pairs in order of first appearance (by text).
    groups: Vec<(Pair, Vec<T>)>,
    /// The `Arc`s each group has been found by (its own first), with the group's index.
    by_pointer: Vec<(Pair, usize)>,
    /// The index in `by_pointer` of the last request's pair.
    last: usize,
    /// Emptied groups given back by the tick ([`Pending::give_back`]), with their room: a
    /// group of a tick's requests grows to its size once, not again at every tick.
    emptied: Vec<Vec<T>>,
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Self {
            groups: Vec::new(),
            by_pointer: Vec::new(),
            last: 0,
            emptied: Vec::new(),
        }
    }
}

impl<T> Pending<T> {
    /// One finished request of (`model`, `upstream`).
    #[inline]
    pub(super) fn push(&mut self, model: &Arc<str>, upstream: &Arc<str>, finished: T) {
        let same = |((m, u), _): &(Pair, usize)| Arc::ptr_eq(m, model) && Arc::ptr_eq(u, upstream);
        let g = match self.by_pointer.get(self.last) {
            Some(p) if same(p) => p.1,
            _ => match self.by_pointer.iter().position(same) {
                Some(i) => {
                    self.last = i;
                    self.by_pointer[i].1
                }
                None => self.found_by_text(model, upstream),
            },
        };
        if let Some((_, done)) = self.groups.get_mut(g) {
            done.push(finished);
        }
    }

    /// The group of a pair of `Arc`s not seen since the last tick: that text's, else a new one.
    #[inline(never)]
    fn found_by_text(&mut self, model: &Arc<str>, upstream: &Arc<str>) -> usize {
        let pair = (model.clone(), upstream.clone());
        let g = match self.groups.iter().position(|(p, _)| *p == pair) {
            Some(g) => g,
            None => {
                let done = self.emptied.pop().unwrap_or_default();
                self.groups.push((pair.clone(), done));
                self.groups.len() - 1
            }
        };
        self.by_pointer.push((pair, g));
        self.last = self.by_pointer.len() - 1;
        g
    }

    /// A group taken out by [`Pending::take_grouped`], its requests consumed: its room serves
    /// a later group (at most as many are kept as there were groups).
    pub(super) fn give_back(&mut self, mut done: Vec<T>) {
        done.clear();
        if self.emptied.len() < self.groups.capacity().max(1) {
            self.emptied.push(done);
        }
    }

    /// Everything pushed since the last call, grouped (see the module docs).
    pub(super) fn take_grouped(&mut self) -> Vec<(Pair, Vec<T>)> {
        self.by_pointer.clear();
        self.last = 0;
        // Iterated as a map keyed by text and filled in the same order of first appearance:
        // its layout does not depend on the values it holds.
        let mut index: HashMap<Pair, usize, FixedState> = HashMap::default();
        let mut groups: Vec<Vec<T>> = Vec::with_capacity(self.groups.len());
        for (pair, done) in self.groups.drain(..) {
            index.insert(pair, groups.len());
            groups.push(done);
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
                prop_assert_eq!(&got, &want);
                // The tick gives the groups back emptied; later groups reuse them.
                for (_, done) in got {
                    pending.give_back(done);
                }
            }
        }
    }
}
