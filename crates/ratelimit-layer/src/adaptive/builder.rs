//! [`AdaptiveLimitBuilder`]: every setting of an [`AdaptiveLimitLayer`], checked by
//! `build`.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use http::request::Parts;
use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock, saturating_nanos};
use overload_core::telemetry::LayerName;
use overload_signal::criticality::Reserves;

use super::controller::AdaptiveSettings;
use super::layer::AdaptiveLimitLayer;
use super::state::{AdaptiveLimitState, ExemptFn, TICK};

impl AdaptiveLimitLayer {
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
            probe_share: Self::DEFAULT_PROBE_SHARE,
            probe_timeout: Self::DEFAULT_PROBE_TIMEOUT,
            failure_threshold: Self::DEFAULT_FAILURE_THRESHOLD,
            backoff: Self::DEFAULT_BACKOFF,
            release_after: None,
            baseline: None,
            seed: None,
            retry_after: Self::DEFAULT_RETRY_AFTER,
            name: Self::DEFAULT_NAME.to_owned(),
            exempt: None,
            reserves: Reserves::new(),
            clock: TokioClock::new(),
        }
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
    probe_share: f64,
    probe_timeout: Duration,
    failure_threshold: f64,
    backoff: f64,
    release_after: Option<Duration>,
    baseline: Option<Duration>,
    seed: Option<u64>,
    retry_after: Duration,
    name: String,
    exempt: Option<Box<ExemptFn>>,
    reserves: Reserves,
    clock: C,
}

impl<C: Clock> AdaptiveLimitBuilder<C> {
    /// The limit a new layer starts at, before any window moved it; its first baseline is
    /// measured at it, turning nobody away to do so. Default: 20
    /// ([`AdaptiveLimitLayer::DEFAULT_INITIAL_LIMIT`], Netflix's). Set it to the concurrency
    /// a fresh process must take at once (its share of the fleet's traffic during a rolling
    /// deploy), so that it rejects nothing while the limit grows.
    pub const fn initial_limit(mut self, limit: usize) -> Self {
        self.initial_limit = limit;
        self
    }

    /// The service's no-load latency, if you know it (a median from your dashboards): the
    /// limit then tracks from the first window instead of measuring a baseline first;
    /// probes under overload measure it again. Default: none, measured in the first window
    /// at the initial limit.
    pub const fn baseline(mut self, latency: Duration) -> Self {
        self.baseline = Some(latency);
        self
    }

    /// The floor of the limit, and the least a probe measures at. Default: 3
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

    /// The fewest outcomes (latency samples and overload failures) a window needs before it
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
    /// target is `baseline * tolerance`. With the `sqrt(limit)` headroom (see [the
    /// algorithm](super#the-algorithm-a-gradient-on-a-measured-baseline)) the limit grows up to
    /// a latency a little above the target (1.35 times it at a limit of 15, 1.11 times at 100),
    /// shrinks above that, settling at `(r / (r - 1))²` for a latency `r` times the target
    /// whatever the limit (about 7 at `r` = 1.6), and halves per window from twice the target.
    /// Default: 1.25
    /// ([`AdaptiveLimitLayer::DEFAULT_TOLERANCE`], Envoy's `buffer`).
    pub const fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// How often the baseline is measured again while the service is overloaded: the limit
    /// rejects requests and the latency is above the target (a measurement due otherwise is
    /// put off by one interval). Default: 60 s
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

    /// The limit while a probe measures the baseline, as a share of the limit in force,
    /// within `0..=1` and above 0 (at least [`min_limit`](Self::min_limit) requests). Default:
    /// 0.25 ([`AdaptiveLimitLayer::DEFAULT_PROBE_SHARE`]); a share so small that it always
    /// gives the minimum is Envoy's way.
    pub const fn probe_share(mut self, share: f64) -> Self {
        self.probe_share = share;
        self
    }

