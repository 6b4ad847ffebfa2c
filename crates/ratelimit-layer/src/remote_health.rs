//! Whether a remote limit (Redis) decides ([`RemoteHealth`]): turned away by a streak of
//! failed decisions, not by one, and brought back by a recovery; with a generation per
//! change, so that a failure a request met before a change (a recovery, a failure counted
//! already, a success) counts for nothing. Lock-free; its model tests run under loom.
//!
//! Outside the `redis` feature only for those model tests (see `crate::reservation`).

#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use overload_core::sync::{AtomicU64, Ordering};

/// Bit 0 of the state: away.
const AWAY: u64 = 1;
/// Bits 1 to 7: the failures counted since the last success (the streak).
const STREAK: u64 = 0x7f << 1;
/// Bits 8 and up: the generation, one more at every change.
const GENERATION: u64 = 1 << 8;

/// Up or away, the streak of failures and a generation, in one atomic word.
///
/// A request reads the word when it starts ([`observe`](Self::observe)). Its failure counts
/// only if the word has not changed since ([`fail`](Self::fail)): so the failures of
/// decisions that were in flight together (a stall of Redis meets them all at once) count
/// as one, and a request that started before Redis went away and came back (and fails
/// after that) does not turn it away again. The `away_after`-th failure counted in a row
/// turns the state away; a success ([`succeeded`](Self::succeeded)) ends the streak; a
/// recovery ([`recover`](Self::recover)) brings it back with no streak.
#[derive(Debug)]
pub(crate) struct RemoteHealth {
    state: AtomicU64,
    away_after: u64,
}

/// What a failure did to the health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RemoteFailure {
    /// Nothing: away already, or the state changed since the request started.
    Ignored,
    /// One more in the streak, still up.
    Counted,
    /// The streak turned the state away (the caller logs it).
    TurnedAway,
}

impl RemoteHealth {
    /// Up, with no streak; away at the `away_after`-th failure counted in a row (1 to 127).
    /// Not `const`: loom's atomics are not.
    pub(crate) fn new(away_after: u32) -> Self {
        Self {
            state: AtomicU64::new(0),
            away_after: u64::from(away_after.clamp(1, 127)),
        }
    }

    /// The state now, to pass to [`fail`](Self::fail) later.
    #[inline]
    pub(crate) fn observe(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// Whether an observed state is up.
    #[inline]
    pub(crate) const fn is_up(observed: u64) -> bool {
        observed & AWAY == 0
    }

    /// The failures counted in a row in an observed state.
    pub(crate) const fn streak(observed: u64) -> u64 {
        (observed & STREAK) >> 1
    }

    /// A request that observed `observed` failed; see [`RemoteFailure`].
    pub(crate) fn fail(&self, observed: u64) -> RemoteFailure {
        if !Self::is_up(observed) {
            return RemoteFailure::Ignored;
        }
        let streak = Self::streak(observed) + 1;
        let away = streak >= self.away_after;
        let next = if away {
            (observed & !STREAK) | AWAY
        } else {
            (observed & !STREAK) | (streak << 1)
        };
        // NOTE: one compare-and-swap from what the request saw: any change since (another
        // failure counted, a success, a recovery) makes this one stale, and it is ignored.
        match self.state.compare_exchange(
            observed,
            next.wrapping_add(GENERATION),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) if away => RemoteFailure::TurnedAway,
            Ok(_) => RemoteFailure::Counted,
            Err(_) => RemoteFailure::Ignored,
        }
    }

