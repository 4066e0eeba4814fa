//! The scaler loop's decision, pure: the replica count a Kubernetes HPA would set from one
//! signal read off the proxy's `/metrics`, with the HPA's rules (ratio to a per-replica target,
//! 10% tolerance, scale up at once but by at most 4 replicas or 100% a period, whichever is
//! more: the default scale-up policies of `autoscaling/v2`; scale down only to the highest
//! count wanted over the stabilization window; min/max).

use goodput_measure::prom::{self, Family};
use serde::Serialize;

/// What the scaler reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// Engines' waiting queues (`goodput_proxy_upstream_queue_depth`), per replica.
    Queue,
    /// `goodput_proxy_demand` (in flight + queues), per replica.
    Demand,
    /// `goodput_proxy_upstream_tokens_in_flight` (every token of the requests in flight), per
    /// replica.
    Tokens,
    /// `goodput_proxy_upstream_tokens_pending` (both phases: prompt tokens still to prefill,
    /// output tokens still to come), per replica.
    Pending,
    /// `goodput_proxy_desired_replicas{model}`, read as the replica count.
    Desired,
}

impl Signal {
    pub const ALL: [Signal; 5] = [
        Signal::Queue,
        Signal::Demand,
        Signal::Tokens,
        Signal::Pending,
        Signal::Desired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Queue => "queue",
            Signal::Demand => "demand",
            Signal::Tokens => "tokens",
            Signal::Pending => "pending",
            Signal::Desired => "desired",
        }
    }

    /// The metric the HPA would read, for the report.
    pub fn metric(self) -> &'static str {
        match self {
            Signal::Queue => "sum(goodput_proxy_upstream_queue_depth)",
            Signal::Demand => "goodput_proxy_demand",
            Signal::Tokens => "sum(goodput_proxy_upstream_tokens_in_flight)",
            Signal::Pending => "sum(goodput_proxy_upstream_tokens_pending)",
            Signal::Desired => "goodput_proxy_desired_replicas",
        }
    }

    /// The signal's total value on one `/metrics` page; `None` when the page has no series.
    pub fn read(self, families: &[Family], model: &str) -> Option<f64> {
        match self {
            Signal::Queue => prom::sum(families, "goodput_proxy_upstream_queue_depth", &[]).ok(),
            Signal::Demand => prom::sum(families, "goodput_proxy_demand", &[]).ok(),
            Signal::Tokens => {
                prom::sum(families, "goodput_proxy_upstream_tokens_in_flight", &[]).ok()
            }
            Signal::Pending => {
                prom::sum(families, "goodput_proxy_upstream_tokens_pending", &[]).ok()
            }
            Signal::Desired => prom::sum(
                families,
                "goodput_proxy_desired_replicas",
                &[("model", model)],
            )
            .ok(),
        }
    }
}

/// The HPA's rules, with a per-replica target for the signal.
#[derive(Debug, Clone, Serialize)]
pub struct Hpa {
    /// Per-replica target value (`AverageValue`); 1 for `desired`.
    pub target: f64,
    pub min: usize,
    pub max: usize,
    /// Scale down only to the highest count wanted over this long (seconds).
    pub stabilization_down: f64,
    /// Within this ratio of the current count, nothing changes.
    pub tolerance: f64,
    /// Recent wishes: (time, replicas).
    #[serde(skip)]
    wishes: Vec<(f64, usize)>,
}

impl Hpa {
    pub fn new(target: f64, min: usize, max: usize, stabilization_down: f64) -> Self {
        Hpa {
            target,
            min,
            max,
            stabilization_down,
            tolerance: 0.1,
            wishes: Vec::new(),
        }
    }

    /// The replica count to run at `now`, given the signal's total `value` (`None`: no data,
    /// nothing changes) and the `current` count.
    pub fn decide(&mut self, now: f64, value: Option<f64>, current: usize) -> usize {
        let Some(value) = value.filter(|v| v.is_finite() && *v >= 0.0) else {
            return current;
        };
        let current = current.max(1);
        let ratio = value / self.target / current as f64;
        let wanted = if (ratio - 1.0).abs() <= self.tolerance {
            current
        } else {
            (value / self.target).ceil() as usize
        }
        .clamp(self.min, self.max);
        // The HPA remembers what the metric asked for; the rate limit applies to what it sets.
        self.wishes.push((now, wanted));
        let since = now - self.stabilization_down;
        self.wishes.retain(|w| w.0 >= since);
        let highest = self.wishes.iter().map(|w| w.1).max().unwrap_or(wanted);
        if wanted >= current {
            wanted.min(scale_up_limit(current))
        } else {
            highest.min(current)
        }
    }
}

/// The most replicas an HPA sets one period after running `current`: its default scale-up
/// policies (`autoscaling/v2`, also when `behavior.scaleUp` sets only the stabilization
/// window) allow 4 more or twice as many, whichever is more. The scaler decides once a
/// period, so each decision starts a period.
fn scale_up_limit(current: usize) -> usize {
    (current + 4).max(current * 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpa_rules() {
        let mut h = Hpa::new(4.0, 1, 10, 100.0);
        // (now, value, current, expected)
        let steps: &[(f64, Option<f64>, usize, usize)] = &[
            (0.0, None, 2, 2),
            (1.0, Some(8.4), 2, 2),  // within 10%
            (2.0, Some(20.0), 2, 5), // up at once
            (3.0, Some(4.0), 5, 5),  // down held by the window (5 wanted at 2 s)
            (103.0, Some(4.0), 5, 1),
            (104.0, Some(1000.0), 6, 10), // max
            // Up by at most 4 or 100% a period, whichever is more.
            (105.0, Some(1000.0), 1, 5),
            (106.0, Some(1000.0), 5, 10),
            (107.0, Some(8.0 * 4.0), 3, 7),
        ];
        for &(now, v, cur, want) in steps {
            assert_eq!(h.decide(now, v, cur), want, "at {now}");
        }
    }

    #[test]
    fn signals_read_their_series() {
        let page = "goodput_proxy_upstream_queue_depth{upstream=\"a\"} 2\n\
                    goodput_proxy_upstream_queue_depth{upstream=\"b\"} 3\n\
                    goodput_proxy_demand 9\n\
                    goodput_proxy_upstream_tokens_pending{upstream=\"a\",phase=\"prefill\"} 300\n\
                    goodput_proxy_upstream_tokens_pending{upstream=\"a\",phase=\"decode\"} 40\n\
                    goodput_proxy_desired_replicas{model=\"m\"} 2.5\n";
        let f = prom::parse(page).unwrap();
        assert_eq!(Signal::Queue.read(&f, "m"), Some(5.0));
        assert_eq!(Signal::Demand.read(&f, "m"), Some(9.0));
        assert_eq!(Signal::Desired.read(&f, "m"), Some(2.5));
        assert_eq!(Signal::Desired.read(&f, "x"), None);
        assert_eq!(Signal::Tokens.read(&f, "m"), None);
        assert_eq!(Signal::Pending.read(&f, "m"), Some(340.0));
    }
}
