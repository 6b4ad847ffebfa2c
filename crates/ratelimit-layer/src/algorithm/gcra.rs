//! The token bucket, as the generic cell rate algorithm (GCRA) on one atomic word.

// NOTE: the crate's `sync` shim: loom's atomics under `cfg(loom)`, so that the model of
// `LiveTokenBucket` (which converts this word) checks the code that ships.
use overload_core::sync::{AtomicU64, Ordering};
use std::time::Duration;

use overload_core::ConfigError;

use super::limiter::{Decision, Limiter, QuotaStatus};
use super::validate::{non_zero, positive_nanos};

/// A token bucket with rate `R` and burst `B`, implemented as GCRA (the generic cell rate
/// algorithm) on a single `AtomicU64`, lock-free.
///
/// Instead of a token count and a refill timestamp, GCRA keeps one number per key: the
/// *theoretical arrival time* (TAT) at which the bucket will be full again. A unit costs one
/// emission interval `T = period / rate`; a request of cost `n` at time `t` is admitted when
/// `max(TAT, t) + n*T - t <= B*T`, and then TAT moves to `max(TAT, t) + n*T`. The state
/// is updated with one compare-and-swap; a rejection only reads it.
///
/// Guarantees: a fresh key admits `B` units at once; afterwards one unit per `T`; and in any
/// interval of length `L` at most `L / T + B` units are admitted. `T` is rounded down to
/// whole nanoseconds, so the rate is at most one part in `T` (in nanoseconds) generous.
///
/// In `RateLimit-Policy` it advertises its rate over the time its burst takes to refill:
/// `w` is `burst x T` rounded up to whole seconds (at least one), and `q` the units the rate
/// admits over `w`, rounded down, never below the burst; the `RateLimit` field's `r` (up to
/// `burst`) is then never above `q`. `10 per 100 ms` with a burst of 10 is `q=100;w=1`;
/// `300 per second` with a burst of 30 is `q=300;w=1`; `60 per minute` with a burst of 60
/// is `q=60;w=60`. A client that paces itself at `q` per `w` is never rejected; an idle one
/// may send its burst at once besides.
///
/// With criticality ([`RateLimitBuilder::reserves`](crate::RateLimitBuilder::reserves),
/// through [`check_holding_back`](Limiter::check_holding_back)): while a higher level is
/// active (seen within the last 10 seconds), a level `c` stops taking at `share(c) × burst`
/// units left (rounded up). So level `c` and above, sending together under the rate with
/// bursts within the share the level below leaves (`(share(c − 1) − share(c)) × burst`
/// units), are never rejected, whatever the lower levels send: the lower levels never take
/// the bucket below `share(c − 1) × burst`, and below it the refill is theirs alone. It
/// holds from the moment level `c` is active; a level that comes back after 10 seconds
/// quiet finds what the lower levels left (possibly nothing) and waits for the refill,
/// which the lower levels then no longer take, for at most the time `share(c − 1) × burst`
/// units take to come back. Critical-plus, held back from nobody, has the whole bucket.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::algorithm::QuotaStatus;
/// use ratelimit_layer::{Decision, Limiter, TokenBucket};
///
/// // 10 per second, bursts of 5.
/// let bucket = TokenBucket::builder(10).burst(5).build()?;
/// let state = Default::default();
/// for _ in 0..5 {
///     assert!(bucket.check(&state, 0, 1).is_allowed());
/// }
/// assert_eq!(
///     bucket.check(&state, 0, 1),
///     Decision::Reject { retry_after: Duration::from_millis(100) }
/// );
/// assert_eq!(
///     bucket.status(&state, 0),
///     QuotaStatus { remaining: 0, reset: Duration::from_millis(500) }
/// );
/// assert!(bucket.check(&state, 100_000_000, 1).is_allowed());
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    rate: u32,
    period: Duration,
    burst: u32,
    /// `T`, nanoseconds per unit.
    pub(super) emission: u64,
    /// `B * T`, nanoseconds.
    pub(super) tolerance: u64,
}

/// The state of one [`TokenBucket`] key: its theoretical arrival time, in one atomic word.
#[derive(Debug, Default)]
pub struct TokenBucketState {
    pub(super) tat: AtomicU64,
}

impl TokenBucket {
    /// The period the rate is counted over unless [`TokenBucketBuilder::period`] says
    /// otherwise: one second, so that `rate` reads as requests per second, as in the
    /// paper's limits and in `RateLimit-Policy`'s usual `w=1`.
    pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);

    /// A bucket refilled with `rate` units per second ([`DEFAULT_PERIOD`](Self::DEFAULT_PERIOD)),
    /// holding at most `rate` units (one period's worth, as governor's `Quota::per_second`).
    ///
    /// # Errors
    ///
    /// A zero rate, or more than one unit per nanosecond; see [`TokenBucketBuilder::build`].
    pub fn new(rate: u32) -> Result<Self, ConfigError> {
        Self::builder(rate).build()
    }

    /// A builder for a bucket refilled with `rate` units per period, starting from the
    /// defaults of [`new`](Self::new): a period of one second and a burst of `rate`.
    pub const fn builder(rate: u32) -> TokenBucketBuilder {
        TokenBucketBuilder {
            rate,
            period: Self::DEFAULT_PERIOD,
            burst: None,
        }
    }

    /// The rate: units per [`period`](Self::period).
    pub const fn rate(&self) -> u32 {
        self.rate
    }

    /// The period the rate is counted over.
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The burst: the most units admitted at once.
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// The emission interval `T`: the time one unit takes to come back.
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission)
    }
}

