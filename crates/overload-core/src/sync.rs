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
