//! `demo-server`: a backend that behaves like an overloaded server, so the overload layers
//! can be watched at work. See `demo-server --help`.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::ConnectInfo;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{CommandFactory, Parser, ValueEnum, error::ErrorKind};
use demo_server::app::{
    ARTICLE_BURST, ARTICLE_RATE_LIMIT, AppConfig, MMC_BURST, MMC_RATE_LIMIT, ServerStats, Stack,
    app,
};
use demo_server::downstream::Downstream;
use demo_server::model::{ArticleModel, LatencyModel, MmcModel, Model};
use demo_server::server::{
    Abandoned, ConnectionStats, Server, ServerConfig, connections_within, listen,
    raise_open_files_limit,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use overload_signal::{AttemptHistogram, OverloadSignalLayer};
use ratelimit_layer::AdaptiveLimitLayer;
use ratelimit_layer::config::{Algorithm, KeyBy, RateLimitConfig, RedisConfig};
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::redis::RedisStore;

use demo_server::duration::parse_duration;
use demo_server::size::parse_size;

const ABOUT: &str = "A demo backend that behaves like an overloaded server.";

const LONG_ABOUT: &str = "\
A demo backend that behaves like an overloaded server, so retry storms and the layers that stop
them can be watched with any HTTP client (curl, oha, the demo-client).

GET /api is served by a latency model:
  article  (default) 100 ms while at most 30 requests are inside, then
           100ms * 1.05^((c - 30)/15) for c requests inside, re-evaluated every 50 ms
           (the server of the article 'Exponential backoff, or how not to crash a server')
  mmc      10 workers, exponential service time of mean 50 ms, one FIFO queue
           (the M/M/10 server of the paper 'Handling overloads in distributed systems')
  instant  answers at once (to measure what the layers cost)

With --stack full (the default), an overload-signal layer and a rate limiter stand in front of
the model: above --rate-limit requests are rejected at once with 429 Too Many Requests,
Retry-After and the IETF RateLimit fields; when more than 5% of the last 10 seconds' requests
were retries (the X-Request-Attempt header), rejections become 503 with
X-Overloaded: stop-retrying.
--stack adaptive puts the overload-signal layer in front of an adaptive concurrency limit
instead: no rate configured, it finds the model's capacity from its latency and rejects above
it with 503 Service Unavailable and Retry-After. --stack none serves the bare model.

Other routes: GET /healthz (never limited), GET /metrics (Prometheus text), and with --admin
GET and PUT /admin/capacity, the model's capacity (article: the knee; mmc: the workers),
to change it while the server runs.
Once a second a status line is printed on standard output. Ctrl-C (SIGINT) or SIGTERM stops
the server after in-flight requests finish; a second Ctrl-C stops it at once.";

const AFTER_HELP: &str = "\
Examples:
  demo-server                                  the article's server behind the full stack
  demo-server --stack none                     the article's server, bare
  demo-server --model mmc --rate-limit 183     the paper's M/M/10 server, limited at 183 req/s
  demo-server --stack adaptive --admin         no rate: the limit adapts; then halve the capacity:
      curl -X PUT --data 15 http://127.0.0.1:8070/admin/capacity
  demo-server --listen 127.0.0.1:8071 --downstream http://127.0.0.1:8070/api
                                               a tier that calls the next one
  oha -z 10s -q 1000 http://127.0.0.1:8070/api see the limiter reject
  demo-server --model instant --rate-limit 300 --redis-url redis://127.0.0.1:6379 \\
      --redis-local-share 0.33 --listen 127.0.0.1:8071
                                               one of three servers sharing 300 req/s";

/// The command line. Flag names are stable: people script against them.
#[derive(Debug, Parser)]
// NOTE: a flag given twice takes its last value, so a script (or `demo-client scenario`,
// which passes --abandoned and --backlog before the user's own --server-arg values) can
// override an earlier one.
#[command(name = "demo-server", version, about = ABOUT, long_about = LONG_ABOUT, after_help = AFTER_HELP, args_override_self = true)]
struct Cli {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8070")]
    listen: SocketAddr,

    /// What stands in front of the model: `full` (overload signal + rate limiter),
    /// `adaptive` (overload signal + adaptive limit, no rate) or `none`.
    #[arg(long, value_enum, default_value_t = StackArg::Full)]
    stack: StackArg,

    /// The latency model behind GET /api.
    #[arg(long, value_enum, default_value_t = ModelArg::Article)]
    model: ModelArg,

    /// Rate limit, requests per second [default: 250 for article and instant, 183 for mmc].
    ///
    /// The article model's default keeps it under its 30-request knee: a token bucket admits
    /// at most rate x T + burst requests in any T, so while requests last their 100 ms at
    /// most 250 x 0.1 + 5 = 30 are inside. The mmc default is the paper's: 183 req/s keeps
    /// the M/M/10 server's mean response time under 100 ms.
    #[arg(long, value_name = "REQ_PER_S", value_parser = clap::value_parser!(u32).range(1..))]
    rate_limit: Option<u32>,

    /// Token bucket burst: requests admitted at once above the rate [default: 5 for article and
    /// instant, 10 for mmc]. Not allowed with the window algorithms, whose burst is their
    /// quota.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    burst: Option<u32>,

    /// Rate limiting algorithm.
    #[arg(long, default_value_t = Algorithm::TokenBucket, value_parser = algorithm_parser())]
    algorithm: Algorithm,

    /// What the rate limit applies to: all requests together, or each client IP address.
    #[arg(long, default_value_t = KeyBy::Global, value_parser = key_parser())]
    key: KeyBy,

    /// Call this URL (GET, through the retrying client stack) before answering each /api
    /// request, to chain tiers: server -> server -> server.
    #[arg(long, value_name = "URL")]
    downstream: Option<http::Uri>,

    /// article: delay at or below the knee.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration, help_heading = "Article model")]
    base_delay: Duration,

    /// article: concurrency up to which the delay is flat.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 30,
        help_heading = "Article model"
    )]
    knee: usize,

    /// article: growth factor of the delay per --step requests above the knee.
    #[arg(
        long,
        value_name = "FACTOR",
        default_value_t = 1.05,
        help_heading = "Article model"
    )]
    growth: f64,

    /// article: requests above the knee per growth factor.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 15,
        help_heading = "Article model"
    )]
    step: usize,

    /// article: how often a request re-evaluates its delay.
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = parse_duration, help_heading = "Article model")]
    tick: Duration,

    /// article: the cap on the delay (the original simulation overflowed without one).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration, help_heading = "Article model")]
    max_delay: Duration,

    /// mmc: number of workers.
    #[arg(long, value_name = "N", default_value_t = NonZeroUsize::new(10).expect("not zero"), help_heading = "M/M/c model")]
    workers: NonZeroUsize,

    /// mmc: mean service time.
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = parse_duration, help_heading = "M/M/c model")]
    mean_service: Duration,

    /// mmc: seed of the service times [default: random].
    #[arg(long, value_name = "N", help_heading = "M/M/c model")]
    seed: Option<u64>,

    /// Length of the listen queue: connections the kernel accepts and holds while the server
    /// does not take them (for instance while it is stopped with SIGSTOP). The default is Go's
    /// (the article's server): net.core.somaxconn, 4096 on current Linux, which also caps
    /// larger values. tokio's own default is 1024.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65535))]
    backlog: u32,

    /// What to do with a request whose client went away. serve (the default): every request
    /// that reached the server does its work to the end, as in the article's server and any
    /// thread-pool server. cancel: the work stops when hyper sees the connection close
    /// (hyper's behaviour), which makes the server much harder to collapse.
    #[arg(long, value_enum, default_value_t = AbandonedArg::Serve)]
    abandoned: AbandonedArg,

    /// A connection without a request in progress must send a complete request head within
    /// this time (from its accept, or from its previous response), or it is closed. Guards
    /// against clients that hold connections with unfinished headers.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, help_heading = "Limits")]
    header_read_timeout: Duration,

    /// Most connections open at once. At the cap, a new connection makes the server close
    /// the one idle the longest (idle keep-alive, unfinished headers), so /healthz still
    /// answers under a flood of slow connections. Lowered at startup, with a warning, to fit
    /// the open-files limit with a tenth of it (at least 64 descriptors) kept for the rest;
    /// the soft limit is first raised to the hard one, as Go's runtime does.
    #[arg(long, value_name = "N", default_value_t = ServerConfig::DEFAULT_MAX_CONNECTIONS, help_heading = "Limits")]
    max_connections: NonZeroUsize,

    /// Longest --downstream response body read, in bytes (65536, 64KiB, 1MiB); a longer
    /// one fails the call with 502 Bad Gateway. The default is Envoy's default buffer limit.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = parse_size, help_heading = "Limits")]
    max_downstream_body: usize,

    /// Keep the rate limit in this Redis (redis://HOST:PORT[/DB]), shared by every
    /// demo-server that uses it: one limit for the fleet.
    #[arg(long, value_name = "URL", help_heading = "Fleet")]
    redis_url: Option<String>,

    /// The share of the limit this server applies on its own while Redis is away
    /// (1/N for N servers) [default: 1].
    #[arg(
        long,
        value_name = "FRACTION",
        requires = "redis_url",
        help_heading = "Fleet"
    )]
    redis_local_share: Option<f64>,

    /// How long a decision may wait for Redis before the local share decides [default: 5ms].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "redis_url", help_heading = "Fleet")]
    redis_budget: Option<Duration>,

    /// Serve GET and PUT /admin/capacity, to read and change the model's capacity (article:
    /// the knee; mmc: the workers) while the server runs. Off by default: anyone who can
    /// reach the server could change it.
    #[arg(long)]
    admin: bool,

    /// Do not print the status line.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AbandonedArg {
    /// Finish its work; it keeps counting toward the concurrency.
    Serve,
    /// Stop working on it.
    Cancel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StackArg {
    /// Overload signal and rate limiter in front of the model.
    Full,
    /// Overload signal and an adaptive concurrency limit (no rate) in front of the model.
    Adaptive,
    /// The bare model.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModelArg {
    /// The article's server.
    Article,
    /// The paper's M/M/c server.
    Mmc,
    /// No latency at all.
    Instant,
}

