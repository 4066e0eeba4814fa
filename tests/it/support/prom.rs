//! Reading Prometheus text in tests. Every lookup FAILS when the series it asks for is missing:
//! a missing series must never read as 0, or a renamed family would pass an `== 0` check.

/// Every series of the family (or histogram part) `name` exactly, e.g. `..._seconds_count`.
/// Panics on a sample line of that name whose value does not parse (never skips it).
pub fn series<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
            r.rsplit_once('}')?
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            return None;
        };
        let value = value.split_whitespace().next().unwrap_or("");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("unparsable sample `{line}`: {e}"));
        Some((labels, value))
    })
}

/// The labels of one series as (name, value) pairs, quotes removed, escapes undone.
pub fn labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (k, v) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad labels `{text}`"));
        let mut value = String::new();
        let mut chars = v.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("bad labels `{text}`"),
                },
                Some((_, c)) => value.push(c),
                None => panic!("bad labels `{text}`"),
            }
        };
        out.push((k.trim().trim_start_matches(',').trim().to_string(), value));
        rest = v[end + 1..].trim_start_matches(',').trim();
    }
    out
}

/// Whether the label text has every (name, value) pair of `want` (exact names and values).
pub fn has_labels(label_text: &str, want: &[(&str, &str)]) -> bool {
    let have = labels(label_text);
    want.iter()
        .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
}

/// The sum of the series of `name` that carry every label of `labels`, or `None` when no
/// series matches.
pub fn try_metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for (l, v) in series(text, name) {
        if has_labels(l, labels) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The sum of the series of `name` that carry every label of `labels`. Panics when no series
/// matches, listing what the family does have.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    try_metric(text, name, labels).unwrap_or_else(|| panic!("{}", missing(text, name, labels)))
}

/// For a labelled counter whose label set may not have been touched yet: the family `name`
/// must have at least one series (so a renamed family fails), and a label set without a series
/// reads as 0.
pub fn metric_in_family(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    assert!(
        series(text, name).next().is_some(),
        "{}",
        missing(text, name, labels)
    );
    try_metric(text, name, labels).unwrap_or(0.0)
}

/// The value of one exact series line, e.g. `vllm:x_total{engine="0",model_name="tiny"}`
/// (labels in the order the page writes them). Panics when that line is missing.
pub fn sample(text: &str, series: &str) -> f64 {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"));
    let value = line.split_whitespace().next().unwrap_or("");
    value
        .parse()
        .unwrap_or_else(|e| panic!("unparsable sample `{series} {line}`: {e}"))
}

fn missing(text: &str, name: &str, labels: &[(&str, &str)]) -> String {
    let have: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .take(20)
        .collect();
    format!(
        "no series {name} with labels {labels:?}; lines starting with that name:\n{}",
        have.join("\n")
    )
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
    assert!(std::panic::catch_unwind(|| metric(page, "a", &[("model", "other")])).is_err());
    assert!(std::panic::catch_unwind(|| metric(page, "c", &[])).is_err());
    assert!(std::panic::catch_unwind(|| metric_in_family(page, "c", &[])).is_err());
    assert!(std::panic::catch_unwind(|| sample(page, "a{model=\"other\"}")).is_err());
}
