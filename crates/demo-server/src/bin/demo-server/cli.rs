//! The command line: the flags, their help, and the [`Plan`] they describe once checked.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use demo_server::app::{ARTICLE_BURST, ARTICLE_RATE_LIMIT, MMC_BURST, MMC_RATE_LIMIT, Stack};
use demo_server::downstream::Downstream;
use demo_server::duration::parse_duration;
use demo_server::model::{ArticleModel, LatencyModel, MmcModel};
use demo_server::peers::Peer;
use demo_server::server::{Abandoned, ServerConfig};
use demo_server::size::parse_size;
use overload_signal::signal::StopRule;
use overload_signal::{DeadlineLayer, OverloadSignalLayer};
use ratelimit_layer::AdaptiveLimitLayer;
use ratelimit_layer::config::{Algorithm, KeyBy, RateLimitConfig, RedisConfig};
use ratelimit_layer::key::{ClientIp, ForwardedHeader, IpNet, TrustedProxies};
use ratelimit_layer::limits_file::LimitsLayer;
use ratelimit_layer::redis::RedisStore;

#[cfg(test)]
mod tests;

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
With --limits FILE, the limits of a TOML file (a default, per route, per tenant; see
ratelimit_layer::limits_file) take the place of --rate-limit in --stack full, each entry a
token bucket per client IP (or global), reloaded while serving when the file changes: a
change is in force within a second, each kept limit keeping its clients' state; a file with
an error is refused whole, logged at WARN with its line and column, and the limits in force
stay. A bad file at startup is an error.
--stack adaptive puts the overload-signal layer in front of an adaptive concurrency limit
instead: no rate configured, it finds the model's capacity from its latency and rejects above
it with 503 Service Unavailable and Retry-After. Both stacks have the deadline layer between
the overload-signal layer and the limit. --stack deadline is the deadline layer alone: a
request whose caller's deadline has passed (X-Request-Deadline, grpc-timeout, Envoy's
x-envoy-expected-rq-timeout-ms) is answered
504 Gateway Timeout at once, without the model, and one still running at its deadline is
cancelled; no rate, no limit. --stack none serves the bare model.
To compare, --stack tower-shed, tower-resilience and little put another project's protection
alone in front of the model (no overload signal, no deadline layer), each answering 503
Service Unavailable to what it sheds: tower's ConcurrencyLimit + LoadShed at the model's
capacity, tower-resilience's adaptive limiter (Vegas), little-loadshedder (Little's law).

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
  demo-server --stack deadline                 no rate, no limit: expired requests dropped
  demo-server --model mmc --stack tower-shed   tower's ConcurrencyLimit + LoadShed at 10
  demo-server --stack adaptive --admin         no rate: the limit adapts; then halve the capacity:
      curl -X PUT --data 15 http://127.0.0.1:8070/admin/capacity
  demo-server --listen 127.0.0.1:8071 --downstream http://127.0.0.1:8070/api
                                               a tier that calls the next one
  oha -z 10s -q 1000 http://127.0.0.1:8070/api see the limiter reject
  demo-server --model instant --limits limits.toml
                                               limits per route and tenant, reloaded when
                                               limits.toml changes
  demo-server --model instant --rate-limit 300 --redis-url redis://127.0.0.1:6379 \\
      --redis-local-share 0.33 --listen 127.0.0.1:8071
                                               one of three servers sharing 300 req/s
  demo-server --rate-limit 300 --burst 30 --redis-cluster --redis-url redis://10.0.0.5:6379 \\
      --redis-url redis://10.0.0.6:6379 --redis-reservation 10
                                               the limit in a Redis Cluster, 10 units at a time
  demo-server --redis-url rediss://:PASSWORD@redis.example.com:6380 --redis-ca-cert ca.pem
                                               a managed Redis over TLS with its own CA";

/// The command line. Flag names are stable: people script against them.
#[derive(Debug, Parser)]
// NOTE: a flag given twice takes its last value, so a script (or `demo-client scenario`,
// which passes --abandoned and --backlog before the user's own --server-arg values) can
// override an earlier one.
#[command(name = "demo-server", version, about = ABOUT, long_about = LONG_ABOUT, after_help = AFTER_HELP, args_override_self = true)]
pub(crate) struct Cli {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8070")]
    listen: SocketAddr,

