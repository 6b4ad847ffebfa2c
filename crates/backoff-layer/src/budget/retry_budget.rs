//! [`RetryBudget`]: retries at most a share of first attempts over a sliding window.

use std::fmt;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics};
use overload_core::window::Window;
use overload_signal::criticality::{RecentLevels, Reserves};
use overload_signal::protocol::Criticality;

use super::contract::Budget;
use super::telemetry::{RetryBudgetMetrics, refusing_began, refusing_ended};

/// Fixed-point scale of the ratio: the ratio is kept in millionths, so the usual ratios
/// (0.1, 0.2, 0.6) are exact, unlike their binary floating-point forms.
const SCALE: u64 = 1_000_000;

/// The window's one added counter: deposits. Withdrawals are its takes.
const DEPOSITS: usize = 0;

/// Whether the budget keeps its refusing episode (for its logs). Not in loom's models: they
/// check the window's atomics, which the episode never touches nor reads, and the
/// episode's own atomics (loom's too under `cfg(loom)`) multiplied the interleavings each
/// model explores about seven-fold.
const LOGS_EPISODES: bool = !cfg!(loom);

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
/// - **name `"default"`**, or the name of the retry layer that made the budget (a layer
///   built without [`budget`](crate::RetryBuilder::budget) makes its own): the label `name`
///   of the budget's metrics and the field `name` of its logs. A budget shared by several
///   layers is built by you and named by [`name`](RetryBudgetBuilder::name); it reports
///   once, under its own name, whichever layer's retry it refused.
/// - **clock: [`TokioClock`]**, so under `tokio::time::pause()` the window slides with the
///   paused clock. [`CoarseClock`](overload_core::clock::CoarseClock) (through
///   [`clock`](RetryBudgetBuilder::clock)) reads the time in a few nanoseconds instead of
///   tens, which is most of a deposit's cost; slots then start up to one kernel tick (1 to
///   10 ms) late, and paused time no longer moves the budget.
///
/// # Levels of criticality
///
/// The retry layer tells the budget each request's [`Criticality`] (the level it carries on
/// the wire, `critical` when none), and the budget sheds retries from the bottom: a level
/// draws only from the allowance above its [reserve](RetryBudgetBuilder::reserves) while a
/// higher level deposited or withdrew in the last window:
///
/// ```text
/// retries + 1 <= allowance - share(level) * allowance      (a higher level active)
/// retries + 1 <= allowance                                  (otherwise)
/// ```
///
/// where `allowance` is the right-hand side above and `retries` counts every level's.
/// With the default [`Reserves`] (`sheddable` 0.5, `sheddable-plus` 0.25, `critical` 0.1,
/// `critical-plus` 0), in a storm a client's `sheddable` retries stop once half the
/// allowance is spent, its `critical` ones at 90 %, and `critical-plus` takes the rest.
///
/// What this guarantees: **while a lower level's retry is granted, no higher level's retry
/// is refused** at the same moment (a higher level's reserve is smaller: shares fall with the
/// level, as [`Reserves`] enforces), and a client whose requests are all of one level (or a
/// budget with [`Reserves::none()`]) is limited exactly as without levels. It does not hold
/// across time: a `sheddable` retry granted early in a window spends allowance a later
/// `critical` retry may miss; the reserve bounds what lower levels can spend to
/// `1 - share` of the allowance. A level counts as active for one window (10 s by default)
/// after its last deposit or withdrawal. [`deposit`](Budget::deposit) and
/// [`withdraw`](Budget::withdraw) without a level are `critical`'s.
///
/// ```
/// use backoff_layer::budget::{Budget, RetryBudget};
/// use overload_signal::criticality::Reserves;
/// use overload_signal::protocol::Criticality::{Critical, Sheddable};
///
/// // No ratio: the floor alone, 10 retries in the window.
/// let budget = RetryBudget::builder().ratio(0.0).build()?;
/// budget.deposit_at(Critical);
/// // Critical is active: sheddable takes only the half above its reserve...
/// assert_eq!((0..10).filter(|_| budget.withdraw_at(Sheddable)).count(), 5);
/// // ...and critical the rest.
/// assert_eq!((0..10).filter(|_| budget.withdraw_at(Critical)).count(), 5);
///
/// // Without reserves, levels share the allowance as one.
/// let flat = RetryBudget::builder().ratio(0.0).reserves(Reserves::none()).build()?;
/// flat.deposit_at(Critical);
/// assert_eq!((0..12).filter(|_| flat.withdraw_at(Sheddable)).count(), 10);
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
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
    /// The counters `backoff_layer_budget_retries_{allowed,refused}_total{name}`,
    /// registered on the first deposit (the first request), with the recorder of that
    /// moment.
    metrics: LazyMetrics<RetryBudgetMetrics>,
    /// Refusing retries: begins at a refusal, ends once a whole window has passed without
    /// one (every refusal has then left the window).
    refusing: Episode,
    /// The share of the allowance each level may not take while a higher one is active.
    reserves: Reserves,
    /// Which levels deposited or withdrew in the last window.
    recent: RecentLevels,
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

    /// The default budget of a retry layer named `name`: the defaults, under the layer's
    /// name.
    pub(crate) fn named(name: LayerName) -> Self {
        Self::builder()
            .build_named(name)
            .expect("the default retry budget configuration is valid")
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

    /// The share of the allowance each level may not take while a higher level is active.
    pub fn reserves(&self) -> Reserves {
        self.reserves
    }

    /// The budget's name: the label `name` of its metrics and the field `name` of its logs.
    pub fn name(&self) -> &str {
        self.metrics.name().as_str()
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

    /// Ends the refusing episode, and logs its end, if no retry has been refused for a
    /// whole window at `now`.
    #[cold]
    fn end_refusing(&self, now: u64) {
        if let Some(ended) = self.refusing.quiet_for(self.window.window(), now) {
            refusing_ended(self.metrics.name(), ended);
        }
    }
}

impl<C: Clock> Budget for RetryBudget<C> {
    #[inline]
    fn deposit(&self) {
        self.deposit_at(Criticality::default());
    }

    #[inline]
    fn withdraw(&self) -> bool {
        self.withdraw_at(Criticality::default())
    }

    #[inline]
    fn deposit_at(&self, level: Criticality) {
        let now = self.window.clock().now();
        self.recent.note(level, now);
        self.window.add(self.window.slot_at(now), DEPOSITS, 1);
        // NOTE: the first deposit is the first request: the counters are registered then,
        // at zero, so they exist before the first retry. Later, one atomic load.
        self.metrics.get();
        // NOTE: a refusing episode ends on the first request after a quiet window; no task
        // runs for it. Outside an episode this is one relaxed load.
        if LOGS_EPISODES && self.refusing.is_active() {
            self.end_refusing(now);
        }
    }

    fn withdraw_at(&self, level: Criticality) -> bool {
        let now = self.window.clock().now();
        let slot = self.window.slot_at(now);
        self.recent.note(level, now);
        // NOTE: whether a share is held back is decided once, before the compare-and-swap
        // loop (`RecentLevels::held_back` split in two): it reads other atomics than the
        // window's, and a retry of the loop must not change its mind on them.
        let reserved = self.reserves.share(level) > 0.0 && self.recent.higher_active(level, now);
        // NOTE: the window calls this with the withdrawals exact as of the moment the retry
        // is granted (it re-checks if another withdrawal got in first): never an overdraw.
        let granted = self.window.try_take(slot, |counts| {
            let earned = self.earned(counts.added(DEPOSITS));
            let held = if reserved {
                let capacity = u64::try_from(earned).unwrap_or(u64::MAX);
                u128::from(self.reserves.held_back(level, capacity))
            } else {
                0
            };
            u128::from(counts.taken() + 1) * u128::from(SCALE) <= earned - held
        });
        let metrics = self.metrics.get();
        if granted {
            metrics.allowed.increment(1);
            if LOGS_EPISODES && self.refusing.is_active() {
                self.end_refusing(now);
            }
        } else {
            metrics.refused[level.rank()].increment(1);
            if LOGS_EPISODES && self.refusing.seen(now) {
                refusing_began(self.metrics.name(), self.ratio, self.window.window());
            }
        }
        granted
    }
}

impl<C: Clock> fmt::Debug for RetryBudget<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NOTE: `remaining` only reads (regression: it used to move the window, so printing
        // a budget changed it).
        f.debug_struct("RetryBudget")
            .field("name", self.metrics.name())
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
    name: Option<String>,
    ratio: f64,
    window: Duration,
    slots: u32,
    min_retries_per_sec: u32,
    reserves: Reserves,
    clock: C,
}

impl RetryBudgetBuilder {
    /// A builder with the defaults: ratio 0.1, window 10 s, 10 slots, 1 retry per second,
    /// [`TokioClock`].
    pub fn new() -> Self {
        Self {
            name: None,
            ratio: RetryBudget::DEFAULT_RATIO,
            window: RetryBudget::DEFAULT_WINDOW,
            slots: RetryBudget::DEFAULT_SLOTS,
            min_retries_per_sec: RetryBudget::DEFAULT_MIN_RETRIES_PER_SEC,
            reserves: Reserves::new(),
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

    /// The share of the allowance each level of [`Criticality`] may not take while a higher
    /// level deposited or withdrew in the last window. Default: [`Reserves::new()`]
    /// (`sheddable` 0.5, `sheddable-plus` 0.25, `critical` 0.1, `critical-plus` 0);
    /// [`Reserves::none()`] makes every level draw from the whole allowance. See
    /// [Levels of criticality](RetryBudget#levels-of-criticality).
    pub const fn reserves(mut self, reserves: Reserves) -> Self {
        self.reserves = reserves;
        self
    }

    /// The budget's name: the label `name` of its metrics
    /// (`backoff_layer_budget_retries_allowed_total{name="..."}`) and the field `name` of
    /// its logs. Name a budget you share between layers, or build for one downstream, after
    /// that downstream. Non-empty printable ASCII, at most 128 bytes. Default: `"default"`
    /// (a retry layer's own default budget takes the layer's name instead).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The clock the budget reads. Default: [`TokioClock`], which follows tokio's paused
    /// time; [`CoarseClock`](overload_core::clock::CoarseClock) costs less per call (see
    /// [Defaults](RetryBudget#defaults) for what it changes).
    pub fn clock<C2: Clock>(self, clock: C2) -> RetryBudgetBuilder<C2> {
        RetryBudgetBuilder {
            name: self.name,
            ratio: self.ratio,
            window: self.window,
            slots: self.slots,
            min_retries_per_sec: self.min_retries_per_sec,
            reserves: self.reserves,
            clock,
        }
    }

    /// Builds the budget; its slots are counted from the clock's origin.
    ///
    /// Nothing is registered with a metrics recorder here: the budget's counters are
    /// registered on its first deposit (its first request), with the recorder installed
    /// then, so a budget may be built before the recorder is installed.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when: `name` is empty, longer than 128 bytes or
    /// not printable ASCII; `ratio` is not finite, or not from 0 to 1000; `window` is zero
    /// or longer than one hour; `slots` is not from 1 to 64; a slot (`window / slots`) is
    /// shorter than 10 milliseconds.
    pub fn build(mut self) -> Result<RetryBudget<C>, ConfigError> {
        let name = match self.name.take() {
            Some(name) => LayerName::new(name)?,
            None => LayerName::default(),
        };
        self.build_named(name)
    }

    /// [`build`](Self::build), under a name already checked.
    fn build_named(self, name: LayerName) -> Result<RetryBudget<C>, ConfigError> {
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
            metrics: LazyMetrics::new(name),
            refusing: Episode::new(),
            reserves: self.reserves,
            recent: RecentLevels::new(self.window),
        })
    }
}

impl<C: Clock> fmt::Debug for RetryBudgetBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudgetBuilder")
            .field("name", &self.name)
            .field("ratio", &self.ratio)
            .field("window", &self.window)
            .field("slots", &self.slots)
            .field("min_retries_per_sec", &self.min_retries_per_sec)
            .field("reserves", &self.reserves)
            .finish_non_exhaustive()
    }
}
