//! One time-slotted atomic window: counts per slot over the last few seconds, lock-free.
//!
//! Every "how many over the last N seconds" of the workspace is one [`Window`]: the attempt
//! histogram (six counters per slot, one per attempt class), the retry budget (deposits, and
//! withdrawals that must never overdraw), and whatever counts per slot comes next.
//!
//! # The model
//!
//! Time, read from a [`Clock`], is cut into **slots** of equal width; slot `s` covers
//! `[s * width, (s + 1) * width)` nanoseconds of the clock. The **window ending at slot `s`**
//! is `s` and the `slots - 1` slots before it, so it covers between `window - width` and
//! `window` of history, and slides one slot at a time: a slot leaves it whole.
//!
//! Each slot has:
//!
//! - `N` **added** counters ([`add`](Window::add)), for what every request writes. They are
//!   striped: each thread writes to a stripe of its own (threads are numbered as they first
//!   write; a pool of `n` threads uses `n` stripes when there are that many), each stripe on
//!   cache lines of its own, so cores do not fight over one word. A sum reads every stripe.
//! - one exact **taken** counter ([`try_take`](Window::try_take)), for admissions that must
//!   never exceed what the window allows: a take is checked against the window's counts and
//!   granted with a compare-and-swap on one word that holds the current slot and its takes,
//!   so two takes can never both pass the same check.
//!
//! [`counts`](Window::counts) sums a window: both kinds of counter over every slot in it.
//!
//! # Guarantees
//!
//! - **Lock-free, and no thread ever waits for another.** Every loop retries only because
//!   another thread changed the same word, that is, made progress; no thread spins while
//!   another finishes a step. A new slot is started by whoever first writes in it, in the
//!   same compare-and-swap that counts the write.
//! - **No lost write.** A write counts in its slot, and every sum of a window that holds the
//!   slot sees it once it is done, except a write whose slot had already left every window
//!   (its thread read the clock, then stalled while others moved a whole window on).
//! - **Takes never overdraw.** A granted take was checked, by the caller's `allow`, against
//!   the window's takes as they were when it was granted: with `allow` "fewer than `k`", a
//!   window never holds more than `k` takes. Added counts it was checked against may miss
//!   writes still in flight, which can only make a check stricter.
//! - **Reads change nothing.** [`counts`](Window::counts) and
//!   [`slot_counts`](Window::slot_counts) only load.
//!
//! # Limits
//!
//! - An added counter saturates at `u32::MAX` (4,294,967,295) per slot and stripe; sums are
//!   `u64`.
//! - A slot holds at most 16,777,215 (2^24 - 1) takes; beyond, `try_take` refuses.
//! - Cells keep their slot's number modulo 2^32 (136 years of 1-second slots, 49 days of
//!   1-millisecond ones). Each new slot resets the cells of the slot it replaces, so a cell
//!   never keeps a count that long while the window is in use; a window that nobody wrote to
//!   for a multiple of 2^32 slots (to within one window) can count that old slot's writes
//!   once, in reads made before its first write.
//!
//! # Clock
//!
//! The window reads its clock only in [`slot_now`](Window::slot_now), once per operation.
//! With [`TokioClock`], the default, it follows tokio's paused time in tests; with
//! [`CoarseClock`](crate::clock::CoarseClock) a read costs a few nanoseconds instead of tens,
//! and slots move up to one kernel tick late.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use overload_core::window::Window;
//!
//! // Two counters per slot (0: requests, 1: errors), over 10 seconds in 1-second slots.
//! let window = Window::<2>::new();
//! let now = window.slot_now();
//! window.add(now, 0, 3);
//! window.add(now, 1, 1);
//! let counts = window.counts(now);
//! assert_eq!(counts.added(0), 3);
//! assert_eq!(counts.added(1), 1);
//!
//! // Exact admissions: at most one take per two requests in the window.
//! let allow = |c: &overload_core::window::Counts<2>| (c.taken() + 1) * 2 <= c.added(0);
//! assert!(window.try_take(now, allow));
//! assert!(!window.try_take(now, allow));
//!
//! // A minute in 6 slots of 10 seconds, one counter, two stripes.
//! let window = Window::<1>::builder()
//!     .window(Duration::from_secs(60))
//!     .slots(6)
//!     .stripes(2)
//!     .build()?;
//! assert_eq!(window.slot_width(), Duration::from_secs(10));
//! # Ok::<(), overload_core::ConfigError>(())
//! ```

