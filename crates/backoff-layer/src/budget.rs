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
//! let budget = RetryBudget::default();
//! for _ in 0..100 {
//!     budget.deposit(); // 100 first attempts earn 10 retries, plus the floor of 10
//! }
//! let allowed = (0..100).filter(|_| budget.withdraw()).count();
//! assert_eq!(allowed, 20);
//! ```
//!
//! A customised budget, built with the fallible builder:
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::budget::{Budget, RetryBudget};
//!
//! let budget = RetryBudget::builder()
//!     .ratio(0.6)
//!     .window(Duration::from_secs(30))
//!     .slots(30)
//!     .min_retries_per_sec(0)
//!     .build()
//!     .expect("a valid budget");
//! for _ in 0..10 {
//!     budget.deposit();
//! }
//! // Exactly 60% of 10 first attempts: 6 retries, not one more.
//! assert_eq!((0..10).filter(|_| budget.withdraw()).count(), 6);
//!
//! // Invalid configuration cannot be built.
//! let err = RetryBudget::builder().ratio(f64::NAN).build().unwrap_err();
//! assert_eq!(err.to_string(), "retry budget ratio must be a finite number");
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

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

/// Bits of a slot number in a packed word; the low [`COUNT_BITS`] hold a withdrawal count.
const COUNT_BITS: u32 = 28;
/// Mask of the withdrawal count in a packed word.
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// The largest slot number: with the shortest slot (10 ms) it is reached after 21 years.
const EPOCH_MAX: u64 = (1 << (64 - COUNT_BITS)) - 1;

/// The largest number of retries one window can allow: 2^27 - 1 (134,217,727). Withdrawals
/// are counted modulo 2^28 in the packed word, so counts in one window must stay well below
/// that to be compared unambiguously.
pub const MAX_RETRIES_PER_WINDOW: u64 = (1 << (COUNT_BITS - 1)) - 1;

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
/// [`RetryBudget::default()`] and [`RetryBudget::builder()`] start from:
///
/// - **ratio 0.1**: retries may add at most 10% to the load. The figure is the paper's
///   ("retries at most 10% of requests") and the Google SRE book's per-client retry
///   budget (chapter "Handling Overload").
/// - **window 10 seconds, in 10 slots of 1 second**: the window length is the one
///   Finagle, linkerd and tower's `TpsBudget` use; the window slides one slot at a time,
///   so it spans between 9 and 10 seconds of history.
/// - **floor 1 retry per second** (10 per default window), so a quiet client that sends a
///   request a minute can still retry a transient failure. Finagle and linkerd use 10 per
///   second with a ratio of 0.2; this budget uses 1 because the floor is added to the ratio's
///   allowance for every budget: at 10 per second, a client sending fewer than 100 requests
///   per second would get more than twice its 10% share, and a fleet of quiet clients would
///   retry far more than 10% in total.
///
/// # Sharing and cost
///
/// One `RetryBudget` is meant to be shared by every clone of a client, behind an `Arc`
/// (the retry layer holds it as `Arc<dyn Budget>`). Both operations are lock-free: a
/// deposit reads the clock and the current slot (a word that changes once a slot) and
/// adds to a counter; a withdrawal also reads
/// the counts at the start of the window and takes its retry with a compare-and-swap
/// loop, so concurrent withdrawals never take more than the allowance.
///
/// Time comes from [`tokio::time::Instant`], so under `tokio::time::pause()` the window
/// slides with the paused clock.
///
/// # Precision
///
/// - The ratio is kept in millionths (0.1234567 acts as 0.123457).
/// - A deposit racing with the start of a new slot may be counted in either slot. A
///   withdrawal racing with deposits may not see them yet, and a withdrawal racing with
///   the start of a new slot is checked against the window of the new slot: every
///   granted withdrawal keeps `retries <= ratio * first_attempts + floor` in the window
///   it was checked against.
/// - At most [`MAX_RETRIES_PER_WINDOW`] retries are allowed in one window, however large
///   the ratio and the traffic.
/// - Slots are numbered from the budget's creation in 36 bits; after 2^36 slots (21 years
///   with the shortest 10 ms slot, 2000 years with the default 1 s) the window stops
///   sliding and the ratio then applies to all deposits since.
pub struct RetryBudget {
    /// The current slot and the withdrawals so far, packed: `slot << 28 | withdrawals`.
    /// Every successful withdrawal is a compare-and-swap on this word.
    head: CachePadded<AtomicU64>,
    /// Deposits since creation. Not part of `head`: a withdrawal that misses a concurrent
    /// deposit only errs on the strict side.
    deposits: CachePadded<AtomicU64>,
    /// The slot of `head`, or an older one: raised after `head` moves. A deposit in this slot
    /// reads only this word, which changes once a slot, not `head`, which every granted
    /// withdrawal changes.
    slot: CachePadded<AtomicU64>,
    /// For slot `s`, at index `s & index_mask`: the counts when `s` became current. The
    /// length is the number of slots rounded up to a power of two, so the slots of one
    /// window never share a record and indexing needs no division.
    starts: Box<[SlotStart]>,
    index_mask: u64,
    origin: Instant,
    slot_nanos: u64,
    ratio_units: u64,
    floor_units: u64,
    allowed: metrics::Counter,
    refused: metrics::Counter,
    config: RetryBudgetBuilder,
}

