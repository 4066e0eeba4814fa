//! Builds the metrics registry, upstreams and the stack; binds the listeners; runs; drains.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::config::Config;
use crate::listener::{self, ServeOptions};
use crate::sim::{SimConfig, SimHandle, SimServer};
use crate::stack;
use crate::upstream::{health, Upstreams};

/// What the admin routes (and, later, the meter) share with the running proxy.
pub struct AppState {
    /// The proxy's own metrics; `metrics.rs` registers the goodput_proxy_* families here.
    pub registry: prometheus::Registry,
    /// Set at SIGTERM/SIGINT: `/readyz` answers 503 from then on.
    pub draining: AtomicBool,
    pub upstreams: Arc<Upstreams>,
}

/// A bound, not yet running proxy: both sockets are open, so callers can read the addresses
/// (port 0 in tests) before `run`.
pub struct App {
    config: Config,
    state: Arc<AppState>,
    public: TcpListener,
    admin: TcpListener,
    tls: Option<TlsAcceptor>,
    demo: Option<DemoEngine>,
}

/// The built-in simulated engine started when no upstream is configured.
pub struct DemoEngine {
    pub addr: SocketAddr,
    /// The first model it serves (what the sample curl asks for).
    pub model: String,
    handle: SimHandle,
}

impl App {
    /// Checks the config, starts the demo engine when there is no upstream, binds both ports.
    pub async fn bind(mut config: Config) -> anyhow::Result<App> {
        let demo = if config.upstream.urls.is_empty() {
            let demo = start_demo_engine(config.sim.clone().unwrap_or_default()).await?;
            config.upstream.urls = vec![format!("http://{}", demo.addr)];
            Some(demo)
        } else {
            None
        };
        let upstreams =
            Upstreams::new(&config.upstream).map_err(|e| anyhow::anyhow!("upstream.urls: {e}"))?;
        let tls = match (&config.server.tls_cert, &config.server.tls_key) {
            (Some(cert), Some(key)) => Some(listener::tls_acceptor(cert, key)?),
            _ => None,
        };
        let public = TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("server.listen: cannot bind {}", config.server.listen))?;
        let admin = TcpListener::bind(config.server.admin_listen)
            .await
            .with_context(|| {
                format!(
                    "server.admin_listen: cannot bind {}",
                    config.server.admin_listen
                )
            })?;
        let state = Arc::new(AppState {
            registry: prometheus::Registry::new(),
            draining: AtomicBool::new(false),
            upstreams: Arc::new(upstreams),
        });
        Ok(App {
            config,
            state,
            public,
            admin,
            tls,
            demo,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.public
            .local_addr()
            .unwrap_or(self.config.server.listen)
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .unwrap_or(self.config.server.admin_listen)
    }

    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// The demo engine, when `bind` started one.
    pub fn demo(&self) -> Option<&DemoEngine> {
        self.demo.as_ref()
    }

    /// A curl command that streams a chat completion through this proxy.
    pub fn sample_curl(&self, model: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!(
            "curl -sSN {scheme}://{}/v1/chat/completions -H 'content-type: application/json' \
             -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],\"stream\":true,\"max_tokens\":32}}'",
            self.local_addr()
        )
    }

    /// Serves until `shutdown` resolves, then drains: `/readyz` turns 503 at once, the listener
    /// keeps accepting for `server.drain_delay_ms`, stops, and in-flight requests get
    /// `server.grace_period_ms` before they are cut.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let App {
            config,
            state,
            public,
            admin,
            tls,
            demo,
        } = self;
        let service = stack::build(&config, state.upstreams.clone());
        let health = tokio::spawn(health::run(state.upstreams.clone()));
        let admin_task = tokio::spawn(serve_admin(admin, state.clone()));
        let drain_delay = config.server.drain_delay();
        let draining = {
            let state = state.clone();
            async move {
                shutdown.await;
                state.draining.store(true, Ordering::SeqCst);
                tracing::info!(
                    drain_delay_ms = drain_delay.as_millis() as u64,
                    "shutdown requested; /readyz now 503, still accepting"
                );
                tokio::time::sleep(drain_delay).await;
            }
        };
        let options = ServeOptions {
            header_read_timeout: config.server.header_read_timeout(),
            tls,
        };
        listener::serve(
            public,
            service,
            options,
            draining,
            config.server.grace_period(),
        )
        .await;
        health.abort();
        admin_task.abort();
        if let Some(demo) = demo {
            demo.handle.shutdown().await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// The admin port: plain HTTP/1.1, a handful of GET routes, nothing of the public stack.
async fn serve_admin(listener: TcpListener, state: Arc<AppState>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| crate::admin::handle(state.clone(), req));
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Demo mode: the simulated engine on an ephemeral loopback port, in this process.
async fn start_demo_engine(sim: SimConfig) -> anyhow::Result<DemoEngine> {
    let model = sim.models.first().cloned().unwrap_or_else(|| "tiny".into());
    let server = SimServer::bind(sim, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .context("starting the built-in simulated engine")?;
    let addr = server.local_addr();
    Ok(DemoEngine {
        addr,
        model,
        handle: server.spawn(),
    })
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = int.recv() => tracing::info!("SIGINT received"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