mod cell;
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use crate::ConfigError;
use crate::clock::{Clock, TokioClock, saturating_nanos};
use crate::sync::{self, AtomicU64, Ordering};

/// Words per cache-line block of cells: 128 bytes, the unit adjacent-line prefetchers pull
/// in (smaller under loom, where every atomic is a modelled object).
#[cfg(not(loom))]
const LINE_WORDS: usize = 16;
#[cfg(loom)]
const LINE_WORDS: usize = 2;

/// A block of cells on cache lines of its own, so that stripes never share a line.
#[repr(align(128))]
struct Line([AtomicU64; LINE_WORDS]);

impl Line {
    fn new() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// One hot word on cache lines of its own.
#[repr(align(128))]
struct Padded(AtomicU64);

/// A sliding window of `N` added counters and one exact taken counter per slot, lock-free.
///
/// Generic over what it counts (`N` counters per slot, addressed `0..N`) and over its clock
/// (`C`, [`TokioClock`] by default). See the [module docs](crate::window) for the model, the
/// guarantees and the limits. Share it behind an `Arc`; every method takes `&self`.
///
/// Defaults ([`Window::new`], [`Window::builder`]):
///
/// - **window 10 seconds, in 10 slots of 1 second**: the retry-budget window of the paper
///   ("Handling overloads in distributed systems") and the Google SRE book, which the attempt
///   histogram uses too so servers and clients judge retries over the same span;
/// - **stripes**: the number of CPUs this process may use, rounded up to a power of two, at
///   most 16, so each core of a typical server writes to a stripe of its own while a sum
///   reads at most 16.
pub struct Window<const N: usize, C: Clock = TokioClock> {
    clock: C,
    /// Slot width in nanoseconds.
    width: u64,
    /// Slots in the window.
    slots: u64,
    /// Ring positions minus one: the ring has `slots` rounded up to a power of two
    /// positions, so a slot's position is a mask, not a division.
    ring_mask: u64,
    stripe_mask: usize,
    /// Words of one stripe: `ring * N`, rounded up to whole lines.
    stripe_words: usize,
    /// The added counters: stripe by stripe, ring position by position, counter by counter.
    cells: Box<[Line]>,
    /// The newest slot any write has used; the slot a clock reading most likely falls in.
    newest: Padded,
    /// The slot of the takes and the takes in it (see `cell::head`).
    head: Padded,
    /// The takes of slots the head has left, one cell per ring position.
    taken: Box<[AtomicU64]>,
}

/// The counts of a window (or of one slot): `N` added counters and the takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts<const N: usize> {
    added: [u64; N],
    taken: u64,
}

impl<const N: usize> Counts<N> {
    /// Counts with these values: for tests, and for deciding on figures from elsewhere.
    pub const fn new(added: [u64; N], taken: u64) -> Self {
        Self { added, taken }
    }

    /// What was added to counter `counter`.
    ///
    /// # Panics
    ///
    /// If `counter` is not below `N`.
    pub const fn added(&self, counter: usize) -> u64 {
        self.added[counter]
    }

    /// Every added counter, indexed by counter.
    pub const fn added_all(&self) -> &[u64; N] {
        &self.added
    }

    /// The takes.
    pub const fn taken(&self) -> u64 {
        self.taken
    }
}

impl<const N: usize> Window<N> {
    /// The default window: 10 seconds, the paper's and the SRE book's retry-budget window.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

    /// The default number of slots: 10, so the default window slides by 1 second.
    pub const DEFAULT_SLOTS: u32 = 10;

