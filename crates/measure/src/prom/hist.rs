//! Histogram estimates from Prometheus exposition: a family's cumulative buckets summed over the
//! series a filter keeps, the delta between two scrapes, and PromQL's `histogram_quantile`
//! interpolation. Pure: parsed families in, numbers out; one arithmetic for `goodput-proxy compare`
//! and the load generator's comparison.

use std::collections::BTreeMap;

use super::{Family, Sample};

/// Cumulative bucket counts of one histogram: `(le, count)` ascending, `+Inf` last.
pub type Buckets = Vec<(f64, f64)>;

/// The `le` value of a bucket sample.
pub fn parse_le(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" | "inf" => Some(f64::INFINITY),
        _ => v.parse().ok(),
    }
}

/// Buckets of histogram `family` summed over the `_bucket` samples `keep` accepts; `None` when
/// the family is absent from `families` (present with no matching series: empty buckets).
pub fn buckets(
    families: &[Family],
    family: &str,
    keep: &dyn Fn(&Sample) -> bool,
) -> Option<Buckets> {
    let f = families.iter().find(|f| f.name == family)?;
    let bucket = format!("{family}_bucket");
    // le bits keep non-negative floats in order.
    let mut acc: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for s in f.samples.iter().filter(|s| s.name == bucket && keep(s)) {
        let Some(le) = s.label("le").and_then(parse_le) else {
            continue;
        };
        acc.entry(le.to_bits()).or_insert((le, 0.0)).1 += s.value;
    }
    Some(acc.into_values().collect())
}

/// One series' labels without `le`, and its bounds.
type SeriesGrid<'a> = (Vec<(&'a str, &'a str)>, Vec<f64>);

/// The distinct bucket grids (finite `le` bounds, ascending) of histogram `family` among the
/// series `keep` accepts, one per grid in first-seen order: more than one means the series
/// cannot be summed bucket by bucket (an engine started with other buckets than its peers).
pub fn grids(families: &[Family], family: &str, keep: &dyn Fn(&Sample) -> bool) -> Vec<Vec<f64>> {
    let Some(f) = families.iter().find(|f| f.name == family) else {
        return Vec::new();
    };
    let bucket = format!("{family}_bucket");
    let mut per_series: Vec<SeriesGrid> = Vec::new();
    for s in f.samples.iter().filter(|s| s.name == bucket && keep(s)) {
        let Some(le) = s.label("le").and_then(parse_le).filter(|v| v.is_finite()) else {
            continue;
        };
        let key: Vec<(&str, &str)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match per_series.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(le),
            None => per_series.push((key, vec![le])),
        }
    }
    let mut out: Vec<Vec<f64>> = Vec::new();
    for (_, mut g) in per_series {
        g.sort_by(f64::total_cmp);
        if !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// Sum over the samples of counter or gauge `name` that `keep` accepts, grouped by `key`'s
/// label value; `None` when no sample of that name exists at all.
pub fn sums_by(
    families: &[Family],
    name: &str,
    key: &str,
    keep: &dyn Fn(&Sample) -> bool,
) -> Option<BTreeMap<String, f64>> {
    let mut found = false;
    let mut out = BTreeMap::new();
    for s in families.iter().flat_map(|f| &f.samples) {
        if s.name != name {
            continue;
        }
        found = true;
        if keep(s) {
            *out.entry(s.label(key).unwrap_or("").to_string())
                .or_insert(0.0) += s.value;
        }
    }
    found.then_some(out)
}

/// `end - start` per bucket; a counter reset (e.g. a restarted engine) yields `end`.
pub fn delta(start: Option<&Buckets>, end: &Buckets) -> Buckets {
    let Some(start) = start else {
        return end.clone();
    };
    let before = |le: f64| start.iter().find(|s| s.0 == le).map_or(0.0, |s| s.1);
    let reset = end.iter().any(|&(le, c)| c < before(le));
    end.iter()
        .map(|&(le, c)| (le, if reset { c } else { (c - before(le)).max(0.0) }))
        .collect()
}

/// Observations in the buckets (the `+Inf` count).
pub fn count(b: &Buckets) -> f64 {
    b.last().map_or(0.0, |l| l.1)
}

/// PromQL `histogram_quantile` on cumulative buckets: linear interpolation inside the bucket
/// holding rank `q * total` (lower bound 0 for the first bucket); a rank in `+Inf` returns the
/// highest finite bound. `None` for an empty histogram.
pub fn quantile(b: &Buckets, q: f64) -> Option<f64> {
    let total = count(b);
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut prev_le, mut prev_c) = (0.0, 0.0);
    for &(le, c) in b {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev_le);
            }
            if c == prev_c {
                return Some(le);
            }
            return Some(prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c));
        }
        (prev_le, prev_c) = (le, c);
    }
    Some(prev_le)
}

/// Width of the bucket of grid `b` that holds `value` (`upper - lower`, lower 0 for the first);
/// `None` above the highest finite bound.
pub fn bucket_width(b: &Buckets, value: f64) -> Option<f64> {
    let mut lower = 0.0;
    for &(le, _) in b {
        if le.is_infinite() {
            return None;
        }
        if value <= le {
            return Some(le - lower);
        }
        lower = le;
    }
    None
}

