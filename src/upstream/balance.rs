//! Replica choice: power of two choices on in-flight requests, healthy replicas first.
//!
//! Two random candidates, the less loaded wins: near-least-loaded without the herd behaviour of
//! always picking the global minimum. The engine queue signal can be folded into the load later.

use rand::Rng;

/// What the balancer looks at for one replica.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub in_flight: usize,
    pub healthy: bool,
}

/// Picks a replica index, never `exclude` (a replica that just failed to connect).
/// Healthy replicas are preferred; when none is healthy every candidate is tried, so a stale
/// health view never blocks traffic. `None` when there is no candidate.
pub fn pick<R: Rng + ?Sized>(loads: &[Load], exclude: Option<usize>, rng: &mut R) -> Option<usize> {
    let eligible = |i: &usize| Some(*i) != exclude;
    let mut candidates: Vec<usize> = (0..loads.len())
        .filter(eligible)
        .filter(|&i| loads[i].healthy)
        .collect();
    if candidates.is_empty() {
        candidates = (0..loads.len()).filter(eligible).collect();
    }
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        n => {
            let a = rng.random_range(0..n);
            let mut b = rng.random_range(0..n - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (candidates[a], candidates[b]);
            Some(if loads[b].in_flight < loads[a].in_flight {
                b
            } else {
                a
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn l(in_flight: usize, healthy: bool) -> Load {
        Load { in_flight, healthy }
    }

    #[test]
    fn table() {
        let mut rng = SmallRng::seed_from_u64(1);
        let cases: Vec<(Vec<Load>, Option<usize>, Option<usize>)> = vec![
            (vec![], None, None),
            (vec![l(5, false)], None, Some(0)),
            (vec![l(5, true)], Some(0), None),
            // two replicas: p2c sees both, the less loaded wins
            (vec![l(3, true), l(1, true)], None, Some(1)),
            (vec![l(0, true), l(9, true)], None, Some(0)),
            // the excluded one is never chosen even when idle
            (vec![l(0, true), l(9, true)], Some(0), Some(1)),
            // unhealthy loses to healthy regardless of load
            (vec![l(0, false), l(9, true)], None, Some(1)),
            // nobody healthy: still pick by load
            (vec![l(4, false), l(2, false)], None, Some(1)),
        ];
        for (loads, exclude, want) in cases {
            for _ in 0..20 {
                assert_eq!(
                    pick(&loads, exclude, &mut rng),
                    want,
                    "{loads:?} {exclude:?}"
                );
            }
        }
    }

    #[test]
    fn never_picks_the_most_loaded_of_many() {
        let mut rng = SmallRng::seed_from_u64(7);
        let loads: Vec<Load> = (0..5).map(|i| l(i, true)).collect();
        for _ in 0..200 {
            assert_ne!(pick(&loads, None, &mut rng), Some(4));
        }
    }
}
