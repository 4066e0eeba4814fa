//! Prometheus text exposition (format 0.0.4): the one reader, used by the engine scraper, the
//! proxy's `compare`, the load generator and the tests. A small, strict parser plus lookups
//! that fail on a missing series (a missing series is an error, never a 0). Pure: text in,
//! values out.
//!
//! Strict where a lax reading would make our own output invalid (a second TYPE or HELP line, a
//! TYPE after samples, a histogram sample without `_bucket`/`_sum`/`_count`, bad escapes): such
//! a page is refused whole, as Prometheus refuses it. HELP texts, label values and sample values
//! are kept as written (still escaped), so they pass through byte for byte.

use std::collections::HashMap;

pub mod engines;
pub mod hist;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "histogram" => Kind::Histogram,
            "summary" => Kind::Summary,
            "untyped" => Kind::Untyped,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
            Kind::Untyped => "untyped",
        }
    }
}

/// One metric family: its HELP/TYPE and every sample that belongs to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    /// The HELP text as written (escapes kept); `None` without a HELP line.
    pub help: Option<String>,
    pub kind: Kind,
    pub samples: Vec<Sample>,
    typed: bool,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's own name (`foo_bucket` for a bucket of histogram `foo`).
    pub name: String,
    /// Label names and values; values as written between the quotes (escapes kept).
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// The value as written, so the engine's formatting passes through unchanged.
    pub raw_value: String,
    pub timestamp: Option<i64>,
}

impl Sample {
    /// The value of label `name`, as written.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

/// Parses a whole exposition into families, in the order they first appear. Samples of one
/// family that appear in several groups are joined.
pub fn parse(text: &str) -> Result<Vec<Family>, ParseError> {
    let mut p = Parser::default();
    for (i, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        p.line(line).map_err(|reason| ParseError {
            line: i + 1,
            reason,
        })?;
    }
    Ok(p.families)
}

#[derive(Default)]
struct Parser {
    families: Vec<Family>,
    index: HashMap<String, usize>,
}

impl Parser {
    fn line(&mut self, line: &str) -> Result<(), String> {
        let trimmed = line.trim_start_matches([' ', '\t']);
        if trimmed.is_empty() {
            return Ok(());
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            return self.comment(comment);
        }
        let sample = parse_sample(trimmed)?;
        let i = match self.owner(&sample.name) {
            Some(i) => i,
            None => self.family(&sample.name),
        };
        check_sample(&self.families[i], &sample)?;
        self.families[i].samples.push(sample);
        Ok(())
    }

    /// `# HELP name text`, `# TYPE name kind`; any other comment is ignored.
    fn comment(&mut self, rest: &str) -> Result<(), String> {
        let rest = rest.trim_start_matches([' ', '\t']);
        let (keyword, rest) = split_token(rest);
        if keyword != "HELP" && keyword != "TYPE" {
            return Ok(());
        }
        let (name, rest) = split_token(rest.trim_start_matches([' ', '\t']));
        if name.is_empty() {
            // A bare `# HELP` is just a comment (as the Prometheus parser reads it).
            return Ok(());
        }
        if !is_metric_name(name) {
            return Err(format!("# {keyword}: bad metric name `{name}`"));
        }
        let value = rest.trim_start_matches([' ', '\t']);
        let i = self.family(name);
        let f = &mut self.families[i];
        if keyword == "HELP" {
            if f.help.is_some() {
                return Err(format!("second HELP line for `{name}`"));
            }
            check_escapes(value, false)?;
            f.help = Some(value.to_string());
        } else {
            if f.typed {
                return Err(format!("second TYPE line for `{name}`"));
            }
            if !f.samples.is_empty() {
                return Err(format!("TYPE line for `{name}` after its samples"));
            }
            f.kind = Kind::parse(value.trim_end_matches([' ', '\t']))
                .ok_or_else(|| format!("unknown metric type `{value}`"))?;
            f.typed = true;
        }
        Ok(())
    }

    /// The family index for `name`, created (untyped) when new.
    fn family(&mut self, name: &str) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.families.push(Family {
            name: name.to_string(),
            help: None,
            kind: Kind::Untyped,
            samples: Vec::new(),
            typed: false,
        });
        self.index.insert(name.to_string(), self.families.len() - 1);
        self.families.len() - 1
    }

