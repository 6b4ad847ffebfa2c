//! The one clock abstraction of the workspace: where every limiter, budget and window
//! reads the time.
//!
//! Time is a `u64` of nanoseconds since an origin the clock chooses, which lasts 584 years
//! and lets a whole time-stamped state fit in one atomic word. Layer code never reads
//! `std::time::Instant`; it reads a [`Clock`]:
//!
//! - [`TokioClock`], the default everywhere, reads [`tokio::time::Instant`], so tests that
//!   pause tokio's time (`#[tokio::test(start_paused = true)]`, `tokio::time::advance`)
//!   move every limiter, budget and histogram with it;
//! - [`CoarseClock`] reads the operating system's coarse monotonic clock: a few nanoseconds
//!   instead of tens, in steps of the kernel's tick (1 to 10 ms). Opt in where the clock read
//!   is most of the cost (a retry budget, a histogram on every request) and slots of 10 ms
//!   or more make a tick's lateness irrelevant; it does not follow tokio's paused time;
//! - `FakeClock` (with the `test-util` feature) moves only when told to, for tests that run
//!   without a tokio runtime, and for property and model tests.
//!
//! The time of day, which a deadline on the wire needs, is read through [`WallClock`]:
//! [`SystemWallClock`] by default, [`TokioWallClock`] in simulations and tests.
//!
//! Implement [`Clock`] yourself to read another source, for example a TSC-based clock where
//! the operating system's monotonic clock is slow to read.
//!
//! # How the layers take a clock
//!
//! One rule across the workspace: **a clock read on the request path is never a virtual
//! call.** Every type that reads the time for each request (a [`window`](crate::window),
//! `overload-signal`'s attempt histogram, `backoff-layer`'s retry budget, `ratelimit-layer`'s
//! limiters and adaptive limit) takes its clock as a type parameter, `C: Clock =
//! TokioClock`, and a builder's `.clock(..)` changes the type it builds: the read is inlined
//! (`CoarseClock`'s costs a few nanoseconds, a vtable call and the lost inlining would
//! double it). A layer that already makes its per-request decision through a trait object
//! of its own erases the clock there, inside the decision (`RateLimitLayer`, whose builder
//! takes the clock as a parameter and whose layer does not carry it), so the type a user
//! names stays short; the layers that decide in place carry it (`OverloadSignal<S, C>`,
//! `AdaptiveLimit<S, C>`), defaulted, so that naming them without a test clock is
//! unchanged. A type that reads the time only off the request path (the client-side
//! throttle, read by its ticker and when a destination first fills the table) takes it
//! erased, as `Box<dyn Clock>`, and its type names no clock.
//!
//! ```
//! use std::time::Duration;
//! use overload_core::clock::{Clock, TokioClock};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let clock = TokioClock::new();
//! tokio::time::advance(Duration::from_millis(250)).await;
//! assert_eq!(clock.now(), 250_000_000);
//! # }
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// A monotonic source of time: nanoseconds since an origin of the clock's choosing.
///
/// Implementations must never go backwards (callers tolerate a clock that stands still)
/// and must be cheap: the clock is read on every request.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds elapsed since this clock's origin.
    fn now(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

/// [`tokio::time::Instant`], measured from when the clock was made.
///
/// It stops when a test pauses tokio's time and moves with `tokio::time::advance`. It
/// reads the operating system's monotonic clock otherwise: cheap where `clock_gettime`
/// runs in the vDSO, tens of nanoseconds on some virtual machines (see the workspace's
/// `BENCHMARKS.md`).
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    /// The same as [`TokioClock::new`]: the origin is now.
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> u64 {
        saturating_nanos(Instant::now().saturating_duration_since(self.origin))
    }
}

