//! The proxy under test: the real `goodput-proxy` binary as a child process (so its RSS and fds
//! are its own, read from `/proc/PID`), on loopback port 0, killed when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

pub struct ProxyProcess {
    child: Child,
    pub pid: u32,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    log_task: tokio::task::JoinHandle<()>,
}

/// Settings the soak needs besides the defaults (environment overrides of the config).
pub struct ProxySettings<'a> {
    pub bin: &'a Path,
    pub upstreams: &'a [String],
    pub sink: &'a Path,
    pub log: &'a Path,
    /// `/stats` ring capacity: small, so the ring is full long before the warm-up ends and
    /// the RSS criterion sees leaks, not a bounded buffer filling.
    pub ring: usize,
    pub first_byte_timeout_ms: u64,
}

/// The default binary: `goodput-proxy` beside this executable (cargo puts both in
/// `target/<profile>/`).
pub fn default_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("goodput-proxy")))
        .unwrap_or_else(|| PathBuf::from("goodput-proxy"))
}

impl ProxyProcess {
    pub async fn spawn(s: &ProxySettings<'_>) -> anyhow::Result<Self> {
        let mut cmd = Command::new(s.bin);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ]);
        for u in s.upstreams {
            cmd.args(["--upstream", u]);
        }
        cmd.env(
            "RUST_LOG",
            "warn,goodput_proxy=info,goodput_proxy::access=off",
        )
        .env("GOODPUT_PROXY_MEASURE_SINK_PATH", s.sink)
        // One file for the whole run (no rotation to follow): 64 GiB.
        .env(
            "GOODPUT_PROXY_MEASURE_SINK_MAX_BYTES",
            (64u64 << 30).to_string(),
        )
        .env("GOODPUT_PROXY_MEASURE_RECORDS", s.ring.to_string())
        .env(
            "GOODPUT_PROXY_UPSTREAM_FIRST_BYTE_TIMEOUT_MS",
            s.first_byte_timeout_ms.to_string(),
        );
        Self::start(cmd, s.log).await
    }

    /// Starts `cmd` (a `goodput-proxy serve` on port 0), its stderr logged to `log`, and waits
    /// until it has logged both its addresses.
    pub async fn start(mut cmd: Command, log_path: &Path) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting the proxy")?;
        let pid = child.id().context("the proxy exited at once")?;
        let stderr = child.stderr.take().context("no stderr pipe")?;
        let mut log = tokio::fs::File::create(log_path)
            .await
            .with_context(|| format!("creating {}", log_path.display()))?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        // Every line goes to the log file; the first ones are also searched for the addresses.
        let log_task = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = log.write_all(line.as_bytes()).await;
                let _ = log.write_all(b"\n").await;
                let _ = tx.send(line);
            }
            let _ = log.flush().await;
        });
        let (mut addr, mut admin) = (None, None);
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            while addr.is_none() || admin.is_none() {
                let Some(line) = rx.recv().await else { break };
                addr = addr.or_else(|| logged_addr(&line, "proxy listening"));
                admin = admin.or_else(|| logged_addr(&line, "admin listening"));
            }
        })
        .await;
        let (Ok(()), Some(addr), Some(admin)) = (found, addr, admin) else {
            anyhow::bail!(
                "the proxy did not log its addresses within 30 s (see {})",
                log_path.display()
            );
        };
        Ok(Self {
            child,
            pid,
            addr,
            admin,
            log_task,
        })
    }

    /// SIGTERM (graceful drain: the JSONL sink is written out), then wait up to `grace`;
    /// killed after that. Returns whether it exited on its own.
    pub async fn stop(mut self, grace: Duration) -> bool {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let clean = matches!(
            tokio::time::timeout(grace, self.child.wait()).await,
            Ok(Ok(s)) if s.success()
        );
        if !clean {
            let _ = self.child.kill().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.log_task).await;
        clean
    }
}

fn logged_addr(line: &str, what: &str) -> Option<SocketAddr> {
    if !line.contains(what) {
        return None;
    }
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .and_then(|a| a.parse().ok())
}

/// One sample of the proxy's resources from `/proc/PID`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub rss_kib: u64,
    pub fds: u64,
}

/// RSS (`VmRSS` of `/proc/PID/status`) and open fds (`/proc/PID/fd` entries); `None` once
/// the process is gone.
pub fn sample(pid: u32, t_s: f64) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample { t_s, rss_kib, fds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_process_and_the_logged_addresses() {
        let s = sample(std::process::id(), 1.5).unwrap();
        assert!(s.rss_kib > 0 && s.fds > 0, "{s:?}");
        assert!(sample(u32::MAX, 0.0).is_none());
        let line = "2026-12-01T19:00:00Z  INFO goodput_proxy: proxy listening addr=127.0.0.1:4321";
        assert_eq!(
            logged_addr(line, "proxy listening"),
            Some("127.0.0.1:4321".parse().unwrap())
        );
        assert_eq!(logged_addr(line, "admin listening"), None);
    }
}
