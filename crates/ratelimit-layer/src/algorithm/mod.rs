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
//! and a keyed map alike. All of them take the time as nanoseconds from a [`Clock`](crate::Clock)
//! and a cost (weight) per request: a heavier request takes more of the quota. A cost of
//! zero is always admitted and consumes nothing.

mod fixed_window;
mod gcra;
mod sliding_window;

use std::fmt;
use std::time::Duration;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::{TokenBucket, TokenBucketState};
pub use sliding_window::{SlidingWindow, SlidingWindowState};

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

/// Why a limiter's configuration was refused.
///
/// The rules, for every algorithm:
///
/// - the rate or quota is not zero ([`ZeroRate`](Self::ZeroRate));
/// - the period or window is not zero ([`ZeroPeriod`](Self::ZeroPeriod));
/// - the token bucket's burst is not zero ([`ZeroBurst`](Self::ZeroBurst));
/// - the token bucket admits at most one unit per nanosecond
///   ([`RateTooHigh`](Self::RateTooHigh));
/// - periods, windows and `burst * emission interval` fit in 584 years of nanoseconds
///   ([`TooLong`](Self::TooLong));
/// - a configured request cost does not exceed the burst (token bucket) or the quota
///   (windows) ([`CostExceedsCapacity`](Self::CostExceedsCapacity)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidLimit {
    /// The rate (token bucket) or quota (windows) is zero.
    ZeroRate,
    /// The period (token bucket) or window (windows) is zero.
    ZeroPeriod,
    /// The token bucket's burst is zero.
    ZeroBurst,
    /// More than one unit per nanosecond.
    RateTooHigh,
    /// A duration does not fit in `u64` nanoseconds.
    TooLong,
    /// A request cost larger than the burst or quota could never be admitted.
    CostExceedsCapacity {
        /// The configured cost.
        cost: u32,
        /// The burst or quota.
        capacity: u64,
    },
}

impl fmt::Display for InvalidLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroRate => f.write_str("rate limit rate (or window quota) must not be zero"),
            Self::ZeroPeriod => f.write_str("rate limit period (or window) must not be zero"),
            Self::ZeroBurst => f.write_str("rate limit burst must not be zero"),
            Self::RateTooHigh => {
                f.write_str("rate limit rate is too high: more than one unit per nanosecond")
            }
            Self::TooLong => f.write_str("rate limit period, window or burst span is too long"),
            Self::CostExceedsCapacity { cost, capacity } => write!(
                f,
                "request cost {cost} exceeds the burst or quota {capacity}, so no such request could ever be admitted"
            ),
        }
    }
}

impl std::error::Error for InvalidLimit {}

/// A duration in whole nanoseconds, if it fits in a `u64`.
fn nanos(d: Duration) -> Result<u64, InvalidLimit> {
    u64::try_from(d.as_nanos()).map_err(|_| InvalidLimit::TooLong)
}
