//! The axum application: `/api` served by a model, `/healthz`, `/metrics`.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use metrics::Counter;
use metrics_exporter_prometheus::PrometheusHandle;
use overload_signal::criticality;
use overload_signal::protocol::{Criticality, Protocol, is_stop_signal, stop_signal_response};
use overload_signal::{DeadlineLayer, OverloadSignalLayer, is_overloaded};
use ratelimit_layer::limits_file::LimitsLayer;
use ratelimit_layer::{AdaptiveLimitLayer, OverloadProtectionLayer, RateLimitLayer, Remote};
use tower::util::MapResponseLayer;

use crate::downstream::Downstream;
use crate::model::{LatencyModel, Model};
use crate::peers::{Peer, Shed};

/// Names of the metrics `demo-server` records, through the `metrics` facade.
///
/// They are stable: scripts and the demo client read them from `GET /metrics`. The library
/// records them but never installs a recorder; without one (as in an in-process simulation)
/// recording costs next to nothing.
pub mod metric_names {
    /// Counter of `/api` responses, labelled `outcome`: `served` (2xx), `rejected` (429
    /// from the rate limiter, 503 with `Retry-After` from the adaptive limit, or 503 from a
    /// peer that shed the request),
    /// `stop_signal` (a response carrying the stop-retrying signal), `expired` (504 from the
    /// deadline layer: the caller's deadline had passed), `failed` (anything else).
    pub const REQUESTS: &str = "demo_server_requests_total";
    /// Gauge: requests inside the model when `/metrics` was scraped.
    pub const CONCURRENCY: &str = "demo_server_concurrency";
    /// Gauge: the highest concurrency since the previous scrape of `/metrics` (so a client
    /// scraping once a second sees each second's peak). Several scrapers share the periods.
    pub const CONCURRENCY_PEAK: &str = "demo_server_concurrency_peak";
    /// Gauge, seconds: the model's last delay (see `Model::last_delay`).
    pub const LAST_DELAY: &str = "demo_server_last_delay_seconds";
    /// Histogram (a summary in Prometheus text), seconds: time `/api` requests spent in the
    /// model.
    pub const MODEL_SECONDS: &str = "demo_server_model_seconds";
    /// Counter of `/api` requests that reached the handler, labelled `criticality`
    /// (`sheddable`, `sheddable-plus`, `critical`, `critical-plus`): the level the handler
    /// ran in, as the server stack set it in the task
    /// ([`overload_signal::criticality::current`]), or `critical`, the protocol's default,
    /// where no layer set one. The handler never reads the `X-Request-Criticality` header
    /// itself: this counter shows what the libraries delivered, so a tier behind another
    /// shows whether its caller's level reached it.
    pub const HANDLER_CRITICALITY: &str = "demo_server_handler_criticality_total";
}

/// The default rate limit of `demo-server --stack full` with the `article` (and `instant`)
/// model: 250 requests per second.
///
/// It keeps the article's model under its 30-request knee: a token bucket admits at most
/// `rate x T + burst` requests in any interval `T`, and a request lasts 100 ms, so with
/// [`ARTICLE_BURST`] at most `250 x 0.1 + 5 = 30` requests are inside (about 25 on average).
pub const ARTICLE_RATE_LIMIT: u32 = 250;

/// The default token bucket burst with the `article` model: 5; see [`ARTICLE_RATE_LIMIT`].
pub const ARTICLE_BURST: u32 = 5;

/// The default rate limit with the `mmc` model: 183 requests per second, the paper's figure
/// below which its M/M/10 server keeps low response times (Erlang C: 92 ms mean).
pub const MMC_RATE_LIMIT: u32 = 183;

/// The default token bucket burst with the `mmc` model: 10, one request per worker.
pub const MMC_BURST: u32 = 10;

/// The default `(rate per second, burst)` of `demo-server --stack full` for `latency`.
pub const fn default_rate_limit(latency: &LatencyModel) -> (u32, u32) {
    match latency {
        LatencyModel::Article(_) | LatencyModel::Instant => (ARTICLE_RATE_LIMIT, ARTICLE_BURST),
        LatencyModel::Mmc(_) => (MMC_RATE_LIMIT, MMC_BURST),
    }
}

/// The outcome labels of [`metric_names::REQUESTS`].
const SERVED: &str = "served";
const REJECTED: &str = "rejected";
const STOP_SIGNAL: &str = "stop_signal";
const EXPIRED: &str = "expired";
const FAILED: &str = "failed";

