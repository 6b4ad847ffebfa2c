//! The fleet's load balancer: an HAProxy process of our own, its configuration, and its
//! statistics ([`Balancer`], [`BalancerSettings`], [`ServerStats`]).

use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use tokio::process::{Child, Command};
use tower::BoxError;

use crate::process::{NotReady, accepts, free_port, http_get_text, spawn_logged, wait_until_ready};

/// What to say when HAProxy is missing.
pub const INSTALL_HINT: &str = "the fleet needs HAProxy (Debian and Ubuntu: `sudo apt-get install haproxy`; \
     Fedora: `sudo dnf install haproxy`; macOS: `brew install haproxy`), or pass --haproxy PATH";

/// How long HAProxy gets to accept its first connection: 10 seconds.
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How the balancer is set up. [`BalancerSettings::default`] is the fleet's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancerSettings {
    /// Interval of the health checks (`GET /healthz`); `None`: no health checks, a stopped
    /// server keeps its share of the requests. Default: 500 ms, with HAProxy's own `fall 3`
    /// and `rise 2`: a stopped server is taken out within about 1.5 s plus the check's
    /// 1 s timeout, and put back within about 1 s of answering again.
    pub check_interval: Option<Duration>,
    /// HAProxy's `retries`: how many times it retries a request on another attempt to
    /// connect. Default: 3 (HAProxy's default).
    pub retries: u32,
    /// HAProxy's `retry-on`: which failures it retries. Default: `conn-failure` (HAProxy's
    /// default): only a failed connection, never a request a server received.
    pub retry_on: String,
    /// HAProxy's `option redispatch`: retry on another server rather than the same one.
    /// Default: off (HAProxy's default).
    pub redispatch: bool,
}

impl BalancerSettings {
    /// The default health-check interval: 500 ms.
    pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(500);
    /// The default `retries`: 3, HAProxy's own.
    pub const DEFAULT_RETRIES: u32 = 3;
    /// The default `retry-on`: `conn-failure`, HAProxy's own.
    pub const DEFAULT_RETRY_ON: &'static str = "conn-failure";

    /// Whole seconds the balancer takes at most to take a stopped server out: three failed
    /// checks (`fall 3`) of at most the interval plus the check's 1 s timeout each, rounded
    /// up; 0 without health checks (a stopped server is never taken out).
    pub fn detection_secs(&self) -> usize {
        self.check_interval.map_or(0, |inter| {
            let ms = 3 * (inter.as_millis() + 1000);
            usize::try_from(ms.div_ceil(1000)).unwrap_or(usize::MAX)
        })
    }
}

impl Default for BalancerSettings {
    fn default() -> Self {
        Self {
            check_interval: Some(Self::DEFAULT_CHECK_INTERVAL),
            retries: Self::DEFAULT_RETRIES,
            retry_on: Self::DEFAULT_RETRY_ON.to_owned(),
            redispatch: false,
        }
    }
}

/// HAProxy's configuration for `servers` behind `listen`, statistics on `stats`:
/// round-robin, `option forwardfor`, HTTP keep-alive on both sides.
pub fn config(
    settings: &BalancerSettings,
    listen: SocketAddr,
    stats: SocketAddr,
    servers: &[SocketAddr],
) -> String {
    let mut c = String::new();
    // NOTE: the timeouts are the balancer's, not the experiment's: clients give up after
    // their own timeout (2 s by default) and the servers' answers may take longer; 30 s
    // keeps HAProxy from answering 504 on its own for anything a client still waits for.
    let _ = write!(
        c,
        "global\n    maxconn 4096\n\n\
         defaults\n    mode http\n    option forwardfor\n    option http-keep-alive\n    \
         timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n    \
         timeout check 1s\n    retries {retries}\n    retry-on {retry_on}\n{redispatch}\n\
         frontend fleet\n    bind {listen}\n    maxconn 4096\n    default_backend servers\n\n\
         backend servers\n    balance roundrobin\n{httpchk}",
        retries = settings.retries,
        retry_on = settings.retry_on,
        redispatch = if settings.redispatch {
            "    option redispatch\n"
        } else {
            ""
        },
        httpchk = if settings.check_interval.is_some() {
            "    option httpchk GET /healthz\n"
        } else {
            ""
        },
    );
    for (i, server) in servers.iter().enumerate() {
        let _ = write!(c, "    server s{} {server}", i + 1);
        if let Some(inter) = settings.check_interval {
            let _ = write!(c, " check inter {}ms", inter.as_millis().max(1));
        }
        c.push('\n');
    }
    let _ = write!(
        c,
        "\nlisten stats\n    bind {stats}\n    stats enable\n    stats uri /stats\n"
    );
    c
}

