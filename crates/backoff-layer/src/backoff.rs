//! Backoff strategies: how long to wait before each retry.
//!
//! Every strategy implements [`Backoff`], the one trait the retry layer knows. A strategy is
//! immutable configuration shared by every request; what changes from one retry to the next
//! (the retry number, the previous delay, the random generator) is passed in, so a strategy
//! never holds per-request state and two requests never share a jitter sequence.
//!
//! | strategy | delay before retry `n` (`n = 0` for the first retry) | defaults | source |
//! |---|---|---|---|
//! | [`Fixed`] | `T` | `T` = 100 ms | the article's simulation client |
//! | [`Exponential`] | `d = min(MinDelay * Factor^n, MaxDelay)`, plus a normal variate with sigma `d * Jitter`, never below zero | 100 ms, 15 min, x2, jitter 0.1 | the article |
//! | [`FullJitter`] | `U(0, min(cap, base * 2^n))` | base 100 ms, cap 20 s | AWS's "Exponential Backoff and Jitter"; values of the AWS SDKs |
//! | [`EqualJitter`] | `t/2 + U(0, t/2)` with `t = min(cap, base * 2^n)` | base 500 ms, cap 20 s | the same article; values of the AWS SDKs for throttling errors |
//! | [`Decorrelated`] | `min(cap, U(base, prev * 3))`, `prev` starting at `base` | base 100 ms, cap 20 s | the same article; [`FullJitter`]'s values |
//! | [`Ethernet`] | `slot * U{0 .. 2^min(n + 1, 10) - 1}` | slot 100 ms | IEEE 802.3 binary exponential backoff |
//!
//! # Construction
//!
//! Every strategy follows the workspace's convention: `new()` gives the defaults above (each
//! is also an associated constant, `Exponential::DEFAULT_FACTOR`), and
//! `builder()` returns a builder with one named setter per setting whose `build()` checks
//! the settings and returns a [`ConfigError`] naming the setting, the value and the rule. The
//! two strategies with a single setting take it in a named constructor instead
//! ([`Fixed::every`], [`Ethernet::with_slot`]), which reads better than a builder of one.
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::backoff::{Exponential, Fixed};
//!
//! let article = Exponential::new(); // 100 ms, x2, jitter 0.1, at most 15 min
//! let gentle = Exponential::builder()
//!     .min_delay(Duration::from_millis(50))
//!     .max_delay(Duration::from_secs(5))
//!     .factor(1.5)
//!     .jitter(0.2)
//!     .build()?;
//! let every_250_ms = Fixed::every(Duration::from_millis(250))?;
//!
//! // A swapped factor and jitter is caught by name:
//! let err = Exponential::builder().factor(0.1).jitter(2.0).build().unwrap_err();
//! assert_eq!(err.to_string(), "factor must be at least 1, got 0.1");
//! # let _ = (article, gentle, every_250_ms);
//! # Ok::<(), backoff_layer::ConfigError>(())
//! ```
//!
//! No strategy overflows or panics at any retry number (`u32::MAX` included).
//!
//! # Randomness
//!
//! A strategy draws from the generator it is given. The retry layer gives each request its own
//! generator, seeded from a shared [`Seeds`] source, so that the jitter of two requests is
//! independent (which is the whole point of jitter). Tests inject [`Seeds::from_seed`] to make
//! the seeds, and therefore every delay, reproducible.
//!
//! # Computing a delay sequence without a service
//!
//! [`delays`] (or [`Backoff::delays`]) turns a strategy and a generator into the infinite
//! sequence of delays a request would see, for plots and simulations:
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::backoff::{Backoff, Exponential, Fixed, Seeds};
//!
//! let article = Exponential::new();
//! let first: Vec<Duration> = article.delays(Seeds::from_seed(7).rng()).take(5).collect();
//! assert_eq!(first.len(), 5);
//!
//! let fixed = Fixed::new(); // 100 ms
//! assert!(fixed.delays(Seeds::from_seed(7).rng()).take(3).all(|d| d == Duration::from_millis(100)));
//! ```
//!
//! # Writing your own
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::backoff::Backoff;
//! use rand::RngCore;
//!
//! /// Linear backoff: 1 s, 2 s, 3 s, ... at most 10 s.
//! #[derive(Debug)]
//! struct Linear;
//!
//! impl Backoff for Linear {
//!     fn next_delay(&self, retry: u32, _previous: Option<Duration>, _rng: &mut dyn RngCore) -> Duration {
//!         Duration::from_secs(u64::from(retry) + 1).min(self.max_delay())
//!     }
//!     fn max_delay(&self) -> Duration {
//!         Duration::from_secs(10)
//!     }
//! }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use overload_core::ConfigError;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng, TryRngCore};
use rand_distr::StandardNormal;

