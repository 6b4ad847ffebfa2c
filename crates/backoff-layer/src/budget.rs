//! Retry budgets: the share of retries a client may add to its load.
//!
//! A budget is consulted by the retry layer: every first attempt is a
//! [`deposit`](Budget::deposit), every retry must first succeed at a
//! [`withdraw`](Budget::withdraw). A refused withdrawal ends the request with its last
//! outcome instead of retrying.
//!
//! Max attempts bound the retries of *one* request; they do nothing for a fleet whose
//! dependency is failing: with 3 attempts per request, a failing service sees 3 times its
//! normal load, and 3 tiers that each retry 3 times multiply that to 27 times. A budget
//! bounds the retries of *all* requests together: with [`RetryBudget`]'s default of 10%,
//! a failing dependency sees at most about 1.1 times its normal load from this client.
//!
//! # Examples
//!
//! The defaults (10% of first attempts over 10 seconds, plus 1 retry per second):
//!
//! ```
//! use backoff_layer::budget::{Budget, RetryBudget};
//!
//! let budget = RetryBudget::new();
//! for _ in 0..100 {
//!     budget.deposit(); // 100 first attempts earn 10 retries, plus the floor of 10
//! }
//! let allowed = (0..100).filter(|_| budget.withdraw()).count();
//! assert_eq!(allowed, 20);
//! ```
//!
//! A customised budget, on the coarse clock:
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::budget::{Budget, RetryBudget};
//! use overload_core::clock::CoarseClock;
//!
//! let budget = RetryBudget::builder()
//!     .ratio(0.6)
//!     .window(Duration::from_secs(30))
//!     .slots(30)
//!     .min_retries_per_sec(0)
//!     .clock(CoarseClock::new())
//!     .build()?;
//! for _ in 0..10 {
//!     budget.deposit();
//! }
//! // Exactly 60% of 10 first attempts: 6 retries, not one more.
//! assert_eq!((0..10).filter(|_| budget.withdraw()).count(), 6);
//!
//! // Invalid configuration cannot be built, and the error names the setting.
//! let err = RetryBudget::builder().ratio(f64::NAN).build().unwrap_err();
//! assert_eq!(err.field(), "ratio");
//! assert_eq!(err.to_string(), "ratio must be a finite number, got NaN");
//! # Ok::<(), backoff_layer::ConfigError>(())
//! ```
//!
//! # Metrics
//!
//! [`RetryBudget`] records, through the [`metrics`] facade (this crate never installs a
//! recorder):
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `backoff_layer_budget_retries_allowed_total` | counter | withdrawals that succeeded: retries the budget let through |
//! | `backoff_layer_budget_retries_refused_total` | counter | withdrawals that were refused: retries the budget stopped |
//!
//! First attempts are not counted here: they happen on every request, and the retry layer's
//! own request metrics already count them.
//!
//! The counters are registered when the budget is built (registering on every call would
//! cost more than the budget itself), so install the recorder before building budgets.

use std::fmt;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::window::Window;

/// A retry budget shared by every clone of a client.
///
/// Implementations must be cheap (they are called on every request) and safe to call from
/// many threads at once.
pub trait Budget: Send + Sync + 'static {
    /// Records a request's first attempt, which earns retry allowance.
    fn deposit(&self);

    /// Tries to spend one retry; `true` if the retry may go ahead.
    fn withdraw(&self) -> bool;
}

/// No budget: every retry is allowed. Max attempts and the deadline still bound retries.
///
/// Useful in tests and for clients that are the only caller of a service they own; in a
/// fleet it lets a failing dependency see up to max-attempts times its normal load.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unlimited;

impl Budget for Unlimited {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        true
    }
}

/// Metric: withdrawals that succeeded.
const RETRIES_ALLOWED: &str = "backoff_layer_budget_retries_allowed_total";
/// Metric: withdrawals that were refused.
const RETRIES_REFUSED: &str = "backoff_layer_budget_retries_refused_total";

/// Fixed-point scale of the ratio: the ratio is kept in millionths, so the usual ratios
/// (0.1, 0.2, 0.6) are exact, unlike their binary floating-point forms.
const SCALE: u64 = 1_000_000;

