//! Whether a remote limit (Redis) decides, with an epoch per recovery, so that a failure
//! that a request met before the last recovery cannot undo it ([`RemoteHealth`]).
//! Lock-free; its model tests run under loom.
//!
//! Outside the `redis` feature only for those model tests (see `crate::reservation`).

#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use overload_core::sync::{AtomicU64, Ordering};

/// Up or away, in one atomic: an even value is up, an odd one away, and every change adds
/// one. A request reads the value when it starts ([`observe`](Self::observe)); its failure
/// turns the state away only if the value has not changed since
/// ([`fail`](Self::fail)), so a request that started before Redis went away and came back
/// (and times out after that) does not make it flap.
#[derive(Debug)]
pub(crate) struct RemoteHealth {
    state: AtomicU64,
}

impl RemoteHealth {
    /// Up, epoch 0. Not `const`: loom's atomics are not.
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
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
        observed % 2 == 0
    }

    /// A request that observed `observed` failed: `true` when this turns the state away
    /// (the caller then logs it); `false` when it was away already, or came back since the
    /// request started.
    pub(crate) fn fail(&self, observed: u64) -> bool {
        Self::is_up(observed)
            && self
                .state
                .compare_exchange(
                    observed,
                    observed.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// The remote answered as it should: `true` when this ends an away state (the caller
    /// then logs it).
    pub(crate) fn recover(&self) -> bool {
        let mut state = self.state.load(Ordering::Acquire);
        while !Self::is_up(state) {
            match self.state.compare_exchange_weak(
                state,
                state.wrapping_add(1),
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
        let health = RemoteHealth::new();
        let early = health.observe();
        let other = health.observe();
        assert!(health.fail(other), "up, then away");
        assert!(!health.fail(early), "away already: logged once");
        assert!(health.recover());
        assert!(!health.recover(), "up already");
        assert!(!health.fail(early), "started before the recovery: ignored");
        assert!(RemoteHealth::is_up(health.observe()));
        let late = health.observe();
        assert!(health.fail(late), "a failure of this epoch counts");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! No interleaving of a failure seen before a recovery, and the recovery, leaves the
    //! state away.

    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    #[test]
    fn loom_a_failure_from_before_a_recovery_never_wins() {
        loom::model(|| {
            let health = Arc::new(RemoteHealth::new());
            let before = health.observe();
            assert!(health.fail(health.observe()));
            let recovering = {
                let health = Arc::clone(&health);
                thread::spawn(move || health.recover())
            };
            let late = {
                let health = Arc::clone(&health);
                thread::spawn(move || health.fail(before))
            };
            assert!(recovering.join().unwrap());
            assert!(!late.join().unwrap());
            assert!(RemoteHealth::is_up(health.observe()));
        });
    }
}