/// What [`app`] serves.
///
/// Build it from a [`Model`] and keep a clone of the model and of [`stats`](Self::stats) to
/// watch the server, as the `demo-server` binary does for its status line.
///
/// ```
/// use demo_server::app::{AppConfig, app};
/// use demo_server::model::{LatencyModel, Model};
///
/// let model = Model::new(LatencyModel::default());
/// let config = AppConfig::new(model.clone());
/// let stats = config.stats().clone();
/// let router = app(config);
/// # let _ = (router, stats);
/// ```
#[derive(Clone, Debug)]
pub struct AppConfig {
    model: Model,
    stack: Stack,
    deadline: DeadlineLayer,
    downstream: Option<Downstream>,
    metrics: Option<PrometheusHandle>,
    stats: ServerStats,
    admin: bool,
}

/// What stands in front of the model on `/api`.
///
/// The deadline layer of `Deadline`, `Full` and `Adaptive` is [`AppConfig::deadline`]'s.
#[derive(Clone, Debug)]
pub enum Stack {
    /// The bare model: the article's server.
    None,
    /// [`DeadlineLayer`] alone in front of the model: no rate, no limit; a request whose
    /// caller's deadline has passed is answered `504` at once, and one still running at its
    /// deadline is cancelled.
    ///
    /// ```text
    /// network ──► DeadlineLayer ──► model
    /// ```
    Deadline,
    /// [`OverloadSignalLayer`] outside [`DeadlineLayer`] outside [`RateLimitLayer`], in front
    /// of the model:
    ///
    /// ```text
    /// network ──► OverloadSignalLayer ──► DeadlineLayer ──► RateLimitLayer ──► model
    /// ```
    Full {
        /// The overload layer; keep a clone to read its histogram.
        overload: OverloadSignalLayer,
        /// The rate limiter, decided in this process or kept in Redis (either converts with
        /// `.into()`).
        rate_limit: FullRateLimit,
    },
    /// [`OverloadSignalLayer`] outside [`DeadlineLayer`] outside [`AdaptiveLimitLayer`], in
    /// front of the model: no rate configured, the limit finds the model's capacity from its
    /// latency.
    ///
    /// ```text
    /// network ──► OverloadSignalLayer ──► DeadlineLayer ──► AdaptiveLimitLayer ──► model
    /// ```
    Adaptive {
        /// The overload layer; keep a clone to read its histogram.
        overload: OverloadSignalLayer,
        /// The adaptive limit; keep a clone to read its [status](AdaptiveLimitLayer::status).
        adaptive: AdaptiveLimitLayer,
    },
    /// Another project's overload protection in front of the model, with no layer of this
    /// workspace (no overload signal, no deadline layer), for benchmarks; see
    /// [`peers`](crate::peers).
    ///
    /// ```text
    /// network ──► peer ──► model
    /// ```
    Peer(Peer),
}

/// The rate limiter of [`Stack::Full`]: a [`RateLimitLayer`] decided in this process (what
/// the README composes), one kept in Redis (`demo-server --redis-url`), or the limits of a
/// file, per route and tenant, reloaded while serving (`demo-server --limits`).
///
/// Both convert with `.into()`:
///
/// ```
/// use demo_server::app::FullRateLimit;
/// use ratelimit_layer::config::RateLimitConfig;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let local: FullRateLimit = RateLimitConfig::default().layer()?.into();
/// assert!(matches!(local, FullRateLimit::Local(_)));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub enum FullRateLimit {
    /// A limit decided in this process, in `call`: `RateLimitLayer<Local>`, the one a
    /// server without Redis composes.
    Local(RateLimitLayer),
    /// A limit kept in Redis, decided there after a round trip (its local share while Redis
    /// is away).
    Redis(RateLimitLayer<Remote>),
    /// A limit per entry of a limits file, decided in this process, changed when the file
    /// changes.
    File(LimitsLayer),
}

impl From<LimitsLayer> for FullRateLimit {
    fn from(layer: LimitsLayer) -> Self {
        Self::File(layer)
    }
}

impl From<RateLimitLayer> for FullRateLimit {
    fn from(layer: RateLimitLayer) -> Self {
        Self::Local(layer)
    }
}

impl From<RateLimitLayer<Remote>> for FullRateLimit {
    fn from(layer: RateLimitLayer<Remote>) -> Self {
        Self::Redis(layer)
    }
}

