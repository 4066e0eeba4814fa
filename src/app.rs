//! Builds the metrics registry, upstreams and the stack; binds the listeners; runs; drains.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::auth::Auth;
use crate::compare::history::History;
use crate::config::{BaseUrl, Config, UsageInjection};
use crate::discover::{Discovery, HostsFile, Resolver, SystemResolver};
use crate::engine::{self, Engines};
use crate::listener::{self, ReloadableTls, ServeOptions};
use crate::metrics::labels::{ByTenant, Sink};
use crate::metrics::{Metrics, ModelLabels};
use crate::recorder::Recorder;
use crate::scale::{ReplicaLoad, Scale};
use crate::sink::clickhouse::{ClickHouseSink, SinkCounters};
use crate::sink::jsonl::{RecordSink, SinkConfig};
use crate::sink::Sinks;
use crate::stack;
use crate::state::AppState;
use crate::upstream::headers::Forwarded;
use crate::upstream::{health, Upstreams};
use goodput_net::{bind_listener, LISTEN_BACKLOG};
use goodput_sim::{SimConfig, SimHandle, SimServer};

/// A bound, not yet running proxy: both sockets are open, so callers can read the addresses
/// (port 0 in tests) before `run`.
pub struct App {
    config: Config,
    state: Arc<AppState>,
    public: TcpListener,
    admin: TcpListener,
    tls: Option<Arc<ReloadableTls>>,
    demo: Option<DemoEngine>,
    discovery: Option<Discovery>,
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
    pub async fn bind(config: Config) -> anyhow::Result<App> {
        let resolver: Arc<dyn Resolver> = match &config.upstream.discover_hosts_file {
            Some(path) => Arc::new(HostsFile::new(path.clone())),
            None => Arc::new(SystemResolver),
        };
        Self::bind_with_resolver(config, resolver).await
    }

