//! Admin listener routes: /healthz, /readyz, /metrics, /stats.
