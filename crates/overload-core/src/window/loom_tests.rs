//! Model tests of the window: every interleaving of a few threads, under loom.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p overload-signal --lib --release loom`
//!
//! Each model is small (two threads, a handful of operations, a window of one or two slots
//! in one or two stripes), so that loom explores every interleaving, with no preemption
//! bound, in seconds. Besides the properties each test asserts, loom itself fails a model in
//! which a thread spins waiting for another (the spinning schedule never ends and exceeds the
//! branch bound), and the tests count each operation's retry rounds against the writes other
//! threads made: a thread retries only because another made progress.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

use super::{Counts, Window};
use crate::clock::Clock;

const MS: u64 = 1_000_000;

/// A clock whose reads and moves are loom operations, so that loom interleaves them with
/// the window's.
#[derive(Clone)]
struct LoomClock(Arc<AtomicU64>);

impl LoomClock {
    fn new() -> Self {
        Self(Arc::new(AtomicU64::new(0)))
    }

    fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms * MS, Ordering::Release);
    }
}

impl Clock for LoomClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// `slots` slots of 1 ms, two stripes, on a loom clock.
fn window<const N: usize>(clock: &LoomClock, slots: u32) -> Arc<Window<N, LoomClock>> {
    Arc::new(
        Window::<N>::builder()
            .window(Duration::from_millis(u64::from(slots)))
            .slots(slots)
            .stripes(2)
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

/// Runs `f` under loom, exploring every interleaving.
fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(None, f);
}

/// Runs `f` under loom, exploring every interleaving with at most `preemptions` forced
/// switches between threads (`None`: every interleaving).
fn model_bounded(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = preemptions;
    builder.max_branches = 10_000;
    builder.check(f);
}

/// Two threads add while one of them starts a new slot (and resets the cells it reuses):
/// nothing is lost, in either slot, whatever the interleaving.
#[test]
fn loom_window_adds_across_a_slot_move_lose_nothing() {
    model(|| {
        let clock = LoomClock::new();
        let w = window::<1>(&clock, 2);
        let other = {
            let (w, clock) = (Arc::clone(&w), clock.clone());
            thread::spawn(move || {
                let first = w.add_counting(w.slot_now(), 0, 1);
                clock.advance_ms(1);
                let second = w.add_counting(w.slot_now(), 0, 1);
                (first, second)
            })
        };
        let mine = w.add_counting(w.slot_now(), 0, 1);
        let (first, second) = other.join().unwrap();
        // The main thread's add and the other's are on different stripes; the slot move's
        // reset touches both. One add can be retried once per other write to its cell.
        assert!(
            mine <= 3 && first <= 3 && second <= 3,
            "{mine} {first} {second}"
        );
        assert_eq!(w.counts(1).added(0), 3);
    });
}

/// Two threads write the same cell (one stripe): a reset racing an increment loses neither.
#[test]
fn loom_window_reset_and_increment_of_one_cell_lose_nothing() {
    model(|| {
        let clock = LoomClock::new();
        let w = Arc::new(
            Window::<1>::builder()
                .window(Duration::from_millis(1))
                .slots(1)
                .stripes(1)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        w.add(0, 0, 5);
        clock.advance_ms(1);
        let other = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.add_counting(1, 0, 1))
        };
        let mine = w.add_counting(1, 0, 1);
        let theirs = other.join().unwrap();
        assert!(mine <= 3 && theirs <= 3, "{mine} {theirs}");
        assert_eq!(
            w.counts(1).added(0),
            2,
            "slot 0's five are gone, both ones counted"
        );
    });
}

/// Two threads take with a limit of one per window while the clock moves into the next slot
/// (still the same window): exactly one take is granted, and it is counted.
#[test]
fn loom_window_takes_never_overdraw_across_a_slot_move() {
    model(|| {
        let clock = LoomClock::new();
        let w = window::<1>(&clock, 2);
        let limit = |c: &Counts<1>| c.taken() < 1;
        let other = {
            let (w, clock) = (Arc::clone(&w), clock.clone());
            thread::spawn(move || {
                clock.advance_ms(1);
                w.take_counting(w.slot_now(), &mut { limit })
            })
        };
        let (mine, my_rounds) = w.take_counting(w.slot_now(), &mut { limit });
        let (theirs, their_rounds) = other.join().unwrap();
        assert_eq!(
            u32::from(mine) + u32::from(theirs),
            1,
            "one take per window"
        );
        // Each failed round is a head change by the other thread: at most a move and a take.
        assert!(
            my_rounds <= 3 && their_rounds <= 3,
            "{my_rounds} {their_rounds}"
        );
        assert_eq!(w.counts(1).taken(), 1);
    });
}