/// The cumulative counts at the start of one slot.
#[derive(Debug)]
struct SlotStart {
    /// `slot << 28 | withdrawals`, written after `deposits`.
    tag: AtomicU64,
    /// Deposits when the slot began; only ever raised (`fetch_max`), so a late writer from
    /// an older slot cannot lower it.
    deposits: AtomicU64,
}

/// Keeps a hot atomic on its own cache line, so deposits and withdrawals from different
/// cores do not invalidate each other's unrelated data.
#[derive(Debug, Default)]
#[repr(align(128))]
struct CachePadded<T>(T);

impl std::ops::Deref for CachePadded<AtomicU64> {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

const fn pack(epoch: u64, withdrawals: u64) -> u64 {
    (epoch << COUNT_BITS) | (withdrawals & COUNT_MASK)
}

const fn epoch_of(word: u64) -> u64 {
    word >> COUNT_BITS
}

const fn count_of(word: u64) -> u64 {
    word & COUNT_MASK
}

/// Whether withdrawal count `a` is later than `b`. Counts wrap at 2^28; two counts read
/// around one slot boundary differ by at most an allowance, under 2^27. A misjudged order
/// could only keep an older (smaller) count, which counts more withdrawals in the window:
/// stricter, never more generous.
const fn count_after(a: u64, b: u64) -> bool {
    let d = a.wrapping_sub(b) & COUNT_MASK;
    d != 0 && d < (1 << (COUNT_BITS - 1))
}

impl RetryBudget {
    /// A builder starting from the defaults (see [Defaults](#defaults)).
    pub fn builder() -> RetryBudgetBuilder {
        RetryBudgetBuilder::new()
    }

    /// The ratio of retries to first attempts.
    pub fn ratio(&self) -> f64 {
        self.config.ratio
    }

    /// The length of the sliding window.
    pub fn window(&self) -> Duration {
        self.config.window
    }

    /// The number of slots the window slides by.
    pub fn slots(&self) -> u32 {
        self.config.slots
    }

    /// The floor, in retries per second of window.
    pub fn min_retries_per_sec(&self) -> u32 {
        self.config.min_retries_per_sec
    }

    /// How many retries the budget would allow now, without taking any.
    ///
    /// A snapshot: concurrent deposits and withdrawals change it at once.
    pub fn remaining(&self) -> u64 {
        let nanos = self.elapsed_nanos();
        loop {
            let seen = self.head.load(Ordering::Acquire);
            let current = self.epoch_at(nanos, seen);
            if epoch_of(seen) < current {
                // The window has moved since the last call: count as if it had slid.
                self.rotate(seen, current);
                continue;
            }
            let Some((withdrawn, deposited)) = self.in_window(seen) else {
                continue;
            };
            let earned = self.earned(deposited);
            return (earned / u128::from(SCALE))
                .saturating_sub(u128::from(withdrawn))
                .try_into()
                .unwrap_or(u64::MAX);
        }
    }

