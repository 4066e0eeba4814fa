//! Raw HTTP/1.1 over tokio TcpStream for the sim's integration tests: full control over the
//! bytes (headers as sent, de-chunked body, truncation, disconnects).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The simulator on port 0 (one definition, in `meter`).
pub use super::meter::start_sim as start;
/// Polling until a condition holds (one definition, in `proxy`).
pub use super::proxy::eventually;

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    /// `HTTP/1.1 200 OK`
    pub status_line: String,
    /// Header lines in order, names lowercase.
    pub headers: Vec<(String, String)>,
    /// De-chunked body.
    pub body: Vec<u8>,
    /// The body ended with the terminating zero-length chunk (or full content-length).
    pub complete: bool,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }

    /// SSE data payloads in order (`data: ` stripped).
    pub fn events(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap_or(e).to_string())
            .collect()
    }

    pub fn json_events(&self) -> Vec<serde_json::Value> {
        self.events()
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
            .collect()
    }
}

pub fn request_bytes(
    method: &str,
    path: &str,
    extra_headers: &[(&str, &str)],
    body: &str,
) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nhost: sim\r\nconnection: close\r\n");
    for (k, v) in extra_headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        r.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        ));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request_bytes(method, path, headers, body))
        .await
        .unwrap();
    let mut raw = Vec::new();
    // A reset (truncation) ends the read like EOF does.
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = [0u8; 16384];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    parse(&raw)
}

pub async fn post(addr: SocketAddr, path: &str, body: &str) -> Resp {
    send(addr, "POST", path, &[], body).await
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    send(addr, "GET", path, &[], "").await
}

pub fn parse(raw: &[u8]) -> Resp {
    let end = memchr::memmem::find(raw, b"\r\n\r\n").expect("no header end");
    let head = std::str::from_utf8(&raw[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap().to_string();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_ascii_lowercase(), v.to_string())
        })
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v == "chunked");
    if !chunked {
        let len: Option<usize> = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.parse().unwrap());
        let complete = len.is_none_or(|l| rest.len() == l);
        return Resp {
            status,
            status_line,
            headers,
            body: rest.to_vec(),
            complete,
        };
    }
    let mut body = Vec::new();
    let mut i = 0;
    let mut complete = false;
    while let Some(nl) = memchr::memmem::find(&rest[i..], b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&rest[i..i + nl]).unwrap().trim(), 16)
            .unwrap();
        i += nl + 2;
        if size == 0 {
            complete = true;
            break;
        }
        let take = size.min(rest.len() - i);
        body.extend_from_slice(&rest[i..i + take]);
        i += take + 2;
        if i > rest.len() {
            break;
        }
    }
    Resp {
        status,
        status_line,
        headers,
        body,
        complete,
    }
}
