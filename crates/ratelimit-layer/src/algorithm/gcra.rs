//! The token bucket, as the generic cell rate algorithm (GCRA) on one atomic word.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Decision, InvalidLimit, Limiter, QuotaStatus, nanos};

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
/// In `RateLimit-Policy` it advertises `q = rate` per `w = period`; the burst shows in the
/// `RateLimit` field's `r`, which can be up to `burst`.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::{Decision, Limiter, QuotaStatus, TokenBucket};
///
/// // 10 per second, bursts of 5.
/// let bucket = TokenBucket::per_second(10, 5)?;
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
/// # Ok::<(), ratelimit_layer::InvalidLimit>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    rate: u32,
    period: Duration,
    burst: u32,
    /// `T`, nanoseconds per unit.
    emission: u64,
    /// `B * T`, nanoseconds.
    tolerance: u64,
}

/// The state of one [`TokenBucket`] key: its theoretical arrival time, in one atomic word.
#[derive(Debug, Default)]
pub struct TokenBucketState {
    tat: AtomicU64,
}

impl TokenBucket {
    /// A bucket refilled with `rate` units per `period`, holding at most `burst` units.
    ///
    /// # Errors
    ///
    /// Zero rate, zero period, zero burst, more than one unit per nanosecond, or a
    /// `burst * period / rate` longer than 584 years; see [`InvalidLimit`].
    pub fn new(rate: u32, period: Duration, burst: u32) -> Result<Self, InvalidLimit> {
        if rate == 0 {
            return Err(InvalidLimit::ZeroRate);
        }
        if period.is_zero() {
            return Err(InvalidLimit::ZeroPeriod);
        }
        if burst == 0 {
            return Err(InvalidLimit::ZeroBurst);
        }
        let emission = nanos(period)? / u64::from(rate);
        if emission == 0 {
            return Err(InvalidLimit::RateTooHigh);
        }
        let tolerance = emission
            .checked_mul(u64::from(burst))
            .ok_or(InvalidLimit::TooLong)?;
        Ok(Self {
            rate,
            period,
            burst,
            emission,
            tolerance,
        })
    }

    /// A bucket refilled with `rate` units per second, holding at most `burst` units.
    ///
    /// # Errors
    ///
    /// As [`TokenBucket::new`].
    pub fn per_second(rate: u32, burst: u32) -> Result<Self, InvalidLimit> {
        Self::new(rate, Duration::from_secs(1), burst)
    }

    /// The rate: units per [`period`](Self::period).
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The period the rate is counted over.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The burst: the most units admitted at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The emission interval `T`: the time one unit takes to come back.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission)
    }
}

impl Limiter for TokenBucket {
    type State = TokenBucketState;

    #[inline]
    fn check(&self, state: &TokenBucketState, now: u64, cost: u32) -> Decision {
        if cost > self.burst {
            return Decision::OverCapacity {
                capacity: u64::from(self.burst),
            };
        }
        // NOTE: cost <= burst, so cost * T <= B * T, which `new` checked fits in a u64.
        let increment = u64::from(cost) * self.emission;
        let mut tat = state.tat.load(Ordering::Acquire);
        loop {
            let base = tat.max(now);
            let ahead = base.saturating_add(increment) - now;
            if ahead > self.tolerance {
                return Decision::Reject {
                    retry_after: Duration::from_nanos(ahead - self.tolerance),
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

    const MS: u64 = 1_000_000;

    #[test]
    fn issue_case_ten_per_second_burst_five() {
        // Issue 5: R = 10/s, B = 5 admits exactly 5 at once, then 1 per 100 ms.
        let bucket = TokenBucket::per_second(10, 5).unwrap();
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
        let bucket = TokenBucket::per_second(10, 5).unwrap();
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
        let bucket = TokenBucket::per_second(10, 5).unwrap();
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
    fn invalid_configurations() {
        let s = Duration::from_secs(1);
        assert_eq!(TokenBucket::new(0, s, 1), Err(InvalidLimit::ZeroRate));
        assert_eq!(
            TokenBucket::new(1, Duration::ZERO, 1),
            Err(InvalidLimit::ZeroPeriod)
        );
        assert_eq!(TokenBucket::new(1, s, 0), Err(InvalidLimit::ZeroBurst));
        assert_eq!(
            TokenBucket::new(2, Duration::from_nanos(1), 1),
            Err(InvalidLimit::RateTooHigh)
        );
        assert_eq!(
            TokenBucket::new(1, Duration::MAX, 1),
            Err(InvalidLimit::TooLong)
        );
        assert_eq!(
            TokenBucket::new(1, Duration::from_secs(u64::MAX / 1_000_000_000), u32::MAX),
            Err(InvalidLimit::TooLong)
        );
        assert_eq!(
            InvalidLimit::ZeroBurst.to_string(),
            "rate limit burst must not be zero"
        );
    }

    #[test]
    fn contended_updates_lose_nothing() {
        let bucket = TokenBucket::per_second(1, 1_000).unwrap();
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
