//! Helpers shared by the load generator's integration tests.

use std::time::Duration;

use goodput_proxy::app::App;
use goodput_proxy::config::RawConfig;
use tokio::sync::oneshot;

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

/// A proxy running in this process (stopped by [`Proxy::stop`]).
pub struct Proxy {
    /// `http://ADDR` of the public port.
    pub target: String,
    /// `http://ADDR` of the admin port.
    pub admin: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Proxy {
    /// Shuts it down and waits (at most 10 s) for it to drain.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

/// Starts a proxy in front of `upstreams` on loopback port 0 that knows the model `tiny`, with
/// no drain delay, a 5 s grace period and 200 ms health checks; `tweak` sets the rest.
pub async fn start_proxy(upstreams: Vec<String>, tweak: impl FnOnce(&mut RawConfig)) -> Proxy {
    let mut c = RawConfig::default();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
    c.server.drain_delay_ms = 0;
    c.server.grace_period_ms = 5_000;
    c.upstream.urls = upstreams;
    c.upstream.health_interval_ms = 200;
    c.measure.models = vec!["tiny".into()];
    tweak(&mut c);
    let app = App::bind(c.check().expect("a valid test config"))
        .await
        .expect("bind proxy");
    let (addr, admin) = (app.local_addr(), app.admin_addr());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    Proxy {
        target: format!("http://{addr}"),
        admin: format!("http://{admin}"),
        stop: Some(tx),
        task,
    }
}
