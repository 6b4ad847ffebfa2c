//! What the throwaway deployments share: a free port, a blocking wait.

use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

/// A port of 127.0.0.1 free now (bound, then released).
pub(super) fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot find a free port on 127.0.0.1: {e}"))
}

// NOTE: test set-up outside any async task's hot path: a blocking wait of a few
// milliseconds while a child process starts is what is wanted.
#[allow(clippy::disallowed_methods)]
pub(super) fn pause(duration: Duration) {
    std::thread::sleep(duration);
}