    /// [`App::bind`] with the resolver `upstream.discover` uses (tests pass a fake one).
    pub async fn bind_with_resolver(
        mut config: Config,
        resolver: Arc<dyn Resolver>,
    ) -> anyhow::Result<App> {
        let demo = if config.upstream.urls.is_empty() && config.upstream.discover.is_empty() {
            let sim = config.sim.clone().unwrap_or_default();
            // The demo engine's models are known: label them from the first request.
            config.measure.models.extend(sim.models.iter().cloned());
            let demo = start_demo_engine(sim).await?;
            let url = format!("http://{}", demo.addr);
            config.upstream.urls = vec![BaseUrl::parse(&url).map_err(anyhow::Error::msg)?];
            Some(demo)
        } else {
            None
        };
        let registry = prometheus::Registry::new();
        let upstreams = Upstreams::new(&config.upstream, &registry)
            .map_err(|e| anyhow::anyhow!("upstream: {e}"))?;
        let tls = match &config.server.tls {
            Some(t) => Some(Arc::new(ReloadableTls::load(&t.cert, &t.key)?)),
            None => None,
        };
        let public = bind_listener(config.server.listen, LISTEN_BACKLOG)
            .with_context(|| format!("server.listen: cannot bind {}", config.server.listen))?;
        let admin =
            bind_listener(config.server.admin_listen, LISTEN_BACKLOG).with_context(|| {
                format!(
                    "server.admin_listen: cannot bind {}",
                    config.server.admin_listen
                )
            })?;
        let scale = Scale::register(&config.scale, &registry, tokio::time::Instant::now())
            .context("registering autoscaling metrics")?;
        let recorder = Arc::new(build_recorder(&config, &registry)?.with_scale(Arc::new(scale)));
        let engines = Engines::new(&config.engine, &upstreams, &registry)
            .context("registering engine metrics")?;
        // The proxy's own families carry the same `upstream` value as the engine families of
        // that replica, so the two join in PromQL.
        recorder
            .metrics()
            .upstreams
            .add(engines.sync(&upstreams.replicas()));
        let state = Arc::new(AppState {
            registry,
            recorder,
            draining: AtomicBool::new(false),
            upstreams: Arc::new(upstreams),
            engines: Arc::new(engines),
            auth: Auth::new(&config.auth),
            admin: config.admin.clone(),
            dashboard: History::new(crate::dashboard::MAX_WINDOW),
        });
        if let Some(auth) = &state.auth {
            // Every configured tenant's series exists from the start (a zero is a signal too).
            for name in auth.tenant_names() {
                state
                    .recorder
                    .metrics()
                    .tenant_tokens
                    .get(&ByTenant { tenant: &name });
            }
        }
        let discovery = if config.upstream.discover.is_empty() {
            None
        } else {
            let targets = config.upstream.discover.clone();
            let mut d = Discovery::new(
                state.upstreams.clone(),
                state.engines.clone(),
                state.recorder.metrics().upstreams.clone(),
                resolver,
                targets,
            );
            // The first replicas before the first request; a slow resolver delays startup by
            // one interval at most (the periodic rounds take over).
            let _ = tokio::time::timeout(config.upstream.discover_interval, d.round()).await;
            Some(d)
        };
        Ok(App {
            config,
            state,
            public,
            admin,
            tls,
            demo,
            discovery,
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

    /// The public listener's reloadable certificate, when it speaks TLS (SIGHUP reloads it).
    pub fn tls(&self) -> Option<Arc<ReloadableTls>> {
        self.tls.clone()
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
            discovery,
        } = self;
        let limits = config.limits.clone();
        let forwarded = Forwarded {
            trusted_proxies: config.server.trusted_proxies,
        };
        let service = stack::build(
            &config,
            &limits,
            forwarded,
            state.upstreams.clone(),
            state.recorder.clone(),
            state.auth.clone(),
        );
        let health = tokio::spawn(health::run(state.upstreams.clone()));
        let interval = config.upstream.discover_interval;
        let discovery = discovery.map(|d| tokio::spawn(d.run(interval)));
        let scraper = config.engine.scrape.then(|| {
            tokio::spawn(engine::scrape::run(
                state.upstreams.clone(),
                state.engines.clone(),
            ))
        });
        let scale_ticks = state
            .recorder
            .scale()
            .map(|s| tokio::spawn(scale_ticks(state.clone(), s.clone())));
        let mut reloadable: Vec<Arc<dyn crate::reload::Reload>> = Vec::new();
        if let Some(tls) = &tls {
            reloadable.push(tls.clone());
        }
        if let Some(auth) = state
            .auth
            .as_ref()
            .filter(|_| config.auth.keys_file.is_some())
        {
            reloadable.push(auth.clone());
        }
        let reloader =
            (!reloadable.is_empty()).then(|| tokio::spawn(crate::reload::on_sighup(reloadable)));
        // Learn the served models before the first request is taken (connections wait in the
        // backlog meanwhile), so its `model` label is right; bounded, so a replica that is slow
        // to answer delays startup by at most STARTUP_LEARNING.
        let _ = tokio::time::timeout(
            STARTUP_LEARNING,
            learn_once(&state.upstreams, &state.recorder),
        )
        .await;
        let models = tokio::spawn(learn_models(
            state.upstreams.clone(),
            state.recorder.clone(),
            config.measure.models_refresh,
        ));
        // The admin port runs the same accept loop; it keeps answering while the public port
        // drains (/readyz says 503 then) and stops after it.
        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin_options = ServeOptions {
            name: "admin",
            header_read_timeout: config.server.header_read_timeout,
            limits: limits.clone(),
            max_connections: limits.admin_max_connections,
            tls: None,
        };
        let admin_task = tokio::spawn(listener::serve(
            admin,
            crate::admin::service(state.clone()),
            admin_options,
            async move {
                let _ = admin_stopped.await;
            },
            ADMIN_GRACE,
        ));
        let drain_delay = config.server.drain_delay;
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
            name: "public",
            header_read_timeout: config.server.header_read_timeout,
            max_connections: limits.max_connections,
            limits,
            tls,
        };
        listener::serve(
            public,
            service,
            options,
            draining,
            config.server.grace_period,
        )
        .await;
        let _ = admin_stop.send(());
        let _ = admin_task.await;
        if let Some(r) = reloader {
            r.abort();
        }
        health.abort();
        if let Some(t) = scale_ticks {
            t.abort();
        }
        if let Some(d) = discovery {
            d.abort();
        }
        if let Some(scraper) = scraper {
            scraper.abort();
        }
        models.abort();
        if let Some(demo) = demo {
            demo.handle.shutdown().await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// How long admin requests (a scrape, a probe) get to finish once the public port has drained.
const ADMIN_GRACE: Duration = Duration::from_secs(1);

/// Registers the goodput_proxy_* families and builds the recorder (ring, SLOs, sinks).
fn build_recorder(config: &Config, registry: &prometheus::Registry) -> anyhow::Result<Recorder> {
    let m = &config.measure;
    // A model with its own SLOs is a configured model too: its label (and so its SLOs) must
    // not depend on learning.
    let labelled = m.models.iter().chain(config.slo.per_model.keys());
    let metrics =
        Metrics::register(registry, ModelLabels::new(labelled)).context("registering metrics")?;
    metrics.set_goodput_window(m.goodput_window);
    let mut sinks = Sinks::default();
    if let Some(jsonl) = &m.jsonl {
        let path = &jsonl.path;
        let cfg = SinkConfig {
            path: path.clone(),
            max_bytes: jsonl.max_bytes,
            keep: jsonl.keep,
            queue: jsonl.queue,
        };
        let dropped = metrics.records_dropped.get(&Sink::Jsonl);
        // The writer task ends by itself once the last sender (the recorder) is dropped.
        let (sink, _task) = RecordSink::spawn(cfg, dropped)
            .with_context(|| format!("measure.sink_path: cannot open {}", path.display()))?;
        sinks.jsonl = Some(sink);
    }
    if let Some(ch) = &config.clickhouse {
        let l = Sink::Clickhouse;
        let counters = SinkCounters {
            dropped: metrics.records_dropped.get(&l),
            shipped: metrics.records_shipped.get(&l),
            errors: metrics.sink_errors.get(&l),
        };
        // The shipper ends by itself once the recorder is dropped and the queue is shipped.
        let (sink, _task) = ClickHouseSink::spawn(ch, counters)
            .map_err(|e| anyhow::anyhow!("sink.clickhouse: {e}"))?;
        tracing::info!(url = %ch.url, database = %ch.database, table = %ch.table, "clickhouse sink on");
        sinks.clickhouse = Some(sink);
    }
    let recorder = Recorder::new(
        metrics,
        config.slo.clone(),
        m.records,
        sinks,
        m.usage_injection == UsageInjection::Auto,
    )
    .with_instance(&config.server.instance)
    .with_stall(m.stall)
    .with_trace(
        config.trace.sample_rate,
        config.trace.bounds,
        config.trace.max_traces,
    );
    Ok(if m.enabled {
        recorder
    } else {
        recorder.disabled()
    })
}

/// The longest `run` waits for the upstreams' model lists before it starts serving.
const STARTUP_LEARNING: Duration = Duration::from_secs(2);

/// Learns the model names the upstreams serve (`GET /v1/models`) so they get their own
/// `model` label: once before serving (see `run`), then when a request names a model without
/// a label (at most once per second, so a flood of random names costs one listing a second)
/// and every `every`. Names are only added (a replica that is briefly down keeps its series),
/// bounded by `MAX_LEARNED_MODELS`.
async fn learn_models(upstreams: Arc<Upstreams>, recorder: Arc<Recorder>, every: Duration) {
    const DEBOUNCE: Duration = Duration::from_secs(1);
    loop {
        tokio::select! {
            _ = recorder.unknown_model_seen() => {}
            _ = tokio::time::sleep(every) => {}
        }
        learn_once(&upstreams, &recorder).await;
        tokio::time::sleep(DEBOUNCE).await;
    }
}

/// Lists every replica's models (concurrently) and adds the names to the label set.
async fn learn_once(upstreams: &Upstreams, recorder: &Recorder) {
    let labels = &recorder.metrics().models;
    let replicas = upstreams.replicas();
    let lists = replicas
        .iter()
        .map(|replica| async move { (replica, list_models(upstreams, replica).await) });
    for (replica, names) in futures_util::future::join_all(lists).await {
        let added = labels.add_learned(&names);
        if added > 0 {
            tracing::info!(upstream = %replica.url, added, "learned model names");
        }
    }
}

/// The `data[].id` of one replica's `/v1/models`; empty on any failure (tried again later).
async fn list_models(up: &Upstreams, replica: &crate::upstream::Replica) -> Vec<String> {
    use http_body_util::Full;
    #[derive(serde::Deserialize)]
    struct Model {
        id: String,
    }
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<Model>,
    }
    let Ok(uri) = replica.uri_for("/v1/models") else {
        return Vec::new();
    };
    let Ok(req) = http::Request::get(uri).body(Full::new(bytes::Bytes::new())) else {
        return Vec::new();
    };
    let limit = up.config.connect_timeout + Duration::from_secs(5);
    // A model list is small; bound what a misbehaving upstream can make us buffer.
    match goodput_net::fetch(&up.client, req, limit, 1 << 20).await {
        Ok(page) if page.status.is_success() => serde_json::from_slice::<List>(&page.body)
            .map(|list| list.data.into_iter().map(|m| m.id).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
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
/// Every `scale.tick_ms`: each replica's load into the autoscaling estimate (off the request
/// path; the gauges are set from it at the next scrape).
async fn scale_ticks(state: Arc<AppState>, scale: Arc<Scale>) {
    let mut tick = tokio::time::interval(Duration::from_millis(scale.config().tick_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let labels = &state.recorder.metrics().upstreams;
    loop {
        let now = tick.tick().await;
        let loads: Vec<ReplicaLoad> = state
            .upstreams
            .replicas()
            .iter()
            .map(|r| ReplicaLoad {
                upstream: labels.resolve(&r.url),
                healthy: r.is_healthy(),
                in_flight: r.in_flight(),
                tokens_in_flight: Some(r.route.tokens()),
                tokens_sent: r.route.tokens_sent(),
                tokens_pending: Some(r.route.tokens_pending()),
            })
            .collect();
        scale.tick(now, &loads);
    }
}

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
