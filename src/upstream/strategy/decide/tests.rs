use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::upstream::strategy::fixtures::*;

#[test]
fn prefix_affinity_is_sticky_until_saturated() {
    let c = cfg(Strategy::Prefix);
    let hit = Some(Choice {
        idx: 2,
        reason: Reason::PrefixHit,
    });
    let cases: Vec<(&str, Vec<Cand>, Option<Choice>)> = vec![
        (
            "idle cluster: the match wins",
            vec![cand(0, 0), cand(1, 0), cand(2, 0)],
            hit,
        ),
        (
            "busier than the others, not saturated: still the match",
            vec![cand(0, 400), cand(1, 400), cand(2, 900)],
            hit,
        ),
        (
            "far above the mean: released",
            vec![cand(0, 200), cand(1, 200), cand(2, 5_000)],
            Some(Choice {
                idx: 0,
                reason: Reason::PrefixSaturated,
            }),
        ),
        (
            "its engine queues: released",
            vec![
                cand(0, 0),
                cand(1, 0),
                Cand {
                    waiting: Some(4.0),
                    ..cand(2, 0)
                },
            ],
            Some(Choice {
                idx: 0,
                reason: Reason::PrefixSaturated,
            }),
        ),
        (
            "its KV cache is full and a request waits: released",
            vec![
                cand(0, 0),
                cand(1, 0),
                Cand {
                    kv: Some(0.97),
                    waiting: Some(1.0),
                    ..cand(2, 0)
                },
            ],
            Some(Choice {
                idx: 0,
                reason: Reason::PrefixSaturated,
            }),
        ),
        (
            "its KV cache is full, nothing waits: it still admits, kept",
            vec![
                cand(0, 0),
                cand(1, 0),
                Cand {
                    kv: Some(0.97),
                    ..cand(2, 0)
                },
            ],
            hit,
        ),
        (
            "its KV cache is full, its queue unknown: released",
            vec![
                cand(0, 0),
                cand(1, 0),
                Cand {
                    kv: Some(0.97),
                    waiting: None,
                    ..cand(2, 0)
                },
            ],
            Some(Choice {
                idx: 0,
                reason: Reason::PrefixSaturated,
            }),
        ),
        (
            "unhealthy: not a candidate",
            vec![
                cand(0, 0),
                cand(1, 0),
                Cand {
                    healthy: false,
                    ..cand(2, 0)
                },
            ],
            Some(Choice {
                idx: 0,
                reason: Reason::LeastLoad,
            }),
        ),
    ];
    for (what, cands, want) in cases {
        let got = run(&c, &cands, &[2], 3, &[]);
        assert_eq!(got.map(|g| g.reason), want.map(|w| w.reason), "{what}");
        if want.map(|w| w.reason) == Some(Reason::PrefixHit) {
            assert_eq!(got, want, "{what}");
        } else {
            assert_ne!(got.map(|g| g.idx), Some(2), "{what}");
        }
    }
    // Too short a match, or none: load decides.
    let cands = [cand(0, 0), cand(1, 0), cand(2, 0)];
    assert_eq!(
        run(&c, &cands, &[2], 1, &[]).unwrap().reason,
        Reason::LeastLoad
    );
    assert_eq!(
        run(&c, &cands, &[], 0, &[]).unwrap().reason,
        Reason::LeastLoad
    );
}