/// A backoff strategy: the delay before each retry of one request.
///
/// Implementations are shared by every request of a client (the retry layer holds them in an
/// `Arc`), so they must be immutable or internally synchronised; per-request state is passed
/// in. They must not panic for any `retry` (up to `u32::MAX`) nor any `previous` delay.
pub trait Backoff: fmt::Debug + Send + Sync + 'static {
    /// The delay before retry number `retry` of a request: `0` before the first retry (the
    /// second attempt), `1` before the second, and so on.
    ///
    /// `previous` is what this strategy returned for the previous retry of the same request
    /// (`None` before the first retry); `rng` is the request's own generator.
    fn next_delay(&self, retry: u32, previous: Option<Duration>, rng: &mut dyn RngCore)
    -> Duration;

    /// The largest delay this strategy means to wait.
    ///
    /// It bounds the strategy's own waits only: a server's `Retry-After` or
    /// `grpc-retry-pushback-ms` hint may lengthen a wait beyond it, up to the retry layer's
    /// `max_retry_after`. [`Exponential`]'s jitter may take a single delay slightly above it.
    fn max_delay(&self) -> Duration;

    /// The infinite sequence of delays one request would see, drawn from `rng`.
    fn delays<R: RngCore>(&self, rng: R) -> Delays<'_, Self, R>
    where
        Self: Sized,
    {
        delays(self, rng)
    }
}

/// The infinite sequence of delays of `backoff` for one request whose generator is `rng`.
///
/// Works on trait objects too (`&dyn Backoff`).
pub fn delays<B: Backoff + ?Sized, R: RngCore>(backoff: &B, rng: R) -> Delays<'_, B, R> {
    Delays {
        backoff,
        rng,
        retry: 0,
        previous: None,
    }
}

/// The iterator returned by [`delays`]; never ends.
#[derive(Debug)]
pub struct Delays<'a, B: ?Sized, R> {
    backoff: &'a B,
    rng: R,
    retry: u32,
    previous: Option<Duration>,
}

impl<B: Backoff + ?Sized, R: RngCore> Iterator for Delays<'_, B, R> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self
            .backoff
            .next_delay(self.retry, self.previous, &mut self.rng);
        self.retry = self.retry.saturating_add(1);
        self.previous = Some(d);
        Some(d)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

/// Seconds to a duration, saturating at `max` (and at zero for negative or NaN input).
fn secs_to_duration(secs: f64, max: Duration) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
}

/// `min(base * factor^n, cap)` in seconds, without overflow for any `n`.
fn grown(base: Duration, factor: f64, n: u32, cap: Duration) -> f64 {
    let cap = cap.as_secs_f64();
    // NOTE: `powi` takes an i32; beyond i32::MAX the value is infinite (factor > 1) or 1
    // (factor == 1) anyway, and infinity is absorbed by `min`.
    let exp = i32::try_from(n).unwrap_or(i32::MAX);
    let g = base.as_secs_f64() * factor.powi(exp);
    if g.is_nan() { cap } else { g.min(cap) }
}

/// `field` must be greater than zero: a zero wait is a retry storm.
fn positive(field: &'static str, delay: Duration) -> Result<(), ConfigError> {
    if delay.is_zero() {
        Err(ConfigError::out_of_range(field, delay, "greater than zero"))
    } else {
        Ok(())
    }
}

/// `low` (the setting `low_field`) must not exceed `high` (the setting `high_field`).
fn ordered(
    low_field: &'static str,
    low: Duration,
    high_field: &'static str,
    high: Duration,
) -> Result<(), ConfigError> {
    if low > high {
        Err(ConfigError::conflict(
            low_field,
            format_args!("{low_field} ({low:?}) must not exceed {high_field} ({high:?})"),
        ))
    } else {
        Ok(())
    }
}

/// The rules of the strategies set by a `base` and a `cap`.
fn check_base_cap(base: Duration, cap: Duration) -> Result<(), ConfigError> {
    positive("base", base)?;
    ordered("base", base, "cap", cap)
}

/// A fixed interval between attempts: the article's baseline, and how not to do it under load.
///
/// Every retry waits the same time, so a fleet of clients that failed together retries
/// together, forever in step.
///
/// [`Fixed::new`] waits 100 ms ([`DEFAULT_INTERVAL`](Self::DEFAULT_INTERVAL), the interval
/// of the article's simulation client); [`Fixed::every`] takes another interval. The
/// interval is the strategy's only setting, so it is given to a named constructor rather
/// than to a builder.
///
/// Its maximum is its interval. A server's `Retry-After` still lengthens a wait: the retry
/// layer takes a hint as a lower bound, up to its `max_retry_after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed {
    interval: Duration,
}

impl Fixed {
    /// Default interval: 100 ms, the article's simulation client.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

    /// Waits 100 ms ([`DEFAULT_INTERVAL`](Self::DEFAULT_INTERVAL)) before every retry.
    pub const fn new() -> Self {
        Self {
            interval: Self::DEFAULT_INTERVAL,
        }
    }

    /// Waits `interval` before every retry.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on the setting `interval` if it is zero (a retry storm).
    pub fn every(interval: Duration) -> Result<Self, ConfigError> {
        positive("interval", interval)?;
        Ok(Self { interval })
    }

    /// The interval.
    pub const fn interval(&self) -> Duration {
        self.interval
    }
}

impl Default for Fixed {
    /// The same as [`Fixed::new`]: 100 ms, the article's simulation client.
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff for Fixed {
    fn next_delay(&self, _: u32, _: Option<Duration>, _: &mut dyn RngCore) -> Duration {
        self.interval
    }

    fn max_delay(&self) -> Duration {
        self.interval
    }
}

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

/// "Full jitter", from AWS's "Exponential Backoff and Jitter": a uniform wait between zero
/// and the exponential bound, `U(0, min(cap, base * 2^n))`.
///
/// [`FullJitter::new`] has the defaults of the AWS SDKs' standard retry mode, which uses
/// this strategy: `base` 100 ms ([`DEFAULT_BASE`](Self::DEFAULT_BASE)) and `cap` 20 s
/// ([`DEFAULT_CAP`](Self::DEFAULT_CAP)). [`FullJitter::builder`] changes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FullJitter {
    base: Duration,
    cap: Duration,
}

