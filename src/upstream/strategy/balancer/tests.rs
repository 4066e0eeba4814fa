use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::*;
use crate::upstream::strategy::fixtures::*;

#[test]
fn choosing_among_replicas_is_choosing_among_their_snapshot() {
    let set: Vec<Arc<Replica>> = (0..6)
        .map(|i| Arc::new(Replica::new(&format!("http://e{i}:1")).unwrap()))
        .collect();
    let mut guards = Vec::new();
    for (i, r) in set.iter().enumerate() {
        r.set_healthy(i != 4);
        for _ in 0..i % 3 {
            guards.push(r.start_tokens(200 * i as u64, 50));
        }
    }
    let long = shape(4);
    for strategy in [
        Strategy::P2c,
        Strategy::Prefix,
        Strategy::Goodput,
        Strategy::Auto,
    ] {
        let (a, b) = (balancer(cfg(strategy)), balancer(cfg(strategy)));
        for round in 0..40 {
            let now = Instant::now();
            let snapshot: Vec<Cand> = set.iter().map(|r| r.cand(now)).collect();
            let excluded: &[usize] = if round % 5 == 0 { &[1, 2] } else { &[] };
            let got = a.choose_among(
                &set,
                now,
                &long,
                excluded,
                &mut SmallRng::seed_from_u64(round),
            );
            let want = b.choose(
                &snapshot,
                &long,
                excluded,
                &mut SmallRng::seed_from_u64(round),
            );
            assert_eq!(got, want, "{strategy:?} round {round}");
        }
    }
}

#[test]
fn eight_long_prompts_spread_two_to_each_of_four_replicas() {
    // The first request of each prompt arrives while the others' are in flight at
    // different loads; placed by room, each replica gets two, whatever the loads.
    for strategy in [Strategy::Prefix, Strategy::Auto] {
        let b = balancer(cfg(strategy));
        let mut cands: Vec<Cand> = (0..4).map(|id| cand(id, 0)).collect();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut placed = [0; 4];
        for k in 0..8u64 {
            let s = Shape {
                blocks: (0..20).map(|j| k << 32 | j).collect(),
                prompt_tokens: 1_400,
                output_tokens: 32,
            };
            let (ch, _) = b.choose(&cands, &s, &[], &mut rng).unwrap();
            placed[ch.idx] += 1;
            // Its cold prefill is in flight there.
            cands[ch.idx].tokens += 1_432;
            cands[ch.idx].in_flight += 1;
        }
        assert_eq!(placed, [2, 2, 2, 2], "{strategy:?}");
    }
}

#[test]
fn a_spilled_prefix_moves_and_does_not_spread() {
    // The index and the choice together: a prefix whose replica saturates moves to one
    // other replica and stays there, busier than its former holders as it may be; its
    // traffic is never shared out among every replica that once served it.
    let b = balancer(cfg(Strategy::Prefix));
    let idle: Vec<Cand> = (0..4).map(|id| cand(id, 0)).collect();
    let s = shape(6);
    let mut rng = SmallRng::seed_from_u64(2);
    let mut home = b.choose(&idle, &s, &[], &mut rng).unwrap().0.idx;
    let mut homes = std::collections::BTreeSet::from([home]);
    for round in 0..200 {
        let saturated = round % 10 == 9;
        let mut cands = idle.clone();
        // Serving the prefix keeps its replica busier than the others.
        cands[home].tokens = if saturated { 50_000 } else { 400 };
        let ch = b.choose(&cands, &s, &[], &mut rng).unwrap().0;
        if saturated {
            // To a former holder when one is open (likely still cached), else by load.
            let want = if homes.len() == 1 {
                Reason::PrefixSaturated
            } else {
                Reason::PrefixHit
            };
            assert_eq!(ch.reason, want, "round {round}");
            assert_ne!(ch.idx, home, "round {round}");
            home = ch.idx;
            homes.insert(home);
        } else {
            assert_eq!(
                ch,
                Choice {
                    idx: home,
                    reason: Reason::PrefixHit
                },
                "round {round}"
            );
        }
    }
    assert!(homes.len() > 1, "it moved: {homes:?}");
}