    /// Turns the state away at once, whatever the streak, if it has not changed since
    /// `observed` (a probe that met no answer within the response timeout, or an error):
    /// `true` when this did.
    pub(crate) fn turn_away(&self, observed: u64) -> bool {
        Self::is_up(observed)
            && self
                .state
                .compare_exchange(
                    observed,
                    ((observed & !STREAK) | AWAY).wrapping_add(GENERATION),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// A decision answered within its budget: the streak, if any, is over. A read, and no
    /// write, when there is none (every success of a healthy remote).
    #[inline]
    pub(crate) fn succeeded(&self) {
        let mut state = self.state.load(Ordering::Acquire);
        while Self::is_up(state) && Self::streak(state) > 0 {
            match self.state.compare_exchange_weak(
                state,
                (state & !STREAK).wrapping_add(GENERATION),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => state = now,
            }
        }
    }

    /// The remote answered a probe: `true` when this ends an away state (the caller then
    /// logs it).
    pub(crate) fn recover(&self) -> bool {
        let mut state = self.state.load(Ordering::Acquire);
        while !Self::is_up(state) {
            match self.state.compare_exchange_weak(
                state,
                (state & !(AWAY | STREAK)).wrapping_add(GENERATION),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => state = now,
            }
        }
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A regression test of the review's finding: a request that started before a recovery
    /// and timed out after it turned the state back to "away".
    #[test]
    fn a_late_failure_does_not_undo_a_recovery() {
        let health = RemoteHealth::new(1);
        let early = health.observe();
        let other = health.observe();
        assert_eq!(
            health.fail(other),
            RemoteFailure::TurnedAway,
            "up, then away"
        );
        assert_eq!(
            health.fail(early),
            RemoteFailure::Ignored,
            "away already: logged once"
        );
        assert!(health.recover());
        assert!(!health.recover(), "up already");
        assert_eq!(
            health.fail(early),
            RemoteFailure::Ignored,
            "started before the recovery: ignored"
        );
        assert!(RemoteHealth::is_up(health.observe()));
        let late = health.observe();
        assert_eq!(
            health.fail(late),
            RemoteFailure::TurnedAway,
            "a failure of this epoch counts"
        );
    }

    /// Regression (issue 30, finding 6): one decision over budget turned Redis away, and
    /// sent the process local for at least a recheck interval. Now one failure, or two, in
    /// a row leave it up; the third turns it away; a success in between ends the streak.
    #[test]
    fn one_failed_decision_does_not_turn_the_remote_away_and_three_in_a_row_do() {
        let health = RemoteHealth::new(3);
        assert_eq!(health.fail(health.observe()), RemoteFailure::Counted);
        assert!(RemoteHealth::is_up(health.observe()), "one failure: up");
        assert_eq!(health.fail(health.observe()), RemoteFailure::Counted);
        assert_eq!(RemoteHealth::streak(health.observe()), 2);
        health.succeeded();
        assert_eq!(
            RemoteHealth::streak(health.observe()),
            0,
            "a success ends it"
        );
        for _ in 0..2 {
            assert_eq!(health.fail(health.observe()), RemoteFailure::Counted);
        }
        assert_eq!(health.fail(health.observe()), RemoteFailure::TurnedAway);
        assert!(!RemoteHealth::is_up(health.observe()));
        health.succeeded();
        assert!(
            !RemoteHealth::is_up(health.observe()),
            "only a probe's recovery brings it back"
        );
        assert!(health.recover());
        assert_eq!(
            RemoteHealth::streak(health.observe()),
            0,
            "back with no streak"
        );
    }

    /// Decisions in flight together when the remote stalls fail together: one failure.
    #[test]
    fn failures_of_requests_in_flight_together_count_once() {
        let health = RemoteHealth::new(3);
        let together = health.observe();
        assert_eq!(health.fail(together), RemoteFailure::Counted);
        for _ in 0..63 {
            assert_eq!(health.fail(together), RemoteFailure::Ignored);
        }
        assert_eq!(RemoteHealth::streak(health.observe()), 1);
        // A success that ends no streak writes nothing: a request that started before it
        // still counts.
        health.succeeded();
        let before = health.observe();
        health.succeeded();
        health.succeeded();
        assert_eq!(health.observe(), before);
    }

    #[test]
    fn a_probe_turns_the_remote_away_at_once() {
        let health = RemoteHealth::new(3);
        let observed = health.observe();
        assert!(health.turn_away(observed));
        assert!(!health.turn_away(health.observe()), "away already");
        assert!(health.recover());
        assert!(!health.turn_away(observed), "from before the recovery");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! No interleaving of a failure seen before a recovery, and the recovery, leaves the
    //! state away; failures seen together count once, whatever their order.

    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    #[test]
    fn loom_a_failure_from_before_a_recovery_never_wins() {
        loom::model(|| {
            let health = Arc::new(RemoteHealth::new(1));
            let before = health.observe();
            assert_eq!(health.fail(health.observe()), RemoteFailure::TurnedAway);
            let recovering = {
                let health = Arc::clone(&health);
                thread::spawn(move || health.recover())
            };
            let late = {
                let health = Arc::clone(&health);
                thread::spawn(move || health.fail(before))
            };
            assert!(recovering.join().unwrap());
            assert_eq!(late.join().unwrap(), RemoteFailure::Ignored);
            assert!(RemoteHealth::is_up(health.observe()));
        });
    }

    #[test]
    fn loom_failures_seen_together_count_once_and_a_success_never_turns_away() {
        loom::model(|| {
            let health = Arc::new(RemoteHealth::new(2));
            let together = health.observe();
            let failing: Vec<_> = (0..2)
                .map(|_| {
                    let health = Arc::clone(&health);
                    thread::spawn(move || health.fail(together))
                })
                .collect();
            let succeeding = {
                let health = Arc::clone(&health);
                thread::spawn(move || health.succeeded())
            };
            let counted = failing
                .into_iter()
                .map(|t| t.join().unwrap())
                .filter(|f| *f != RemoteFailure::Ignored)
                .count();
            succeeding.join().unwrap();
            assert_eq!(counted, 1, "one failure of the two");
            assert!(RemoteHealth::is_up(health.observe()), "one failure of two");
            assert!(RemoteHealth::streak(health.observe()) <= 1);
        });
    }
}
