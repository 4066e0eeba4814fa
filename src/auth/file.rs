//! The keys file (`auth.keys_file`): more tenants' key digests, kept out of the main config
//! so a secret manager can own it, re-read on SIGHUP. Its shape, in TOML:
//!
//! ```toml
//! [tenants.team-a]
//! keys = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
//! ```
//!
//! Keys only: a tenant's limits live in the config (`[auth.tenants.NAME]`); a tenant named only
//! here has none. Every problem is reported with its place in the file; a file with any
//! problem is not used (at startup the proxy does not start, on SIGHUP the keys in use stay).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;

use super::{check_tenant_name, parse_digest, Digest, TenantConfig, MAX_TENANTS};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeysFile {
    #[serde(default)]
    tenants: BTreeMap<String, RawFileTenant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFileTenant {
    keys: Vec<String>,
}

/// Reads and checks the keys file against the config's tenants (`config`: a key may not be
/// in both under different tenants). Each problem names the file and the place in it.
pub fn load(path: &Path, config: &[TenantConfig]) -> Result<Vec<TenantConfig>, Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("{}: cannot read: {e}", path.display())])?;
    parse(&text, config).map_err(|problems| {
        let at = path.display();
        problems.into_iter().map(|p| format!("{at}: {p}")).collect()
    })
}

/// [`load`] without the file system.
pub fn parse(text: &str, config: &[TenantConfig]) -> Result<Vec<TenantConfig>, Vec<String>> {
    let raw: RawKeysFile = toml::from_str(text).map_err(|e| vec![e.message().to_string()])?;
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for (name, t) in raw.tenants {
        if let Err(m) = check_tenant_name(&name) {
            problems.push(format!("tenants.{name}: {m}"));
        }
        let mut keys = Vec::new();
        for (i, k) in t.keys.iter().enumerate() {
            match parse_digest(k) {
                Ok(d) => keys.push(d),
                Err(m) => problems.push(format!("tenants.{name}.keys[{i}]: {m}")),
            }
        }
        out.push(TenantConfig {
            name,
            keys,
            limits: Default::default(),
        });
    }
    let all: Vec<&TenantConfig> = config.iter().chain(&out).collect();
    problems.extend(conflicts(&all));
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// What makes a set of tenants unusable together: one key owned by two tenants (which one
/// would a request be?), more than [`MAX_TENANTS`] distinct names.
pub fn conflicts(all: &[&TenantConfig]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut owner: HashMap<Digest, &str> = HashMap::new();
    for t in all {
        for d in &t.keys {
            match owner.insert(*d, &t.name) {
                Some(other) if other != t.name => problems.push(format!(
                    "tenants.{}: a key of tenant `{}` is listed for `{other}` too",
                    t.name, t.name
                )),
                _ => {}
            }
        }
    }
    let mut names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    if names.len() > MAX_TENANTS {
        problems.push(format!(
            "{} tenants: at most {MAX_TENANTS} (each is a `tenant` label value)",
            names.len()
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{digest_of, hex};

    fn digest(key: &str) -> String {
        hex(&digest_of(key.as_bytes()))
    }

    #[test]
    fn a_good_file() {
        let text = format!(
            "[tenants.a]\nkeys = [\"{}\", \"sha256:{}\"]\n[tenants.b]\nkeys = []\n",
            digest("k1"),
            digest("k2")
        );
        let got = parse(&text, &[]).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].name, "a");
        assert_eq!(
            got[0].keys,
            [digest_of(b"k1"), digest_of(b"k2")],
            "both spellings"
        );
        assert!(got[1].keys.is_empty());
        assert!(parse("", &[]).unwrap().is_empty());
    }

    #[test]
    fn every_problem_is_reported_with_its_place() {
        let text = format!(
            "[tenants.none]\nkeys = [\"{}\"]\n[tenants.b]\nkeys = [\"zz\", \"{}\"]\n",
            digest("k1"),
            digest("k1")
        );
        let problems = parse(&text, &[]).unwrap_err();
        let all = problems.join("\n");
        assert!(
            all.contains("tenants.none: tenant name `none` is reserved"),
            "{all}"
        );
        assert!(all.contains("tenants.b.keys[0]: a SHA-256 digest"), "{all}");
        assert!(
            all.contains("tenants.none: a key of tenant `none` is listed for `b` too"),
            "{all}"
        );
        assert_eq!(problems.len(), 3, "{all}");
        let e = parse("[tenants.a]\nkeys = []\nlimit = 1\n", &[]).unwrap_err();
        assert!(e[0].contains("unknown field `limit`"), "{e:?}");
    }

    #[test]
    fn a_key_of_a_config_tenant_cannot_move_to_another_in_the_file() {
        let config = [TenantConfig {
            name: "a".into(),
            keys: vec![digest_of(b"k1")],
            limits: Default::default(),
        }];
        let text = format!("[tenants.b]\nkeys = [\"{}\"]\n", digest("k1"));
        assert!(parse(&text, &config).is_err());
        // The same tenant listing it again is no conflict.
        let text = format!("[tenants.a]\nkeys = [\"{}\"]\n", digest("k1"));
        assert!(parse(&text, &config).is_ok());
    }
}
