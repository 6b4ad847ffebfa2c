//! The sliding window, with the paper's estimate from two counts.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use overload_core::ConfigError;

use super::limiter::{Decision, Limiter, QuotaStatus};
use super::validate::{non_zero, positive_nanos};

/// About `quota` units per sliding window, estimated from the counts of the current and
/// the previous fixed window, as the paper describes:
///
/// ```text
/// r = c_n + (1 - (t mod w) / w) * c_{n-1}
/// ```
///
/// where `c_n` is the count of the current window and `c_{n-1}` of the previous one: the
/// previous window's requests are assumed evenly spread, and only the part of it still
/// inside the sliding window counts. A request of cost 1 is admitted when `r < quota` (the
/// paper's rule); a request of cost `n` when `r + n - 1 < quota`, which is the same rule
/// applied as if its units arrived one by one. There is no edge burst as with
/// [`FixedWindow`](super::FixedWindow), and no per-request timestamps are stored.
///
/// The state is the window number and two counts, under a per-key mutex held for a few
/// instructions. The estimate is computed in integers (nanoseconds times counts), so it is
/// exact. The `RateLimit` field's reset time is the end of the current window.
///
/// In `RateLimit-Policy` it advertises `q = quota` per `w = window` when the window is whole
/// seconds; another window is advertised over the next whole second, the quota scaled to it
/// and rounded down (`10 per 100 ms` is `q=100;w=1`, `5 per 1.5 s` is `q=6;w=2`), so that the
/// rate shown is the real one, and the `RateLimit` field's `r` (up to `quota`) never above
/// `q`.
///
/// With criticality ([`RateLimitBuilder::reserves`](crate::RateLimitBuilder::reserves),
/// through [`check_holding_back`](Limiter::check_holding_back)): while a higher level is
/// active (seen within the last 10 seconds), a level `c` is admitted as a request of its
/// cost plus `share(c) × quota` units (rounded up) would be: it stops where the estimate
/// `r` leaves that share. The levels below `c` then stop where the estimate leaves
/// `share(c − 1) × quota`, so level `c` and above together can use about that share of
/// each sliding window, whatever the lower levels send; level `c` itself about
/// `(share(c − 1) − share(c)) × quota`. "About", as for the limit itself: the estimate
/// weighs the previous window's count as if spread evenly, so a share used early in the
/// previous window counts less than it took. It does not hold while the lower levels'
/// use from before level `c` came (after 10 seconds without a higher level) still weighs
/// in the estimate, at most one window and the rest of the current one.
///
/// The paper's worked example, quota 10 per second:
///
/// ```
/// use ratelimit_layer::{Limiter, SlidingWindow};
///
/// let limiter = SlidingWindow::new(10)?;
/// let state = Default::default();
/// for i in 0..10 {
///     assert!(limiter.check(&state, i * 90_000_000, 1).is_allowed()); // 10 in [0, 1)
/// }
/// assert!(limiter.check(&state, 1_050_000_000, 1).is_allowed()); // 1 in [1, 2)
/// // At 1.15 s: 1 + (1 - 0.15) * 10 = 9.5 < 10, so one more is admitted.
/// assert!((limiter.estimate(&state, 1_150_000_000) - 9.5).abs() < 1e-9);
/// assert!(limiter.check(&state, 1_150_000_000, 1).is_allowed());
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    quota: u64,
    window: Duration,
    window_nanos: u64,
}

/// The state of one [`SlidingWindow`] key.
#[derive(Debug, Default)]
pub struct SlidingWindowState {
    counts: Mutex<SlidingWindowCounts>,
}

/// What a key stores: the number of the current fixed window and the two counts.
#[derive(Clone, Copy, Debug, Default)]
struct SlidingWindowCounts {
    /// Which fixed window `current` counts: `now / window`.
    index: u64,
    current: u64,
    previous: u64,
}

