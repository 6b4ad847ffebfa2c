//! Backoff strategies: how long to wait before each retry.
//!
//! Every strategy implements [`Backoff`], the one trait the retry layer knows. A strategy is
//! immutable configuration shared by every request; what changes from one retry to the next
//! (the retry number, the previous delay, the random generator) is passed in, so a strategy
//! never holds per-request state and two requests never share a jitter sequence.
//!
//! | strategy | delay before retry `n` (`n = 0` for the first retry) | source |
//! |---|---|---|
//! | [`Fixed`] | `T` | the article's baseline client |
//! | [`Exponential`] | `d = min(MinDelay * Factor^n, MaxDelay)`, plus a normal variate with sigma `d * Jitter`, never below zero | the article |
//! | [`FullJitter`] | `U(0, min(cap, base * 2^n))` | AWS architecture blog |
//! | [`EqualJitter`] | `t/2 + U(0, t/2)` with `t = min(cap, base * 2^n)` | AWS architecture blog |
//! | [`Decorrelated`] | `min(cap, U(base, prev * 3))`, `prev` starting at `base` | AWS architecture blog |
//! | [`Ethernet`] | `slot * U{0 .. 2^min(n + 1, 10) - 1}` | IEEE 802.3 binary exponential backoff |
//!
//! Every constructor is fallible and returns [`InvalidBackoff`] for a configuration that makes
//! no sense; no strategy overflows or panics at any retry number (`u32::MAX` included).
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
//! let article = Exponential::default(); // 100 ms, x2, 10% jitter, at most 15 min
//! let first: Vec<Duration> = article.delays(Seeds::from_seed(7).rng()).take(5).collect();
//! assert_eq!(first.len(), 5);
//!
//! let fixed = Fixed::new(Duration::from_millis(100)).unwrap();
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
    /// The retry layer caps a server's `Retry-After` or `grpc-retry-pushback-ms` hint at this
    /// value: a hint can lengthen a wait up to the strategy's maximum, never beyond it.
    /// [`Exponential`]'s jitter may take a single delay slightly above it.
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

/// A strategy's configuration was rejected by its constructor.
///
/// The rules, per field:
///
/// - base delays (`MinDelay`, `base`, `slot`, the fixed interval) must be greater than zero:
///   a zero wait is a retry storm;
/// - a maximum (`MaxDelay`, `cap`) must be at least the base delay;
/// - a growth factor must be finite and at least `1` (a backoff that shrinks is not one);
/// - a jitter ratio must be finite and not negative;
/// - [`Ethernet`]'s largest wait, `slot * 1023`, must fit in a [`Duration`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum InvalidBackoff {
    /// A base delay was zero; the field is named.
    ZeroDelay(&'static str),
    /// The maximum delay was below the base delay.
    MaxBelowBase {
        /// The base delay given.
        base: Duration,
        /// The maximum given.
        max: Duration,
    },
    /// The growth factor was not finite or below `1`.
    Factor(f64),
    /// The jitter ratio was not finite or negative.
    Jitter(f64),
    /// A delay the strategy can produce does not fit in a [`Duration`].
    Overflow,
}

impl fmt::Display for InvalidBackoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidBackoff::ZeroDelay(what) => write!(f, "{what} must be greater than zero"),
            InvalidBackoff::MaxBelowBase { base, max } => write!(
                f,
                "maximum delay ({max:?}) must be at least the base delay ({base:?})"
            ),
            InvalidBackoff::Factor(x) => {
                write!(f, "growth factor must be finite and at least 1, got {x}")
            }
            InvalidBackoff::Jitter(x) => {
                write!(f, "jitter must be finite and not negative, got {x}")
            }
            InvalidBackoff::Overflow => f.write_str("the largest delay does not fit in a duration"),
        }
    }
}

impl std::error::Error for InvalidBackoff {}

fn check_base(what: &'static str, base: Duration) -> Result<(), InvalidBackoff> {
    if base.is_zero() {
        Err(InvalidBackoff::ZeroDelay(what))
    } else {
        Ok(())
    }
}

