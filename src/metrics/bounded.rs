//! The bounded sets of label values: `model` ([`ModelLabels`]: configured + learned, else
//! `other`) and `upstream` ([`UpstreamLabels`]: configured or discovered replicas, capped;
//! `none` before a replica answered). Never a raw user value.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use foldhash::fast::FixedState;

use super::by_pointer::{ByLabel, Found};

/// The label sets are looked up for every request (with the request's model name too); they
/// hold only configured, learned or discovered values (bounded, never a request's), so a
/// fixed-seed fast hash is enough.
type Set = HashSet<Arc<str>, FixedState>;
/// Replica URL to its label (the replicas' own URL `Arc`s found by pointer).
type ByUrl = ByLabel<str>;

/// The label for any model not in the set.
pub const OTHER_MODEL: &str = "other";

/// Most models the label set learns (configured models always count): bounds series growth
/// even if an upstream's `/v1/models` lists thousands.
pub const MAX_LEARNED_MODELS: usize = 256;

/// The bounded set of `model` label values: configured models plus those learned from the
/// upstreams' `/v1/models`; everything else maps to `other`. Resolved once per request.
#[derive(Debug, Clone)]
pub struct ModelLabels {
    inner: Arc<RwLock<Labels>>,
    other: Arc<str>,
}

impl Default for ModelLabels {
    fn default() -> Self {
        Self::new(std::iter::empty::<&str>())
    }
}

#[derive(Debug, Default)]
struct Labels {
    configured: Set,
    learned: Set,
}

impl ModelLabels {
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(configured: I) -> Self {
        let configured = configured
            .into_iter()
            .map(|s| Arc::from(s.as_ref()))
            .collect();
        Self {
            inner: Arc::new(RwLock::new(Labels {
                configured,
                learned: Set::default(),
            })),
            other: Arc::from(OTHER_MODEL),
        }
    }

    /// Replace the learned models (from discovery); at most [`MAX_LEARNED_MODELS`] are kept.
    pub fn set_learned<I: IntoIterator<Item = S>, S: AsRef<str>>(&self, models: I) {
        let learned: Set = models
            .into_iter()
            .take(MAX_LEARNED_MODELS)
            .map(|s| Arc::from(s.as_ref()))
            .collect();
        if let Ok(mut l) = self.inner.write() {
            l.learned = learned;
        }
    }

    /// Add learned models (from discovery) without forgetting earlier ones, so a replica that
    /// is briefly down does not move its model's series to `other`; bounded by
    /// [`MAX_LEARNED_MODELS`]. Returns how many were new.
    pub fn add_learned<I: IntoIterator<Item = S>, S: AsRef<str>>(&self, models: I) -> usize {
        let Ok(mut l) = self.inner.write() else {
            return 0;
        };
        let mut added = 0;
        for m in models {
            let m = m.as_ref();
            if l.learned.len() >= MAX_LEARNED_MODELS {
                break;
            }
            if !l.configured.contains(m) && !l.learned.contains(m) {
                l.learned.insert(Arc::from(m));
                added += 1;
            }
        }
        added
    }

    /// The label value for a request's model name.
    pub fn resolve(&self, model: &str) -> Arc<str> {
        if let Ok(l) = self.inner.read() {
            if let Some(m) = l.configured.get(model).or_else(|| l.learned.get(model)) {
                return m.clone();
            }
        }
        self.other.clone()
    }

    pub fn contains(&self, model: &str) -> bool {
        self.inner
            .read()
            .map(|l| l.configured.contains(model) || l.learned.contains(model))
            .unwrap_or(false)
    }
}

/// The `upstream` label of a request no replica answered (connect failure, no head in time,
/// rejected before forwarding).
pub const NO_UPSTREAM: &str = "none";
/// The label for a replica beyond [`MAX_UPSTREAM_LABELS`].
pub const OTHER_UPSTREAM: &str = "other";
/// Most replicas with their own `upstream` label: discovery can add replicas for ever (each
/// rollout brings new pod IPs), the series count must not follow.
pub const MAX_UPSTREAM_LABELS: usize = 64;

/// The bounded map from a replica's URL (what forwarding reports in `ServedBy`) to its
/// `upstream` label value, the same value the engine families are relabelled with, so proxy
/// and engine series of one replica join on `upstream`. Entries are only added (a replica that
/// leaves keeps its label, so its series stay readable), at most [`MAX_UPSTREAM_LABELS`].
#[derive(Debug, Clone, Default)]
pub struct UpstreamLabels {
    inner: Arc<RwLock<ByUrl>>,
}

impl UpstreamLabels {
    /// Adds `(url, label)` pairs; a known URL keeps its first label. Returns how many were new.
    pub fn add<I, U, L>(&self, pairs: I) -> usize
    where
        I: IntoIterator<Item = (U, L)>,
        U: AsRef<str>,
        L: AsRef<str>,
    {
        let Ok(mut m) = self.inner.write() else {
            return 0;
        };
        let mut added = 0;
        for (url, label) in pairs {
            if m.len() >= MAX_UPSTREAM_LABELS {
                break;
            }
            if !m.contains(url.as_ref()) {
                m.insert_new(Arc::from(url.as_ref()), Arc::from(label.as_ref()));
                added += 1;
            }
        }
        added
    }

    /// The replica URLs labelled `label` (a label can only be one URL unless two replicas
    /// were given the same index label; an unknown label is taken as a URL).
    pub fn urls_of(&self, label: &str) -> Vec<String> {
        let Ok(m) = self.inner.read() else {
            return Vec::new();
        };
        let urls: Vec<String> = m
            .iter()
            .filter(|(_, l)| &***l == label)
            .map(|(u, _)| u.to_string())
            .collect();
        if urls.is_empty() && label != NO_UPSTREAM {
            vec![label.to_string()]
        } else {
            urls
        }
    }

    /// The label value for a replica URL: its own, else `other`.
    pub fn resolve(&self, url: &str) -> Arc<str> {
        self.inner
            .read()
            .ok()
            .and_then(|m| m.by_text(url).cloned())
            .unwrap_or_else(|| Arc::from(OTHER_UPSTREAM))
    }

    /// [`UpstreamLabels::resolve`] of the URL `Arc` a replica is named by (`ServedBy`): found
    /// by its pointer once seen (the replica's `Arc` is the same for every request it serves).
    pub fn resolve_served(&self, url: &Arc<str>) -> Arc<str> {
        let remember = match self.inner.read() {
            Ok(m) => match m.find(url) {
                Found::ByPointer(label) => return label.clone(),
                Found::ByText { value, remember } => Some((value.clone(), remember)),
                Found::Missing => None,
            },
            Err(_) => None,
        };
        match remember {
            Some((label, remember)) => {
                if remember {
                    if let Ok(mut m) = self.inner.write() {
                        m.remember(url);
                    }
                }
                label
            }
            None => Arc::from(OTHER_UPSTREAM),
        }
    }
}
