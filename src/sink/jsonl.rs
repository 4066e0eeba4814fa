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

use goodput_measure::record::RequestRecord;

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

#[cfg(test)]
mod tests {
    use super::*;
    use goodput_measure::meter::Measurement;
    use goodput_measure::outcome::Outcome;
    use goodput_measure::slo::SloVerdict;
    use std::time::Duration;

    fn record(i: usize) -> Arc<RequestRecord> {
        let m = Measurement::without_body(Outcome::Success, Some(200), Duration::from_millis(5));
        let end = tokio::time::Instant::now();
        Arc::new(RequestRecord::new(
            format!("req-{i}").into(),
            "tiny".into(),
            None,
            0,
            end,
            m,
            SloVerdict::default(),
        ))
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn writes_jsonl_rotates_by_size_and_counts_drops() {
        let dir = std::env::temp_dir().join(format!("goodput-sink-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("records.jsonl");
        let dropped = IntCounter::new("d", "d").unwrap();
        let cfg = SinkConfig {
            path: path.clone(),
            max_bytes: 4096,
            keep: 2,
            queue: 8,
        };
        let (sink, task) = RecordSink::spawn(cfg, dropped.clone()).unwrap();
        let sent = 2000;
        for i in 0..sent {
            sink.send(record(i)); // never waits, whatever the writer does
        }
        drop(sink);
        task.await.unwrap().unwrap();
        let files = [path.clone(), rotated(&path, 1), rotated(&path, 2)];
        for f in &files {
            let len = fs::metadata(f).map(|m| m.len()).unwrap_or(0);
            assert!(len <= 4096, "{f:?} is {len} bytes");
        }
        assert!(!rotated(&path, 3).exists(), "keeps 2 rotated files");
        let written: usize = files.iter().map(|f| lines(f).len()).sum();
        // What was not written was dropped and counted, or rotated away (3 files of 4 KiB).
        assert!(dropped.get() as usize + written <= sent);
        assert!(written > 0);
        let newest = lines(&path);
        let last = newest.last().unwrap();
        assert_eq!(last["outcome"], "success");
        assert!(last["id"].as_str().unwrap().starts_with("req-"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_blocking() {
        let dir = std::env::temp_dir().join(format!("goodput-sink-full-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.jsonl");
        let _ = fs::remove_file(&path);
        let dropped = IntCounter::new("d", "d").unwrap();
        let cfg = SinkConfig {
            path: path.clone(),
            max_bytes: u64::MAX,
            keep: 1,
            queue: 1,
        };
        let (sink, task) = RecordSink::spawn(cfg, dropped.clone()).unwrap();
        let sent = 5000;
        for i in 0..sent {
            sink.send(record(i));
        }
        drop(sink);
        task.await.unwrap().unwrap();
        let written = lines(&path).len();
        assert_eq!(
            written + dropped.get() as usize,
            sent,
            "every record is written or counted"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