    /// Nanoseconds since the budget was built, by tokio's clock.
    fn elapsed_nanos(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()))
    }

    /// The slot at `nanos`, or `head`'s if that is as new: the common case, a call in the
    /// current slot, costs a multiplication instead of a division.
    fn epoch_at(&self, nanos: u64, head: u64) -> u64 {
        let current = epoch_of(head);
        if nanos < (current + 1).saturating_mul(self.slot_nanos) {
            current
        } else {
            (nanos / self.slot_nanos).min(EPOCH_MAX)
        }
    }

    fn start(&self, epoch: u64) -> &SlotStart {
        // The mask is below the length of `starts`, so this never goes out of bounds.
        &self.starts[(epoch & self.index_mask) as usize]
    }

    /// Allowance earned by `deposited` first attempts, in millionths of a retry, capped so
    /// the window never allows more than [`MAX_RETRIES_PER_WINDOW`].
    fn earned(&self, deposited: u64) -> u128 {
        let earned =
            u128::from(self.ratio_units) * u128::from(deposited) + u128::from(self.floor_units);
        earned.min(u128::from(MAX_RETRIES_PER_WINDOW) * u128::from(SCALE))
    }

    /// Withdrawals and deposits in the window ending at the slot of `head`, or `None` if
    /// the slot records were reused meanwhile (the caller reloads `head`).
    fn in_window(&self, head: u64) -> Option<(u64, u64)> {
        let current = epoch_of(head);
        let n = u64::from(self.config.slots);
        // NOTE: the oldest slot with a record is the start of the window: a slot without
        // one saw no calls, so the counts at the start of the next recorded slot are the
        // counts at the end of the last slot before the window.
        for epoch in current.saturating_sub(n - 1)..=current {
            let start = self.start(epoch);
            let tag = start.tag.load(Ordering::Acquire);
            if epoch_of(tag) == epoch {
                let withdrawn = count_of(head).wrapping_sub(count_of(tag)) & COUNT_MASK;
                // Read after the tag (acquire): at least the value written with it.
                let deposited_before = start.deposits.load(Ordering::Acquire);
                let deposited = self
                    .deposits
                    .load(Ordering::Acquire)
                    .saturating_sub(deposited_before);
                return Some((withdrawn, deposited));
            }
        }
        None
    }

    /// Makes slot `to` current, if `head` still reads `seen` (an older slot).
    fn rotate(&self, seen: u64, to: u64) {
        let withdrawn = count_of(seen);
        let start = self.start(to);
        // NOTE: deposits first, then the tag (release): a reader that sees the tag sees
        // a deposit count at least this recent. `fetch_max` because deposits only grow,
        // so a late writer for an older slot can only leave a larger (stricter) value.
        start
            .deposits
            .fetch_max(self.deposits.load(Ordering::Acquire), Ordering::AcqRel);
        let new_tag = pack(to, withdrawn);
        let mut tag = start.tag.load(Ordering::Acquire);
        loop {
            let (epoch, count) = (epoch_of(tag), count_of(tag));
            // A newer slot's record, or a later count of the same slot, is already there.
            if epoch > to || (epoch == to && !count_after(withdrawn, count)) {
                break;
            }
            match start
                .tag
                .compare_exchange_weak(tag, new_tag, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(actual) => tag = actual,
            }
        }
        // NOTE: the slot's record is written before `head` moves to it, so whoever sees
        // the new `head` finds the record. Failure means someone else moved `head`, or a
        // withdrawal raised the count; the caller reloads and tries again.
        if self
            .head
            .compare_exchange(
                seen,
                pack(to, withdrawn),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            self.slot.fetch_max(to, Ordering::Relaxed);
        }
    }
}