impl Stack {
    /// The name `demo-server --stack` takes for this stack.
    pub const fn name(&self) -> &'static str {
        match self {
            Stack::None => "none",
            Stack::Deadline => "deadline",
            Stack::Full { .. } => "full",
            Stack::Adaptive { .. } => "adaptive",
            Stack::Peer(peer) => peer.name(),
        }
    }

    /// The overload layer of the stack, if it has one.
    pub fn overload(&self) -> Option<&OverloadSignalLayer> {
        match self {
            Stack::None | Stack::Deadline | Stack::Peer(_) => None,
            Stack::Full { overload, .. } | Stack::Adaptive { overload, .. } => Some(overload),
        }
    }
}

impl AppConfig {
    /// `/api` served by the bare `model` ([`Stack::None`]), no downstream, no `/metrics`
    /// route.
    pub fn new(model: Model) -> Self {
        Self {
            model,
            stack: Stack::None,
            deadline: DeadlineLayer::new(),
            downstream: None,
            metrics: None,
            stats: ServerStats::default(),
            admin: false,
        }
    }

    /// Serves `GET` and `PUT /admin/capacity`, which read and change the model's capacity
    /// at run time ([`Model::set_capacity`]). Default: off, since anyone who can reach the
    /// server could change it.
    pub fn admin(mut self, enabled: bool) -> Self {
        self.admin = enabled;
        self
    }

    /// Puts `stack` in front of the model. Default [`Stack::None`].
    pub fn stack(mut self, stack: Stack) -> Self {
        self.stack = stack;
        self
    }

    /// The deadline layer of [`Stack::Deadline`], [`Stack::Full`] and [`Stack::Adaptive`].
    /// Default: [`DeadlineLayer::new`] (a 250 ms skew allowance, work cancelled at its
    /// deadline, the system's time of day); a simulation under paused time gives it a wall
    /// clock that tokio moves.
    pub fn deadline(mut self, deadline: DeadlineLayer) -> Self {
        self.deadline = deadline;
        self
    }

    /// Makes `/api` call `downstream` after the model's work and before answering, so tiers
    /// chain. Default: no downstream.
    pub fn downstream(mut self, downstream: Downstream) -> Self {
        self.downstream = Some(downstream);
        self
    }

    /// Serves `GET /metrics` from `handle`. The caller installs the recorder the handle
    /// belongs to (the binary installs it globally); without this, there is no `/metrics`
    /// route.
    pub fn metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// The model behind `/api`.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The counters of `/api` outcomes, shared with the router [`app`] builds.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }
}

/// Counts of `/api` responses by outcome, since the server started. Clones share the
/// counts. The same outcomes are recorded in [`metric_names::REQUESTS`].
#[derive(Clone, Debug, Default)]
pub struct ServerStats {
    inner: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    served: AtomicU64,
    rejected: AtomicU64,
    stop_signals: AtomicU64,
    expired: AtomicU64,
    failed: AtomicU64,
}

/// A reading of [`ServerStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// 2xx responses.
    pub served: u64,
    /// Rejections without the stop signal: 429 (the rate limiter), or 503 with
    /// `Retry-After` (the adaptive limit), or a `503` from a [`Stack::Peer`] that shed the
    /// request.
    pub rejected: u64,
    /// Responses carrying the stop-retrying signal.
    pub stop_signals: u64,
    /// `504 Gateway Timeout` from the deadline layer: the caller's deadline had passed when
    /// the request arrived, or while it ran.
    pub expired: u64,
    /// Every other response.
    pub failed: u64,
}

impl StatsSnapshot {
    /// The counts since `earlier` (saturating, so a reset never underflows).
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            served: self.served.saturating_sub(earlier.served),
            rejected: self.rejected.saturating_sub(earlier.rejected),
            stop_signals: self.stop_signals.saturating_sub(earlier.stop_signals),
            expired: self.expired.saturating_sub(earlier.expired),
            failed: self.failed.saturating_sub(earlier.failed),
        }
    }
}

impl ServerStats {
    /// The counts now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let c = &self.inner;
        StatsSnapshot {
            served: c.served.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            stop_signals: c.stop_signals.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }

