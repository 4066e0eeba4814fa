//! `summary.json`: per phase and overall, counts by outcome, exact latency percentiles (the
//! shared `measure::stats` code, numpy's linear interpolation over raw values), goodput, tokens, in-flight peak.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;

/// Exact statistics of one latency over raw values (seconds): the proxy's own definition, so
/// both sides of a comparison rank percentiles the same way.
pub use goodput_measure::stats::Summary as Stats;

/// What the runner knows about a phase besides its records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseWindow {
    pub name: String,
    pub arrivals: String,
    /// Run-relative start and end of the phase (seconds).
    pub start_s: f64,
    pub end_s: f64,
    /// Arrivals the in-flight cap held back, and the longest hold.
    pub held_back: u64,
    pub hold_max_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub good: u64,
    pub ratio: Option<f64>,
    pub per_second: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    pub prompt: u64,
    /// Sum of every record's completion tokens (usage when the response carried it, else the
    /// counted output events).
    pub completion: u64,
    pub completion_per_second: f64,
    /// The part of `completion` that came from `usage` (exact), and how many requests had it.
    #[serde(default)]
    pub completion_from_usage: u64,
    #[serde(default)]
    pub requests_with_usage: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    pub name: String,
    pub arrivals: String,
    pub start_s: f64,
    pub end_s: f64,
    pub elapsed_seconds: f64,
    pub requests: u64,
    pub requests_per_second: f64,
    pub outcomes: BTreeMap<String, u64>,
    pub finish_reasons: BTreeMap<String, u64>,
    /// Outcomes per tag (extra header, e.g. injected fault); `untagged` for the rest.
    pub outcomes_by_tag: BTreeMap<String, BTreeMap<String, u64>>,
    /// Outcomes per request-mix option: `api=chat`, `stream=true`, `n=2`, `logprobs=true`,
    /// `usage=final` (streams only), `ignore_eos=true`, `hung_up=true`, ...
    #[serde(default)]
    pub outcomes_by_option: BTreeMap<String, BTreeMap<String, u64>>,
    pub goodput: Goodput,
    pub tokens: Tokens,
    pub ttft_seconds: Option<Stats>,
    pub ttfc_seconds: Option<Stats>,
    pub tpot_seconds: Option<Stats>,
    pub itl_seconds: Option<Stats>,
    pub e2e_seconds: Option<Stats>,
    /// Actual send minus scheduled send: how far the generator (or the in-flight cap) fell
    /// behind the arrival schedule. Large values mean the offered load was not the planned one.
    pub send_lag_seconds: Option<Stats>,
    /// Most requests in flight at once during the phase window (all phases' requests).
    pub in_flight_peak: u64,
    pub held_back: u64,
    pub hold_max_seconds: f64,
    /// Tool calls by outcome and agent phase timings; absent when no request offered tools or
    /// got reasoning or a tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<super::tool_calls::ToolCallSection>,
}

/// The whole `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub target: String,
    pub scenario: String,
    pub seed: u64,
    pub max_in_flight: usize,
    pub slo: crate::scenario::SloSpec,
    pub phases: Vec<PhaseSummary>,
    pub overall: PhaseSummary,
    /// Client vs proxy vs engine tables (only with `--proxy-admin` / `--engine-metrics`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub comparison: Option<crate::report::compare::Comparison>,
}

