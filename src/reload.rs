//! SIGHUP: everything the proxy re-reads from its files, in one handler. Each [`Reload`] is
//! tried on every SIGHUP; one that fails keeps what it had and says why, the others still
//! reload. Today: the listener's TLS certificate and key, the API keys file.

use std::sync::Arc;

/// Something re-read from its files on SIGHUP.
pub trait Reload: Send + Sync {
    /// For the log line of a failure: what failed to reload (`TLS`, `API keys`).
    fn what(&self) -> &'static str;
    /// Re-reads; on error what was in use stays in use. Ok: the log line of a success.
    fn reload(&self) -> Result<String, String>;
}

impl Reload for crate::listener::ReloadableTls {
    fn what(&self) -> &'static str {
        "TLS"
    }
    fn reload(&self) -> Result<String, String> {
        crate::listener::ReloadableTls::reload(self)
            .map(|()| "TLS certificate and key reloaded".to_string())
            .map_err(|e| e.to_string())
    }
}

impl Reload for crate::auth::Auth {
    fn what(&self) -> &'static str {
        "API keys"
    }
    fn reload(&self) -> Result<String, String> {
        crate::auth::Auth::reload(self).map(|s| format!("API keys reloaded: {s}"))
    }
}

/// Reloads every item on each SIGHUP, until the task is aborted.
pub async fn on_sighup(items: Vec<Arc<dyn Reload>>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; nothing will be reloaded");
            return;
        };
        while hup.recv().await.is_some() {
            reload_all(&items);
        }
    }
    #[cfg(not(unix))]
    {
        let _ = items;
    }
}

/// One SIGHUP's worth: every item, each logged.
pub fn reload_all(items: &[Arc<dyn Reload>]) {
    for item in items {
        let what = item.what();
        match item.reload() {
            Ok(line) => tracing::info!("SIGHUP: {line}"),
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: {what} reload failed; keeping what was in use")
            }
        }
    }
}
