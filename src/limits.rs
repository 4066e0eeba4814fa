//! What one client may make the proxy hold: the limits of the listeners and of the request
//! read, each with its default and the reason for it. Documented in docs/RELIABILITY.md.
//!
//! The values are explicit (none is left to a library default that could change under us).
//! The config's `[limits]` table ([`crate::config::RawLimits`]) sets them; its defaults are
//! [`Limits::default`].

use std::time::Duration;

/// Connection, head and body-read limits of the listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest HTTP/1.1 request head (request line and header fields) in bytes; a larger one
    /// gets 431 and the connection is closed. hyper's `max_buf_size`, so at least
    /// [`MIN_HEAD_BYTES`]. Default 64 KiB: nginx refuses at 4 x 8 KiB buffers, Envoy at 60 KiB.
    pub max_head_bytes: usize,
    /// Most header fields in one HTTP/1.1 request head; more gets 431. Default 100 (nginx and
    /// hyper: 100).
    pub max_headers: usize,
    /// HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`: the decoded header list (names, values and 32
    /// bytes a field, RFC 9113 6.5.2); a larger list gets 431 on its stream. Also bounds what
    /// a CONTINUATION flood can make the decoder buffer. Default 64 KiB, as for HTTP/1.1.
    pub h2_max_header_list_bytes: u32,
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: streams one connection may have open. Default
    /// 100 (RFC 9113's recommended minimum; nginx's and Envoy's default too).
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2 receive window of each stream, bytes: how much request body a client may send
    /// ahead of the proxy reading it. Default 1 MiB.
    pub h2_stream_window_bytes: u32,
    /// HTTP/2 receive window of the whole connection, bytes: bounds the request body buffered
    /// for one connection over all its streams. Default 1 MiB.
    pub h2_connection_window_bytes: u32,
    /// Streams a client may open and reset before the proxy accepted them (the HTTP/2 rapid
    /// reset attack, CVE-2023-44487); beyond it the connection gets GOAWAY. Default 20 (h2's).
    pub h2_max_pending_accept_reset_streams: usize,
    /// Open client connections on the public listener; one more is accepted and closed at
    /// once (a clear refusal, not a stalled backlog). Each can hold an upstream connection
    /// too, so keep it below half the process's file-descriptor limit. Default 8192.
    pub max_connections: usize,
    /// Open connections on the admin listener (Prometheus, probes). Default 256.
    pub admin_max_connections: usize,
    /// A TLS handshake must finish within this long after the first byte. Default 10 s.
    pub tls_handshake_timeout: Duration,
    /// Longest pause between two pieces of a request body (a slow upload, or a client that
    /// stopped sending); then 408 and the connection is closed. Default 30 s.
    pub body_idle_timeout: Duration,
}

/// The smallest `max_head_bytes` hyper accepts (its initial read buffer).
pub const MIN_HEAD_BYTES: usize = 8192;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head_bytes: 64 * 1024,
            max_headers: 100,
            h2_max_header_list_bytes: 64 * 1024,
            h2_max_concurrent_streams: 100,
            h2_stream_window_bytes: 1024 * 1024,
            h2_connection_window_bytes: 1024 * 1024,
            h2_max_pending_accept_reset_streams: 20,
            max_connections: 8192,
            admin_max_connections: 256,
            tls_handshake_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
        }
    }
}

impl Limits {
    /// Every value that would make a library panic or refuse all traffic: (field as named in
    /// the `[limits]` table, why), all of them at once.
    pub fn check(&self) -> Vec<(&'static str, String)> {
        let mut bad = Vec::new();
        if self.max_head_bytes < MIN_HEAD_BYTES {
            bad.push((
                "max_head_bytes",
                format!("must be at least {MIN_HEAD_BYTES}"),
            ));
        }
        let positive = [
            ("max_headers", self.max_headers as u64),
            (
                "h2_max_header_list_bytes",
                self.h2_max_header_list_bytes.into(),
            ),
            (
                "h2_max_concurrent_streams",
                self.h2_max_concurrent_streams.into(),
            ),
            ("max_connections", self.max_connections as u64),
            ("admin_max_connections", self.admin_max_connections as u64),
            (
                "tls_handshake_timeout_ms",
                self.tls_handshake_timeout.as_millis() as u64,
            ),
            (
                "body_idle_timeout_ms",
                self.body_idle_timeout.as_millis() as u64,
            ),
        ];
        bad.extend(
            positive
                .iter()
                .filter(|(_, v)| *v == 0)
                .map(|(name, _)| (*name, "must be positive".to_string())),
        );
        // RFC 9113 6.9.2: a window is at least 65,535 and at most 2^31 - 1.
        for (name, w) in [
            ("h2_stream_window_bytes", self.h2_stream_window_bytes),
            (
                "h2_connection_window_bytes",
                self.h2_connection_window_bytes,
            ),
        ] {
            if !(65_535..=0x7fff_ffff).contains(&w) {
                bad.push((name, "must be between 65535 and 2147483647".to_string()));
            }
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_their_own_check() {
        assert!(Limits::default().check().is_empty());
    }

    #[test]
    fn every_bad_value_is_named_at_once() {
        let l = Limits {
            max_head_bytes: 100,
            max_connections: 0,
            h2_stream_window_bytes: 10,
            body_idle_timeout: Duration::ZERO,
            ..Limits::default()
        };
        let named: Vec<&str> = l.check().iter().map(|(f, _)| *f).collect();
        assert_eq!(
            named,
            [
                "max_head_bytes",
                "max_connections",
                "body_idle_timeout_ms",
                "h2_stream_window_bytes"
            ]
        );
    }
}
