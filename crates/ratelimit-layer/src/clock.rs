//! Where limiters read the time from.
//!
//! Limiters work in whole nanoseconds since an origin the clock chooses (a `u64`, which
//! lasts 584 years), so that a token bucket's whole state fits in one atomic word.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A monotonic source of time for a limiter.
///
/// Implementations must never go backwards; limiters tolerate a clock that stands still.
///
/// Reading the clock is most of a token bucket decision's cost. [`RealClock`] reads tokio's
/// clock, which is the OS monotonic clock: cheap where `clock_gettime` runs in the vDSO,
/// tens of nanoseconds on some virtual machines (see this crate's benchmarks). Where that
/// matters more than pausing time in tests, implement this trait over a TSC-based clock
/// such as the `quanta` crate's.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds elapsed since this clock's origin.
    fn now(&self) -> u64;
}

/// The real clock: [`tokio::time::Instant`], measured from when the clock was made.
///
/// Because it reads tokio's clock, it stops when a test pauses time
/// (`tokio::time::pause()` or `#[tokio::test(start_paused = true)]`) and moves with
/// `tokio::time::advance`.
#[derive(Clone, Copy, Debug)]
pub struct RealClock {
    origin: Instant,
}

impl RealClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RealClock {
    #[inline]
    fn now(&self) -> u64 {
        // NOTE: saturating: 584 years of uptime fit in a u64 of nanoseconds.
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::{Clock, FakeClock};
///
/// let clock = FakeClock::new();
/// let seen_by_limiter = clock.clone();
/// clock.advance(Duration::from_millis(150));
/// assert_eq!(seen_by_limiter.now(), 150_000_000);
/// ```
#[derive(Clone, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (saturating at the end of time).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the clock to `at` after its origin. Setting it backwards is ignored, because
    /// clocks are monotonic.
    pub fn set(&self, at: Duration) {
        let at = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_max(at, Ordering::AcqRel);
    }
}

impl Clock for FakeClock {
    #[inline]
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::Acquire)
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeClock")
            .field("nanos", &self.now())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_is_shared_and_monotonic() {
        let a = FakeClock::new();
        let b = a.clone();
        a.advance(Duration::from_secs(1));
        assert_eq!(b.now(), 1_000_000_000);
        b.set(Duration::from_millis(500));
        assert_eq!(a.now(), 1_000_000_000, "set backwards is ignored");
        b.set(Duration::from_secs(2));
        assert_eq!(a.now(), 2_000_000_000);
        a.advance(Duration::MAX);
        assert_eq!(a.now(), u64::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn real_clock_follows_paused_tokio_time() {
        let clock = RealClock::new();
        assert_eq!(clock.now(), 0);
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.now(), 250_000_000);
    }
}
