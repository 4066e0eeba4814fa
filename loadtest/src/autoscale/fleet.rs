//! The simulated fleet: engine replicas in this process, published to the proxy through its
//! DNS discovery (a resolver that answers with the ready replicas, as a headless Service
//! answers with its ready pods). A replica asked for becomes ready after the start delay (an
//! engine loading its weights); one removed leaves the answer at once and is stopped after a
//! drain, so its streams finish.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goodput_proxy::discover::{Resolved, Resolver};
use goodput_sim::{SimConfig, SimHandle, SimServer};

/// Answers every name with the ready replicas' addresses.
#[derive(Default)]
pub struct Ready(Mutex<Vec<SocketAddr>>);

impl Resolver for Ready {
    fn resolve<'a>(&'a self, _host: &'a str, _port: u16) -> Resolved<'a> {
        let addrs = self.0.lock().map(|a| a.clone()).unwrap_or_default();
        Box::pin(async move { Ok(addrs) })
    }
}

enum Slot {
    /// Asked for; binds once its start delay has passed.
    Starting(tokio::task::JoinHandle<anyhow::Result<SimHandle>>),
    Ready(SimHandle),
}

pub struct Fleet {
    sim: SimConfig,
    start_delay: Duration,
    drain: Duration,
    pub ready: Arc<Ready>,
    slots: Vec<Slot>,
    next_seed: u64,
}

impl Fleet {
    pub fn new(sim: SimConfig, start_delay: Duration, drain: Duration) -> Self {
        Fleet {
            sim,
            start_delay,
            drain,
            ready: Arc::new(Ready::default()),
            slots: Vec::new(),
            next_seed: 1,
        }
    }

    /// Replicas asked for (starting or ready): what they cost.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Starts one replica at once (the fleet's first).
    pub async fn add_now(&mut self) -> anyhow::Result<()> {
        let h = self.bind().await?;
        self.slots.push(Slot::Ready(h));
        self.publish();
        Ok(())
    }

    fn bind(&mut self) -> impl std::future::Future<Output = anyhow::Result<SimHandle>> {
        let cfg = SimConfig {
            seed: self.next_seed,
            ..self.sim.clone()
        };
        self.next_seed += 1;
        async move {
            let s = SimServer::bind(cfg, ([127, 0, 0, 1], 0).into()).await?;
            Ok(s.spawn())
        }
    }

    /// Moves the count towards `n`: new replicas start (ready after the delay), the newest go.
    pub fn scale_to(&mut self, n: usize) {
        while self.slots.len() < n {
            let delay = self.start_delay;
            let bind = self.bind();
            self.slots.push(Slot::Starting(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                bind.await
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
        self.publish();
    }

    /// Replicas whose start delay has passed join the answer.
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
            self.publish();
        }
        Ok(())
    }

    pub fn ready_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Ready(_)))
            .count()
    }

    fn publish(&self) {
        let addrs = self
            .slots
            .iter()
            .filter_map(|s| match s {
                Slot::Ready(h) => Some(h.local_addr()),
                Slot::Starting(_) => None,
            })
            .collect();
        if let Ok(mut a) = self.ready.0.lock() {
            *a = addrs;
        }
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
