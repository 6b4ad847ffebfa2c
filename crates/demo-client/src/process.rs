//! Child server processes for the outage scenario, and the signals that pause them.
//!
//! The scenario pauses a real server the way the article does: SIGSTOP freezes the whole
//! process (requests inside stop progressing, new connections wait in the kernel's listen
//! queue), SIGCONT resumes it. A [`ServerProcess`] is killed when it is dropped, so no exit
//! path (an error, a panic, Ctrl-C handled by the caller) leaves a stopped server behind.

use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustix::process::{Pid, Signal, kill_process};
use tokio::process::{Child, Command};
use tower::BoxError;

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
        let addr = self.addr;
        wait_until_ready(&mut self.child, timeout, None, || accepts(addr))
            .await
            .map_err(|e| match e {
                NotReady::Exited { status, .. } => SpawnError::Exited(status),
                NotReady::TimedOut { .. } => SpawnError::NotReady(addr, timeout),
            })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The handle to pause and resume it.
    pub fn pausable(&self) -> Pausable {
        self.pausable
    }

    /// The server's exit status if it has exited (it is reaped then), `None` while it runs.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
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

/// Starts `command` with no input, its standard output and error both into `log`, killed
/// when its [`Child`] is dropped. Fails when `log` cannot be shared between the two outputs
/// or the program cannot be started.
///
/// ```no_run
/// # fn run() -> std::io::Result<()> {
/// let log = std::fs::File::create("haproxy.log")?;
/// let mut command = tokio::process::Command::new("haproxy");
/// command.arg("-db").arg("-f").arg("haproxy.cfg");
/// let child = demo_client::process::spawn_logged(&mut command, log)?;
/// # Ok(())
/// # }
/// ```
pub fn spawn_logged(command: &mut Command, log: std::fs::File) -> std::io::Result<Child> {
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
}

/// Why a child process did not become ready ([`wait_until_ready`]).
#[derive(Debug)]
pub enum NotReady {
    /// The child exited first.
    Exited {
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it had written to its log, trimmed; empty without a log.
        log: String,
    },
    /// The readiness probe did not pass within the timeout.
    TimedOut {
        /// What the child had written to its log, trimmed; empty without a log.
        log: String,
    },
}

impl NotReady {
    /// What the child had written to its log, trimmed; empty without a log.
    pub fn log(&self) -> &str {
        match self {
            NotReady::Exited { log, .. } | NotReady::TimedOut { log } => log,
        }
    }
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Exited { status, .. } => write!(f, "exited before it was ready ({status})"),
            NotReady::TimedOut { .. } => write!(f, "was not ready in time"),
        }?;
        if !self.log().is_empty() {
            write!(f, ":\n{}", self.log())?;
        }
        Ok(())
    }
}

impl std::error::Error for NotReady {}

/// How often [`wait_until_ready`] checks the child and its probe: every 25 ms.
const READY_POLL: Duration = Duration::from_millis(25);

