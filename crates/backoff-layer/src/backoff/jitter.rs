//! AWS's "full jitter" ([`FullJitter`]) and "equal jitter" ([`EqualJitter`]): uniform
//! draws under an exponential bound.

use std::time::Duration;

use overload_core::ConfigError;
use rand::{Rng, RngCore};

use super::rules::{check_base_cap, grown, secs_to_duration};
use super::strategy::Backoff;

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
