//! The shape of [`RawConfig`], read from its `Deserialize` impl: every field's dotted path and
//! the kind of value serde asks for there. Environment overrides are named and typed from it,
//! so a new field is overridable the moment it exists (no list to keep).
//!
//! How: [`RawConfig::deserialize`] is driven by a deserializer that answers every request with
//! an empty value (0, "", [], the first enum variant) and writes down what was asked. A field
//! whose type refuses the empty value (a `SocketAddr` refuses "") aborts the walk; it is noted,
//! left out of the next walk (its struct's default fills it), and the walk starts again.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use serde::de::value::{Error, StrDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::raw::RawConfig;

/// What serde asked for at one path (an `Option` is its inner kind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A table with these fields.
    Struct(Vec<&'static str>),
    /// A table of any keys (e.g. `slo.models`).
    Map,
    Seq,
    Bool,
    Int,
    Float,
    Str,
    /// One of these names.
    Enum,
    /// A self-describing value (number or string, e.g. a limit: `5000` or `"none"`).
    Any,
    /// Something no environment string can be (unit, bytes).
    Other,
}

/// Every path of the config and its kind.
pub fn schema() -> &'static BTreeMap<String, Kind> {
    static SCHEMA: OnceLock<BTreeMap<String, Kind>> = OnceLock::new();
    SCHEMA.get_or_init(trace)
}

#[derive(Default)]
struct Walk {
    kinds: BTreeMap<String, Kind>,
    skip: BTreeSet<String>,
    /// The innermost path whose value failed in this walk.
    failed: Option<String>,
}

fn trace() -> BTreeMap<String, Kind> {
    let walk = RefCell::new(Walk::default());
    // Each failed walk skips one more leaf; there are fewer leaves than this.
    for _ in 0..1000 {
        let done = RawConfig::deserialize(Tracer {
            path: String::new(),
            walk: &walk,
        })
        .is_ok();
        let mut w = walk.borrow_mut();
        match w.failed.take() {
            Some(path) if !done => {
                w.skip.insert(path);
            }
            _ => break,
        }
    }
    walk.into_inner().kinds
}

struct Tracer<'a> {
    path: String,
    walk: &'a RefCell<Walk>,
}

impl Tracer<'_> {
    fn note(&self, kind: Kind) {
        self.walk.borrow_mut().kinds.insert(self.path.clone(), kind);
    }
}

macro_rules! leaf {
    ($($method:ident => $kind:expr, $visit:ident($($arg:expr)?);)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.note($kind);
            visitor.$visit($($arg)?)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Tracer<'_> {
    type Error = Error;

    leaf! {
        deserialize_any => Kind::Any, visit_u64(0);
        deserialize_bool => Kind::Bool, visit_bool(false);
        deserialize_i8 => Kind::Int, visit_i64(0);
        deserialize_i16 => Kind::Int, visit_i64(0);
        deserialize_i32 => Kind::Int, visit_i64(0);
        deserialize_i64 => Kind::Int, visit_i64(0);
        deserialize_u8 => Kind::Int, visit_u64(0);
        deserialize_u16 => Kind::Int, visit_u64(0);
        deserialize_u32 => Kind::Int, visit_u64(0);
        deserialize_u64 => Kind::Int, visit_u64(0);
        deserialize_f32 => Kind::Float, visit_f64(0.0);
        deserialize_f64 => Kind::Float, visit_f64(0.0);
        deserialize_char => Kind::Str, visit_str("");
        deserialize_str => Kind::Str, visit_str("");
        deserialize_string => Kind::Str, visit_str("");
        deserialize_bytes => Kind::Other, visit_bytes(&[]);
        deserialize_byte_buf => Kind::Other, visit_bytes(&[]);
        deserialize_unit => Kind::Other, visit_unit();
        deserialize_identifier => Kind::Str, visit_str("");
        deserialize_ignored_any => Kind::Other, visit_unit();
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.note(Kind::Seq);
        visitor.visit_seq(Empty)
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.note(Kind::Map);
        visitor.visit_map(Empty)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.note(Kind::Struct(fields.to_vec()));
        let fields: Vec<&'static str> = {
            let walk = self.walk.borrow();
            fields
                .iter()
                .copied()
                .filter(|f| !walk.skip.contains(&join(&self.path, f)))
                .collect()
        };
        visitor.visit_map(Fields {
            fields: fields.into_iter(),
            current: None,
            tracer: &self,
        })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.note(Kind::Enum);
        let first: StrDeserializer<Error> =
            variants.first().copied().unwrap_or("").into_deserializer();
        visitor.visit_enum(first)
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// An empty sequence or map.
struct Empty;

impl<'de> SeqAccess<'de> for Empty {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        _: T,
    ) -> Result<Option<T::Value>, Error> {
        Ok(None)
    }
}

impl<'de> MapAccess<'de> for Empty {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, _: K) -> Result<Option<K::Value>, Error> {
        Ok(None)
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, _: T) -> Result<T::Value, Error> {
        Err(de::Error::custom("no value"))
    }
}

/// A struct's fields, each with a tracer one level down as its value.
struct Fields<'t, 'a> {
    fields: std::vec::IntoIter<&'static str>,
    current: Option<&'static str>,
    tracer: &'t Tracer<'a>,
}

impl<'de> MapAccess<'de> for Fields<'_, '_> {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        self.current = self.fields.next();
        match self.current {
            Some(f) => seed.deserialize(f.into_deserializer()).map(Some),
            None => Ok(None),
        }
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, Error> {
        let path = join(&self.tracer.path, self.current.unwrap_or(""));
        let walk = self.tracer.walk;
        seed.deserialize(Tracer {
            path: path.clone(),
            walk,
        })
        .inspect_err(|_| {
            let mut w = walk.borrow_mut();
            if w.failed.is_none() {
                w.failed = Some(path);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_section_and_field_is_found() {
        let s = schema();
        for (path, want) in [
            ("server", Kind::Struct(vec![])),
            ("server.listen", Kind::Str),
            ("server.admin_listen", Kind::Str),
            ("server.max_in_flight", Kind::Int),
            ("server.tls_cert", Kind::Str),
            ("server.paths", Kind::Seq),
            ("upstream.total_timeout_ms", Kind::Any),
            ("measure.enabled", Kind::Bool),
            ("measure.usage_injection", Kind::Enum),
            ("slo.models", Kind::Map),
            ("sink.clickhouse.url", Kind::Str),
            ("sink.clickhouse.max_attempts", Kind::Int),
            ("sim.ttft_ms", Kind::Float),
        ] {
            let got = s.get(path);
            match (&want, got) {
                (Kind::Struct(_), Some(Kind::Struct(fields))) => assert!(!fields.is_empty()),
                _ => assert_eq!(got, Some(&want), "{path}"),
            }
        }
        assert!(!s.contains_key("server.nope"));
    }
}