impl Budget for RetryBudget {
    fn deposit(&self) {
        let nanos = self.elapsed_nanos();
        // NOTE: `slot` never runs ahead of `head`, so a call within its slot is within
        // `head`'s too: nothing to rotate.
        let slot = self.slot.load(Ordering::Relaxed);
        if nanos >= (slot + 1).saturating_mul(self.slot_nanos) {
            let mut seen = self.head.load(Ordering::Acquire);
            loop {
                let now = self.epoch_at(nanos, seen);
                if epoch_of(seen) >= now {
                    break;
                }
                self.rotate(seen, now);
                seen = self.head.load(Ordering::Acquire);
            }
            self.slot.fetch_max(epoch_of(seen), Ordering::Relaxed);
        }
        self.deposits.fetch_add(1, Ordering::Relaxed);
    }

    fn withdraw(&self) -> bool {
        let nanos = self.elapsed_nanos();
        loop {
            let seen = self.head.load(Ordering::Acquire);
            let epoch = epoch_of(seen);
            let now = self.epoch_at(nanos, seen);
            if epoch < now {
                self.rotate(seen, now);
                continue;
            }
            let Some((withdrawn, deposited)) = self.in_window(seen) else {
                continue;
            };
            let wanted = u128::from(withdrawn + 1) * u128::from(SCALE);
            if wanted > self.earned(deposited) {
                self.refused.increment(1);
                return false;
            }
            // NOTE: the whole decision rests on `seen`: if any withdrawal (or a new slot)
            // got in between, the swap fails and the check is made again on fresh counts.
            // This is what keeps concurrent withdrawals from overdrawing.
            if self
                .head
                .compare_exchange_weak(
                    seen,
                    pack(epoch, count_of(seen) + 1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.allowed.increment(1);
                return true;
            }
        }
    }
}

impl Default for RetryBudget {
    /// The defaults: ratio 0.1, window 10 s in 10 slots, floor 1 retry per second. See
    /// [Defaults](#defaults) for their sources.
    fn default() -> Self {
        RetryBudgetBuilder::new()
            .build()
            .expect("the default retry budget configuration is valid")
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &self.config.ratio)
            .field("window", &self.config.window)
            .field("slots", &self.config.slots)
            .field("min_retries_per_sec", &self.config.min_retries_per_sec)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// Builds a [`RetryBudget`]; every setting starts at its default.
///
/// [`build`](Self::build) checks the settings; see [`InvalidBudget`] for the rules.
#[derive(Clone, Debug)]
pub struct RetryBudgetBuilder {
    ratio: f64,
    window: Duration,
    slots: u32,
    min_retries_per_sec: u32,
}

impl Default for RetryBudgetBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudgetBuilder {
    /// The default ratio: retries may be 10% of first attempts (paper; Google SRE book).
    pub const DEFAULT_RATIO: f64 = 0.1;
    /// The default window: 10 seconds (Finagle, linkerd, tower's `TpsBudget`).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
    /// The default number of slots: 10, so the default window slides by 1 second.
    pub const DEFAULT_SLOTS: u32 = 10;
    /// The default floor: 1 retry per second of window.
    pub const DEFAULT_MIN_RETRIES_PER_SEC: u32 = 1;
    /// The largest ratio accepted: 1000 retries per first attempt, Finagle's bound.
    pub const MAX_RATIO: f64 = 1000.0;
    /// The longest window accepted: 1 hour; a budget over longer spans no longer reacts
    /// to an outage.
    pub const MAX_WINDOW: Duration = Duration::from_secs(3600);
    /// The most slots accepted: 64; a withdrawal may look at every slot.
    pub const MAX_SLOTS: u32 = 64;
    /// The shortest slot (window divided by slots) accepted: 10 milliseconds.
    pub const MIN_SLOT: Duration = Duration::from_millis(10);