/// The two counts the estimate reads at some time, and how much of the current fixed
/// window is left then: everything a decision depends on.
///
/// Whoever keeps the counts (this crate's per-key state, or a script in Redis), the
/// decision, the wait and the remaining quota follow from these three numbers alone, by
/// [`SlidingWindow::admits`], [`SlidingWindow::retry_after`] and
/// [`SlidingWindow::remaining`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlidingWindowView {
    /// Units admitted in the current fixed window.
    pub(crate) current: u64,
    /// Units admitted in the previous fixed window.
    pub(crate) previous: u64,
    /// Nanoseconds left of the current fixed window, within `1..=window`.
    pub(crate) left: u64,
}

impl SlidingWindow {
    /// The window unless [`SlidingWindowBuilder::window`] says otherwise: one second, so that
    /// the quota reads as requests per second, as in the paper's limits.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(1);

    /// About `quota` units per window of one second ([`DEFAULT_WINDOW`](Self::DEFAULT_WINDOW)).
    ///
    /// # Errors
    ///
    /// A zero quota; see [`SlidingWindowBuilder::build`].
    pub fn new(quota: u32) -> Result<Self, ConfigError> {
        Self::builder(quota).build()
    }

    /// A builder for about `quota` units per window, starting from the defaults of
    /// [`new`](Self::new): a window of one second.
    pub const fn builder(quota: u32) -> SlidingWindowBuilder {
        SlidingWindowBuilder {
            quota,
            window: Self::DEFAULT_WINDOW,
        }
    }

    /// The quota: units per window.
    pub const fn quota(&self) -> u64 {
        self.quota
    }

    /// The window.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// The paper's estimate `r` for `state` at `now`, before any new request.
    pub fn estimate(&self, state: &SlidingWindowState, now: u64) -> f64 {
        let stored = *state.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (v, _) = self.view(stored, now);
        // NOTE: display only; decisions use the exact integer form.
        #[allow(clippy::cast_precision_loss)]
        let r = v.current as f64 + (v.left as f64 / self.window_nanos as f64) * v.previous as f64;
        r
    }

    /// The stored counts rolled forward to `now`, without storing them; with the number of
    /// the fixed window they then count.
    fn view(&self, s: SlidingWindowCounts, now: u64) -> (SlidingWindowView, u64) {
        let w = self.window_nanos;
        let index = now / w;
        if index > s.index {
            let previous = if index == s.index + 1 { s.current } else { 0 };
            let view = SlidingWindowView {
                current: 0,
                previous,
                left: w - now % w,
            };
            (view, index)
        } else if index == s.index {
            let view = SlidingWindowView {
                current: s.current,
                previous: s.previous,
                left: w - now % w,
            };
            (view, index)
        } else {
            // NOTE: another thread read a later time and already moved to a newer window;
            // count this request there, as if at its start.
            let view = SlidingWindowView {
                current: s.current,
                previous: s.previous,
                left: w,
            };
            (view, s.index)
        }
    }

    /// Whether a request of `cost` units is admitted with these counts: the paper's rule
    /// `r + cost - 1 < quota`, in integers (`(current + cost - 1) * w + left * previous <
    /// quota * w`), so that it is exact. A cost of zero is always admitted.
    pub(crate) fn admits(&self, v: &SlidingWindowView, cost: u64) -> bool {
        let w = u128::from(self.window_nanos);
        cost == 0
            || u128::from(v.current + cost - 1) * w + u128::from(v.left) * u128::from(v.previous)
                < u128::from(self.quota) * w
    }

    /// Whole units left under the quota with these counts (the estimate rounded up).
    pub(crate) fn remaining(&self, v: &SlidingWindowView) -> u64 {
        let w = u128::from(self.window_nanos);
        let used = u128::from(v.current) * w + u128::from(v.left) * u128::from(v.previous);
        let quota = u128::from(self.quota) * w;
        // NOTE: at most `quota`, so the cast cannot truncate.
        u64::try_from(quota.saturating_sub(used) / w).unwrap_or(u64::MAX)
    }

    /// How long until nothing counts any more with these counts (at least 1 ns): until the
    /// current fixed window ends if only the previous one holds units, else until the next
    /// one ends.
    pub(crate) fn until_whole(&self, v: &SlidingWindowView) -> Duration {
        let nanos = if v.current == 0 {
            if v.previous == 0 { 1 } else { v.left }
        } else {
            v.left.saturating_add(self.window_nanos)
        };
        Duration::from_nanos(nanos)
    }

