//! Live progress on stderr (indicatif): phase, elapsed and left, sent, in flight, errors and a
//! running TTFT p50. Hidden when stderr is not a terminal or `CI` is set.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: ProgressBar,
}

/// A snapshot of the run for one redraw.
pub struct Tick<'a> {
    pub phase: &'a str,
    pub elapsed: Duration,
    pub left: Option<Duration>,
    pub sent: u64,
    pub in_flight: u64,
    pub errors: u64,
    pub ttft_p50: Option<f64>,
}

/// Whether progress should show: a terminal, and not in CI.
pub fn enabled() -> bool {
    std::io::stderr().is_terminal()
        && std::env::var("CI").map_or(true, |v| v.is_empty() || v == "false")
}

impl Progress {
    pub fn new(show: bool) -> Self {
        let bar = if show {
            let b = ProgressBar::new_spinner();
            b.set_draw_target(ProgressDrawTarget::stderr_with_hz(5));
            b.set_style(
                ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b
        } else {
            ProgressBar::hidden()
        };
        Self { bar }
    }

    pub fn update(&self, t: &Tick<'_>) {
        if self.bar.is_hidden() {
            return;
        }
        self.bar.set_message(line(t));
        self.bar.tick();
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The one-line status (pure, so it is testable).
pub fn line(t: &Tick<'_>) -> String {
    let left = t
        .left
        .map_or("-".into(), |d| format!("{:.0}s", d.as_secs_f64()));
    let ttft = t
        .ttft_p50
        .map_or("-".into(), |v| format!("{:.1}ms", v * 1000.0));
    format!(
        "phase {} | {:.0}s elapsed, {left} left | sent {} | in flight {} | errors {} | TTFT p50 {ttft}",
        t.phase,
        t.elapsed.as_secs_f64(),
        t.sent,
        t.in_flight,
        t.errors
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_every_field() {
        let l = line(&Tick {
            phase: "warm",
            elapsed: Duration::from_secs(3),
            left: Some(Duration::from_secs(7)),
            sent: 12,
            in_flight: 4,
            errors: 1,
            ttft_p50: Some(0.0425),
        });
        assert_eq!(
            l,
            "phase warm | 3s elapsed, 7s left | sent 12 | in flight 4 | errors 1 | TTFT p50 42.5ms"
        );
    }
}
