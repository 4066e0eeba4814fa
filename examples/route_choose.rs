//! What one replica choice costs (docs/routing.md): the request's shape (prefix-block hashes
//! of a chat body) and the choice among `REPLICAS` candidates, for each strategy, timed over
//! many requests on one thread. Bounded, no I/O.
//!
//!   cargo run --release --example route_choose -- [REPLICAS] [REQUESTS]

use goodput_proxy::config::{BalanceConfig, Strategy};
use goodput_proxy::metrics::Registrar;
use goodput_proxy::upstream::shape::Shape;
use goodput_proxy::upstream::strategy::{Balancer, Cand};
use goodput_proxy::upstream::Replica;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let replicas = args.first().copied().unwrap_or(64);
    let requests = args.get(1).copied().unwrap_or(200_000);
    // 16 system prompts of ~2 KB (8 blocks), a short question each.
    let bodies: Vec<Vec<u8>> = (0..256)
        .map(|i| {
            format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"question {i}"}}],"stream":true,"max_tokens":64}}"#,
                format!("policy {} ", i % 16).repeat(220)
            )
            .into_bytes()
        })
        .collect();
    for strategy in [
        Strategy::P2c,
        Strategy::Prefix,
        Strategy::Goodput,
        Strategy::Auto,
    ] {
        let cfg = BalanceConfig {
            strategy,
            ..BalanceConfig::default()
        };
        let b = Balancer::new(cfg.clone(), &Registrar::new(&prometheus::Registry::new()))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rng = SmallRng::seed_from_u64(1);
        // Real replicas: the snapshot the forwarder takes per request is part of the cost.
        let set: Vec<std::sync::Arc<Replica>> = (0..replicas)
            .map(|i| {
                let r = Replica::new(&format!("http://10.0.{}.{}:8000", i / 200, i % 200))
                    .map(std::sync::Arc::new)
                    .unwrap_or_else(|e| panic!("{e}"));
                r.set_healthy(true);
                r
            })
            .collect();
        let mut guards = std::collections::VecDeque::new();
        let (mut shape_ns, mut choose_ns, mut sink) = (0u128, 0u128, 0usize);
        for i in 0..requests {
            let t = Instant::now();
            let shape = Shape::of(&bodies[i % bodies.len()], cfg.prefix_block_bytes);
            let t1 = Instant::now();
            let now = Instant::now();
            let cands: Vec<Cand> = set.iter().map(|r| r.cand(now)).collect();
            let c = b.choose(&cands, &shape, &[], &mut rng);
            let t2 = Instant::now();
            shape_ns += (t1 - t).as_nanos();
            choose_ns += (t2 - t1).as_nanos();
            if let Some((c, _)) = c {
                sink += c.idx;
                // About 4 requests in flight per replica.
                guards.push_back(set[c.idx].start_tokens(shape.prompt_tokens, shape.output_tokens));
                if guards.len() > 4 * replicas {
                    guards.pop_front();
                }
            }
        }
        println!(
            "{:8} {replicas} replicas: shape {:.0} ns, choose {:.0} ns per request ({sink})",
            strategy.as_str(),
            shape_ns as f64 / requests as f64,
            choose_ns as f64 / requests as f64,
        );
    }
}
