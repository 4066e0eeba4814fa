//! Helpers shared by the integration tests of `tests/it`.
//!
//! - `proxy`: an in-process proxy on port 0, a hyper client, a fake upstream chosen by header.
//! - `meter`: the simulator as upstream, `/stats` and `/metrics` readers, a measuring client.
//! - `raw_http`: raw HTTP/1.1 over a TcpStream, for byte-exact checks of the simulator.
//! - `raw_h2`: raw HTTP/2 frames (h2c), for floods and resets no client library sends.
//! - `tls`: the fixture certificates and a rustls client trusting them.
//! - `prom`: metric lookups in Prometheus text that fail when the series is missing.
//! - `serial()`: a lock for timing-sensitive and CPU-heavy tests (see there).
//! - `temp_dir(tag)`: a fresh directory of this test run.
#![allow(dead_code)]

pub mod binary;
pub mod meter;
pub mod prom;
pub mod proxy;
pub mod raw_h2;
pub mod raw_http;
pub mod tls;

/// Held by the tests whose figures depend on the machine's timing (client and proxy within a
/// few ms of each other) and by the CPU-heavy tests that would disturb them, so that no two of
/// them overlap in this binary (libtest runs the others alongside as usual). Take it first:
/// `let _serial = serial().await;`
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A fresh, empty directory under the system's temporary directory, unique to this call, and
/// removed with everything in it when the returned guard drops (a failed test's unwinding
/// drops it too: repeated runs leave nothing behind). `tag` names the test in the path.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("goodput-{tag}-"))
        .tempdir()
        .unwrap()
}

/// A record sink's file (`records.jsonl`) in its own [`temp_dir`], removed when this drops.
/// Dereferences to the file's path.
pub struct TempSink {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TempSink {
    pub fn new(tag: &str) -> Self {
        let dir = temp_dir(tag);
        TempSink {
            path: dir.path().join("records.jsonl"),
            _dir: dir,
        }
    }
}

impl AsRef<std::path::Path> for TempSink {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl std::ops::Deref for TempSink {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

/// A loopback URL whose connections are refused, for as long as this lives. Its socket is bound
/// but never listens: the kernel refuses every connection to the port and hands the port to no
/// other socket meanwhile. (A listener bound and dropped frees its port at once, and a server
/// of another test running alongside could be given it: the "dead" replica then answered.)
pub struct DeadUrl {
    pub url: String,
    _socket: tokio::net::TcpSocket,
}

pub fn dead_url() -> DeadUrl {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let url = format!("http://{}", socket.local_addr().unwrap());
    DeadUrl {
        url,
        _socket: socket,
    }
}
