//! The fixed window: a count per window of time.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use overload_core::ConfigError;

use super::limiter::{Decision, Limiter, QuotaStatus};
use super::validate::{non_zero, positive_nanos};

/// At most `quota` units per window; windows are aligned on the clock's origin
/// (`[0, w)`, `[w, 2w)`, ...) and the count starts again at zero in each.
///
/// The cheapest algorithm to explain, with a known flaw the paper describes: the count
/// forgets everything at a window edge, so a client can spend a whole quota at the end of
/// one window and another whole quota at the start of the next. **Up to `2 * quota` units
/// can be admitted within a few milliseconds across an edge.** Prefer [`SlidingWindow`]
/// (which estimates across the edge) or [`TokenBucket`] when that matters.
///
/// [`SlidingWindow`]: super::SlidingWindow
/// [`TokenBucket`]: super::TokenBucket
///
/// The state is the window number and its count, under a per-key mutex held for a few
/// instructions.
///
/// With criticality ([`RateLimitBuilder::reserves`](crate::RateLimitBuilder::reserves),
/// through [`check_holding_back`](Limiter::check_holding_back)): while a higher level is
/// active (seen within the last 10 seconds), a level `c` is admitted only while the
/// window's count stays at or under `quota − share(c) × quota` (the held-back units rounded
/// up). The levels below `c` then stop at `quota − share(c − 1) × quota`, so level `c`
/// and above together can use at least the `share(c − 1) × quota` units they leave in
/// each window, whatever the lower levels send; level `c` itself up to the difference
/// `(share(c − 1) − share(c)) × quota`. It does not hold in a window where the lower
/// levels came first while no higher level had been seen for 10 seconds: they may then
/// have taken the whole window, and level `c` waits for the next one. The edge effect is
/// the window's own: each level may take its part at the end of one window and again at
/// the start of the next.
///
/// In `RateLimit-Policy` it advertises `q = quota` per `w = window` when the window is whole
/// seconds; another window is advertised over the next whole second, the quota scaled to it
/// and rounded down (`10 per 100 ms` is `q=100;w=1`, `5 per 1.5 s` is `q=6;w=2`), so that the
/// rate shown is the real one, and the `RateLimit` field's `r` (up to `quota`) never above
/// `q`.
///
/// ```
/// use ratelimit_layer::{FixedWindow, Limiter};
///
/// let window = FixedWindow::new(2)?;
/// let state = Default::default();
/// assert!(window.check(&state, 0, 1).is_allowed());
/// assert!(window.check(&state, 0, 1).is_allowed());
/// assert!(!window.check(&state, 999_999_999, 1).is_allowed());
/// assert!(window.check(&state, 1_000_000_000, 1).is_allowed());
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    quota: u64,
    window: Duration,
    window_nanos: u64,
}

/// The state of one [`FixedWindow`] key.
#[derive(Debug, Default)]
pub struct FixedWindowState {
    inner: Mutex<FixedWindowCount>,
}

#[derive(Debug, Default)]
struct FixedWindowCount {
    /// Which window `count` belongs to: `now / window`.
    index: u64,
    count: u64,
}

impl FixedWindow {
    /// The window unless [`FixedWindowBuilder::window`] says otherwise: one second, so that
    /// the quota reads as requests per second, as in the paper's limits.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(1);

    /// At most `quota` units per window of one second ([`DEFAULT_WINDOW`](Self::DEFAULT_WINDOW)).
    ///
    /// # Errors
    ///
    /// A zero quota; see [`FixedWindowBuilder::build`].
    pub fn new(quota: u32) -> Result<Self, ConfigError> {
        Self::builder(quota).build()
    }