    /// How long until a request of `cost` units (`1 <= cost <= quota`) is admitted, given
    /// that it is not admitted with these counts, if nothing else is admitted meanwhile.
    pub(crate) fn retry_after(&self, v: &SlidingWindowView, cost: u64) -> Duration {
        let w = u128::from(self.window_nanos);
        // Admitted when current * w + left * previous < need * w.
        let need = u128::from(self.quota - cost + 1);
        let current = u128::from(v.current);
        let left = u128::from(v.left);
        let nanos = if current < need {
            // Later in this window, as the previous window's weight decays. Rejected now
            // means previous > 0.
            let previous = u128::from(v.previous.max(1));
            let left_max = ((need - current) * w).div_ceil(previous) - 1;
            left - left_max.min(left)
        } else {
            // In the next window, where this window's count becomes the previous one.
            let left_max = (need * w).div_ceil(current) - 1;
            if left_max >= w {
                left
            } else {
                left + (w - left_max)
            }
        };
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// Builds a [`SlidingWindow`]; from [`SlidingWindow::builder`].
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::SlidingWindow;
///
/// // 600 per minute.
/// let limiter = SlidingWindow::builder(600).window(Duration::from_secs(60)).build()?;
/// assert_eq!(limiter.quota(), 600);
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct SlidingWindowBuilder {
    quota: u32,
    window: Duration,
}

impl SlidingWindowBuilder {
    /// The window the quota is counted over. Default: one second
    /// ([`SlidingWindow::DEFAULT_WINDOW`]).
    pub const fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of kind `OutOfRange` naming the setting, when `quota` is zero or
    /// `window` is zero or longer than 584 years.
    pub fn build(self) -> Result<SlidingWindow, ConfigError> {
        let quota = non_zero("quota", self.quota)?;
        Ok(SlidingWindow {
            quota: u64::from(quota),
            window: self.window,
            window_nanos: positive_nanos("window", self.window)?,
        })
    }
}

impl Limiter for SlidingWindow {
    type State = SlidingWindowState;

    fn check_holding_back(
        &self,
        state: &SlidingWindowState,
        now: u64,
        cost: u32,
        held_back: u64,
    ) -> Decision {
        let cost = u64::from(cost);
        if cost > self.quota {
            return Decision::OverCapacity {
                capacity: self.quota,
            };
        }
        let mut stored = state.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (v, index) = self.view(*stored, now);
        // NOTE: admitted with `held_back` units still free is admitted as a request of
        // `cost + held_back` would be; nothing is held back from a free request.
        let need = if cost == 0 {
            0
        } else {
            cost.saturating_add(held_back)
        };
        if need > self.quota {
            return Decision::Reject {
                retry_after: self.until_whole(&v),
            };
        }
        if self.admits(&v, need) {
            *stored = SlidingWindowCounts {
                index,
                current: v.current + cost,
                previous: v.previous,
            };
            Decision::Allow
        } else {
            Decision::Reject {
                retry_after: self.retry_after(&v, need),
            }
        }
    }

    fn status(&self, state: &SlidingWindowState, now: u64) -> QuotaStatus {
        let stored = *state.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (v, _) = self.view(stored, now);
        QuotaStatus {
            remaining: self.remaining(&v),
            reset: Duration::from_nanos(v.left),
        }
    }

    fn is_idle(&self, state: &SlidingWindowState, now: u64) -> bool {
        let stored = *state.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (v, _) = self.view(stored, now);
        v.current == 0 && v.previous == 0
    }

    fn quota(&self) -> u64 {
        self.quota
    }

    fn window(&self) -> Duration {
        self.window
    }

    fn capacity(&self) -> u64 {
        self.quota
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_papers_worked_example() {
        // 10 in [0, 1), 1 in [1, 2); at t = 1.15 s the estimate is 9.5 < 10.
        let limiter = SlidingWindow::new(10).unwrap();
        let state = SlidingWindowState::default();
        for i in 0..10 {
            assert!(limiter.check(&state, i * 100 * MS, 1).is_allowed());
        }
        assert!(!limiter.check(&state, 999 * MS, 1).is_allowed());
        // At 1.0 s exactly the whole previous window still counts: 0 + 1 * 10 = 10.
        assert!(!limiter.check(&state, 1_000 * MS, 1).is_allowed());
        assert!(limiter.check(&state, 1_100 * MS, 1).is_allowed());
        let estimate = limiter.estimate(&state, 1_150 * MS);
        assert!((estimate - 9.5).abs() < 1e-9, "estimate {estimate}");
        // 10 - 9.5 leaves no whole unit; the window ends in 850 ms.
        assert_eq!(
            limiter.status(&state, 1_150 * MS),
            QuotaStatus {
                remaining: 0,
                reset: Duration::from_millis(850)
            }
        );
        // At 1.5 s: 1 + 0.5 * 10 = 6, so 4 whole units are left.
        assert_eq!(limiter.status(&state, 1_500 * MS).remaining, 4);
        assert!(limiter.check(&state, 1_150 * MS, 1).is_allowed());
        // Now 2 + 0.85 * 10 = 10.5: full.
        assert!(!limiter.check(&state, 1_150 * MS, 1).is_allowed());
    }

    #[test]
    fn no_edge_burst() {
        let limiter = SlidingWindow::new(10).unwrap();
        let state = SlidingWindowState::default();
        let mut admitted = 0;
        for t in [990 * MS, 1_000 * MS] {
            for _ in 0..15 {
                if limiter.check(&state, t, 1).is_allowed() {
                    admitted += 1;
                }
            }
        }
        assert_eq!(admitted, 10, "the fixed window would admit 20");
    }

    #[test]
    fn retry_after_is_exact() {
        let limiter = SlidingWindow::new(10).unwrap();
        let state = SlidingWindowState::default();
        for _ in 0..10 {
            assert!(limiter.check(&state, 500 * MS, 1).is_allowed());
        }
        // Current window full: wait for the next one, then for the weight to fall below 10.
        let Decision::Reject { retry_after, .. } = limiter.check(&state, 600 * MS, 1) else {
            panic!("expected a rejection");
        };
        let at = 600 * MS + u64::try_from(retry_after.as_nanos()).unwrap();
        assert!(!limiter.check(&state, at - 1, 1).is_allowed());
        assert!(limiter.check(&state, at, 1).is_allowed());
        assert!(at > 1_000 * MS && at <= 1_001 * MS, "at {at}");
    }

    #[test]
    fn idle_after_two_quiet_windows() {
        let limiter = SlidingWindow::new(10).unwrap();
        let state = SlidingWindowState::default();
        assert!(limiter.is_idle(&state, 0));
        assert!(limiter.check(&state, 500 * MS, 4).is_allowed());
        assert!(!limiter.is_idle(&state, 1_999 * MS));
        assert!(limiter.is_idle(&state, 2_000 * MS));
        assert_eq!(
            limiter.check(&state, 0, 11),
            Decision::OverCapacity { capacity: 10 }
        );
    }

    #[test]
    fn invalid_configurations_name_the_setting() {
        let err = |b: SlidingWindowBuilder| b.build().unwrap_err();
        let e = err(SlidingWindow::builder(0));
        assert_eq!(
            (e.field(), e.to_string().as_str()),
            ("quota", "quota must be at least 1, got 0")
        );
        let e = err(SlidingWindow::builder(1).window(Duration::ZERO));
        assert_eq!(
            (e.field(), e.to_string().as_str()),
            ("window", "window must be greater than zero, got 0ns")
        );
        let e = err(SlidingWindow::builder(1).window(Duration::MAX));
        assert_eq!(
            (e.field(), e.kind()),
            ("window", overload_core::ConfigErrorKind::OutOfRange)
        );
        assert!(
            e.to_string()
                .starts_with("window must be at most 584 years, got ")
        );
        let l = SlidingWindow::new(5).unwrap();
        assert_eq!((l.quota(), l.window()), (5, Duration::from_secs(1)));
    }
}
