//! The ClickHouse sink: every record, batched, over the HTTP interface, off the request path.
//!
//! The request path only calls [`ClickHouseSink::send`]: a `try_send` into a bounded queue
//! (`queue` records); a full queue drops the record and counts it in
//! `goodput_proxy_records_dropped_total{sink="clickhouse"}`. Nothing on the request path waits
//! for the store, whatever it does.
//!
//! One shipper task takes up to `batch_size` records, or what arrived within `flush_interval`
//! of the first one, turns them into `JSONEachRow` lines (on a blocking thread, so a large
//! batch never stalls a runtime worker), gzips them and INSERTs. A failed INSERT is retried
//! with the same bytes after a backoff (`retry_initial` doubling to `retry_max`): while the
//! store is down, the batch in hand waits and the queue fills behind it, then drops. A batch the
//! store *answers* with an error `max_attempts` times in a row is dropped and counted (the
//! data or schema is wrong; retrying would block everything behind it). Accounting is exact:
//! every record sent is shipped, dropped (counted), or still queued.
//!
//! Each row carries `uid` = this process's random boot id + a sequence number, assigned
//! once per record, so a batch that is retried after it had landed (an answer lost on the
//! way back) holds the same uids: the ReplacingMergeTree table (schema.sql) collapses them.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus::IntCounter;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::http::{ChError, ChHttp};
use super::row::write_row;
use crate::config::ClickHouseConfig;
use goodput_measure::record::RequestRecord;

/// The counters the sink keeps (the `sink="clickhouse"` children).
#[derive(Debug, Clone)]
pub struct SinkCounters {
    pub dropped: IntCounter,
    pub shipped: IntCounter,
    pub errors: IntCounter,
}

/// The request-path side: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct ClickHouseSink {
    tx: mpsc::Sender<Arc<RequestRecord>>,
    dropped: IntCounter,
}

impl ClickHouseSink {
    /// Starts the shipper. It ends once every `ClickHouseSink` clone is dropped and what was
    /// queued is shipped (or, with the store unreachable, after `max_attempts` tries per batch).
    pub fn spawn(
        cfg: &ClickHouseConfig,
        counters: SinkCounters,
    ) -> Result<(Self, JoinHandle<()>), String> {
        let http = ChHttp::new(cfg.url.as_str(), &cfg.user, &cfg.password, cfg.timeout)?;
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let shipper = Shipper {
            http,
            cfg: cfg.clone(),
            counters: counters.clone(),
            boot: rand::random::<u64>(),
            seq: 0,
        };
        let task = tokio::spawn(shipper.run(rx));
        Ok((
            Self {
                tx,
                dropped: counters.dropped,
            },
            task,
        ))
    }

    /// Queues a record; drops and counts it when the queue is full or the shipper is gone.
    pub fn send(&self, record: &Arc<RequestRecord>) {
        if self.tx.try_send(record.clone()).is_err() {
            self.dropped.inc();
        }
    }
}

struct Shipper {
    http: ChHttp,
    cfg: ClickHouseConfig,
    counters: SinkCounters,
    boot: u64,
    seq: u64,
}

