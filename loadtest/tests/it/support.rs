//! Helpers shared by the load generator's integration tests.

/// Held by the tests that run load against the simulator and compare timings within a few ms
/// (`proxy_e2e`, `proxy_stats_agree`, `sim_e2e`), so that no two of them share the 2 cores at once (each was
/// alone in its own binary before the merge). Take it first: `let _serial = serial().await;`
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// Whether `text` has exactly this line (`contains("x 4")` would also pass on `x 40`).
pub fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}