    fn record(&self, response: &Response) {
        let c = &self.inner;
        let (counter, outcome) = if is_stop_signal(response.headers()) {
            (&c.stop_signals, STOP_SIGNAL)
        } else if response.status().is_success() {
            (&c.served, SERVED)
        } else if response.status() == StatusCode::TOO_MANY_REQUESTS
            || (response.status() == StatusCode::SERVICE_UNAVAILABLE
                && (response.headers().contains_key(header::RETRY_AFTER)
                    || response.extensions().get::<Shed>().is_some()))
        {
            (&c.rejected, REJECTED)
        } else if response.status() == StatusCode::GATEWAY_TIMEOUT {
            (&c.expired, EXPIRED)
        } else {
            (&c.failed, FAILED)
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(metric_names::REQUESTS, "outcome" => outcome).increment(1);
    }
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "served: {}, rejected: {}, stop signals: {}, expired: {}, failed: {}",
            self.served, self.rejected, self.stop_signals, self.expired, self.failed
        )
    }
}

#[derive(Clone)]
struct AppState {
    model: Model,
    downstream: Option<Downstream>,
    metrics: Option<PrometheusHandle>,
    /// [`metric_names::HANDLER_CRITICALITY`] per level, indexed by [`Criticality::rank`].
    levels: Arc<[Counter; 4]>,
}

/// The demo server's routes:
///
/// - `GET /api`: the [`Stack`], then one request through the model, then the downstream call
///   if any; `200 OK` with `ok\n`. A paused in-process model whose backlog is full answers
///   `503 Service Unavailable`. A downstream call that ends with the stop signal answers
///   with the stop signal (`503` with `X-Overloaded`), with or without the overload layer;
///   any other downstream failure answers `502 Bad Gateway`. The downstream call carries
///   what is left of the request's deadline (the deadline layer makes it the task's current
///   one, which the retry layer reads). With a deadline layer in the stack, a request whose
///   caller's deadline has passed answers `504 Gateway Timeout`.
/// - `GET /healthz`: `200 OK` with `ok\n` at once, never limited.
/// - `GET /metrics`: Prometheus text from the handle given to [`AppConfig::metrics`] (route
///   absent without one); see [`metric_names`].
/// - `GET /admin/capacity` and `PUT /admin/capacity` (only with [`AppConfig::admin`]): the
///   model's capacity (the article's knee, the M/M/c workers) as a decimal number; `PUT`
///   a positive decimal body to change it, answered with `before -> after`. `400` for a
///   body that is not a positive number, `409` for the `instant` model.
///
/// Every `/api` response is counted in [`AppConfig::stats`] and [`metric_names::REQUESTS`].
pub fn app(config: AppConfig) -> Router {
    let AppConfig {
        model,
        stack,
        deadline,
        downstream,
        metrics,
        stats,
        admin,
    } = config;
    let has_metrics = metrics.is_some();
    let record = MapResponseLayer::new(move |response: Response| {
        stats.record(&response);
        response
    });
    // NOTE: one `.layer` call for the route, whatever the stack: axum boxes the route's
    // service once per call, and clones it and boxes its future again on every request,
    // so the stacked route pays that once, as the bare one does. The counts are
    // outermost: they see what the client sees. The stack is one
    // `OverloadProtectionLayer`, as the README shows: the overload layer outside the limit
    // whatever the nesting, the deadline layer between them (an expired request spends no
    // token and the overload layer's histogram still records it).
    let api: MethodRouter<AppState> = match stack {
        Stack::None => get(api).layer::<_, Infallible>(record),
        Stack::Deadline => get(api).layer::<_, Infallible>((record, deadline)),
        // NOTE: a limit decided in this process stays `Local`: a `Remote` one without a
        // remote decider decides the same, through a future with one state more.
        Stack::Full {
            overload,
            rate_limit: FullRateLimit::Local(rate_limit),
        } => get(api).layer::<_, Infallible>((
            record,
            OverloadProtectionLayer::builder(rate_limit)
                .signal(overload)
                .deadline(deadline)
                .build()
                .expect("the demo sets no proxies twice"),
        )),
        Stack::Full {
            overload,
            rate_limit: FullRateLimit::Redis(rate_limit),
        } => get(api).layer::<_, Infallible>((
            record,
            OverloadProtectionLayer::builder(rate_limit)
                .signal(overload)
                .deadline(deadline)
                .build()
                .expect("the demo sets no proxies twice"),
        )),
        Stack::Full {
            overload,
            rate_limit: FullRateLimit::File(limits),
        } => get(api).layer::<_, Infallible>((
            record,
            OverloadProtectionLayer::builder(limits)
                .signal(overload)
                .deadline(deadline)
                .build()
                .expect("the demo sets no proxies twice"),
        )),
        Stack::Adaptive { overload, adaptive } => get(api).layer::<_, Infallible>((
            record,
            OverloadProtectionLayer::builder(adaptive)
                .signal(overload)
                .deadline(deadline)
                .build()
                .expect("the demo sets no proxies twice"),
        )),
        // NOTE: the peer inside the counts, as the other stacks; `layer_fn` hands it the
        // route as axum built it.
        Stack::Peer(peer) => get(api).layer::<_, Infallible>((
            record,
            axum::error_handling::HandleErrorLayer::new(crate::peers::handle_shed),
            tower::layer::layer_fn(move |route| peer.wrap(route)),
        )),
    };
    let router = Router::new()
        .route("/api", api)
        .route("/healthz", get(healthz));
    let router = if has_metrics {
        router.route("/metrics", get(render_metrics))
    } else {
        router
    };
    let router = if admin {
        router.route("/admin/capacity", get(capacity).put(set_capacity))
    } else {
        router
    };
    // NOTE: registered once, when the router is built (after the binary installed its
    // recorder), not looked up on every request.
    let levels = Arc::new(Criticality::ALL.map(|level| {
        metrics::counter!(metric_names::HANDLER_CRITICALITY, "criticality" => level.as_str())
    }));
    router.with_state(AppState {
        model,
        downstream,
        metrics,
        levels,
    })
}

