//! A client that goes away at any stage of a request: mid-head, mid-upload, while the upstream
//! thinks, mid-stream. Pass: the upstream is released (the replica's in-flight count back to
//! 0, the upstream connection of that request closed) within 1 s; after 1,000 such
//! disconnects the proxy process holds no more file descriptors than before.

use std::sync::atomic::Ordering;
use std::time::Duration;

use goodput_proxy::app::App;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::*;
use crate::support::binary;
use crate::support::proxy::*;

#[derive(Debug, Clone, Copy)]
enum Stage {
    /// Half a request head.
    Head,
    /// The head and part of the announced body.
    Upload,
    /// The whole request; the upstream has not answered yet (it never will: x-fake-hang).
    Waiting,
    /// Three events into a stream.
    Streaming,
}

const STAGES: [Stage; 4] = [Stage::Head, Stage::Upload, Stage::Waiting, Stage::Streaming];

const BODY: &str = r#"{"model":"tiny","stream":true,"messages":[]}"#;

fn request(extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{extra}\r\n{BODY}",
        BODY.len()
    )
}

/// Plays `stage` on a new connection and returns it, still open: the caller drops it. With
/// `settle`, waits 50 ms for the proxy (and the upstream) to have taken in what was sent, and
/// streams at 20 ms an event; without, as fast as the loop goes (2 ms an event).
async fn play(addr: SocketAddr, stage: Stage, settle: bool) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    match stage {
        Stage::Head => {
            let r = request("");
            s.write_all(&r.as_bytes()[..r.len() / 3]).await.unwrap();
        }
        Stage::Upload => {
            let r = request("");
            s.write_all(&r.as_bytes()[..r.len() - BODY.len() / 2])
                .await
                .unwrap();
        }
        Stage::Waiting => {
            s.write_all(request("x-fake-hang: 1\r\n").as_bytes())
                .await
                .unwrap();
        }
        Stage::Streaming => {
            let delay = if settle { 20 } else { 2 };
            let extra = format!("x-fake-events: 1000\r\nx-fake-delay-ms: {delay}\r\n");
            s.write_all(request(&extra).as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while got.windows(2).filter(|w| w == b"\n\n").count() < 3 {
                let n =
                    tokio::time::timeout(QUICK, tokio::io::AsyncReadExt::read(&mut s, &mut buf))
                        .await
                        .expect("events in time")
                        .unwrap();
                assert!(n > 0, "stream ended early");
                got.extend_from_slice(&buf[..n]);
            }
        }
    }
    if settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s
}

#[tokio::test]
async fn a_client_leaving_at_any_stage_releases_the_upstream_within_1s() {
    let _serial = crate::support::serial().await;
    let fake = start_fake().await;
    let app = App::bind(test_config(&[fake.url()]).check().unwrap())
        .await
        .unwrap();
    let state = app.state();
    let proxy = run_app(app);
    let in_flight = || {
        state
            .upstreams
            .replicas()
            .iter()
            .map(|r| r.in_flight())
            .sum::<usize>()
    };
    // Settle the background connections (health probes, model listing).
    tokio::time::sleep(Duration::from_millis(500)).await;
    for stage in STAGES {
        let before = fake.stats.connections.load(Ordering::SeqCst);
        let conn = play(proxy.addr, stage, true).await;
        if matches!(stage, Stage::Waiting | Stage::Streaming) {
            assert_eq!(
                in_flight(),
                1,
                "{stage:?}: the request reached the upstream"
            );
        }
        drop(conn);
        let released = eventually(Duration::from_secs(1), || {
            in_flight() == 0 && fake.stats.connections.load(Ordering::SeqCst) <= before
        })
        .await;
        assert!(
            released,
            "{stage:?}: in flight {}, upstream connections {} (before {before})",
            in_flight(),
            fake.stats.connections.load(Ordering::SeqCst)
        );
    }
    // The fake counts the abort when its stream body is dropped, which may come after the
    // proxy let go of the request (a loaded machine).
    let aborted = eventually(Duration::from_secs(1), || {
        fake.stats.aborted.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(
        aborted,
        "the stream was aborted: {} aborts",
        fake.stats.aborted.load(Ordering::SeqCst)
    );
}

/// 1,000 disconnects (250 at each stage) against the real binary; its fd count must come back
/// to what it was after a warm-up round (+2 for pooled idle upstream connections that may
/// come and go), within 10 s.
#[tokio::test]
async fn a_thousand_disconnects_leave_the_fd_count_where_it_was() {
    let _serial = crate::support::serial().await;
    let fake = start_fake().await;
    // One access line per request would be 1,000 lines of noise.
    let quiet = [("RUST_LOG", "info,goodput_proxy::access=warn".to_string())];
    let bin = binary::spawn(&fake.url(), &quiet);
    for stage in STAGES {
        drop(play(bin.addr, stage, true).await);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let baseline = bin.fds();
    assert!(baseline > 0, "cannot read /proc/PID/fd");
    for i in 0..1000 {
        drop(play(bin.addr, STAGES[i % 4], false).await);
    }
    let mut now = bin.fds();
    let settled = eventually(Duration::from_secs(10), || {
        now = bin.fds();
        now <= baseline + 2
    })
    .await;
    assert!(
        settled,
        "fds: baseline {baseline}, after 1,000 disconnects {now}"
    );
    eprintln!("fds: baseline {baseline}, after 1,000 disconnects {now}");
}
