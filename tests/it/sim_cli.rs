//! `goodput-proxy sim` as a real process: it binds port 0, prints its address and streams.
//! The test kills the child it started when done.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::support::raw_http;
use std::time::Duration;

/// Kills the child on every exit path, a failed assertion included.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn sim_subcommand_serves_streaming_chat() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_goodput-proxy"))
        .args([
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "tiny",
            "--ttft-ms",
            "1",
            "--tpot-ms",
            "1",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _guard = KillOnDrop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap().to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let addr: std::net::SocketAddr = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap()
        .parse()
        .unwrap();
    let r = raw_http::post(
        addr,
        "/v1/chat/completions",
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":5}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.events().len(), 7);
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
}

#[test]
fn invalid_flags_fail_with_the_field_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_goodput-proxy"))
        .args(["sim", "--listen", "127.0.0.1:0", "--max-num-seqs", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_num_seqs"));
}