    /// A builder for at most `quota` units per window, starting from the defaults of
    /// [`new`](Self::new): a window of one second.
    pub const fn builder(quota: u32) -> FixedWindowBuilder {
        FixedWindowBuilder {
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
}

/// Builds a [`FixedWindow`]; from [`FixedWindow::builder`].
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::FixedWindow;
///
/// // 600 per minute.
/// let limiter = FixedWindow::builder(600).window(Duration::from_secs(60)).build()?;
/// assert_eq!(limiter.quota(), 600);
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct FixedWindowBuilder {
    quota: u32,
    window: Duration,
}

impl FixedWindowBuilder {
    /// The window the quota is counted over. Default: one second
    /// ([`FixedWindow::DEFAULT_WINDOW`]).
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
    pub fn build(self) -> Result<FixedWindow, ConfigError> {
        let quota = non_zero("quota", self.quota)?;
        Ok(FixedWindow {
            quota: u64::from(quota),
            window: self.window,
            window_nanos: positive_nanos("window", self.window)?,
        })
    }
}

impl Limiter for FixedWindow {
    type State = FixedWindowState;

    fn check_holding_back(
        &self,
        state: &FixedWindowState,
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
        let mut s = state.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let index = now / self.window_nanos;
        let into = if index > s.index {
            s.index = index;
            s.count = 0;
            now % self.window_nanos
        } else if index == s.index {
            now % self.window_nanos
        } else {
            // NOTE: another thread read a later time and already moved to a newer window;
            // count this request there, as if at its start.
            0
        };
        // NOTE: nothing is held back from a free request; saturating, a hold as large as
        // the quota is never met.
        let held_back = if cost == 0 { 0 } else { held_back };
        if s.count + cost.saturating_add(held_back) <= self.quota {
            s.count += cost;
            Decision::Allow
        } else {
            Decision::Reject {
                retry_after: Duration::from_nanos(self.window_nanos - into),
            }
        }
    }

    fn status(&self, state: &FixedWindowState, now: u64) -> QuotaStatus {
        let s = state.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let index = now / self.window_nanos;
        let (count, into) = if index > s.index {
            (0, now % self.window_nanos)
        } else if index == s.index {
            (s.count, now % self.window_nanos)
        } else {
            (s.count, 0)
        };
        QuotaStatus {
            remaining: self.quota - count,
            reset: Duration::from_nanos(self.window_nanos - into),
        }
    }

    fn is_idle(&self, state: &FixedWindowState, now: u64) -> bool {
        let s = state.inner.lock().unwrap_or_else(PoisonError::into_inner);
        s.count == 0 || now / self.window_nanos > s.index
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
    fn edge_burst_admits_twice_the_quota_across_an_edge() {
        // The paper's flaw: quota 10 per second, 10 at 0.99 s and 10 more at 1.00 s.
        let window = FixedWindow::new(10).unwrap();
        let state = FixedWindowState::default();
        let mut admitted = 0;
        for t in [990 * MS, 1_000 * MS] {
            for _ in 0..15 {
                if window.check(&state, t, 1).is_allowed() {
                    admitted += 1;
                }
            }
        }
        assert_eq!(admitted, 20, "20 admitted within 10 ms");
    }

    #[test]
    fn counts_per_window_and_rejects_until_the_edge() {
        let window = FixedWindow::new(3).unwrap();
        let state = FixedWindowState::default();
        assert_eq!(window.check(&state, 100 * MS, 2), Decision::Allow);
        assert_eq!(
            window.status(&state, 100 * MS),
            QuotaStatus {
                remaining: 1,
                reset: Duration::from_millis(900)
            }
        );
        assert_eq!(
            window.check(&state, 400 * MS, 2),
            Decision::Reject {
                retry_after: Duration::from_millis(600),
            }
        );
        assert_eq!(
            window.status(&state, 400 * MS),
            QuotaStatus {
                remaining: 1,
                reset: Duration::from_millis(600)
            }
        );
        assert_eq!(
            window.status(&state, 1_200 * MS),
            QuotaStatus {
                remaining: 3,
                reset: Duration::from_millis(800)
            }
        );
        assert!(window.check(&state, 400 * MS, 1).is_allowed());
        assert!(!window.is_idle(&state, 999 * MS));
        assert!(window.is_idle(&state, 1_000 * MS));
        assert!(window.check(&state, 1_000 * MS, 3).is_allowed());
        assert_eq!(
            window.check(&state, 0, 4),
            Decision::OverCapacity { capacity: 3 }
        );
    }

    #[test]
    fn a_late_reader_counts_in_the_newer_window() {
        let window = FixedWindow::new(1).unwrap();
        let state = FixedWindowState::default();
        assert!(window.check(&state, 1_500 * MS, 1).is_allowed());
        // A thread that read the clock before 1 s arrives after: the newer window counts.
        assert!(!window.check(&state, 900 * MS, 1).is_allowed());
    }

    #[test]
    fn invalid_configurations_name_the_setting() {
        let err = |b: FixedWindowBuilder| b.build().unwrap_err();
        let e = err(FixedWindow::builder(0));
        assert_eq!(
            (e.field(), e.to_string().as_str()),
            ("quota", "quota must be at least 1, got 0")
        );
        let e = err(FixedWindow::builder(1).window(Duration::ZERO));
        assert_eq!(
            (e.field(), e.to_string().as_str()),
            ("window", "window must be greater than zero, got 0ns")
        );
        let e = err(FixedWindow::builder(1).window(Duration::MAX));
        assert_eq!(
            (e.field(), e.kind()),
            ("window", overload_core::ConfigErrorKind::OutOfRange)
        );
        assert!(
            e.to_string()
                .starts_with("window must be at most 584 years, got ")
        );
        let l = FixedWindow::new(5).unwrap();
        assert_eq!((l.quota(), l.window()), (5, Duration::from_secs(1)));
    }
}