/// Summarize the records of one window. `all` is every record of the run (for in-flight).
pub fn summarize_phase(
    win: &PhaseWindow,
    mine: &[&RequestRecord],
    all: &[RequestRecord],
) -> PhaseSummary {
    let elapsed = (win.end_s - win.start_s).max(1e-9);
    let mut outcomes = BTreeMap::new();
    let mut finish = BTreeMap::new();
    let mut by_tag: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut by_option: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let (mut good, mut denom, mut ptok, mut ctok) = (0u64, 0u64, 0u64, 0u64);
    let (mut ctok_usage, mut with_usage) = (0u64, 0u64);
    let (mut ttft, mut ttfc, mut tpot, mut itl, mut e2e) = (vec![], vec![], vec![], vec![], vec![]);
    let mut lag = Vec::with_capacity(mine.len());
    for r in mine {
        *outcomes.entry(r.outcome.clone()).or_insert(0) += 1;
        if let Some(f) = &r.finish_reason {
            *finish.entry(f.clone()).or_insert(0) += 1;
        }
        let tag = r.tag.clone().unwrap_or_else(|| "untagged".into());
        *by_tag
            .entry(tag)
            .or_default()
            .entry(r.outcome.clone())
            .or_insert(0) += 1;
        for key in option_keys(r) {
            *by_option
                .entry(key)
                .or_default()
                .entry(r.outcome.clone())
                .or_insert(0) += 1;
        }
        if r.tokens_exact {
            with_usage += 1;
            ctok_usage += r.completion_tokens.unwrap_or(0);
        }
        good += r.good as u64;
        denom += r.counts_for_goodput() as u64;
        ptok += r.prompt_tokens.unwrap_or(0);
        ctok += r.completion_tokens.unwrap_or(0);
        lag.push((r.start_s - r.scheduled_s).max(0.0));
        // DESIGN.md: latency statistics leave out `rejected` requests, as the proxy does.
        if r.outcome == "rejected" {
            continue;
        }
        ttft.extend(r.ttft_seconds);
        ttfc.extend(r.ttfc_seconds);
        tpot.extend(r.tpot_values());
        itl.extend_from_slice(&r.itl_seconds);
        e2e.push(r.e2e_seconds);
    }
    PhaseSummary {
        name: win.name.clone(),
        arrivals: win.arrivals.clone(),
        start_s: win.start_s,
        end_s: win.end_s,
        elapsed_seconds: elapsed,
        requests: mine.len() as u64,
        requests_per_second: mine.len() as f64 / elapsed,
        outcomes,
        finish_reasons: finish,
        outcomes_by_tag: by_tag,
        outcomes_by_option: by_option,
        goodput: Goodput {
            good,
            ratio: (denom > 0).then(|| good as f64 / denom as f64),
            per_second: good as f64 / elapsed,
        },
        tokens: Tokens {
            prompt: ptok,
            completion: ctok,
            completion_per_second: ctok as f64 / elapsed,
            completion_from_usage: ctok_usage,
            requests_with_usage: with_usage,
        },
        ttft_seconds: Stats::of(ttft),
        ttfc_seconds: Stats::of(ttfc),
        tpot_seconds: Stats::of(tpot),
        itl_seconds: Stats::of(itl),
        e2e_seconds: Stats::of(e2e),
        send_lag_seconds: Stats::of(lag),
        in_flight_peak: in_flight_peak(all, win.start_s, win.end_s),
        held_back: win.held_back,
        hold_max_seconds: win.hold_max_seconds,
        tool_calls: super::tool_calls::summarize(mine),
    }
}

/// The mix options of a record as `key=value` group names.
pub fn option_keys(r: &RequestRecord) -> Vec<String> {
    let mut k = vec![
        format!("api={}", r.api),
        format!("stream={}", r.stream),
        format!("n={}", r.n),
        format!("logprobs={}", r.logprobs.is_some()),
        format!("ignore_eos={}", r.ignore_eos),
        format!("tools={}", r.tools),
    ];
    if r.stream {
        k.push(format!("usage={}", r.usage));
        k.push(format!("hung_up={}", r.hung_up));
    }
    k
}

/// Step function of requests in flight: `(time, count after this time)`, sorted by time.
/// A request is in flight over `[start, end)`.
pub fn in_flight_steps(all: &[RequestRecord]) -> Vec<(f64, u64)> {
    let mut ev: Vec<(f64, i64)> = all
        .iter()
        .flat_map(|r| [(r.start_s, 1), (r.end_s(), -1)])
        .collect();
    // Ends before starts at the same instant: [start, end) intervals.
    ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut n = 0i64;
    let mut out: Vec<(f64, u64)> = Vec::with_capacity(ev.len());
    for (t, d) in ev {
        n += d;
        match out.last_mut() {
            Some(last) if last.0 == t => last.1 = n.max(0) as u64,
            _ => out.push((t, n.max(0) as u64)),
        }
    }
    out
}

/// Peak of requests in flight within `[from, to]`.
pub fn in_flight_peak(all: &[RequestRecord], from: f64, to: f64) -> u64 {
    let steps = in_flight_steps(all);
    let mut level = 0;
    let mut peak = 0;
    for (t, n) in steps {
        if t > to {
            break;
        }
        if t < from {
            level = n;
            continue;
        }
        peak = peak.max(n);
        level = n;
    }
    peak.max(level)
}

/// The phase windows back from a summary (for re-rendering a report from files).
pub fn windows_of(s: &Summary) -> Vec<PhaseWindow> {
    s.phases
        .iter()
        .map(|p| PhaseWindow {
            name: p.name.clone(),
            arrivals: p.arrivals.clone(),
            start_s: p.start_s,
            end_s: p.end_s,
            held_back: p.held_back,
            hold_max_seconds: p.hold_max_seconds,
        })
        .collect()
}