/// `--algorithm`: the library's names, parsed by the library, listed with their help.
fn algorithm_parser() -> impl TypedValueParser<Value = Algorithm> {
    let values = Algorithm::ALL.map(|algorithm| {
        PossibleValue::new(algorithm.as_str()).help(match algorithm {
            Algorithm::TokenBucket => "Token bucket (GCRA): the rate, with bursts of --burst",
            Algorithm::FixedWindow => "Fixed window of one second",
            Algorithm::SlidingWindow => "Sliding window of one second",
        })
    });
    PossibleValuesParser::new(values).try_map(|name| name.parse::<Algorithm>())
}

/// `--key`: the library's names, parsed by the library, listed with their help.
fn key_parser() -> impl TypedValueParser<Value = KeyBy> {
    let values = KeyBy::ALL.map(|key| {
        PossibleValue::new(key.as_str()).help(match key {
            KeyBy::Global => "One limit for all clients",
            KeyBy::Ip => "One limit per client IP address",
        })
    });
    PossibleValuesParser::new(values).try_map(|name| name.parse::<KeyBy>())
}

/// Everything the flags describe, validated.
struct Plan {
    listen: SocketAddr,
    backlog: u32,
    server: ServerConfig,
    latency: LatencyModel,
    stack: Stack,
    downstream: Option<Downstream>,
    admin: bool,
    redis: Option<RedisStore>,
    quiet: bool,
}

