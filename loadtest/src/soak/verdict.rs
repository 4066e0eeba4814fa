//! The soak's pass criteria, pure: tallies in, checks with their figures out.
//!
//! - Accounting: every request the client sent has exactly one client outcome; the proxy's
//!   JSONL records hold every one of them exactly once, nothing else, with the outcome its class
//!   says (and the client's outcome is its class's too); `goodput_proxy_requests_total` grew by
//!   exactly the client's tally per outcome; `/stats` over the audit window counts exactly the
//!   audit requests per outcome.
//! - Nothing left behind: in-flight gauge 0, the simulators idle, no sink drops.
//! - Flat: RSS and fd count, last-third median within a tolerance of the first-third median.

use goodput_measure::Outcome;
use serde::Serialize;

use super::classes::{outcome_index, CLASSES};

pub const OUTCOMES: usize = Outcome::ALL.len();
pub type Tally = [u64; OUTCOMES];

/// One machine-checked criterion and what was measured for it.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

pub fn check(name: &'static str, pass: bool, detail: String) -> Check {
    Check { name, pass, detail }
}

/// Outcome counts by name, for the report.
pub fn named(t: &Tally) -> std::collections::BTreeMap<&'static str, u64> {
    Outcome::ALL
        .iter()
        .zip(t)
        .filter(|(_, n)| **n > 0)
        .map(|(o, n)| (o.as_str(), *n))
        .collect()
}

/// What the client recorded: per request (by index) its class and outcome index.
#[derive(Debug, Default)]
pub struct ClientLedger {
    /// `(class, outcome)` per request index; `None`: sent, never finished (lost).
    pub requests: Vec<Option<(u8, u8)>>,
    /// Requests the client began to send.
    pub sent: u64,
    /// Requests recorded more than once (a bug in the driver, never expected).
    pub duplicates: u64,
}

impl ClientLedger {
    pub fn tally(&self) -> Tally {
        let mut t = [0; OUTCOMES];
        for (_, o) in self.requests.iter().flatten() {
            t[usize::from(*o)] += 1;
        }
        t
    }

    pub fn recorded(&self) -> u64 {
        self.requests.iter().flatten().count() as u64
    }
}

/// The proxy's JSONL records matched against the client's by request index.
#[derive(Debug, Default)]
pub struct ProxyLedger {
    /// Records seen per request index.
    pub seen: Vec<u32>,
    /// Outcome index of the (first) record per request index.
    pub outcome: Vec<Option<u8>>,
    /// Records whose id is not one of this run's request ids (health checks do not make
    /// records, so this must stay 0).
    pub foreign: u64,
    /// Lines that are not records.
    pub unreadable: u64,
}

impl ProxyLedger {
    pub fn new(n: usize) -> Self {
        ProxyLedger {
            seen: vec![0; n],
            outcome: vec![None; n],
            ..Default::default()
        }
    }

    /// One record: its id (`<run id>-<index>`) and outcome name.
    pub fn add(&mut self, run_id: &str, id: &str, outcome: &str) {
        let idx = id
            .strip_prefix(run_id)
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|r| r.parse::<usize>().ok())
            .filter(|i| *i < self.seen.len());
        let Some(i) = idx else {
            self.foreign += 1;
            return;
        };
        self.seen[i] += 1;
        if self.seen[i] == 1 {
            self.outcome[i] = Outcome::ALL
                .iter()
                .position(|o| o.as_str() == outcome)
                .map(|k| k as u8);
        }
    }
}

/// Per-class tallies of both sides, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct ClassRow {
    pub class: &'static str,
    pub expected_client: &'static str,
    pub expected_proxy: &'static str,
    pub client: std::collections::BTreeMap<&'static str, u64>,
    pub proxy: std::collections::BTreeMap<&'static str, u64>,
}