    /// The declared family a sample name belongs to: its own name, or a histogram/summary
    /// whose name it extends by `_bucket`, `_sum` or `_count`.
    fn owner(&self, sample: &str) -> Option<usize> {
        if let Some(&i) = self.index.get(sample) {
            return Some(i);
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            let Some(base) = sample.strip_suffix(suffix) else {
                continue;
            };
            if let Some(&i) = self.index.get(base) {
                match (self.families[i].kind, suffix) {
                    (Kind::Histogram, _) | (Kind::Summary, "_sum" | "_count") => return Some(i),
                    _ => {}
                }
            }
        }
        None
    }
}

/// A histogram's samples are `_bucket` (with `le`), `_sum`, `_count`; a summary's are the bare
/// name (with `quantile`), `_sum`, `_count`; any other family's carry its exact name.
fn check_sample(f: &Family, s: &Sample) -> Result<(), String> {
    let suffix = s.name.strip_prefix(f.name.as_str()).unwrap_or("?");
    let ok = match f.kind {
        Kind::Histogram => match suffix {
            "_bucket" => s.label("le").is_some(),
            "_sum" | "_count" => true,
            _ => false,
        },
        Kind::Summary => matches!(suffix, "" | "_sum" | "_count"),
        _ => suffix.is_empty(),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "sample `{}` does not fit {} `{}`",
            s.name,
            f.kind.as_str(),
            f.name
        ))
    }
}

fn split_token(s: &str) -> (&str, &str) {
    let end = s.find([' ', '\t']).unwrap_or(s.len());
    s.split_at(end)
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// HELP allows `\\` and `\n`; label values also `\"`.
fn check_escapes(s: &str, quote: bool) -> Result<(), String> {
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\\' | 'n') => {}
                Some('"') if quote => {}
                other => return Err(format!("invalid escape `\\{}`", other.unwrap_or(' '))),
            }
        }
    }
    Ok(())
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err(format!("bad metric name `{name}`"));
    }
    let mut rest = line[name_end..].trim_start_matches([' ', '\t']);
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = parse_labels(r, &mut labels)?;
    }
    let rest = rest.trim_start_matches([' ', '\t']);
    let (raw_value, rest) = split_token(rest);
    let value: f64 = raw_value
        .parse()
        .map_err(|_| format!("bad sample value `{raw_value}`"))?;
    let (ts, rest) = split_token(rest.trim_start_matches([' ', '\t']));
    let timestamp = if ts.is_empty() {
        None
    } else {
        Some(
            ts.parse::<i64>()
                .map_err(|_| format!("bad timestamp `{ts}`"))?,
        )
    };
    if !rest.trim_matches([' ', '\t']).is_empty() {
        return Err(format!("unexpected text after the sample: `{rest}`"));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
        raw_value: raw_value.to_string(),
        timestamp,
    })
}

/// Parses `name="value",...}` (the `{` already taken); returns what follows the `}`.
fn parse_labels<'a>(
    mut rest: &'a str,
    labels: &mut Vec<(String, String)>,
) -> Result<&'a str, String> {
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        if let Some(r) = rest.strip_prefix('}') {
            return Ok(r);
        }
        let eq = rest.find('=').ok_or("label without `=`")?;
        let name = rest[..eq].trim_end_matches([' ', '\t']);
        if !is_label_name(name) {
            return Err(format!("bad label name `{name}`"));
        }
        if labels.iter().any(|(k, _)| k == name) {
            return Err(format!("label `{name}` twice"));
        }
        let r = rest[eq + 1..].trim_start_matches([' ', '\t']);
        let r = r.strip_prefix('"').ok_or("label value without `\"`")?;
        let end = closing_quote(r).ok_or("unterminated label value")?;
        check_escapes(&r[..end], true)?;
        labels.push((name.to_string(), r[..end].to_string()));
        rest = r[end + 1..].trim_start_matches([' ', '\t']);
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err("expected `,` or `}` after a label".into());
        }
    }
}