#[cfg(test)]
mod grid_tests {
    use super::*;
    use crate::prom::parse;

    #[test]
    fn grids_of_the_kept_series() {
        let page = "# TYPE h histogram\n\
            h_bucket{u=\"a\",le=\"0.1\"} 1\nh_bucket{u=\"a\",le=\"1\"} 2\nh_bucket{u=\"a\",le=\"+Inf\"} 2\n\
            h_bucket{u=\"b\",le=\"1\"} 1\nh_bucket{u=\"b\",le=\"0.1\"} 0\nh_bucket{u=\"b\",le=\"+Inf\"} 1\n\
            h_bucket{u=\"c\",le=\"0.5\"} 1\nh_bucket{u=\"c\",le=\"+Inf\"} 1\n\
            h_sum 1\nh_count 4\n";
        let f = parse(page).unwrap();
        let only = |u: &'static str| move |s: &Sample| s.label("u") == Some(u);
        type Keep = Box<dyn Fn(&Sample) -> bool>;
        let cases: Vec<(Keep, Vec<Vec<f64>>)> = vec![
            (Box::new(only("a")), vec![vec![0.1, 1.0]]),
            // same grid in another order: one grid
            (
                Box::new(|s: &Sample| s.label("u") != Some("c")),
                vec![vec![0.1, 1.0]],
            ),
            (Box::new(|_: &Sample| true), vec![vec![0.1, 1.0], vec![0.5]]),
            (Box::new(only("z")), vec![]),
        ];
        for (keep, want) in cases {
            assert_eq!(grids(&f, "h", &*keep), want);
        }
        assert!(grids(&f, "missing", &|_| true).is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::parse;

    const PAGE: &str = "\
# TYPE h histogram
h_bucket{m=\"a\",le=\"0.1\"} 1
h_bucket{m=\"a\",le=\"0.5\"} 3
h_bucket{m=\"a\",le=\"+Inf\"} 4
h_sum{m=\"a\"} 1
h_count{m=\"a\"} 4
h_bucket{m=\"b\",le=\"0.1\"} 10
h_bucket{m=\"b\",le=\"0.5\"} 10
h_bucket{m=\"b\",le=\"+Inf\"} 10
h_sum{m=\"b\"} 1
h_count{m=\"b\"} 10
# TYPE c counter
c_total{r=\"stop\",m=\"a\"} 5
c_total{r=\"length\",m=\"a\"} 2
c_total{r=\"stop\",m=\"b\"} 1
";

    #[test]
    fn buckets_sum_the_kept_series() {
        let f = parse(PAGE).unwrap();
        let a = buckets(&f, "h", &|s| s.label("m") == Some("a")).unwrap();
        assert_eq!(a, vec![(0.1, 1.0), (0.5, 3.0), (f64::INFINITY, 4.0)]);
        let all = buckets(&f, "h", &|_| true).unwrap();
        assert_eq!(count(&all), 14.0);
        assert!(buckets(&f, "missing", &|_| true).is_none());
        let none = buckets(&f, "h", &|_| false).unwrap();
        assert!(none.is_empty() && quantile(&none, 0.5).is_none());
    }

    #[test]
    fn sums_group_by_a_label() {
        let f = parse(PAGE).unwrap();
        let by = sums_by(&f, "c_total", "r", &|s| s.label("m") == Some("a")).unwrap();
        assert_eq!(by.get("stop"), Some(&5.0));
        assert_eq!(by.get("length"), Some(&2.0));
        assert!(sums_by(&f, "nope_total", "r", &|_| true).is_none());
    }

    #[test]
    fn quantile_interpolates_like_promql() {
        let b = vec![(0.1, 1.0), (0.5, 3.0), (f64::INFINITY, 4.0)];
        // rank 2 of 4: halfway through (0.1, 0.5].
        assert!((quantile(&b, 0.5).unwrap() - 0.3).abs() < 1e-12);
        // rank 0.4 in the first bucket: lower bound 0.
        assert!((quantile(&b, 0.1).unwrap() - 0.04).abs() < 1e-12);
        // rank in +Inf: the highest finite bound.
        assert_eq!(quantile(&b, 0.99), Some(0.5));
    }

    #[test]
    fn delta_subtracts_and_survives_resets() {
        let start = vec![(0.1, 1.0), (f64::INFINITY, 2.0)];
        let end = vec![(0.1, 4.0), (f64::INFINITY, 7.0)];
        assert_eq!(
            delta(Some(&start), &end),
            vec![(0.1, 3.0), (f64::INFINITY, 5.0)]
        );
        let restarted = vec![(0.1, 0.0), (f64::INFINITY, 1.0)];
        assert_eq!(delta(Some(&start), &restarted), restarted);
        assert_eq!(delta(None, &end), end);
    }

    #[test]
    fn widths_of_the_grid() {
        let b = vec![(0.1, 0.0), (0.5, 0.0), (f64::INFINITY, 0.0)];
        assert_eq!(bucket_width(&b, 0.05), Some(0.1));
        assert_eq!(bucket_width(&b, 0.3), Some(0.4));
        assert_eq!(bucket_width(&b, 0.5), Some(0.4));
        assert_eq!(bucket_width(&b, 9.0), None);
    }
}