/// Builds a [`TokenBucket`]; from [`TokenBucket::builder`].
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::TokenBucket;
///
/// // 5 per 3 seconds, bursts of 2.
/// let bucket = TokenBucket::builder(5)
///     .period(Duration::from_secs(3))
///     .burst(2)
///     .build()?;
/// assert_eq!(bucket.emission_interval(), Duration::from_millis(600));
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct TokenBucketBuilder {
    rate: u32,
    period: Duration,
    burst: Option<u32>,
}

impl TokenBucketBuilder {
    /// The period the rate is counted over (the bucket refills `rate` units per `period`).
    /// Default: one second ([`TokenBucket::DEFAULT_PERIOD`]).
    pub const fn period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// The most units admitted at once, by a bucket that has been idle. Default: the rate
    /// (one period's worth, as governor's `Quota::per_second`).
    pub const fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Builds the bucket.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting, when:
    ///
    /// - `rate` or `burst` is zero, or `period` is zero or longer than 584 years
    ///   (kind `OutOfRange`);
    /// - the rate is above one unit per nanosecond of the period, or `burst` times the
    ///   emission interval exceeds 584 years (kind `Conflict`).
    pub fn build(self) -> Result<TokenBucket, ConfigError> {
        let rate = non_zero("rate", self.rate)?;
        let period_nanos = positive_nanos("period", self.period)?;
        let burst = non_zero("burst", self.burst.unwrap_or(rate))?;
        let emission = period_nanos / u64::from(rate);
        if emission == 0 {
            return Err(ConfigError::conflict(
                "rate",
                format_args!(
                    "rate ({rate}) must be at most one unit per nanosecond of period ({:?})",
                    self.period
                ),
            ));
        }
        let tolerance = emission.checked_mul(u64::from(burst)).ok_or_else(|| {
            ConfigError::conflict(
                "burst",
                format_args!(
                    "burst ({burst}) times the emission interval ({:?}) must be at most 584 years",
                    Duration::from_nanos(emission)
                ),
            )
        })?;
        Ok(TokenBucket {
            rate,
            period: self.period,
            burst,
            emission,
            tolerance,
        })
    }
}

impl Limiter for TokenBucket {
    type State = TokenBucketState;

    #[inline]
    fn check_holding_back(
        &self,
        state: &TokenBucketState,
        now: u64,
        cost: u32,
        held_back: u64,
    ) -> Decision {
        if cost > self.burst {
            return Decision::OverCapacity {
                capacity: u64::from(self.burst),
            };
        }
        // NOTE: cost <= burst, so cost * T <= B * T, which `new` checked fits in a u64.
        let increment = u64::from(cost) * self.emission;
        // What the request may bring the backlog up to: the tolerance less the time the
        // held-back units take to come back (nothing is held back from a free request).
        let limit = if held_back == 0 || increment == 0 {
            self.tolerance
        } else {
            // NOTE: held_back is capped at the burst, so the product fits as B * T does.
            self.tolerance - held_back.min(u64::from(self.burst)) * self.emission
        };
        let mut tat = state.tat.load(Ordering::Acquire);
        loop {
            let base = tat.max(now);
            let ahead = base.saturating_add(increment) - now;
            if ahead > limit {
                let wait = if increment <= limit {
                    ahead - limit
                } else {
                    // NOTE: cost + held_back > burst: no backlog is short enough; the time
                    // until the bucket is full.
                    (base - now).max(1)
                };
                return Decision::Reject {
                    retry_after: Duration::from_nanos(wait),
                };
            }
            if increment == 0 {
                // A free request: nothing to store.
                return Decision::Allow;
            }
            match state.tat.compare_exchange_weak(
                tat,
                now + ahead,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Decision::Allow,
                Err(actual) => tat = actual,
            }
        }
    }

    fn status(&self, state: &TokenBucketState, now: u64) -> QuotaStatus {
        let backlog = state.tat.load(Ordering::Acquire).saturating_sub(now);
        QuotaStatus {
            remaining: self.tolerance.saturating_sub(backlog) / self.emission,
            reset: Duration::from_nanos(backlog),
        }
    }

    #[inline]
    fn is_idle(&self, state: &TokenBucketState, now: u64) -> bool {
        state.tat.load(Ordering::Acquire) <= now
    }

    fn quota(&self) -> u64 {
        u64::from(self.rate)
    }

    fn window(&self) -> Duration {
        self.period
    }

