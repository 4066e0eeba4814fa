//! What the balancer and autoscalers read from an engine's `/metrics`: its waiting queue,
//! running batch and KV-cache usage. Pure: families in, numbers out.

use super::parse::Family;

/// vLLM V1 names; the v0 name of the KV-cache gauge is read too.
pub const WAITING: &str = "vllm:num_requests_waiting";
pub const RUNNING: &str = "vllm:num_requests_running";
pub const KV_CACHE: &str = "vllm:kv_cache_usage_perc";
pub const KV_CACHE_V0: &str = "vllm:gpu_cache_usage_perc";

/// One replica's engine signals; `None` where its page lacks the family (not a vLLM engine).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    /// Requests queued in the engine, summed over its series (`engine` = data-parallel ranks,
    /// `model_name` = served names).
    pub waiting: Option<f64>,
    /// Requests in the engine's running batch, summed likewise.
    pub running: Option<f64>,
    /// KV-cache usage 0..1, the fullest series (one full rank is what stalls admissions).
    pub kv_cache_usage: Option<f64>,
}

impl Signals {
    pub fn from_families(families: &[Family]) -> Signals {
        let values = |name: &str| {
            families
                .iter()
                .find(|f| f.name == name)
                .map(|f| f.samples.iter().map(|s| s.value).filter(|v| v.is_finite()))
        };
        let sum = |name: &str| values(name).map(|v| v.sum::<f64>().max(0.0));
        let max = |name: &str| values(name).and_then(|v| v.reduce(f64::max));
        Signals {
            waiting: sum(WAITING),
            running: sum(RUNNING),
            kv_cache_usage: max(KV_CACHE).or_else(|| max(KV_CACHE_V0)),
        }
    }

    /// The queue the balancer adds to in-flight: whole requests, 0 when unknown.
    pub fn queue(&self) -> usize {
        self.waiting.map_or(0, |w| w.round() as usize)
    }
}

/// `goodput_proxy_demand`: what the replicas are asked to carry now, for an autoscaler.
/// `in_flight` (this proxy's requests, all replicas) plus every fresh engine's waiting queue:
/// a backlog raises the signal beyond the requests themselves, which is what should add
/// replicas (an engine that keeps up has an empty queue, and demand = in-flight).
pub fn demand(in_flight: usize, queues: impl IntoIterator<Item = f64>) -> f64 {
    in_flight as f64 + queues.into_iter().filter(|q| q.is_finite()).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::parse::parse;

    #[test]
    fn signals_from_pages() {
        let cases: &[(&str, Signals)] = &[
            ("", Signals::default()),
            (
                "not_vllm 1\n",
                Signals {
                    waiting: None,
                    running: None,
                    kv_cache_usage: None,
                },
            ),
            (
                "vllm:num_requests_waiting{engine=\"0\"} 3.0\n\
                 vllm:num_requests_running{engine=\"0\"} 2.0\n\
                 vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n",
                Signals {
                    waiting: Some(3.0),
                    running: Some(2.0),
                    kv_cache_usage: Some(0.25),
                },
            ),
            // data-parallel ranks: queues add up, the fullest cache counts
            (
                "vllm:num_requests_waiting{engine=\"0\"} 3.0\n\
                 vllm:num_requests_waiting{engine=\"1\"} 4.0\n\
                 vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n\
                 vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n",
                Signals {
                    waiting: Some(7.0),
                    running: None,
                    kv_cache_usage: Some(0.75),
                },
            ),
            // vLLM v0 cache name; NaN ignored
            (
                "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_waiting NaN\n",
                Signals {
                    waiting: Some(0.0),
                    running: None,
                    kv_cache_usage: Some(0.5),
                },
            ),
        ];
        for (page, want) in cases {
            let s = Signals::from_families(&parse(page).unwrap());
            assert_eq!(&s, want, "{page:?}");
        }
    }

    #[test]
    fn the_real_capture_reads_idle() {
        let raw = include_str!("../../tests/sim_fixtures/vllm-0.32/metrics.txt");
        let body = &raw[raw.find("\r\n\r\n").unwrap() + 4..];
        let s = Signals::from_families(&parse(body).unwrap());
        assert_eq!(s.waiting, Some(0.0));
        assert_eq!(s.running, Some(0.0));
        assert_eq!(s.kv_cache_usage, Some(0.0));
        assert_eq!(s.queue(), 0);
    }

    #[test]
    fn queue_and_demand() {
        for (waiting, queue) in [(None, 0), (Some(0.0), 0), (Some(2.0), 2), (Some(2.6), 3)] {
            let s = Signals {
                waiting,
                ..Signals::default()
            };
            assert_eq!(s.queue(), queue, "{waiting:?}");
        }
        assert_eq!(demand(0, []), 0.0);
        assert_eq!(demand(3, [2.0, 5.0]), 10.0);
        assert_eq!(demand(1, [f64::NAN, 4.0]), 5.0);
    }
}
