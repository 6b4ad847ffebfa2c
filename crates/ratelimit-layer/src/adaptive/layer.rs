//! [`AdaptiveLimitLayer`]: the layer, its defaults, and its status; its builder is in
//! `builder.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::LayerName;
use tower_layer::Layer;

use super::held;
use super::service::AdaptiveLimit;
use super::state::{AdaptiveLimitState, Status};

/// Applies [`AdaptiveLimit`] to a service; see the [module docs](super).
///
/// Cheap to clone: clones, and every service they make, share one limit, so an axum
/// `Router::layer` that wraps each route still limits the whole server.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::AdaptiveLimitLayer;
///
/// // The defaults: no capacity figure at all.
/// let layer = AdaptiveLimitLayer::new();
///
/// // Customised: latency may reach 1.5 times the baseline, at most 200 in flight.
/// let layer = AdaptiveLimitLayer::builder()
///     .tolerance(1.5)
///     .max_limit(200)
///     .retry_after(Duration::from_secs(2))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
pub struct AdaptiveLimitLayer<C = TokioClock> {
    state: Arc<AdaptiveLimitState<C>>,
}

impl AdaptiveLimitLayer {
    /// The limit a new layer starts at, in force while its first baseline is measured (the
    /// first window's latency at this limit): 20 requests, the initial limit of Netflix's
    /// concurrency-limits (Vegas and Gradient2). From the first window on, it grows while
    /// the latency stays under the target, by at least `sqrt(limit)` per window (20, 29, 42,
    /// 59, ... a window of 100 ms and 50 requests each).
    pub const DEFAULT_INITIAL_LIMIT: usize = 20;

    /// The floor of the limit, and the least a probe measures at: 3 requests, the
    /// `min_concurrency` of Envoy's adaptive concurrency filter.
    pub const DEFAULT_MIN_LIMIT: usize = 3;

    /// The ceiling of the limit: 1000 requests, the `max_concurrency_limit` of Envoy's
    /// adaptive concurrency filter.
    pub const DEFAULT_MAX_LIMIT: usize = 1000;

    /// The shortest sampling window: 100 ms. This crate's choice: a window must hold a
    /// few whole requests of a typical API, and the limit must react within a second.
    pub const DEFAULT_WINDOW: Duration = Duration::from_millis(100);

    /// The fewest outcomes a window needs before it closes: 50, the `request_count` that
    /// Envoy's filter samples for its baseline. Fewer make the percentile too noisy with
    /// exponential service times (the paper's M/M/10 model).
    pub const DEFAULT_MIN_SAMPLES: u64 = 50;

    /// The percentile of a window's latencies that the controller reads: 0.5 (the
    /// median), the `sample_aggregate_percentile` of Envoy's filter.
    pub const DEFAULT_PERCENTILE: f64 = 0.5;

    /// How far above the baseline the latency may settle: 1.25 times, Envoy's default
    /// `buffer` of 25 %.
    pub const DEFAULT_TOLERANCE: f64 = 1.25;

    /// How often the baseline is measured again while the limit rejects requests: every 60
    /// seconds, plus jitter (a measurement that falls due while nothing is rejected is put
    /// off by one interval). This crate's choice: each measurement holds the limit at its
    /// minimum for about 50 requests, so at 60 s the cost stays near 2 % of goodput under
    /// overload; a service that became slower is noticed sooner anyway, when the limit sits
    /// at its floor or falls while the latency does not.
    pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(60);

    /// The random extra delay before each measurement, as a share of the interval: 0.15,
    /// Envoy's default `jitter` of 15 %, so servers started together do not all measure
    /// (and reject) at once.
    pub const DEFAULT_PROBE_JITTER: f64 = 0.15;

    /// The requests a baseline measurement takes: 50, Envoy's default `request_count`.
    pub const DEFAULT_PROBE_SAMPLES: u64 = 50;