    /// A builder with the defaults: ratio 0.1, window 10 s, 10 slots, 1 retry per second.
    pub const fn new() -> Self {
        Self {
            ratio: Self::DEFAULT_RATIO,
            window: Self::DEFAULT_WINDOW,
            slots: Self::DEFAULT_SLOTS,
            min_retries_per_sec: Self::DEFAULT_MIN_RETRIES_PER_SEC,
        }
    }

    /// Retries allowed per first attempt in the window. Default 0.1.
    ///
    /// Must be finite, and from 0 to [`MAX_RATIO`](Self::MAX_RATIO). At 0 only the floor
    /// allows retries.
    pub const fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// How far back deposits and withdrawals count. Default 10 seconds.
    ///
    /// Must be more than zero and at most [`MAX_WINDOW`](Self::MAX_WINDOW).
    pub const fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Into how many slots the window is cut; it slides one slot at a time. Default 10.
    ///
    /// Must be from 1 to [`MAX_SLOTS`](Self::MAX_SLOTS), and each slot at least
    /// [`MIN_SLOT`](Self::MIN_SLOT) long. More slots slide more smoothly; each withdrawal
    /// may look at every slot, so keep the number small.
    pub const fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    /// Retries allowed per second of window whatever the traffic, added to the ratio's
    /// allowance. Default 1 (10 retries in the default window). 0 disables the floor.
    pub const fn min_retries_per_sec(mut self, min_retries_per_sec: u32) -> Self {
        self.min_retries_per_sec = min_retries_per_sec;
        self
    }

    /// Builds the budget; its window starts now (by [`tokio::time::Instant`]).
    ///
    /// The budget's metrics are registered here, with the recorder installed at this
    /// moment: install the recorder before building budgets.
    ///
    /// # Errors
    ///
    /// [`InvalidBudget`] if a setting breaks one of the rules listed there.
    pub fn build(&self) -> Result<RetryBudget, InvalidBudget> {
        if !self.ratio.is_finite() {
            return Err(InvalidBudget(Kind::RatioNotFinite));
        }
        if self.ratio < 0.0 {
            return Err(InvalidBudget(Kind::RatioNegative));
        }
        if self.ratio > Self::MAX_RATIO {
            return Err(InvalidBudget(Kind::RatioTooLarge));
        }
        if self.window.is_zero() {
            return Err(InvalidBudget(Kind::WindowZero));
        }
        if self.window > Self::MAX_WINDOW {
            return Err(InvalidBudget(Kind::WindowTooLong));
        }
        if self.slots == 0 || self.slots > Self::MAX_SLOTS {
            return Err(InvalidBudget(Kind::Slots));
        }
        let slot = self.window / self.slots;
        if slot < Self::MIN_SLOT {
            return Err(InvalidBudget(Kind::SlotTooShort));
        }
        let slot_nanos = u64::try_from(slot.as_nanos()).unwrap_or(u64::MAX);
        let ratio_units = (self.ratio * SCALE as f64).round() as u64;
        // retries/s * window in ns / 1e9 * SCALE, with SCALE = 1e6: exact in u128.
        let floor_units = u128::from(self.min_retries_per_sec) * self.window.as_nanos() / 1_000;
        let floor_units = u64::try_from(floor_units).unwrap_or(u64::MAX);
        let records = self.slots.next_power_of_two();
        let starts = (0..records)
            .map(|_| SlotStart {
                // Slot 0 starts with nothing deposited or withdrawn; the other records
                // hold slot 0, which never maps to their index, so they read as empty.
                tag: AtomicU64::new(pack(0, 0)),
                deposits: AtomicU64::new(0),
            })
            .collect();
        Ok(RetryBudget {
            head: CachePadded(AtomicU64::new(pack(0, 0))),
            deposits: CachePadded(AtomicU64::new(0)),
            slot: CachePadded(AtomicU64::new(0)),
            starts,
            index_mask: u64::from(records - 1),
            origin: Instant::now(),
            slot_nanos,
            ratio_units,
            floor_units,
            allowed: metrics::counter!(RETRIES_ALLOWED),
            refused: metrics::counter!(RETRIES_REFUSED),
            config: self.clone(),
        })
    }
}

/// A [`RetryBudget`] setting is invalid.
///
/// The rules [`RetryBudgetBuilder::build`] checks:
///
/// - the ratio is a finite number, not negative, and at most 1000;
/// - the window is more than zero and at most one hour;
/// - the number of slots is from 1 to 64;
/// - a slot (the window divided by the number of slots) is at least 10 milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidBudget(Kind);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RatioNotFinite,
    RatioNegative,
    RatioTooLarge,
    WindowZero,
    WindowTooLong,
    Slots,
    SlotTooShort,
}

impl fmt::Display for InvalidBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Kind::RatioNotFinite => "retry budget ratio must be a finite number",
            Kind::RatioNegative => "retry budget ratio must not be negative",
            Kind::RatioTooLarge => "retry budget ratio must be at most 1000",
            Kind::WindowZero => "retry budget window must be more than zero",
            Kind::WindowTooLong => "retry budget window must be at most one hour",
            Kind::Slots => "retry budget slots must be from 1 to 64",
            Kind::SlotTooShort => {
                "retry budget slot (window divided by slots) must be at least 10 milliseconds"
            }
        })
    }
}