/// The accounting checks. `metrics_delta`: growth of `goodput_proxy_requests_total` per
/// outcome over the whole run; `audit`: (client tally, `/stats` tally) of the audit requests.
pub fn accounting(
    client: &ClientLedger,
    proxy: &ProxyLedger,
    metrics_delta: &Tally,
    audit: Option<(&Tally, &Tally)>,
) -> (Vec<Check>, Vec<ClassRow>) {
    let mut checks = Vec::new();
    let recorded = client.recorded();
    let lost = client.sent - recorded;
    checks.push(check(
        "client: every request sent has exactly one outcome",
        lost == 0 && client.duplicates == 0 && client.sent > 0,
        format!(
            "sent {}, recorded {recorded}, lost {lost}, recorded twice {}",
            client.sent, client.duplicates
        ),
    ));
    let (mut missing, mut twice, mut wrong_client, mut wrong_proxy) = (0u64, 0u64, 0u64, 0u64);
    let mut examples = Vec::new();
    let mut rows: Vec<ClassRow> = CLASSES
        .iter()
        .map(|c| ClassRow {
            class: c.name,
            expected_client: c.client.as_str(),
            expected_proxy: c.proxy.as_str(),
            client: Default::default(),
            proxy: Default::default(),
        })
        .collect();
    for (i, r) in client.requests.iter().enumerate() {
        let Some((class, co)) = *r else { continue };
        let c = &CLASSES[usize::from(class)];
        let row = &mut rows[usize::from(class)];
        *row.client
            .entry(Outcome::ALL[usize::from(co)].as_str())
            .or_insert(0) += 1;
        if usize::from(co) != outcome_index(c.client) {
            wrong_client += 1;
            if examples.len() < 5 {
                examples.push(format!(
                    "#{i} {}: client {}",
                    c.name,
                    Outcome::ALL[usize::from(co)].as_str()
                ));
            }
        }
        match proxy.seen.get(i).copied().unwrap_or(0) {
            0 => {
                missing += 1;
                *row.proxy.entry("(no record)").or_insert(0) += 1;
                continue;
            }
            1 => {}
            _ => twice += 1,
        }
        let po = proxy.outcome.get(i).copied().flatten();
        let name = po.map_or("(unknown)", |k| Outcome::ALL[usize::from(k)].as_str());
        *row.proxy.entry(name).or_insert(0) += 1;
        if po.map(usize::from) != Some(outcome_index(c.proxy)) {
            wrong_proxy += 1;
            if examples.len() < 5 {
                examples.push(format!("#{i} {}: proxy {name}", c.name));
            }
        }
    }
    checks.push(check(
        "proxy records: every client request exactly once, nothing else",
        missing == 0 && twice == 0 && proxy.foreign == 0 && proxy.unreadable == 0,
        format!(
            "without a record {missing}, recorded more than once {twice}, records of no client request {}, unreadable lines {}",
            proxy.foreign, proxy.unreadable
        ),
    ));
    checks.push(check(
        "outcomes: each request's client and proxy outcome are its class's",
        wrong_client == 0 && wrong_proxy == 0,
        format!(
            "client outcome not its class's {wrong_client}, proxy outcome not its class's {wrong_proxy}{}",
            if examples.is_empty() {
                String::new()
            } else {
                format!(" (e.g. {})", examples.join("; "))
            }
        ),
    ));
    let tally = client.tally();
    let want = proxy_tally_expected(client);
    checks.push(check(
        "/metrics: goodput_proxy_requests_total grew by the run's requests per outcome",
        *metrics_delta == want,
        format!(
            "delta {:?}, expected from the client's requests {:?} (client outcomes {:?})",
            named(metrics_delta),
            named(&want),
            named(&tally)
        ),
    ));
    if let Some((client_audit, stats)) = audit {
        checks.push(check(
            "/stats: the audit window counts exactly the audit requests per outcome",
            client_audit == stats && client_audit.iter().sum::<u64>() > 0,
            format!(
                "/stats {:?}, audit requests by proxy outcome {:?}",
                named(stats),
                named(client_audit)
            ),
        ));
    }
    (checks, rows)
}

/// The proxy-side tally the client's requests imply (each class's proxy outcome): what
/// `/metrics` must have counted.
pub fn proxy_tally_expected(client: &ClientLedger) -> Tally {
    let mut t = [0; OUTCOMES];
    for (class, _) in client.requests.iter().flatten() {
        t[outcome_index(CLASSES[usize::from(*class)].proxy)] += 1;
    }
    t
}

/// A resource sampled over the run: (seconds since start, value).
#[derive(Debug, Clone, Serialize)]
pub struct Flatness {
    pub samples: usize,
    pub first_third_median: f64,
    pub last_third_median: f64,
    /// `first_third_median * (1 + tolerance_pct / 100) + slack`.
    pub limit: f64,
    pub growth_pct: f64,
    pub tolerance_pct: f64,
    pub max: f64,
    pub pass: bool,
}