impl Cli {
    /// Validates the flags; the error says which flag is wrong.
    fn plan(&self) -> Result<Plan, String> {
        let latency = match self.model {
            ModelArg::Article => ArticleModel::builder()
                .base(self.base_delay)
                .knee(self.knee)
                .growth(self.growth)
                .step(self.step)
                .tick(self.tick)
                .max_delay(self.max_delay)
                .build()
                .map_err(|e| e.to_string())?
                .into(),
            ModelArg::Mmc => {
                let mut b = MmcModel::builder()
                    .workers(self.workers)
                    .mean_service(self.mean_service);
                if let Some(seed) = self.seed {
                    b = b.seed(seed);
                }
                b.build().map_err(|e| e.to_string())?.into()
            }
            ModelArg::Instant => LatencyModel::Instant,
        };
        let redis = self.redis_config()?;
        if redis.is_some() && self.stack != StackArg::Full {
            return Err(format!(
                "--redis-url keeps the rate limit of --stack full in Redis; --stack {} has none",
                self.stack
                    .to_possible_value()
                    .map(|v| v.get_name().to_owned())
                    .unwrap_or_default()
            ));
        }
        let stack = match self.stack {
            StackArg::None => Stack::None,
            StackArg::Full => Stack::Full {
                overload: OverloadSignalLayer::default(),
                rate_limit: match &redis {
                    None => self.rate_limit_config().layer(),
                    Some(redis) => self.rate_limit_config().redis_layer(redis),
                }
                .map_err(|e| e.to_string())?,
            },
            StackArg::Adaptive => Stack::Adaptive {
                overload: OverloadSignalLayer::default(),
                adaptive: AdaptiveLimitLayer::new(),
            },
        };
        let downstream = self
            .downstream
            .clone()
            .map(|uri| Downstream::with_max_body(uri, self.max_downstream_body))
            .transpose()
            .map_err(|e| e.to_string())?;
        let server = ServerConfig::builder()
            .abandoned(match self.abandoned {
                AbandonedArg::Cancel => Abandoned::Cancel,
                AbandonedArg::Serve => Abandoned::Serve,
            })
            .header_read_timeout(self.header_read_timeout)
            .max_connections(self.max_connections)
            .build()
            .map_err(|e| format!("--{}", e.to_string().replace('_', "-")))?;
        Ok(Plan {
            listen: self.listen,
            backlog: self.backlog,
            server,
            latency,
            stack,
            downstream,
            admin: self.admin,
            redis: redis.map(|r| r.store),
            quiet: self.quiet,
        })
    }