impl std::error::Error for InvalidBudget {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    fn budget(ratio: f64, window: Duration, slots: u32, floor: u32) -> RetryBudget {
        RetryBudget::builder()
            .ratio(ratio)
            .window(window)
            .slots(slots)
            .min_retries_per_sec(floor)
            .build()
            .unwrap()
    }

    fn drain(b: &RetryBudget) -> usize {
        let mut n = 0;
        while b.withdraw() {
            n += 1;
            assert!(n <= 100_000_000, "budget never runs out");
        }
        n
    }

    fn deposit(b: &RetryBudget, n: usize) {
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
        let b = RetryBudget::default();
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
    fn invalid_settings_are_refused_with_clear_messages() {
        let cases: [(RetryBudgetBuilder, &str); 9] = [
            (
                RetryBudget::builder().ratio(f64::NAN),
                "retry budget ratio must be a finite number",
            ),
            (
                RetryBudget::builder().ratio(f64::INFINITY),
                "retry budget ratio must be a finite number",
            ),
            (
                RetryBudget::builder().ratio(-0.1),
                "retry budget ratio must not be negative",
            ),
            (
                RetryBudget::builder().ratio(1000.5),
                "retry budget ratio must be at most 1000",
            ),
            (
                RetryBudget::builder().window(Duration::ZERO),
                "retry budget window must be more than zero",
            ),
            (
                RetryBudget::builder().window(Duration::from_secs(3601)),
                "retry budget window must be at most one hour",
            ),
            (
                RetryBudget::builder().slots(0),
                "retry budget slots must be from 1 to 64",
            ),
            (
                RetryBudget::builder().slots(65),
                "retry budget slots must be from 1 to 64",
            ),
            (
                RetryBudget::builder()
                    .window(Duration::from_millis(99))
                    .slots(10),
                "retry budget slot (window divided by slots) must be at least 10 milliseconds",
            ),
        ];
        for (builder, message) in cases {
            let err = builder.build().unwrap_err();
            assert_eq!(err.to_string(), message, "{builder:?}");
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
    fn count_order_wraps() {
        assert!(count_after(1, 0));
        assert!(!count_after(0, 0));
        assert!(!count_after(0, 1));
        assert!(count_after(0, COUNT_MASK));
        assert!(count_after(3, COUNT_MASK - 2));
    }

    /// The no-overdraw property: many tasks on a multi-threaded runtime race to withdraw
    /// from one budget; exactly the allowance succeeds, never one more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_withdrawals_never_overdraw() {
        for round in 0..20 {
            // A window far longer than the test, so nothing expires while it runs.
            let b = Arc::new(budget(0.6, Duration::from_secs(3600), 10, 0));
            deposit(&b, 1000 + round);
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
        assert_eq!(g + drain(&b), d / 4);
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