async fn api(State(state): State<AppState>) -> Response {
    // NOTE: whether the work outlives a client that goes away is decided by the connection
    // handling (`server::Abandoned`), not here: a request dropped before this handler first
    // runs never reaches any code in it.
    let level = criticality::current().unwrap_or_default();
    state.levels[level.rank()].increment(1);
    let served = state.model.serve().await;
    let took = match served {
        Ok(took) => took,
        Err(refused) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{refused}\n")).into_response();
        }
    };
    metrics::histogram!(metric_names::MODEL_SECONDS).record(took.as_secs_f64());
    let Some(downstream) = state.downstream else {
        return "ok\n".into_response();
    };
    match downstream.call().await {
        Ok(status) if status.is_success() => "ok\n".into_response(),
        Ok(status) => (
            StatusCode::BAD_GATEWAY,
            format!("downstream answered {status}\n"),
        )
            .into_response(),
        // NOTE: behind the overload layer the retry layer's marker would turn any failure
        // into the stop signal anyway; answering it here keeps `--stack none` tiers honest
        // too (the typed-error path of `overload_signal`'s propagation).
        Err(e) if is_overloaded(&*e) => stop_signal_response::<axum::body::Body>(Protocol::Http),
        Err(e) => {
            tracing::debug!(error = %e, "downstream call failed");
            (
                StatusCode::BAD_GATEWAY,
                format!("downstream call failed: {e}\n"),
            )
                .into_response()
        }
    }
}

// NOTE: axum handlers must be async even when they do not await.
#[allow(clippy::unused_async)]
async fn healthz() -> &'static str {
    "ok\n"
}

#[allow(clippy::unused_async)]
async fn capacity(State(state): State<AppState>) -> Response {
    match state.model.capacity() {
        Some(capacity) => format!("{capacity}\n").into_response(),
        None => (StatusCode::CONFLICT, "the instant model has no capacity\n").into_response(),
    }
}

#[allow(clippy::unused_async)]
async fn set_capacity(State(state): State<AppState>, body: String) -> Response {
    let Ok(capacity) = body.trim().parse::<std::num::NonZeroUsize>() else {
        return (
            StatusCode::BAD_REQUEST,
            format!("the capacity must be a positive whole number, got {body:?}\n"),
        )
            .into_response();
    };
    match state.model.set_capacity(capacity) {
        Ok(before) => {
            tracing::info!(%before, after = %capacity, "model capacity changed");
            format!("{before} -> {capacity}\n").into_response()
        }
        Err(e) => (StatusCode::CONFLICT, format!("{e}\n")).into_response(),
    }
}

#[allow(clippy::unused_async)]
async fn render_metrics(State(state): State<AppState>) -> Response {
    let Some(handle) = state.metrics else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let model = &state.model;
    // Gauges are read from the model at scrape time, so they are fresh whatever the
    // scrape interval.
    metrics::gauge!(metric_names::CONCURRENCY).set(model.concurrency() as f64);
    metrics::gauge!(metric_names::CONCURRENCY_PEAK).set(model.take_peak_concurrency() as f64);
    metrics::gauge!(metric_names::LAST_DELAY).set(model.last_delay().as_secs_f64());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}
