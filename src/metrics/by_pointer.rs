//! Values by label value, the first few found by the pointer of the caller's `Arc<str>`.
//!
//! A label value is one `Arc` for every request of its model (tenant, replica): the label sets
//! hand out clones of the `Arc` they keep, and forwarding names a replica by its own URL
//! `Arc`. Comparing pointers finds such a key's value without hashing its text. The first
//! [`BY_POINTER`] `Arc`s a key was found or inserted with are kept with its value (held, so
//! that their address is never another text's); any other `Arc` of a known text is found by
//! the hash, as before.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, RwLock};

use foldhash::fast::FixedState;

/// `Arc`s kept by pointer (a proxy serves a few models, tenants and replicas).
const BY_POINTER: usize = 8;

/// See the module docs. Keys come from bounded label sets, never from a request's own bytes: a
/// fixed-seed fast hash is enough.
#[derive(Debug)]
pub(super) struct ByLabel<V: ?Sized> {
    by_text: HashMap<Arc<str>, Arc<V>, FixedState>,
    by_pointer: Vec<(Arc<str>, Arc<V>)>,
    /// How many `Arc`s are kept by pointer (0: always by the hash, the reference the tests
    /// hold the fast path to).
    by_pointer_max: usize,
}

impl<V: ?Sized> Default for ByLabel<V> {
    fn default() -> Self {
        Self::with_keys_by_pointer(BY_POINTER)
    }
}

/// How [`ByLabel::find`] found a value.
pub(super) enum Found<'a, V: ?Sized> {
    /// By the pointer of the `Arc` asked with.
    ByPointer(&'a Arc<V>),
    /// By the text; `remember`: the `Arc` asked with may be kept by pointer
    /// ([`ByLabel::remember`]).
    ByText {
        value: &'a Arc<V>,
        remember: bool,
    },
    Missing,
}

impl<V: ?Sized> ByLabel<V> {
    pub(super) fn with_keys_by_pointer(n: usize) -> Self {
        Self {
            by_text: HashMap::default(),
            by_pointer: Vec::new(),
            by_pointer_max: n,
        }
    }

    /// The value of `key`: by its pointer when it is a kept `Arc`, else by its text.
    #[inline]
    pub(super) fn find(&self, key: &Arc<str>) -> Found<'_, V> {
        if let Some((_, v)) = self.by_pointer.iter().find(|(k, _)| Arc::ptr_eq(k, key)) {
            return Found::ByPointer(v);
        }
        match self.by_text.get(&**key) {
            Some(value) => Found::ByText {
                value,
                remember: self.by_pointer.len() < self.by_pointer_max,
            },
            None => Found::Missing,
        }
    }

    /// The value of `key`, by pointer or text.
    #[cfg(test)]
    fn get(&self, key: &Arc<str>) -> Option<&Arc<V>> {
        match self.find(key) {
            Found::ByPointer(v) | Found::ByText { value: v, .. } => Some(v),
            Found::Missing => None,
        }
    }

    /// The value of the text `key` (by the hash).
    pub(super) fn by_text(&self, key: &str) -> Option<&Arc<V>> {
        self.by_text.get(key)
    }

    /// Keeps `key` (an `Arc` of a known text) by its pointer while there is room.
    pub(super) fn remember(&mut self, key: &Arc<str>) {
        if self.by_pointer.len() >= self.by_pointer_max
            || self.by_pointer.iter().any(|(k, _)| Arc::ptr_eq(k, key))
        {
            return;
        }
        if let Some(v) = self.by_text.get(&**key) {
            let v = v.clone();
            self.by_pointer.push((key.clone(), v));
        }
    }

    /// The value of `key`, else `v` inserted as its value (and `key` kept by pointer while
    /// there is room).
    pub(super) fn get_or_insert(&mut self, key: &Arc<str>, v: Arc<V>) -> Arc<V> {
        if let Some(old) = self.by_text.get(&**key) {
            return old.clone();
        }
        self.by_text.insert(key.clone(), v.clone());
        self.remember(key);
        v
    }

    /// Inserts `key` with `v` unless the text is known (then its value stays).
    pub(super) fn insert_new(&mut self, key: Arc<str>, v: Arc<V>) -> bool {
        if self.by_text.contains_key(&*key) {
            return false;
        }
        self.by_text.insert(key, v);
        true
    }

    pub(super) fn contains<Q: ?Sized + Hash + Eq>(&self, key: &Q) -> bool
    where
        Arc<str>: Borrow<Q>,
    {
        self.by_text.contains_key(key)
    }

    pub(super) fn len(&self) -> usize {
        self.by_text.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<V>)> {
        self.by_text.iter()
    }
}