    /// The most slots a window may have: 1024. Every sum reads every slot of every stripe.
    pub const MAX_SLOTS: u32 = 1024;

    /// The narrowest slot: 1 millisecond. Each new slot resets the cells it reuses.
    pub const MIN_SLOT_WIDTH: Duration = Duration::from_millis(1);

    /// The longest window: 24 hours.
    pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

    /// The most stripes: 64.
    pub const MAX_STRIPES: u32 = 64;

    /// The most stripes chosen by default: 16.
    pub const MAX_DEFAULT_STRIPES: u32 = 16;

    /// A window with the defaults: 10 seconds in 10 slots, on [`TokioClock`]. See
    /// [`Window`] for the defaults' sources.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default window configuration is valid")
    }

    /// A builder that starts from the defaults.
    pub fn builder() -> WindowBuilder<N> {
        WindowBuilder::new()
    }
}

impl<const N: usize> Default for Window<N> {
    /// The same as [`Window::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize, C: Clock> Window<N, C> {
    /// The slot the clock is in now: the one read of the clock an operation makes.
    #[inline]
    pub fn slot_now(&self) -> u64 {
        self.slot_at(self.clock.now())
    }

    /// The slot that `nanos` (a reading of this window's clock) falls in.
    #[inline]
    pub fn slot_at(&self, nanos: u64) -> u64 {
        // NOTE: the common case, a reading in the newest slot, costs a multiplication
        // rather than a 64-bit division.
        let newest = self.newest.0.load(Ordering::Relaxed);
        let start = newest.saturating_mul(self.width);
        if nanos >= start && nanos - start < self.width {
            newest
        } else {
            nanos / self.width
        }
    }

    /// Adds `n` to counter `counter` of slot `slot` (usually [`slot_now`](Self::slot_now)),
    /// in the calling thread's stripe. Saturates at `u32::MAX` per slot and stripe.
    ///
    /// A write for a slot that has already left every window (a thread that read the clock,
    /// then stalled while others moved on by a whole window) is dropped.
    ///
    /// # Panics
    ///
    /// If `counter` is not below `N`.
    #[inline]
    pub fn add(&self, slot: u64, counter: usize, n: u32) {
        self.add_counting(slot, counter, n);
    }

    /// [`add`](Self::add), returning the compare-and-swap rounds it took (for model tests).
    pub(crate) fn add_counting(&self, slot: u64, counter: usize, n: u32) -> u32 {
        assert!(counter < N, "counter {counter} of a window of {N} counters");
        self.advance(slot);
        let stripe = sync::thread_stripe() & self.stripe_mask;
        let cell = self.cell(stripe, self.position(slot), counter);
        cell::add(cell, slot, u64::from(n), || self.newest())
    }

    /// Takes one in slot `slot` (usually [`slot_now`](Self::slot_now)) if `allow` says the
    /// window's counts leave room for it; `true` if taken.
    ///
    /// `allow` gets the counts of the window ending at the take's slot, the takes exact as
    /// of the moment the take is granted; it may be called more than once when other threads
    /// take at the same time, each time with fresh counts. A caller whose `slot` is older
    /// than the latest take's (it read the clock before another thread that has taken since)
    /// takes in that newer slot.
    pub fn try_take(&self, slot: u64, mut allow: impl FnMut(&Counts<N>) -> bool) -> bool {
        self.take_counting(slot, &mut allow).0
    }

