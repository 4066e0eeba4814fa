//! What the admin routes and the recorder share with the running proxy. Its own module so that
//! `app` (which builds it) and `admin` (which reads it) do not depend on each other.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::auth::Auth;
use crate::compare::history::History;
use crate::engine::Engines;
use crate::recorder::Recorder;
use crate::upstream::Upstreams;

/// What the admin routes and the recorder share with the running proxy.
pub struct AppState {
    /// The proxy's own metrics; `metrics.rs` registers the goodput_proxy_* families here.
    pub registry: prometheus::Registry,
    /// Metric handles, SLOs and the record ring behind `/stats`.
    pub recorder: Arc<Recorder>,
    /// Set at SIGTERM/SIGINT: `/readyz` answers 503 from then on.
    pub draining: AtomicBool,
    pub upstreams: Arc<Upstreams>,
    /// Each replica's latest engine `/metrics` and the gauges derived from it.
    pub engines: Arc<Engines>,
    /// API keys and tenants, when `[auth]` is on (reloaded on SIGHUP).
    pub auth: Option<Arc<Auth>>,
    /// The metric pages the dashboard's windows start from (kept only while a page polls).
    pub dashboard: History,
}