    /// The limit while a probe measures the baseline, as a share of the limit in force (at
    /// least [`min_limit`](super::AdaptiveLimitBuilder::min_limit)): 0.25. This crate's choice, where
    /// Envoy drops to its minimum: a service that queues past some concurrency does not at a
    /// quarter of the limit it settles at (near its knee), so the baseline is
    /// the same, and a probe under overload turns away a quarter of what a probe at 3 did
    /// (at 100 ms per request and a limit of 100, 50 samples take 0.2 s instead of 1.7 s). A
    /// service whose latency grows from the first concurrent request reads a baseline up to
    /// about 9 % high (the share's latency, not the single request's).
    pub const DEFAULT_PROBE_SHARE: f64 = 0.25;

    /// The longest a probe may last: 5 seconds, after which the previous limit comes back
    /// whether or not the probe has its samples (with half of them, their percentile is the
    /// new baseline; with fewer, the old one stays). This crate's choice: long enough for 15
    /// requests of 1 s at 3 in flight; short enough that a probe whose requests an outer
    /// timeout drops never holds the limit down for good.
    pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

    /// The share of overload failures (errors of the inner service, such as a tower
    /// `Timeout` or `LoadShed` inside) in a window above which the limit backs off: 0.1
    /// (10 %). This crate's choice: a rare failure is noise, one in ten is a service
    /// shedding load.
    pub const DEFAULT_FAILURE_THRESHOLD: f64 = 0.1;

    /// The factor applied to the limit when it backs off on failures: 0.9, the backoff
    /// ratio of Netflix's concurrency-limits AIMD limit.
    pub const DEFAULT_BACKOFF: f64 = 0.9;

    /// The default [`release_after`](super::AdaptiveLimitBuilder::release_after), in target
    /// latencies (the baseline times the tolerance): a request in flight ten times longer
    /// than the latency the limit aims at is released, within
    /// [`DEFAULT_RELEASE_AFTER_MIN`](Self::DEFAULT_RELEASE_AFTER_MIN) and
    /// [`DEFAULT_RELEASE_AFTER_MAX`](Self::DEFAULT_RELEASE_AFTER_MAX).
    ///
    /// This crate's choice. The bound must stay above the slow tail of a healthy service, or
    /// the limit would stop counting requests that are merely slow: with exponential service
    /// times, one request in 5000 runs ten times the target latency (the median times 12.5);
    /// with a heavier tail (log-normal, sigma 1) one in 800 does, and the 1 s floor puts a
    /// service of 50 ms further out, at one in 5000. And it must be short enough that
    /// requests that never end (20 uploads whose bodies trickle in, a hung dependency) give
    /// their slots back within a few seconds, not never.
    pub const DEFAULT_RELEASE_AFTER_TARGETS: f64 = held::RELEASE_AFTER_TARGETS;

    /// The least default [`release_after`](super::AdaptiveLimitBuilder::release_after): 1
    /// second, whatever the baseline. A service of a few milliseconds has a tail of
    /// garbage-collection pauses and cold caches much longer than ten of its latencies.
    pub const DEFAULT_RELEASE_AFTER_MIN: Duration = held::RELEASE_AFTER_MIN;

    /// The most default [`release_after`](super::AdaptiveLimitBuilder::release_after): 30
    /// seconds, whatever the baseline: a request longer than that holds its slot for
    /// longer than most clients and proxies wait for it.
    pub const DEFAULT_RELEASE_AFTER_MAX: Duration = held::RELEASE_AFTER_MAX;

    /// The default [`release_after`](super::AdaptiveLimitBuilder::release_after) while no
    /// baseline is known (a fresh layer measuring its first one): 5 seconds, the
    /// [`DEFAULT_PROBE_TIMEOUT`](Self::DEFAULT_PROBE_TIMEOUT), long enough for any request
    /// of the first window of a healthy service.
    pub const DEFAULT_RELEASE_AFTER_UNMEASURED: Duration = held::RELEASE_AFTER_UNMEASURED;

    /// The `Retry-After` of a rejection: 1 second, the shortest the header can say (and
    /// `grpc-retry-pushback-ms: 1000` for gRPC). A slot frees within one request's latency,
    /// so a longer wait would only leave capacity idle.
    pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

