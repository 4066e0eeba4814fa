//! Prometheus exposition text: histogram buckets and counter sums, with the PromQL-style
//! quantile over bucket deltas (shared with `goodput-proxy compare`).

use std::collections::{BTreeMap, HashMap};

// One histogram arithmetic for the proxy's `compare` and this comparison.
pub use goodput_proxy::compare::hist::{delta, quantile, Buckets};

/// Histogram `family` buckets from exposition text, summed over the series whose labels contain
/// every `(key, value)` in `filter` (any one key of `model_keys` must equal `model` if given).
pub fn histogram(
    text: &str,
    family: &str,
    model_keys: &[&str],
    model: Option<&str>,
) -> Option<Buckets> {
    let prefix = format!("{family}_bucket");
    let mut acc: BTreeMap<u64, (f64, f64)> = BTreeMap::new(); // le bits (ordered) -> (le, sum)
    let mut found = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some(rest) = rest.strip_prefix('{') else {
            continue;
        };
        let Some(close) = rest.rfind('}') else {
            continue;
        };
        let labels = parse_labels(&rest[..close]);
        let value: f64 = match rest[close + 1..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
        {
            Some(v) => v,
            None => continue,
        };
        if let Some(m) = model {
            if !model_keys
                .iter()
                .any(|k| labels.get(*k).is_some_and(|v| v == m))
            {
                continue;
            }
        }
        let Some(le) = labels.get("le").and_then(|v| parse_le(v)) else {
            continue;
        };
        found = true;
        let e = acc.entry(order_key(le)).or_insert((le, 0.0));
        e.1 += value;
    }
    found.then(|| acc.into_values().collect())
}

pub(super) use goodput_proxy::compare::hist::parse_le;

/// Monotone map from non-negative f64 to u64 so a BTreeMap keeps buckets in `le` order.
pub(super) fn order_key(x: f64) -> u64 {
    x.to_bits()
}

pub(super) fn parse_labels(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i] != b'=' {
            i += 1;
        }
        let key = s[start..i]
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_string();
        i += 1; // '='
        if i >= b.len() || b[i] != b'"' {
            break;
        }
        i += 1;
        let mut val = String::new();
        while i < b.len() && b[i] != b'"' {
            if b[i] == b'\\' && i + 1 < b.len() {
                i += 1;
                val.push(match b[i] {
                    b'n' => '\n',
                    c => c as char,
                });
            } else {
                val.push(b[i] as char);
            }
            i += 1;
        }
        i += 1; // closing quote
        while i < b.len() && (b[i] == b',' || b[i] == b' ') {
            i += 1;
        }
        out.insert(key, val);
    }
    out
}

/// Sum of every series of a counter or gauge `name` (e.g. `vllm:generation_tokens_total`), or
/// `None` when the family is absent.
pub fn series_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(r) = rest.strip_prefix('{') {
            r.rfind('}').map(|c| &r[c + 1..])
        } else if rest.starts_with(' ') {
            Some(rest)
        } else {
            None // a longer name (`..._created`)
        };
        if let Some(v) = value
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}
