//! The three rate-limiting algorithms, behind one trait.
//!
//! | algorithm | state per key | admits at most, in any interval of length `L` | notes |
//! |---|---|---|---|
//! | [`TokenBucket`] (GCRA) | one `AtomicU64`, lock-free | `L / T + B` units, `T` the emission interval, `B` the burst | smooth; no edge effect |
//! | [`FixedWindow`] | window number and count, under a per-key mutex | `2 * quota` units when `L` straddles a window edge | cheapest to explain; bursts at edges |
//! | [`SlidingWindow`] | window number and two counts, under a per-key mutex | about `quota` units per window | the paper's estimate, no stored timestamps |
//!
//! A limiter ([`Limiter`]) holds only configuration; the state it updates is a separate
//! value ([`Limiter::State`]), one per key, so one limiter serves a single global limit
//! and a keyed map alike. All of them take the time as nanoseconds from a
//! [`Clock`] and a cost (weight) per request: a heavier request takes more of the quota. A
//! cost of zero is always admitted and consumes nothing.
//!
//! Each algorithm takes what it cannot do without in `new` (the rate, or the quota) and
//! the rest through its builder; every invalid setting is a [`ConfigError`] naming it:
//!
//! ```
//! use std::time::Duration;
//! use ratelimit_layer::{FixedWindow, SlidingWindow, TokenBucket};
//!
//! // 100 per second, bursts of 100 (the defaults).
//! let bucket = TokenBucket::new(100)?;
//! // 100 per second, bursts of 20.
//! let bucket = TokenBucket::builder(100).burst(20).build()?;
//! // 600 per minute in a sliding window.
//! let sliding = SlidingWindow::builder(600).window(Duration::from_secs(60)).build()?;
//! // A zero burst is refused by name.
//! let err = TokenBucket::builder(100).burst(0).build().unwrap_err();
//! assert_eq!(err.to_string(), "burst must be at least 1, got 0");
//! # let _ = (bucket, sliding, FixedWindow::new(1)?);
//! # Ok::<(), ratelimit_layer::ConfigError>(())
//! ```
//!
//! [`Clock`]: https://docs.rs/overload-signal/0.1/overload_signal/clock/trait.Clock.html

mod fixed_window;
mod gcra;
mod sliding_window;

use std::time::Duration;

use overload_signal::ConfigError;

pub use fixed_window::{FixedWindow, FixedWindowBuilder, FixedWindowState};
pub use gcra::{TokenBucket, TokenBucketBuilder, TokenBucketState};
pub use sliding_window::{SlidingWindow, SlidingWindowBuilder, SlidingWindowState};

/// A rate-limiting algorithm: decides whether a request of some cost is admitted now.
///
/// The limiter itself is immutable configuration; everything that changes lives in
/// [`State`](Self::State), one value per key. Implementations must be safe to call from
/// many threads on the same state at once.
///
/// [`check`](Self::check) is the hot path and computes only the decision (and, for a
/// rejection, when to retry); [`status`](Self::status) computes what the `RateLimit` field
/// reports, only when a response needs it.
pub trait Limiter: Send + Sync + 'static {
    /// The per-key state. `Default` is the state of a key never seen: full quota.
    type State: Default + Send + Sync + 'static;

    /// Decides a request of `cost` units at time `now` (nanoseconds from the clock's
    /// origin), updating `state` if it is admitted.
    fn check(&self, state: &Self::State, now: u64, cost: u32) -> Decision;

    /// What is left of the quota in `state` at `now`, and when it is whole again.
    fn status(&self, state: &Self::State, now: u64) -> QuotaStatus;

    /// Whether `state` at `now` behaves exactly like a fresh `State::default()`, so that
    /// forgetting it loses nothing. Keyed limiters evict such keys.
    fn is_idle(&self, state: &Self::State, now: u64) -> bool;

    /// The quota advertised in `RateLimit-Policy` (`q`): units per [`window`](Self::window).
    fn quota(&self) -> u64;

    /// The window advertised in `RateLimit-Policy` (`w`).
    fn window(&self) -> Duration;

    /// The largest cost a request may have and still be admitted some day.
    fn capacity(&self) -> u64;
}

/// What a limiter decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Decision {
    /// Admitted; its cost has been taken from the quota.
    Allow,
    /// Rejected; nothing was taken from the quota.
    Reject {
        /// The earliest time from now at which the same request would be admitted, if
        /// nothing else is admitted meanwhile.
        retry_after: Duration,
    },
    /// Rejected, and never admissible: the cost exceeds the limiter's
    /// [`capacity`](Limiter::capacity).
    OverCapacity {
        /// The limiter's capacity.
        capacity: u64,
    },
}

impl Decision {
    /// Whether the request was admitted.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allow)
    }
}

/// What is left of a quota: the `r` and `t` of the `RateLimit` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaStatus {
    /// Whole units that could be admitted now.
    pub remaining: u64,
    /// Time until the quota is whole again (for the window algorithms: until the current
    /// window ends).
    pub reset: Duration,
}

/// `duration` in whole nanoseconds, or an error naming `field` if it is zero or does not
/// fit in a `u64` (584 years).
fn positive_nanos(field: &'static str, duration: Duration) -> Result<u64, ConfigError> {
    if duration.is_zero() {
        return Err(ConfigError::out_of_range(
            field,
            duration,
            "greater than zero",
        ));
    }
    u64::try_from(duration.as_nanos())
        .map_err(|_| ConfigError::out_of_range(field, duration, "at most 584 years"))
}

/// `value` if it is not zero, or an error naming `field`.
fn non_zero(field: &'static str, value: u32) -> Result<u32, ConfigError> {
    if value == 0 {
        return Err(ConfigError::out_of_range(field, value, "at least 1"));
    }
    Ok(value)
}