/// The operating system's coarse monotonic clock, measured from when the clock was made.
///
/// On Linux, Android and FreeBSD it reads `CLOCK_MONOTONIC_COARSE`, which the kernel updates
/// once a tick: reading it copies a value the kernel keeps (measured at 7 to 8 ns on a
/// virtual machine whose precise clock, the one [`TokioClock`] reads, costs 30 to 40 ns),
/// and it moves in steps of [`resolution`](Self::resolution) (4 ms on a kernel built with
/// `HZ=250`). Elsewhere it reads the same clock as [`TokioClock`], at the same cost.
///
/// What choosing it changes:
///
/// - **Up to one tick late.** A record or a deposit made just after a slot boundary can be
///   counted in the slot before, so a window slides up to one tick late. With the retry
///   budget's slots (10 ms at the shortest, 1 s by default) or the attempt histogram's
///   (1 s by default) that is a fraction of a slot; with slots close to the tick it is not,
///   so keep slots several ticks wide.
/// - **Not paused by tokio.** It ignores `tokio::time::pause()`: tests of code that uses it
///   inject `FakeClock` (feature `test-util`) instead, through the same type parameter.
/// - **No thread, no state.** The kernel keeps the time; nothing runs in the background and
///   nothing needs to be started or stopped, and it keeps time while the process is starved
///   of CPU, which is when an overload layer needs it.
///
/// ```
/// use overload_core::clock::{Clock, CoarseClock};
///
/// let clock = CoarseClock::new();
/// let before = clock.now();
/// assert!(clock.now() >= before);
/// assert!(CoarseClock::resolution() <= std::time::Duration::from_millis(100));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CoarseClock {
    origin: u64,
}

impl CoarseClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: coarse::now(),
        }
    }

    /// The step in which the clock moves: the kernel's tick where the coarse clock is read
    /// (1 to 10 ms), 1 ns where the precise clock is read instead.
    pub fn resolution() -> Duration {
        coarse::resolution()
    }
}

impl Default for CoarseClock {
    /// The same as [`CoarseClock::new`]: the origin is now.
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        coarse::now().saturating_sub(self.origin)
    }
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
mod coarse {
    use std::time::Duration;

    use rustix::time::{ClockId, Timespec, clock_getres, clock_gettime};

    fn nanos(t: Timespec) -> u64 {
        // A monotonic clock never reads negative; saturate rather than trust that blindly.
        let secs = u64::try_from(t.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    }

    #[inline]
    pub(super) fn now() -> u64 {
        nanos(clock_gettime(ClockId::MonotonicCoarse))
    }

    pub(super) fn resolution() -> Duration {
        Duration::from_nanos(nanos(clock_getres(ClockId::MonotonicCoarse)).max(1))
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
mod coarse {
    use std::sync::OnceLock;
    use std::time::Duration;

    use tokio::time::Instant;

    /// Where no coarse clock is known: the precise clock, since a process-wide origin.
    pub(super) fn now() -> u64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(Instant::now);
        super::saturating_nanos(Instant::now().saturating_duration_since(origin))
    }

    pub(super) fn resolution() -> Duration {
        Duration::from_nanos(1)
    }
}

/// The time of day, for what must mean the same on two hosts: a deadline on the wire.
///
/// A [`Clock`] measures intervals on one host; a deadline another host reads needs the time
/// of day, which both hosts keep (with NTP or a provider's time service) to within some
/// skew. Layer code reads it only through a `WallClock`:
///
/// - [`SystemWallClock`], the default everywhere: the operating system's time of day,
///   stepped and slewed by its time service as it is;
/// - [`TokioWallClock`]: the time of day when it was made, moved on by tokio's clock since,
///   so that it follows tokio's paused time. For simulations and tests, where both ends of
///   a deadline must read one clock that tokio moves, and for tests of clock skew
///   ([`TokioWallClock::starting_at`] a time ahead or behind).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use overload_core::clock::{SystemWallClock, TokioWallClock, WallClock};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let system = SystemWallClock;
/// assert!(system.now() > SystemTime::UNIX_EPOCH);
///
/// // A clock five seconds ahead of this host's, that moves with tokio's paused time.
/// let start = SystemTime::now() + Duration::from_secs(5);
/// let ahead = TokioWallClock::starting_at(start);
/// tokio::time::advance(Duration::from_millis(250)).await;
/// assert_eq!(ahead.now(), start + Duration::from_millis(250));
/// # }
/// ```
pub trait WallClock: Send + Sync + 'static {
    /// The time of day.
    fn now(&self) -> SystemTime;
}

impl<W: WallClock + ?Sized> WallClock for Arc<W> {
    #[inline]
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

/// The operating system's time of day ([`SystemTime::now`]): the default [`WallClock`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SystemWallClock;

impl WallClock for SystemWallClock {
    #[inline]
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A [`WallClock`] that reads the time of day when it was made, plus the time tokio's clock
/// has measured since: it stops when a test pauses tokio's time and moves with
/// `tokio::time::advance`.
///
/// For simulations and tests only: it never sees the system's clock stepped after it was
/// made (a host's first time synchronisation after boot, an operator's correction), so in
/// production it would keep the error it was made with. [`SystemWallClock`] is the default
/// everywhere.
#[derive(Clone, Copy, Debug)]
pub struct TokioWallClock {
    start: SystemTime,
    origin: Instant,
}

impl TokioWallClock {
    /// A clock that reads the system's time of day now, and moves with tokio's clock.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// A clock that reads `start` now, and moves with tokio's clock: a host whose clock is
    /// ahead of this one's (`start` in the future) or behind it, for tests of clock skew.
    pub fn starting_at(start: SystemTime) -> Self {
        Self {
            start,
            origin: Instant::now(),
        }
    }
}

impl Default for TokioWallClock {
    /// The same as [`TokioWallClock::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl WallClock for TokioWallClock {
    #[inline]
    fn now(&self) -> SystemTime {
        let since = Instant::now().saturating_duration_since(self.origin);
        self.start.checked_add(since).unwrap_or(self.start)
    }
}

/// `duration` in whole nanoseconds, saturating at `u64::MAX` (584 years).
///
/// Cheaper than `u64::try_from(duration.as_nanos())`, whose 128-bit arithmetic costs more
/// than the rest of a limiter decision.
#[inline]
pub const fn saturating_nanos(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(duration.subsec_nanos() as u64)
}

#[cfg(any(test, feature = "test-util"))]
pub use fake::FakeClock;

#[cfg(any(test, feature = "test-util"))]
mod fake {
    use std::fmt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::{Clock, saturating_nanos};