    /// [`try_take`](Self::try_take), also returning the rounds of its loop: one, plus one
    /// per change another thread made to the head meanwhile (for model tests).
    pub(crate) fn take_counting(
        &self,
        slot: u64,
        allow: &mut impl FnMut(&Counts<N>) -> bool,
    ) -> (bool, u32) {
        self.advance(slot);
        let mut word = self.head.0.load(Ordering::Acquire);
        let mut rounds = 0;
        loop {
            rounds += 1;
            let head = cell::head_slot(word, slot, self.newest());
            if head < slot {
                // The head is in an older slot: record its takes where the window's sums
                // find them, then move it to ours. Recording first means that whoever sees
                // the moved head also sees the record.
                // NOTE: no take happened in the slots between `head` and ours (the head was
                // never there), so this record cannot overwrite one that a window still
                // needs; and if `word` is stale (the head has moved on since, perhaps round
                // the ring), `raise` leaves a newer slot's record alone and the swap below
                // fails.
                let taken = cell::head_taken(word);
                if taken > 0 {
                    cell::raise(&self.taken[self.position(head)], head, taken, || {
                        self.newest()
                    });
                }
                let moved = cell::head(slot, 0);
                match self
                    .head
                    .0
                    .compare_exchange(word, moved, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => word = moved,
                    Err(actual) => {
                        word = actual;
                        continue;
                    }
                }
            }
            // A late caller (head ahead of its slot) takes in the head's slot.
            let current = head.max(slot);
            let taken = cell::head_taken(word);
            if taken >= cell::TAKEN_MAX {
                return (false, rounds);
            }
            if !allow(&self.sum(current, current, taken)) {
                return (false, rounds);
            }
            // NOTE: the check above rests on `word`: the slot and every take in the window
            // (older slots' takes are final while the head stays in `current`). If anything
            // took or moved the head since, this fails and the check is made again on fresh
            // counts. This is what keeps concurrent takes from overdrawing.
            match self
                .head
                .0
                .compare_exchange(word, word + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (true, rounds),
                Err(actual) => word = actual,
            }
        }
    }

    /// The counts of the window ending at slot `slot`. Only reads: it never starts a slot or
    /// moves anything.
    ///
    /// Concurrent writes may or may not be in it.
    pub fn counts(&self, slot: u64) -> Counts<N> {
        let word = self.head.0.load(Ordering::Acquire);
        let head = cell::head_slot(word, slot, self.newest());
        self.sum(slot, head, cell::head_taken(word))
    }

    /// What was added to counter `counter` over the window ending at slot `slot`: the same
    /// figure as `counts(slot).added(counter)`, reading that one counter's cells only (a
    /// window of many counters need not be summed whole to judge one of them). Only reads.
    ///
    /// # Panics
    ///
    /// If `counter` is not below `N`.
    pub fn added(&self, slot: u64, counter: usize) -> u64 {
        assert!(counter < N, "counter {counter} of a window of {N} counters");
        let first = slot.saturating_sub(self.slots - 1);
        let mut sum = 0;
        for stripe in 0..=self.stripe_mask {
            for s in first..=slot {
                sum += cell::read(self.cell(stripe, self.position(s), counter), s);
            }
        }
        sum
    }

    /// The counts of slot `slot` alone. Only reads.
    pub fn slot_counts(&self, slot: u64) -> Counts<N> {
        let word = self.head.0.load(Ordering::Acquire);
        let position = self.position(slot);
        let mut added = [0; N];
        for stripe in 0..=self.stripe_mask {
            for (counter, sum) in added.iter_mut().enumerate() {
                *sum += cell::read(self.cell(stripe, position, counter), slot);
            }
        }
        let taken = if cell::head_slot(word, slot, self.newest()) == slot {
            cell::head_taken(word)
        } else {
            cell::read(&self.taken[position], slot)
        };
        Counts { added, taken }
    }

