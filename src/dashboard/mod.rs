//! The admin port's live page. `GET /` serves one self-contained HTML page: markup, script and
//! the vendored uPlot chart library (MIT, `page/vendor/`, license inlined) are compiled into the
//! binary, so there is no CDN, no second request and no build step. The page polls
//! `GET /dashboard.json?window=SECONDS`, one bounded JSON document of panels, each built by one
//! function (`panels.rs`) from what `/stats` and `/metrics` read: the record ring, the registry
//! and the engines' latest scrapes. Nothing runs on the request path and nothing runs while no
//! page is open: the document is built when asked for.
//!
//! The latency panel is `goodput-proxy compare`'s table ([`crate::compare::build`]) over the
//! window: the histogram deltas need a metric page from the window's start, so each request of
//! the document keeps the few families the table reads ([`crate::compare::history::History`],
//! at most one page per [`crate::compare::history::SPACING`], none older than [`MAX_WINDOW`]).

mod panels;
mod split;

use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::state::AppState;

/// The page, whole: built at compile time from its parts.
pub const PAGE: &str = concat!(
    include_str!("page/head.html"),
    "<style>\n",
    include_str!("page/vendor/uPlot.min.css"),
    "\n</style>\n<script>\n/*\nuPlot 1.6.32, https://github.com/leeoniya/uPlot\n",
    include_str!("page/vendor/uPlot.LICENSE"),
    "*/\n",
    include_str!("page/vendor/uPlot.iife.min.js"),
    "\n</script>\n",
    include_str!("page/body.html"),
    "<script>\n",
    include_str!("page/dashboard.js"),
    "</script>\n</body>\n</html>\n",
);

/// The window when the query names none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// The longest window the document covers (and the oldest metric page kept for it).
pub const MAX_WINDOW: Duration = Duration::from_secs(600);

/// Why a `/dashboard.json` query is refused (a 400 naming the parameter).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QueryError {
    #[error("window must be a number of seconds in [1, {max}], got {0:?}", max = MAX_WINDOW.as_secs())]
    BadWindow(String),
    #[error("unknown parameter {0:?} (expected window)")]
    UnknownParam(String),
}

impl QueryError {
    pub fn param(&self) -> &str {
        match self {
            QueryError::BadWindow(_) => "window",
            QueryError::UnknownParam(p) => p,
        }
    }
}

/// `window=SECONDS` (1 to [`MAX_WINDOW`]); [`DEFAULT_WINDOW`] without it.
pub fn parse_query(query: Option<&str>) -> Result<Duration, QueryError> {
    let mut window = DEFAULT_WINDOW;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "window" => {
                let secs: f64 = v.parse().map_err(|_| QueryError::BadWindow(v.into()))?;
                if !(1.0..=MAX_WINDOW.as_secs_f64()).contains(&secs) {
                    return Err(QueryError::BadWindow(v.into()));
                }
                window = Duration::from_secs_f64(secs);
            }
            other => return Err(QueryError::UnknownParam(other.into())),
        }
    }
    Ok(window)
}

/// The document: `{"window_seconds", "uptime_seconds", "panels": {NAME: ...}}`, one entry per
/// panel of [`panels::PANELS`].
pub fn document(state: &AppState, window: Duration) -> Value {
    let now = Instant::now();
    let inputs = panels::Inputs::gather(state, now, window);
    let mut out = Map::new();
    for (name, build) in panels::PANELS {
        out.insert((*name).to_string(), build(&inputs));
    }
    json!({
        "window_seconds": inputs.window.as_secs_f64(),
        "uptime_seconds": inputs.uptime.as_secs_f64(),
        "panels": out,
    })
}

#[cfg(test)]
mod tests;
