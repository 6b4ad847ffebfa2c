//! A fixed or sliding window whose quota changes while it serves: [`LiveWindow`] and its
//! [`WindowHandle`].
//!
//! A window's per-key state is counts of units per window (the window number and its count,
//! and the previous window's for the sliding window): nothing in it depends on the quota.
//! So a new quota applies to the counts as they are, with no conversion. In the current
//! window a lowered quota admits `max(0, q' − count)` more units (no burst: what was
//! admitted stays counted), a raised one the difference at once (nothing the new quota
//! admits is rejected). The window's length is not changed live: the counts are per window
//! number, which a new length would renumber.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use overload_core::ConfigError;

use super::fixed_window::FixedWindow;
use super::limiter::{Decision, Limiter, QuotaStatus};
use super::sliding_window::SlidingWindow;

/// A window algorithm whose quota a [`WindowHandle`] may change: [`FixedWindow`] and
/// [`SlidingWindow`]. Sealed.
pub trait WindowAlgorithm: Limiter + Clone + std::fmt::Debug + window_sealed::Sealed {}

impl WindowAlgorithm for FixedWindow {}
impl WindowAlgorithm for SlidingWindow {}

mod window_sealed {
    use std::time::Duration;

    use overload_core::ConfigError;

    use crate::algorithm::fixed_window::FixedWindow;
    use crate::algorithm::limiter::Limiter;
    use crate::algorithm::sliding_window::SlidingWindow;

    pub trait Sealed: Sized {
        /// The same window with `quota`.
        fn with_quota(&self, quota: u32) -> Result<Self, ConfigError>;
    }

    impl Sealed for FixedWindow {
        fn with_quota(&self, quota: u32) -> Result<Self, ConfigError> {
            Self::builder(quota).window(self.window()).build()
        }
    }

    impl Sealed for SlidingWindow {
        fn with_quota(&self, quota: u32) -> Result<Self, ConfigError> {
            let window: Duration = Limiter::window(self);
            Self::builder(quota).window(window).build()
        }
    }
}

/// A [`FixedWindow`] or [`SlidingWindow`] whose quota a [`WindowHandle`] changes while it
/// serves; a [`Limiter`] with the same state as the window it wraps.
///
/// ```
/// use ratelimit_layer::algorithm::LiveWindow;
/// use ratelimit_layer::{FixedWindow, Limiter};
///
/// let (window, handle) = LiveWindow::new(FixedWindow::new(10)?);
/// let state = Default::default();
/// for _ in 0..6 {
///     assert!(window.check(&state, 0, 1).is_allowed());
/// }
/// handle.set_quota(8)?; // 6 counted: 2 more in this window
/// assert!(window.check(&state, 0, 2).is_allowed());
/// assert!(!window.check(&state, 0, 1).is_allowed());
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct LiveWindow<W: WindowAlgorithm> {
    params: Arc<ArcSwap<W>>,
}

/// Changes a [`LiveWindow`]'s quota; cheap to clone, usable from any thread.
#[derive(Debug)]
pub struct WindowHandle<W: WindowAlgorithm> {
    params: Arc<ArcSwap<W>>,
    /// Serializes changes (never a request).
    write: Arc<Mutex<()>>,
}

impl<W: WindowAlgorithm> Clone for WindowHandle<W> {
    fn clone(&self) -> Self {
        Self {
            params: Arc::clone(&self.params),
            write: Arc::clone(&self.write),
        }
    }
}

impl<W: WindowAlgorithm> LiveWindow<W> {
    /// A live window starting with `window`'s parameters, and its handle.
    pub fn new(window: W) -> (Self, WindowHandle<W>) {
        let params = Arc::new(ArcSwap::from_pointee(window));
        let handle = WindowHandle {
            params: Arc::clone(&params),
            write: Arc::new(Mutex::new(())),
        };
        (Self { params }, handle)
    }

    /// The parameters in force.
    pub fn current(&self) -> W {
        W::clone(&self.params.load())
    }
}

impl<W: WindowAlgorithm> WindowHandle<W> {
    /// The parameters in force.
    pub fn current(&self) -> W {
        W::clone(&self.params.load())
    }

    /// Changes the quota, keeping the window; the counts of every key stay.
    ///
    /// # Errors
    ///
    /// As the window's builder (a zero quota, ...); nothing changes.
    pub fn set_quota(&self, quota: u32) -> Result<(), ConfigError> {
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let next = self.params.load().with_quota(quota)?;
        self.params.store(Arc::new(next));
        Ok(())
    }
}

impl<W: WindowAlgorithm> Limiter for LiveWindow<W> {
    type State = W::State;

    fn check_holding_back(
        &self,
        state: &W::State,
        now: u64,
        cost: u32,
        held_back: u64,
    ) -> Decision {
        self.params
            .load()
            .check_holding_back(state, now, cost, held_back)
    }

    fn status(&self, state: &W::State, now: u64) -> QuotaStatus {
        self.params.load().status(state, now)
    }

    fn is_idle(&self, state: &W::State, now: u64) -> bool {
        self.params.load().is_idle(state, now)
    }

    fn quota(&self) -> u64 {
        self.params.load().quota()
    }

    fn window(&self) -> Duration {
        self.params.load().window()
    }

    fn capacity(&self) -> u64 {
        self.params.load().capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Units admitted one by one at `now` until the first rejection.
    fn take_all<L: Limiter>(limiter: &L, state: &L::State, now: u64) -> u64 {
        let mut n = 0;
        while limiter.check(state, now, 1).is_allowed() {
            n += 1;
        }
        n
    }

    #[test]
    fn a_fixed_windows_counts_stay_across_a_change() {
        let (live, handle) = LiveWindow::new(FixedWindow::new(10).unwrap());
        let state = Default::default();
        assert_eq!(take_all(&live, &state, 0), 10);
        // Lowered: nothing more in this window, the new quota in the next.
        handle.set_quota(4).unwrap();
        assert_eq!(take_all(&live, &state, 500 * MS), 0);
        assert_eq!(take_all(&live, &state, 1_000 * MS), 4);
        // Raised mid-window: the difference at once.
        handle.set_quota(6).unwrap();
        assert_eq!(take_all(&live, &state, 1_500 * MS), 2);
        assert_eq!((live.quota(), live.capacity()), (6, 6));
    }

    #[test]
    fn a_sliding_windows_estimate_takes_the_new_quota() {
        let window = SlidingWindow::builder(100)
            .window(Duration::from_secs(1))
            .build()
            .unwrap();
        let (live, handle) = LiveWindow::new(window);
        let state = Default::default();
        assert_eq!(take_all(&live, &state, 0), 100);
        handle.set_quota(50).unwrap();
        // Half-way through the next window, the estimate still counts 50 of the last 100:
        // a quota of 50 admits nothing more, where the old one would have admitted 50.
        assert_eq!(take_all(&live, &state, 1_500 * MS), 0);
        handle.set_quota(200).unwrap();
        assert_eq!(take_all(&live, &state, 1_500 * MS), 150);
    }

    #[test]
    fn an_invalid_quota_is_refused_and_changes_nothing() {
        let (live, handle) = LiveWindow::new(FixedWindow::new(10).unwrap());
        assert_eq!(handle.set_quota(0).unwrap_err().field(), "quota");
        assert_eq!(live.current(), FixedWindow::new(10).unwrap());
        // A clone of the handle changes the same window.
        let other = handle.clone();
        other.set_quota(12).unwrap();
        assert_eq!(handle.current(), FixedWindow::new(12).unwrap());
        assert_eq!(live.quota(), 12);
    }
}