    /// The window's length: slots times their width.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.width.saturating_mul(self.slots))
    }

    /// The width of one slot: the step in which the window slides.
    pub fn slot_width(&self) -> Duration {
        Duration::from_nanos(self.width)
    }

    /// The number of slots in the window.
    pub fn slots(&self) -> u32 {
        u32::try_from(self.slots).unwrap_or(u32::MAX)
    }

    /// The number of stripes the added counters are spread over.
    pub fn stripes(&self) -> u32 {
        u32::try_from(self.stripe_mask + 1).unwrap_or(u32::MAX)
    }

    /// The clock the window reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn newest(&self) -> u64 {
        self.newest.0.load(Ordering::Relaxed)
    }

    const fn position(&self, slot: u64) -> usize {
        // Below the ring's length, at most 1024: the cast cannot truncate.
        (slot & self.ring_mask) as usize
    }

    #[inline]
    fn cell(&self, stripe: usize, position: usize, counter: usize) -> &AtomicU64 {
        let i = stripe * self.stripe_words + position * N + counter;
        &self.cells[i / LINE_WORDS].0[i % LINE_WORDS]
    }

    /// Makes `slot` the newest slot if it is newer, and then resets the cells of the slots
    /// it replaces in the ring. Whoever raises `newest` does the resets for the slots it
    /// skipped; nobody waits for them: a write that gets to a cell first resets it itself.
    #[inline]
    fn advance(&self, slot: u64) {
        if slot <= self.newest.0.load(Ordering::Relaxed) {
            return;
        }
        let before = self.newest.0.fetch_max(slot, Ordering::AcqRel);
        if before < slot {
            self.expire(before, slot);
        }
    }

    #[cold]
    fn expire(&self, before: u64, newest: u64) {
        let ring = self.ring_mask + 1;
        let first = before.max(newest.saturating_sub(ring)) + 1;
        for slot in first..=newest {
            let position = self.position(slot);
            for stripe in 0..=self.stripe_mask {
                for counter in 0..N {
                    cell::expire(self.cell(stripe, position, counter), slot, || self.newest());
                }
            }
        }
    }

    /// The counts of the window ending at `end`, with the head in slot `head` holding
    /// `head_taken` takes.
    fn sum(&self, end: u64, head: u64, head_taken: u64) -> Counts<N> {
        let first = end.saturating_sub(self.slots - 1);
        let mut added = [0; N];
        for stripe in 0..=self.stripe_mask {
            for slot in first..=end {
                let position = self.position(slot);
                for (counter, sum) in added.iter_mut().enumerate() {
                    *sum += cell::read(self.cell(stripe, position, counter), slot);
                }
            }
        }
        let mut taken = 0;
        for slot in first..=end {
            // NOTE: the head's slot is read from the head, not from its record, which may
            // not be written yet (or not to the end).
            taken += if slot == head {
                head_taken
            } else {
                cell::read(&self.taken[self.position(slot)], slot)
            };
        }
        Counts { added, taken }
    }
}