/// Flat: over the samples in `[from_s, to_s]` (after warm-up, before the load stops), the
/// median of the last third is at most the first third's median times `1 + tolerance_pct/100`
/// plus `slack` (an absolute allowance for small values: a few fds). Medians, not extremes:
/// one spike (a burst of connections, a GC-like allocator trim) neither fails nor hides a trend.
/// `None` with fewer than 6 samples.
pub fn flatness(
    samples: &[(f64, f64)],
    from_s: f64,
    to_s: f64,
    tolerance_pct: f64,
    slack: f64,
) -> Option<Flatness> {
    let v: Vec<f64> = samples
        .iter()
        .filter(|(t, _)| *t >= from_s && *t <= to_s)
        .map(|(_, v)| *v)
        .collect();
    if v.len() < 6 {
        return None;
    }
    let third = v.len() / 3;
    let first = median(&v[..third]);
    let last = median(&v[v.len() - third..]);
    let limit = first * (1.0 + tolerance_pct / 100.0) + slack;
    Some(Flatness {
        samples: v.len(),
        first_third_median: first,
        last_third_median: last,
        limit,
        growth_pct: if first > 0.0 {
            (last / first - 1.0) * 100.0
        } else {
            0.0
        },
        tolerance_pct,
        max: v.iter().copied().fold(f64::MIN, f64::max),
        pass: last <= limit,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(rows: &[(u8, Outcome)]) -> ClientLedger {
        ClientLedger {
            requests: rows
                .iter()
                .map(|(c, o)| Some((*c, outcome_index(*o) as u8)))
                .collect(),
            sent: rows.len() as u64,
            duplicates: 0,
        }
    }

    fn idx(name: &str) -> u8 {
        CLASSES.iter().position(|c| c.name == name).unwrap() as u8
    }

    #[test]
    fn a_clean_run_passes_every_accounting_check() {
        let hang = idx("hang");
        let c = ledger(&[
            (0, Outcome::Success),
            (hang, Outcome::UpstreamError),
            (0, Outcome::Success),
        ]);
        let mut p = ProxyLedger::new(3);
        p.add("lt1", "lt1-0000000", "success");
        p.add("lt1", "lt1-0000001", "timeout");
        p.add("lt1", "lt1-0000002", "success");
        let mut delta = [0; OUTCOMES];
        delta[outcome_index(Outcome::Success)] = 2;
        delta[outcome_index(Outcome::Timeout)] = 1;
        let (checks, rows) = accounting(&c, &p, &delta, Some((&delta, &delta)));
        assert!(checks.iter().all(|c| c.pass), "{checks:#?}");
        assert_eq!(checks.len(), 5);
        assert_eq!(rows[usize::from(hang)].proxy.get("timeout"), Some(&1));
    }

    #[test]
    fn a_lost_duplicated_foreign_or_wrong_record_fails() {
        let c = ledger(&[(0, Outcome::Success), (0, Outcome::Success)]);
        let mut delta = [0; OUTCOMES];
        delta[outcome_index(Outcome::Success)] = 2;
        let names = |ch: &[Check]| -> Vec<&'static str> {
            ch.iter().filter(|c| !c.pass).map(|c| c.name).collect()
        };
        // One record missing.
        let mut p = ProxyLedger::new(2);
        p.add("lt1", "lt1-0000000", "success");
        let (ch, _) = accounting(&c, &p, &delta, None);
        assert_eq!(names(&ch), [ch[1].name]);
        // One twice, one foreign id.
        p.add("lt1", "lt1-0000000", "success");
        p.add("lt1", "lt1-0000001", "success");
        p.add("lt1", "other-0000001", "success");
        let (ch, _) = accounting(&c, &p, &delta, None);
        assert!(!ch[1].pass && ch[1].detail.contains("more than once 1"));
        assert!(ch[1].detail.contains("of no client request 1"));
        // The proxy's outcome disagrees with the class.
        let mut p = ProxyLedger::new(2);
        p.add("lt1", "lt1-0000000", "success");
        p.add("lt1", "lt1-0000001", "truncated");
        let (ch, _) = accounting(&c, &p, &delta, None);
        assert_eq!(names(&ch), [ch[2].name]);
        // /metrics off by one; a request sent and never recorded by the client.
        let mut c2 = ledger(&[(0, Outcome::Success), (0, Outcome::Success)]);
        c2.sent = 3;
        let mut p = ProxyLedger::new(2);
        p.add("lt1", "lt1-0000000", "success");
        p.add("lt1", "lt1-0000001", "success");
        let mut off = delta;
        off[0] += 1;
        let (ch, _) = accounting(&c2, &p, &off, None);
        assert_eq!(names(&ch), [ch[0].name, ch[3].name]);
        // /stats disagrees with the audit.
        let mut stats = delta;
        stats[0] -= 1;
        let (ch, _) = accounting(&c, &p, &delta, Some((&delta, &stats)));
        assert!(!ch[4].pass);
    }

    #[test]
    fn flatness_uses_medians_of_the_thirds_after_warm_up() {
        // Warm-up ramp 0..10 s is ignored; a single spike does not fail.
        let mut s: Vec<(f64, f64)> = (0..10).map(|t| (t as f64, t as f64 * 10.0)).collect();
        s.extend((10..100).map(|t| (t as f64, if t == 95 { 500.0 } else { 100.0 })));
        let f = flatness(&s, 10.0, 99.0, 10.0, 0.0).unwrap();
        assert!(f.pass, "{f:?}");
        assert_eq!((f.first_third_median, f.last_third_median), (100.0, 100.0));
        assert_eq!(f.max, 500.0);
        // Steady growth of 20% fails at 10%, passes at 25%.
        let grow: Vec<(f64, f64)> = (0..90)
            .map(|t| (t as f64, 100.0 + t as f64 / 3.0))
            .collect();
        assert!(!flatness(&grow, 0.0, 90.0, 10.0, 0.0).unwrap().pass);
        assert!(flatness(&grow, 0.0, 90.0, 25.0, 0.0).unwrap().pass);
        // Slack lets small counts move by a few.
        let fds: Vec<(f64, f64)> = (0..30)
            .map(|t| (t as f64, if t < 15 { 10.0 } else { 13.0 }))
            .collect();
        assert!(!flatness(&fds, 0.0, 30.0, 10.0, 0.0).unwrap().pass);
        assert!(flatness(&fds, 0.0, 30.0, 10.0, 2.0).unwrap().pass);
        assert!(flatness(&fds[..5], 0.0, 30.0, 10.0, 0.0).is_none());
    }
}
