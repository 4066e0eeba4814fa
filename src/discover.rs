//! DNS discovery: `upstream.discover = ["dns://NAME:PORT"]`, re-resolved every
//! `upstream.discover_interval_ms`. Every address is one replica `http://ADDRESS:PORT` (a
//! Kubernetes headless Service resolves to its ready pods). What changed goes to the replica
//! set ([`Upstreams::set_discovered`]), the engine scraper ([`Engines::sync`]) and the
//! `upstream` label set; a new replica is probed at once, so it takes traffic as soon as it
//! answers its health check. Resolution goes through [`Resolver`], so tests use a fake one.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engines;
use crate::metrics::UpstreamLabels;
use crate::upstream::{health, Upstreams};

pub use crate::config::DnsTarget;

pub type Resolved<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Resolves a name to addresses (the port is the target's).
pub trait Resolver: Send + Sync + 'static {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolved<'a>;
}

/// The system's resolver (`getaddrinfo`: `/etc/hosts`, then DNS).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolved<'a> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// Resolves from a hosts-format file (`ADDRESS NAME...` per line, `#` comments), read again at
/// every resolution: `upstream.discover_hosts_file`.
#[derive(Debug, Clone)]
pub struct HostsFile {
    path: std::path::PathBuf,
}

impl HostsFile {
    pub fn new(path: std::path::PathBuf) -> Self {
        Self { path }
    }
}

impl Resolver for HostsFile {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolved<'a> {
        Box::pin(async move {
            let text = tokio::fs::read_to_string(&self.path).await?;
            Ok(hosts_lookup(&text, host, port))
        })
    }
}

/// The addresses a hosts-format text gives `host` (lines that do not parse are skipped).
fn hosts_lookup(text: &str, host: &str, port: u16) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or_default();
            let mut words = line.split_whitespace();
            let addr: std::net::IpAddr = words.next()?.parse().ok()?;
            words
                .any(|w| w.eq_ignore_ascii_case(host))
                .then_some(SocketAddr::new(addr, port))
        })
        .collect()
}

/// The replica URL of one address.
pub fn replica_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// The discovered replica URLs: every target's addresses, sorted, without repeats. A target
/// that fails to resolve keeps what it resolved last time (a DNS hiccup must not empty the
/// set); `last` holds that per target.
pub async fn resolve_all(
    resolver: &dyn Resolver,
    targets: &[DnsTarget],
    last: &mut [Option<Vec<String>>],
) -> Vec<String> {
    let mut urls = Vec::new();
    for (t, last) in targets.iter().zip(last.iter_mut()) {
        match resolver.resolve(&t.host, t.port).await {
            Ok(addrs) => {
                let mut found: Vec<String> = addrs.into_iter().map(replica_url).collect();
                found.sort();
                found.dedup();
                *last = Some(found);
            }
            Err(e) => tracing::warn!(
                target = %format!("dns://{}:{}", t.host, t.port),
                error = %e,
                "discovery: resolution failed; keeping the previous addresses"
            ),
        }
        urls.extend(last.iter().flatten().cloned());
    }
    urls.sort();
    urls.dedup();
    urls
}

/// Everything one discovery round updates.
pub struct Discovery {
    pub upstreams: Arc<Upstreams>,
    pub engines: Arc<Engines>,
    pub labels: UpstreamLabels,
    pub resolver: Arc<dyn Resolver>,
    pub targets: Vec<DnsTarget>,
    last: Vec<Option<Vec<String>>>,
}

impl Discovery {
    pub fn new(
        upstreams: Arc<Upstreams>,
        engines: Arc<Engines>,
        labels: UpstreamLabels,
        resolver: Arc<dyn Resolver>,
        targets: Vec<DnsTarget>,
    ) -> Self {
        let last = vec![None; targets.len()];
        Self {
            upstreams,
            engines,
            labels,
            resolver,
            targets,
            last,
        }
    }

