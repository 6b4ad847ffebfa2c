//! Building a [`KeyedLimiter`]: its defaults, [`KeyedLimiterBuilder`] and the rules
//! [`build`](KeyedLimiterBuilder::build) checks.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock, saturating_nanos};

use super::map::KeyedLimiter;
use crate::algorithm::Limiter;

/// The default cap on tracked keys; see
/// [`RateLimitLayer::DEFAULT_MAX_KEYS`](crate::RateLimitLayer::DEFAULT_MAX_KEYS).
pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;

/// The default interval between sweeps; see
/// [`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`](crate::RateLimitLayer::DEFAULT_SWEEP_INTERVAL).
pub(crate) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

impl<L: Limiter, K: Hash + Eq> KeyedLimiter<L, K, TokioClock> {
    /// A keyed limiter with the defaults: at most 100 000 keys
    /// ([`RateLimitLayer::DEFAULT_MAX_KEYS`](crate::RateLimitLayer::DEFAULT_MAX_KEYS)), idle
    /// keys swept at most once a second per shard
    /// ([`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`](crate::RateLimitLayer::DEFAULT_SWEEP_INTERVAL)),
    /// time from [`TokioClock`], no keys gauge.
    ///
    /// [`TokioClock`]: crate::clock::TokioClock
    pub fn new(limiter: L) -> Self {
        Self::assemble(
            limiter,
            TokioClock::new(),
            DEFAULT_MAX_KEYS,
            saturating_nanos(DEFAULT_SWEEP_INTERVAL),
        )
    }

    /// A builder starting from the defaults of [`new`](Self::new).
    pub fn builder(limiter: L) -> KeyedLimiterBuilder<L, K> {
        KeyedLimiterBuilder {
            limiter,
            clock: TokioClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            key: PhantomData,
        }
    }
}

/// Builds a [`KeyedLimiter`]; from [`KeyedLimiter::builder`].
#[must_use]
pub struct KeyedLimiterBuilder<L, K, C = TokioClock> {
    limiter: L,
    clock: C,
    max_keys: usize,
    sweep_interval: Duration,
    key: PhantomData<fn() -> K>,
}

impl<L: Limiter, K: Hash + Eq, C: Clock> KeyedLimiterBuilder<L, K, C> {
    /// Where the limiter reads the time. Default: [`TokioClock`], which follows tokio's
    /// paused time in tests.
    ///
    /// [`TokioClock`]: crate::clock::TokioClock
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedLimiterBuilder<L, K, C2> {
        KeyedLimiterBuilder {
            limiter: self.limiter,
            clock,
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            key: PhantomData,
        }
    }

    /// The cap on tracked keys (rounded up to a multiple of the shard count); see
    /// [`KeyedLimiter`] for what happens at the cap. Default: 100 000
    /// ([`RateLimitLayer::DEFAULT_MAX_KEYS`](crate::RateLimitLayer::DEFAULT_MAX_KEYS)).
    pub const fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The interval between sweeps of idle keys in a shard. Default: one second
    /// ([`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`](crate::RateLimitLayer::DEFAULT_SWEEP_INTERVAL)).
    pub const fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of kind `OutOfRange` when `max_keys` or `sweep_interval` is zero.
    pub fn build(self) -> Result<KeyedLimiter<L, K, C>, ConfigError> {
        check_settings(self.max_keys, self.sweep_interval)?;
        Ok(KeyedLimiter::assemble(
            self.limiter,
            self.clock,
            self.max_keys,
            saturating_nanos(self.sweep_interval),
        ))
    }
}

/// The rules of [`KeyedLimiterBuilder::build`], shared with the layer's builder.
pub(crate) fn check_settings(max_keys: usize, sweep_interval: Duration) -> Result<(), ConfigError> {
    if max_keys == 0 {
        return Err(ConfigError::out_of_range("max_keys", 0, "at least 1"));
    }
    if sweep_interval.is_zero() {
        // NOTE: a zero interval would sweep a whole shard for every new key: a flood of
        // distinct keys would cost O(cap) per request.
        return Err(ConfigError::out_of_range(
            "sweep_interval",
            sweep_interval,
            "greater than zero",
        ));
    }
    Ok(())
}

impl<L: Limiter + fmt::Debug, K, C: fmt::Debug> fmt::Debug for KeyedLimiterBuilder<L, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiterBuilder")
            .field("limiter", &self.limiter)
            .field("clock", &self.clock)
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .finish()
    }
}