/// The window's one added counter: deposits. Withdrawals are its takes.
const DEPOSITS: usize = 0;

/// A sliding-window retry budget: retries may be at most a share of first attempts.
///
/// Over the last [`window`](RetryBudgetBuilder::window), a withdrawal succeeds only while
///
/// ```text
/// retries + 1 <= ratio * first_attempts + min_retries_per_sec * window_seconds
/// ```
///
/// where `retries` counts the withdrawals that succeeded and `first_attempts` the
/// deposits, both in the window. The comparison is exact: with a ratio of 0.6 and no
/// floor, 10 first attempts allow exactly 6 retries. (tower's `TpsBudget` rounds the ratio
/// to a whole number of deposits per retry and allows 10 here: tower issue 857.)
///
/// # Defaults
///
/// [`RetryBudget::new()`] and [`RetryBudget::builder()`] start from:
///
/// - **ratio 0.1** ([`RetryBudget::DEFAULT_RATIO`]): retries may add at most 10% to the
///   load. The figure is the paper's ("retries at most 10% of requests") and the Google SRE
///   book's per-client retry budget (chapter "Handling Overload").
/// - **window 10 seconds, in 10 slots of 1 second** ([`RetryBudget::DEFAULT_WINDOW`],
///   [`RetryBudget::DEFAULT_SLOTS`]): the window length is the one Finagle, linkerd and
///   tower's `TpsBudget` use; the window slides one slot at a time, so it spans between 9
///   and 10 seconds of history.
/// - **floor 1 retry per second** ([`RetryBudget::DEFAULT_MIN_RETRIES_PER_SEC`]; 10 per
///   default window), so a quiet client that sends a request a minute can still retry a
///   transient failure. Finagle and linkerd use 10 per second with a ratio of 0.2; this
///   budget uses 1 because the floor is added to the ratio's allowance for every budget: at
///   10 per second, a client sending fewer than 100 requests per second would get more than
///   twice its 10% share, and a fleet of quiet clients would retry far more than 10% in total.
/// - **clock: [`TokioClock`]**, so under `tokio::time::pause()` the window slides with the
///   paused clock. [`CoarseClock`](overload_core::clock::CoarseClock) (through
///   [`clock`](RetryBudgetBuilder::clock)) reads the time in a few nanoseconds instead of
///   tens, which is most of a deposit's cost; slots then start up to one kernel tick (1 to
///   10 ms) late, and paused time no longer moves the budget.
///
/// # Sharing and cost
///
/// One `RetryBudget` is meant to be shared by every clone of a client, behind an `Arc`
/// (the retry layer holds it as `Arc<dyn Budget>`). It is an
/// [`overload_core::window::Window`]: a deposit reads the clock and adds one with a
/// compare-and-swap on a counter of the calling thread's own stripe, so threads on different
/// cores do not contend; a withdrawal reads the window's deposits and withdrawals and takes
/// its retry with a compare-and-swap on the word that holds the current slot's withdrawals,
/// so concurrent withdrawals never take more than the allowance. Both are lock-free, and no
/// call ever waits for another thread to finish: a call retries only when another changed
/// the same word meanwhile.
///
/// # Precision
///
/// - The ratio is kept in millionths (0.1234567 acts as 0.123457), and the allowance is
///   computed in integers: no rounding beyond that.
/// - Every granted withdrawal keeps `retries <= ratio * first_attempts + floor` in the
///   window it was checked against, with the withdrawals counted exactly at the moment it
///   was granted. Deposits still in flight on other threads may be missed by a withdrawal
///   (it is then stricter, never more generous); a deposit is never lost.
/// - A withdrawal by a thread that read the clock before another thread's withdrawal in a
///   newer slot is checked against the newer slot's window.
/// - At most 16,777,215 (2^24 - 1) retries are allowed in one slot, and deposits saturate
///   at 4,294,967,295 per slot and stripe, however large the ratio and the traffic.
/// - Slots are numbered from the clock's origin; see [`Window`]'s limits for how long a
///   slot number lasts.
pub struct RetryBudget<C: Clock = TokioClock> {
    window: Window<1, C>,
    ratio: f64,
    min_retries_per_sec: u32,
    ratio_units: u64,
    floor_units: u64,
    allowed: metrics::Counter,
    refused: metrics::Counter,
}

