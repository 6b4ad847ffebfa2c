//! The process's side of serving: the listening socket, and how many connections the
//! descriptors allow.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Binds `addr` and listens with a queue of `backlog` connections (the kernel caps it at
/// `net.core.somaxconn`, 4096 on current Linux).
///
/// # Errors
///
/// When the socket cannot be created, bound (the address is in use, or not this machine's)
/// or put in the listening state.
pub fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // NOTE: as std's `TcpListener::bind` does on Unix; it does not let two servers listen on
    // one port, so a busy port is still an error.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Raises the process's soft limit on open files to its hard limit, as Go's runtime does
/// at startup (so the article's server could hold as many connections), and returns the
/// limit now in force; `None` when there is no limit.
///
/// # Errors
///
/// When the limit cannot be raised (the current one stays in force).
pub fn raise_open_files_limit() -> std::io::Result<Option<u64>> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return Ok(limit.current);
    }
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    setrlimit(Resource::Nofile, raised)?;
    Ok(limit.maximum)
}

/// The most connections a process allowed `open_files` descriptors should hold: the
/// limit minus a reserve for everything else (the listener, standard streams, logs, the
/// `--downstream` client's connections): a tenth of the limit, at least 64. At least 1.
pub fn connections_within(open_files: u64) -> usize {
    let reserve = (open_files / 10).max(64);
    usize::try_from(open_files.saturating_sub(reserve))
        .unwrap_or(usize::MAX)
        .max(1)
}
