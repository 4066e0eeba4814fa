//! The soak's load: closed-loop workers (each sends its next request when the previous one
//! ended, so CPU contention slows the run down instead of piling requests up), every request
//! of a class drawn from the seed, every outcome written into the client ledger by index.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goodput_sim::FAULT_HEADER;
use http::Uri;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::classes::{class_of, outcome_index, plan, CLASSES};
use super::verdict::{ClientLedger, Tally, OUTCOMES};
use crate::client::{self, HttpClient, Outgoing};
use crate::request;
use crate::scenario::Api;

pub struct Driver {
    pub client: HttpClient,
    pub chat: Uri,
    pub completions: Uri,
    pub run_id: String,
    pub seed: u64,
    pub model: String,
    pub timeout: Duration,
    next: AtomicU64,
    /// Requests handed to the client (the ledger must hold exactly these).
    begun: AtomicU64,
    pub in_flight: AtomicU64,
    ledger: Mutex<ClientLedger>,
    tally: Mutex<Tally>,
}

/// When a phase's workers stop taking new requests.
#[derive(Clone, Copy)]
pub enum Stop {
    At(Instant),
    /// Request indices below this bound.
    Below(u64),
}

impl Driver {
    pub fn new(client: HttpClient, base: &str, run_id: String, seed: u64) -> anyhow::Result<Self> {
        Ok(Self {
            client,
            chat: format!("{base}{}", Api::Chat.path()).parse()?,
            completions: format!("{base}{}", Api::Completions.path()).parse()?,
            run_id,
            seed,
            model: "tiny".into(),
            timeout: Duration::from_secs(60),
            next: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            ledger: Mutex::new(ClientLedger::default()),
            tally: Mutex::new([0; OUTCOMES]),
        })
    }

    /// Requests handed to the client so far.
    pub fn issued(&self) -> u64 {
        self.begun.load(Ordering::Relaxed)
    }

    /// The next request index.
    pub fn next_index(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Client outcomes so far.
    pub fn tally(&self) -> Tally {
        *self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ledger, taken out at the end.
    pub fn into_ledger(self: Arc<Self>) -> ClientLedger {
        let mut l = std::mem::take(&mut *self.ledger.lock().unwrap_or_else(|e| e.into_inner()));
        l.sent = self.issued();
        l
    }

    /// `workers` closed-loop workers until `stop`; returns when every request has ended (each
    /// is bounded by the client deadline).
    pub async fn phase(self: &Arc<Self>, workers: usize, stop: Stop) {
        let mut set = JoinSet::new();
        for _ in 0..workers {
            let d = self.clone();
            set.spawn(async move {
                loop {
                    if let Stop::At(t) = stop {
                        if Instant::now() >= t {
                            return;
                        }
                    }
                    let i = d.next.fetch_add(1, Ordering::Relaxed);
                    if let Stop::Below(n) = stop {
                        if i >= n {
                            // Never sent (not counted in `begun`); no phase follows an audit.
                            return;
                        }
                    }
                    d.one(i).await;
                }
            });
        }
        while set.join_next().await.is_some() {}
    }

    async fn one(&self, i: u64) {
        let k = class_of(self.seed, i);
        let class = &CLASSES[k];
        let p = plan(class, &self.model, i);
        let id = format!("{}-{i:07}", self.run_id);
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let sent = client::send(
            &self.client,
            Outgoing {
                uri: match class.api {
                    Api::Chat => &self.chat,
                    Api::Completions => &self.completions,
                },
                body: request::body(&p),
                stream: p.stream,
                request_id: &id,
                extra_header: class.fault.map(|f| (FAULT_HEADER, f)),
                timeout: self.timeout,
                hangup_after: p.hangup_after,
            },
        )
        .await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let o = outcome_index(sent.measurement.outcome);
        self.tally.lock().unwrap_or_else(|e| e.into_inner())[o] += 1;
        let mut l = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let i = i as usize;
        if l.requests.len() <= i {
            l.requests.resize(i + 1, None);
        }
        if l.requests[i].is_some() {
            l.duplicates += 1;
        } else {
            l.requests[i] = Some((k as u8, o as u8));
        }
    }
}

/// The audit tally the proxy must show: the class's proxy outcome of each audit request.
pub fn audit_expected(ledger: &ClientLedger, from: u64) -> Tally {
    let mut t = [0; OUTCOMES];
    for (c, _) in ledger.requests.iter().skip(from as usize).flatten() {
        t[outcome_index(CLASSES[usize::from(*c)].proxy)] += 1;
    }
    t
}
