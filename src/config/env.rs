//! Environment overrides: `GOODPUT_PROXY_<PATH>` with the field's dotted path in capitals and
//! `_` for `.` (`server.max_in_flight` is `GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT`,
//! `sink.clickhouse.url` is `GOODPUT_PROXY_SINK_CLICKHOUSE_URL`). The names and the value types
//! come from the schema ([`super::schema`]): numbers and booleans are parsed, lists are
//! comma-separated, a limit takes a number or `none`, the rest is taken as written.

use std::collections::BTreeMap;

use super::schema::{schema, Kind};
use super::{Origin, Override, Problem};

/// Prefix of environment overrides.
pub const ENV_PREFIX: &str = "GOODPUT_PROXY_";

/// The environment variable naming the config file (read by the CLI, not an override).
pub const ENV_CONFIG_FILE: &str = "GOODPUT_PROXY_CONFIG";

/// The variable that overrides the field at `path`.
pub fn var_name(path: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        path.replace('.', "_").to_ascii_uppercase()
    )
}

/// Every overridable field by its variable name: the schema's leaves.
fn by_name() -> BTreeMap<String, (&'static str, &'static Kind)> {
    schema()
        .iter()
        .filter(|(_, k)| !matches!(k, Kind::Struct(_)))
        .map(|(path, k)| (var_name(path), (path.as_str(), k)))
        .collect()
}

/// The overrides in `env` (other variables are ignored), sorted by name, and the problems of
/// those that name no field or carry a value of the wrong type.
pub fn overrides(env: impl IntoIterator<Item = (String, String)>) -> (Vec<Override>, Vec<Problem>) {
    let fields = by_name();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k != ENV_CONFIG_FILE)
        .collect();
    vars.sort();
    let (mut out, mut problems) = (Vec::new(), Vec::new());
    for (var, raw) in vars {
        let origin = Origin::Env(var.clone());
        let Some((path, kind)) = fields.get(&var) else {
            // Name the field it would be if the first `_` separated the section.
            let guess = var[ENV_PREFIX.len()..]
                .to_ascii_lowercase()
                .replacen('_', ".", 1);
            problems.push(Problem::new(
                &guess,
                origin,
                "no such setting (names are GOODPUT_PROXY_ + the field's path, `.` as `_`)",
            ));
            continue;
        };
        match typed(kind, &raw) {
            Ok(value) => out.push(Override {
                field: path.to_string(),
                value,
                origin,
            }),
            Err(message) => problems.push(Problem::new(path, origin, &message)),
        }
    }
    (out, problems)
}

/// `raw` as the TOML value of a field of `kind`.
fn typed(kind: &Kind, raw: &str) -> Result<toml::Value, String> {
    use toml::Value;
    let t = raw.trim();
    Ok(match kind {
        Kind::Int => Value::Integer(
            t.parse()
                .map_err(|_| format!("`{raw}` is not an integer"))?,
        ),
        Kind::Float => Value::Float(t.parse().map_err(|_| format!("`{raw}` is not a number"))?),
        Kind::Bool => Value::Boolean(
            t.parse()
                .map_err(|_| format!("`{raw}` is not true/false"))?,
        ),
        Kind::Seq => Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        ),
        Kind::Any => match t.parse::<i64>() {
            Ok(n) => Value::Integer(n),
            Err(_) => Value::String(raw.to_string()),
        },
        Kind::Str | Kind::Enum => Value::String(raw.to_string()),
        Kind::Struct(_) | Kind::Map | Kind::Other => {
            return Err("a table: set it in the config file".into())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_two_fields_share_a_variable() {
        let leaves = schema()
            .values()
            .filter(|k| !matches!(k, Kind::Struct(_)))
            .count();
        assert_eq!(by_name().len(), leaves);
    }

    #[test]
    fn values_are_typed_by_their_field() {
        let (o, p) = overrides(env(&[
            ("GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT", "7"),
            ("GOODPUT_PROXY_UPSTREAM_URLS", "http://a:1, http://b:2,"),
            ("GOODPUT_PROXY_ENGINE_SCRAPE", "false"),
            ("GOODPUT_PROXY_UPSTREAM_TOTAL_TIMEOUT_MS", "none"),
            ("GOODPUT_PROXY_SLO_TTFT_MS", "700"),
            ("GOODPUT_PROXY_SIM_TTFT_MS", "2.5"),
            ("GOODPUT_PROXY_SINK_CLICKHOUSE_URL", "http://ch:8123"),
            ("GOODPUT_PROXY_CONFIG", "/etc/x.toml"),
            ("UNRELATED", "x"),
        ]));
        assert!(p.is_empty(), "{p:?}");
        let got: Vec<(String, String)> = o
            .iter()
            .map(|o| (o.field.clone(), o.value.to_string()))
            .collect();
        let want = [
            ("engine.scrape", "false"),
            ("server.max_in_flight", "7"),
            ("sim.ttft_ms", "2.5"),
            ("sink.clickhouse.url", "\"http://ch:8123\""),
            ("slo.ttft_ms", "700"),
            ("upstream.total_timeout_ms", "\"none\""),
            ("upstream.urls", "[\"http://a:1\", \"http://b:2\"]"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn problems_name_the_variable_and_field() {
        for (k, v, field) in [
            ("GOODPUT_PROXY_SERVER_NOPE", "1", "server.nope"),
            (
                "GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT",
                "many",
                "server.max_in_flight",
            ),
            ("GOODPUT_PROXY_BOGUS_X", "1", "bogus.x"),
            ("GOODPUT_PROXY_SLO_MODELS", "x", "slo.models"),
            ("GOODPUT_PROXY_MEASURE_ENABLED", "yes", "measure.enabled"),
        ] {
            let (o, p) = overrides(env(&[(k, v)]));
            assert!(o.is_empty(), "{k}");
            assert_eq!(p.len(), 1, "{k}");
            assert_eq!(p[0].field, field);
            assert_eq!(p[0].origin, Origin::Env(k.into()));
        }
    }
}