    /// What stands in front of the model: `full` (overload signal + deadline + rate
    /// limiter), `adaptive` (overload signal + deadline + adaptive limit, no rate),
    /// `deadline` (the deadline layer alone) or `none`; or, to compare, another project's
    /// protection alone: `tower-shed`, `tower-resilience` or `little`.
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

    /// Limits per route and per tenant from this TOML file, in place of --rate-limit (which,
    /// with --burst, --algorithm, --key and --redis-url, it excludes), with --stack full;
    /// the file is looked at every 250 ms and a change is in force within a second. A file
    /// with an error is refused whole: at startup the server does not start (the error
    /// names path:line:column); later the limits in force stay and the reason is logged.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["rate_limit", "burst", "algorithm", "key", "redis_url"]
    )]
    limits: Option<std::path::PathBuf>,

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

    /// Keep the rate limit in this Redis (redis://[:PASSWORD@]HOST:PORT[/DB], rediss://...
    /// for TLS), shared by every demo-server that uses it: one limit for the fleet. With
    /// --redis-cluster, a seed node of the Cluster; repeat it to give several.
    #[arg(long, value_name = "URL", help_heading = "Fleet")]
    redis_url: Vec<String>,

    /// The --redis-url values are seed nodes of a Redis Cluster: any reachable one finds
    /// every node.
    #[arg(long, requires = "redis_url", help_heading = "Fleet")]
    redis_cluster: bool,

    /// TLS (rediss://): the CA that signed Redis's certificate (PEM file), instead of the
    /// system's roots.
    #[arg(
        long,
        value_name = "FILE",
        requires = "redis_url",
        help_heading = "Fleet"
    )]
    redis_ca_cert: Option<std::path::PathBuf>,

    /// TLS (rediss://): a client certificate (PEM file) for a Redis that asks for one; with
    /// --redis-client-key.
    #[arg(
        long,
        value_name = "FILE",
        requires_all = ["redis_url", "redis_client_key"],
        help_heading = "Fleet"
    )]
    redis_client_cert: Option<std::path::PathBuf>,

    /// TLS (rediss://): the client certificate's private key (PEM file).
    #[arg(
        long,
        value_name = "FILE",
        requires = "redis_client_cert",
        help_heading = "Fleet"
    )]
    redis_client_key: Option<std::path::PathBuf>,

    /// Take up to N units of the limit (at most its burst) at a time from Redis and spend
    /// them here without a round trip: far fewer round trips, for an overshoot of at most N
    /// per server in any window [default: 0, off].
    #[arg(long, value_name = "N", requires = "redis_url", help_heading = "Fleet")]
    redis_reservation: Option<u32>,

    /// With --key ip: the most new keys this server makes in Redis per second; keys over
    /// it share one overflow limit [default: 1000].
    #[arg(long, value_name = "N", requires = "redis_url", help_heading = "Fleet")]
    redis_max_new_keys: Option<u32>,

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

    /// Trust this load balancer or reverse proxy (an address or a network such as
    /// 10.0.0.0/8; repeat for several) to say who the client is: for a request whose peer is
    /// one of them, the client is the address it forwards in --forwarded-header. One
    /// setting for the overload layer's callers and the per-client rate limit (--key ip).
    /// Default: none trusted, forwarding headers ignored: behind a balancer every request
    /// has its address.
    #[arg(long = "trusted-proxy", value_name = "NET", help_heading = "Fleet")]
    trusted_proxies: Vec<IpNet>,

    /// The header trusted proxies write the client's address in.
    #[arg(long, value_enum, default_value_t = ForwardedArg::XForwardedFor, requires = "trusted_proxies", help_heading = "Fleet")]
    forwarded_header: ForwardedArg,

    /// The overload layer's stop rule: the retry share of the window above which a rejection
    /// becomes the stop signal, within 0..1 [default: 0.05, the library's
    /// `StopRule::DEFAULT_RETRY_SHARE`]. 0.5: only when retries are the majority.
    #[arg(long, value_name = "FRACTION")]
    stop_retry_share: Option<f64>,

    /// How far this server's clock and its clients' may be apart: a request whose
    /// X-Request-Deadline has passed by more is answered 504 at once, and one whose send time
    /// lies further in the future is timed from its arrival. The default covers hosts kept
    /// within ntpd's 128 ms step threshold of a common source.
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_duration, help_heading = "Deadlines")]
    skew_allowance: Duration,

    /// Serve GET and PUT /admin/capacity, to read and change the model's capacity (article:
    /// the knee; mmc: the workers) while the server runs. Off by default: anyone who can
    /// reach the server could change it.
    #[arg(long)]
    admin: bool,

    /// --stack tower-shed: the concurrency of tower's ConcurrencyLimit [default: the model's
    /// capacity: mmc's workers, the article's knee; required with the instant model].
    #[arg(long, value_name = "N", help_heading = "Peers")]
    peer_concurrency: Option<NonZeroUsize>,

    /// --stack little: the average latency little-loadshedder keeps [default: twice the
    /// model's unloaded latency: 2 x --mean-service for mmc (the M/M/10 server's own mean
    /// is 92 ms at the paper's 183 req/s), 2 x --base-delay for the article; required with
    /// the instant model].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "Peers")]
    little_target: Option<Duration>,

    /// Do not print the status line.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ForwardedArg {
    /// `X-Forwarded-For: client, proxy` (HAProxy's `option forwardfor`, nginx, Envoy).
    XForwardedFor,
    /// `Forwarded: for=client` (RFC 7239).
    Forwarded,
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
    /// Overload signal, deadline layer and rate limiter in front of the model.
    Full,
    /// Overload signal, deadline layer and an adaptive concurrency limit (no rate) in front
    /// of the model.
    Adaptive,
    /// The deadline layer alone: expired requests answered 504 at once; no rate, no limit.
    Deadline,
    /// The bare model.
    None,
    /// tower's ConcurrencyLimit (at --peer-concurrency) inside LoadShed, answering 503.
    TowerShed,
    /// tower-resilience's adaptive limiter (Vegas, its defaults) inside tower's LoadShed,
    /// answering 503.
    TowerResilience,
    /// little-loadshedder: Little's law keeps the average latency at --little-target;
    /// answers 503.
    Little,
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
pub(crate) struct Plan {
    pub(crate) listen: SocketAddr,
    pub(crate) backlog: u32,
    pub(crate) server: ServerConfig,
    pub(crate) latency: LatencyModel,
    pub(crate) stack: Stack,
    pub(crate) deadline: DeadlineLayer,
    pub(crate) downstream: Option<Downstream>,
    pub(crate) admin: bool,
    pub(crate) redis: Option<RedisStore>,
    pub(crate) quiet: bool,
}

