//! Child server processes for the outage scenario, and the signals that pause them.
//!
//! The scenario pauses a real server the way the article does: SIGSTOP freezes the whole
//! process (requests inside stop progressing, new connections wait in the kernel's listen
//! queue), SIGCONT resumes it. A [`ServerProcess`] is killed when it is dropped, so no exit
//! path (an error, a panic, Ctrl-C handled by the caller) leaves a stopped server behind.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use tokio::process::{Child, Command};

/// A process the scenario may pause and resume: a child it started, or any process given by
/// its id (`--pause-pid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pausable {
    pid: Pid,
}

impl Pausable {
    /// The process with id `pid`; `None` if `pid` is not a valid process id (zero or
    /// negative, which `kill` would read as a process group).
    pub fn from_pid(pid: i32) -> Option<Self> {
        if pid <= 0 {
            return None;
        }
        Pid::from_raw(pid).map(|pid| Self { pid })
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw_nonzero().get()
    }

    /// Freezes the process (SIGSTOP).
    pub fn pause(&self) -> std::io::Result<()> {
        kill_process(self.pid, Signal::STOP).map_err(Into::into)
    }

    /// Resumes the process (SIGCONT).
    pub fn resume(&self) -> std::io::Result<()> {
        kill_process(self.pid, Signal::CONT).map_err(Into::into)
    }
}

/// A `demo-server` child process listening on 127.0.0.1, killed when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pausable: Pausable,
    addr: SocketAddr,
}

/// Why a server process could not be started.
#[derive(Debug)]
pub enum SpawnError {
    /// The executable could not be started.
    Spawn(PathBuf, std::io::Error),
    /// The server exited before it accepted connections.
    Exited(std::process::ExitStatus),
    /// The server did not accept connections within the startup timeout.
    NotReady(SocketAddr, Duration),
    /// No free port could be found.
    Port(std::io::Error),
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::Spawn(path, e) => write!(f, "cannot start {}: {e}", path.display()),
            SpawnError::Exited(status) => {
                write!(
                    f,
                    "the server exited before accepting connections ({status})"
                )
            }
            SpawnError::NotReady(addr, wait) => write!(
                f,
                "the server did not accept connections on {addr} within {wait:?}"
            ),
            SpawnError::Port(e) => write!(f, "cannot find a free port on 127.0.0.1: {e}"),
        }
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpawnError::Spawn(_, e) | SpawnError::Port(e) => Some(e),
            SpawnError::Exited(_) | SpawnError::NotReady(..) => None,
        }
    }
}

/// How long a server gets to accept its first connection: 10 seconds.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

impl ServerProcess {
    /// Starts `program --listen 127.0.0.1:PORT` followed by `args` on a free port, and waits
    /// until it accepts connections. Its standard output and error go to `log`, or nowhere.
    pub async fn start(
        program: &Path,
        args: &[OsString],
        log: Option<std::fs::File>,
    ) -> Result<Self, SpawnError> {
        let addr = free_port().map_err(SpawnError::Port)?;
        let mut command = Command::new(program);
        command
            .arg("--listen")
            .arg(addr.to_string())
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        match log {
            Some(file) => {
                let err = file
                    .try_clone()
                    .map_err(|e| SpawnError::Spawn(program.to_owned(), e))?;
                command.stdout(file).stderr(err);
            }
            None => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        let child = command
            .spawn()
            .map_err(|e| SpawnError::Spawn(program.to_owned(), e))?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pausable::from_pid)
            .ok_or_else(|| {
                SpawnError::Spawn(
                    program.to_owned(),
                    std::io::Error::other("the child has no process id"),
                )
            })?;
        let mut server = Self {
            child,
            pausable: pid,
            addr,
        };
        server.wait_ready(STARTUP_TIMEOUT).await?;
        Ok(server)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), SpawnError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(SpawnError::Exited(status));
            }
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SpawnError::NotReady(self.addr, timeout));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The handle to pause and resume it.
    pub fn pausable(&self) -> Pausable {
        self.pausable
    }

    /// Resumes the server if it was paused, kills it and waits for it to exit.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        let _ = self.pausable.resume();
        self.child.kill().await
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // NOTE: `kill_on_drop` sends SIGKILL, which ends a stopped process too; resuming
        // first only lets it leave cleanly if it is still running when reaped.
        let _ = self.pausable.resume();
        let _ = self.child.start_kill();
    }
}

/// A free TCP port on 127.0.0.1, found by binding port 0 and releasing it.
pub fn free_port() -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.local_addr()
}

/// Finds the `demo-server` executable: `explicit` if given, else next to the current
/// executable (where `cargo build` puts every binary of the workspace).
pub fn find_server(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_owned());
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    // Test executables live one level down, in `deps/`.
    [dir, dir.parent().unwrap_or(dir)]
        .into_iter()
        .map(|d| d.join(format!("demo-server{}", std::env::consts::EXE_SUFFIX)))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_pids_are_refused() {
        assert!(Pausable::from_pid(0).is_none());
        assert!(Pausable::from_pid(-1).is_none());
        assert!(Pausable::from_pid(1).is_some());
    }

    #[tokio::test]
    async fn stop_and_continue_a_real_process() {
        // `sleep` stands in for a server: a process we own that we can freeze and resume.
        let mut child = Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let p = Pausable::from_pid(i32::try_from(child.id().unwrap()).unwrap()).unwrap();
        p.pause().unwrap();
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap();
            // The state is the first field after the parenthesised command name.
            stat.rsplit_once(") ").unwrap().1.chars().next().unwrap()
        };
        let mut stopped = false;
        for _ in 0..100 {
            if state() == 'T' {
                stopped = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(stopped, "SIGSTOP did not stop the process");
        p.resume().unwrap();
        let mut running = false;
        for _ in 0..100 {
            if state() != 'T' {
                running = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(running, "SIGCONT did not resume the process");
        child.kill().await.unwrap();
    }

    #[tokio::test]
    async fn a_server_that_exits_is_reported() {
        let err = ServerProcess::start(Path::new("false"), &[], None)
            .await
            .unwrap_err();
        assert!(matches!(err, SpawnError::Exited(_)), "{err}");
        let err = ServerProcess::start(Path::new("/nonexistent/demo-server"), &[], None)
            .await
            .unwrap_err();
        assert!(matches!(err, SpawnError::Spawn(..)), "{err}");
    }
}