    fn capacity(&self) -> u64 {
        u64::from(self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overload_core::ConfigErrorKind::{Conflict, OutOfRange};

    const MS: u64 = 1_000_000;

    fn bucket(rate: u32, burst: u32) -> TokenBucket {
        TokenBucket::builder(rate).burst(burst).build().unwrap()
    }

    #[test]
    fn issue_case_ten_per_second_burst_five() {
        // Issue 5: R = 10/s, B = 5 admits exactly 5 at once, then 1 per 100 ms.
        let bucket = bucket(10, 5);
        let state = TokenBucketState::default();
        for i in 0..5 {
            assert_eq!(bucket.check(&state, 0, 1), Decision::Allow);
            assert_eq!(
                bucket.status(&state, 0),
                QuotaStatus {
                    remaining: 4 - i,
                    reset: Duration::from_millis(100 * (i + 1)),
                }
            );
        }
        assert_eq!(
            bucket.check(&state, 0, 1),
            Decision::Reject {
                retry_after: Duration::from_millis(100),
            }
        );
        assert_eq!(
            bucket.status(&state, 0),
            QuotaStatus {
                remaining: 0,
                reset: Duration::from_millis(500),
            }
        );
        for step in 1..=20u64 {
            let t = step * 100 * MS;
            assert!(
                !bucket.check(&state, t - 1, 1).is_allowed(),
                "just before {step}"
            );
            assert!(bucket.check(&state, t, 1).is_allowed(), "at step {step}");
            assert!(
                !bucket.check(&state, t, 1).is_allowed(),
                "twice at step {step}"
            );
        }
    }

    #[test]
    fn refills_to_burst_and_no_further() {
        let bucket = bucket(10, 5);
        let state = TokenBucketState::default();
        assert!(bucket.check(&state, 0, 5).is_allowed());
        assert!(!bucket.is_idle(&state, 499 * MS));
        assert!(bucket.is_idle(&state, 500 * MS));
        // An hour later the bucket holds 5, not 36 000.
        let t = 3_600_000 * MS;
        assert!(bucket.check(&state, t, 5).is_allowed());
        assert!(!bucket.check(&state, t, 1).is_allowed());
    }

    #[test]
    fn weighted_costs() {
        let bucket = bucket(10, 5);
        let state = TokenBucketState::default();
        assert!(bucket.check(&state, 0, 3).is_allowed());
        assert_eq!(
            bucket.check(&state, 0, 3),
            Decision::Reject {
                retry_after: Duration::from_millis(100),
            }
        );
        assert_eq!(
            bucket.status(&state, 0),
            QuotaStatus {
                remaining: 2,
                reset: Duration::from_millis(300),
            }
        );
        // An hour on, the bucket is full again.
        assert_eq!(
            bucket.status(&state, 3_600_000 * MS),
            QuotaStatus {
                remaining: 5,
                reset: Duration::ZERO,
            }
        );
        assert!(bucket.check(&state, 0, 2).is_allowed());
        assert_eq!(
            bucket.check(&state, 0, 6),
            Decision::OverCapacity { capacity: 5 }
        );
        // Cost zero is free, even on an empty bucket.
        assert!(bucket.check(&state, 0, 0).is_allowed());
    }

    #[test]
    fn invalid_configurations_name_the_setting() {
        let s = Duration::from_secs(1);
        let err = |b: TokenBucketBuilder| {
            let e = b.build().unwrap_err();
            (e.field(), e.kind(), e.to_string())
        };
        assert_eq!(
            err(TokenBucket::builder(0)),
            ("rate", OutOfRange, "rate must be at least 1, got 0".into())
        );
        assert_eq!(
            err(TokenBucket::builder(1).period(Duration::ZERO)),
            (
                "period",
                OutOfRange,
                "period must be greater than zero, got 0ns".into()
            )
        );
        assert_eq!(
            err(TokenBucket::builder(1).burst(0)),
            (
                "burst",
                OutOfRange,
                "burst must be at least 1, got 0".into()
            )
        );
        assert_eq!(
            err(TokenBucket::builder(2).period(Duration::from_nanos(1))),
            (
                "rate",
                Conflict,
                "rate (2) must be at most one unit per nanosecond of period (1ns)".into()
            )
        );
        assert_eq!(
            err(TokenBucket::builder(1).period(Duration::MAX)).0,
            "period"
        );
        let long = Duration::from_secs(u64::MAX / 1_000_000_000);
        let (field, kind, message) = err(TokenBucket::builder(1).period(long).burst(u32::MAX));
        assert_eq!((field, kind), ("burst", Conflict));
        assert!(message.starts_with("burst (4294967295) times the emission interval"));
        // The defaults: one second, a burst of the rate.
        let b = TokenBucket::new(7).unwrap();
        assert_eq!((b.rate(), b.period(), b.burst()), (7, s, 7));
        assert_eq!(
            TokenBucket::new(1_000_000_000).unwrap().emission_interval(),
            Duration::from_nanos(1)
        );
    }

    #[test]
    fn contended_updates_lose_nothing() {
        let bucket = bucket(1, 1_000);
        let state = TokenBucketState::default();
        let admitted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1_000 {
                        if bucket.check(&state, 0, 1).is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.into_inner(), 1_000);
    }
}
