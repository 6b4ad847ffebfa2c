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
    /// origin), updating `state` if it is admitted: [`check_holding_back`] with nothing
    /// held back.
    ///
    /// [`check_holding_back`]: Self::check_holding_back
    #[inline]
    fn check(&self, state: &Self::State, now: u64, cost: u32) -> Decision {
        self.check_holding_back(state, now, cost, 0)
    }

    /// Decides a request of `cost` units at time `now` (nanoseconds from the clock's
    /// origin) that may not take the last `held_back` units: it is admitted only if at
    /// least `held_back` units are still free once its cost is taken, and then `state` is
    /// updated; nothing is taken on a rejection.
    ///
    /// This is how a limit sheds from the bottom: a layer passes the units a request's
    /// criticality may not take now (`RecentLevels::held_back` of `overload-signal`), `0`
    /// unless a higher level is active. With `held_back == 0` it must decide exactly as a
    /// limiter without reserves would; a cost of zero is always admitted, whatever is held
    /// back.
    ///
    /// A rejection's `retry_after` is the time until `cost + held_back` units are free, if
    /// nothing else is admitted meanwhile (never zero). When `cost + held_back` exceeds
    /// [`capacity`](Self::capacity) no wait frees that much while the units stay held back:
    /// `retry_after` is then the time until the whole capacity is free (at least 1 ns),
    /// and the caller, who knows when the hold may end, says more.
    fn check_holding_back(
        &self,
        state: &Self::State,
        now: u64,
        cost: u32,
        held_back: u64,
    ) -> Decision;

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