impl Shipper {
    async fn run(mut self, mut rx: mpsc::Receiver<Arc<RequestRecord>>) {
        let limit = self.cfg.batch_size.max(1);
        let mut batch: Vec<Arc<RequestRecord>> = Vec::with_capacity(limit.min(1 << 14));
        let mut open = true;
        while open {
            if rx.recv_many(&mut batch, limit).await == 0 {
                break; // closed and empty
            }
            let deadline = Instant::now() + self.cfg.flush_interval;
            while batch.len() < limit {
                let room = limit - batch.len();
                tokio::select! {
                    n = rx.recv_many(&mut batch, room) => {
                        if n == 0 {
                            open = false;
                            break;
                        }
                    }
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            let records = std::mem::take(&mut batch);
            let n = records.len() as u64;
            let first_seq = self.seq;
            self.seq += n;
            let (boot, gzip) = (self.boot, self.cfg.gzip);
            let body =
                tokio::task::spawn_blocking(move || encode(&records, boot, first_seq, gzip)).await;
            match body {
                Ok(body) => self.ship(body, n, !open || rx.is_closed()).await,
                Err(e) => {
                    tracing::error!(error = %e, records = n, "clickhouse sink: encoding a batch failed; dropped");
                    self.counters.dropped.inc_by(n);
                }
            }
        }
    }

    /// INSERTs one encoded batch of `n` records, retrying as the module doc says. `closing`:
    /// the proxy is shutting down, so an unreachable store gets `max_attempts` tries too.
    async fn ship(&self, body: Bytes, n: u64, closing: bool) {
        let mut delay = self.cfg.retry_initial;
        let (mut refused, mut attempts) = (0u32, 0u32);
        loop {
            attempts += 1;
            let err = match self
                .http
                .insert(
                    &self.cfg.database,
                    &self.cfg.table,
                    body.clone(),
                    self.cfg.gzip,
                )
                .await
            {
                Ok(()) => {
                    self.counters.shipped.inc_by(n);
                    if attempts > 1 {
                        tracing::info!(
                            records = n,
                            attempts,
                            "clickhouse sink: batch shipped after retries"
                        );
                    }
                    return;
                }
                Err(e) => e,
            };
            self.counters.errors.inc();
            if matches!(err, ChError::Refused { .. }) {
                refused += 1;
            } else {
                refused = 0;
            }
            if refused >= self.cfg.max_attempts || (closing && attempts >= self.cfg.max_attempts) {
                tracing::error!(error = %err, records = n, attempts, "clickhouse sink: batch dropped");
                self.counters.dropped.inc_by(n);
                return;
            }
            if attempts == 1 {
                tracing::warn!(error = %err, records = n, "clickhouse sink: insert failed; retrying with backoff");
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2)
                .min(self.cfg.retry_max)
                .max(Duration::from_millis(1));
        }
    }
}

/// The batch as JSONEachRow lines, gzipped when asked. Record `i` gets uid `<boot>-<seq+i>`.
fn encode(records: &[Arc<RequestRecord>], boot: u64, first_seq: u64, gzip: bool) -> Bytes {
    let mut lines = Vec::with_capacity(records.len() * 480);
    let mut uid = String::with_capacity(40);
    for (i, r) in records.iter().enumerate() {
        uid.clear();
        use std::fmt::Write as _;
        let _ = write!(uid, "{boot:016x}-{}", first_seq + i as u64);
        write_row(r, &uid, &mut lines);
    }
    if !gzip {
        return Bytes::from(lines);
    }
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(lines.len() / 6),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    match enc.write_all(&lines).and_then(|()| enc.finish()) {
        Ok(gz) => Bytes::from(gz),
        Err(_) => Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use goodput_measure::meter::Measurement;
    use goodput_measure::outcome::Outcome;
    use std::io::Read as _;

    fn record(i: u64) -> Arc<RequestRecord> {
        let m = Measurement::without_body(Outcome::Success, Some(200), Duration::from_millis(i));
        Arc::new(RequestRecord::new(
            format!("r{i}").into(),
            "tiny".into(),
            None,
            0,
            Instant::now(),
            m,
            Default::default(),
        ))
    }

    fn counters() -> SinkCounters {
        let c = |n: &str| IntCounter::new(n, n).unwrap();
        SinkCounters {
            dropped: c("d"),
            shipped: c("s"),
            errors: c("e"),
        }
    }

    #[test]
    fn encodes_one_line_per_record_with_consecutive_uids() {
        let recs: Vec<_> = (0..3).map(record).collect();
        let gz = encode(&recs, 0xab, 7, true);
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .unwrap();
        let uids: Vec<String> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["uid"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            uids,
            [
                "00000000000000ab-7",
                "00000000000000ab-8",
                "00000000000000ab-9"
            ]
        );
        assert_eq!(encode(&recs, 0xab, 7, false), Bytes::from(text));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_an_unreachable_store_never_blocks_send() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        drop(l); // nothing listens: every insert is refused at connect
        let ms = std::time::Duration::from_millis;
        let cfg = ClickHouseConfig {
            url: crate::config::BaseUrl::parse(&url).unwrap(),
            queue: 10,
            batch_size: 5,
            flush_interval: ms(1),
            retry_initial: ms(1),
            retry_max: ms(2),
            max_attempts: 2,
            ..Default::default()
        };
        let c = counters();
        let (sink, task) = ClickHouseSink::spawn(&cfg, c.clone()).unwrap();
        let t = tokio::time::Instant::now();
        for i in 0..1000 {
            sink.send(&record(i));
        }
        assert!(t.elapsed() < Duration::from_millis(500), "send never waits");
        drop(sink);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        // Closing: each batch got max_attempts tries, then was dropped and counted.
        assert_eq!(c.shipped.get(), 0);
        assert_eq!(c.dropped.get(), 1000, "every record is shipped or counted");
        assert!(c.errors.get() >= 2);
    }
}
