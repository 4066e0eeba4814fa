use super::*;

fn s(v: &str) -> Arc<str> {
    Arc::from(v)
}

/// `sent`: the replica's tokens-sent counter.
fn load(upstream: &str, in_flight: usize, sent: u64) -> ReplicaLoad {
    ReplicaLoad {
        upstream: s(upstream),
        healthy: true,
        in_flight,
        tokens_in_flight: Some(in_flight as u64 * 100),
        tokens_sent: sent,
        tokens_pending: Some(TokensPending {
            prefill: in_flight as u64 * 60,
            decode: in_flight as u64 * 40,
        }),
    }
}

fn scale() -> (Scale, Registry) {
    let registry = Registry::new();
    let config = ScaleConfig {
        tick_ms: 1_000,
        load_window_ms: 1_000,
        ..ScaleConfig::default()
    };
    let scale = Scale::register(&config, &registry, Instant::now()).unwrap();
    (scale, registry)
}

/// Series of `name` as (label values in label-name order joined by `,`, value).
fn series(r: &Registry, name: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for f in r.gather().iter().filter(|f| f.name() == name) {
        for m in f.get_metric() {
            let l: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
            out.push((l.join(","), m.get_gauge().get_value()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn attainment_per_window_model_tenant_upstream() {
    let (sc, r) = scale();
    let t0 = Instant::now();
    let (m, a, b) = (s("m"), s("a"), s("u0"));
    for good in [true, true, true, false] {
        sc.finished(&m, Some(&a), &b, true, good, t0, t0);
    }
    // A rejection the client caused says nothing about the replicas.
    sc.finished(&m, Some(&a), &b, false, false, t0, t0);
    sc.refresh(t0 + Duration::from_secs(1));
    assert_eq!(
        series(&r, "goodput_proxy_slo_attainment"),
        [("m,30s".into(), 0.75), ("m,5m".into(), 0.75)]
    );
    assert_eq!(
        series(&r, "goodput_proxy_slo_attainment_by_tenant"),
        [("a,30s".into(), 0.75), ("a,5m".into(), 0.75)]
    );
    assert_eq!(
        series(&r, "goodput_proxy_slo_attainment_by_upstream"),
        [("u0,30s".into(), 0.75), ("u0,5m".into(), 0.75)]
    );
    // Past the short window only the long one has data.
    sc.refresh(t0 + Duration::from_secs(40));
    assert_eq!(
        series(&r, "goodput_proxy_slo_attainment"),
        [("m,5m".into(), 0.75)]
    );
}

#[test]
fn headroom_is_absent_until_the_limit_is_seen_then_follows_the_load() {
    let (sc, r) = scale();
    let m = s("m");
    let mut now = Instant::now();
    sc.tick(now, &[load("u0", 0, 0), load("u1", 0, 0)]);
    // Two replicas; each meets its SLOs up to 8 streams and misses half beyond. Each is
    // sent 100 tokens a second per stream.
    let m = &m;
    let mut sent = 0;
    let step = |sc: &Scale, now: &mut Instant, sent: &mut u64, per_replica: usize| {
        *now += Duration::from_secs(1);
        for u in ["u0", "u1"] {
            for i in 0..30 {
                let good = per_replica <= 8 || i % 2 == 0;
                sc.finished(m, None, &s(u), true, good, *now, *now);
            }
        }
        *sent += per_replica as u64 * 100;
        let n = per_replica;
        sc.tick(*now, &[load("u0", n, *sent), load("u1", n, *sent)]);
    };
    for n in 1..=8 {
        step(&sc, &mut now, &mut sent, n);
    }
    sc.refresh(now);
    assert!(series(&r, "goodput_proxy_headroom_streams").is_empty());
    assert!(series(&r, "goodput_proxy_desired_replicas").is_empty());
    assert_eq!(sc.estimates()[0].1.capacity_streams, None);
    for n in 9..=12 {
        step(&sc, &mut now, &mut sent, n);
    }
    // Now at 12 per replica, past the limit: no room, 3 replicas wanted where 2 serve.
    let e = sc.estimates()[0].1;
    let cap = e.capacity_streams.unwrap();
    // Within a bin (19%) of the true limit, 8.
    assert!((6.5..=9.5).contains(&cap), "{cap}");
    assert_eq!(e.headroom_streams, Some(0.0));
    let want = e.desired_replicas.unwrap();
    assert!(want >= 24.0 / cap - 1e-9, "{want}");
    // The same limit in tokens offered per second: 100 per stream.
    let cap_tokens = e.capacity_tokens.unwrap();
    assert!((650.0..=950.0).contains(&cap_tokens), "{cap_tokens}");
    // Load falls to 2 per replica: room for about 2 x cap - 4 more.
    step(&sc, &mut now, &mut sent, 2);
    let e = sc.estimates()[0].1;
    let room = e.headroom_streams.unwrap();
    assert!((room - (2.0 * cap - 4.0)).abs() < 1e-9, "{room}");
    sc.refresh(now);
    let h = series(&r, "goodput_proxy_headroom_streams");
    assert_eq!(h, [("m".into(), room)]);
    assert_eq!(series(&r, "goodput_proxy_capacity_streams").len(), 1);
    assert_eq!(
        series(&r, "goodput_proxy_upstream_tokens_in_flight"),
        [("u0".into(), 200.0), ("u1".into(), 200.0)]
    );
    assert_eq!(
        series(&r, "goodput_proxy_upstream_tokens_pending"),
        [
            ("decode,u0".into(), 80.0),
            ("decode,u1".into(), 80.0),
            ("prefill,u0".into(), 120.0),
            ("prefill,u1".into(), 120.0)
        ]
    );
    // A replica that leaves loses its series.
    now += Duration::from_secs(1);
    sc.tick(now, &[load("u0", 1, sent)]);
    sc.refresh(now);
    assert_eq!(
        series(&r, "goodput_proxy_upstream_tokens_in_flight"),
        [("u0".into(), 100.0)]
    );
    assert_eq!(
        series(&r, "goodput_proxy_upstream_tokens_pending"),
        [("decode,u0".into(), 40.0), ("prefill,u0".into(), 60.0)]
    );
}

/// Past saturation a replica's output stays flat, or falls, while its clients miss their
/// SLOs; what it is sent keeps rising. The token load is what was sent, so the limit in tokens
/// per second sits where attainment crossed the target, and a replica that finishes little
/// while its requests fail does not put the limit near 0 (which asked for replicas without
/// end).
#[test]
fn token_load_is_what_was_sent_not_what_came_out() {
    let (sc, _r) = scale();
    let m = s("m");
    let mut now = Instant::now();
    let mut sent = 0u64;
    sc.tick(now, &[load("u0", 0, 0)]);
    // (tokens sent per second, streams, requests finished this second, good ones)
    let seconds: &[(u64, usize, u32, u32)] = &[
        (500, 2, 20, 20),
        (1_000, 4, 20, 20),
        (2_000, 8, 20, 20),
        (4_000, 16, 20, 6),
        // Saturated: little comes out and most of it misses.
        (8_000, 32, 20, 2),
        (8_000, 40, 20, 0),
    ];
    for &(rate, streams, total, good) in seconds {
        for _ in 0..10 {
            now += Duration::from_secs(1);
            for i in 0..total {
                sc.finished(&m, None, &s("u0"), true, i < good, now, now);
            }
            sent += rate;
            sc.tick(now, &[load("u0", streams, sent)]);
        }
    }
    let e = sc.estimates()[0].1;
    let cap = e.capacity_tokens.unwrap_or(0.0);
    assert!((2_000.0..4_000.0).contains(&cap), "{cap}");
    // Offered 8000 tokens/s: 2 to 4 replicas' worth, not thousands.
    let want = e.desired_replicas.unwrap_or(0.0);
    assert!((2.0..=5.0).contains(&want), "{want}");
}

#[test]
fn window_labels() {
    let cases = [
        (30, "30s"),
        (300, "5m"),
        (90, "90s"),
        (7200, "2h"),
        (60, "1m"),
    ];
    for (secs, want) in cases {
        assert_eq!(window_label(Duration::from_secs(secs)), want);
    }
}

/// The hint reads the throughput (Little's law), not the streams held: the same requests a
/// second spread over 2 or over 6 replicas are fewer streams in all on 6 (each batch runs
/// faster), and the hint stays where it was. Request times reach the estimate from what
/// finished (start to end).
#[test]
fn the_hint_follows_the_throughput_not_the_replicas_sharing_it() {
    let (sc, _r) = scale();
    let m = s("m");
    let mut now = Instant::now() + Duration::from_secs(10);
    // Seconds a request takes while its replica holds `n` streams.
    let took = |n: usize| Duration::from_secs_f64(0.5 * (1.0 + n as f64 / 8.0));
    // One second: each of `replicas` holds `n` streams and finishes `per` requests, which
    // meet their SLOs up to 8 streams and half of them beyond. Returns the hint.
    let second = |now: &mut Instant, replicas: usize, n: usize, per: u32| {
        *now += Duration::from_secs(1);
        let names: Vec<String> = (0..replicas).map(|i| format!("u{i}")).collect();
        for u in &names {
            for i in 0..per {
                let good = n <= 8 || i % 2 == 0;
                sc.finished(&m, None, &s(u), true, good, *now - took(n), *now);
            }
        }
        let loads: Vec<ReplicaLoad> = names.iter().map(|u| load(u, n, 0)).collect();
        sc.tick(*now, &loads);
        sc.estimates()[0].1.desired_replicas
    };
    // Learn the limit: 2 replicas from 1 to 12 streams each.
    for n in 1..=12 {
        second(&mut now, 2, n, 30);
    }
    // Requests a second the fleet serves when each of `replicas` holds `n`: n / took(n) each.
    let rate = |replicas: usize, n: usize| replicas as f64 * n as f64 / took(n).as_secs_f64();
    // (replicas, streams each): the same 10.7 requests a second, 8 streams in all on 2
    // replicas, 6 on 6.
    let fleets = [(2, 4), (6, 1)];
    assert!((rate(2, 4) - rate(6, 1)).abs() < 1e-9);
    let hints: Vec<f64> = fleets
        .iter()
        .map(|&(r, n)| second(&mut now, r, n, 10).unwrap_or(0.0))
        .collect();
    assert!(hints[0] > 0.0, "{hints:?}");
    assert!((hints[1] / hints[0] - 1.0).abs() < 0.02, "{hints:?}");
}

/// The mean load a request lived through, by a pass over every tick (the reference the
/// bisection replaces).
fn lived_through_by_pass(
    h: &std::collections::VecDeque<(Instant, Load)>,
    start: Instant,
    end: Instant,
) -> Option<Load> {
    let (mut sum, mut n) = ([0.0; UNITS], 0usize);
    for (_, l) in h.iter().filter(|(t, _)| *t >= start && *t <= end) {
        for (s, v) in sum.iter_mut().zip(l) {
            *s += v;
        }
        n += 1;
    }
    if n == 0 {
        return h.iter().rev().find(|(t, _)| *t <= end).map(|(_, l)| *l);
    }
    Some(sum.map(|s| s / n as f64))
}

proptest::proptest! {
    /// Any history in tick order (ties included), any request: bisection and the pass agree
    /// bit for bit (the same ticks summed in the same order).
    #[test]
    fn lived_through_is_the_pass_over_every_tick(
        steps in proptest::collection::vec((0u64..3, proptest::array::uniform4(0.0f64..1e4)), 0..40),
        start_ms in 0u64..60,
        len_ms in 0u64..40,
    ) {
        let t0 = Instant::now();
        let mut at = t0;
        let mut h = std::collections::VecDeque::new();
        for (gap, load) in steps {
            at += Duration::from_millis(gap);
            h.push_back((at, load));
        }
        let start = t0 + Duration::from_millis(start_ms);
        let end = start + Duration::from_millis(len_ms);
        let (a, b) = (lived_through(&h, start, end), lived_through_by_pass(&h, start, end));
        proptest::prop_assert_eq!(a.map(|l| l.map(f64::to_bits)), b.map(|l| l.map(f64::to_bits)));
    }
}

proptest::proptest! {
    /// Any history in tick order (ties included), any run of requests: the load each lived
    /// through, with its last span kept, is the pass's bit for bit, and its bins are the
    /// curves' own for that load.
    #[test]
    fn lived_with_the_last_span_kept_is_the_pass_for_every_request(
        steps in proptest::collection::vec((0u64..3, proptest::array::uniform4(0.0f64..1e4)), 0..40),
        requests in proptest::collection::vec((0u64..60, 0u64..40), 1..40),
    ) {
        let t0 = Instant::now();
        let mut at = t0;
        let mut h = std::collections::VecDeque::new();
        for (gap, load) in steps {
            at += Duration::from_millis(gap);
            h.push_back((at, load));
        }
        let curves = [Unit::Streams, Unit::TokensPerS, Unit::Prefill, Unit::Decode]
            .map(|u| Curve::new(u.lo(), BINS, 400.0));
        let mut lived = Lived::new(&h);
        for (start_ms, len_ms) in requests {
            let start = t0 + Duration::from_millis(start_ms);
            let end = start + Duration::from_millis(len_ms);
            let got = lived.load(start, end, &curves);
            let want = lived_through_by_pass(&h, start, end)
                .map(|l| (l, std::array::from_fn::<_, UNITS, _>(|i| curves[i].bin(l[i]))));
            proptest::prop_assert_eq!(
                got.map(|(l, b)| (l.map(f64::to_bits), b)),
                want.map(|(l, b)| (l.map(f64::to_bits), b))
            );
        }
    }
}
