//! `[scale]`: the autoscaling signals (SLO attainment windows, headroom, desired replicas; see
//! `src/scale/` and docs/autoscaling.md). Nothing here needs converting, so the raw table is
//! also the checked form.

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScaleConfig {
    /// Share of requests that must meet every SLO: headroom is the load the replicas can take
    /// before their attainment falls below it (0.5 to 1).
    pub target: f64,
    /// The two sliding windows of `goodput_proxy_slo_attainment*` (whole seconds).
    pub short_window_s: u64,
    pub long_window_s: u64,
    /// How often each replica's load and attainment are sampled for the estimator.
    pub tick_ms: u64,
    /// Loads are smoothed over about this long (an exponential average), both the samples the
    /// estimator learns from and the load headroom is reported against.
    pub load_window_ms: u64,
    /// A load bin counts once it holds this many finished requests.
    pub min_requests: u64,
    /// Each load bin remembers its last this many requests.
    pub memory: u64,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        ScaleConfig {
            target: 0.95,
            short_window_s: 30,
            long_window_s: 300,
            tick_ms: 1_000,
            load_window_ms: 10_000,
            min_requests: 20,
            memory: 400,
        }
    }
}

impl ScaleConfig {
    /// Every problem, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = Vec::new();
        if !(0.5..=1.0).contains(&self.target) {
            p.push(("scale.target", "must be between 0.5 and 1"));
        }
        if self.short_window_s == 0 || self.short_window_s > 3_600 {
            p.push(("scale.short_window_s", "must be between 1 and 3600"));
        }
        if self.long_window_s <= self.short_window_s || self.long_window_s > 86_400 {
            p.push((
                "scale.long_window_s",
                "must be longer than short_window_s and at most 86400",
            ));
        }
        if !(10..=60_000).contains(&self.tick_ms) {
            p.push(("scale.tick_ms", "must be between 10 and 60000"));
        }
        if self.load_window_ms < self.tick_ms {
            p.push(("scale.load_window_ms", "must be at least tick_ms"));
        }
        if self.min_requests == 0 {
            p.push(("scale.min_requests", "must be positive"));
        }
        if self.memory < self.min_requests {
            p.push(("scale.memory", "must be at least min_requests"));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_field() {
        assert!(ScaleConfig::default().problems().is_empty());
        type Set = fn(&mut ScaleConfig);
        let cases: &[(Set, &str)] = &[
            (|c| c.target = 1.5, "scale.target"),
            (|c| c.short_window_s = 0, "scale.short_window_s"),
            (|c| c.long_window_s = 10, "scale.long_window_s"),
            (|c| c.tick_ms = 1, "scale.tick_ms"),
            (|c| c.load_window_ms = 500, "scale.load_window_ms"),
            (|c| c.min_requests = 0, "scale.min_requests"),
            (|c| c.memory = 5, "scale.memory"),
        ];
        for (set, field) in cases {
            let mut c = ScaleConfig::default();
            set(&mut c);
            let fields: Vec<&str> = c.problems().iter().map(|p| p.0).collect();
            assert_eq!(fields, [*field]);
        }
    }
}
