//! The simulated fleet: engine replicas in this process, published to the proxy through its
//! DNS discovery. Every replica listens on the same port at its own loopback address
//! (127.0.0.2, .3, ...), and the ready ones are written to a hosts file the proxy resolves the
//! fleet's name from (`upstream.discover_hosts_file`), as a headless Service answers with its
//! ready pods. A replica asked for becomes ready after the start delay (an engine loading its
//! weights); one removed leaves the file at once and is stopped after a drain, so its streams
//! finish.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use goodput_sim::{SimConfig, SimHandle, SimServer};

/// The name the proxy discovers.
pub const NAME: &str = "fleet";

enum Slot {
    /// Asked for; binds once its start delay has passed.
    Starting(tokio::task::JoinHandle<anyhow::Result<SimHandle>>),
    Ready(SimHandle),
}

pub struct Fleet {
    sim: SimConfig,
    start_delay: Duration,
    drain: Duration,
    hosts: PathBuf,
    port: u16,
    slots: Vec<Slot>,
    /// Last octet of the next replica's address (each replica gets a fresh one).
    next: u8,
}

impl Fleet {
    /// The first replica starts at once on `port` (0: any free one); its port is every
    /// replica's.
    pub async fn start(
        sim: SimConfig,
        start_delay: Duration,
        drain: Duration,
        hosts: PathBuf,
        port: u16,
    ) -> anyhow::Result<Self> {
        let first = bind(sim.clone(), 2, port).await?;
        let port = first.local_addr().port();
        let fleet = Fleet {
            sim,
            start_delay,
            drain,
            hosts,
            port,
            slots: vec![Slot::Ready(first)],
            next: 3,
        };
        fleet.publish()?;
        Ok(fleet)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Replicas asked for (starting or ready): what they cost.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn ready_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Ready(_)))
            .count()
    }

    /// Moves the count towards `n`: new replicas start (ready after the delay), the newest go.
    pub fn scale_to(&mut self, n: usize) -> anyhow::Result<()> {
        while self.slots.len() < n {
            let (delay, cfg, octet, port) =
                (self.start_delay, self.sim.clone(), self.next, self.port);
            self.next = self
                .next
                .checked_add(1)
                .context("out of loopback addresses")?;
            self.slots.push(Slot::Starting(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                bind(cfg, octet, port).await
            })));
        }
        while self.slots.len() > n {
            let Some(slot) = self.slots.pop() else { break };
            let drain = self.drain;
            match slot {
                Slot::Starting(task) => task.abort(),
                Slot::Ready(h) => {
                    tokio::spawn(async move {
                        tokio::time::sleep(drain).await;
                        h.shutdown().await;
                    });
                }
            }
        }
        self.publish()
    }

    /// Replicas whose start delay has passed join the file.
    pub async fn poll(&mut self) -> anyhow::Result<()> {
        let mut changed = false;
        for slot in self.slots.iter_mut() {
            if let Slot::Starting(task) = slot {
                if task.is_finished() {
                    let h = task.await??;
                    *slot = Slot::Ready(h);
                    changed = true;
                }
            }
        }
        if changed {
            self.publish()?;
        }
        Ok(())
    }

    /// Writes the ready replicas' addresses (a new file renamed over the old: the proxy never
    /// reads half of one).
    fn publish(&self) -> anyhow::Result<()> {
        let mut text = String::new();
        for s in &self.slots {
            if let Slot::Ready(h) = s {
                text.push_str(&format!("{} {NAME}\n", h.local_addr().ip()));
            }
        }
        let tmp = self.hosts.with_extension("tmp");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.hosts)
            .with_context(|| format!("renaming to {}", self.hosts.display()))
    }

    /// Stops every replica.
    pub async fn stop(self) {
        for slot in self.slots {
            match slot {
                Slot::Starting(task) => task.abort(),
                Slot::Ready(h) => h.shutdown().await,
            }
        }
    }
}

/// One replica on 127.0.0.`octet`:`port` (0: any port), seeded by its address.
async fn bind(cfg: SimConfig, octet: u8, port: u16) -> anyhow::Result<SimHandle> {
    let cfg = SimConfig {
        seed: u64::from(octet),
        ..cfg
    };
    let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, octet), port));
    let s = SimServer::bind(cfg, addr)
        .await
        .with_context(|| format!("binding a replica on {addr}"))?;
    Ok(s.spawn())
}