#[test]
fn the_balancer_learns_prefixes_and_what_the_engines_evicted() {
    let b = balancer(cfg(Strategy::Prefix));
    let cands = [cand(10, 0), cand(11, 0), cand(12, 0), cand(13, 0)];
    // While only replica 10 is healthy, every prompt goes there.
    let solo: Vec<Cand> = cands
        .iter()
        .map(|c| Cand {
            healthy: c.id == 10,
            ..*c
        })
        .collect();
    // 4 blocks of 256 bytes: a 1,024-byte prefix of a prompt of 400 estimated tokens.
    let s = Shape {
        prompt_tokens: 400,
        ..shape(4)
    };
    let older = Shape {
        blocks: (100..104).collect(),
        ..s.clone()
    };
    let newer = Shape {
        blocks: (200..204).collect(),
        ..s.clone()
    };
    let mut rng = SmallRng::seed_from_u64(3);
    let mut choose = |cands: &[Cand], shape: &Shape| b.choose(cands, shape, &[], &mut rng).unwrap();
    assert_eq!(
        choose(&solo, &older).1,
        Belief::default(),
        "nothing expected of a first request"
    );
    choose(&solo, &s);
    // Healthy again: the prompt goes back where it was served, expected there.
    let (hit, belief) = choose(&cands, &s);
    assert_eq!(
        hit,
        Choice {
            idx: 0,
            reason: Reason::PrefixHit
        }
    );
    assert_eq!((belief.id, belief.blocks), (10, 4));
    choose(&solo, &newer);
    // The engines report (cached, prompt) tokens: 4 of 6.25 parts of 500 = 320 expected.
    let cases: &[(&str, u64, bool)] = &[
        ("all of it cached", 320, false),
        ("more than expected", 480, false),
        ("a block short: estimates are rough", 250, false),
        ("well short: evicted", 200, true),
        ("nothing", 0, true),
    ];
    for &(what, cached, evicted) in cases {
        assert_eq!(b.learn(&s, &belief, cached, 500), evicted, "{what}");
    }
    // Nothing was expected: nothing to learn; p2c keeps no index.
    assert!(!b.learn(&s, &Belief::default(), 0, 500));
    let p2c = balancer(cfg(Strategy::P2c));
    assert!(!p2c.learn(&s, &belief, 0, 500));
    // The engine had lost the prompt: the index forgets it there with everything older
    // (the request that found it missing was recorded anew: that prompt stays), and keeps
    // what came after.
    assert!(b.learn(&s, &belief, 0, 500));
    let mut choose = |shape: &Shape| b.choose(&cands, shape, &[], &mut rng).unwrap();
    assert_eq!(
        choose(&s).0,
        Choice {
            idx: 0,
            reason: Reason::PrefixHit
        }
    );
    assert_eq!(
        choose(&newer).0,
        Choice {
            idx: 0,
            reason: Reason::PrefixHit
        }
    );
    let (stale, belief) = choose(&older);
    assert_eq!(stale.reason, Reason::LeastLoad, "forgotten");
    assert_eq!(belief, Belief::default());
}

#[test]
fn every_decision_reason_and_release_cause_is_a_series_from_the_start() {
    let registry = prometheus::Registry::new();
    let b = Balancer::new(cfg(Strategy::Auto), &Registrar::new(&registry)).unwrap();
    b.count(Reason::PrefixHit);
    b.count(Reason::PrefixHit);
    // A prefix placed, then sent away from its holder's full KV cache: one release.
    let idle: Vec<Cand> = (0..3).map(|id| cand(id, 0)).collect();
    let mut rng = SmallRng::seed_from_u64(6);
    let home = b.choose(&idle, &shape(6), &[], &mut rng).unwrap().0.idx;
    let mut full = idle.clone();
    full[home].kv = Some(1.0);
    full[home].waiting = Some(1.0);
    let moved = b.choose(&full, &shape(6), &[], &mut rng).unwrap().0;
    assert_eq!(moved.reason, Reason::PrefixSaturated);
    let text = crate::metrics::exposition_text(&registry);
    for r in Reason::ALL {
        let n = if r == Reason::PrefixHit { 2 } else { 0 };
        let line = format!(
            "goodput_proxy_route_decisions_total{{reason=\"{}\"}} {n}\n",
            r.as_str()
        );
        assert!(text.contains(&line), "{line} in {text}");
    }
    for r in Release::ALL {
        let n = if r == Release::Kv { 1 } else { 0 };
        let line = format!(
            "goodput_proxy_route_releases_total{{cause=\"{}\"}} {n}\n",
            r.as_str()
        );
        assert!(text.contains(&line), "{line} in {text}");
    }
    // Declared once: a second balancer on the same registry is refused.
    assert!(Balancer::new(cfg(Strategy::Auto), &Registrar::new(&registry)).is_err());
}
