//! Optional JSONL sink for records, written off the request path: a bounded queue feeds a
//! blocking writer thread; when the queue is full the record is dropped and counted
//! (`goodput_proxy_records_dropped_total`), never waited for. Files rotate by size:
//! `path` -> `path.1` -> ... -> `path.<keep>` (the oldest is deleted).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prometheus::IntCounter;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::measure::record::RequestRecord;

/// Sink settings.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    pub path: PathBuf,
    /// Rotate when the current file would grow past this many bytes.
    pub max_bytes: u64,
    /// Rotated files kept beside the current one.
    pub keep: usize,
    /// Records queued at most before new ones are dropped.
    pub queue: usize,
}

/// The request-path side of the sink: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct RecordSink {
    tx: mpsc::Sender<Arc<RequestRecord>>,
    dropped: IntCounter,
}

impl RecordSink {
    /// Open the file and start the writer (a blocking thread). The returned handle ends after
    /// every `RecordSink` clone is dropped and the queue is written out.
    pub fn spawn(
        cfg: SinkConfig,
        dropped: IntCounter,
    ) -> io::Result<(Self, JoinHandle<io::Result<()>>)> {
        let writer = Writer::open(&cfg)?;
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let task = tokio::task::spawn_blocking(move || writer.run(rx));
        Ok((Self { tx, dropped }, task))
    }

    /// Queue a record; drops and counts it when the queue is full or the writer is gone.
    pub fn send(&self, record: Arc<RequestRecord>) {
        if self.tx.try_send(record).is_err() {
            self.dropped.inc();
        }
    }
}

struct Writer {
    cfg: SinkConfig,
    out: BufWriter<File>,
    size: u64,
}

impl Writer {
    fn open(cfg: &SinkConfig) -> io::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cfg.path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            cfg: cfg.clone(),
            out: BufWriter::new(file),
            size,
        })
    }

    fn run(mut self, mut rx: mpsc::Receiver<Arc<RequestRecord>>) -> io::Result<()> {
        let mut line = Vec::with_capacity(512);
        while let Some(rec) = rx.blocking_recv() {
            line.clear();
            serde_json::to_writer(&mut line, &*rec).map_err(io::Error::other)?;
            line.push(b'\n');
            self.write_line(&line)?;
            // Flush when the queue is momentarily empty, so the file is current when idle.
            if rx.is_empty() {
                self.out.flush()?;
            }
        }
        self.out.flush()
    }

    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.cfg.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.out.flush()?;
        let keep = self.cfg.keep;
        let path = &self.cfg.path;
        if keep == 0 {
            fs::remove_file(path).or_else(ignore_not_found)?;
        } else {
            fs::remove_file(rotated(path, keep)).or_else(ignore_not_found)?;
            for i in (1..keep).rev() {
                fs::rename(rotated(path, i), rotated(path, i + 1)).or_else(ignore_not_found)?;
            }
            fs::rename(path, rotated(path, 1))?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        self.out = BufWriter::new(file);
        self.size = 0;
        Ok(())
    }
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

/// `path.N`.
pub fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}