    /// Resolves every target once and applies the result; new replicas are probed before this
    /// returns (so they can take traffic right away when healthy).
    pub async fn round(&mut self) {
        let urls = resolve_all(&*self.resolver, &self.targets, &mut self.last).await;
        let change = self.upstreams.set_discovered(&urls);
        if change.is_empty() {
            return;
        }
        let labels = self.engines.sync(&self.upstreams.replicas());
        self.labels.add(labels);
        for r in &change.removed {
            tracing::info!(upstream = %r.url, in_flight = r.in_flight(), "discovery: replica removed; no new requests, its streams finish");
        }
        let probes = change
            .added
            .iter()
            .map(|r| health::probe(&self.upstreams, r));
        futures_util::future::join_all(probes).await;
        for r in &change.added {
            tracing::info!(upstream = %r.url, healthy = r.is_healthy(), "discovery: replica added");
        }
    }

    /// A round every `interval`, until the task is aborted.
    pub async fn run(mut self, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.round().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Answers from a table; a missing name is an error.
    #[derive(Default)]
    struct Fake(Mutex<Vec<(String, Vec<SocketAddr>)>>);

    impl Fake {
        fn set(&self, host: &str, addrs: &[&str]) {
            let mut t = self.0.lock().unwrap();
            t.retain(|(h, _)| h != host);
            t.push((
                host.into(),
                addrs.iter().map(|a| a.parse().unwrap()).collect(),
            ));
        }
        fn forget(&self, host: &str) {
            self.0.lock().unwrap().retain(|(h, _)| h != host);
        }
    }

    impl Resolver for Fake {
        fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> Resolved<'a> {
            let found = self
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|(h, _)| h == host)
                .map(|(_, a)| a.clone());
            Box::pin(async move {
                found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
            })
        }
    }

    #[test]
    fn hosts_file_lines() {
        let text = "# fleet\n127.0.0.2 fleet other\n127.0.0.3\tFLEET # comment\nnot-an-ip fleet\n::1 fleet\n10.0.0.9 else\n";
        let got = hosts_lookup(text, "fleet", 8000);
        let want: Vec<SocketAddr> = ["127.0.0.2:8000", "127.0.0.3:8000", "[::1]:8000"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(got, want);
        assert!(hosts_lookup(text, "missing", 1).is_empty());
    }

    #[tokio::test]
    async fn a_missing_hosts_file_is_an_error_so_the_last_answer_stays() {
        let r = HostsFile::new("/nonexistent/goodput-hosts".into());
        assert!(r.resolve("fleet", 8000).await.is_err());
    }

    #[tokio::test]
    async fn every_address_is_a_replica_and_a_failure_keeps_the_last_answer() {
        let fake = Fake::default();
        let targets = [
            DnsTarget::parse("dns://a:8000").unwrap(),
            DnsTarget::parse("dns://b:8000").unwrap(),
        ];
        let mut last = vec![None, None];
        fake.set("a", &["10.0.0.2:8000", "10.0.0.1:8000", "10.0.0.1:8000"]);
        fake.set("b", &["[fd00::1]:8000"]);
        let urls = resolve_all(&fake, &targets, &mut last).await;
        assert_eq!(
            urls,
            [
                "http://10.0.0.1:8000",
                "http://10.0.0.2:8000",
                "http://[fd00::1]:8000"
            ]
        );
        // b stops resolving: its last answer stays; a resolves to nothing: it has none.
        fake.forget("b");
        fake.set("a", &[]);
        let urls = resolve_all(&fake, &targets, &mut last).await;
        assert_eq!(urls, ["http://[fd00::1]:8000"]);
        // Replica URLs are valid upstream URLs.
        assert!(crate::upstream::parse_base_url(&urls[0]).is_ok());
    }

    #[tokio::test]
    async fn the_system_resolver_reads_etc_hosts() {
        // `localhost` is in /etc/hosts on every machine this runs on.
        let addrs = SystemResolver.resolve("localhost", 8000).await.unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.ip().is_loopback() && a.port() == 8000),
            "{addrs:?}"
        );
    }
}
