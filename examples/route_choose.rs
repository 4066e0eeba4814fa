//! What one replica choice costs (docs/routing.md): the request's shape (prefix-block hashes
//! of a chat body) and the choice among `REPLICAS` candidates, for each strategy, timed over
//! many requests on one thread. Bounded, no I/O.
//!
//!   cargo run --release --example route_choose -- [REPLICAS] [REQUESTS] [STRATEGY...]
//!
//! Every strategy by default, else those named. Each line ends with the decisions by reason and
//! a digest of every choice in order (replica and reason): two builds that print the same
//! digest chose the same replicas for the same reasons.

use goodput_proxy::config::{BalanceConfig, Strategy};
use goodput_proxy::metrics::Registrar;
use goodput_proxy::upstream::shape::Shape;
use goodput_proxy::upstream::strategy::{Balancer, Reason};
use goodput_proxy::upstream::Replica;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::time::Instant;

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = raw.iter().filter_map(|a| a.parse().ok()).collect();
    let named: Vec<&str> = raw
        .iter()
        .filter(|a| a.parse::<usize>().is_err())
        .map(String::as_str)
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
    ]
    .into_iter()
    .filter(|s| named.is_empty() || named.contains(&s.as_str()))
    {
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
        let (mut shape_ns, mut choose_ns) = (0u128, 0u128);
        let mut reasons = [0u64; Reason::ALL.len()];
        // FNV-1a over (replica, reason) of every choice.
        let mut digest = 0xcbf2_9ce4_8422_2325u64;
        for i in 0..requests {
            let t = Instant::now();
            let shape = Shape::of(&bodies[i % bodies.len()], cfg.prefix_block_bytes);
            let t1 = Instant::now();
            // The forwarder's call: the replicas' snapshot is part of the cost.
            let c = b.choose_among(&set, Instant::now(), &shape, &[], &mut rng);
            let t2 = Instant::now();
            shape_ns += (t1 - t).as_nanos();
            choose_ns += (t2 - t1).as_nanos();
            if let Some((c, _)) = c {
                reasons[c.reason as usize] += 1;
                for x in [c.idx as u64, c.reason as u64] {
                    digest = (digest ^ x).wrapping_mul(0x100_0000_01b3);
                }
                // About 4 requests in flight per replica.
                guards.push_back(set[c.idx].start_tokens(shape.prompt_tokens, shape.output_tokens));
                if guards.len() > 4 * replicas {
                    guards.pop_front();
                }
            }
        }
        let by_reason: Vec<String> = Reason::ALL
            .iter()
            .filter(|r| reasons[**r as usize] > 0)
            .map(|r| format!("{} {}", r.as_str(), reasons[*r as usize]))
            .collect();
        println!(
            "{:8} {replicas} replicas: shape {:.0} ns, choose {:.0} ns per request ({}; digest {digest:016x})",
            strategy.as_str(),
            shape_ns as f64 / requests as f64,
            choose_ns as f64 / requests as f64,
            by_reason.join(", "),
        );
    }
}
