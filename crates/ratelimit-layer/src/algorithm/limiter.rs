//! The [`Limiter`] trait every algorithm implements, and what it answers.

use std::time::Duration;

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

    /// The limiter's rate: units admitted per [`window`](Self::window), in the long run
    /// (a token bucket's rate per its period, a window's quota).
    fn quota(&self) -> u64;

    /// The window the [`quota`](Self::quota) is counted over.
    fn window(&self) -> Duration;

    /// The most units the limiter holds at once, and so the largest cost a request may have
    /// and still be admitted some day (a token bucket's burst, a window's quota). A request
    /// above it is answered `413`, never `429`.
    fn capacity(&self) -> u64;

    // NOTE: `RateLimit-Policy` is derived from the three, the same way for every limiter:
    // `w` is the time `capacity` takes to refill at `quota` per `window`, rounded up to
    // whole seconds (at least one), and `q` is what `quota` per `window` admits over `w`,
    // rounded down; so `q >= capacity >= r` (the `RateLimit` field's remaining units, which
    // `status` must keep within `capacity`). See `rate_limit::state::policy_window`.
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
