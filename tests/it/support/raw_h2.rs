//! Raw HTTP/2 frames over a TcpStream (h2c by prior knowledge), for the attack tests: frames a
//! well-behaved client library would never send (floods, resets before the answer, endless
//! CONTINUATION). Header blocks are HPACK literals without Huffman coding or indexing, so
//! they need no encoder state; frames read back are only split, never HPACK-decoded.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// SETTINGS identifiers (RFC 9113 6.5.2).
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// CANCEL, the error code of a client's RST_STREAM in the rapid-reset attack.
pub const CANCEL: u32 = 0x8;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix, the prefix's other bits set to `high`.
fn int(out: &mut Vec<u8>, n: u32, high: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(high | v as u8);
        return;
    }
    out.push(high | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    int(out, 7, 0, s.len());
    out.extend_from_slice(s);
}

/// A header field "literal without indexing, new name" (RFC 7541 6.2.2).
pub fn field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(0x00);
    string(out, name.as_bytes());
    string(out, value);
}

/// The header block of `method path` with the given extra fields.
pub fn request_block(method: &str, path: &str, extra: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    field(&mut b, ":method", method.as_bytes());
    field(&mut b, ":scheme", b"http");
    field(&mut b, ":authority", b"localhost");
    field(&mut b, ":path", path.as_bytes());
    for (k, v) in extra {
        field(&mut b, k, v);
    }
    b
}

pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The (identifier, value) pairs of a SETTINGS frame.
    pub fn settings(&self) -> Vec<(u16, u32)> {
        self.payload
            .chunks_exact(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect()
    }
}

/// One HTTP/2 connection, prior knowledge, with the client preface sent.
pub struct RawH2 {
    pub s: TcpStream,
    buf: Vec<u8>,
}

impl RawH2 {
    pub async fn connect(addr: SocketAddr) -> RawH2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        RawH2 { s, buf: Vec::new() }
    }

    /// Writes; an error (the server closed or reset) is returned, not a panic: attacks are
    /// expected to be cut off.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.s.write_all(bytes).await
    }

    /// The next frame, or None when the connection ended (EOF, reset) or `within` passed.
    pub async fn read_frame(&mut self, within: Duration) -> Option<Frame> {
        let fill = async {
            loop {
                if self.buf.len() >= 9 {
                    let len =
                        u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                    if self.buf.len() >= 9 + len {
                        let head: Vec<u8> = self.buf.drain(..9 + len).collect();
                        return Some(Frame {
                            kind: head[3],
                            flags: head[4],
                            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]])
                                & 0x7fff_ffff,
                            payload: head[9..].to_vec(),
                        });
                    }
                }
                let mut chunk = [0u8; 16384];
                match self.s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::time::timeout(within, fill).await.ok().flatten()
    }

    /// Reads frames until one satisfies `want` (returned) or the connection ends / `within`
    /// passes (None).
    pub async fn read_until(
        &mut self,
        within: Duration,
        mut want: impl FnMut(&Frame) -> bool,
    ) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let f = self.read_frame(left).await?;
            if want(&f) {
                return Some(f);
            }
        }
    }
}
