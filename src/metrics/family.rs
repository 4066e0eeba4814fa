//! A metric family, declared once: [`Registrar`] creates and registers it in one expression,
//! and its series are named by a typed label set ([`LabelSet`], the sets are in `labels.rs`),
//! never by a positional list of strings. The label names and the order of the values are
//! written once, in the label set's impl, so a family cannot be read with another family's
//! labels or with two values swapped.

use std::marker::PhantomData;

use super::gap_histogram::{gap_histogram_vec, GapHistogramVec};
use prometheus::core::{Atomic, Collector, GenericGaugeVec, MetricVec, MetricVecBuilder};
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// The labels of a family: their names, and the values of one series in the same order. A
/// family is declared with the set's `'static` form (`Counters<Served<'static>>`) and read with
/// values borrowed for the call (`Served { model: &m, .. }`, its [`LabelSet::Series`]).
pub trait LabelSet {
    /// The label names, in order.
    const NAMES: &'static [&'static str];
    /// One series' values, borrowed for `'a`.
    type Series<'a>;
    /// Calls `f` with a series' values, in the order of [`LabelSet::NAMES`] (a callback so that
    /// no per-call array or vector is built).
    fn with_values<R>(series: &Self::Series<'_>, f: impl FnOnce(&[&str]) -> R) -> R;
}

/// The one series of a family without labels.
impl LabelSet for () {
    const NAMES: &'static [&'static str] = &[];
    type Series<'a> = ();
    fn with_values<R>(_: &(), f: impl FnOnce(&[&str]) -> R) -> R {
        f(&[])
    }
}

/// A labelled family whose series are picked by label set `L`.
pub struct Family<L, V> {
    vec: V,
    labels: PhantomData<fn(&L)>,
}

impl<L, V: Clone> Clone for Family<L, V> {
    fn clone(&self) -> Self {
        Self {
            vec: self.vec.clone(),
            labels: PhantomData,
        }
    }
}

impl<L: LabelSet, B: MetricVecBuilder> Family<L, MetricVec<B>> {
    /// The series of `labels` (created at zero when first asked for).
    pub fn get(&self, labels: &L::Series<'_>) -> B::M {
        L::with_values(labels, |v| self.vec.with_label_values(v))
    }

    /// Removes the series of `labels` (an absent series: nothing to do).
    pub fn remove(&self, labels: &L::Series<'_>) {
        L::with_values(labels, |v| {
            let _ = self.vec.remove_label_values(v);
        });
    }
}

impl<L: LabelSet, P: Atomic> Family<L, GenericGaugeVec<P>> {
    /// Sets the series of `labels` to `v`, or removes it when there is no value: a reader sees
    /// "no data", never a made-up 0.
    pub fn set_or_remove(&self, labels: &L::Series<'_>, v: Option<P::T>) {
        match v {
            Some(v) => self.get(labels).set(v),
            None => self.remove(labels),
        }
    }
}

/// Counters (`u64`) labelled by `L`.
pub type Counters<L> = Family<L, IntCounterVec>;
/// Gauges (`f64`) labelled by `L`.
pub type Gauges<L> = Family<L, GaugeVec>;
/// Gauges (`i64`) labelled by `L`.
pub type IntGauges<L> = Family<L, IntGaugeVec>;
/// Histograms labelled by `L`.
pub type Histograms<L> = Family<L, HistogramVec>;
/// Histograms of gaps labelled by `L`, zero gaps counted beside them (`gap_histogram.rs`).
pub type GapHistograms<L> = Family<L, GapHistogramVec>;

/// Creates families and registers them on one registry: each family is one expression,
/// e.g. `r.counters::<Served>("goodput_proxy_x_total", "help")?`.
pub struct Registrar<'r> {
    registry: &'r Registry,
}

impl<'r> Registrar<'r> {
    pub fn new(registry: &'r Registry) -> Self {
        Self { registry }
    }

    pub fn counters<L: LabelSet>(
        &self,
        name: &str,
        help: &str,
    ) -> Result<Counters<L>, prometheus::Error> {
        self.family(IntCounterVec::new(Opts::new(name, help), L::NAMES)?)
    }

    pub fn gauges<L: LabelSet>(
        &self,
        name: &str,
        help: &str,
    ) -> Result<Gauges<L>, prometheus::Error> {
        self.family(GaugeVec::new(Opts::new(name, help), L::NAMES)?)
    }

    pub fn int_gauges<L: LabelSet>(
        &self,
        name: &str,
        help: &str,
    ) -> Result<IntGauges<L>, prometheus::Error> {
        self.family(IntGaugeVec::new(Opts::new(name, help), L::NAMES)?)
    }

    pub fn histograms<L: LabelSet>(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
    ) -> Result<Histograms<L>, prometheus::Error> {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.family(HistogramVec::new(opts, L::NAMES)?)
    }

    /// [`Registrar::histograms`] whose series count zero gaps apart (`gap_histogram.rs`).
    pub fn gap_histograms<L: LabelSet>(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
    ) -> Result<GapHistograms<L>, prometheus::Error> {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.family(gap_histogram_vec(opts, L::NAMES)?)
    }

    /// A histogram without labels.
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
    ) -> Result<Histogram, prometheus::Error> {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.single(Histogram::with_opts(opts)?)
    }

    /// A metric without labels (`IntCounter::new(..)?`, `Gauge::new(..)?`, ...), registered.
    pub fn single<C: Collector + Clone + 'static>(&self, c: C) -> Result<C, prometheus::Error> {
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn family<L, V: Collector + Clone + 'static>(
        &self,
        vec: V,
    ) -> Result<Family<L, V>, prometheus::Error> {
        Ok(Family {
            vec: self.single(vec)?,
            labels: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::labels::{Served, Sink};

    fn text(r: &Registry) -> String {
        crate::metrics::exposition_text(r)
    }

    #[test]
    fn a_family_is_declared_once_and_read_by_its_label_set() {
        let r = Registry::new();
        let reg = Registrar::new(&r);
        let g: Gauges<Served<'static>> = reg.gauges("g", "A gauge.").unwrap();
        let c: Counters<Sink> = reg.counters("c_total", "A counter.").unwrap();
        let served = Served {
            model: "m",
            upstream: "u",
        };
        g.set_or_remove(&served, Some(0.5));
        c.get(&Sink::Jsonl).inc();
        let t = text(&r);
        assert!(
            t.contains("# HELP g A gauge.\n# TYPE g gauge\ng{model=\"m\",upstream=\"u\"} 0.5\n"),
            "{t}"
        );
        assert!(t.contains("c_total{sink=\"jsonl\"} 1\n"), "{t}");
        // No value: the series goes (a reader sees no data, not 0); removing again is a no-op.
        g.set_or_remove(&served, None);
        g.remove(&served);
        assert!(!text(&r).contains("g{"), "{}", text(&r));
        // Registered once: a second family of the same name is refused.
        assert!(reg.gauges::<Served<'static>>("g", "Again.").is_err());
    }
}
