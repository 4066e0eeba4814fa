//! The file, then the environment, then the flags, merged into one TOML tree that remembers
//! where each value came from; and its deserialization into a [`RawConfig`] that reports every
//! bad field, not only the first.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::{Table, Value};

use super::raw::RawConfig;
use super::schema::{schema, Kind};
use super::{ConfigError, Origin, Override, Problem};

/// The merged tree and the origin of every value set over the file.
#[derive(Debug, Default)]
pub struct Layers {
    tree: Table,
    /// What the tree's values not listed in `set` came from: the file, or nothing.
    base: Option<Origin>,
    /// Dotted path -> where an override came from.
    set: BTreeMap<String, Origin>,
}

impl Layers {
    /// The file's tree (a TOML syntax error stops here: nothing after it can be read).
    pub fn file(path: &Path) -> Result<Layers, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        Layers::text(&text, &path.display().to_string())
    }

    /// A TOML document; `name` names it in errors.
    pub fn text(text: &str, name: &str) -> Result<Layers, ConfigError> {
        let tree: Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse {
                file: name.to_string(),
                message: e.to_string().trim_end().to_string(),
            })?;
        Ok(Layers {
            tree,
            base: Some(Origin::File(name.to_string())),
            set: BTreeMap::new(),
        })
    }

    /// Puts an override into the tree (creating its tables; replacing a non-table in the way).
    pub fn set(&mut self, o: Override) {
        let mut parts: Vec<&str> = o.field.split('.').collect();
        let Some(last) = parts.pop() else { return };
        let mut table = &mut self.tree;
        for p in parts {
            let entry = table
                .entry(p.to_string())
                .or_insert_with(|| Value::Table(Table::new()));
            if !entry.is_table() {
                *entry = Value::Table(Table::new());
            }
            let Value::Table(t) = entry else { return };
            table = t;
        }
        table.insert(last.to_string(), o.value);
        self.set.insert(o.field, o.origin);
    }

    /// Drops the file's value at `field`: an override of it was unusable (and reported), so
    /// the file's value is not what the user meant either; the default takes its place.
    pub fn unset(&mut self, field: &str, origin: Origin) {
        let mut parts: Vec<&str> = field.split('.').collect();
        let Some(last) = parts.pop() else { return };
        let mut table = &mut self.tree;
        for p in parts {
            match table.get_mut(p) {
                Some(Value::Table(t)) => table = t,
                _ => return,
            }
        }
        table.remove(last);
        self.set.insert(field.to_string(), origin);
    }

    /// Where the value at `field` came from: the override that set it or a table above it,
    /// else the file when the file has it, else the defaults.
    pub fn origin(&self, field: &str) -> Origin {
        let mut prefix = field;
        loop {
            if let Some(o) = self.set.get(prefix) {
                return o.clone();
            }
            match prefix.rsplit_once('.') {
                Some((up, _)) => prefix = up,
                None => break,
            }
        }
        match (&self.base, lookup(&self.tree, field)) {
            (Some(base), Some(_)) => base.clone(),
            _ => Origin::Default,
        }
    }

    /// The raw config with every bad value left out (its default in its place), and one
    /// problem per bad value: an unknown key, a wrong type, an unparsable value.
    pub fn deserialize(&self) -> (RawConfig, Vec<Problem>) {
        if let Ok(raw) = RawConfig::deserialize(Value::Table(self.tree.clone())) {
            return (raw, Vec::new());
        }
        let mut problems = Vec::new();
        let mut leaves = Vec::new();
        walk(&self.tree, "", &mut |path, key_known| {
            if let Err(message) = key_known {
                problems.push(Problem::new(path, self.origin(path), &message));
            } else {
                leaves.push(path.to_string());
            }
        });
        // Each leaf alone on top of the defaults: what fails is that leaf's problem.
        let mut good = Table::new();
        for path in leaves {
            let Some(value) = lookup(&self.tree, &path) else {
                continue;
            };
            let mut alone = Table::new();
            insert(&mut alone, &path, value.clone());
            match RawConfig::deserialize(Value::Table(alone)) {
                Ok(_) => insert(&mut good, &path, value.clone()),
                Err(e) => problems.push(Problem::new(&path, self.origin(&path), &message(&e))),
            }
        }
        match RawConfig::deserialize(Value::Table(good)) {
            Ok(raw) => (raw, problems),
            Err(e) => {
                // Two values that are fine alone but not together: not expected, but say so.
                problems.push(Problem::new(
                    "",
                    self.base.clone().unwrap_or(Origin::Default),
                    &message(&e),
                ));
                (RawConfig::default(), problems)
            }
        }
    }
}

/// Serde's message without toml's position prefix (a tree has no positions).
fn message(e: &toml::de::Error) -> String {
    e.message().trim_end().to_string()
}

/// Calls `f` for every leaf of `tree` with `Ok(())`, or with the problem of a key the schema
/// does not have (and then not for the leaves below it).
fn walk(tree: &Table, prefix: &str, f: &mut dyn FnMut(&str, Result<(), String>)) {
    for (key, value) in tree {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        // The root's fields are under "", like every struct's under its path.
        if let Some(Kind::Struct(fields)) = schema().get(prefix) {
            if !fields.contains(&key.as_str()) {
                let expected = fields.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>();
                f(
                    &path,
                    Err(format!(
                        "unknown field, expected one of {}",
                        expected.join(", ")
                    )),
                );
                continue;
            }
        }
        match value {
            // An empty table is a value of its own: `[sink.clickhouse]` alone turns it on.
            Value::Table(t) if !t.is_empty() => walk(t, &path, f),
            _ => f(&path, Ok(())),
        }
    }
}

fn lookup<'t>(tree: &'t Table, path: &str) -> Option<&'t Value> {
    let mut parts = path.split('.');
    let mut v = tree.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

fn insert(tree: &mut Table, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut t = tree;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(next) = entry else { return };
        t = next;
    }
    t.insert(last.to_string(), value);
}
