//! A throwaway `redis-server`: [`RedisServer`].

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::process::{free_port, pause};

/// How to get `redis-server`, for the messages of a server that cannot start.
pub const INSTALL_HINT: &str = "the tests that need Redis start their own redis-server: \
    install it (Debian and Ubuntu: `apt-get install redis-server`; macOS: `brew install \
    redis`), or run `scripts/test`, which installs it, or point REDIS_SERVER at the binary";

/// Attempts to find a free port before giving up.
const PORT_ATTEMPTS: u32 = 10;

/// How long a starting server has to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A `redis-server` on 127.0.0.1 on a free port (and, with TLS, a second one), with a
/// temporary directory and no persistence, killed (and its directory removed) when
/// dropped.
///
/// Redis cannot listen on port 0 (it means "no TCP"), so a free port is found by binding
/// port 0 and releasing it; a server that loses the port to another process in between
/// is started again on another one.
///
/// The binary is `redis-server` from `PATH`, or the one the environment variable
/// `REDIS_SERVER` names.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// The TLS port, for a server started with [`start_tls`](Self::start_tls).
    tls_port: Option<u16>,
    dir: PathBuf,
    /// Arguments after the common ones (`--port`, `--dir`, ...).
    extra: Vec<OsString>,
}

impl RedisServer {
    /// Starts a server and waits until it answers.
    ///
    /// # Panics
    ///
    /// When it cannot start (no `redis-server`, or it fails), with a message that says why
    /// and how to install it: a test that needs Redis fails loudly, never skips.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with more `redis-server` arguments (`--cluster-enabled yes`, ...),
    /// and waits until it answers. Relative paths in them are in the server's own
    /// directory ([`dir`](Self::dir)).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(args: &[&str]) -> Self {
        Self::launch(&args.iter().map(OsString::from).collect::<Vec<_>>(), false)
    }

    /// Starts a server that also listens with TLS on a second free port, with the
    /// certificate and key (PEM files) it presents and the CA it trusts for client
    /// certificates, which it asks for when `auth_clients`. The plain port stays, for
    /// [`command`](Self::command).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(certificate: &Path, key: &Path, ca: &Path, auth_clients: bool) -> Self {
        let mut args: Vec<OsString> = Vec::new();
        for (flag, path) in [
            ("--tls-cert-file", certificate),
            ("--tls-key-file", key),
            ("--tls-ca-cert-file", ca),
        ] {
            args.push(flag.into());
            args.push(path.into());
        }
        args.push("--tls-auth-clients".into());
        args.push(if auth_clients { "yes" } else { "no" }.into());
        Self::launch(&args, true)
    }

    fn launch(extra: &[OsString], tls: bool) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ratelimit-layer-redis-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            panic!("cannot create {}: {e}", dir.display());
        }
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let mut server = Self {
                child: None,
                port,
                tls_port: tls.then(free_port),
                dir: dir.clone(),
                extra: extra.to_vec(),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(Failure::PortTaken(log)) => last = log,
                Err(Failure::Fatal(message)) => panic!("{message}"),
            }
        }
        panic!("redis-server found no free port in {PORT_ATTEMPTS} attempts; last log:\n{last}");
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:TLS_PORT`, for a server started with
    /// [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    ///
    /// For a server without TLS.
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("a server started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// `127.0.0.1:PORT`, the plain port.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's own directory, where its log and relative paths are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The port it listens on (kept across [`restart`](Self::restart)).
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it to exit: its data is gone, as after a
    /// crash without persistence.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, after [`stop`](Self::stop).
    ///
    /// # Panics
    ///
    /// When it cannot start, or the port was taken meanwhile.
    pub fn restart(&mut self) {
        self.stop();
        // NOTE: Redis binds with SO_REUSEADDR, so the port is free again at once unless
        // another process took it; a few tries cover a slow exit.
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            match self.spawn() {
                Ok(()) => return,
                Err(Failure::PortTaken(log)) => {
                    last = log;
                    pause(Duration::from_millis(100));
                }
                Err(Failure::Fatal(message)) => panic!("{message}"),
            }
        }
        panic!(
            "redis-server cannot listen on port {} again; last log:\n{last}",
            self.port
        );
    }

    /// Sends one command (inline form) and returns the first line of the reply, for tests
    /// that look at Redis itself (`DBSIZE`, `PTTL key`, `SCRIPT FLUSH`).
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    pub fn command(&self, command: &str) -> String {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port));
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        stream
            .write_all(format!("{command}\r\n").as_bytes())
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port));
        let mut line = String::new();
        BufReader::new(stream)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port));
        line.trim_end().to_owned()
    }

    /// `INFO section`: the whole text of the reply, for tests that look at Redis's own
    /// figures (`used_memory`).
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    pub fn info(&self, section: &str) -> String {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port));
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        stream
            .write_all(format!("INFO {section}\r\n").as_bytes())
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port));
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        reader
            .read_line(&mut head)
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port));
        let length: usize = head
            .trim_end()
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("INFO answered {head:?}"));
        let mut body = vec![0; length];
        reader
            .read_exact(&mut body)
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port));
        String::from_utf8_lossy(&body).into_owned()
    }

    fn spawn(&mut self) -> Result<(), Failure> {
        let binary = std::env::var_os("REDIS_SERVER").unwrap_or_else(|| "redis-server".into());
        let log = self.dir.join(format!("redis-{}.log", self.port));
        // NOTE: what redis-server says before it opens its log file (a bad argument, a
        // failed bind of the TLS port on some versions) goes to standard error.
        let stderr = self.dir.join(format!("redis-{}.stderr", self.port));
        let child = Command::new(&binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(
                self.tls_port
                    .map(|port| vec!["--tls-port".to_owned(), port.to_string()])
                    .unwrap_or_default(),
            )
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(&stderr)
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                return Err(Failure::Fatal(format!(
                    "cannot run {}: {e}; {INSTALL_HINT}",
                    binary.to_string_lossy()
                )));
            }
        };
        let read_log = || {
            let mut text = String::new();
            for file in [&log, &stderr] {
                if let Ok(mut f) = std::fs::File::open(file) {
                    let _ = f.read_to_string(&mut text);
                }
            }
            text
        };
        let mut waited = Duration::ZERO;
        let step = Duration::from_millis(10);
        while waited < READY_WITHIN {
            if let Ok(Some(status)) = child.try_wait() {
                let text = read_log();
                // NOTE: a server that exits without a word (seen once under load, with
                // another test's servers starting at the same moment) is tried again on
                // other ports, as a taken port is; PORT_ATTEMPTS bounds it.
                return Err(
                    if text.contains("Address already in use") || text.trim().is_empty() {
                        Failure::PortTaken(text)
                    } else {
                        Failure::Fatal(format!(
                            "redis-server exited at start ({status}); {INSTALL_HINT}; its log:\n{text}"
                        ))
                    },
                );
            }
            if answers_ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            pause(step);
            waited += step;
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(Failure::Fatal(format!(
            "redis-server did not answer PING on port {} within {READY_WITHIN:?}; its log:\n{}",
            self.port,
            read_log()
        )))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

enum Failure {
    PortTaken(String),
    Fatal(String),
}

fn answers_ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}
