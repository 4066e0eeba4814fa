//! The long part of the slow-client suite: Debian's `slowhttptest` against the real binary,
//! slowloris (`-H`, heads trickled) and slow body (`-B`, bodies trickled), 1,000 connections
//! each for 60 s. Pass: every probe (a normal request every 500 ms on a fresh connection) gets
//! 200 within 2 s for the whole attack, and the proxy held more than 200 fds at some point (the
//! attack really ran).
//!
//! `apt-get install slowhttptest`, then
//! `cargo test --test it attack::slow -- --ignored --nocapture` (about 2.5 min).
//! The quick in-process versions run in CI: `proxy_lifecycle::slowloris_...` and
//! `attack::limits::a_stalled_upload_is_408_...`.

use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::support::binary;
use crate::support::proxy::*;

async fn under_attack(mode: &str, path: &str) -> (usize, Duration, usize) {
    let fake = start_fake().await;
    let bin = binary::spawn(
        &fake.url(),
        &[("RUST_LOG", "info,goodput_proxy::access=warn".to_string())],
    );
    let url = format!("http://{}{path}", bin.addr);
    let mut attack = Command::new("slowhttptest")
        .args([
            mode, "-c", "1000", "-i", "10", "-r", "200", "-l", "60", "-x", "24", "-p", "3",
        ])
        .args(["-u", &url])
        .args(if mode == "-B" {
            &["-t", "POST"][..]
        } else {
            &["-t", "GET"][..]
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("slowhttptest installed (apt-get install slowhttptest)");
    // Let the attack open its connections first.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let c = client();
    let started = Instant::now();
    let (mut probes, mut worst, mut peak_fds) = (0, Duration::ZERO, 0);
    while started.elapsed() < Duration::from_secs(50) {
        peak_fds = peak_fds.max(bin.fds());
        let t = Instant::now();
        let (parts, _) = send(&c, get(&format!("http://{}/version", bin.addr))).await;
        let took = t.elapsed();
        assert_eq!(
            parts.status, 200,
            "{mode}: probe {probes} got {}",
            parts.status
        );
        assert!(
            took < Duration::from_secs(2),
            "{mode}: probe {probes} took {took:?}"
        );
        worst = worst.max(took);
        probes += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = attack.kill();
    let _ = attack.wait();
    // The attack was real: the proxy held hundreds of its connections at once.
    assert!(
        peak_fds > 200,
        "{mode}: the proxy never held more than {peak_fds} fds"
    );
    (probes, worst, peak_fds)
}

#[tokio::test]
#[ignore = "long: needs slowhttptest, ~2.5 min (see the module doc)"]
async fn slowhttptest_slowloris_and_slow_body_leave_normal_requests_served() {
    let _serial = crate::support::serial().await;
    for (mode, path) in [("-H", "/version"), ("-B", "/v1/completions")] {
        let (probes, worst, fds) = under_attack(mode, path).await;
        eprintln!(
            "slowhttptest {mode}: {probes} probes, all 200, slowest {worst:?}; proxy fds peak {fds}"
        );
    }
}
