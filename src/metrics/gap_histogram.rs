//! The ITL family's series: prometheus's [`Histogram`], with zero gaps counted beside it.
//!
//! Events an engine packs into one read are served to the client at one instant: every gap
//! between them is zero, and a packed stream closes dozens of them in one frame. Observing a
//! zero is the same for each (the first bucket and every one above it, the count, a sum that
//! stays as it was), so a zero is counted, not observed: the request's [`GapBuffer`] adds one
//! to an integer and, when it flushes, adds the total to the series' zero count in one atomic
//! add. The series' exposition is the histogram's with the zeros added to every bucket and to
//! the count: what observing each of them would have made (`tests` below compare the two).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::core::{Metric, MetricVec, MetricVecBuilder};
use prometheus::local::LocalHistogram;
use prometheus::{proto, Histogram, HistogramOpts};

/// One series of the ITL family (see the module docs).
#[derive(Clone, Debug)]
pub struct GapHistogram {
    inner: Histogram,
    zeros: Arc<AtomicU64>,
}

impl GapHistogram {
    /// One gap, observed now (no buffer).
    pub fn observe(&self, gap: Duration) {
        if gap.is_zero() {
            self.zeros.fetch_add(1, Ordering::Relaxed);
        } else {
            self.inner.observe(gap.as_secs_f64());
        }
    }

    /// A buffer for one request's gaps (see [`GapBuffer`]).
    pub fn buffer(&self) -> GapBuffer {
        GapBuffer {
            series: self.clone(),
            local: None,
            zeros: 0,
        }
    }

    /// Observations so far, the zeros included.
    pub fn sample_count(&self) -> u64 {
        self.inner.get_sample_count() + self.zeros.load(Ordering::Relaxed)
    }
}

impl Metric for GapHistogram {
    fn metric(&self) -> proto::Metric {
        let mut m = self.inner.metric();
        let zeros = self.zeros.load(Ordering::Relaxed);
        if zeros > 0 {
            let mut h = m.get_histogram().clone();
            let buckets = h
                .get_bucket()
                .iter()
                .map(|b| {
                    let mut b = b.clone();
                    if b.upper_bound() >= 0.0 {
                        b.set_cumulative_count(b.cumulative_count() + zeros);
                    }
                    b
                })
                .collect();
            h.set_bucket(buckets);
            h.set_sample_count(h.get_sample_count() + zeros);
            m.set_histogram(h);
        }
        m
    }
}

/// One request's gaps on their way to a [`GapHistogram`]: zeros counted, the others in a
/// [`LocalHistogram`]; both reach the series on [`GapBuffer::flush`] and when dropped. The local
/// histogram (an allocation, and a flush over every bucket) is made at the first gap that is
/// not zero: a stream whose events all came packed in one read has none.
#[derive(Debug)]
pub struct GapBuffer {
    series: GapHistogram,
    local: Option<LocalHistogram>,
    zeros: u64,
}

impl GapBuffer {
    #[inline]
    pub fn observe(&mut self, gap: Duration) {
        if gap.is_zero() {
            self.zeros += 1;
        } else {
            let series = &self.series.inner;
            self.local
                .get_or_insert_with(|| series.local())
                .observe(gap.as_secs_f64());
        }
    }

    /// `n` zero gaps.
    #[inline]
    pub fn observe_zeros(&mut self, n: u64) {
        self.zeros += n;
    }

    pub fn flush(&mut self) {
        if let Some(local) = &self.local {
            local.flush();
        }
        if self.zeros > 0 {
            self.series.zeros.fetch_add(self.zeros, Ordering::Relaxed);
            self.zeros = 0;
        }
    }
}

impl Drop for GapBuffer {
    fn drop(&mut self) {
        self.flush(); // the local histogram flushes itself too; flushing twice adds nothing
    }
}

/// Builds a family's [`GapHistogram`]s: each series a histogram whose label values are its
/// constant labels (the same label pairs, sorted by name, as a `HistogramVec`'s series has).
#[derive(Clone, Debug)]
pub struct GapHistogramBuilder;

impl MetricVecBuilder for GapHistogramBuilder {
    type M = GapHistogram;
    type P = HistogramOpts;

