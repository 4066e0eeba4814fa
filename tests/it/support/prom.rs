//! Reading Prometheus text in tests, through the one reader (`goodput_measure::prom`; a page
//! it refuses fails the test). Every lookup FAILS when the series it asks for is missing: a
//! missing series must never read as 0, or a renamed family would pass an `== 0` check.

use goodput_measure::prom::{self, Family};

/// Labels of one series: (name, value) pairs, escapes undone.
pub type Labels = Vec<(String, String)>;

fn page(text: &str) -> Vec<Family> {
    prom::parse(text).unwrap_or_else(|e| panic!("unreadable exposition: {e}\n{text}"))
}

/// Every series of the family (or histogram part) `name` exactly, e.g. `..._seconds_count`.
pub fn series(text: &str, name: &str) -> impl Iterator<Item = (Labels, f64)> {
    let found: Vec<(Labels, f64)> = prom::samples(&page(text), name, &[])
        .map(|s| {
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), prom::unescape(v)))
                .collect();
            (labels, s.value)
        })
        .collect();
    found.into_iter()
}

/// Whether `labels` has every (name, value) pair of `want` (exact names and values).
pub fn has_labels(labels: &Labels, want: &[(&str, &str)]) -> bool {
    want.iter()
        .all(|(k, v)| labels.iter().any(|(hk, hv)| hk == k && hv == v))
}

/// The sum of the series of `name` that carry every label of `labels`, or `None` when no
/// series matches.
pub fn try_metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    prom::sum(&page(text), name, labels).ok()
}

/// The sum of the series of `name` that carry every label of `labels`. Panics when no series
/// matches, listing what the family does have.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    prom::sum(&page(text), name, labels).unwrap_or_else(|e| panic!("{}", missing(text, &e)))
}

/// For a labelled counter whose label set may not have been touched yet: the family `name`
/// must have at least one series (so a renamed family fails), and a label set without a series
/// reads as 0.
pub fn metric_in_family(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let families = page(text);
    if let Err(e) = prom::sum(&families, name, &[]) {
        panic!("{}", missing(text, &e));
    }
    prom::sum(&families, name, labels).unwrap_or(0.0)
}

/// The value of one exact series, e.g. `vllm:x_total{engine="0",model_name="tiny"}`: that
/// name with exactly those labels (in any order). Panics when it is missing.
pub fn sample(text: &str, series: &str) -> f64 {
    let want = page(&format!("{series} 0\n"));
    let want = &want[0].samples[0];
    let families = page(text);
    let mut found = prom::samples(&families, &want.name, &[]).filter(|s| {
        s.labels.len() == want.labels.len() && want.labels.iter().all(|l| s.labels.contains(l))
    });
    match (found.next(), found.next()) {
        (Some(s), None) => s.value,
        (None, _) => panic!("no series {series} in:\n{text}"),
        (Some(_), Some(_)) => panic!("series {series} twice in:\n{text}"),
    }
}

fn missing(text: &str, e: &prom::Missing) -> String {
    let have: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&e.name) && !l.starts_with('#'))
        .take(20)
        .collect();
    format!("{e}; lines starting with that name:\n{}", have.join("\n"))
}

#[test]
fn lookups_fail_on_missing_series_and_match_labels_exactly() {
    let page = "# TYPE a counter\na{model=\"tiny\",x=\"1\"} 2\na{model=\"tiny\",x=\"2\"} 3\n\
                a{model=\"big\"} 7\nab 9\nb 0\nq{v=\"a\\\"b,c=\\\"d\"} 1\n";
    assert_eq!(metric(page, "a", &[("model", "tiny")]), 5.0);
    assert_eq!(metric(page, "a", &[]), 12.0);
    assert_eq!(metric(page, "b", &[]), 0.0);
    assert_eq!(try_metric(page, "a", &[("model", "other")]), None);
    assert_eq!(try_metric(page, "c", &[]), None);
    // A label name that merely ends like the wanted one does not match.
    assert_eq!(try_metric(page, "a", &[("odel", "tiny")]), None);
    assert_eq!(metric(page, "q", &[("v", "a\"b,c=\"d")]), 1.0);
    assert_eq!(metric_in_family(page, "a", &[("model", "other")]), 0.0);
    assert_eq!(sample(page, "a{model=\"big\"}"), 7.0);
    assert_eq!(sample(page, "a{x=\"2\",model=\"tiny\"}"), 3.0);
    assert_eq!(series(page, "a").count(), 3);
    assert!(std::panic::catch_unwind(|| metric(page, "a", &[("model", "other")])).is_err());
    assert!(std::panic::catch_unwind(|| metric(page, "c", &[])).is_err());
    assert!(std::panic::catch_unwind(|| metric_in_family(page, "c", &[])).is_err());
    assert!(std::panic::catch_unwind(|| sample(page, "a{model=\"other\"}")).is_err());
    assert!(std::panic::catch_unwind(|| sample(page, "a{model=\"tiny\"}")).is_err());
}