impl Cli {
    /// Validates the flags; the error says which flag is wrong.
    pub(crate) fn plan(&self) -> Result<Plan, String> {
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
        if self.limits.is_some() && self.stack != StackArg::Full {
            return Err("--limits sets the rate limits of --stack full".to_owned());
        }
        let overload = self.overload_layer()?;
        let stack = match self.stack {
            StackArg::None => Stack::None,
            StackArg::Deadline => Stack::Deadline,
            StackArg::Full => Stack::Full {
                overload,
                rate_limit: match (&self.limits, &redis) {
                    (Some(path), _) => Ok(LimitsLayer::builder()
                        .client_ip(ClientIp::new())
                        .watch(path)
                        .map_err(|e| format!("--limits: {e}"))?
                        .into()),
                    (None, None) => self.rate_limit_config().layer().map(Into::into),
                    (None, Some(redis)) => {
                        self.rate_limit_config().redis_layer(redis).map(Into::into)
                    }
                }
                .map_err(|e| e.to_string())?,
            },
            StackArg::Adaptive => Stack::Adaptive {
                overload,
                adaptive: AdaptiveLimitLayer::new(),
            },
            StackArg::TowerShed => Stack::Peer(Peer::tower_shed(self.peer_concurrency(&latency)?)),
            StackArg::TowerResilience => Stack::Peer(Peer::tower_resilience()),
            StackArg::Little => Stack::Peer(self.little(&latency)?),
        };
        if self.peer_concurrency.is_some() && self.stack != StackArg::TowerShed {
            return Err("--peer-concurrency is for --stack tower-shed".to_owned());
        }
        if self.little_target.is_some() && self.stack != StackArg::Little {
            return Err("--little-target is for --stack little".to_owned());
        }
        let deadline = DeadlineLayer::builder()
            .skew_allowance(self.skew_allowance)
            .build()
            .map_err(|e| format!("--{}", e.to_string().replace('_', "-")))?;
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
            deadline,
            downstream,
            admin: self.admin,
            redis: redis.map(|r| r.store),
            quiet: self.quiet,
        })
    }

    /// The concurrency of `--stack tower-shed`: `--peer-concurrency`, or the model's
    /// capacity (mmc's workers, the article's knee).
    fn peer_concurrency(&self, latency: &LatencyModel) -> Result<NonZeroUsize, String> {
        match (self.peer_concurrency, latency) {
            (Some(n), _) => Ok(n),
            (None, LatencyModel::Mmc(mmc)) => Ok(mmc.workers()),
            (None, LatencyModel::Article(article)) => NonZeroUsize::new(article.knee())
                .ok_or_else(|| "--knee must be above zero for --stack tower-shed".to_owned()),
            (None, LatencyModel::Instant) => Err("--stack tower-shed on the instant model needs \
                                                 --peer-concurrency: the model has no capacity"
                .to_owned()),
        }
    }

    /// The peer of `--stack little`: little-loadshedder keeping `--little-target`, or twice
    /// the model's unloaded latency.
    fn little(&self, latency: &LatencyModel) -> Result<Peer, String> {
        let target = match (self.little_target, latency) {
            (Some(target), _) => target,
            (None, LatencyModel::Mmc(mmc)) => mmc.mean_service() * 2,
            (None, LatencyModel::Article(article)) => article.base() * 2,
            (None, LatencyModel::Instant) => {
                return Err(
                    "--stack little on the instant model needs --little-target: \
                            the model has no latency"
                        .to_owned(),
                );
            }
        };
        Peer::little(target).map_err(|e| format!("--little-target: {e}"))
    }

    /// The overload layer, trusting `--trusted-proxy` if given, with the stop rule of
    /// `--stop-retry-share`.
    fn overload_layer(&self) -> Result<OverloadSignalLayer, String> {
        let mut builder = OverloadSignalLayer::builder();
        if !self.trusted_proxies.is_empty() {
            let header = match self.forwarded_header {
                ForwardedArg::XForwardedFor => ForwardedHeader::XForwardedFor,
                ForwardedArg::Forwarded => ForwardedHeader::Forwarded,
            };
            let proxies = TrustedProxies::new(header, self.trusted_proxies.iter().copied())
                .map_err(|e| format!("--trusted-proxy: {e}"))?;
            builder = builder.trusted_proxies(proxies);
        }
        if let Some(share) = self.stop_retry_share {
            let rule = StopRule::builder()
                .retry_share(share)
                .build()
                .map_err(|e| format!("--stop-retry-share: {e}"))?;
            builder = builder.rule(rule);
        }
        builder.build().map_err(|e| e.to_string())
    }

    /// `--redis-url` and its settings, validated.
    fn redis_config(&self) -> Result<Option<RedisConfig>, String> {
        if self.redis_url.is_empty() {
            return Ok(None);
        }
        let mut store = if self.redis_cluster {
            RedisStore::cluster_builder(&self.redis_url)
        } else {
            let [url] = self.redis_url.as_slice() else {
                return Err(
                    "--redis-url is given more than once: several URLs are the seeds of a \
                     Redis Cluster, with --redis-cluster"
                        .to_owned(),
                );
            };
            RedisStore::builder(url)
        };
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
        };
        if let Some(path) = &self.redis_ca_cert {
            store = store.ca_certificate(read("--redis-ca-cert", path)?);
        }
        if let (Some(certificate), Some(key)) = (&self.redis_client_cert, &self.redis_client_key) {
            store = store.client_certificate(
                read("--redis-client-cert", certificate)?,
                read("--redis-client-key", key)?,
            );
        }
        let store = store.build().map_err(|e| {
            // NOTE: the library names its settings; the user typed flags.
            let flag = match e.field() {
                "ca_certificate" => "--redis-ca-cert",
                "client_certificate" => "--redis-client-cert",
                _ => "--redis-url",
            };
            format!("{flag}: {e}")
        })?;
        let mut config = RedisConfig::new(store);
        if let Some(share) = self.redis_local_share {
            config.local_share = share;
        }
        if let Some(budget) = self.redis_budget {
            config.budget = budget;
        }
        if let Some(units) = self.redis_reservation {
            config.reservation = units;
        }
        if let Some(per_second) = self.redis_max_new_keys {
            config.max_new_keys = per_second;
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
            // The peer address the server's connections insert as a `SocketAddr`.
            client_ip: ClientIp::new(),
            ..RateLimitConfig::default()
        }
    }
}
