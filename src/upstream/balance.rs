//! Replica choice: power of two choices on in-flight requests plus the engine's waiting queue,
//! healthy replicas first.
//!
//! Two random candidates, the less loaded wins: near-least-loaded without the herd behaviour of
//! always picking the global minimum.
//!
//! Load of a replica: `score = in_flight + engine_queue`, where `in_flight` is what this proxy
//! has sent and not yet finished there, and `engine_queue` is the engine's canonical waiting
//! queue from its last scrape (`Replica::engine_load`, mapped from each engine's own family by
//! `engine::signals`; 0 when unknown, stale or turned off).
//! A request that waits in the engine queue is counted twice on purpose: at equal in-flight,
//! the replica whose engine is already saturated (queueing) loses, and traffic the engine gets
//! from elsewhere (other proxies, direct clients) shows up at all.

use rand::Rng;

/// What the balancer looks at for one replica.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub in_flight: usize,
    /// The engine's waiting queue as last scraped (0 when unknown).
    pub engine_queue: usize,
    pub healthy: bool,
}

/// The number p2c compares: lower is less loaded.
pub fn score(load: &Load) -> usize {
    load.in_flight.saturating_add(load.engine_queue)
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
            Some(if score(&loads[b]) < score(&loads[a]) {
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
        Load {
            in_flight,
            engine_queue: 0,
            healthy,
        }
    }

    fn q(in_flight: usize, engine_queue: usize) -> Load {
        Load {
            in_flight,
            engine_queue,
            healthy: true,
        }
    }

    #[test]
    fn score_is_in_flight_plus_engine_queue() {
        for (load, want) in [
            (q(0, 0), 0),
            (q(3, 0), 3),
            (q(0, 4), 4),
            (q(2, 5), 7),
            (q(usize::MAX, 1), usize::MAX),
        ] {
            assert_eq!(score(&load), want, "{load:?}");
        }
    }

    #[test]
    fn engine_queue_moves_traffic() {
        let mut rng = SmallRng::seed_from_u64(3);
        let cases: Vec<(Vec<Load>, Option<usize>)> = vec![
            // equal in-flight: the replica whose engine queues loses
            (vec![q(2, 6), q(2, 0)], Some(1)),
            // a long engine queue outweighs fewer in-flight requests
            (vec![q(1, 8), q(4, 0)], Some(1)),
            // fewer in-flight still wins when the queues are level
            (vec![q(1, 3), q(4, 3)], Some(0)),
            // an unhealthy replica loses even with an empty queue
            (
                vec![
                    Load {
                        in_flight: 0,
                        engine_queue: 0,
                        healthy: false,
                    },
                    q(5, 5),
                ],
                Some(1),
            ),
        ];
        for (loads, want) in cases {
            for _ in 0..20 {
                assert_eq!(pick(&loads, None, &mut rng), want, "{loads:?}");
            }
        }
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
