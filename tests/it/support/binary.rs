//! The real `goodput-proxy` binary on port 0: spawned with environment overrides, its stderr
//! echoed and searched for the addresses it logs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use super::proxy::SLOW;

/// The real binary, a line-reader on its stderr, and the addresses it logged.
pub struct Binary {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// Every stderr line so far (the reader thread keeps sending).
    pub lines: std::sync::mpsc::Receiver<String>,
}

impl Binary {
    /// Open file descriptors of the process (Linux `/proc`).
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Sends `signal` (e.g. "TERM", "HUP") with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success());
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `goodput-proxy serve` in front of `upstream`, listening on loopback port 0, with `env`
/// (config overrides such as `GOODPUT_PROXY_SERVER_GRACE_PERIOD_MS`) and `extra` arguments.
pub fn spawn_with(upstream: &str, env: &[(&str, String)], extra: &[&str]) -> Binary {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_goodput-proxy"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
    ])
    .args(extra)
    .env("GOODPUT_PROXY_UPSTREAM_HEALTH_INTERVAL_MS", "200")
    .env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn goodput-proxy");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[proxy] {line}");
            let _ = tx.send(line);
        }
    });
    let find = |line: &str, what: &str| -> Option<SocketAddr> {
        if !line.contains(what) {
            return None;
        }
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .and_then(|a| a.parse().ok())
    };
    let (mut addr, mut admin) = (None, None);
    while addr.is_none() || admin.is_none() {
        let line = rx.recv_timeout(SLOW).expect("binary logs its addresses");
        addr = addr.or_else(|| find(&line, "proxy listening"));
        admin = admin.or_else(|| find(&line, "admin listening"));
    }
    Binary {
        child,
        addr: addr.unwrap(),
        admin: admin.unwrap(),
        lines: rx,
    }
}

/// [`spawn_with`] without extra arguments.
pub fn spawn(upstream: &str, env: &[(&str, String)]) -> Binary {
    spawn_with(upstream, env, &[])
}