    /// The longest a probe may last before the previous limit comes back. Default: 5 s
    /// ([`AdaptiveLimitLayer::DEFAULT_PROBE_TIMEOUT`]).
    pub const fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// Requests for which `exempt` returns `true` bypass the limit: never rejected, never
    /// counted, never measured, holding no slot (a health check a load balancer sends, which
    /// must not be refused while the service sheds load, or the balancer ejects the
    /// instance). The predicate runs on every request, so keep it cheap. Default: none.
    ///
    /// ```
    /// use ratelimit_layer::AdaptiveLimitLayer;
    ///
    /// let layer = AdaptiveLimitLayer::builder()
    ///     .exempt(|parts: &http::request::Parts| parts.uri.path() == "/healthz")
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), ratelimit_layer::ConfigError>(())
    /// ```
    pub fn exempt<F>(mut self, exempt: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.exempt = Some(Box::new(exempt));
        self
    }

    /// The share of overload failures in a window, within `0..=1` and above 0, at or above
    /// which the limit backs off instead of following the latency. Default: 0.1
    /// ([`AdaptiveLimitLayer::DEFAULT_FAILURE_THRESHOLD`]).
    ///
    /// Overload failures are **errors of the inner service** (no response at all: a tower
    /// `Timeout` or `LoadShed` inside this layer, a panic caught inside), not responses: a
    /// `503` or `504` the handler makes is a latency sample like any response (see the
    /// [module docs](super#outcomes)). A service that only ever answers has no overload
    /// failures, and this setting does nothing for it.
    pub const fn failure_threshold(mut self, share: f64) -> Self {
        self.failure_threshold = share;
        self
    }

    /// The factor applied to the limit when it backs off on overload failures (errors of
    /// the inner service; see [`failure_threshold`](Self::failure_threshold)), within `0..1`
    /// and above 0. Default: 0.9 ([`AdaptiveLimitLayer::DEFAULT_BACKOFF`], Netflix's AIMD).
    pub const fn backoff(mut self, factor: f64) -> Self {
        self.backoff = factor;
        self
    }

    /// How long a request may stay in flight before it is released from the limit: its
    /// slot comes back, and it counts once as a latency sample of the time it has run (the
    /// evidence that the service is slow); when it ends at last, nothing more is counted. It
    /// is released between this and twice this after it was admitted (the layer counts
    /// admissions by periods of this length), and at least 100 ms (the layer's tick).
    /// Released requests still count toward [`max_limit`](Self::max_limit), so a service
    /// that never answers cannot pile up work without bound. See the [module
    /// docs](super#requests-that-take-long).
    ///
    /// Default: none set, the layer's own bound: ten times the target latency (the
    /// baseline times the [`tolerance`](Self::tolerance)), at least 1 s and at most 30 s;
    /// 5 s while no baseline is known
    /// ([`AdaptiveLimitLayer::DEFAULT_RELEASE_AFTER_TARGETS`] and the constants after it).
    /// Set it when you know your slowest legitimate request (a report that takes 20 s):
    /// above that, not below.
    pub const fn release_after(mut self, bound: Duration) -> Self {
        self.release_after = Some(bound);
        self
    }

    /// The share of the limit each [`Criticality`] may not take while a higher level is
    /// active, left for the levels above it: a request of level `c` is admitted only while,
    /// once it is, the requests in flight are at most the limit less `c`'s share of it. See
    /// [criticality](super#criticality-shedding-from-the-bottom). Default:
    /// [`Reserves::new`] (`sheddable` 50 %, `sheddable-plus` 25 %, `critical` 10 %,
    /// `critical-plus` 0); [`Reserves::none`] makes the limit blind to levels. Traffic of
    /// one level is limited exactly as with [`Reserves::none`] whatever the shares (a
    /// share is held back only while a higher level is active). The shares are checked
    /// when [`Reserves`] are built.
    ///
    /// ```
    /// use overload_signal::criticality::Reserves;
    /// use overload_signal::protocol::Criticality;
    /// use ratelimit_layer::AdaptiveLimitLayer;
    ///
    /// // Batch traffic (`sheddable`) takes at most a fifth of the limit while
    /// // interactive traffic is about.
    /// let reserves = Reserves::builder().share(Criticality::Sheddable, 0.8).build()?;
    /// let layer = AdaptiveLimitLayer::builder().reserves(reserves).build()?;
    /// # let _ = layer;
    /// # Ok::<(), ratelimit_layer::ConfigError>(())
    /// ```
    ///
    /// [`Criticality`]: overload_signal::protocol::Criticality
    pub const fn reserves(mut self, reserves: Reserves) -> Self {
        self.reserves = reserves;
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
            probe_share: self.probe_share,
            probe_timeout: self.probe_timeout,
            failure_threshold: self.failure_threshold,
            backoff: self.backoff,
            release_after: self.release_after,
            baseline: self.baseline,
            seed: self.seed,
            retry_after: self.retry_after,
            name: self.name,
            exempt: self.exempt,
            reserves: self.reserves,
            clock,
        }
    }

    /// Builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting, when:
    ///
    /// - `min_limit`, `min_samples` or `probe_samples` is zero, or `window`,
    ///   `probe_interval`, `probe_timeout` or `baseline` is zero or longer than 584 years,
    ///   or `release_after` is under 100 ms or longer than 584 years (kind `OutOfRange`);
    /// - `max_limit` is below `min_limit`, or `initial_limit` is outside
    ///   `min_limit..=max_limit` (kind `Conflict`);
    /// - a ratio is NaN or infinite (kind `NotFinite`), or out of its range: `percentile`
    ///   `failure_threshold` and `probe_share` within `0..=1` and above 0, `probe_jitter`
    ///   within `0..=1`,
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
        positive_duration("probe_timeout", self.probe_timeout)?;
        if let Some(baseline) = self.baseline {
            positive_duration("baseline", baseline)?;
        }
        if let Some(bound) = self.release_after
            && (bound < TICK || u64::try_from(bound.as_nanos()).is_err())
        {
            return Err(ConfigError::out_of_range(
                "release_after",
                bound,
                "at least 100ms and at most 584 years",
            ));
        }
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
            "probe_share",
            self.probe_share,
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
            probe_share: self.probe_share,
            probe_timeout: self.probe_timeout,
            failure_threshold: self.failure_threshold,
            backoff: self.backoff,
            baseline: self.baseline.map(saturating_nanos),
            seed: self
                .seed
                .unwrap_or_else(|| RandomState::new().hash_one(0x5EED_u64)),
        };
        Ok(AdaptiveLimitLayer::from_state(
            AdaptiveLimitState::new(
                settings,
                self.clock,
                self.retry_after,
                name,
                AdaptiveLimitLayer::QUIET_PERIOD,
                self.exempt,
                self.release_after,
            )
            .with_reserves(self.reserves),
        ))
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
            .field("probe_share", &self.probe_share)
            .field("probe_timeout", &self.probe_timeout)
            .field("failure_threshold", &self.failure_threshold)
            .field("backoff", &self.backoff)
            .field("release_after", &self.release_after)
            .field("baseline", &self.baseline)
            .field("seed", &self.seed)
            .field("retry_after", &self.retry_after)
            .field("name", &self.name)
            .field("exempt", &self.exempt.is_some())
            .field("reserves", &self.reserves)
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
        assert_eq!(status.limit, AdaptiveLimitLayer::DEFAULT_INITIAL_LIMIT);
        assert!(!status.probing);
        assert_eq!(status.baseline, None);
        let seeded = AdaptiveLimitLayer::builder()
            .baseline(Duration::from_millis(40))
            .build()
            .unwrap();
        assert_eq!(seeded.status().baseline, Some(Duration::from_millis(40)));
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
                b().probe_share(0.0),
                "probe_share must be within 0..=1 and above 0, got 0.0",
            ),
            (
                b().probe_timeout(Duration::ZERO),
                "probe_timeout must be greater than zero and at most 584 years, got 0ns",
            ),
            (
                b().baseline(Duration::ZERO),
                "baseline must be greater than zero and at most 584 years, got 0ns",
            ),
            (
                b().release_after(Duration::from_millis(50)),
                "release_after must be at least 100ms and at most 584 years, got 50ms",
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
