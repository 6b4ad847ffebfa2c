//! Model tests of the retry budget under loom: every interleaving of a few threads.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p backoff-layer --lib --release loom`
//!
//! The budget's atomics are its window's (`overload_core::window`), which are loom's under
//! `cfg(loom)`. The models check that the budget never overdraws (granted withdrawals never
//! exceed what the deposits they were checked against allow) and never loses a deposit. They
//! also check that no call waits for another thread: a call that spun until another thread
//! finished something would, in the schedules where that thread never runs, loop until loom's
//! branch bound fails the model.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use overload_core::clock::Clock;

use super::{Budget, RetryBudget};

/// 10 ms: the budget's shortest slot.
const SLOT: u64 = 10_000_000;

/// A clock whose reads and moves are loom operations.
#[derive(Clone)]
struct LoomClock(Arc<AtomicU64>);

impl LoomClock {
    fn next_slot(&self) {
        self.0.fetch_add(SLOT, Ordering::Release);
    }
}

impl Clock for LoomClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A budget of `ratio`, no floor, over two slots of 10 ms, on a loom clock.
fn budget(ratio: f64) -> (Arc<RetryBudget<LoomClock>>, LoomClock) {
    let clock = LoomClock(Arc::new(AtomicU64::new(0)));
    let b = RetryBudget::builder()
        .ratio(ratio)
        .window(Duration::from_millis(20))
        .slots(2)
        .min_retries_per_sec(0)
        .clock(clock.clone())
        .build()
        .unwrap();
    (Arc::new(b), clock)
}

/// Runs `f` under loom, exploring every interleaving with at most `preemptions` forced
/// switches between threads (`None`: every interleaving).
fn model(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = preemptions;
    // Bounded loops: a waiting loop would run past this in the schedules that starve the
    // thread it waits for.
    builder.max_branches = 10_000;
    builder.check(f);
}

/// One deposit allows one retry (ratio 1). Two threads withdraw at once, one of them after
/// the clock has moved to the next slot (the same window, and a move of the slot the
/// withdrawals are counted in): exactly one retry is granted, never two.
#[test]
fn loom_budget_never_overdraws() {
    model(None, || {
        let (b, clock) = budget(1.0);
        b.deposit();
        let other = {
            let (b, clock) = (Arc::clone(&b), clock.clone());
            thread::spawn(move || {
                clock.next_slot();
                b.withdraw()
            })
        };
        let mine = b.withdraw();
        let theirs = other.join().unwrap();
        assert_eq!(
            u32::from(mine) + u32::from(theirs),
            1,
            "one deposit, one retry"
        );
        assert_eq!(b.remaining(), 0);
    });
}

/// Two threads deposit at once, one of them starting the next slot (and resetting the
/// cells it reuses): both deposits count, exactly, and allow exactly two retries.
#[test]
fn loom_budget_never_loses_a_deposit() {
    model(None, || {
        let (b, clock) = budget(1.0);
        let other = {
            let (b, clock) = (Arc::clone(&b), clock.clone());
            thread::spawn(move || {
                clock.next_slot();
                b.deposit();
            })
        };
        b.deposit();
        other.join().unwrap();
        assert_eq!(b.remaining(), 2);
        assert!(b.withdraw());
        assert!(b.withdraw());
        assert!(!b.withdraw());
    });
}

/// A withdrawal racing the deposit that funds it: granted only if it saw the deposit, and
/// whatever it did, the deposit is there afterwards.
#[test]
fn loom_budget_withdrawal_racing_its_deposit() {
    model(None, || {
        let (b, _) = budget(1.0);
        let other = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.deposit())
        };
        let granted = b.withdraw();
        other.join().unwrap();
        assert_eq!(b.remaining(), u64::from(!granted));
    });
}

/// Ratio 0.5, two deposits in slot 0 (one retry). One thread moves to slot 1, deposits two
/// more (a second retry) and withdraws; the other withdraws twice. However they interleave,
/// the retries granted never exceed what the deposits allow, and none is lost: what remains
/// afterwards is exactly the rest.
///
/// Eight operations on two threads: every interleaving would take far longer than CI allows,
/// so this one is explored with up to five forced switches between threads (about ten
/// seconds): enough for every order of the two threads' operations, with a switch inside an
/// operation on top.
#[test]
fn loom_budget_withdrawals_across_a_slot_move_with_deposits() {
    model(Some(5), || {
        let (b, clock) = budget(0.5);
        b.deposit();
        b.deposit();
        let other = {
            let (b, clock) = (Arc::clone(&b), clock.clone());
            thread::spawn(move || {
                clock.next_slot();
                b.deposit();
                b.deposit();
                b.withdraw()
            })
        };
        let mine = u64::from(b.withdraw()) + u64::from(b.withdraw());
        let theirs = u64::from(other.join().unwrap());
        let granted = mine + theirs;
        assert!((1..=2).contains(&granted), "granted {granted} of 2");
        assert_eq!(b.remaining(), 2 - granted);
    });
}