impl FullJitter {
    /// Default `base`: 100 ms, the AWS SDKs' base delay.
    pub const DEFAULT_BASE: Duration = Duration::from_millis(100);
    /// Default `cap`: 20 s, the AWS SDKs' maximum backoff.
    pub const DEFAULT_CAP: Duration = Duration::from_secs(20);

    /// Base 100 ms, cap 20 s: the AWS SDKs' standard retry mode.
    pub const fn new() -> Self {
        Self {
            base: Self::DEFAULT_BASE,
            cap: Self::DEFAULT_CAP,
        }
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> FullJitterBuilder {
        FullJitterBuilder {
            base: Self::DEFAULT_BASE,
            cap: Self::DEFAULT_CAP,
        }
    }

    /// The base delay, the bound of the first wait.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The cap, the largest wait.
    pub const fn cap(&self) -> Duration {
        self.cap
    }
}

impl Default for FullJitter {
    /// The same as [`FullJitter::new`]: base 100 ms, cap 20 s.
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff for FullJitter {
    fn next_delay(&self, retry: u32, _: Option<Duration>, rng: &mut dyn RngCore) -> Duration {
        let t = grown(self.base, 2.0, retry, self.cap);
        secs_to_duration(rng.random_range(0.0..=t), self.cap)
    }

    fn max_delay(&self) -> Duration {
        self.cap
    }
}

/// Builds a [`FullJitter`]; made by [`FullJitter::builder`], starting from the defaults
/// (base 100 ms, cap 20 s).
///
/// [`build`](Self::build) checks that `base` is greater than zero and does not exceed
/// `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct FullJitterBuilder {
    base: Duration,
    cap: Duration,
}

impl FullJitterBuilder {
    /// The base delay: the first wait is drawn from `0..=base`, and the bound doubles after
    /// each failure. Must be greater than zero. Default: 100 ms, the AWS SDKs'.
    pub const fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The largest wait. Must be at least `base`. Default: 20 s, the AWS SDKs'.
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Checks the settings and builds the strategy.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `base` if it is zero or above `cap`.
    pub fn build(self) -> Result<FullJitter, ConfigError> {
        check_base_cap(self.base, self.cap)?;
        Ok(FullJitter {
            base: self.base,
            cap: self.cap,
        })
    }
}

/// "Equal jitter", from AWS's "Exponential Backoff and Jitter": half the exponential bound,
/// plus a uniform share of the other half, `t/2 + U(0, t/2)` with `t = min(cap, base * 2^n)`.
///
/// [`EqualJitter::new`] has the values the AWS SDKs use for throttling errors (the SDK for
/// Java uses this strategy for them): `base` 500 ms ([`DEFAULT_BASE`](Self::DEFAULT_BASE)),
/// `cap` 20 s ([`DEFAULT_CAP`](Self::DEFAULT_CAP)). [`EqualJitter::builder`] changes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EqualJitter {
    base: Duration,
    cap: Duration,
}

impl EqualJitter {
    /// Default `base`: 500 ms, the AWS SDKs' base delay for throttling errors.
    pub const DEFAULT_BASE: Duration = Duration::from_millis(500);
    /// Default `cap`: 20 s, the AWS SDKs' maximum backoff.
    pub const DEFAULT_CAP: Duration = Duration::from_secs(20);

    /// Base 500 ms, cap 20 s: the AWS SDKs' backoff for throttling errors.
    pub const fn new() -> Self {
        Self {
            base: Self::DEFAULT_BASE,
            cap: Self::DEFAULT_CAP,
        }
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> EqualJitterBuilder {
        EqualJitterBuilder {
            base: Self::DEFAULT_BASE,
            cap: Self::DEFAULT_CAP,
        }
    }

    /// The base delay: the first wait is within `base/2..=base`.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The cap, the largest wait.
    pub const fn cap(&self) -> Duration {
        self.cap
    }
}

impl Default for EqualJitter {
    /// The same as [`EqualJitter::new`]: base 500 ms, cap 20 s.
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff for EqualJitter {
    fn next_delay(&self, retry: u32, _: Option<Duration>, rng: &mut dyn RngCore) -> Duration {
        let half = grown(self.base, 2.0, retry, self.cap) / 2.0;
        secs_to_duration(half + rng.random_range(0.0..=half), self.cap)
    }

    fn max_delay(&self) -> Duration {
        self.cap
    }
}

/// Builds an [`EqualJitter`]; made by [`EqualJitter::builder`], starting from the defaults
/// (base 500 ms, cap 20 s).
///
/// [`build`](Self::build) checks that `base` is greater than zero and does not exceed
/// `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct EqualJitterBuilder {
    base: Duration,
    cap: Duration,
}

impl EqualJitterBuilder {
    /// The base delay: the first wait is within `base/2..=base`, and the bound doubles after
    /// each failure. Must be greater than zero. Default: 500 ms, the AWS SDKs' for
    /// throttling errors.
    pub const fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The largest wait. Must be at least `base`. Default: 20 s, the AWS SDKs'.
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Checks the settings and builds the strategy.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `base` if it is zero or above `cap`.
    pub fn build(self) -> Result<EqualJitter, ConfigError> {
        check_base_cap(self.base, self.cap)?;
        Ok(EqualJitter {
            base: self.base,
            cap: self.cap,
        })
    }
}

/// "Decorrelated jitter", from AWS's "Exponential Backoff and Jitter": each wait is drawn
/// between the base and three times the previous wait, `min(cap, U(base, prev * 3))`, with
/// `prev` starting at `base`.
///
/// [`Decorrelated::new`] has [`FullJitter`]'s defaults, the AWS SDKs' values: `base` 100 ms
/// ([`DEFAULT_BASE`](Self::DEFAULT_BASE)), `cap` 20 s ([`DEFAULT_CAP`](Self::DEFAULT_CAP)).
/// AWS's article compares the jittered strategies at one base and cap; sharing them keeps a
/// switch from one to the other a change of shape only. [`Decorrelated::builder`] changes
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decorrelated {
    base: Duration,
    cap: Duration,
}

impl Decorrelated {
    /// Default `base`: 100 ms, as [`FullJitter::DEFAULT_BASE`] (the AWS SDKs' base delay).
    pub const DEFAULT_BASE: Duration = FullJitter::DEFAULT_BASE;
    /// Default `cap`: 20 s, as [`FullJitter::DEFAULT_CAP`] (the AWS SDKs' maximum backoff).
    pub const DEFAULT_CAP: Duration = FullJitter::DEFAULT_CAP;