impl RetryBudget {
    /// The default ratio: retries may be 10% of first attempts (paper; Google SRE book).
    pub const DEFAULT_RATIO: f64 = 0.1;
    /// The default window: 10 seconds (Finagle, linkerd, tower's `TpsBudget`).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
    /// The default number of slots: 10, so the default window slides by 1 second.
    pub const DEFAULT_SLOTS: u32 = 10;
    /// The default floor: 1 retry per second of window (see [Defaults](#defaults) for why
    /// not Finagle's 10).
    pub const DEFAULT_MIN_RETRIES_PER_SEC: u32 = 1;
    /// The largest ratio accepted: 1000 retries per first attempt, Finagle's bound.
    pub const MAX_RATIO: f64 = 1000.0;
    /// The longest window accepted: 1 hour; a budget over longer spans no longer reacts
    /// to an outage.
    pub const MAX_WINDOW: Duration = Duration::from_secs(3600);
    /// The most slots accepted: 64; a withdrawal reads every slot.
    pub const MAX_SLOTS: u32 = 64;
    /// The shortest slot (window divided by slots) accepted: 10 milliseconds.
    pub const MIN_SLOT: Duration = Duration::from_millis(10);

    /// A budget with the defaults: ratio 0.1, window 10 s in 10 slots, floor 1 retry per
    /// second, on [`TokioClock`]. See [Defaults](#defaults) for their sources.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default retry budget configuration is valid")
    }

    /// A builder starting from the defaults (see [Defaults](#defaults)).
    pub fn builder() -> RetryBudgetBuilder {
        RetryBudgetBuilder::new()
    }
}

impl Default for RetryBudget {
    /// The same as [`RetryBudget::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> RetryBudget<C> {
    /// The ratio of retries to first attempts.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The length of the sliding window.
    pub fn window(&self) -> Duration {
        self.window.window()
    }

    /// The number of slots the window slides by.
    pub fn slots(&self) -> u32 {
        self.window.slots()
    }

    /// The floor, in retries per second of window.
    pub fn min_retries_per_sec(&self) -> u32 {
        self.min_retries_per_sec
    }

    /// How many retries the budget would allow now, without taking any.
    ///
    /// Only reads: it never moves the window. A snapshot: concurrent deposits and
    /// withdrawals change it at once.
    pub fn remaining(&self) -> u64 {
        let counts = self.window.counts(self.window.slot_now());
        let earned = self.earned(counts.added(DEPOSITS)) / u128::from(SCALE);
        u64::try_from(earned)
            .unwrap_or(u64::MAX)
            .saturating_sub(counts.taken())
    }

    /// Allowance earned by `deposited` first attempts (and the floor), in millionths of a
    /// retry.
    fn earned(&self, deposited: u64) -> u128 {
        u128::from(self.ratio_units) * u128::from(deposited) + u128::from(self.floor_units)
    }
}

impl<C: Clock> Budget for RetryBudget<C> {
    #[inline]
    fn deposit(&self) {
        self.window.add(self.window.slot_now(), DEPOSITS, 1);
    }

    fn withdraw(&self) -> bool {
        let slot = self.window.slot_now();
        // NOTE: the window calls this with the withdrawals exact as of the moment the retry
        // is granted (it re-checks if another withdrawal got in first): never an overdraw.
        let granted = self.window.try_take(slot, |counts| {
            u128::from(counts.taken() + 1) * u128::from(SCALE)
                <= self.earned(counts.added(DEPOSITS))
        });
        if granted {
            self.allowed.increment(1);
        } else {
            self.refused.increment(1);
        }
        granted
    }
}

