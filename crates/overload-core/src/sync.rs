//! The atomics of the workspace's lock-free code, and each thread's stripe: std's in a
//! normal build, loom's under `cfg(loom)`, so the model tests check the code that ships.
//!
//! Every lock-free type of the workspace (the [`window`](crate::window), the attempt
//! histogram's caller ledger, the retry budget, the adaptive limit's admission) imports its
//! atomics from here and nowhere else. `cfg(loom)` is set only by the model tests
//! (`RUSTFLAGS="--cfg loom"`); a normal build always gets std's.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The lock of a cold path beside lock-free reads (a table whose slots are claimed under it
/// and read without it): loom's under `cfg(loom)`, so a model thread that waits for it
/// yields to the one holding it instead of blocking the model.
#[cfg(loom)]
pub use loom::sync::Mutex;
#[cfg(not(loom))]
pub use std::sync::Mutex;

/// A number that stays the same for the calling thread and differs between threads, for
/// picking the stripe a thread writes to.
///
/// Threads are numbered in the order they first ask, so a pool of `n` worker threads uses
/// `n` different stripes when there are at least `n`.
#[cfg(not(loom))]
#[inline]
pub fn thread_stripe() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    // NOTE: `try_with`, because a thread-local destructor elsewhere may record into a window
    // after this one is gone; such a late write goes to stripe 0, which is always correct.
    STRIPE
        .try_with(|stripe| {
            let mine = stripe.get();
            if mine != usize::MAX {
                return mine;
            }
            let mine = NEXT.fetch_add(1, Relaxed) & (usize::MAX >> 1);
            stripe.set(mine);
            mine
        })
        .unwrap_or(0)
}

/// Under loom: the model thread's number, so the main thread and each spawned thread write
/// to stripes of their own, and the same execution always picks the same stripes (loom
/// replays executions, which must be deterministic).
#[cfg(loom)]
pub fn thread_stripe() -> usize {
    let id = format!("{:?}", loom::thread::current().id());
    id.chars()
        .filter(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0)
}

/// A counter that every request may add to without the cores fighting over one word: one
/// cell per stripe ([`thread_stripe`]), each on cache lines of its own; a reader
/// [`take`](Self::take)s the sum and empties the cells.
///
/// For a count a layer reports from time to time (a metric flushed by its once-a-second
/// tick) rather than decides on: a shared counter incremented by every request moves its
/// cache line between the cores on every request (tens of nanoseconds each time, under
/// load), where a stripe stays in its core's cache. Lock-free; `add` is one relaxed
/// addition.
///
/// ```
/// use overload_core::sync::StripedCounter;
///
/// let admitted = StripedCounter::new();
/// admitted.add(1);
/// admitted.add(2);
/// assert_eq!(admitted.take(), 3);
/// assert_eq!(admitted.take(), 0, "taken");
/// ```
pub struct StripedCounter {
    cells: Box<[StripedCell]>,
    mask: usize,
}

/// One stripe's cell, on cache lines of its own (two lines: adjacent-line prefetchers pull
/// pairs).
#[repr(align(128))]
struct StripedCell(AtomicU64);

impl StripedCounter {
    /// The most stripes: 64.
    pub const MAX_STRIPES: usize = 64;

    /// A counter at zero, with a stripe per CPU this process may use (rounded up to a
    /// power of two, at most [`MAX_STRIPES`](Self::MAX_STRIPES)).
    pub fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Self::with_stripes(cpus)
    }

    /// A counter at zero with `stripes` stripes (rounded up to a power of two, from 1 to
    /// [`MAX_STRIPES`](Self::MAX_STRIPES)).
    pub fn with_stripes(stripes: usize) -> Self {
        let stripes = stripes.clamp(1, Self::MAX_STRIPES).next_power_of_two();
        Self {
            cells: (0..stripes)
                .map(|_| StripedCell(AtomicU64::new(0)))
                .collect(),
            mask: stripes - 1,
        }
    }

    /// Adds `n` in the calling thread's stripe.
    #[inline]
    pub fn add(&self, n: u64) {
        self.cells[thread_stripe() & self.mask]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The sum of what was added since the last `take`, and empties the cells. An `add`
    /// racing with it is counted now or by the next `take`, never lost nor twice.
    pub fn take(&self) -> u64 {
        self.cells
            .iter()
            .map(|cell| cell.0.swap(0, Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

impl Default for StripedCounter {
    /// The same as [`StripedCounter::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StripedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripedCounter")
            .field("stripes", &self.cells.len())
            .finish_non_exhaustive()
    }
}

/// Model tests of [`StripedCounter`] under loom:
/// `RUSTFLAGS="--cfg loom" cargo test -p overload-core --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// Two threads add while a third takes: what the take saw plus what a last take finds
    /// is every addition, exactly once.
    #[test]
    fn loom_striped_counter_loses_nothing_and_counts_nothing_twice() {
        loom::model(|| {
            let counter = Arc::new(StripedCounter::with_stripes(2));
            let adders: Vec<_> = (0..2)
                .map(|i| {
                    let counter = Arc::clone(&counter);
                    thread::spawn(move || counter.add(i + 1))
                })
                .collect();
            let first = counter.take();
            for adder in adders {
                adder.join().unwrap();
            }
            assert_eq!(first + counter.take(), 3);
        });
    }
}
