//! The simulated vLLM engine: OpenAI-compatible endpoints byte-shaped like vLLM 0.32's,
//! a continuous-batching timing model, vLLM V1 `/metrics`, and faults on demand.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use goodput_sim::{SimConfig, SimServer};
//! let sim = SimServer::bind(SimConfig::fast(), "127.0.0.1:0".parse().unwrap()).await?.spawn();
//! let url = format!("http://{}/v1/chat/completions", sim.local_addr());
//! # let _ = url;
//! sim.shutdown().await;
//! # Ok(()) }
//! ```

pub mod agent;
pub mod cli;
pub mod coalesce;
pub mod config;
pub mod engine;
pub mod errors;
pub mod faults;
pub mod gen;
pub mod kvcache;
pub mod metrics;
pub mod nonstream;
pub mod per_request;
pub mod personality;
pub mod prompt;
pub mod render;
pub mod request;
pub mod routes;
pub mod sched;
pub mod server;
pub mod stream;
pub mod text;

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use cli::{run_cli, SimArgs};
pub use config::{ConfigError, Jitter, SimConfig};
pub use engine::Engine;
pub use faults::{EarlyFinish, EndReason, FaultRule, Faults, FAULT_HEADER};
pub use personality::Personality;

/// A bound, not yet serving, simulator.
pub struct SimServer {
    listener: TcpListener,
    engine: Arc<Engine>,
}

impl SimServer {
    /// Binds `addr` (port 0 picks a free port). The config must be valid.
    pub async fn bind(cfg: SimConfig, addr: SocketAddr) -> std::io::Result<SimServer> {
        cfg.validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let listener = goodput_net::bind_listener(addr, goodput_net::LISTEN_BACKLOG)?;
        Ok(SimServer {
            listener,
            engine: Arc::new(Engine::new(cfg)),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Serves in a tokio task until [`SimHandle::shutdown`]. Dropping the handle leaves the
    /// server running (for the life of the runtime).
    pub fn spawn(self) -> SimHandle {
        let addr = self.local_addr();
        let engine = self.engine.clone();
        let task = tokio::spawn(server::serve(self.listener, self.engine));
        SimHandle { addr, engine, task }
    }

    /// Serves on the current task until it is cancelled.
    pub async fn run(self) {
        server::serve(self.listener, self.engine).await
    }
}

/// A running simulator, with introspection for tests.
pub struct SimHandle {
    addr: SocketAddr,
    engine: Arc<Engine>,
    task: JoinHandle<()>,
}

impl SimHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and closes every connection (streams in flight are cut).
    pub async fn shutdown(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Sequences holding a decode slot now (`vllm:num_requests_running`, all models).
    pub fn running(&self) -> usize {
        self.engine.running()
    }

    /// Sequences queued for a slot (`vllm:num_requests_waiting`, all models).
    pub fn waiting(&self) -> usize {
        self.engine.waiting()
    }

    /// Generation requests accepted so far (valid and not answered by a status fault).
    pub fn requests_started(&self) -> u64 {
        self.engine.stats.started.load(Relaxed)
    }

    /// Generation requests that ran to their end (including injected in-band errors).
    pub fn requests_served(&self) -> u64 {
        self.engine.stats.finished.load(Relaxed)
    }

    /// Generation requests that ended early: client disconnect or `truncate-after`.
    pub fn requests_aborted(&self) -> u64 {
        self.engine.stats.aborted.load(Relaxed)
    }

    /// Waits until no sequence runs or waits (every slot freed), polling every 2 ms; false
    /// if that does not happen `within`. For tests: "the sim saw the disconnect".
    pub async fn wait_idle(&self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.running() == 0 && self.waiting() == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// The `/metrics` text as a scrape would return it.
    pub fn metrics_text(&self) -> String {
        self.engine.metrics.render()
    }

    /// The engine, for deeper assertions (config, metrics atomics).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}