impl<C: Clock> fmt::Debug for RetryBudget<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NOTE: `remaining` only reads (regression: it used to move the window, so printing
        // a budget changed it).
        f.debug_struct("RetryBudget")
            .field("ratio", &self.ratio)
            .field("window", &self.window())
            .field("slots", &self.slots())
            .field("min_retries_per_sec", &self.min_retries_per_sec)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// Builds a [`RetryBudget`]; every setting starts at its default (see
/// [Defaults](RetryBudget#defaults)).
///
/// [`build`](Self::build) checks the settings and names the one that is wrong.
pub struct RetryBudgetBuilder<C: Clock = TokioClock> {
    ratio: f64,
    window: Duration,
    slots: u32,
    min_retries_per_sec: u32,
    clock: C,
}

impl RetryBudgetBuilder {
    /// A builder with the defaults: ratio 0.1, window 10 s, 10 slots, 1 retry per second,
    /// [`TokioClock`].
    pub fn new() -> Self {
        Self {
            ratio: RetryBudget::DEFAULT_RATIO,
            window: RetryBudget::DEFAULT_WINDOW,
            slots: RetryBudget::DEFAULT_SLOTS,
            min_retries_per_sec: RetryBudget::DEFAULT_MIN_RETRIES_PER_SEC,
            clock: TokioClock::new(),
        }
    }
}

impl Default for RetryBudgetBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> RetryBudgetBuilder<C> {
    /// Retries allowed per first attempt in the window. Default: 0.1 (10%, the paper's and
    /// the SRE book's retry budget).
    ///
    /// Must be finite, and from 0 to [`RetryBudget::MAX_RATIO`] (1000). At 0 only the floor
    /// allows retries.
    pub const fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// How far back deposits and withdrawals count. Default: 10 seconds (Finagle, linkerd,
    /// tower's `TpsBudget`).
    ///
    /// Must be more than zero and at most [`RetryBudget::MAX_WINDOW`] (1 hour).
    pub const fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Into how many slots the window is cut; it slides one slot at a time. Default: 10, so
    /// the default window slides by 1 second.
    ///
    /// Must be from 1 to [`RetryBudget::MAX_SLOTS`] (64), and each slot at least
    /// [`RetryBudget::MIN_SLOT`] (10 ms) long. More slots slide more smoothly; each
    /// withdrawal reads every slot, so keep the number small.
    pub const fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    /// Retries allowed per second of window whatever the traffic, added to the ratio's
    /// allowance. Default: 1 (10 retries in the default window; see
    /// [Defaults](RetryBudget#defaults) for why not Finagle's 10). 0 disables the floor.
    pub const fn min_retries_per_sec(mut self, min_retries_per_sec: u32) -> Self {
        self.min_retries_per_sec = min_retries_per_sec;
        self
    }

    /// The clock the budget reads. Default: [`TokioClock`], which follows tokio's paused
    /// time; [`CoarseClock`](overload_core::clock::CoarseClock) costs less per call (see
    /// [Defaults](RetryBudget#defaults) for what it changes).
    pub fn clock<C2: Clock>(self, clock: C2) -> RetryBudgetBuilder<C2> {
        RetryBudgetBuilder {
            ratio: self.ratio,
            window: self.window,
            slots: self.slots,
            min_retries_per_sec: self.min_retries_per_sec,
            clock,
        }
    }

    /// Builds the budget; its slots are counted from the clock's origin.
    ///
    /// The budget's metrics are registered here, with the recorder installed at this
    /// moment: install the recorder before building budgets.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when: `ratio` is not finite, or not from 0 to
    /// 1000; `window` is zero or longer than one hour; `slots` is not from 1 to 64; a slot
    /// (`window / slots`) is shorter than 10 milliseconds.
    pub fn build(self) -> Result<RetryBudget<C>, ConfigError> {
        if !self.ratio.is_finite() {
            return Err(ConfigError::not_finite("ratio", self.ratio));
        }
        if !(0.0..=RetryBudget::MAX_RATIO).contains(&self.ratio) {
            return Err(ConfigError::out_of_range(
                "ratio",
                self.ratio,
                "within 0..=1000",
            ));
        }
        if self.window.is_zero() || self.window > RetryBudget::MAX_WINDOW {
            return Err(ConfigError::out_of_range(
                "window",
                self.window,
                "more than zero and at most 1h",
            ));
        }
        if self.slots == 0 || self.slots > RetryBudget::MAX_SLOTS {
            return Err(ConfigError::out_of_range(
                "slots",
                self.slots,
                "within 1..=64",
            ));
        }
        let slot = self.window / self.slots;
        if slot < RetryBudget::MIN_SLOT {
            return Err(ConfigError::conflict(
                "slots",
                format_args!(
                    "window ({:?}) divided by slots ({}) must be at least 10ms, got {slot:?}",
                    self.window, self.slots
                ),
            ));
        }
        let window = Window::<1>::builder()
            .window(self.window)
            .slots(self.slots)
            .clock(self.clock)
            .build()?;
        // The ratio is at most 1000: at most 10^9 millionths, exact in an f64 and a u64.
        let ratio_units = (self.ratio * SCALE as f64).round() as u64;
        // retries/s * window in ns / 1e9 * SCALE, with SCALE = 1e6: exact in u128, at most
        // 2^32 * 3.6e12 / 1e3 < 2^64.
        let floor_units = u128::from(self.min_retries_per_sec) * self.window.as_nanos() / 1_000;
        let floor_units = u64::try_from(floor_units).unwrap_or(u64::MAX);
        Ok(RetryBudget {
            window,
            ratio: self.ratio,
            min_retries_per_sec: self.min_retries_per_sec,
            ratio_units,
            floor_units,
            allowed: metrics::counter!(RETRIES_ALLOWED),
            refused: metrics::counter!(RETRIES_REFUSED),
        })
    }
}

impl<C: Clock> fmt::Debug for RetryBudgetBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudgetBuilder")
            .field("ratio", &self.ratio)
            .field("window", &self.window)
            .field("slots", &self.slots)
            .field("min_retries_per_sec", &self.min_retries_per_sec)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use overload_core::clock::{CoarseClock, FakeClock};
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    fn budget(ratio: f64, window: Duration, slots: u32, floor: u32) -> RetryBudget {
        RetryBudget::builder()
            .ratio(ratio)
            .window(window)
            .slots(slots)
            .min_retries_per_sec(floor)
            .build()
            .unwrap()
    }

    fn drain(b: &impl Budget) -> usize {
        let mut n = 0;
        while b.withdraw() {
            n += 1;
            assert!(n <= 100_000_000, "budget never runs out");
        }
        n
    }

    fn deposit(b: &impl Budget, n: usize) {
        for _ in 0..n {
            b.deposit();
        }
    }

    #[test]
    fn unlimited_always_allows() {
        let b = Unlimited;
        for _ in 0..1000 {
            assert!(b.withdraw());
        }
        b.deposit();
        assert!(b.withdraw());
    }

    /// Regression for tower issue 857: `TpsBudget` with 0.6 allows 10 retries for 10
    /// deposits, because it rounds the ratio to one retry per whole deposit.
    #[tokio::test(start_paused = true)]
    async fn exact_ratio_six_tenths_allows_six_of_ten() {
        let b = budget(0.6, Duration::from_secs(10), 10, 0);
        deposit(&b, 10);
        assert_eq!(b.remaining(), 6);
        assert_eq!(drain(&b), 6);
        assert_eq!(b.remaining(), 0);
        // One more deposit earns 0.6 of a retry: not enough for a seventh...
        b.deposit();
        assert!(!b.withdraw());
        // ...two more make 12 * 0.6 = 7.2: exactly one more.
        b.deposit();
        assert_eq!(drain(&b), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn default_is_ten_percent_plus_one_per_second() {
        let b = RetryBudget::new();
        assert!((b.ratio() - 0.1).abs() < f64::EPSILON);
        assert_eq!(b.window(), Duration::from_secs(10));
        assert_eq!(b.slots(), 10);
        assert_eq!(b.min_retries_per_sec(), 1);
        // The floor alone: 1 per second over 10 seconds.
        assert_eq!(b.remaining(), 10);
        deposit(&b, 1000);
        assert_eq!(drain(&b), 100 + 10);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_ratio_and_zero_floor_allows_nothing() {
        let b = budget(0.0, Duration::from_secs(1), 1, 0);
        deposit(&b, 1000);
        assert!(!b.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn floor_lets_a_quiet_client_retry() {
        let b = budget(0.1, Duration::from_secs(10), 10, 2);
        // No traffic at all: 2 retries per second of a 10 s window.
        assert_eq!(drain(&b), 20);
        // The floor is a window allowance, renewed as the window slides.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(drain(&b), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn floor_scales_with_a_fractional_window() {
        let b = budget(0.0, Duration::from_millis(500), 5, 10);
        assert_eq!(drain(&b), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn deposits_expire_with_the_window() {
        let b = budget(0.5, Duration::from_secs(10), 10, 0);
        deposit(&b, 10); // slot 0
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(b.remaining(), 5, "slot 0 is still in the window at 9 s");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(b.remaining(), 0, "slot 0 left the window at 10 s");
        assert!(!b.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn window_slides_slot_by_slot() {
        let b = budget(1.0, Duration::from_secs(4), 4, 0);
        deposit(&b, 1); // slot 0
        tokio::time::advance(Duration::from_secs(1)).await;
        deposit(&b, 2); // slot 1
        tokio::time::advance(Duration::from_secs(1)).await;
        deposit(&b, 4); // slot 2
        assert_eq!(b.remaining(), 7);
        tokio::time::advance(Duration::from_secs(2)).await; // slot 4: slot 0 gone
        assert_eq!(b.remaining(), 6);
        tokio::time::advance(Duration::from_secs(1)).await; // slot 5: slot 1 gone
        assert_eq!(b.remaining(), 4);
        tokio::time::advance(Duration::from_secs(1)).await; // slot 6: slot 2 gone
        assert_eq!(b.remaining(), 0);
    }

    /// Three slots share four records: the window's slots must still never collide.
    #[tokio::test(start_paused = true)]
    async fn window_slides_with_a_slot_count_that_is_not_a_power_of_two() {
        let b = budget(1.0, Duration::from_secs(3), 3, 0);
        for (slot, n) in [(0usize, 1), (1, 2), (2, 4), (3, 8), (4, 16)] {
            deposit(&b, n);
            let in_window: usize = [1, 2, 4, 8, 16][slot.saturating_sub(2)..=slot].iter().sum();
            assert_eq!(b.remaining(), in_window as u64, "slot {slot}");
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // Slot 5 holds nothing; slots 3 and 4 still count.
        assert_eq!(b.remaining(), 24);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(b.remaining(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn withdrawals_expire_with_the_window() {
        let b = budget(1.0, Duration::from_secs(2), 2, 0);
        deposit(&b, 3); // slot 0
        assert_eq!(drain(&b), 3); // slot 0
        tokio::time::advance(Duration::from_secs(1)).await;
        deposit(&b, 3); // slot 1: the window holds 6 deposits and 3 withdrawals
        assert_eq!(drain(&b), 3);
        tokio::time::advance(Duration::from_secs(1)).await;
        // Slot 0 (3 deposits, 3 withdrawals) left; slot 1 holds 3 and 3.
        assert_eq!(b.remaining(), 0);
        deposit(&b, 2);
        assert_eq!(drain(&b), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn long_idle_gap_forgets_everything() {
        let b = budget(1.0, Duration::from_secs(10), 10, 0);
        deposit(&b, 100);
        assert_eq!(drain(&b), 100);
        tokio::time::advance(Duration::from_secs(3600 * 24 * 365)).await;
        assert_eq!(b.remaining(), 0);
        deposit(&b, 7);
        assert_eq!(drain(&b), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn refusal_does_not_consume_allowance() {
        let b = budget(0.5, Duration::from_secs(10), 10, 0);
        deposit(&b, 1);
        for _ in 0..10 {
            assert!(!b.withdraw());
        }
        b.deposit();
        assert!(b.withdraw());
    }

    #[test]
    fn invalid_settings_are_refused_by_name() {
        use overload_core::ConfigErrorKind::{Conflict, NotFinite, OutOfRange};
        let cases: [(RetryBudgetBuilder, &str, _, &str); 10] = [
            (
                RetryBudget::builder().ratio(f64::NAN),
                "ratio",
                NotFinite,
                "ratio must be a finite number, got NaN",
            ),
            (
                RetryBudget::builder().ratio(f64::INFINITY),
                "ratio",
                NotFinite,
                "ratio must be a finite number, got inf",
            ),
            (
                RetryBudget::builder().ratio(-0.1),
                "ratio",
                OutOfRange,
                "ratio must be within 0..=1000, got -0.1",
            ),
            (
                RetryBudget::builder().ratio(1000.5),
                "ratio",
                OutOfRange,
                "ratio must be within 0..=1000, got 1000.5",
            ),
            (
                RetryBudget::builder().window(Duration::ZERO),
                "window",
                OutOfRange,
                "window must be more than zero and at most 1h, got 0ns",
            ),
            (
                RetryBudget::builder().window(Duration::from_secs(3601)),
                "window",
                OutOfRange,
                "window must be more than zero and at most 1h, got 3601s",
            ),
            (
                RetryBudget::builder().slots(0),
                "slots",
                OutOfRange,
                "slots must be within 1..=64, got 0",
            ),
            (
                RetryBudget::builder().slots(65),
                "slots",
                OutOfRange,
                "slots must be within 1..=64, got 65",
            ),
            (
                RetryBudget::builder()
                    .window(Duration::from_millis(99))
                    .slots(10),
                "slots",
                Conflict,
                "window (99ms) divided by slots (10) must be at least 10ms, got 9.9ms",
            ),
            (
                RetryBudget::builder()
                    .window(Duration::from_millis(100))
                    .slots(11),
                "slots",
                Conflict,
                "window (100ms) divided by slots (11) must be at least 10ms, got 9.090909ms",
            ),
        ];
        for (builder, field, kind, message) in cases {
            let shown = format!("{builder:?}");
            let err = builder.build().unwrap_err();
            assert_eq!((err.field(), err.kind()), (field, kind), "{shown}");
            assert_eq!(err.to_string(), message, "{shown}");
        }
        // The bounds themselves are valid.
        RetryBudget::builder()
            .ratio(1000.0)
            .window(Duration::from_secs(3600))
            .slots(64)
            .build()
            .unwrap();
        RetryBudget::builder()
            .ratio(0.0)
            .window(Duration::from_millis(100))
            .slots(10)
            .build()
            .unwrap();
    }

    #[test]
    fn defaults_are_the_associated_constants() {
        let b = RetryBudget::new();
        assert_eq!(b.ratio().to_bits(), RetryBudget::DEFAULT_RATIO.to_bits());
        assert_eq!(b.window(), RetryBudget::DEFAULT_WINDOW);
        assert_eq!(b.slots(), RetryBudget::DEFAULT_SLOTS);
        assert_eq!(
            b.min_retries_per_sec(),
            RetryBudget::DEFAULT_MIN_RETRIES_PER_SEC
        );
    }

    /// A budget on a clock the test moves, without a tokio runtime.
    #[test]
    fn any_clock_moves_the_window() {
        let clock = FakeClock::new();
        let b = RetryBudget::builder()
            .ratio(0.5)
            .window(Duration::from_secs(2))
            .slots(2)
            .min_retries_per_sec(0)
            .clock(clock.clone())
            .build()
            .unwrap();
        deposit(&b, 4);
        clock.advance(Duration::from_secs(1));
        assert_eq!(b.remaining(), 2);
        assert!(b.withdraw());
        clock.advance(Duration::from_secs(1));
        // The deposits' slot left; the withdrawal's (slot 1) is still in the window.
        assert_eq!(b.remaining(), 0);
        deposit(&b, 4);
        assert_eq!(b.remaining(), 1);
        assert_eq!(
            format!("{b:?}"),
            "RetryBudget { ratio: 0.5, window: 2s, slots: 2, min_retries_per_sec: 0, remaining: 1 }"
        );
    }

    /// The opt-in coarse clock: the same exact arithmetic.
    #[test]
    fn coarse_clock_budget_is_exact_too() {
        let b = RetryBudget::builder()
            .ratio(0.6)
            .window(Duration::from_secs(3600))
            .min_retries_per_sec(0)
            .clock(CoarseClock::new())
            .build()
            .unwrap();
        deposit(&b, 10);
        assert_eq!(drain(&b), 6);
    }

    /// A tiny ratio over huge traffic: the allowance is computed in 128-bit integers.
    #[test]
    fn allowance_does_not_overflow() {
        let b = RetryBudget::builder()
            .ratio(1000.0)
            .min_retries_per_sec(u32::MAX)
            .window(Duration::from_secs(3600))
            .build()
            .unwrap();
        assert!(b.remaining() > u64::from(u32::MAX));
        assert!(b.withdraw());
    }

    /// The no-overdraw property: many tasks on a multi-threaded runtime race to withdraw
    /// from one budget; exactly the allowance succeeds, never one more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_withdrawals_never_overdraw() {
        for round in 0..20 {
            // A window far longer than the test, so nothing expires while it runs.
            let b = Arc::new(budget(0.6, Duration::from_secs(3600), 10, 0));
            deposit(&*b, 1000 + round);
            let allowance = (1000 + round) * 6 / 10;
            let granted = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let b = Arc::clone(&b);
                    let granted = Arc::clone(&granted);
                    tokio::spawn(async move {
                        for i in 0..50 {
                            if b.withdraw() {
                                granted.fetch_add(1, Ordering::Relaxed);
                            }
                            if i % 8 == 0 {
                                tokio::task::yield_now().await;
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(granted.load(Ordering::Relaxed), allowance, "round {round}");
        }
    }

    /// Deposits and withdrawals racing on real threads: at every moment the withdrawals
    /// granted stay within the allowance of the deposits made before them.
    #[test]
    fn concurrent_deposits_and_withdrawals_never_overdraw() {
        let b = Arc::new(budget(0.25, Duration::from_secs(3600), 10, 0));
        let deposited = Arc::new(AtomicUsize::new(0));
        let granted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let b = Arc::clone(&b);
                let deposited = Arc::clone(&deposited);
                let granted = Arc::clone(&granted);
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        if (i + t) % 2 == 0 {
                            b.deposit();
                            deposited.fetch_add(1, Ordering::SeqCst);
                        } else if b.withdraw() {
                            // Counted after the grant: `granted` may lag, never lead.
                            let g = granted.fetch_add(1, Ordering::SeqCst) + 1;
                            // `deposited` may lag too (counted after the deposit), by at
                            // most one per other thread.
                            let d = deposited.load(Ordering::SeqCst) + 3;
                            assert!(g * 4 <= d, "granted {g} with {d} deposits");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (d, g) = (
            deposited.load(Ordering::SeqCst),
            granted.load(Ordering::SeqCst),
        );
        assert_eq!(d, 40_000);
        assert!(g <= d / 4, "granted {g} of {d}");
        // Whatever was refused during the race is still there, exactly.
        assert_eq!(g + drain(&*b), d / 4);
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_allowed_and_refused() {
        let recorder = TestRecorder::default();
        let b =
            metrics::with_local_recorder(&recorder, || budget(0.5, Duration::from_secs(10), 10, 0));
        metrics::with_local_recorder(&recorder, || {
            deposit(&b, 4);
            for _ in 0..5 {
                b.withdraw();
            }
        });
        assert_eq!(recorder.get(RETRIES_ALLOWED), 2);
        assert_eq!(recorder.get(RETRIES_REFUSED), 3);
    }

    #[derive(Default)]
    struct TestRecorder(std::sync::Mutex<std::collections::HashMap<String, Arc<AtomicU64>>>);

    impl TestRecorder {
        fn get(&self, name: &str) -> u64 {
            self.0.lock().unwrap()[name].load(Ordering::Relaxed)
        }
    }

    impl metrics::Recorder for TestRecorder {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            let c = Arc::clone(
                self.0
                    .lock()
                    .unwrap()
                    .entry(key.name().to_owned())
                    .or_default(),
            );
            metrics::Counter::from_arc(c)
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The allowance is exactly floor(ratio * deposits + floor * window), computed
        /// here in integers from a ratio given in thousandths.
        #[test]
        fn allowance_is_exact(
            ratio_millis in 0u64..5_000,
            deposits in 0u64..2_000,
            floor in 0u32..20,
            window_secs in 1u64..60,
        ) {
            let b = budget(
                ratio_millis as f64 / 1000.0,
                Duration::from_secs(window_secs),
                1,
                floor,
            );
            deposit(&b, deposits as usize);
            let expected = (ratio_millis * deposits + 1000 * u64::from(floor) * window_secs) / 1000;
            prop_assert_eq!(b.remaining(), expected);
            prop_assert_eq!(drain(&b) as u64, expected);
            prop_assert!(!b.withdraw());
        }
    }
}