#[test]
fn a_holder_is_saturated_by_what_its_requests_cost_it() {
    // A long shared prompt (3,100 estimated tokens, 48 blocks of 64 tokens cached) with a
    // short question and 30 output tokens: 58 tokens on its holder, 3,130 elsewhere. The
    // balancer counts requests in flight the same way (`Replica::start_cached`).
    let c = cfg(Strategy::Prefix);
    let s = Shape {
        blocks: (0..48).collect(),
        prompt_tokens: 3_100,
        output_tokens: 30,
    };
    let (warm, cold) = (58u64, 3_130u64);
    let at = |tokens: u64, waiting: Option<f64>, kv: Option<f64>| Cand {
        tokens,
        waiting,
        kv,
        ..cand(0, 0)
    };
    let idle = at(0, Some(0.0), Some(0.1));
    // (what, the holder, the other two's tokens in flight, released)
    type Case = (&'static str, Cand, [u64; 2], bool);
    let cases: Vec<Case> = vec![
        ("idle cluster", idle, [0, 0], false),
        (
            "a burst of 8 cached requests at low concurrency: cheap for the holder",
            at(8 * warm, Some(0.0), Some(0.5)),
            [cold, 0],
            false,
        ),
        (
            "400 cached requests: past the bound",
            at(400 * warm, Some(0.0), Some(0.5)),
            [cold, 0],
            true,
        ),
        (
            "8 cold requests against 1 elsewhere: saturated",
            at(8 * cold, Some(0.0), Some(0.5)),
            [cold, 0],
            true,
        ),
        (
            "within 1.5x the mean with the request, plus one cold request",
            at(12_000, None, None),
            [0, 0],
            false,
        ),
        (
            "beyond it, the engine's signals unknown",
            at(20_000, None, None),
            [0, 0],
            true,
        ),
        (
            "its engine queues",
            at(warm, Some(c.saturation_queue), Some(0.5)),
            [0, 0],
            true,
        ),
        (
            "its KV cache is full while a request waits",
            at(warm, Some(1.0), Some(0.96)),
            [0, 0],
            true,
        ),
        (
            "its KV cache is full, nothing waits",
            at(warm, Some(0.0), Some(0.96)),
            [0, 0],
            false,
        ),
    ];
    let mut rng = SmallRng::seed_from_u64(4);
    for (what, holder, others, released) in cases {
        let cands = [
            Cand {
                id: 0,
                tokens: others[0],
                ..idle
            },
            Cand {
                id: 1,
                tokens: others[1],
                ..idle
            },
            Cand { id: 2, ..holder },
        ];
        let got = decide(
            &c,
            &cands,
            &Ask {
                shape: &s,
                matched: &[2],
                match_blocks: 48,
                excluded: &[],
                room: Room::Unknown,
            },
            &mut rng,
            &mut Vec::new(),
        )
        .unwrap();
        if released {
            assert_eq!(got.reason, Reason::PrefixSaturated, "{what}");
            assert_ne!(got.idx, 2, "{what}");
        } else {
            assert_eq!(
                got,
                Choice {
                    idx: 2,
                    reason: Reason::PrefixHit
                },
                "{what}"
            );
        }
    }
}

#[test]
fn the_quick_prefix_hit_is_the_full_paths_choice() {
    // Random fleets: whenever the quick path answers, the full path answers the same.
    let mut rng = SmallRng::seed_from_u64(8);
    let mut quick = 0;
    for round in 0..20_000 {
        let strategy = if round % 2 == 0 {
            Strategy::Prefix
        } else {
            Strategy::Auto
        };
        let c = cfg(strategy);
        let n = rng.random_range(1..6);
        let cands: Vec<Cand> = (0..n)
            .map(|id| Cand {
                id,
                healthy: rng.random_bool(0.8),
                in_flight: 0,
                tokens: rng.random_range(0..2_000),
                waiting: [None, Some(0.0), Some(5.0)][rng.random_range(0..3)],
                kv: [None, Some(0.2), Some(0.99)][rng.random_range(0..3)],
                attainment: [1.0, 0.9, 0.5][rng.random_range(0..3)],
            })
            .collect();
        let matched: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.4)).collect();
        let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.2)).collect();
        let s = Shape {
            prompt_tokens: rng.random_range(50..600),
            ..shape(rng.random_range(0..8))
        };
        let blocks = s.blocks.len();
        if blocks < c.prefix_min_blocks {
            continue;
        }
        let ask = Ask {
            shape: &s,
            matched: &matched,
            match_blocks: blocks,
            excluded: &excluded,
            room: Room::Unknown,
        };
        if let Some(hit) = quick_hit(&c, &cands, &ask) {
            quick += 1;
            let full = decide_full(&c, &cands, &ask, &mut rng, &mut Vec::new());
            assert_eq!(Some(hit), full, "{cands:?} {matched:?} {excluded:?} {s:?}");
        }
    }
    assert!(quick > 500, "{quick}");
}