/// Waits until `probe` passes for `child`, checking every 25 ms: `Ok` as soon as it passes;
/// [`NotReady::Exited`] if the child exits first; [`NotReady::TimedOut`] if it has not
/// passed after `timeout`. Both errors carry what the child had written to `log` (the file
/// its output goes to), empty when `log` is `None` or unreadable. The wait runs on tokio's
/// clock (paused time applies).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use demo_client::process::{free_port, wait_until_ready};
///
/// let addr = free_port()?;
/// let mut child = tokio::process::Command::new("demo-server")
///     .arg("--listen")
///     .arg(addr.to_string())
///     .spawn()?;
/// wait_until_ready(&mut child, Duration::from_secs(10), None, || async move {
///     tokio::net::TcpStream::connect(addr).await.is_ok()
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
pub async fn wait_until_ready<P, F>(
    child: &mut Child,
    timeout: Duration,
    log: Option<&Path>,
    mut probe: P,
) -> Result<(), NotReady>
where
    P: FnMut() -> F,
    F: Future<Output = bool>,
{
    let said = || {
        log.and_then(|path| std::fs::read_to_string(path).ok())
            .map(|text| text.trim().to_owned())
            .unwrap_or_default()
    };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NotReady::Exited {
                status,
                log: said(),
            });
        }
        if probe().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(NotReady::TimedOut { log: said() });
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// Whether `addr` accepts a TCP connection: the readiness probe of a server that is ready
/// once it listens.
pub async fn accepts(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

/// The body of `GET url` (plain HTTP/1), when it answers `200` within `timeout`; otherwise
/// an error naming the URL, with the status and body of any other answer.
///
/// ```no_run
/// # async fn run() -> Result<(), tower::BoxError> {
/// use std::time::Duration;
///
/// let stats = demo_client::process::http_get_text(
///     "http://127.0.0.1:9901/stats".parse()?,
///     Duration::from_secs(5),
/// )
/// .await?;
/// # Ok(())
/// # }
/// ```
pub async fn http_get_text(url: Uri, timeout: Duration) -> Result<String, BoxError> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let fetch = async {
        let response = client
            .request(Request::get(url.clone()).body(Empty::new())?)
            .await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        if status != http::StatusCode::OK {
            return Err(format!("GET {url}: {status}: {}", text.trim()).into());
        }
        Ok::<_, BoxError>(text)
    };
    tokio::time::timeout(timeout, fetch)
        .await
        .map_err(|_| format!("GET {url}: no answer within {timeout:?}"))?
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

    #[tokio::test]
    async fn waiting_ends_when_the_probe_passes() {
        let mut child = Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut calls = 0;
        let ready = wait_until_ready(&mut child, Duration::from_secs(5), None, || {
            calls += 1;
            let passes = calls >= 3;
            async move { passes }
        })
        .await;
        assert!(ready.is_ok(), "{ready:?}");
        assert_eq!(calls, 3);
        child.kill().await.unwrap();
    }

    #[tokio::test]
    async fn a_child_that_exits_before_it_is_ready_is_reported_with_its_log() {
        let dir = std::env::temp_dir().join(format!("process-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log_path = dir.join("exits.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let mut child = Command::new("sh")
            .args(["-c", "echo bad config >&2; exit 3"])
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let err = wait_until_ready(
            &mut child,
            Duration::from_secs(5),
            Some(&log_path),
            || async { false },
        )
        .await
        .unwrap_err();
        match &err {
            NotReady::Exited { status, log } => {
                assert_eq!(status.code(), Some(3), "{err}");
                assert_eq!(log, "bad config", "{err}");
            }
            NotReady::TimedOut { .. } => panic!("not an exit: {err}"),
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_never_ready_times_out() {
        let mut child = Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let err = wait_until_ready(&mut child, Duration::from_secs(2), None, || async { false })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NotReady::TimedOut { log } if log.is_empty()),
            "{err}"
        );
        child.kill().await.unwrap();
    }

    #[tokio::test]
    async fn http_get_text_returns_a_200_body_and_refuses_other_answers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0; 4096];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let (status, body) = if request.starts_with("GET /ok ") {
                        ("200 OK", "all good")
                    } else {
                        ("503 Service Unavailable", "not yet")
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        let timeout = Duration::from_secs(5);
        let ok: Uri = format!("http://{addr}/ok").parse().unwrap();
        assert_eq!(http_get_text(ok, timeout).await.unwrap(), "all good");
        let busy: Uri = format!("http://{addr}/busy").parse().unwrap();
        let err = http_get_text(busy, timeout).await.unwrap_err().to_string();
        assert!(err.contains("503") && err.contains("not yet"), "{err}");
        let closed: Uri = format!("http://{}/ok", free_port().unwrap())
            .parse()
            .unwrap();
        assert!(http_get_text(closed, timeout).await.is_err());
    }

    #[tokio::test]
    async fn a_logged_child_writes_both_outputs_into_its_log() {
        let dir = std::env::temp_dir().join(format!("process-logged-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log_path = dir.join("both.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2"]);
        let status = spawn_logged(&mut command, log)
            .unwrap()
            .wait()
            .await
            .unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&log_path).unwrap();
        assert!(text.contains("out") && text.contains("err"), "{text}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