/// With a window of one slot, each slot is a window of its own: a thread in the old slot and
/// a thread in the new one each get a take, unless the late one finds the head already in the
/// new slot, in which case it is checked against the new slot (and takes it, or is refused).
/// No slot ever holds more than its limit, and no take is lost.
#[test]
fn loom_window_late_take_is_checked_against_the_newer_slot() {
    model(|| {
        let clock = LoomClock::new();
        let w = window::<1>(&clock, 1);
        let limit = |c: &Counts<1>| c.taken() < 1;
        let late = {
            let w = Arc::clone(&w);
            let slot = w.slot_now(); // slot 0, read before the clock moves
            thread::spawn(move || w.try_take(slot, limit))
        };
        clock.advance_ms(1);
        let mine = w.try_take(w.slot_now(), limit);
        let theirs = late.join().unwrap();
        // Slot 1 gets exactly one take: this thread's, or the late one's if it found the
        // head already in slot 1 (this thread is then refused).
        let in_0 = w.slot_counts(0).taken();
        let in_1 = w.slot_counts(1).taken();
        assert_eq!(in_1, 1);
        assert!(in_0 <= 1);
        assert!(mine || theirs);
        assert_eq!(in_0 + in_1, u64::from(mine) + u64::from(theirs));
    });
}

/// The head leaves a slot holding a take while two threads race to move it: the slot's
/// takes are recorded exactly once (idempotent records), and both new takes are checked
/// against them.
#[test]
fn loom_window_racing_head_moves_record_the_old_slot_once() {
    model(|| {
        let clock = LoomClock::new();
        let w = window::<1>(&clock, 2);
        assert!(w.try_take(0, |_| true));
        clock.advance_ms(1);
        let limit = |c: &Counts<1>| c.taken() < 2;
        let other = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.try_take(1, limit))
        };
        let mine = w.try_take(1, limit);
        let theirs = other.join().unwrap();
        assert_eq!(u32::from(mine) + u32::from(theirs), 1);
        assert_eq!(w.slot_counts(0).taken(), 1);
        assert_eq!(w.counts(1).taken(), 2);
    });
}

/// An add racing a take: the take's check sees the add or not (never half of it), and the
/// take is granted only if the add it was checked against is there.
#[test]
fn loom_window_take_checked_against_a_concurrent_add() {
    model(|| {
        let clock = LoomClock::new();
        let w = window::<1>(&clock, 2);
        let other = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.add(w.slot_now(), 0, 1))
        };
        // One take per added unit.
        let took = w.try_take(w.slot_now(), |c| c.taken() < c.added(0));
        other.join().unwrap();
        let counts = w.counts(0);
        assert_eq!(counts.added(0), 1);
        assert_eq!(counts.taken(), u64::from(took));
    });
}

/// A thread that loaded the head long ago, while it held takes in slot 0, records slot 0's
/// takes late, after the other thread has moved the head through slots 1, 2 and 3, so that
/// slot 2's record now sits where slot 0's was (a ring of two). The late record must not
/// overwrite slot 2's: the window ending at 3 holds exactly the takes of slots 2 and 3.
///
/// Regression: a record overwrote a cell holding any other slot, so this lost slot 2's
/// take, and the window could then grant one take too many.
///
/// Four takes on one thread against one on the other: every interleaving would take minutes;
/// three forced switches (a second or so) cover the stall at every point of the late
/// thread's take, with the other thread's takes before, between or after.
#[test]
fn loom_window_stalled_helper_does_not_clobber_a_newer_record() {
    model_bounded(Some(3), || {
        let clock = LoomClock::new();
        let w = window::<1>(&clock, 2);
        assert!(w.try_take(0, |_| true));
        let stalled = {
            let w = Arc::clone(&w);
            // Refuses every take, but moves the head (recording slot 0) on the way.
            thread::spawn(move || w.try_take(1, |_| false))
        };
        for slot in 1..=3 {
            assert!(w.try_take(slot, |_| true));
        }
        assert!(!stalled.join().unwrap());
        assert_eq!(w.counts(3).taken(), 2, "slot 2's take and slot 3's");
    });
}
