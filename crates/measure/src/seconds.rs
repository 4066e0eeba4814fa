//! Durations stored as seconds: the record's JSON (and so the JSONL sink and ClickHouse rows)
//! carries every duration as an `f64` number of seconds (`Duration::as_secs_f64`), while the
//! measurement holds `Duration`s. Reading back rounds to whole nanoseconds, which recovers the
//! written `Duration` exactly for anything under ~10^6 s (see `sink/row.rs` on nanoseconds).
//! Used as `#[serde(with = "crate::seconds::...")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

fn from_secs(s: f64) -> Duration {
    if s.is_finite() && s > 0.0 {
        Duration::from_nanos((s * 1e9).round().min(u64::MAX as f64) as u64)
    } else {
        Duration::ZERO
    }
}

/// `Duration` <-> seconds.
pub mod one {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        f64::deserialize(d).map(from_secs)
    }
}

/// `Option<Duration>` <-> seconds or `null`.
pub mod opt {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<f64>::deserialize(d).map(|s| s.map(from_secs))
    }
}

/// A list of durations <-> a list of seconds.
pub mod list {
    use super::*;
    use serde::ser::SerializeSeq;

    pub fn serialize<S: Serializer>(ds: &[Duration], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(ds.len()))?;
        for d in ds {
            seq.serialize_element(&d.as_secs_f64())?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<[Duration]>, D::Error> {
        Vec::<f64>::deserialize(d).map(|v| v.into_iter().map(from_secs).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_read_back_as_the_same_whole_nanoseconds() {
        for ns in [0u64, 1, 999, 250_000_001, 1_234_567_891, 86_400_000_000_001] {
            let d = Duration::from_nanos(ns);
            assert_eq!(from_secs(d.as_secs_f64()), d, "{ns}");
        }
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(from_secs(bad), Duration::ZERO, "{bad}");
        }
    }
}
