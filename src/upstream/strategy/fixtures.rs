//! What the strategy's tests share: candidates, configurations, shapes, random fleets.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::balancer::Balancer;
use super::decide::{decide, Ask, Cand, Choice, Room};
use crate::config::{BalanceConfig, Strategy};
use crate::metrics::Registrar;
use crate::upstream::shape::Shape;

pub(super) fn cand(id: u32, tokens: u64) -> Cand {
    Cand {
        id,
        healthy: true,
        in_flight: (tokens / 100) as usize,
        tokens,
        waiting: Some(0.0),
        kv: Some(0.1),
        attainment: 1.0,
    }
}

pub(super) fn balancer(cfg: BalanceConfig) -> Balancer {
    Balancer::new(cfg, &Registrar::new(&prometheus::Registry::new())).unwrap()
}

pub(super) fn cfg(strategy: Strategy) -> BalanceConfig {
    BalanceConfig {
        strategy,
        exploration: 0.0,
        prefix_min_blocks: 2,
        ..BalanceConfig::default()
    }
}

pub(super) fn shape(blocks: usize) -> Shape {
    Shape {
        blocks: (0..blocks as u64).collect(),
        prompt_tokens: 100,
        output_tokens: 100,
    }
}

pub(super) fn run(
    cfg: &BalanceConfig,
    cands: &[Cand],
    matched: &[usize],
    blocks: usize,
    excluded: &[usize],
) -> Option<Choice> {
    let mut rng = SmallRng::seed_from_u64(5);
    decide(
        cfg,
        cands,
        &Ask {
            shape: &shape(blocks),
            matched,
            match_blocks: blocks,
            excluded,
            room: Room::Unknown,
        },
        &mut rng,
        &mut Vec::new(),
    )
}

/// Random fleets for the differential tests: `n` candidates with ids 1..=n, some
/// unhealthy, engines and attainments varied.
pub(super) fn random_fleet(rng: &mut SmallRng, n: u32) -> Vec<Cand> {
    (1..=n)
        .map(|id| Cand {
            id,
            healthy: rng.random_bool(0.85),
            in_flight: rng.random_range(0..8),
            tokens: rng.random_range(0..3_000),
            waiting: [None, Some(0.0), Some(1.0), Some(5.0)][rng.random_range(0..4)],
            kv: [None, Some(0.2), Some(0.99)][rng.random_range(0..3)],
            attainment: [1.0, 1.0, 0.9, 0.5][rng.random_range(0..4)],
        })
        .collect()
}
