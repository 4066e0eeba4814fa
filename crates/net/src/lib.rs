//! Sockets with explicit settings. `TcpListener::bind` takes the OS default listen backlog
//! (tokio: 1024); a burst of new connections beyond it is refused or dropped by the kernel
//! before the proxy sees it, so every listener here sets its backlog explicitly.

pub mod fetch;
pub use fetch::{error_chain, fetch, query_value, FetchError, Fetched};

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Listen backlog of every listener (the kernel caps it at `net.core.somaxconn`, 4096 on
/// current Linux): room for a burst of 10,000 new streams to queue while they are accepted.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` with `SO_REUSEADDR` (a restart does not wait for TIME_WAIT) and `backlog`.
pub fn bind_listener(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Raises the soft limit on open files to the hard one, as nginx's `worker_rlimit_nofile` and
/// Go's runtime do: a proxied stream holds two sockets (client and upstream), and under a soft
/// limit of 1024 (a common default) accepts and upstream connects would fail with EMFILE
/// from the 500th stream on. Returns the soft limit in force afterwards (None: unlimited).
pub fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current != now.maximum {
        let raised = Rlimit {
            current: now.maximum,
            maximum: now.maximum,
        };
        // Refused (a hard limit the kernel caps lower): the limit in force is returned below.
        let _ = setrlimit(Resource::Nofile, raised);
    }
    getrlimit(Resource::Nofile).current
}

/// Streams that fit in `nofile` open files: two sockets each, less a reserve for listeners,
/// the admin side, sinks and logs.
pub fn streams_within(nofile: u64) -> u64 {
    nofile.saturating_sub(FD_RESERVE) / 2
}

/// Files kept for everything but proxied streams.
const FD_RESERVE: u64 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let hard = getrlimit(Resource::Nofile).maximum;
        // One below the hard limit (other tests of this process keep running meanwhile).
        if let Some(h) = hard.filter(|h| *h > 1024) {
            let lower = Rlimit {
                current: Some(h - 1),
                maximum: hard,
            };
            setrlimit(Resource::Nofile, lower).unwrap();
            assert_eq!(getrlimit(Resource::Nofile).current, Some(h - 1));
        }
        assert_eq!(raise_nofile_limit(), hard);
        assert_eq!(streams_within(20_000), 9_968);
        assert_eq!(streams_within(10), 0);
    }

    #[tokio::test]
    async fn binds_v4_and_v6_loopback_and_accepts() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = bind_listener(addr.parse().unwrap(), LISTEN_BACKLOG) else {
                assert!(addr.starts_with('['), "IPv4 loopback must bind");
                continue; // a machine without IPv6 loopback
            };
            let at = l.local_addr().unwrap();
            let (conn, accepted) = tokio::join!(tokio::net::TcpStream::connect(at), l.accept());
            assert!(conn.is_ok() && accepted.is_ok(), "{addr}");
        }
    }
}