#[test]
fn the_eligible_list_is_the_simple_filters() {
    let simple = |cands: &[Cand], excluded: &[usize]| -> Vec<usize> {
        let ok = |i: &usize| !excluded.contains(i);
        let healthy: Vec<usize> = (0..cands.len())
            .filter(|i| ok(i) && cands[*i].healthy)
            .collect();
        if healthy.is_empty() {
            (0..cands.len()).filter(ok).collect()
        } else {
            healthy
        }
    };
    let mut rng = SmallRng::seed_from_u64(11);
    let mut scratch = Vec::new();
    let mut all = 0;
    for round in 0..5_000 {
        // Past `ALL`'s length now and then, all healthy often.
        let n = if round % 50 == 0 {
            300
        } else {
            rng.random_range(0..70)
        };
        let mut cands = random_fleet(&mut rng, n);
        if round % 2 == 0 {
            cands.iter_mut().for_each(|c| c.healthy = true);
        }
        let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.02)).collect();
        let got = eligible(&cands, &excluded, &mut scratch).to_vec();
        all += usize::from(got.len() == cands.len());
        assert_eq!(got, simple(&cands, &excluded), "{n} {excluded:?}");
    }
    assert!(all > 1_000, "{all}");
}

#[test]
fn the_room_looked_up_in_the_index_places_as_the_room_of_every_candidate() {
    // The balancer reads the index's room only for the candidates a placement considers;
    // the full list of every candidate's room, read first, must choose the same.
    let mut rng = SmallRng::seed_from_u64(12);
    let mut placed = 0;
    for round in 0..4_000 {
        let strategy = if round % 2 == 0 {
            Strategy::Prefix
        } else {
            Strategy::Auto
        };
        let c = cfg(strategy);
        let n = rng.random_range(1..12);
        let cands = random_fleet(&mut rng, n);
        let mut index = PrefixIndex::new(4_096);
        for p in 0..rng.random_range(0..40u64) {
            let blocks: Vec<u64> = (0..rng.random_range(1..10)).map(|b| p << 8 | b).collect();
            index.record(&blocks, rng.random_range(1..=n));
        }
        let room: Vec<u64> = cands.iter().map(|c| index.owned(c.id)).collect();
        let matched: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.2)).collect();
        let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.1)).collect();
        let s = shape(rng.random_range(0..8));
        let ask = |room| Ask {
            shape: &s,
            matched: &matched,
            match_blocks: if matched.is_empty() {
                0
            } else {
                s.blocks.len()
            },
            excluded: &excluded,
            room,
        };
        let seed = rng.random();
        let lazy = decide(
            &c,
            &cands,
            &ask(Room::Index(&index)),
            &mut SmallRng::seed_from_u64(seed),
            &mut Vec::new(),
        );
        let each = decide(
            &c,
            &cands,
            &ask(Room::Each(&room)),
            &mut SmallRng::seed_from_u64(seed),
            &mut Vec::new(),
        );
        assert_eq!(lazy, each, "{cands:?} {room:?} {matched:?} {excluded:?}");
        // Not vacuous: often the room decided (without it the choice differs).
        let blind = decide(
            &c,
            &cands,
            &ask(Room::Unknown),
            &mut SmallRng::seed_from_u64(seed),
            &mut Vec::new(),
        );
        placed += usize::from(blind != lazy);
    }
    assert!(placed > 200, "{placed}");
}