/// Per phase (in window order) and overall.
pub fn build(
    windows: &[PhaseWindow],
    records: &[RequestRecord],
) -> (Vec<PhaseSummary>, PhaseSummary) {
    let phases = windows
        .iter()
        .map(|w| {
            let mine: Vec<&RequestRecord> = records.iter().filter(|r| r.phase == w.name).collect();
            summarize_phase(w, &mine, records)
        })
        .collect();
    let overall_win = PhaseWindow {
        name: "overall".into(),
        arrivals: String::new(),
        start_s: windows.first().map_or(0.0, |w| w.start_s),
        end_s: windows.last().map_or(0.0, |w| w.end_s),
        held_back: windows.iter().map(|w| w.held_back).sum(),
        hold_max_seconds: windows
            .iter()
            .map(|w| w.hold_max_seconds)
            .fold(0.0, f64::max),
    };
    let all: Vec<&RequestRecord> = records.iter().collect();
    let overall = summarize_phase(&overall_win, &all, records);
    (phases, overall)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::sample as rec;

    /// numpy's linear interpolation, by hand with integer arithmetic for the rank: for
    /// q = q_milli / 1000, h = (n - 1) * q splits exactly into floor and fraction.
    fn brute(values: &[f64], q_milli: usize) -> f64 {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let h_milli = (v.len() - 1) * q_milli;
        let (lo, frac) = (h_milli / 1000, (h_milli % 1000) as f64 / 1000.0);
        let hi = (lo + 1).min(v.len() - 1);
        v[lo] + frac * (v[hi] - v[lo])
    }

    #[test]
    fn percentiles_match_a_brute_force_sort() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for n in [1usize, 2, 3, 10, 99, 100, 101, 1000, 4321] {
            let values: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * 10.0).collect();
            let s = Stats::of(values.clone()).unwrap();
            assert_eq!(s.count, n as u64);
            for (q, got) in [
                (500, s.p50),
                (900, s.p90),
                (950, s.p95),
                (990, s.p99),
                (999, s.p999),
                (1000, s.max),
            ] {
                let want = brute(&values, q);
                assert!((got - want).abs() <= 1e-12, "n={n} q={q}: {got} vs {want}");
            }
            let mean = values.iter().sum::<f64>() / n as f64;
            assert!((s.mean - mean).abs() < 1e-9);
        }
        assert!(Stats::of(vec![]).is_none());
    }

    #[test]
    fn phases_count_their_own_records() {
        let recs = vec![
            rec("a", 0.0, 1.0, Some(0.1), "success"),
            rec("a", 0.5, 1.0, Some(0.3), "truncated"),
            rec("b", 2.0, 0.5, None, "upstream_error"),
            rec("b", 2.1, 0.5, Some(0.2), "success"),
        ];
        let wins = vec![
            PhaseWindow {
                name: "a".into(),
                arrivals: "x".into(),
                start_s: 0.0,
                end_s: 2.0,
                held_back: 1,
                hold_max_seconds: 0.1,
            },
            PhaseWindow {
                name: "b".into(),
                arrivals: "y".into(),
                start_s: 2.0,
                end_s: 4.0,
                held_back: 0,
                hold_max_seconds: 0.0,
            },
        ];
        let (phases, overall) = build(&wins, &recs);
        assert_eq!(phases[0].requests, 2);
        assert_eq!(phases[0].outcomes["success"], 1);
        assert_eq!(phases[0].outcomes["truncated"], 1);
        assert_eq!(phases[0].in_flight_peak, 2);
        assert_eq!(phases[0].goodput.good, 1);
        assert_eq!(phases[0].goodput.per_second, 0.5);
        assert_eq!(
            phases[1].ttft_seconds.unwrap().count,
            1,
            "no TTFT is not a zero TTFT"
        );
        assert_eq!(overall.requests, 4);
        assert_eq!(overall.held_back, 1);
        assert_eq!(overall.goodput.ratio, Some(0.5));
    }

    #[test]
    fn in_flight_intervals_are_half_open() {
        // Back-to-back requests never overlap.
        let recs = vec![
            rec("a", 0.0, 1.0, None, "success"),
            rec("a", 1.0, 1.0, None, "success"),
        ];
        assert_eq!(in_flight_peak(&recs, 0.0, 3.0), 1);
        assert_eq!(in_flight_steps(&recs).last(), Some(&(2.0, 0)));
    }
}
