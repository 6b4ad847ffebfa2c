//! [`Exponential`]: the article's exponential backoff with normal jitter.

use std::time::Duration;

use overload_core::ConfigError;
use rand::{Rng, RngCore};
use rand_distr::StandardNormal;

use super::rules::{grown, ordered, positive, secs_to_duration};
use super::strategy::Backoff;

/// The article's exponential backoff with normal jitter.
///
/// Before retry `n` (`0` for the first retry) the deterministic delay is
/// `d = min(MinDelay * Factor^n, MaxDelay)`: it starts at `MinDelay` and is multiplied by
/// `Factor` after each failure, up to `MaxDelay`. A normal variate with mean zero and standard
/// deviation `d * Jitter` is then added, and the result is never below zero. The jitter is not
/// fed back into the next step, so the mean delay of retry `n` is `d` (within the clamp at
/// zero, which matters only for jitter ratios near 1).
///
/// [`Exponential::new`] has the article's defaults, each an associated constant: `MinDelay`
/// 100 ms, `MaxDelay` 15 min, `Factor` 2, `Jitter` 0.1. [`Exponential::builder`] changes
/// them; [`article_blue`](Self::article_blue) and [`article_green`](Self::article_green) are
/// the two parameter sets the article plots.
///
/// ```
/// use std::time::Duration;
/// use backoff_layer::backoff::Exponential;
///
/// let no_jitter = Exponential::builder().jitter(0.0).build()?;
/// assert_eq!(no_jitter.deterministic_delay(3), Duration::from_millis(800));
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exponential {
    min_delay: Duration,
    max_delay: Duration,
    factor: f64,
    jitter: f64,
}

impl Exponential {
    /// Default `MinDelay`, the first delay: 100 ms, the article's.
    pub const DEFAULT_MIN_DELAY: Duration = Duration::from_millis(100);
    /// Default `MaxDelay`, the largest delay before jitter: 15 minutes, the article's.
    pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(15 * 60);
    /// Default `Factor`, the growth per failure: 2, the article's.
    pub const DEFAULT_FACTOR: f64 = 2.0;
    /// Default `Jitter`, the noise's standard deviation as a share of the delay: 0.1 (10 %),
    /// the article's.
    pub const DEFAULT_JITTER: f64 = 0.1;

    /// The article's defaults: 100 ms, at most 15 min, factor 2, jitter 0.1.
    pub const fn new() -> Self {
        Self {
            min_delay: Self::DEFAULT_MIN_DELAY,
            max_delay: Self::DEFAULT_MAX_DELAY,
            factor: Self::DEFAULT_FACTOR,
            jitter: Self::DEFAULT_JITTER,
        }
    }

    /// A builder starting from the article's defaults.
    pub const fn builder() -> ExponentialBuilder {
        ExponentialBuilder {
            min_delay: Self::DEFAULT_MIN_DELAY,
            max_delay: Self::DEFAULT_MAX_DELAY,
            factor: Self::DEFAULT_FACTOR,
            jitter: Self::DEFAULT_JITTER,
        }
    }

    /// The article's "blue" curve: 100 ms, factor 2.7, jitter 0.1, at most 10 min.
    pub const fn article_blue() -> Self {
        Self {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(600),
            factor: 2.7,
            jitter: 0.1,
        }
    }

    /// The article's "green" curve: 1 s, factor 1.5, jitter 0.1, at most 5 min.
    pub const fn article_green() -> Self {
        Self {
            min_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            factor: 1.5,
            jitter: 0.1,
        }
    }

    /// `MinDelay`, the first delay.
    pub const fn min_delay(&self) -> Duration {
        self.min_delay
    }

    /// `MaxDelay`, the largest delay before jitter (the same as [`Backoff::max_delay`]).
    pub const fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// `Factor`, the growth per failure.
    pub const fn factor(&self) -> f64 {
        self.factor
    }

    /// `Jitter`, the standard deviation of the noise as a share of the delay.
    pub const fn jitter(&self) -> f64 {
        self.jitter
    }

    /// The delay before retry `n` without jitter: `min(MinDelay * Factor^n, MaxDelay)`.
    pub fn deterministic_delay(&self, retry: u32) -> Duration {
        secs_to_duration(
            grown(self.min_delay, self.factor, retry, self.max_delay),
            self.max_delay,
        )
    }
}

impl Default for Exponential {
    /// The same as [`Exponential::new`]: the article's defaults.
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff for Exponential {
    fn next_delay(&self, retry: u32, _: Option<Duration>, rng: &mut dyn RngCore) -> Duration {
        let d = grown(self.min_delay, self.factor, retry, self.max_delay);
        let z: f64 = rng.sample(StandardNormal);
        // NOTE: the noise may take one delay above MaxDelay (as in the article); the
        // conversion saturates at twice the maximum so no value can overflow.
        let ceiling = self.max_delay.saturating_mul(2);
        secs_to_duration(d + z * d * self.jitter, ceiling)
    }

    fn max_delay(&self) -> Duration {
        self.max_delay
    }
}

/// Builds an [`Exponential`]; made by [`Exponential::builder`], starting from the article's
/// defaults.
///
/// The rules [`build`](Self::build) checks:
///
/// - `min_delay` is greater than zero (a zero wait is a retry storm);
/// - `min_delay` does not exceed `max_delay`;
/// - `factor` is finite and at least 1 (a backoff that shrinks is not one);
/// - `jitter` is finite and within `0..=1`: above 1 the noise's standard deviation exceeds
///   the delay itself, and more than one wait in six is clamped to zero, an immediate retry.
#[derive(Clone, Copy, Debug, PartialEq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ExponentialBuilder {
    min_delay: Duration,
    max_delay: Duration,
    factor: f64,
    jitter: f64,
}

impl ExponentialBuilder {
    /// `MinDelay`, the first delay. Must be greater than zero. Default: 100 ms, the
    /// article's.
    pub const fn min_delay(mut self, min_delay: Duration) -> Self {
        self.min_delay = min_delay;
        self
    }

    /// `MaxDelay`, the largest delay before jitter. Must be at least `min_delay`. Default:
    /// 15 minutes, the article's.
    pub const fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// `Factor`, by which the delay is multiplied after each failure. Must be finite and at
    /// least 1. Default: 2, the article's.
    pub const fn factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// `Jitter`, the standard deviation of the normal noise as a share of the delay; `0`
    /// turns the noise off. Must be within `0..=1`. Default: 0.1 (10 %), the article's.
    pub const fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Checks the settings and builds the strategy.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that breaks one of the rules listed on
    /// [`ExponentialBuilder`].
    pub fn build(self) -> Result<Exponential, ConfigError> {
        positive("min_delay", self.min_delay)?;
        ordered("min_delay", self.min_delay, "max_delay", self.max_delay)?;
        if !self.factor.is_finite() {
            return Err(ConfigError::not_finite("factor", self.factor));
        }
        if self.factor < 1.0 {
            return Err(ConfigError::out_of_range(
                "factor",
                self.factor,
                "at least 1",
            ));
        }
        if !self.jitter.is_finite() {
            return Err(ConfigError::not_finite("jitter", self.jitter));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(ConfigError::out_of_range(
                "jitter",
                self.jitter,
                "within 0..=1",
            ));
        }
        Ok(Exponential {
            min_delay: self.min_delay,
            max_delay: self.max_delay,
            factor: self.factor,
            jitter: self.jitter,
        })
    }
}