    /// Base 100 ms, cap 20 s, as [`FullJitter::new`].
    pub const fn new() -> Self {
        Self {
            base: Self::DEFAULT_BASE,
            cap: Self::DEFAULT_CAP,
        }
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> DecorrelatedBuilder {
        DecorrelatedBuilder {
            base: Self::DEFAULT_BASE,
            cap: Self::DEFAULT_CAP,
        }
    }

    /// The base delay, the shortest wait.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The cap, the largest wait.
    pub const fn cap(&self) -> Duration {
        self.cap
    }
}

impl Default for Decorrelated {
    /// The same as [`Decorrelated::new`]: base 100 ms, cap 20 s.
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff for Decorrelated {
    fn next_delay(&self, _: u32, previous: Option<Duration>, rng: &mut dyn RngCore) -> Duration {
        let base = self.base.as_secs_f64();
        // NOTE: a `previous` below the base (possible only from a caller of this trait, not
        // from this strategy) is lifted to it so the range is never empty.
        let prev = previous.unwrap_or(self.base).as_secs_f64().max(base);
        let hi = (prev * 3.0).min(self.cap.as_secs_f64()).max(base);
        secs_to_duration(rng.random_range(base..=hi), self.cap)
    }

    fn max_delay(&self) -> Duration {
        self.cap
    }
}

/// Builds a [`Decorrelated`]; made by [`Decorrelated::builder`], starting from the defaults
/// (base 100 ms, cap 20 s).
///
/// [`build`](Self::build) checks that `base` is greater than zero and does not exceed
/// `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct DecorrelatedBuilder {
    base: Duration,
    cap: Duration,
}

impl DecorrelatedBuilder {
    /// The shortest wait, and the starting point of the first draw, `U(base, 3 base)`. Must
    /// be greater than zero. Default: 100 ms, the AWS SDKs' base delay.
    pub const fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The largest wait. Must be at least `base`. Default: 20 s, the AWS SDKs' maximum
    /// backoff.
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Checks the settings and builds the strategy.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `base` if it is zero or above `cap`.
    pub fn build(self) -> Result<Decorrelated, ConfigError> {
        check_base_cap(self.base, self.cap)?;
        Ok(Decorrelated {
            base: self.base,
            cap: self.cap,
        })
    }
}

/// Ethernet's truncated binary exponential backoff: after collision `c` (`c = n + 1` before
/// retry `n`), wait a whole number of slots drawn uniformly from `0 ..= 2^min(c, 10) - 1`.
///
/// The expected wait after collision `c` is `(2^c - 1) / 2` slots (for `c <= 10`); the
/// largest is 1023 slots.
///
/// [`Ethernet::new`] uses a slot of 100 ms ([`DEFAULT_SLOT`](Self::DEFAULT_SLOT)).
/// IEEE 802.3 sizes its slot (512 bit times, 51.2 µs at 10 Mb/s) to the longest round trip
/// on the medium, the time a collision takes to be seen; for a request the matching unit
/// is the time a server takes to answer, and 100 ms is the article's service time (its
/// `MinDelay`). Waits are then 0 or 100 ms before the first retry, at most 102.3 s. The slot
/// is the only setting, so [`Ethernet::with_slot`] takes another one rather than a builder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ethernet {
    slot: Duration,
}

impl Ethernet {
    /// The exponent is truncated at 10, as in IEEE 802.3.
    pub const CEILING: u32 = 10;

    /// Default slot time: 100 ms, a request's round trip in the article's model (see the
    /// [type docs](Self)).
    pub const DEFAULT_SLOT: Duration = Duration::from_millis(100);

    /// A slot of 100 ms ([`DEFAULT_SLOT`](Self::DEFAULT_SLOT)).
    pub const fn new() -> Self {
        Self {
            slot: Self::DEFAULT_SLOT,
        }
    }

