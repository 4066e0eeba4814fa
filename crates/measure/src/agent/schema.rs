//! A tool call's arguments against its function's `parameters` JSON Schema. With the feature
//! `tool-schema` the schema is compiled (once per distinct schema, see [`compiled`]) and the
//! first violation reported; without it nothing is checked here and a call is judged on its JSON
//! and its function name only ([`JUDGES_SCHEMAS`] tells which build this is).

use serde_json::value::RawValue;

/// Whether this build judges tool calls against their schemas (feature `tool-schema`).
pub const JUDGES_SCHEMAS: bool = cfg!(feature = "tool-schema");

#[cfg(feature = "tool-schema")]
pub(super) use judged::Schema;
#[cfg(not(feature = "tool-schema"))]
pub(super) use unjudged::Schema;

#[cfg(not(feature = "tool-schema"))]
mod unjudged {
    use super::RawValue;

    /// No validator in this build.
    #[derive(Debug)]
    pub struct Schema;

    impl Schema {
        pub fn new() -> Self {
            Schema
        }

        /// Never a violation: the schema is not checked in this build.
        pub fn violation(
            &self,
            _parameters: Option<&RawValue>,
            _arguments: &str,
        ) -> Option<String> {
            None
        }
    }
}

#[cfg(feature = "tool-schema")]
mod judged {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock, PoisonError};

    use serde_json::Value;

    use super::RawValue;

    /// Schemas longer than this (as JSON text) are compiled for their request only.
    const MAX_CACHED_SCHEMA: usize = 16 * 1024;
    /// Compiled schemas kept (full: the cache is emptied and starts again).
    const MAX_CACHED_SCHEMAS: usize = 64;

    /// One function's validator, found on first use (only requests that got a tool call pay
    /// for it).
    #[derive(Debug, Default)]
    pub struct Schema {
        validator: OnceLock<Option<Arc<jsonschema::Validator>>>,
    }

    impl Schema {
        pub fn new() -> Self {
            Self::default()
        }

        /// The first violation of `arguments` (JSON text) against `parameters` (absent: any
        /// JSON value): path and message, unbounded. A schema that does not compile cannot be
        /// broken.
        pub fn violation(&self, parameters: Option<&RawValue>, arguments: &str) -> Option<String> {
            // JSON by grammar that serde_json still refuses (a number past f64's range, as
            // the tiny model wrote in a real capture): JSON that no schema of finite numbers
            // accepts.
            let args: Value = match serde_json::from_str(arguments) {
                Ok(v) => v,
                Err(e) => return Some(format!("/: {e}")),
            };
            let v = self.validator.get_or_init(|| compiled(parameters?));
            let first = v.as_ref()?.iter_errors(&args).next()?;
            let path = first.instance_path().to_string();
            let path = if path.is_empty() { "/" } else { &path };
            Some(format!("{path}: {first}"))
        }

        /// The compiled validator, once a call was judged (for the cache's tests).
        #[cfg(test)]
        pub fn compiled(&self) -> Option<Arc<jsonschema::Validator>> {
            self.validator.get().cloned().flatten()
        }
    }

    /// The validator of a `parameters` schema (`None`: it is not JSON or does not compile),
    /// shared by the requests that write the same schema. Every request carries its own
    /// `tools`, but agents send the same few schemas again and again, and compiling one cost
    /// about 51,000 instructions (a two-property object schema, BENCHMARKS.md "Agent traffic
    /// cost"), most of what judging a call costs; a hit costs a hash of the schema's text and
    /// a lookup. Bounded by [`MAX_CACHED_SCHEMAS`] entries of at most [`MAX_CACHED_SCHEMA`]
    /// bytes; compiled outside the lock.
    fn compiled(parameters: &RawValue) -> Option<Arc<jsonschema::Validator>> {
        type Cache = Mutex<HashMap<String, Option<Arc<jsonschema::Validator>>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let compile = || {
            let schema: Value = serde_json::from_str(parameters.get()).ok()?;
            jsonschema::validator_for(&schema).ok().map(Arc::new)
        };
        let key = parameters.get();
        if key.len() > MAX_CACHED_SCHEMA {
            return compile();
        }
        let cache = CACHE.get_or_init(Cache::default);
        let lock = || cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = lock().get(key) {
            return v.clone();
        }
        let v = compile();
        let mut c = lock();
        if c.len() >= MAX_CACHED_SCHEMAS {
            c.clear();
        }
        c.insert(key.to_string(), v.clone());
        v
    }
}
