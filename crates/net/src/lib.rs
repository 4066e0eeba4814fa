//! Sockets with explicit settings. `TcpListener::bind` takes the OS default listen backlog
//! (tokio: 1024); a burst of new connections beyond it is refused or dropped by the kernel
//! before the proxy sees it, so every listener here sets its backlog explicitly.
#![forbid(unsafe_code)]

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

#[cfg(test)]
mod tests {
    use super::*;

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