    /// A slot of `slot`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on the setting `slot` if it is zero, or so long that the largest
    /// wait, `slot * 1023`, does not fit in a [`Duration`].
    pub fn with_slot(slot: Duration) -> Result<Self, ConfigError> {
        positive("slot", slot)?;
        if slot.checked_mul((1 << Self::CEILING) - 1).is_none() {
            return Err(ConfigError::out_of_range(
                "slot",
                slot,
                "short enough that 1023 slots fit in a Duration",
            ));
        }
        Ok(Self { slot })
    }

    /// The slot time.
    pub const fn slot(&self) -> Duration {
        self.slot
    }

    /// The number of slots to wait before retry `retry`.
    pub fn slots(&self, retry: u32, rng: &mut dyn RngCore) -> u32 {
        let c = retry.saturating_add(1).min(Self::CEILING);
        rng.random_range(0..=(1u32 << c) - 1)
    }
}

impl Default for Ethernet {
    /// The same as [`Ethernet::new`]: a slot of 100 ms.
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff for Ethernet {
    fn next_delay(&self, retry: u32, _: Option<Duration>, rng: &mut dyn RngCore) -> Duration {
        // NOTE: cannot overflow: `with_slot` checked `slot * 1023` (and the default is
        // 100 ms), and slots() <= 1023.
        self.slot * self.slots(retry, rng)
    }

    fn max_delay(&self) -> Duration {
        self.slot * ((1 << Self::CEILING) - 1)
    }
}

/// A shared source of per-request seeds.
///
/// Each call to [`next_seed`](Seeds::next_seed) returns a different 64-bit seed (a counter,
/// keyed and scrambled by the SplitMix64 finaliser, which is a bijection: two calls on one
/// source never return the same seed before 2^64 calls). The retry layer seeds one small,
/// fast generator per request from it, so no two requests share a jitter sequence and no
/// lock is taken.
///
/// [`Seeds::from_os`] (the default) takes its key from the operating system, so sequences
/// differ between processes; [`Seeds::from_seed`] fixes the key for reproducible tests and
/// simulations. The seeds are not cryptographic and need not be.
#[derive(Debug)]
pub struct Seeds {
    key: u64,
    counter: AtomicU64,
}

impl Seeds {
    /// A source keyed by the operating system's random generator.
    ///
    /// Falls back to a key derived from the system clock and the address of a stack value if
    /// the operating system has no randomness to give (seeds then still differ per request).
    pub fn from_os() -> Self {
        let key = rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let local = 0u8;
            t ^ (std::ptr::from_ref(&local) as usize as u64)
        });
        Self::from_seed(key)
    }

    /// A reproducible source: the same `seed` gives the same sequence of per-request seeds.
    pub const fn from_seed(seed: u64) -> Self {
        Self {
            key: seed,
            counter: AtomicU64::new(0),
        }
    }