#[test]
fn a_new_prefix_goes_where_placed_prefixes_take_the_least_room() {
    let idle = || (0..4).map(|id| cand(id, 0)).collect::<Vec<Cand>>();
    let with = |i: usize, f: &dyn Fn(&mut Cand)| {
        let mut v = idle();
        f(&mut v[i]);
        v
    };
    // (what, strategy, candidates, room per candidate, holders, prompt blocks, want idx
    // (None: any), reason)
    type Case = (
        &'static str,
        Strategy,
        Vec<Cand>,
        [u64; 4],
        Vec<usize>,
        usize,
        Option<usize>,
        Reason,
    );
    let cases: Vec<Case> = vec![
        (
            "the least room wins; a tie goes to the first",
            Strategy::Prefix,
            idle(),
            [300, 100, 200, 100],
            vec![],
            4,
            Some(1),
            Reason::LeastLoad,
        ),
        (
            "a tie goes to the lower load",
            Strategy::Prefix,
            with(1, &|c| c.tokens = 150),
            [300, 100, 200, 100],
            vec![],
            4,
            Some(3),
            Reason::LeastLoad,
        ),
        (
            "room before load, within the load bound",
            Strategy::Prefix,
            with(1, &|c| c.tokens = 300),
            [300, 100, 200, 150],
            vec![],
            4,
            Some(1),
            Reason::LeastLoad,
        ),
        (
            "past the load bound: not open",
            Strategy::Prefix,
            with(1, &|c| c.tokens = 5_000),
            [300, 100, 200, 150],
            vec![],
            4,
            Some(3),
            Reason::LeastLoad,
        ),
        (
            "a full KV cache: not open",
            Strategy::Prefix,
            with(1, &|c| {
                c.kv = Some(0.99);
                c.waiting = Some(1.0);
            }),
            [300, 100, 200, 150],
            vec![],
            4,
            Some(3),
            Reason::LeastLoad,
        ),
        (
            "auto: an attainment below the gap is not open",
            Strategy::Auto,
            with(1, &|c| c.attainment = 0.5),
            [300, 100, 200, 150],
            vec![],
            4,
            Some(3),
            Reason::Goodput,
        ),
        (
            "a short prompt is no prefix to place: load decides",
            Strategy::Prefix,
            with(1, &|c| c.tokens = 300),
            [0, 0, 0, 0],
            vec![],
            1,
            None,
            Reason::LeastLoad,
        ),
        (
            "moved off a saturated holder: placed the same way",
            Strategy::Prefix,
            with(2, &|c| {
                c.kv = Some(0.99);
                c.waiting = Some(2.0);
            }),
            [300, 200, 100, 150],
            vec![2],
            4,
            Some(3),
            Reason::PrefixSaturated,
        ),
    ];
    for (what, strategy, cands, room, held, blocks, want, reason) in cases {
        let c = cfg(strategy);
        let got = decide(
            &c,
            &cands,
            &Ask {
                shape: &shape(blocks),
                matched: &held,
                match_blocks: if held.is_empty() { 0 } else { blocks },
                excluded: &[],
                room: Room::Each(&room),
            },
            &mut SmallRng::seed_from_u64(2),
            &mut Vec::new(),
        )
        .unwrap();
        assert_eq!(got.reason, reason, "{what}");
        if let Some(want) = want {
            assert_eq!(got.idx, want, "{what}");
        }
    }
    // Every replica saturated: load decides among all.
    let busy: Vec<Cand> = (0..4).map(|id| cand(id, 9_000 + 100 * id as u64)).collect();
    let mut rng = SmallRng::seed_from_u64(3);
    let long = shape(4);
    let mut ask = Ask::cold(&long);
    ask.room = Room::Each(&[0, 0, 0, 0]);
    let kv_full: Vec<Cand> = busy
        .iter()
        .map(|c| Cand {
            kv: Some(1.0),
            waiting: Some(1.0),
            ..*c
        })
        .collect();
    for _ in 0..50 {
        let ch = decide(
            &cfg(Strategy::Prefix),
            &kv_full,
            &ask,
            &mut rng,
            &mut Vec::new(),
        );
        assert_ne!(
            ch.unwrap().idx,
            3,
            "two random choices never take the busiest"
        );
    }
}