fn check_max(base: Duration, max: Duration) -> Result<(), InvalidBackoff> {
    if max < base {
        Err(InvalidBackoff::MaxBelowBase { base, max })
    } else {
        Ok(())
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

/// A fixed interval between attempts: the article's baseline, and how not to do it under load.
///
/// Every retry waits the same time, so a fleet of clients that failed together retries
/// together, forever in step.
///
/// Its maximum is its interval, so a server's `Retry-After` cannot lengthen its waits (the
/// retry layer caps hints at the strategy's maximum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed {
    interval: Duration,
}

impl Fixed {
    /// The article's simulation client retries every 100 ms.
    pub const ARTICLE_INTERVAL: Duration = Duration::from_millis(100);

    /// Waits `interval` before every retry.
    ///
    /// # Errors
    ///
    /// [`InvalidBackoff::ZeroDelay`] if `interval` is zero.
    pub const fn new(interval: Duration) -> Result<Self, InvalidBackoff> {
        if interval.is_zero() {
            return Err(InvalidBackoff::ZeroDelay("fixed interval"));
        }
        Ok(Self { interval })
    }

    /// The interval.
    pub const fn interval(&self) -> Duration {
        self.interval
    }
}

impl Default for Fixed {
    /// 100 ms, the article's simulation client.
    fn default() -> Self {
        Self {
            interval: Self::ARTICLE_INTERVAL,
        }
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
/// zero, which matters only for jitter ratios near 1 or above).
///
/// Defaults (the article's): `MinDelay` 100 ms, `MaxDelay` 15 min, `Factor` 2, `Jitter` 0.1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exponential {
    min_delay: Duration,
    max_delay: Duration,
    factor: f64,
    jitter: f64,
}

impl Exponential {
    /// Validates and builds the strategy.
    ///
    /// # Errors
    ///
    /// - [`InvalidBackoff::ZeroDelay`] if `min_delay` is zero;
    /// - [`InvalidBackoff::MaxBelowBase`] if `max_delay < min_delay`;
    /// - [`InvalidBackoff::Factor`] if `factor` is not finite or below 1;
    /// - [`InvalidBackoff::Jitter`] if `jitter` is not finite or negative.
    pub fn new(
        min_delay: Duration,
        max_delay: Duration,
        factor: f64,
        jitter: f64,
    ) -> Result<Self, InvalidBackoff> {
        check_base("minimum delay", min_delay)?;
        check_max(min_delay, max_delay)?;
        if !factor.is_finite() || factor < 1.0 {
            return Err(InvalidBackoff::Factor(factor));
        }
        if !jitter.is_finite() || jitter < 0.0 {
            return Err(InvalidBackoff::Jitter(jitter));
        }
        Ok(Self {
            min_delay,
            max_delay,
            factor,
            jitter,
        })
    }

    /// The article's "blue" curve: 100 ms, factor 2.7, jitter 0.1, at most 10 min.
    pub fn article_blue() -> Self {
        Self {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(600),
            factor: 2.7,
            jitter: 0.1,
        }
    }

    /// The article's "green" curve: 1 s, factor 1.5, jitter 0.1, at most 5 min.
    pub fn article_green() -> Self {
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
    /// The article's defaults: 100 ms, 15 min, factor 2, jitter 0.1.
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(15 * 60),
            factor: 2.0,
            jitter: 0.1,
        }
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

/// "Full jitter": a uniform wait between zero and the exponential bound,
/// `U(0, min(cap, base * 2^n))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FullJitter {
    base: Duration,
    cap: Duration,
}

impl FullJitter {
    /// Validates and builds the strategy.
    ///
    /// # Errors
    ///
    /// [`InvalidBackoff::ZeroDelay`] if `base` is zero; [`InvalidBackoff::MaxBelowBase`] if
    /// `cap < base`.
    pub fn new(base: Duration, cap: Duration) -> Result<Self, InvalidBackoff> {
        check_base("base delay", base)?;
        check_max(base, cap)?;
        Ok(Self { base, cap })
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

/// "Equal jitter": half the exponential bound, plus a uniform share of the other half,
/// `t/2 + U(0, t/2)` with `t = min(cap, base * 2^n)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EqualJitter {
    base: Duration,
    cap: Duration,
}

impl EqualJitter {
    /// Validates and builds the strategy.
    ///
    /// # Errors
    ///
    /// [`InvalidBackoff::ZeroDelay`] if `base` is zero; [`InvalidBackoff::MaxBelowBase`] if
    /// `cap < base`.
    pub fn new(base: Duration, cap: Duration) -> Result<Self, InvalidBackoff> {
        check_base("base delay", base)?;
        check_max(base, cap)?;
        Ok(Self { base, cap })
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

/// "Decorrelated jitter": each wait is drawn between the base and three times the previous
/// wait, `min(cap, U(base, prev * 3))`, with `prev` starting at `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decorrelated {
    base: Duration,
    cap: Duration,
}

impl Decorrelated {
    /// Validates and builds the strategy.
    ///
    /// # Errors
    ///
    /// [`InvalidBackoff::ZeroDelay`] if `base` is zero; [`InvalidBackoff::MaxBelowBase`] if
    /// `cap < base`.
    pub fn new(base: Duration, cap: Duration) -> Result<Self, InvalidBackoff> {
        check_base("base delay", base)?;
        check_max(base, cap)?;
        Ok(Self { base, cap })
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

/// Ethernet's truncated binary exponential backoff: after collision `c` (`c = n + 1` before
/// retry `n`), wait a whole number of slots drawn uniformly from `0 ..= 2^min(c, 10) - 1`.
///
/// The expected wait after collision `c` is `(2^c - 1) / 2` slots (for `c <= 10`); the
/// largest is 1023 slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ethernet {
    slot: Duration,
}

impl Ethernet {
    /// The exponent is truncated at 10, as in IEEE 802.3.
    pub const CEILING: u32 = 10;

    /// Validates and builds the strategy.
    ///
    /// # Errors
    ///
    /// [`InvalidBackoff::ZeroDelay`] if `slot` is zero; [`InvalidBackoff::Overflow`] if
    /// `slot * 1023` does not fit in a [`Duration`].
    pub fn new(slot: Duration) -> Result<Self, InvalidBackoff> {
        check_base("slot time", slot)?;
        if slot.checked_mul((1 << Self::CEILING) - 1).is_none() {
            return Err(InvalidBackoff::Overflow);
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

impl Backoff for Ethernet {
    fn next_delay(&self, retry: u32, _: Option<Duration>, rng: &mut dyn RngCore) -> Duration {
        // NOTE: cannot overflow: `new` checked `slot * 1023`, and slots() <= 1023.
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

    fn all_strategies() -> Vec<Box<dyn Backoff>> {
        vec![
            Box::new(Fixed::default()),
            Box::new(Exponential::default()),
            Box::new(Exponential::new(100 * MS, Duration::from_secs(600), 2.7, 0.1).unwrap()),
            Box::new(Exponential::new(MS, Duration::MAX, 2.7, 0.5).unwrap()),
            Box::new(FullJitter::new(100 * MS, Duration::from_secs(30)).unwrap()),
            Box::new(FullJitter::new(MS, Duration::MAX).unwrap()),
            Box::new(EqualJitter::new(100 * MS, Duration::from_secs(30)).unwrap()),
            Box::new(Decorrelated::new(100 * MS, Duration::from_secs(30)).unwrap()),
            Box::new(Decorrelated::new(MS, Duration::MAX).unwrap()),
            Box::new(Ethernet::new(51 * Duration::from_micros(1)).unwrap()),
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
            Exponential::default(),
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
        let b = Exponential::default();
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
        let b = Exponential::new(100 * MS, Duration::from_secs(1), 2.0, 0.0).unwrap();
        let got: Vec<Duration> = b.delays(Seeds::from_seed(3).rng()).take(6).collect();
        assert_eq!(
            got,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
    }

    #[test]
    fn exponential_is_never_negative_even_with_wild_jitter() {
        let b = Exponential::new(100 * MS, Duration::from_secs(10), 2.0, 3.0).unwrap();
        let seeds = Seeds::from_seed(4);
        let mut zeros = 0;
        for _ in 0..2_000 {
            let d = b.delays(seeds.rng()).nth(2).unwrap();
            if d.is_zero() {
                zeros += 1;
            }
            assert!(d <= Duration::from_secs(20));
        }
        assert!(zeros > 0, "with sigma = 3d some draws must clamp at zero");
    }

    #[test]
    fn fixed_is_fixed() {
        let b = Fixed::new(250 * MS).unwrap();
        assert!(
            b.delays(Seeds::from_seed(5).rng())
                .take(100)
                .all(|d| d == 250 * MS)
        );
        assert_eq!(Fixed::default().interval(), 100 * MS);
    }

    #[test]
    fn full_jitter_bounds_and_mean() {
        let b = FullJitter::new(100 * MS, Duration::from_secs(2)).unwrap();
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
        let b = EqualJitter::new(100 * MS, Duration::from_secs(2)).unwrap();
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
        let b = Decorrelated::new(base, cap).unwrap();
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
        let b = Ethernet::new(slot).unwrap();
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
        let b = Exponential::new(100 * MS, Duration::from_secs(600), 2.7, 0.1).unwrap();
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
    fn invalid_configurations_are_rejected_with_clear_messages() {
        let s = Duration::from_secs(1);
        assert_eq!(
            Fixed::new(Duration::ZERO),
            Err(InvalidBackoff::ZeroDelay("fixed interval"))
        );
        assert_eq!(
            Exponential::new(Duration::ZERO, s, 2.0, 0.1),
            Err(InvalidBackoff::ZeroDelay("minimum delay"))
        );
        assert!(matches!(
            Exponential::new(s, MS, 2.0, 0.1),
            Err(InvalidBackoff::MaxBelowBase { .. })
        ));
        for f in [f64::NAN, f64::INFINITY, 0.5, -2.0, 0.0] {
            assert!(matches!(
                Exponential::new(MS, s, f, 0.1),
                Err(InvalidBackoff::Factor(_))
            ));
        }
        for j in [f64::NAN, f64::INFINITY, -0.1] {
            assert!(matches!(
                Exponential::new(MS, s, 2.0, j),
                Err(InvalidBackoff::Jitter(_))
            ));
        }
        assert!(FullJitter::new(Duration::ZERO, s).is_err());
        assert!(FullJitter::new(s, MS).is_err());
        assert!(EqualJitter::new(Duration::ZERO, s).is_err());
        assert!(EqualJitter::new(s, MS).is_err());
        assert!(Decorrelated::new(Duration::ZERO, s).is_err());
        assert!(Decorrelated::new(s, MS).is_err());
        assert_eq!(
            Ethernet::new(Duration::ZERO),
            Err(InvalidBackoff::ZeroDelay("slot time"))
        );
        assert_eq!(Ethernet::new(Duration::MAX), Err(InvalidBackoff::Overflow));

        assert_eq!(
            Exponential::new(MS, s, 0.5, 0.1).unwrap_err().to_string(),
            "growth factor must be finite and at least 1, got 0.5"
        );
        assert_eq!(
            Exponential::new(s, MS, 2.0, 0.1).unwrap_err().to_string(),
            "maximum delay (1ms) must be at least the base delay (1s)"
        );
        assert_eq!(
            Fixed::new(Duration::ZERO).unwrap_err().to_string(),
            "fixed interval must be greater than zero"
        );
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
            jitter in 0.0f64..2.0,
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = base * u32::try_from(cap_factor).unwrap();
            let prev = Some(Duration::from_nanos(prev_nanos));
            let mut rng = SmallRng::seed_from_u64(seed);
            let e = Exponential::new(base, cap, factor, jitter).unwrap();
            prop_assert!(e.next_delay(retry, prev, &mut rng) <= cap * 2);
            let f = FullJitter::new(base, cap).unwrap();
            prop_assert!(f.next_delay(retry, prev, &mut rng) <= cap);
            let q = EqualJitter::new(base, cap).unwrap();
            let d = q.next_delay(retry, prev, &mut rng);
            prop_assert!(d <= cap);
            prop_assert!(d.as_secs_f64() >= grown(base, 2.0, retry, cap) / 2.0 - 1e-9);
            let c = Decorrelated::new(base, cap).unwrap();
            let d = c.next_delay(retry, prev, &mut rng);
            prop_assert!(d >= base && d <= cap);
            let t = Ethernet::new(base).unwrap();
            prop_assert!(t.next_delay(retry, prev, &mut rng) <= base * 1023);
        }
    }
}
