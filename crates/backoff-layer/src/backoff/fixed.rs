//! [`Fixed`]: the same wait before every retry.

use std::time::Duration;

use overload_core::ConfigError;
use rand::RngCore;

use super::rules::positive;
use super::strategy::Backoff;

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