    fn build<V: AsRef<str>>(
        &self,
        opts: &HistogramOpts,
        vals: &[V],
    ) -> prometheus::Result<GapHistogram> {
        let mut one = opts.clone();
        let names = std::mem::take(&mut one.common_opts.variable_labels);
        if names.len() != vals.len() {
            return Err(prometheus::Error::InconsistentCardinality {
                expect: names.len(),
                got: vals.len(),
            });
        }
        for (name, value) in names.into_iter().zip(vals) {
            one.common_opts
                .const_labels
                .insert(name, value.as_ref().to_owned());
        }
        Ok(GapHistogram {
            inner: Histogram::with_opts(one)?,
            zeros: Arc::default(),
        })
    }
}

/// A family of [`GapHistogram`]s.
pub type GapHistogramVec = MetricVec<GapHistogramBuilder>;

/// A [`GapHistogramVec`] labelled by `label_names` (as `HistogramVec::new`).
pub fn gap_histogram_vec(
    opts: HistogramOpts,
    label_names: &[&str],
) -> prometheus::Result<GapHistogramVec> {
    let opts = opts.variable_labels(label_names.iter().map(|s| (*s).to_owned()).collect());
    MetricVec::create(proto::MetricType::HISTOGRAM, GapHistogramBuilder, opts)
}

#[cfg(test)]
mod tests {
    use prometheus::{HistogramVec, Registry};

    use super::*;
    use crate::metrics::TPOT_BUCKETS;

    fn text(r: &Registry) -> String {
        crate::metrics::exposition_text(r)
    }

    fn opts() -> HistogramOpts {
        HistogramOpts::new("gaps_seconds", "Gaps.").buckets(TPOT_BUCKETS.to_vec())
    }

    /// The same gaps, in buffers flushed at the same points, through a `HistogramVec` of plain
    /// histograms and through the gap family: the same exposition, byte for byte.
    #[test]
    fn zeros_counted_expose_as_zeros_observed() {
        let ms = Duration::from_millis;
        let cases: Vec<Vec<Duration>> = vec![
            vec![],
            vec![Duration::ZERO],
            vec![Duration::ZERO; 70],
            vec![ms(3), Duration::ZERO, ms(12), Duration::ZERO, ms(100_000)],
            (0..200)
                .map(|i| if i % 3 == 0 { ms(i) } else { Duration::ZERO })
                .collect(),
            vec![Duration::from_nanos(1), Duration::ZERO, ms(10), ms(11)],
        ];
        for (k, gaps) in cases.iter().enumerate() {
            let (plain_reg, gap_reg) = (Registry::new(), Registry::new());
            let plain = HistogramVec::new(opts(), &["model", "upstream"]).unwrap();
            let fam = gap_histogram_vec(opts(), &["model", "upstream"]).unwrap();
            plain_reg.register(Box::new(plain.clone())).unwrap();
            gap_reg.register(Box::new(fam.clone())).unwrap();
            for series in [["m", "u"], ["m", "v"]] {
                let (p, g) = (
                    plain.with_label_values(&series),
                    fam.with_label_values(&series),
                );
                let local = p.local();
                let mut buf = g.buffer();
                for (i, gap) in gaps.iter().enumerate() {
                    local.observe(gap.as_secs_f64());
                    buf.observe(*gap);
                    if i % 32 == 31 {
                        local.flush();
                        buf.flush();
                    }
                }
                // Unbuffered too, and a run of zeros taken at once.
                p.observe(0.0);
                g.observe(Duration::ZERO);
                for _ in 0..5 {
                    local.observe(0.0);
                }
                buf.observe_zeros(5);
                drop((local, buf));
                assert_eq!(p.get_sample_count(), g.sample_count(), "case {k}");
            }
            assert_eq!(text(&plain_reg), text(&gap_reg), "case {k}");
        }
    }

    #[test]
    fn a_series_takes_as_many_values_as_the_family_has_labels() {
        let fam = gap_histogram_vec(opts(), &["model"]).unwrap();
        assert!(fam.get_metric_with_label_values(&["a", "b"]).is_err());
        assert!(fam.get_metric_with_label_values(&["a"]).is_ok());
    }
}