#[test]
fn a_release_names_the_first_saturation_test_its_holder_failed() {
    let with = |f: &dyn Fn(&mut Cand)| {
        let mut v = vec![cand(0, 200), cand(1, 200), cand(2, 0)];
        f(&mut v[2]);
        v
    };
    // (what, strategy, candidates (holder: 2), excluded, cause)
    type Case = (
        &'static str,
        Strategy,
        Vec<Cand>,
        Vec<usize>,
        Option<Release>,
    );
    let cases: Vec<Case> = vec![
        ("open", Strategy::Prefix, with(&|_| ()), vec![], None),
        (
            "engine queue",
            Strategy::Prefix,
            with(&|c| c.waiting = Some(4.0)),
            vec![],
            Some(Release::Queue),
        ),
        (
            "KV cache, a request waiting",
            Strategy::Prefix,
            with(&|c| {
                c.kv = Some(0.97);
                c.waiting = Some(1.0);
            }),
            vec![],
            Some(Release::Kv),
        ),
        (
            "KV cache full, nothing waiting",
            Strategy::Prefix,
            with(&|c| c.kv = Some(0.97)),
            vec![],
            None,
        ),
        (
            "queue and KV: the queue is tested first",
            Strategy::Auto,
            with(&|c| {
                c.waiting = Some(9.0);
                c.kv = Some(1.0);
            }),
            vec![],
            Some(Release::Queue),
        ),
        (
            "load far above the mean",
            Strategy::Prefix,
            with(&|c| c.tokens = 5_000),
            vec![],
            Some(Release::Load),
        ),
        (
            "load and attainment: load first",
            Strategy::Auto,
            with(&|c| {
                c.tokens = 5_000;
                c.attainment = 0.1;
            }),
            vec![],
            Some(Release::Load),
        ),
        (
            "auto: attainment far below the best",
            Strategy::Auto,
            with(&|c| c.attainment = 0.5),
            vec![],
            Some(Release::Attainment),
        ),
        (
            "prefix ignores attainment",
            Strategy::Prefix,
            with(&|c| c.attainment = 0.5),
            vec![],
            None,
        ),
        (
            "unhealthy",
            Strategy::Prefix,
            with(&|c| c.healthy = false),
            vec![],
            Some(Release::Unhealthy),
        ),
        (
            "already tried",
            Strategy::Auto,
            with(&|_| ()),
            vec![2],
            Some(Release::Excluded),
        ),
    ];
    for (what, strategy, cands, excluded, want) in cases {
        let c = cfg(strategy);
        let ask = Ask {
            shape: &shape(3),
            matched: &[2],
            match_blocks: 3,
            excluded: &excluded,
            room: Room::Unknown,
        };
        assert_eq!(release_cause(&c, &cands, &ask), want, "{what}");
        // The choice agrees: it leaves the holder exactly when a cause is named.
        let ch = decide(
            &c,
            &cands,
            &ask,
            &mut SmallRng::seed_from_u64(1),
            &mut Vec::new(),
        );
        assert_eq!(ch.unwrap().idx != 2, want.is_some(), "{what}");
    }
}

#[test]
fn a_prefix_leaves_its_holders_only_with_a_cause() {
    // Random fleets: a choice that leaves every holder has a cause; one whose most recent
    // eligible holder has none stays on it.
    let mut rng = SmallRng::seed_from_u64(12);
    let mut left = 0;
    for round in 0..20_000 {
        let strategy = [Strategy::Prefix, Strategy::Auto][round % 2];
        let c = cfg(strategy);
        let n = rng.random_range(2..6);
        let cands: Vec<Cand> = (0..n)
            .map(|id| Cand {
                id,
                healthy: rng.random_bool(0.8),
                in_flight: 0,
                tokens: rng.random_range(0..2_000),
                waiting: [None, Some(0.0), Some(5.0)][rng.random_range(0..3)],
                kv: [None, Some(0.2), Some(0.99)][rng.random_range(0..3)],
                attainment: [1.0, 0.9, 0.5][rng.random_range(0..3)],
            })
            .collect();
        let matched: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.4)).collect();
        let excluded: Vec<usize> = (0..n as usize).filter(|_| rng.random_bool(0.2)).collect();
        if matched.is_empty() || excluded.len() == n as usize {
            continue;
        }
        let s = Shape {
            prompt_tokens: rng.random_range(50..600),
            ..shape(4)
        };
        let ask = Ask {
            shape: &s,
            matched: &matched,
            match_blocks: 4,
            excluded: &excluded,
            room: Room::Unknown,
        };
        let cause = release_cause(&c, &cands, &ask);
        let ch = decide(&c, &cands, &ask, &mut rng, &mut Vec::new()).unwrap();
        if !matched.contains(&ch.idx) {
            left += 1;
            assert!(cause.is_some(), "{cands:?} {matched:?} {excluded:?} {ch:?}");
        }
        if cause.is_none() {
            assert!(
                matched.contains(&ch.idx),
                "{cands:?} {matched:?} {excluded:?} {ch:?}"
            );
        }
    }
    assert!(left > 1_000, "{left}");
}

