//! The metric pages a live comparison window starts from (the admin page's latency panel):
//! the families the table reads, kept as taken when a window was asked for (no background
//! task), at most one per [`SPACING`], none older than the longest window.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::parse::Family;

/// Pages closer together than this are not both kept: a page open on several screens, each
/// refreshing every 2 s, keeps a bounded number of pages.
pub const SPACING: Duration = Duration::from_secs(5);

/// One kept page.
pub type Page = Arc<Vec<Family>>;

/// Metric pages by the time they were taken, oldest first.
#[derive(Debug)]
pub struct History {
    keep: Duration,
    pages: Mutex<VecDeque<(Instant, Page)>>,
}

impl History {
    /// Keeps pages up to `keep` old.
    pub fn new(keep: Duration) -> Self {
        Self {
            keep,
            pages: Mutex::new(VecDeque::new()),
        }
    }

    /// The page the window `(now - window, now]` starts from: the oldest kept one taken inside
    /// it (so the window is never longer than asked, and as long as the pages allow), `None`
    /// when none is. Then keeps `page` (taken at `now`) unless the newest kept page is less
    /// than [`SPACING`] old, and forgets pages older than `keep`.
    pub fn start_and_keep(
        &self,
        now: Instant,
        window: Duration,
        page: impl FnOnce() -> Page,
    ) -> Option<(Instant, Page)> {
        let Ok(mut pages) = self.pages.lock() else {
            return None;
        };
        let from = now.checked_sub(window);
        let start = pages
            .iter()
            .find(|(at, _)| from.is_none_or(|f| *at > f) && *at < now)
            .cloned();
        if pages
            .back()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= SPACING)
        {
            pages.push_back((now, page()));
        }
        while pages
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > self.keep)
        {
            pages.pop_front();
        }
        start
    }

    /// Pages kept.
    pub fn len(&self) -> usize {
        self.pages.lock().map(|p| p.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of `n` families: its length tags it.
    fn page(n: usize) -> Page {
        let text: String = (0..n).map(|i| format!("f{i} 1\n")).collect();
        Arc::new(crate::engine::parse::parse(&text).unwrap())
    }

    #[test]
    fn windows_start_at_the_oldest_page_inside_them() {
        let h = History::new(Duration::from_secs(60));
        let t = Instant::now();
        let s = Duration::from_secs;
        // (seconds after t, window asked, the start page expected: its length tags it)
        let steps: [(u64, u64, Option<usize>); 7] = [
            (0, 30, None),     // nothing kept yet; keeps page 1 (at +0)
            (2, 30, Some(1)),  // page 1 is inside; too close to keep another
            (5, 30, Some(1)),  // keeps page 2 (at +5)
            (31, 30, Some(2)), // page 1 left the window, page 2 did not; keeps page 3 (+31)
            (40, 5, None),     // every page is older than 5 s; keeps page 4 (+40)
            (70, 60, Some(3)), // keeps page 5 (+70), forgets pages 1 and 2 (> 60 s old)
            (70, 60, Some(3)), // same instant: the page taken now is not a start
        ];
        let mut next = 1;
        for (at, window, want) in steps {
            let got = h.start_and_keep(t + s(at), s(window), || {
                let p = page(next);
                next += 1;
                p
            });
            assert_eq!(
                got.map(|(_, p)| p.len()),
                want,
                "at +{at}s window {window}s"
            );
        }
        assert_eq!(h.len(), 3, "pages 3, 4, 5 are kept");
    }
}
