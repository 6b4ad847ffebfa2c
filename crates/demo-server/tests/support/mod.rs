//! What the tests of the `demo-server` executable share: a child server on a free port of
//! 127.0.0.1, killed on drop.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_demo-server");

/// A child server, killed on drop if the test did not stop it.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `demo-server --listen 127.0.0.1:0 --quiet ARGS` and reads its address from the
/// startup line. `stderr`: `Stdio::piped()` for a test that reads it (and reads it, so the
/// pipe never fills), `Stdio::null()` otherwise.
pub fn start(args: &[&str], stderr: Stdio) -> Server {
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--quiet"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("the demo-server binary starts");
    let stdout = child.stdout.take().unwrap();
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    // "demo-server listening on http://127.0.0.1:PORT (GET /api, ...)"
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in the startup line: {first:?}"));
    Server { child, addr }
}