    /// The next seed; never the same twice for one source (until 2^64 calls).
    pub fn next_seed(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        splitmix64(n.wrapping_add(self.key.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// A new generator, seeded with [`next_seed`](Seeds::next_seed): what each request gets.
    pub fn rng(&self) -> SmallRng {
        SmallRng::seed_from_u64(self.next_seed())
    }
}

impl Default for Seeds {
    /// [`Seeds::from_os`].
    fn default() -> Self {
        Self::from_os()
    }
}

/// The SplitMix64 output function: a bijection on `u64` with good avalanche.
const fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn full_jitter(base: Duration, cap: Duration) -> FullJitter {
        FullJitter::builder().base(base).cap(cap).build().unwrap()
    }

    fn decorrelated(base: Duration, cap: Duration) -> Decorrelated {
        Decorrelated::builder().base(base).cap(cap).build().unwrap()
    }

    fn all_strategies() -> Vec<Box<dyn Backoff>> {
        vec![
            Box::new(Fixed::default()),
            Box::new(Exponential::default()),
            Box::new(Exponential::article_blue()),
            Box::new(
                Exponential::builder()
                    .min_delay(MS)
                    .max_delay(Duration::MAX)
                    .factor(2.7)
                    .jitter(0.5)
                    .build()
                    .unwrap(),
            ),
            Box::new(FullJitter::new()),
            Box::new(full_jitter(MS, Duration::MAX)),
            Box::new(EqualJitter::new()),
            Box::new(Decorrelated::new()),
            Box::new(decorrelated(MS, Duration::MAX)),
            Box::new(Ethernet::new()),
            Box::new(Ethernet::with_slot(51 * Duration::from_micros(1)).unwrap()),
        ]
    }

    /// Mean of `runs` samples of the delay before retry `retry`, in seconds.
    fn mean_at(b: &dyn Backoff, retry: u32, runs: u32, seeds: &Seeds) -> f64 {
        let mut sum = 0.0;
        for _ in 0..runs {
            let d: Vec<Duration> = delays(b, seeds.rng()).take(retry as usize + 1).collect();
            sum += d[retry as usize].as_secs_f64();
        }
        sum / f64::from(runs)
    }

    #[test]
    fn article_sequence_mean_matches_the_deterministic_curve() {
        let seeds = Seeds::from_seed(1);
        for b in [
            Exponential::new(),
            Exponential::article_blue(),
            Exponential::article_green(),
        ] {
            for n in 0..16 {
                let expected = (b.min_delay.as_secs_f64() * b.factor.powi(n as i32))
                    .min(b.max_delay.as_secs_f64());
                let mean = mean_at(&b, n, 4_000, &seeds);
                let err = (mean - expected).abs() / expected;
                // sigma of the mean is 0.1 / sqrt(4000) = 0.16%; 2% is over 12 sigmas.
                assert!(
                    err < 0.02,
                    "{b:?} retry {n}: mean {mean}, expected {expected}"
                );
                assert_eq!(
                    b.deterministic_delay(n),
                    secs_to_duration(expected, b.max_delay)
                );
            }
        }
    }

    #[test]
    fn article_jitter_has_the_stated_spread() {
        let b = Exponential::new();
        let seeds = Seeds::from_seed(2);
        let n = 3; // 800 ms
        let xs: Vec<f64> = (0..20_000)
            .map(|_| delays(&b, seeds.rng()).nth(n).unwrap().as_secs_f64())
            .collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        let sd = var.sqrt();
        assert!((sd - 0.08).abs() < 0.004, "sd {sd}, expected 0.08");
    }

    #[test]
    fn exponential_without_jitter_is_exact() {
        let b = Exponential::builder()
            .max_delay(Duration::from_secs(1))
            .jitter(0.0)
            .build()
            .unwrap();
        let got: Vec<Duration> = b.delays(Seeds::from_seed(3).rng()).take(6).collect();
        assert_eq!(
            got,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
    }

    #[test]
    fn exponential_is_never_negative_even_at_the_largest_jitter() {
        let b = Exponential::builder()
            .max_delay(Duration::from_secs(10))
            .jitter(1.0)
            .build()
            .unwrap();
        let seeds = Seeds::from_seed(4);
        let mut zeros = 0;
        for _ in 0..2_000 {
            let d = b.delays(seeds.rng()).nth(2).unwrap();
            if d.is_zero() {
                zeros += 1;
            }
            assert!(d <= Duration::from_secs(20));
        }
        // P(z < -1) is 15.9 %: about 317 of 2000 draws clamp at zero.
        assert!(
            zeros > 200,
            "with sigma = d some draws must clamp at zero: {zeros}"
        );
    }

    #[test]
    fn fixed_is_fixed() {
        let b = Fixed::every(250 * MS).unwrap();
        assert!(
            b.delays(Seeds::from_seed(5).rng())
                .take(100)
                .all(|d| d == 250 * MS)
        );
        assert_eq!(Fixed::new().interval(), 100 * MS);
    }

    #[test]
    fn full_jitter_bounds_and_mean() {
        let b = full_jitter(100 * MS, Duration::from_secs(2));
        let seeds = Seeds::from_seed(6);
        for n in 0..8u32 {
            let t = (0.1 * 2f64.powi(n as i32)).min(2.0);
            for _ in 0..500 {
                let d = delays(&b, seeds.rng())
                    .nth(n as usize)
                    .unwrap()
                    .as_secs_f64();
                assert!((0.0..=t).contains(&d), "retry {n}: {d} not in [0, {t}]");
            }
            let mean = mean_at(&b, n, 4_000, &seeds);
            assert!(
                (mean - t / 2.0).abs() / (t / 2.0) < 0.05,
                "retry {n}: mean {mean}"
            );
        }
    }

    #[test]
    fn equal_jitter_bounds_and_mean() {
        let b = EqualJitter::builder()
            .base(100 * MS)
            .cap(Duration::from_secs(2))
            .build()
            .unwrap();
        let seeds = Seeds::from_seed(7);
        for n in 0..8u32 {
            let t = (0.1 * 2f64.powi(n as i32)).min(2.0);
            for _ in 0..500 {
                let d = delays(&b, seeds.rng())
                    .nth(n as usize)
                    .unwrap()
                    .as_secs_f64();
                assert!(d >= t / 2.0 - 1e-9 && d <= t + 1e-9, "retry {n}: {d}");
            }
            let mean = mean_at(&b, n, 4_000, &seeds);
            assert!((mean - 0.75 * t).abs() / t < 0.03, "retry {n}: mean {mean}");
        }
    }

    #[test]
    fn decorrelated_bounds_follow_the_previous_delay() {
        let base = 100 * MS;
        let cap = Duration::from_secs(5);
        let b = decorrelated(base, cap);
        let seeds = Seeds::from_seed(8);
        for _ in 0..200 {
            let mut prev = base;
            for d in b.delays(seeds.rng()).take(30) {
                assert!(d >= base, "{d:?} below base");
                assert!(d <= cap, "{d:?} above cap");
                assert!(
                    d <= prev * 3 + Duration::from_nanos(1),
                    "{d:?} above 3 x {prev:?}"
                );
                prev = d;
            }
        }
        // From the base, the first draw is U(base, 3 base): mean 2 base.
        let mean = mean_at(&b, 0, 4_000, &seeds);
        assert!((mean - 0.2).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn ethernet_slots_have_the_expected_mean_and_range() {
        let slot = Duration::from_micros(51_200) / 1000; // 51.2 us
        let b = Ethernet::with_slot(slot).unwrap();
        let seeds = Seeds::from_seed(9);
        for c in 1..=12u32 {
            let hi = (1u32 << c.min(10)) - 1;
            let mut rng = seeds.rng();
            let runs = 20_000;
            let mut sum = 0u64;
            let mut seen_hi = false;
            for _ in 0..runs {
                let k = b.slots(c - 1, &mut rng);
                assert!(k <= hi);
                seen_hi |= k == hi;
                sum += u64::from(k);
            }
            let mean = sum as f64 / f64::from(runs);
            let expected = f64::from(hi) / 2.0; // (2^c - 1) / 2
            assert!(
                (mean - expected).abs() <= 0.03 * expected.max(1.0),
                "c = {c}: mean {mean} slots, expected {expected}"
            );
            if c <= 6 {
                assert!(seen_hi, "c = {c}: the top slot {hi} never drawn");
            }
        }
        assert_eq!(b.max_delay(), slot * 1023);
        let mut rng = seeds.rng();
        assert_eq!(
            b.next_delay(0, None, &mut rng).as_nanos() % slot.as_nanos(),
            0
        );
    }

    #[test]
    fn no_overflow_or_panic_at_huge_retry_numbers() {
        let seeds = Seeds::from_seed(10);
        for b in all_strategies() {
            let mut rng = seeds.rng();
            for retry in [10_000, 1 << 20, i32::MAX as u32, u32::MAX - 1, u32::MAX] {
                for previous in [None, Some(Duration::ZERO), Some(Duration::MAX)] {
                    let d = b.next_delay(retry, previous, &mut rng);
                    assert!(
                        d <= b.max_delay().saturating_mul(2),
                        "{b:?} at {retry}: {d:?}"
                    );
                }
            }
        }
        let b = Exponential::article_blue();
        let d = b.next_delay(10_000, None, &mut seeds.rng());
        assert!(
            d >= Duration::from_secs(300) && d <= Duration::from_secs(900),
            "{d:?}"
        );
    }

    #[test]
    fn two_requests_get_different_sequences() {
        let seeds = Seeds::from_seed(11);
        for b in all_strategies() {
            if format!("{b:?}").starts_with("Fixed") {
                continue;
            }
            let a: Vec<Duration> = delays(&*b, seeds.rng()).take(8).collect();
            let c: Vec<Duration> = delays(&*b, seeds.rng()).take(8).collect();
            assert_ne!(a, c, "{b:?}");
        }
    }

    #[test]
    fn seeds_are_reproducible_and_distinct() {
        let a = Seeds::from_seed(42);
        let b = Seeds::from_seed(42);
        let xs: Vec<u64> = (0..1000).map(|_| a.next_seed()).collect();
        let ys: Vec<u64> = (0..1000).map(|_| b.next_seed()).collect();
        assert_eq!(xs, ys);
        let mut sorted = xs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), xs.len());
        assert_ne!(Seeds::from_seed(43).next_seed(), xs[0]);
        // Two OS-keyed sources differ (a 2^-64 chance of a false failure).
        assert_ne!(Seeds::from_os().next_seed(), Seeds::from_os().next_seed());
    }

    #[test]
    fn new_gives_the_documented_defaults() {
        assert_eq!(Fixed::new().interval(), 100 * MS);
        assert_eq!(Fixed::new(), Fixed::default());

        let e = Exponential::new();
        assert_eq!(
            (e.min_delay(), e.max_delay(), e.factor(), e.jitter()),
            (100 * MS, Duration::from_secs(900), 2.0, 0.1)
        );
        assert_eq!(e, Exponential::default());
        assert_eq!(Exponential::builder().build().unwrap(), e);
        let blue = Exponential::article_blue();
        assert_eq!(
            (
                blue.min_delay(),
                blue.max_delay(),
                blue.factor(),
                blue.jitter()
            ),
            (100 * MS, Duration::from_secs(600), 2.7, 0.1)
        );
        let green = Exponential::article_green();
        assert_eq!(
            (
                green.min_delay(),
                green.max_delay(),
                green.factor(),
                green.jitter()
            ),
            (Duration::from_secs(1), Duration::from_secs(300), 1.5, 0.1)
        );

        let twenty = Duration::from_secs(20);
        let f = FullJitter::new();
        assert_eq!((f.base(), f.cap()), (100 * MS, twenty));
        assert_eq!(FullJitter::builder().build().unwrap(), f);
        let q = EqualJitter::new();
        assert_eq!((q.base(), q.cap()), (500 * MS, twenty));
        assert_eq!(EqualJitter::builder().build().unwrap(), q);
        let d = Decorrelated::new();
        assert_eq!((d.base(), d.cap()), (100 * MS, twenty));
        assert_eq!(Decorrelated::builder().build().unwrap(), d);
        assert_eq!(Ethernet::new().slot(), 100 * MS);
        assert_eq!(Ethernet::new().max_delay(), 102_300 * MS);
    }

    /// The error's field, kind and message.
    fn refused<T: fmt::Debug>(
        r: Result<T, ConfigError>,
    ) -> (&'static str, ConfigErrorKind, String) {
        let e = r.unwrap_err();
        (e.field(), e.kind(), e.to_string())
    }

    use overload_core::ConfigErrorKind::{self, Conflict, NotFinite, OutOfRange};

    #[test]
    fn invalid_configurations_are_refused_by_name_value_and_rule() {
        let s = Duration::from_secs(1);
        let owned = |(f, k, m): (&'static str, ConfigErrorKind, &str)| (f, k, m.to_owned());

        assert_eq!(
            refused(Fixed::every(Duration::ZERO)),
            owned((
                "interval",
                OutOfRange,
                "interval must be greater than zero, got 0ns"
            ))
        );

        let e = Exponential::builder;
        assert_eq!(
            refused(e().min_delay(Duration::ZERO).build()),
            owned((
                "min_delay",
                OutOfRange,
                "min_delay must be greater than zero, got 0ns"
            ))
        );
        assert_eq!(
            refused(e().min_delay(s).max_delay(MS).build()),
            owned((
                "min_delay",
                Conflict,
                "min_delay (1s) must not exceed max_delay (1ms)"
            ))
        );
        // A minimum above the default maximum (15 min) is caught too.
        assert_eq!(refused(e().min_delay(1000 * s).build()).1, Conflict);
        assert_eq!(
            refused(e().factor(0.5).build()),
            owned(("factor", OutOfRange, "factor must be at least 1, got 0.5"))
        );
        for f in [0.0, -2.0, 0.999] {
            assert_eq!(refused(e().factor(f).build()).1, OutOfRange, "{f}");
        }
        for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(refused(e().factor(f).build()).1, NotFinite, "{f}");
        }
        assert_eq!(
            refused(e().factor(f64::NAN).build()).2,
            "factor must be a finite number, got NaN"
        );
        assert_eq!(
            refused(e().jitter(1.5).build()),
            owned(("jitter", OutOfRange, "jitter must be within 0..=1, got 1.5"))
        );
        assert_eq!(refused(e().jitter(-0.1).build()).1, OutOfRange);
        assert_eq!(refused(e().jitter(f64::INFINITY).build()).1, NotFinite);
        // Regression: the old positional `Exponential::new(min, max, factor, jitter)` took
        // a swapped factor and jitter (2.0 and 0.1 as 0.1 and 2.0) without a word only when
        // both happened to pass; by name, each setting is checked against its own rule.
        assert_eq!(refused(e().factor(0.1).jitter(2.0).build()).0, "factor");
        assert_eq!(refused(e().factor(2.0).jitter(2.0).build()).0, "jitter");
        // The bounds are inclusive.
        assert!(e().factor(1.0).jitter(0.0).build().is_ok());
        assert!(e().jitter(1.0).min_delay(s).max_delay(s).build().is_ok());

        for (field_base, r) in [
            (
                "base",
                refused(FullJitter::builder().base(Duration::ZERO).build()),
            ),
            (
                "base",
                refused(EqualJitter::builder().base(Duration::ZERO).build()),
            ),
            (
                "base",
                refused(Decorrelated::builder().base(Duration::ZERO).build()),
            ),
        ] {
            assert_eq!(
                r,
                owned((
                    field_base,
                    OutOfRange,
                    "base must be greater than zero, got 0ns"
                ))
            );
        }
        for r in [
            refused(FullJitter::builder().base(s).cap(MS).build()),
            refused(EqualJitter::builder().base(s).cap(MS).build()),
            refused(Decorrelated::builder().base(s).cap(MS).build()),
        ] {
            assert_eq!(
                r,
                owned(("base", Conflict, "base (1s) must not exceed cap (1ms)"))
            );
        }
        // A base above the default cap (20 s) is caught too.
        assert_eq!(
            refused(FullJitter::builder().base(30 * s).build()).2,
            "base (30s) must not exceed cap (20s)"
        );

        assert_eq!(
            refused(Ethernet::with_slot(Duration::ZERO)),
            owned((
                "slot",
                OutOfRange,
                "slot must be greater than zero, got 0ns"
            ))
        );
        let (field, kind, message) = refused(Ethernet::with_slot(Duration::MAX));
        assert_eq!((field, kind), ("slot", OutOfRange));
        assert!(
            message.starts_with("slot must be short enough that 1023 slots fit in a Duration"),
            "{message}"
        );
        assert!(Ethernet::with_slot(Duration::MAX / 1023).is_ok());
    }

    proptest! {
        #[test]
        fn every_strategy_stays_within_bounds(
            retry in any::<u32>(),
            prev_nanos in any::<u64>(),
            seed in any::<u64>(),
            base_ms in 1u64..10_000,
            cap_factor in 1u64..1_000,
            factor in 1.0f64..10.0,
            jitter in 0.0f64..=1.0,
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = base * u32::try_from(cap_factor).unwrap();
            let prev = Some(Duration::from_nanos(prev_nanos));
            let mut rng = SmallRng::seed_from_u64(seed);
            let e = Exponential::builder()
                .min_delay(base)
                .max_delay(cap)
                .factor(factor)
                .jitter(jitter)
                .build()
                .unwrap();
            prop_assert!(e.next_delay(retry, prev, &mut rng) <= cap * 2);
            let f = full_jitter(base, cap);
            prop_assert!(f.next_delay(retry, prev, &mut rng) <= cap);
            let q = EqualJitter::builder().base(base).cap(cap).build().unwrap();
            let d = q.next_delay(retry, prev, &mut rng);
            prop_assert!(d <= cap);
            prop_assert!(d.as_secs_f64() >= grown(base, 2.0, retry, cap) / 2.0 - 1e-9);
            let c = decorrelated(base, cap);
            let d = c.next_delay(retry, prev, &mut rng);
            prop_assert!(d >= base && d <= cap);
            let t = Ethernet::with_slot(base).unwrap();
            prop_assert!(t.next_delay(retry, prev, &mut rng) <= base * 1023);
        }
    }
}
