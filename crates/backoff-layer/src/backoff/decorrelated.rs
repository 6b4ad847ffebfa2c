//! [`Decorrelated`]: AWS's "decorrelated jitter", each wait drawn from the previous one.

use std::time::Duration;

use overload_core::ConfigError;
use rand::{Rng, RngCore};

use super::jitter::FullJitter;
use super::rules::{check_base_cap, secs_to_duration};
use super::strategy::Backoff;

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