    /// A clock that moves only when told to; clones share the same time. Starts at zero.
    ///
    /// Only with the `test-util` feature.
    ///
    /// ```
    /// use std::time::Duration;
    /// use overload_core::clock::{Clock, FakeClock};
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

        /// Moves the clock forward by `by`, saturating at the end of time.
        pub fn advance(&self, by: Duration) {
            let by = saturating_nanos(by);
            let _ = self
                .nanos
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    Some(n.saturating_add(by))
                });
        }

        /// Sets the clock to `at` after its origin. Setting it backwards is ignored: clocks
        /// are monotonic.
        pub fn set(&self, at: Duration) {
            self.nanos.fetch_max(saturating_nanos(at), Ordering::AcqRel);
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
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::new();
        assert_eq!(clock.now(), 0);
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.now(), 250_000_000);
        let shared: Arc<dyn Clock> = Arc::new(clock);
        assert_eq!(shared.now(), 250_000_000);
    }

    #[test]
    fn coarse_clock_is_monotonic_and_moves() {
        let clock = CoarseClock::new();
        let resolution = CoarseClock::resolution();
        assert!(resolution >= Duration::from_nanos(1));
        assert!(resolution <= Duration::from_millis(100), "{resolution:?}");
        let mut last = clock.now();
        // Spin (bounded) until the clock has moved by at least one step: it must move, and
        // never backwards.
        let mut moved = false;
        for _ in 0..50_000_000u64 {
            let now = clock.now();
            assert!(now >= last);
            last = now;
            if now > 0 {
                moved = true;
                break;
            }
        }
        assert!(moved, "the coarse clock never moved");
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_wall_clock_follows_paused_time_from_its_start() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let clock = TokioWallClock::starting_at(start);
        assert_eq!(clock.now(), start);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(clock.now(), start + Duration::from_millis(1_500));
        let shared: Arc<dyn WallClock> = Arc::new(clock);
        assert_eq!(shared.now(), start + Duration::from_millis(1_500));
        // The system's clock and a fresh tokio one agree to within the test's own run.
        let (system, tokio) = (SystemWallClock.now(), TokioWallClock::new().now());
        let apart = system
            .duration_since(tokio)
            .or_else(|e| Ok::<_, ()>(e.duration()))
            .unwrap();
        assert!(apart < Duration::from_secs(1), "{apart:?}");
    }

    #[test]
    fn saturating_nanos_matches_as_nanos_and_saturates() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(1500),
            Duration::from_secs(584 * 365 * 24 * 3600),
        ] {
            assert_eq!(u128::from(saturating_nanos(d)), d.as_nanos());
        }
        assert_eq!(saturating_nanos(Duration::MAX), u64::MAX);
    }
}