    /// The name of a layer nobody named: `default` ([`LayerName::DEFAULT`], the workspace's
    /// name for an unnamed layer). Name your layers when a process has more than one
    /// adaptive limit.
    pub const DEFAULT_NAME: &'static str = LayerName::DEFAULT;

    /// How long the limit must reject nothing before the episode its first rejection began
    /// is over: 10 seconds, as
    /// [`RateLimitLayer::QUIET_PERIOD`](crate::RateLimitLayer::QUIET_PERIOD) (the length of
    /// the workspace's sliding windows).
    ///
    /// The first rejection of an episode is logged at `WARN` ("adaptive limit engaged"),
    /// its end at `INFO` ("adaptive limit released"), within a second of the quiet period
    /// passing; each rejection is logged at `TRACE`. The same period without a completed
    /// request sets the latency gauge to zero.
    pub const QUIET_PERIOD: Duration = Duration::from_secs(10);

    /// A layer with every default, reading time from [`TokioClock`].
    ///
    /// [`TokioClock`]: crate::clock::TokioClock
    pub fn new() -> Self {
        // NOTE: the defaults satisfy every rule `build` checks; `defaults_build` pins it.
        Self::builder()
            .build()
            .expect("the default settings are valid")
    }
}

impl Default for AdaptiveLimitLayer {
    /// The same as [`AdaptiveLimitLayer::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> AdaptiveLimitLayer<C> {
    /// The limit, the requests in flight, the baseline and the last window's latency, now.
    ///
    /// ```
    /// use ratelimit_layer::AdaptiveLimitLayer;
    ///
    /// let layer = AdaptiveLimitLayer::new();
    /// let status = layer.status();
    /// // Nothing measured yet: the first baseline is measured at the initial limit, with
    /// // no probe.
    /// assert!(!status.probing);
    /// assert_eq!(status.baseline, None);
    /// assert_eq!(status.limit, AdaptiveLimitLayer::DEFAULT_INITIAL_LIMIT);
    /// ```
    pub fn status(&self) -> Status {
        self.state.status()
    }

    /// Changes the bounds the limit moves within, while the layer serves: the limit in
    /// force is clamped into `min..=max` at once, the windows that follow move it within
    /// them, and `max` is the new ceiling of the requests in flight and released together.
    /// Every clone of the layer, and every service it made, sees the change.
    ///
    /// ```
    /// use ratelimit_layer::AdaptiveLimitLayer;
    ///
    /// let layer = AdaptiveLimitLayer::builder().initial_limit(50).build()?;
    /// layer.set_bounds(5, 30)?;
    /// assert_eq!(layer.status().limit, 30);
    /// assert!(layer.set_bounds(10, 9).is_err());
    /// # Ok::<(), ratelimit_layer::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `min` is zero (kind `OutOfRange`), or `max` is below `min` (kind `Conflict`), as
    /// [`AdaptiveLimitBuilder::build`](super::AdaptiveLimitBuilder::build) refuses them;
    /// nothing changes.
    pub fn set_bounds(&self, min: usize, max: usize) -> Result<(), ConfigError> {
        if min == 0 {
            return Err(ConfigError::out_of_range("min_limit", min, "at least 1"));
        }
        if max < min {
            return Err(ConfigError::conflict(
                "max_limit",
                format_args!("max_limit ({max}) must not be below min_limit ({min})"),
            ));
        }
        self.state.set_bounds(min, max);
        Ok(())
    }
}

impl<C> AdaptiveLimitLayer<C> {
    pub(super) fn from_state(state: AdaptiveLimitState<C>) -> Self {
        Self {
            state: Arc::new(state),
        }
    }
}

impl<C> Clone for AdaptiveLimitLayer<C> {
    fn clone(&self) -> Self {
        Self {
            state: Arc::clone(&self.state),
        }
    }
}

impl<C> fmt::Debug for AdaptiveLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitLayer")
            .field("state", &self.state)
            .finish()
    }
}

impl<S, C> Layer<S> for AdaptiveLimitLayer<C> {
    type Service = AdaptiveLimit<S, C>;

    fn layer(&self, inner: S) -> AdaptiveLimit<S, C> {
        AdaptiveLimit::new(inner, Arc::clone(&self.state))
    }
}