#[test]
fn a_prefix_stays_on_its_most_recent_open_holder() {
    let c = cfg(Strategy::Prefix);
    let idle: Vec<Cand> = (0..5).map(|id| cand(id, 0)).collect();
    let with = |f: &dyn Fn(&mut Vec<Cand>)| {
        let mut v = idle.clone();
        f(&mut v);
        v
    };
    // (what, candidates, holders most recent first, want idx or None: not a holder)
    type Case = (&'static str, Vec<Cand>, Vec<usize>, Option<usize>, Reason);
    let cases: Vec<Case> = vec![
        (
            "of several holders the most recent, not the least loaded",
            with(&|v| v[3].tokens = 400),
            vec![3, 1],
            Some(3),
            Reason::PrefixHit,
        ),
        (
            "it saturated: the next most recent",
            with(&|v| v[3].tokens = 50_000),
            vec![3, 1],
            Some(1),
            Reason::PrefixHit,
        ),
        (
            "its engine queues: the next most recent",
            with(&|v| v[3].waiting = Some(9.0)),
            vec![3, 1, 4],
            Some(1),
            Reason::PrefixHit,
        ),
        (
            "every holder saturated: elsewhere, by load",
            with(&|v| {
                v[3].tokens = 50_000;
                v[1].kv = Some(0.99);
                v[1].waiting = Some(1.0);
            }),
            vec![3, 1],
            None,
            Reason::PrefixSaturated,
        ),
        (
            "an unhealthy holder is passed over",
            with(&|v| v[3].healthy = false),
            vec![3, 1],
            Some(1),
            Reason::PrefixHit,
        ),
    ];
    let mut rng = SmallRng::seed_from_u64(11);
    for (what, cands, held, idx, reason) in cases {
        for _ in 0..20 {
            let got = decide(
                &c,
                &cands,
                &Ask {
                    shape: &shape(3),
                    matched: &held,
                    match_blocks: 3,
                    excluded: &[],
                    room: Room::Unknown,
                },
                &mut rng,
                &mut Vec::new(),
            )
            .unwrap();
            assert_eq!(got.reason, reason, "{what}");
            match idx {
                Some(i) => assert_eq!(got.idx, i, "{what}"),
                None => assert!(!held.contains(&got.idx), "{what}: {got:?}"),
            }
        }
    }
}

#[test]
fn goodput_steers_away_from_replicas_that_miss_their_slos() {
    let c = cfg(Strategy::Goodput);
    let slow = Cand {
        attainment: 0.2,
        ..cand(1, 0)
    };
    let mut rng = SmallRng::seed_from_u64(1);
    let mut counts = [0usize; 2];
    for _ in 0..1_000 {
        let ch = decide(
            &c,
            &[cand(0, 3_000), slow],
            &Ask::cold(&shape(0)),
            &mut rng,
            &mut Vec::new(),
        )
        .unwrap();
        assert_eq!(ch.reason, Reason::Goodput);
        counts[ch.idx] += 1;
    }
    // 3,000 tokens in flight on the good one still beat an idle replica at 20 %.
    assert_eq!(counts, [1_000, 0]);
    // With weight 0 attainment is ignored: the idle one wins.
    let flat = BalanceConfig {
        attainment_weight: 0.0,
        ..c.clone()
    };
    assert_eq!(
        run(&flat, &[cand(0, 3_000), slow], &[], 0, &[])
            .unwrap()
            .idx,
        1
    );
}

#[test]
fn the_exploration_share_runs_while_attainments_differ_and_skips_saturated_engines() {
    let c = BalanceConfig {
        exploration: 0.1,
        ..cfg(Strategy::Auto)
    };
    let bad = Cand {
        attainment: 0.0,
        ..cand(2, 0)
    };
    let mut rng = SmallRng::seed_from_u64(9);
    let mut decide_n = |cands: &[Cand], n: usize| {
        (0..n)
            .map(|_| decide(&c, cands, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new()).unwrap())
            .collect::<Vec<_>>()
    };
    // While attainments differ, a random replica is explored; only exploration reaches
    // the one the weighted score keeps away.
    let choices = decide_n(&[cand(0, 0), cand(1, 0), bad], 10_000);
    let explored = choices
        .iter()
        .filter(|ch| ch.reason == Reason::Explore)
        .count();
    assert!((900..1_100).contains(&explored), "{explored}");
    let to_bad = choices.iter().filter(|ch| ch.idx == 2);
    assert!(to_bad.clone().all(|ch| ch.reason == Reason::Explore));
    let to_bad = to_bad.count();
    assert!((250..420).contains(&to_bad), "{to_bad}");
    // A request whose prefix is cached is not explored with.
    for _ in 0..2_000 {
        let ch = decide(
            &c,
            &[cand(0, 0), cand(1, 0), bad],
            &Ask {
                shape: &shape(3),
                matched: &[1],
                match_blocks: 3,
                excluded: &[],
                room: Room::Unknown,
            },
            &mut rng,
            &mut Vec::new(),
        )
        .unwrap();
        assert_eq!(
            ch,
            Choice {
                idx: 1,
                reason: Reason::PrefixHit
            }
        );
    }
    let mut decide_n = |cands: &[Cand], n: usize| {
        (0..n)
            .map(|_| decide(&c, cands, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new()).unwrap())
            .collect::<Vec<_>>()
    };
    // Replicas alike: nothing to re-measure, no request sent past a shorter queue.
    let queued = Cand {
        waiting: Some(3.0),
        ..cand(1, 0)
    };
    let choices = decide_n(&[cand(0, 0), queued], 2_000);
    assert!(choices
        .iter()
        .all(|ch| ch.reason != Reason::Explore && ch.idx == 0));
    // A penalized replica whose engine is saturated is not explored either.
    for busy in [
        Cand {
            waiting: Some(c.saturation_queue),
            ..bad
        },
        Cand {
            kv: Some(c.saturation_kv),
            waiting: Some(1.0),
            ..bad
        },
    ] {
        let choices = decide_n(&[cand(0, 0), cand(1, 0), busy], 2_000);
        assert!(choices.iter().all(|ch| ch.idx != 2));
    }
    // p2c and prefix never explore.
    for s in [Strategy::P2c, Strategy::Prefix] {
        let c = BalanceConfig {
            exploration: 0.5,
            ..cfg(s)
        };
        for _ in 0..200 {
            let ch = decide(
                &c,
                &[cand(0, 0), cand(1, 0), bad],
                &Ask::cold(&shape(0)),
                &mut rng,
                &mut Vec::new(),
            );
            assert_ne!(ch.unwrap().reason, Reason::Explore);
        }
    }
}

#[test]
fn auto_takes_the_prefix_only_on_a_replica_that_meets_its_slos() {
    let c = cfg(Strategy::Auto);
    let failing = Cand {
        attainment: 0.5,
        ..cand(2, 0)
    };
    let ch = run(&c, &[cand(0, 0), cand(1, 0), failing], &[2], 3, &[]).unwrap();
    // Its prefix moves on, as from a saturated replica.
    assert_eq!(ch.reason, Reason::PrefixSaturated);
    assert_ne!(ch.idx, 2);
    // Within AUTO_ATTAINMENT_GAP of the best, it keeps it: a few streams slowed by cold
    // prefills do not move its prefixes. (holder's attainment, the best's, released)
    let cases = [
        (0.85, 1.0, false),
        (0.7, 1.0, false),
        (0.62, 1.0, false),
        (0.55, 1.0, true),
        (0.55, 0.9, false),
        (0.3, 0.75, true),
    ];
    for (att, best, released) in cases {
        let holder = Cand {
            attainment: att,
            ..cand(2, 0)
        };
        let top = Cand {
            attainment: best,
            ..cand(0, 0)
        };
        let others = [top, cand(1, 0), holder].map(|c| Cand {
            attainment: c.attainment.min(best),
            ..c
        });
        let ch = run(&c, &others, &[2], 3, &[]).unwrap();
        assert_eq!(ch.idx != 2, released, "{att} against {best}");
    }
    let ch = run(&c, &[cand(0, 0), cand(1, 0), cand(2, 0)], &[2], 3, &[]).unwrap();
    assert_eq!(
        ch,
        Choice {
            idx: 2,
            reason: Reason::PrefixHit
        }
    );
}

#[test]
fn exclusions_health_and_single_candidates() {
    for s in [
        Strategy::P2c,
        Strategy::Prefix,
        Strategy::Goodput,
        Strategy::Auto,
    ] {
        let c = cfg(s);
        assert_eq!(run(&c, &[], &[], 0, &[]), None);
        assert_eq!(run(&c, &[cand(0, 0)], &[], 0, &[0]), None);
        let only = run(&c, &[cand(0, 0), cand(1, 0)], &[0], 3, &[1]).unwrap();
        assert_eq!(
            only,
            Choice {
                idx: 0,
                reason: Reason::Only
            }
        );
        // Nobody healthy: still served.
        let sick = |id| Cand {
            healthy: false,
            ..cand(id, 0)
        };
        assert!(run(&c, &[sick(0), sick(1)], &[], 0, &[]).is_some());
        // Healthy first.
        let ch = run(&c, &[sick(0), cand(1, 9_000)], &[0], 3, &[]).unwrap();
        assert_eq!(ch.idx, 1, "{s:?}");
    }
}

#[test]
fn p2c_compares_in_flight_plus_engine_queue() {
    let c = cfg(Strategy::P2c);
    let q = |in_flight: usize, waiting: f64| Cand {
        in_flight,
        waiting: Some(waiting),
        ..cand(0, 0)
    };
    let cases: Vec<(Vec<Cand>, usize)> = vec![
        // equal in-flight: the replica whose engine queues loses
        (vec![q(2, 6.0), q(2, 0.0)], 1),
        // a long engine queue outweighs fewer in-flight requests
        (vec![q(1, 8.0), q(4, 0.0)], 1),
        // fewer in-flight wins when the queues are level
        (vec![q(1, 3.0), q(4, 3.0)], 0),
        (vec![q(3, 0.0), q(1, 0.0)], 1),
        // an unknown queue counts as empty
        (
            vec![
                Cand {
                    waiting: None,
                    ..q(1, 0.0)
                },
                q(2, 0.0),
            ],
            0,
        ),
    ];
    let mut rng = SmallRng::seed_from_u64(3);
    for (cands, want) in cases {
        for _ in 0..20 {
            let ch = decide(&c, &cands, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new());
            assert_eq!(
                ch,
                Some(Choice {
                    idx: want,
                    reason: Reason::P2c
                }),
                "{cands:?}"
            );
        }
    }
    // Of many, never the most loaded.
    let many: Vec<Cand> = (0..5).map(|i| q(i, 0.0)).collect();
    for _ in 0..200 {
        let ch = decide(&c, &many, &Ask::cold(&shape(0)), &mut rng, &mut Vec::new());
        assert_ne!(ch.unwrap().idx, 4);
    }
}
