//! The engine-metrics parser's properties ([`parse`]), shared by the proptests below (in CI)
//! and the fuzz target `fuzz/fuzz_targets/prom.rs` (which includes this file by path; so only
//! public items, named through `super::`, which the includer brings into scope).
//!
//! For any text: parsing never panics, and a page it accepts is a fixpoint: written back out
//! ([`render`], every line ended by CRLF so a trailing CR of a HELP text survives the parser's
//! CRLF tolerance) it parses to the same families, samples, labels (escapes kept) and raw values.

use super::{parse, Family, Kind};

/// A page as the text format writes it: per family its HELP, its TYPE (unless untyped; an
/// untyped family with neither samples nor HELP keeps its TYPE line, else it would vanish),
/// then its samples with labels and values exactly as read.
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families {
        if let Some(h) = &f.help {
            out.push_str(&format!("# HELP {} {h}\r\n", f.name));
        }
        if f.kind != Kind::Untyped || (f.help.is_none() && f.samples.is_empty()) {
            out.push_str(&format!("# TYPE {} {}\r\n", f.name, f.kind.as_str()));
        }
        for s in &f.samples {
            out.push_str(&s.name);
            if !s.labels.is_empty() {
                let labels: Vec<String> = s
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{v}\""))
                    .collect();
                out.push('{');
                out.push_str(&labels.join(","));
                out.push('}');
            }
            out.push(' ');
            out.push_str(&s.raw_value);
            if let Some(t) = s.timestamp {
                out.push_str(&format!(" {t}"));
            }
            out.push_str("\r\n");
        }
    }
    out
}

/// Everything a reader sees of a family: name, HELP, kind, and per sample its name, labels,
/// raw value and timestamp (the parsed `f64` follows from the raw value; NaN != NaN).
pub type View = Vec<(
    String,
    Option<String>,
    &'static str,
    Vec<(String, Vec<(String, String)>, String, Option<i64>)>,
)>;

pub fn view(families: &[Family]) -> View {
    families
        .iter()
        .map(|f| {
            (
                f.name.clone(),
                f.help.clone(),
                f.kind.as_str(),
                f.samples
                    .iter()
                    .map(|s| {
                        (
                            s.name.clone(),
                            s.labels.clone(),
                            s.raw_value.clone(),
                            s.timestamp,
                        )
                    })
                    .collect(),
            )
        })
        .collect()
}

/// `Err` says how an accepted page failed to survive being written back out.
pub fn check(text: &str) -> Result<(), String> {
    let Ok(families) = parse(text) else {
        return Ok(());
    };
    for f in &families {
        for s in &f.samples {
            let again: f64 = s
                .raw_value
                .parse()
                .map_err(|_| format!("kept a raw value that is no number: `{}`", s.raw_value))?;
            if again.to_bits() != s.value.to_bits() {
                return Err(format!("value {} read from `{}`", s.value, s.raw_value));
            }
        }
    }
    let page = render(&families);
    let again = parse(&page).map_err(|e| format!("own rendering refused: {e}\n{page}"))?;
    if view(&again) != view(&families) {
        return Err(format!("rendering changed the page:\n{page}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::parse;
    use super::{check, view};

    /// Family names that never end in `_bucket`/`_sum`/`_count` (so no family can own
    /// another's samples).
    const NAMES: [&str; 5] = ["a", "req_total", "vllm:kv_usage", "_x", "e2e_seconds"];

    fn label_value() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just(""),
            Just("tiny"),
            Just(r#"a \"quoted\" \\ value\n"#),
            Just("é ü 日本"),
            Just("{braces},=commas"),
        ]
    }

    fn raw_value() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("0"),
            Just("1"),
            Just("3.25"),
            Just("1e3"),
            Just("-2.5E-3"),
            Just("+Inf"),
            Just("-Inf"),
            Just("NaN"),
        ]
    }

    /// A valid page written by hand: (text, families as (name, help, kind, sample lines)).
    fn page() -> impl Strategy<Value = String> {
        let family = (
            0usize..NAMES.len(),
            prop_oneof![Just(None), Just(Some("Help \\\\ with \\n escapes"))],
            0usize..5,
            proptest::collection::vec(
                (
                    label_value(),
                    raw_value(),
                    proptest::option::of(0i64..2_000_000_000_000),
                ),
                0..4,
            ),
        );
        proptest::collection::vec(family, 0..6).prop_map(|fams| {
            let mut seen = std::collections::HashSet::new();
            let mut out = String::new();
            for (n, help, kind, samples) in fams {
                let name = NAMES[n];
                if !seen.insert(name) {
                    continue;
                }
                if let Some(h) = help {
                    out.push_str(&format!("# HELP {name} {h}\n"));
                }
                let kind = ["counter", "gauge", "histogram", "summary", "untyped"][kind];
                out.push_str(&format!("# TYPE {name} {kind}\n"));
                for (i, (lv, v, ts)) in samples.into_iter().enumerate() {
                    let (sample, extra) = match kind {
                        "histogram" => [
                            (format!("{name}_bucket"), format!(",le=\"{i}\"")),
                            (format!("{name}_sum"), String::new()),
                            (format!("{name}_count"), String::new()),
                        ][i % 3]
                            .clone(),
                        "summary" => (name.to_string(), format!(",quantile=\"0.{i}\"")),
                        _ => (name.to_string(), String::new()),
                    };
                    let ts = ts.map_or(String::new(), |t| format!(" {t}"));
                    out.push_str(&format!("{sample}{{model=\"{lv}\"{extra}}} {v}{ts}\n"));
                }
            }
            out
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn valid_pages_parse_and_survive_rendering(p in page()) {
            let fams = parse(&p);
            prop_assert!(fams.is_ok(), "{:?}\n{}", fams, p);
            prop_assert_eq!(check(&p), Ok(()));
            // CRLF endings read the same.
            let crlf = p.replace('\n', "\r\n");
            prop_assert_eq!(parse(&crlf).map(|f| view(&f)), fams.map(|f| view(&f)));
        }

        #[test]
        fn cut_or_mangled_pages_never_panic_and_stay_fixpoints(
            p in page(),
            at in any::<prop::sample::Index>(),
            c in prop_oneof![Just('\n'), Just('\r'), Just('"'), Just('\\'), Just('{'), Just('}'), Just(' '), Just('#'), any::<char>()],
        ) {
            let mut chars: Vec<char> = p.chars().collect();
            chars.push('\n');
            let i = at.index(chars.len());
            let cut: String = chars[..i].iter().collect();
            prop_assert_eq!(check(&cut), Ok(()));
            chars[i] = c;
            let mangled: String = chars.iter().collect();
            prop_assert_eq!(check(&mangled), Ok(()));
        }

        #[test]
        fn arbitrary_text_never_panics(s in "[a-z_:{}=\",.# \\\\\n\r\tE+0-9]{0,80}") {
            prop_assert_eq!(check(&s), Ok(()));
        }
    }

    #[test]
    fn a_trailing_cr_of_a_help_text_survives() {
        // The parser strips one CR before each LF: CRLF endings keep a HELP's own last CR.
        assert_eq!(check("# HELP a text\r\r\na 1\n"), Ok(()));
        assert_eq!(
            parse("# HELP a text\r\r\n").unwrap()[0].help.as_deref(),
            Some("text\r")
        );
    }
}
