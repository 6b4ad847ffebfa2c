//! [`AdaptiveLimitLayer`] and its builder.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::LayerName;
use tower_layer::Layer;

use super::controller::AdaptiveSettings;
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
    /// The limit before the first measurement: 20 requests, the initial limit of Netflix's
    /// concurrency-limits (Vegas and Gradient2).
    pub const DEFAULT_INITIAL_LIMIT: usize = 20;

    /// The floor of the limit, and the limit while the baseline is measured: 3 requests,
    /// the `min_concurrency` of Envoy's adaptive concurrency filter.
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
    /// at its floor.
    pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(60);

    /// The random extra delay before each measurement, as a share of the interval: 0.15,
    /// Envoy's default `jitter` of 15 %, so servers started together do not all measure
    /// (and reject) at once.
    pub const DEFAULT_PROBE_JITTER: f64 = 0.15;

    /// The requests a baseline measurement takes: 50, Envoy's default `request_count`.
    pub const DEFAULT_PROBE_SAMPLES: u64 = 50;

    /// The share of overload failures in a window above which the limit backs off: 0.1
    /// (10 %). This crate's choice: a rare failure is noise, one in ten is a service
    /// shedding load.
    pub const DEFAULT_FAILURE_THRESHOLD: f64 = 0.1;

    /// The factor applied to the limit when it backs off on failures: 0.9, the backoff
    /// ratio of Netflix's concurrency-limits AIMD limit.
    pub const DEFAULT_BACKOFF: f64 = 0.9;

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

    /// A builder starting from the defaults.
    pub fn builder() -> AdaptiveLimitBuilder {
        AdaptiveLimitBuilder {
            initial_limit: Self::DEFAULT_INITIAL_LIMIT,
            min_limit: Self::DEFAULT_MIN_LIMIT,
            max_limit: Self::DEFAULT_MAX_LIMIT,
            window: Self::DEFAULT_WINDOW,
            min_samples: Self::DEFAULT_MIN_SAMPLES,
            percentile: Self::DEFAULT_PERCENTILE,
            tolerance: Self::DEFAULT_TOLERANCE,
            probe_interval: Self::DEFAULT_PROBE_INTERVAL,
            probe_jitter: Self::DEFAULT_PROBE_JITTER,
            probe_samples: Self::DEFAULT_PROBE_SAMPLES,
            failure_threshold: Self::DEFAULT_FAILURE_THRESHOLD,
            backoff: Self::DEFAULT_BACKOFF,
            seed: None,
            retry_after: Self::DEFAULT_RETRY_AFTER,
            name: Self::DEFAULT_NAME.to_owned(),
            clock: TokioClock::new(),
        }
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
    /// // Nothing measured yet: the baseline is being measured at the minimum limit.
    /// assert!(status.probing);
    /// assert_eq!(status.limit, AdaptiveLimitLayer::DEFAULT_MIN_LIMIT);
    /// ```
    pub fn status(&self) -> Status {
        self.state.status()
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

/// Builds an [`AdaptiveLimitLayer`]; from [`AdaptiveLimitLayer::builder`]. Every setter
/// starts from the default stated on it.
#[must_use]
pub struct AdaptiveLimitBuilder<C = TokioClock> {
    initial_limit: usize,
    min_limit: usize,
    max_limit: usize,
    window: Duration,
    min_samples: u64,
    percentile: f64,
    tolerance: f64,
    probe_interval: Duration,
    probe_jitter: f64,
    probe_samples: u64,
    failure_threshold: f64,
    backoff: f64,
    seed: Option<u64>,
    retry_after: Duration,
    name: String,
    clock: C,
}

impl<C: Clock> AdaptiveLimitBuilder<C> {
    /// The limit used after the first baseline measurement, before any window moved it.
    /// Default: 20 ([`AdaptiveLimitLayer::DEFAULT_INITIAL_LIMIT`], Netflix's).
    pub const fn initial_limit(mut self, limit: usize) -> Self {
        self.initial_limit = limit;
        self
    }

    /// The floor of the limit, and the limit while the baseline is measured. Default: 3
    /// ([`AdaptiveLimitLayer::DEFAULT_MIN_LIMIT`], Envoy's `min_concurrency`).
    pub const fn min_limit(mut self, limit: usize) -> Self {
        self.min_limit = limit;
        self
    }

    /// The ceiling of the limit. Default: 1000 ([`AdaptiveLimitLayer::DEFAULT_MAX_LIMIT`],
    /// Envoy's `max_concurrency_limit`).
    pub const fn max_limit(mut self, limit: usize) -> Self {
        self.max_limit = limit;
        self
    }

    /// The shortest sampling window: the limit changes at most once per window. Default:
    /// 100 ms ([`AdaptiveLimitLayer::DEFAULT_WINDOW`]).
    pub const fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The fewest outcomes (successes and overload failures) a window needs before it
    /// closes. Default: 50 ([`AdaptiveLimitLayer::DEFAULT_MIN_SAMPLES`]).
    pub const fn min_samples(mut self, samples: u64) -> Self {
        self.min_samples = samples;
        self
    }

    /// The percentile of a window's latencies compared with the baseline, within `0..=1`
    /// and above 0 (the baseline is measured with the same one). Default: 0.5
    /// ([`AdaptiveLimitLayer::DEFAULT_PERCENTILE`], Envoy's).
    pub const fn percentile(mut self, percentile: f64) -> Self {
        self.percentile = percentile;
        self
    }

    /// How far above the baseline the latency may settle, as a ratio of at least 1: the
    /// limit grows while the latency is below `baseline * tolerance` and shrinks above
    /// it. Default: 1.25 ([`AdaptiveLimitLayer::DEFAULT_TOLERANCE`], Envoy's `buffer`).
    pub const fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// How often the baseline is measured again while the limit rejects requests (a
    /// measurement due while nothing is rejected is put off by one interval). Default: 60 s
    /// ([`AdaptiveLimitLayer::DEFAULT_PROBE_INTERVAL`]).
    pub const fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// The random extra delay before each measurement, as a share of the interval, within
    /// `0..=1`. Default: 0.15 ([`AdaptiveLimitLayer::DEFAULT_PROBE_JITTER`], Envoy's).
    pub const fn probe_jitter(mut self, jitter: f64) -> Self {
        self.probe_jitter = jitter;
        self
    }

    /// The requests a baseline measurement takes. Default: 50
    /// ([`AdaptiveLimitLayer::DEFAULT_PROBE_SAMPLES`], Envoy's `request_count`).
    pub const fn probe_samples(mut self, samples: u64) -> Self {
        self.probe_samples = samples;
        self
    }

    /// The share of overload failures (see the [module docs](super#failures)) in a window,
    /// within `0..=1` and above 0, at or above which the limit backs off instead of
    /// following the latency. Default: 0.1
    /// ([`AdaptiveLimitLayer::DEFAULT_FAILURE_THRESHOLD`]).
    pub const fn failure_threshold(mut self, share: f64) -> Self {
        self.failure_threshold = share;
        self
    }

    /// The factor applied to the limit when it backs off, within `0..1` and above 0.
    /// Default: 0.9 ([`AdaptiveLimitLayer::DEFAULT_BACKOFF`], Netflix's AIMD).
    pub const fn backoff(mut self, factor: f64) -> Self {
        self.backoff = factor;
        self
    }

    /// The seed of the probe jitter. Default: a random seed per layer.
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The wait a rejection asks for: `Retry-After` in whole seconds, rounded up, at least
    /// 1; `grpc-retry-pushback-ms` in milliseconds. Default: 1 s
    /// ([`AdaptiveLimitLayer::DEFAULT_RETRY_AFTER`]).
    pub const fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// What the layer calls itself: the `name` label of its metrics and the `name` field
    /// of its logs. Non-empty printable ASCII, at most 128 bytes. Default: `default`
    /// ([`AdaptiveLimitLayer::DEFAULT_NAME`]); name your layers when a process has more
    /// than one adaptive limit, so their metrics and logs are told apart.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Where latencies are measured. Default: [`TokioClock`], which follows tokio's paused
    /// time in tests; `FakeClock` (feature `test-util`) moves only when told to.
    ///
    /// [`TokioClock`]: crate::clock::TokioClock
    pub fn clock<C2: Clock>(self, clock: C2) -> AdaptiveLimitBuilder<C2> {
        AdaptiveLimitBuilder {
            initial_limit: self.initial_limit,
            min_limit: self.min_limit,
            max_limit: self.max_limit,
            window: self.window,
            min_samples: self.min_samples,
            percentile: self.percentile,
            tolerance: self.tolerance,
            probe_interval: self.probe_interval,
            probe_jitter: self.probe_jitter,
            probe_samples: self.probe_samples,
            failure_threshold: self.failure_threshold,
            backoff: self.backoff,
            seed: self.seed,
            retry_after: self.retry_after,
            name: self.name,
            clock,
        }
    }

    /// Builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting, when:
    ///
    /// - `min_limit`, `min_samples` or `probe_samples` is zero, or `window` or
    ///   `probe_interval` is zero or longer than 584 years (kind `OutOfRange`);
    /// - `max_limit` is below `min_limit`, or `initial_limit` is outside
    ///   `min_limit..=max_limit` (kind `Conflict`);
    /// - a ratio is NaN or infinite (kind `NotFinite`), or out of its range: `percentile`
    ///   and `failure_threshold` within `0..=1` and above 0, `probe_jitter` within `0..=1`,
    ///   `backoff` within `0..1` and above 0, `tolerance` at least 1 and at most 100
    ///   (kind `OutOfRange`);
    /// - `name` is empty, longer than 128 bytes, or not printable ASCII (kind `Invalid`).
    pub fn build(self) -> Result<AdaptiveLimitLayer<C>, ConfigError> {
        if self.min_limit == 0 {
            return Err(ConfigError::out_of_range(
                "min_limit",
                self.min_limit,
                "at least 1",
            ));
        }
        if self.max_limit < self.min_limit {
            return Err(ConfigError::conflict(
                "max_limit",
                format_args!(
                    "max_limit ({}) must not be below min_limit ({})",
                    self.max_limit, self.min_limit
                ),
            ));
        }
        if !(self.min_limit..=self.max_limit).contains(&self.initial_limit) {
            return Err(ConfigError::conflict(
                "initial_limit",
                format_args!(
                    "initial_limit ({}) must be within min_limit..=max_limit ({}..={})",
                    self.initial_limit, self.min_limit, self.max_limit
                ),
            ));
        }
        positive_duration("window", self.window)?;
        positive_duration("probe_interval", self.probe_interval)?;
        if self.min_samples == 0 {
            return Err(ConfigError::out_of_range("min_samples", 0, "at least 1"));
        }
        if self.probe_samples == 0 {
            return Err(ConfigError::out_of_range("probe_samples", 0, "at least 1"));
        }
        ratio(
            "percentile",
            self.percentile,
            |p| p > 0.0 && p <= 1.0,
            "within 0..=1 and above 0",
        )?;
        ratio(
            "tolerance",
            self.tolerance,
            |t| (1.0..=100.0).contains(&t),
            "within 1..=100",
        )?;
        ratio(
            "probe_jitter",
            self.probe_jitter,
            |j| (0.0..=1.0).contains(&j),
            "within 0..=1",
        )?;
        ratio(
            "failure_threshold",
            self.failure_threshold,
            |s| s > 0.0 && s <= 1.0,
            "within 0..=1 and above 0",
        )?;
        ratio(
            "backoff",
            self.backoff,
            |b| b > 0.0 && b < 1.0,
            "within 0..1 and above 0",
        )?;
        let name = LayerName::new(self.name)?;
        let settings = AdaptiveSettings {
            initial_limit: self.initial_limit,
            min_limit: self.min_limit,
            max_limit: self.max_limit,
            window: self.window,
            min_samples: self.min_samples,
            quantile: self.percentile,
            tolerance: self.tolerance,
            probe_interval: self.probe_interval,
            probe_jitter: self.probe_jitter,
            probe_samples: self.probe_samples,
            failure_threshold: self.failure_threshold,
            backoff: self.backoff,
            seed: self
                .seed
                .unwrap_or_else(|| RandomState::new().hash_one(0x5EED_u64)),
        };
        Ok(AdaptiveLimitLayer {
            state: Arc::new(AdaptiveLimitState::new(
                settings,
                self.clock,
                self.retry_after,
                name,
                AdaptiveLimitLayer::QUIET_PERIOD,
            )),
        })
    }
}

impl<C: fmt::Debug> fmt::Debug for AdaptiveLimitBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitBuilder")
            .field("initial_limit", &self.initial_limit)
            .field("min_limit", &self.min_limit)
            .field("max_limit", &self.max_limit)
            .field("window", &self.window)
            .field("min_samples", &self.min_samples)
            .field("percentile", &self.percentile)
            .field("tolerance", &self.tolerance)
            .field("probe_interval", &self.probe_interval)
            .field("probe_jitter", &self.probe_jitter)
            .field("probe_samples", &self.probe_samples)
            .field("failure_threshold", &self.failure_threshold)
            .field("backoff", &self.backoff)
            .field("seed", &self.seed)
            .field("retry_after", &self.retry_after)
            .field("name", &self.name)
            .field("clock", &self.clock)
            .finish()
    }
}