impl<const N: usize, C: Clock> fmt::Debug for Window<N, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("counters", &N)
            .field("window", &self.window())
            .field("slots", &self.slots)
            .field("stripes", &self.stripes())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Window`]; every setting starts at its default (see [`Window`]).
pub struct WindowBuilder<const N: usize, C: Clock = TokioClock> {
    window: Duration,
    slots: u32,
    stripes: Option<u32>,
    clock: C,
}

impl<const N: usize> WindowBuilder<N> {
    /// A builder with the defaults: 10 seconds in 10 slots, default stripes, [`TokioClock`].
    pub fn new() -> Self {
        Self {
            window: Window::<N>::DEFAULT_WINDOW,
            slots: Window::<N>::DEFAULT_SLOTS,
            stripes: None,
            clock: TokioClock::new(),
        }
    }
}

impl<const N: usize> Default for WindowBuilder<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize, C: Clock> WindowBuilder<N, C> {
    /// How far back a window reaches. Default: 10 seconds (the paper's and the SRE book's
    /// retry-budget window).
    ///
    /// Must be at most [`Window::MAX_WINDOW`] (24 hours), and each slot (`window / slots`)
    /// at least [`Window::MIN_SLOT_WIDTH`] (1 ms). The window used is `slots` times the
    /// slot width in whole nanoseconds, which can be a few nanoseconds shorter.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Into how many slots the window is cut; it slides one slot at a time. Default: 10.
    ///
    /// Must be from 1 to [`Window::MAX_SLOTS`] (1024).
    pub fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    /// Over how many stripes the added counters are spread. Default: the CPUs this process
    /// may use, rounded up to a power of two, at most [`Window::MAX_DEFAULT_STRIPES`] (16).
    ///
    /// Must be a power of two from 1 to [`Window::MAX_STRIPES`] (64). More stripes spread
    /// writes wider and make every sum read more.
    pub fn stripes(mut self, stripes: u32) -> Self {
        self.stripes = Some(stripes);
        self
    }

    /// The clock the window reads. Default: [`TokioClock`].
    pub fn clock<C2: Clock>(self, clock: C2) -> WindowBuilder<N, C2> {
        WindowBuilder {
            window: self.window,
            slots: self.slots,
            stripes: self.stripes,
            clock,
        }
    }

    /// Builds the window.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when: `slots` is not from 1 to 1024; `window`
    /// is zero or longer than 24 hours; a slot (`window / slots`) is narrower than 1 ms;
    /// `stripes` is not a power of two from 1 to 64.
    pub fn build(self) -> Result<Window<N, C>, ConfigError> {
        let max_slots = Window::<N>::MAX_SLOTS;
        if self.slots == 0 || self.slots > max_slots {
            return Err(ConfigError::out_of_range(
                "slots",
                self.slots,
                "within 1..=1024",
            ));
        }
        if self.window.is_zero() {
            return Err(ConfigError::out_of_range(
                "window",
                self.window,
                "more than zero",
            ));
        }
        if self.window > Window::<N>::MAX_WINDOW {
            return Err(ConfigError::out_of_range(
                "window",
                self.window,
                "at most 24h",
            ));
        }
        let width = self.window / self.slots;
        if width < Window::<N>::MIN_SLOT_WIDTH {
            return Err(ConfigError::conflict(
                "slots",
                format_args!(
                    "window ({:?}) divided by slots ({}) must be at least 1ms, got {width:?}",
                    self.window, self.slots
                ),
            ));
        }
        let stripes = match self.stripes {
            None => default_stripes(),
            Some(n) if n.is_power_of_two() && n <= Window::<N>::MAX_STRIPES => n,
            Some(n) => {
                return Err(ConfigError::out_of_range(
                    "stripes",
                    n,
                    "a power of two within 1..=64",
                ));
            }
        };
        let ring = u64::from(self.slots.next_power_of_two());
        let ring_len = usize::try_from(ring).expect("at most 1024 positions");
        let stripe_words = (ring_len * N).div_ceil(LINE_WORDS).max(1) * LINE_WORDS;
        let stripes = usize::try_from(stripes).expect("at most 64 stripes");
        let lines = stripes * stripe_words / LINE_WORDS;
        Ok(Window {
            clock: self.clock,
            width: saturating_nanos(width),
            slots: u64::from(self.slots),
            ring_mask: ring - 1,
            stripe_mask: stripes - 1,
            stripe_words,
            cells: (0..lines).map(|_| Line::new()).collect(),
            newest: Padded(AtomicU64::new(0)),
            head: Padded(AtomicU64::new(cell::head(0, 0))),
            taken: (0..ring_len).map(|_| AtomicU64::new(0)).collect(),
        })
    }
}

impl<const N: usize, C: Clock> fmt::Debug for WindowBuilder<N, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowBuilder")
            .field("counters", &N)
            .field("window", &self.window)
            .field("slots", &self.slots)
            .field("stripes", &self.stripes)
            .finish_non_exhaustive()
    }
}

/// The CPUs this process may use, rounded up to a power of two, at most 16; computed once
/// (reading the CPU quota can take microseconds).
fn default_stripes() -> u32 {
    if cfg!(loom) {
        // Two stripes keep model tests small and still exercise sums across stripes.
        return 2;
    }
    static STRIPES: OnceLock<u32> = OnceLock::new();
    *STRIPES.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let cpus = u32::try_from(cpus).unwrap_or(u32::MAX);
        cpus.min(Window::<1>::MAX_DEFAULT_STRIPES)
            .next_power_of_two()
    })
}
