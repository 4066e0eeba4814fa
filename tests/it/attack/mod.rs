//! The attack and failure suite: what a hostile or broken client or upstream can
//! do to the proxy, each test with a pass criterion it checks. docs/RELIABILITY.md lists them
//! with their measured results; the long parts are `#[ignore]` with their command there.

mod auth;
mod cardinality;
mod disconnect;
mod h2flood;
mod identity;
mod keepalive;
mod limits;
mod slow;
mod smuggling;
mod tls_reload;
mod truncation;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::proxy::SLOW;

/// Writes `bytes` (a write error is fine: the proxy may cut an attack off mid-way), then reads
/// until the proxy closes or resets the connection, or `within` passes.
pub async fn exchange(addr: SocketAddr, bytes: &[u8], within: Duration) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    read_all(&mut s, within).await
}

/// Reads until EOF, a reset, or `within`.
pub async fn read_all(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, async {
        let mut buf = [0u8; 16384];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    out
}

/// The status code of the first response in `raw` (None when nothing came back).
pub fn status(raw: &[u8]) -> Option<u16> {
    let line = raw.split(|b| *b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// How many responses `raw` holds (status lines at a line start).
pub fn responses(raw: &[u8]) -> usize {
    let text = String::from_utf8_lossy(raw);
    text.match_indices("HTTP/1.1 ")
        .filter(|(i, _)| *i == 0 || text[..*i].ends_with('\n'))
        .count()
}

/// Generous: anything the proxy should answer at once, on a loaded 2-core machine.
pub const QUICK: Duration = SLOW;