    /// `--redis-url` and its settings, validated.
    fn redis_config(&self) -> Result<Option<RedisConfig>, String> {
        let Some(url) = &self.redis_url else {
            return Ok(None);
        };
        let mut config = RedisConfig::new(RedisStore::new(url).map_err(|e| e.to_string())?);
        if let Some(share) = self.redis_local_share {
            config.local_share = share;
        }
        if let Some(budget) = self.redis_budget {
            config.budget = budget;
        }
        Ok(Some(config))
    }

    fn rate_limit_config(&self) -> RateLimitConfig {
        let (rate, burst) = match self.model {
            ModelArg::Article | ModelArg::Instant => (ARTICLE_RATE_LIMIT, ARTICLE_BURST),
            ModelArg::Mmc => (MMC_RATE_LIMIT, MMC_BURST),
        };
        let algorithm = self.algorithm;
        let burst = match algorithm {
            Algorithm::TokenBucket => Some(self.burst.unwrap_or(burst)),
            // NOTE: an explicit --burst with a window algorithm is kept, so the limiter's
            // own validation refuses it with its message.
            Algorithm::FixedWindow | Algorithm::SlidingWindow => self.burst,
        };
        RateLimitConfig {
            algorithm,
            rate: self.rate_limit.unwrap_or(rate),
            burst,
            key: self.key,
            client_ip: ClientIp::from_extension(|c: &ConnectInfo<SocketAddr>| Some(c.0)),
            ..RateLimitConfig::default()
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let plan = match cli.plan() {
        Ok(plan) => plan,
        Err(message) => Cli::command()
            .error(ErrorKind::ValueValidation, message)
            .exit(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(plan)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(plan: Plan) -> Result<(), String> {
    let server_config = fit_to_open_files(plan.server);
    let listener = listen(plan.listen, plan.backlog).map_err(|e| bind_error(plan.listen, &e))?;
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;

    if let Some(store) = &plan.redis {
        // NOTE: connected before serving, so that the first requests do not spend their
        // budget on the handshake; a Redis that is away is not fatal (the local share
        // decides until it answers).
        match tokio::time::timeout(Duration::from_secs(2), store.ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: {e}; limiting locally until it answers"),
            Err(_) => eprintln!(
                "warning: Redis at {} does not answer within 2 s; limiting locally until it does",
                store.addr()
            ),
        }
    }
    let model = Model::new(plan.latency);
    let histogram = plan.stack.overload().map(|o| o.histogram().clone());
    let adaptive = match &plan.stack {
        Stack::Adaptive { adaptive, .. } => Some(adaptive.clone()),
        Stack::None | Stack::Full { .. } => None,
    };
    let stack_name = plan.stack.name();
    let mut config = AppConfig::new(model.clone())
        .admin(plan.admin)
        .stack(plan.stack)
        .metrics(metrics.clone());
    if let Some(downstream) = plan.downstream {
        config = config.downstream(downstream);
    }
    let stats = config.stats().clone();
    let server = Server::new(listener, app(config), server_config);
    let addr = server.local_addr().map_err(|e| e.to_string())?;

    println!(
        "demo-server listening on http://{addr} (GET /api, /healthz, /metrics); model: {}; stack: {}; abandoned requests: {}{}",
        describe(model.latency()),
        stack_name,
        match server_config.abandoned() {
            Abandoned::Serve => "served to the end",
            Abandoned::Cancel => "cancelled",
        },
        plan.redis
            .as_ref()
            .map(|store| format!("; rate limit in Redis at {}", store.addr()))
            .unwrap_or_default(),
    );
    let status = tokio::spawn(status_lines(
        model,
        stats,
        server.stats(),
        histogram,
        adaptive,
        metrics,
        plan.quiet,
    ));
    let result = server.run(shutdown_signal()).await;
    status.abort();
    result.map_err(|e| format!("the server failed: {e}"))
}

/// Raises the open-files limit as Go's runtime does, and lowers the connection cap, with a
/// warning, when the limit cannot hold it (see `connections_within`).
fn fit_to_open_files(config: ServerConfig) -> ServerConfig {
    let limit = match raise_open_files_limit() {
        Ok(limit) => limit,
        Err(e) => {
            eprintln!("warning: cannot raise the open-files limit: {e}");
            Some(rustix::process::getrlimit(
                rustix::process::Resource::Nofile,
            ))
            .and_then(|l| l.current)
        }
    };
    let Some(limit) = limit else {
        return config;
    };
    let fits = connections_within(limit);
    if config.max_connections().get() <= fits {
        return config;
    }
    eprintln!(
        "warning: --max-connections {} lowered to {fits}: the process may open {limit} files",
        config.max_connections()
    );
    let fits = NonZeroUsize::new(fits).unwrap_or(NonZeroUsize::MIN);
    ServerConfig::builder()
        .abandoned(config.abandoned())
        .header_read_timeout(config.header_read_timeout())
        .max_connections(fits)
        .build()
        .unwrap_or(config)
}

fn bind_error(addr: SocketAddr, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "cannot listen on {addr}: the address is already in use (another demo-server?); \
             stop it or choose another address with --listen"
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "cannot listen on {addr}: the address is not one of this machine's; \
             try --listen 127.0.0.1:8070"
        ),
        std::io::ErrorKind::PermissionDenied => {
            format!("cannot listen on {addr}: permission denied (ports below 1024 need privileges)")
        }
        _ => format!("cannot listen on {addr}: {e}"),
    }
}

fn describe(latency: &LatencyModel) -> String {
    match latency {
        LatencyModel::Article(m) => format!(
            "article ({:?} up to {} inside, x{} per {} above, cap {:?})",
            m.base(),
            m.knee(),
            m.growth(),
            m.step(),
            m.max_delay()
        ),
        LatencyModel::Mmc(m) => format!(
            "mmc ({} workers, mean service {:?}, seed {})",
            m.workers(),
            m.mean_service(),
            m.seed()
        ),
        LatencyModel::Instant => "instant".to_owned(),
    }
}

/// Once a second: the article's status line plus the stack's counters. Also runs the
/// Prometheus recorder's upkeep, which the recorder needs when no exporter task runs it.
async fn status_lines(
    model: Model,
    stats: ServerStats,
    connections: ConnectionStats,
    histogram: Option<AttemptHistogram>,
    adaptive: Option<AdaptiveLimitLayer>,
    metrics: PrometheusHandle,
    quiet: bool,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut before = stats.snapshot();
    loop {
        ticker.tick().await;
        metrics.run_upkeep();
        metrics::gauge!(demo_server::server::metric_names::CONNECTIONS_OPEN)
            .set(connections.open() as f64);
        let now = stats.snapshot();
        let second = now.since(&before);
        before = now;
        if quiet {
            continue;
        }
        let retry_share = histogram
            .as_ref()
            .and_then(|h| h.snapshot().retry_share())
            .map_or_else(|| "-".to_owned(), |s| format!("{:.1}%", s * 100.0));
        println!(
            "concurrency: {}, last delay: {:?}, admitted: {}/s, rejected: {}/s, stop signals: {}/s, failed: {}/s, retry share (10 s): {}, connections: {}",
            model.concurrency(),
            model.last_delay(),
            second.served,
            second.rejected,
            second.stop_signals,
            second.failed,
            retry_share,
            connections.open(),
        );
        if let Some(adaptive) = &adaptive {
            let a = adaptive.status();
            println!(
                "  adaptive limit: {}, in flight: {}, baseline: {:?}, latency: {:?}{}, capacity: {}",
                a.limit,
                a.in_flight,
                a.baseline.unwrap_or_default(),
                a.latency.unwrap_or_default(),
                if a.probing {
                    " (measuring the baseline)"
                } else {
                    ""
                },
                model.capacity().map_or(0, |c| c.get()),
            );
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM; a second one exits at once.
async fn shutdown_signal() {
    wait_for_signal().await;
    eprintln!("shutting down: waiting for in-flight requests (Ctrl-C again to stop now)");
    tokio::spawn(async {
        wait_for_signal().await;
        eprintln!("stopping now");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("demo-server").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_articles_server_behind_the_full_stack() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.listen, "127.0.0.1:8070".parse().unwrap());
        assert_eq!(cli.stack, StackArg::Full);
        let plan = cli.plan().unwrap();
        assert_eq!(plan.latency, LatencyModel::Article(ArticleModel::default()));
        assert!(matches!(plan.stack, Stack::Full { .. }));
        let rl = cli.rate_limit_config();
        assert_eq!((rl.rate, rl.burst), (250, Some(5)));
        assert_eq!(rl.algorithm, Algorithm::TokenBucket);
        // The article's server: abandoned work served, Go's listen queue.
        assert_eq!(plan.backlog, 4096);
        assert_eq!(plan.server, ServerConfig::new());
        assert_eq!(plan.server.abandoned(), Abandoned::Serve);
        // Under hostile peers: headers within 10 s, 10 000 connections, 1 MiB bodies.
        assert_eq!(plan.server.header_read_timeout(), Duration::from_secs(10));
        assert_eq!(plan.server.max_connections().get(), 10_000);
        assert_eq!(cli.max_downstream_body, 1 << 20);
    }

    #[test]
    fn limits_reach_the_plan() {
        let cli = parse(&[
            "--abandoned",
            "cancel",
            "--header-read-timeout",
            "2s",
            "--max-connections",
            "50",
            "--max-downstream-body",
            "64KiB",
            "--downstream",
            "http://127.0.0.1:9/api",
        ])
        .unwrap();
        let plan = cli.plan().unwrap();
        assert_eq!(plan.server.abandoned(), Abandoned::Cancel);
        assert_eq!(plan.server.header_read_timeout(), Duration::from_secs(2));
        assert_eq!(plan.server.max_connections().get(), 50);
        assert_eq!(plan.downstream.unwrap().max_body(), 64 * 1024);
    }

    #[test]
    fn a_later_flag_overrides_an_earlier_one() {
        let cli = parse(&[
            "--backlog",
            "16",
            "--abandoned",
            "serve",
            "--backlog",
            "1024",
            "--abandoned",
            "cancel",
        ])
        .unwrap();
        assert_eq!(cli.backlog, 1024);
        assert_eq!(cli.abandoned, AbandonedArg::Cancel);
    }

    #[test]
    fn mmc_defaults_follow_the_paper() {
        let cli = parse(&["--model", "mmc", "--seed", "3"]).unwrap();
        let plan = cli.plan().unwrap();
        let LatencyModel::Mmc(m) = plan.latency else {
            panic!("not mmc")
        };
        assert_eq!((m.workers().get(), m.seed()), (10, 3));
        assert_eq!(m.mean_service(), Duration::from_millis(50));
        let rl = cli.rate_limit_config();
        assert_eq!((rl.rate, rl.burst), (183, Some(10)));
    }

    #[test]
    fn flags_reach_the_plan() {
        let cli = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--stack",
            "none",
            "--rate-limit",
            "40",
            "--algorithm",
            "sliding-window",
            "--key",
            "ip",
            "--base-delay",
            "20ms",
            "--downstream",
            "http://127.0.0.1:9/api",
        ])
        .unwrap();
        let rl = cli.rate_limit_config();
        assert_eq!((rl.rate, rl.burst), (40, None));
        assert_eq!(rl.algorithm, Algorithm::SlidingWindow);
        assert_eq!(rl.key, KeyBy::Ip);
        let plan = cli.plan().unwrap();
        assert!(matches!(plan.stack, Stack::None));
        assert_eq!(
            plan.latency,
            LatencyModel::Article(
                ArticleModel::builder()
                    .base(Duration::from_millis(20))
                    .build()
                    .unwrap()
            )
        );
        assert!(plan.downstream.is_some());
    }

    #[test]
    fn stack_adaptive_has_no_rate_and_admin_is_opt_in() {
        let plan = parse(&[]).unwrap().plan().unwrap();
        assert!(!plan.admin);
        let cli = parse(&["--stack", "adaptive", "--admin", "--model", "mmc"]).unwrap();
        let plan = cli.plan().unwrap();
        assert!(plan.admin);
        let Stack::Adaptive { adaptive, .. } = plan.stack else {
            panic!("not the adaptive stack")
        };
        assert!(adaptive.status().probing, "nothing measured yet");
        assert_eq!(
            adaptive.status().limit,
            AdaptiveLimitLayer::DEFAULT_MIN_LIMIT
        );
    }

    #[test]
    fn the_rate_limit_flags_take_every_name_of_the_library() {
        for algorithm in Algorithm::ALL {
            let cli = parse(&["--algorithm", algorithm.as_str()]).unwrap();
            assert_eq!(cli.algorithm, algorithm);
        }
        for key in KeyBy::ALL {
            let cli = parse(&["--key", key.as_str()]).unwrap();
            assert_eq!(cli.key, key);
        }
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        for (args, needle) in [
            (&["--stack", "half"][..], "invalid value 'half'"),
            (&["--listen", "localhost"], "invalid socket address"),
            (&["--rate-limit", "0"], "0 is not in 1.."),
            (&["--algorithm", "leaky-bucket"], "token-bucket"),
            (&["--base-delay", "soon"], "invalid duration \"soon\""),
            (&["--workers", "0"], "zero"),
            (&["--max-connections", "0"], "--max-connections"),
            (&["--max-downstream-body", "1MB"], "invalid size \"1MB\""),
            (&["--bogus"], "unexpected argument '--bogus'"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn invalid_combinations_are_refused_by_the_plan() {
        for (args, needle) in [
            (
                &["--algorithm", "fixed-window", "--burst", "5"][..],
                "burst",
            ),
            (&["--base-delay", "0s"], "base delay must not be zero"),
            (&["--growth", "0.5"], "growth"),
            (&["--model", "mmc", "--mean-service", "0s"], "mean service"),
            (&["--downstream", "https://example.com/"], "http://"),
            (
                &[
                    "--stack",
                    "adaptive",
                    "--redis-url",
                    "redis://127.0.0.1:6379",
                ],
                "--redis-url keeps the rate limit of --stack full in Redis; --stack adaptive has none",
            ),
            (&["--downstream", "/api"], "http://"),
            (
                &["--header-read-timeout", "0s"],
                "--header-read-timeout must be greater than zero",
            ),
        ] {
            let Err(err) = parse(args).unwrap().plan() else {
                panic!("{args:?} was accepted")
            };
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn redis_flags_reach_the_plan_and_are_checked() {
        let cli = parse(&[
            "--redis-url",
            "redis://127.0.0.1:6390",
            "--redis-local-share",
            "0.25",
            "--redis-budget",
            "20ms",
        ])
        .unwrap();
        let redis = cli.redis_config().unwrap().unwrap();
        assert!((redis.local_share - 0.25).abs() < 1e-12);
        assert_eq!(redis.budget, Duration::from_millis(20));
        let plan = cli.plan().unwrap();
        assert_eq!(plan.redis.unwrap().addr(), "127.0.0.1:6390");
        // The defaults.
        let redis = parse(&["--redis-url", "redis://127.0.0.1"])
            .unwrap()
            .redis_config()
            .unwrap()
            .unwrap();
        assert_eq!(redis.budget, Duration::from_millis(5));
        assert!(parse(&[]).unwrap().redis_config().unwrap().is_none());
        // Settings without a URL, a bad URL, a bad share, a window Redis does not offer.
        assert!(parse(&["--redis-local-share", "0.5"]).is_err());
        for (args, needle) in [
            (
                &["--redis-url", "http://127.0.0.1"][..],
                "url must be redis://",
            ),
            (
                &[
                    "--redis-url",
                    "redis://127.0.0.1",
                    "--redis-local-share",
                    "3",
                ],
                "local_share must be within (0, 1]",
            ),
            (
                &[
                    "--redis-url",
                    "redis://127.0.0.1",
                    "--algorithm",
                    "fixed-window",
                ],
                "token-bucket or sliding-window with Redis",
            ),
        ] {
            let Err(err) = parse(args).unwrap().plan() else {
                panic!("{args:?} was accepted")
            };
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn busy_port_error_says_what_to_do() {
        let e = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let msg = bind_error("127.0.0.1:8070".parse().unwrap(), &e);
        assert!(
            msg.contains("already in use") && msg.contains("--listen"),
            "{msg}"
        );
    }
}