/// The `haproxy` executable: `explicit`, or `haproxy` on the `PATH`, or in `/usr/sbin`
/// (where Debian installs it, often not on a user's `PATH`).
pub fn find_haproxy(explicit: Option<&Path>) -> Result<PathBuf, BoxError> {
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_owned())
        } else {
            Err(format!("--haproxy {}: no such file; {INSTALL_HINT}", path.display()).into())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("haproxy"))
        .find(|p| p.is_file())
        .ok_or_else(|| INSTALL_HINT.into())
}

/// A running HAProxy of our own, stopped (by its process id) when dropped.
#[derive(Debug)]
pub struct Balancer {
    child: Child,
    listen: SocketAddr,
    stats: SocketAddr,
}

impl Balancer {
    /// Writes the configuration into `dir` (`haproxy.cfg`), starts `program` in the
    /// foreground on free ports of 127.0.0.1 with its output in `dir/haproxy.log`, and
    /// waits until it accepts connections.
    pub async fn start(
        program: &Path,
        dir: &Path,
        settings: &BalancerSettings,
        servers: &[SocketAddr],
    ) -> Result<Self, BoxError> {
        let listen = free_port()?;
        let stats = free_port()?;
        std::fs::create_dir_all(dir)?;
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, config(settings, listen, stats, servers))?;
        let log_path = dir.join("haproxy.log");
        let log = std::fs::File::create(&log_path)?;
        let mut command = Command::new(program);
        command.arg("-db").arg("-f").arg(&cfg);
        let mut child = spawn_logged(&mut command, log)
            .map_err(|e| format!("cannot start {}: {e}; {INSTALL_HINT}", program.display()))?;
        wait_until_ready(&mut child, STARTUP_TIMEOUT, Some(&log_path), || {
            accepts(listen)
        })
        .await
        .map_err(|e| match e {
            NotReady::Exited { status, log } => {
                format!("haproxy exited before accepting connections ({status}):\n{log}")
            }
            NotReady::TimedOut { log } => format!(
                "haproxy did not accept connections on {listen} within {STARTUP_TIMEOUT:?}:\n{log}"
            ),
        })?;
        Ok(Self {
            child,
            listen,
            stats,
        })
    }

    /// The address the clients send their requests to.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// The balancer's statistics, per server of the backend.
    pub async fn stats(&self) -> Result<Vec<ServerStats>, BoxError> {
        let url: Uri = format!("http://{}/stats;csv", self.stats).parse()?;
        let text = http_get_text(url, Duration::from_secs(5)).await?;
        ServerStats::parse(&text)
    }

    /// Stops HAProxy (SIGKILL to its process id) and waits for it to exit.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.child.kill().await
    }
}

/// HAProxy's view of one server of the backend, from its statistics CSV.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// The server's name in the configuration (`s1`, `s2`, `s3`).
    pub name: String,
    /// Sessions (requests forwarded over connections) the server took: `stot`.
    pub sessions: u64,
    /// Failed connections to the server: `econ`.
    pub connection_errors: u64,
    /// Responses that failed (server closed or timed out): `eresp`.
    pub response_errors: u64,
    /// Requests HAProxy retried itself: `wretr`.
    pub retries: u64,
    /// Requests HAProxy sent to another server after a failure: `wredis`.
    pub redispatches: u64,
    /// Times the health checks took it out of service (`chkdown`).
    pub check_downs: u64,
}