/// The value of `key` in `map`: found by pointer under the read lock (kept by pointer under
/// the write lock when it was found by its text and there is room); else `make()`'s, inserted
/// (the first writer wins). `None` only when `make` is `None` and the key is unknown. A
/// poisoned lock only costs the caching.
pub(super) fn find_or_make<V: ?Sized>(
    map: &RwLock<ByLabel<V>>,
    key: &Arc<str>,
    make: impl FnOnce() -> Arc<V>,
) -> Arc<V> {
    let found = match map.read() {
        Ok(m) => match m.find(key) {
            Found::ByPointer(v) => return v.clone(),
            Found::ByText { value, remember } => Some((value.clone(), remember)),
            Found::Missing => None,
        },
        Err(_) => None,
    };
    match found {
        Some((v, false)) => v,
        Some((v, true)) => {
            if let Ok(mut m) = map.write() {
                m.remember(key);
            }
            v
        }
        None => {
            let v = make();
            match map.write() {
                Ok(mut m) => m.get_or_insert(key, v),
                Err(_) => v,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Keys found by pointer are found as by their text: any sequence of look-ups (with
        /// and without inserting) with keys of one text in several `Arc`s, more keys than the
        /// pointer list holds, the same value at every step as the map that always hashes.
        #[test]
        fn keys_by_pointer_are_found_as_by_text(
            ops in proptest::collection::vec((0usize..12, 0usize..3, 0u8..3), 1..200),
            max in 0usize..10,
        ) {
            let keys: Vec<[Arc<str>; 3]> = (0..12)
                .map(|i| {
                    let t = format!("m{i}");
                    [Arc::from(t.as_str()), Arc::from(t.as_str()), Arc::from(t.as_str())]
                })
                .collect();
            let fast = RwLock::new(ByLabel::with_keys_by_pointer(max));
            let plain = RwLock::new(ByLabel::with_keys_by_pointer(0));
            for (step, (k, copy, op)) in ops.into_iter().enumerate() {
                let key = &keys[k][copy];
                let (a, b) = match op {
                    0 => (
                        fast.read().unwrap().get(key).map(|v| **v),
                        plain.read().unwrap().get(key).map(|v| **v),
                    ),
                    1 => (
                        Some(*find_or_make(&fast, key, || Arc::new(step))),
                        Some(*find_or_make(&plain, key, || Arc::new(step))),
                    ),
                    _ => {
                        fast.write().unwrap().remember(key);
                        plain.write().unwrap().remember(key);
                        (None, None)
                    }
                };
                prop_assert_eq!(a, b);
                let (f, p) = (fast.read().unwrap(), plain.read().unwrap());
                prop_assert_eq!(f.len(), p.len());
                prop_assert!(f.by_pointer.len() <= max);
                prop_assert!(p.by_pointer.is_empty());
                // Every kept pointer is its text's key, with that key's value.
                for (k, v) in &f.by_pointer {
                    prop_assert!(Arc::ptr_eq(f.by_text.get(&**k).unwrap(), v));
                }
            }
        }
    }

    /// A key's own `Arc` is found by pointer once inserted or found by its text, another `Arc`
    /// of its text by the hash until it is remembered too.
    #[test]
    fn arcs_are_found_by_pointer_once_seen() {
        let own: Arc<str> = Arc::from("tiny");
        let other: Arc<str> = Arc::from("tiny");
        let m = RwLock::new(ByLabel::default());
        let v = find_or_make(&m, &own, || Arc::new(7));
        assert!(matches!(m.read().unwrap().find(&own), Found::ByPointer(_)));
        assert!(matches!(
            m.read().unwrap().find(&other),
            Found::ByText { remember: true, .. }
        ));
        assert!(Arc::ptr_eq(&find_or_make(&m, &other, || Arc::new(8)), &v));
        assert!(matches!(
            m.read().unwrap().find(&other),
            Found::ByPointer(_)
        ));
        assert!(matches!(
            m.read().unwrap().find(&Arc::from("small")),
            Found::Missing
        ));
    }
}