/// Byte index of the first `"` not escaped by a backslash.
fn closing_quote(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// Undoes the text format's label-value escapes (`\\`, `\"`, `\n`); any other character,
/// multi-byte ones included, is kept as it is.
pub fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

impl Sample {
    /// The value of label `name` with its escapes undone.
    pub fn label_value(&self, name: &str) -> Option<String> {
        self.label(name).map(unescape)
    }

    /// Whether the sample carries every `(name, value)` of `want`: exact names, values compared
    /// unescaped.
    pub fn has_labels(&self, want: &[(&str, &str)]) -> bool {
        want.iter()
            .all(|(k, v)| self.label(k).is_some_and(|have| unescape(have) == *v))
    }
}

/// The samples named `name` (a family's name, or a histogram part such as `x_count`) that
/// carry every label of `want`.
pub fn samples<'a>(
    families: &'a [Family],
    name: &'a str,
    want: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = &'a Sample> + 'a {
    families
        .iter()
        .flat_map(|f| &f.samples)
        .filter(move |s| s.name == name && s.has_labels(want))
}

/// No series matched a lookup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no series {name} with labels {labels:?}")]
pub struct Missing {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

/// The sum of the samples [`samples`] finds; `Err` when it finds none (a missing series is
/// never a 0).
pub fn sum(families: &[Family], name: &str, want: &[(&str, &str)]) -> Result<f64, Missing> {
    let mut found = None;
    for s in samples(families, name, want) {
        *found.get_or_insert(0.0) += s.value;
    }
    found.ok_or_else(|| Missing {
        name: name.to_string(),
        labels: want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
}

/// The parser's properties, shared with the fuzz target `prom`.
#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    /// The body of a raw capture (`### GET /metrics`, the HTTP head, a blank line, the body).
    fn capture_body(raw: &str) -> &str {
        let start = raw.find("\r\n\r\n").map(|i| i + 4);
        let start = start.or_else(|| raw.find("\n\n").map(|i| i + 2)).unwrap();
        &raw[start..]
    }

    const CAPTURE: &str = include_str!("../../../tests/sim_fixtures/vllm-0.32/metrics.txt");
    const CAPTURE_LOAD: &str =
        include_str!("../../../tests/sim_fixtures/vllm-0.32/metrics-after-load.txt");

    fn family<'a>(fams: &'a [Family], name: &str) -> &'a Family {
        fams.iter().find(|f| f.name == name).unwrap()
    }

    #[test]
    fn real_vllm_captures_parse_completely() {
        for raw in [CAPTURE, CAPTURE_LOAD] {
            let body = capture_body(raw);
            let fams = parse(body).unwrap();
            let types = body.lines().filter(|l| l.starts_with("# TYPE ")).count();
            let samples = body
                .lines()
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .count();
            assert_eq!(fams.len(), types);
            assert_eq!(fams.iter().map(|f| f.samples.len()).sum::<usize>(), samples);
            assert!(fams.iter().all(|f| f.typed && f.help.is_some()));
            let ttft = family(&fams, "vllm:time_to_first_token_seconds");
            assert_eq!(ttft.kind, Kind::Histogram);
            let buckets = ttft.samples.iter().filter(|s| s.name.ends_with("_bucket"));
            // vLLM's TTFT grid (22 bounds) plus +Inf.
            assert_eq!(buckets.count(), 23);
            let summary = family(&fams, "http_request_size_bytes");
            assert_eq!(summary.kind, Kind::Summary);
            // The trailing space of this HELP text is kept.
            assert!(summary.help.as_deref().unwrap().ends_with("calculated. "));
        }
        let fams = parse(capture_body(CAPTURE)).unwrap();
        let success = family(&fams, "vllm:request_success_total");
        let length = success
            .samples
            .iter()
            .find(|s| s.label("finished_reason") == Some("length"))
            .unwrap();
        assert_eq!(length.value, 9.0);
        assert_eq!(length.label("model_name"), Some("tiny"));
        let created = family(&fams, "vllm:prompt_tokens_created");
        assert_eq!(created.samples[0].raw_value, "1.795964148972793e+09");
    }

    #[test]
    fn accepted_pages() {
        // (page, families, samples)
        let cases: &[(&str, usize, usize)] = &[
            ("", 0, 0),
            ("\n\n", 0, 0),
            ("a 1\n", 1, 1),
            ("a 1 1700000000000\n", 1, 1),
            ("a{} 1\n", 1, 1),
            ("a{x=\"1\",} 1\n", 1, 1),
            ("a { x = \"1\" , y=\"2\" } +Inf\n", 1, 1),
            ("a{x=\"q\\\"uo\\\\te\\n\"} NaN\n", 1, 1),
            ("a{x=\"}{,=\"} -Inf\r\n", 1, 1),
            ("# a free comment\n# HELP\n#TYPE\na 1\n", 1, 1),
            ("# HELP a help \\\\ text\n# TYPE a gauge\na 1\na{b=\"c\"} 2\n", 1, 2),
            // TYPE before HELP, family without samples
            ("# TYPE a counter\n# HELP a x\n# TYPE b gauge\n", 2, 0),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n",
                1,
                4,
            ),
            ("# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 3\ns_count 2\n", 1, 3),
            // a gauge named like a histogram suffix is its own family
            ("# TYPE a gauge\na 1\n# TYPE a_count gauge\na_count 2\n", 2, 2),
            // samples of one family in two groups are joined
            ("# TYPE a gauge\na{x=\"1\"} 1\nb 2\na{x=\"2\"} 3\n", 2, 3),
        ];
        for (page, families, samples) in cases {
            let fams = parse(page).unwrap_or_else(|e| panic!("{page:?}: {e}"));
            assert_eq!(fams.len(), *families, "{page:?}");
            let n: usize = fams.iter().map(|f| f.samples.len()).sum();
            assert_eq!(n, *samples, "{page:?}");
        }
    }

    #[test]
    fn refused_pages_name_the_line() {
        let cases: &[(&str, usize)] = &[
            ("{\"ok\":true}", 1),
            ("<html>\n", 1),
            ("a\n", 1),
            ("a 1\nb one\n", 2),
            ("a 1 2 3\n", 1),
            ("a 1 1.5\n", 1),
            ("1a 1\n", 1),
            ("a{x=1} 1\n", 1),
            ("a{x=\"1\" 1\n", 1),
            ("a{x=\"1\nb 2\n", 1),
            ("a{x=\"1\",x=\"2\"} 1\n", 1),
            ("a{1x=\"1\"} 1\n", 1),
            ("a{x=\"\\t\"} 1\n", 1),
            ("# HELP a x\n# HELP a y\n", 2),
            ("# HELP a bad \\q escape\n", 1),
            ("# TYPE a gauge\n# TYPE a counter\n", 2),
            ("a 1\n# TYPE a gauge\n", 2),
            ("# TYPE a gaug\n", 1),
            ("# TYPE h histogram\nh 1\n", 2),
            ("# TYPE h histogram\nh_bucket 1\n", 2),
        ];
        for (page, line) in cases {
            let e = parse(page).expect_err(page);
            assert_eq!(e.line, *line, "{page:?}: {e}");
        }
    }

    #[test]
    fn lookups_unescape_and_fail_on_a_missing_series() {
        let page = "# TYPE a counter\na{model=\"tiny\",x=\"1\"} 2\na{model=\"tiny\",x=\"2\"} 3\n\
                    a{model=\"big\"} 7\nb 0\nq{v=\"a\\\"b\\\\c\\nd\"} 1\nu{m=\"mod\u{e8}le-\u{6a21}\u{578b}\"} 4\n";
        let f = parse(page).unwrap();
        for (name, want, expect) in [
            ("a", &[("model", "tiny")][..], Ok(5.0)),
            ("a", &[][..], Ok(12.0)),
            ("b", &[][..], Ok(0.0)),
            ("q", &[("v", "a\"b\\c\nd")][..], Ok(1.0)),
            ("u", &[("m", "mod\u{e8}le-\u{6a21}\u{578b}")][..], Ok(4.0)),
            ("a", &[("model", "other")][..], Err(())),
            ("a", &[("odel", "tiny")][..], Err(())),
            ("c", &[][..], Err(())),
        ] {
            assert_eq!(
                sum(&f, name, want).map_err(|_| ()),
                expect,
                "{name} {want:?}"
            );
        }
        let e = sum(&f, "c", &[("k", "v")]).unwrap_err().to_string();
        assert_eq!(e, "no series c with labels [(\"k\", \"v\")]");
        assert_eq!(unescape("a\\"), "a\\", "a trailing backslash is kept");
    }
}
