//! The merger that serves every engine's families beside the proxy's own, relabelled
//! `upstream`. Pure: families in, text out. The reader is `goodput_measure::prom` (one reader
//! of the text format for the scraper, `compare`, the load generator and the tests).

use std::collections::HashMap;
use std::fmt::Write as _;

pub use goodput_measure::prom::{parse, Family, Kind, ParseError, Sample};

/// Escapes a label value for the text format.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The label the merger adds to every engine sample.
pub const UPSTREAM_LABEL: &str = "upstream";
/// An engine's own `upstream` label is kept under this name (Prometheus' `honor_labels: false`
/// convention), so the added label never clashes.
pub const EXPORTED_UPSTREAM_LABEL: &str = "exported_upstream";

/// One engine's latest families and the `upstream` label value they get.
pub struct Source<'a> {
    pub upstream: &'a str,
    pub families: &'a [Family],
}

/// Appends the families of every source to `out`: one HELP/TYPE per family name (the first
/// source's), all samples of a family grouped under it, each with `upstream="<source>"`.
/// A family whose name `reserved` claims (the proxy's own) is left out, as is a source's family
/// whose type disagrees with the one already merged under that name (its samples could not be
/// read under the other type). Returns the number of families left out.
pub fn merge_into(out: &mut String, reserved: &dyn Fn(&str) -> bool, sources: &[Source]) -> usize {
    struct Merged<'a> {
        help: Option<&'a str>,
        kind: Kind,
        samples: Vec<(&'a str, &'a Sample)>,
    }
    let mut order: Vec<&str> = Vec::new();
    let mut merged: HashMap<&str, Merged> = HashMap::new();
    let mut left_out = 0;
    for src in sources {
        for f in src.families {
            if reserved(&f.name) {
                left_out += 1;
                continue;
            }
            let m = merged.entry(&f.name).or_insert_with(|| {
                order.push(&f.name);
                Merged {
                    help: f.help.as_deref(),
                    kind: f.kind,
                    samples: Vec::new(),
                }
            });
            if m.kind != f.kind {
                left_out += 1;
                continue;
            }
            if m.help.is_none() {
                m.help = f.help.as_deref();
            }
            m.samples
                .extend(f.samples.iter().map(|s| (src.upstream, s)));
        }
    }
    for name in order {
        let Some(m) = merged.get(name) else { continue };
        if let Some(help) = m.help {
            let _ = writeln!(out, "# HELP {name} {help}");
        }
        let _ = writeln!(out, "# TYPE {name} {}", m.kind.as_str());
        for (upstream, s) in &m.samples {
            write_sample(out, s, upstream);
        }
    }
    left_out
}

fn write_sample(out: &mut String, s: &Sample, upstream: &str) {
    out.push_str(&s.name);
    out.push('{');
    for (k, v) in &s.labels {
        let k = if k == UPSTREAM_LABEL {
            EXPORTED_UPSTREAM_LABEL
        } else {
            k
        };
        let _ = write!(out, "{k}=\"{v}\",");
    }
    let _ = write!(
        out,
        "{UPSTREAM_LABEL}=\"{}\"}} {}",
        escape_label_value(upstream),
        s.raw_value
    );
    if let Some(ts) = s.timestamp {
        let _ = write!(out, " {ts}");
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use goodput_measure::prom::parse;

    /// The body of a raw capture (`### GET /metrics`, the HTTP head, a blank line, the body).
    fn capture_body(raw: &str) -> &str {
        let start = raw.find("\r\n\r\n").map(|i| i + 4);
        let start = start.or_else(|| raw.find("\n\n").map(|i| i + 2)).unwrap();
        &raw[start..]
    }

    const CAPTURE: &str = include_str!("../../tests/sim_fixtures/vllm-0.32/metrics.txt");
    const CAPTURE_LOAD: &str =
        include_str!("../../tests/sim_fixtures/vllm-0.32/metrics-after-load.txt");

    fn merged(sources: &[(&str, &str)], reserved: &[&str]) -> (String, usize) {
        let parsed: Vec<Vec<Family>> = sources.iter().map(|(_, t)| parse(t).unwrap()).collect();
        let srcs: Vec<Source> = sources
            .iter()
            .zip(&parsed)
            .map(|((u, _), f)| Source {
                upstream: u,
                families: f,
            })
            .collect();
        let mut out = String::new();
        let left_out = merge_into(&mut out, &|n| reserved.contains(&n), &srcs);
        (out, left_out)
    }

    #[test]
    fn merge_groups_families_and_adds_upstream() {
        let a = "# HELP g G\n# TYPE g gauge\ng{m=\"x\"} 1\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 0.5\nh_count 1\n";
        let b = "# HELP g other help\n# TYPE g gauge\ng{m=\"y\"} 2\nonly_b 7 123\n";
        let (out, left_out) = merged(&[("http://a:1", a), ("http://b:2", b)], &[]);
        assert_eq!(left_out, 0);
        assert_eq!(
            out,
            "# HELP g G\n# TYPE g gauge\n\
             g{m=\"x\",upstream=\"http://a:1\"} 1\n\
             g{m=\"y\",upstream=\"http://b:2\"} 2\n\
             # TYPE h histogram\n\
             h_bucket{le=\"+Inf\",upstream=\"http://a:1\"} 1\n\
             h_sum{upstream=\"http://a:1\"} 0.5\n\
             h_count{upstream=\"http://a:1\"} 1\n\
             # TYPE only_b untyped\n\
             only_b{upstream=\"http://b:2\"} 7 123\n"
        );
    }

    #[test]
    fn merge_leaves_out_reserved_and_conflicting_families_and_keeps_engine_upstream() {
        let a = "# TYPE mine counter\nmine 1\n# TYPE t gauge\nt{upstream=\"x\"} 1\n";
        let b = "# TYPE t counter\nt 2\n";
        let (out, left_out) = merged(&[("0", a), ("1", b)], &["mine"]);
        assert_eq!(left_out, 2);
        assert_eq!(
            out,
            "# TYPE t gauge\nt{exported_upstream=\"x\",upstream=\"0\"} 1\n"
        );
        let mut out = String::new();
        let fams = parse("a 1\n").unwrap();
        merge_into(
            &mut out,
            &|_| false,
            &[Source {
                upstream: "we\"ird\\",
                families: &fams,
            }],
        );
        assert_eq!(out, "# TYPE a untyped\na{upstream=\"we\\\"ird\\\\\"} 1\n");
    }

    #[test]
    fn merging_two_real_captures_gives_one_valid_page() {
        let one = capture_body(CAPTURE);
        let two = capture_body(CAPTURE_LOAD);
        let (out, _) = merged(&[("r0", one), ("r1", two)], &[]);
        let fams = parse(&out).unwrap();
        let help_lines = out.lines().filter(|l| l.starts_with("# HELP ")).count();
        let type_lines = out.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(type_lines, fams.len());
        assert_eq!(help_lines, fams.len());
        let expected: usize = [one, two]
            .iter()
            .map(|t| {
                parse(t)
                    .unwrap()
                    .iter()
                    .map(|f| f.samples.len())
                    .sum::<usize>()
            })
            .sum();
        assert_eq!(
            fams.iter().map(|f| f.samples.len()).sum::<usize>(),
            expected
        );
        for f in &fams {
            for s in &f.samples {
                assert!(matches!(s.label("upstream"), Some("r0" | "r1")), "{s:?}");
            }
        }
    }
}