fn positive_duration(field: &'static str, duration: Duration) -> Result<(), ConfigError> {
    if duration.is_zero() || u64::try_from(duration.as_nanos()).is_err() {
        return Err(ConfigError::out_of_range(
            field,
            duration,
            "greater than zero and at most 584 years",
        ));
    }
    Ok(())
}

fn ratio(
    field: &'static str,
    value: f64,
    valid: impl Fn(f64) -> bool,
    rule: &str,
) -> Result<(), ConfigError> {
    if !value.is_finite() {
        return Err(ConfigError::not_finite(field, value));
    }
    if !valid(value) {
        return Err(ConfigError::out_of_range(field, value, rule));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build() {
        let layer = AdaptiveLimitLayer::new();
        let status = layer.status();
        assert_eq!(status.limit, AdaptiveLimitLayer::DEFAULT_MIN_LIMIT);
        assert!(status.probing);
        assert_eq!(status.baseline, None);
    }

    #[test]
    fn invalid_settings_name_the_field() {
        let b = AdaptiveLimitLayer::builder;
        let cases: Vec<(AdaptiveLimitBuilder, &str)> = vec![
            (b().min_limit(0), "min_limit must be at least 1, got 0"),
            (
                b().max_limit(2),
                "max_limit (2) must not be below min_limit (3)",
            ),
            (
                b().initial_limit(2000),
                "initial_limit (2000) must be within min_limit..=max_limit (3..=1000)",
            ),
            (
                b().window(Duration::ZERO),
                "window must be greater than zero and at most 584 years, got 0ns",
            ),
            (b().min_samples(0), "min_samples must be at least 1, got 0"),
            (
                b().probe_samples(0),
                "probe_samples must be at least 1, got 0",
            ),
            (
                b().percentile(0.0),
                "percentile must be within 0..=1 and above 0, got 0.0",
            ),
            (
                b().tolerance(0.9),
                "tolerance must be within 1..=100, got 0.9",
            ),
            (
                b().tolerance(f64::NAN),
                "tolerance must be a finite number, got NaN",
            ),
            (
                b().probe_jitter(1.5),
                "probe_jitter must be within 0..=1, got 1.5",
            ),
            (
                b().failure_threshold(0.0),
                "failure_threshold must be within 0..=1 and above 0, got 0.0",
            ),
            (
                b().backoff(1.0),
                "backoff must be within 0..1 and above 0, got 1.0",
            ),
            (
                b().probe_interval(Duration::MAX),
                "probe_interval must be greater than zero and at most 584 years, got 18446744073709551615.999999999s",
            ),
        ];
        for (builder, message) in cases {
            let debug = format!("{builder:?}");
            let err = builder.build().unwrap_err();
            assert_eq!(err.to_string(), message, "{debug}");
            assert!(message.starts_with(err.field()), "{message}");
        }
    }
}