impl ServerStats {
    /// The backend's servers from HAProxy's `;csv` statistics (the frontend, the backend
    /// total and the stats page itself left out).
    pub fn parse(csv: &str) -> Result<Vec<Self>, BoxError> {
        let mut lines = csv.lines();
        let header = lines
            .next()
            .and_then(|h| h.strip_prefix("# "))
            .ok_or("haproxy's statistics have no header line")?;
        let columns: Vec<&str> = header.split(',').collect();
        let index = |name: &str| {
            columns
                .iter()
                .position(|c| *c == name)
                .ok_or_else(|| format!("haproxy's statistics have no column {name}"))
        };
        let [px, sv, stot, econ, eresp, wretr, wredis, chkdown] = [
            "pxname", "svname", "stot", "econ", "eresp", "wretr", "wredis", "chkdown",
        ]
        .map(index);
        let (px, sv) = (px?, sv?);
        let (stot, econ, eresp, wretr, wredis, chkdown) =
            (stot?, econ?, eresp?, wretr?, wredis?, chkdown?);
        let mut servers = Vec::new();
        for line in lines {
            let cells: Vec<&str> = line.split(',').collect();
            let cell = |i: usize| -> u64 {
                cells
                    .get(i)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or_default()
            };
            if cells.get(px) != Some(&"servers")
                || matches!(cells.get(sv), Some(&"FRONTEND" | &"BACKEND") | None)
            {
                continue;
            }
            servers.push(Self {
                name: cells[sv].to_owned(),
                sessions: cell(stot),
                connection_errors: cell(econ),
                response_errors: cell(eresp),
                retries: cell(wretr),
                redispatches: cell(wredis),
                check_downs: cell(chkdown),
            });
        }
        Ok(servers)
    }
}

impl fmt::Display for ServerStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} sessions, {} connection errors, {} response errors, {} retries, {} redispatches, {} times down",
            self.name,
            self.sessions,
            self.connection_errors,
            self.response_errors,
            self.retries,
            self.redispatches,
            self.check_downs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_forwards_balances_and_checks() {
        let servers: Vec<SocketAddr> = vec!["127.0.0.1:1001".parse().unwrap()];
        let listen = "127.0.0.1:2000".parse().unwrap();
        let stats = "127.0.0.1:2001".parse().unwrap();
        let c = config(&BalancerSettings::default(), listen, stats, &servers);
        for needle in [
            "option forwardfor",
            "balance roundrobin",
            "bind 127.0.0.1:2000",
            "bind 127.0.0.1:2001",
            "option httpchk GET /healthz",
            "server s1 127.0.0.1:1001 check inter 500ms",
            "retries 3",
            "retry-on conn-failure",
        ] {
            assert!(c.contains(needle), "{needle} missing from\n{c}");
        }
        assert!(!c.contains("redispatch"), "{c}");
        let custom = BalancerSettings {
            check_interval: None,
            retries: 1,
            retry_on: "conn-failure response-timeout".into(),
            redispatch: true,
        };
        let c = config(&custom, listen, stats, &servers);
        assert!(!c.contains("httpchk") && !c.contains(" check inter"), "{c}");
        assert_eq!(custom.detection_secs(), 0);
        assert_eq!(BalancerSettings::default().detection_secs(), 5);
        assert!(c.contains("server s1 127.0.0.1:1001\n"), "{c}");
        assert!(c.contains("option redispatch"), "{c}");
        assert!(c.contains("retry-on conn-failure response-timeout"), "{c}");
    }

    #[test]
    fn statistics_are_read_by_column_name() {
        let csv = "# pxname,svname,qcur,stot,econ,eresp,wretr,wredis,chkdown,status\n\
                   fleet,FRONTEND,0,900,,,,,,OPEN\n\
                   servers,s1,0,300,2,5,7,1,1,UP\n\
                   servers,s2,0,600,0,0,0,0,0,UP\n\
                   servers,BACKEND,0,900,2,5,7,1,1,UP\n\
                   stats,FRONTEND,0,3,,,,,,OPEN\n";
        let servers = ServerStats::parse(csv).unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(
            servers[0],
            ServerStats {
                name: "s1".into(),
                sessions: 300,
                connection_errors: 2,
                response_errors: 5,
                retries: 7,
                redispatches: 1,
                check_downs: 1,
            }
        );
        assert_eq!(servers[1].sessions, 600);
        assert!(ServerStats::parse("pxname,svname\n").is_err());
        assert!(
            ServerStats::parse("# pxname,svname\n")
                .unwrap_err()
                .to_string()
                .contains("stot")
        );
    }

    #[test]
    fn a_missing_haproxy_says_how_to_install_it() {
        let err = find_haproxy(Some(Path::new("/nonexistent/haproxy")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("apt-get install haproxy"), "{err}");
    }
}
