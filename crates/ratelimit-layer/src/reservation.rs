//! A process's local reservation of a limit kept elsewhere (in Redis): units taken in a
//! batch on one round trip and spent here without asking again, and the wait of the last
//! rejection kept, so that requests that would be rejected are rejected here
//! ([`LocalReservation`]). Lock-free; its model tests run under loom.
//!
//! Outside the `redis` feature only for those model tests: tokio compiled for loom has no
//! network, so the Redis code that uses it cannot be.

#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use overload_core::sync::{AtomicBool, AtomicU64, Ordering};

/// The units a process holds, and the last rejection's wait.
///
/// Every unit spent here was taken from the remote limit before, so over time the fleet
/// admits no more than the limit; what a reservation changes is *when* a unit is spent: up
/// to a batch after it was counted. A batch is at most `max_batch` units and void after the
/// lease, so at any time the fleet's processes hold at most `max_batch` units each: the
/// worst-case overshoot of any window over the remote limit's own is `processes x
/// max_batch` units.
///
/// The batch asked for adapts to what the process spends: it doubles (up to `max_batch`)
/// when a batch was spent within its lease, and halves (down to 1) when a lease ended with
/// units left, which are dropped, not returned.
pub(crate) struct LocalReservation {
    max_batch: u64,
    /// How long a batch may be spent, nanoseconds of the layer's clock.
    lease: u64,
    /// Units left in the batch.
    units: AtomicU64,
    /// When the batch is void, nanoseconds of the layer's clock.
    expires: AtomicU64,
    /// The size of the next batch asked for.
    next_batch: AtomicU64,
    /// Whether a request is asking for a batch.
    refilling: AtomicBool,
    /// What the remote limit had left after the last batch was taken, and when it is full
    /// again (nanoseconds from then), for the `RateLimit` fields of requests decided here.
    remote_remaining: AtomicU64,
    remote_reset: AtomicU64,
    /// Until when (the layer's clock) a request of at least `blocked_cost` is rejected here:
    /// the remote limit said so, and nothing gives units back before.
    blocked_until: AtomicU64,
    blocked_cost: AtomicU64,
}

/// A decision made from what the process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReservedDecision {
    /// Spent from the batch: the fleet's remaining units as far as this process knows (the
    /// remote's at the last batch, plus what is left here), and the remote's reset, in
    /// nanoseconds.
    Allow { remaining: u64, reset: u64 },
    /// Rejected, as the remote limit rejected a request as costly before: retry after,
    /// nanoseconds.
    Reject { retry_after: u64 },
}

impl LocalReservation {
    /// Batches of at most `max_batch` units (at least 1), each spent within `lease`
    /// nanoseconds (at least 1).
    pub(crate) fn new(max_batch: u32, lease: u64) -> Self {
        Self {
            max_batch: u64::from(max_batch.max(1)),
            lease: lease.max(1),
            units: AtomicU64::new(0),
            expires: AtomicU64::new(0),
            next_batch: AtomicU64::new(1),
            refilling: AtomicBool::new(false),
            remote_remaining: AtomicU64::new(0),
            remote_reset: AtomicU64::new(0),
            blocked_until: AtomicU64::new(0),
            blocked_cost: AtomicU64::new(u64::MAX),
        }
    }

    /// Decides a request of `cost` at `now` from what the process holds, or `None`: the
    /// remote must decide.
    #[inline]
    pub(crate) fn decide(&self, now: u64, cost: u32) -> Option<ReservedDecision> {
        let cost = u64::from(cost);
        let until = self.blocked_until.load(Ordering::Acquire);
        if now < until && cost >= self.blocked_cost.load(Ordering::Relaxed) {
            return Some(ReservedDecision::Reject {
                retry_after: until - now,
            });
        }
        let expires = self.expires.load(Ordering::Acquire);
        if now >= expires {
            self.expire(expires);
            return None;
        }
        let mut units = self.units.load(Ordering::Acquire);
        loop {
            if units < cost {
                return None;
            }
            // NOTE: a compare-and-swap, never a subtraction that could go below zero: two
            // requests can never spend the same unit.
            match self.units.compare_exchange_weak(
                units,
                units - cost,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let remaining = self
                        .remote_remaining
                        .load(Ordering::Relaxed)
                        .saturating_add(units - cost);
                    return Some(ReservedDecision::Allow {
                        remaining,
                        reset: self.remote_reset.load(Ordering::Relaxed),
                    });
                }
                Err(now_units) => units = now_units,
            }
        }
    }

    /// The lease that ended at `expires` is over: its units are dropped, and the next batch
    /// is smaller if some were left.
    #[cold]
    fn expire(&self, expires: u64) {
        let left = self.units.load(Ordering::Acquire);
        // NOTE: only if no batch came meanwhile (its expiry would differ); a race that
        // drops a fresh batch's units loses units, never spends one twice.
        if left > 0
            && self.expires.load(Ordering::Acquire) == expires
            && self
                .units
                .compare_exchange(left, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let next = self.next_batch.load(Ordering::Relaxed);
            self.next_batch.store((next / 2).max(1), Ordering::Relaxed);
        }
    }

    /// How many units the request that calls it should ask for besides its own (0: none,
    /// another request is asking already); on a non-zero answer the caller must call
    /// [`refilled`](Self::refilled) or [`refill_failed`](Self::refill_failed).
    pub(crate) fn claim_refill(&self, now: u64) -> u32 {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return 0;
        }
        let mut batch = self.next_batch.load(Ordering::Relaxed);
        if now < self.expires.load(Ordering::Acquire) {
            // NOTE: the last batch was spent within its lease: the process spends faster.
            batch = batch.saturating_mul(2).min(self.max_batch);
            self.next_batch.store(batch, Ordering::Relaxed);
        }
        u32::try_from(batch).unwrap_or(u32::MAX)
    }

    /// Whether a request is asking for a batch.
    pub(crate) fn is_refilling(&self) -> bool {
        self.refilling.load(Ordering::Acquire)
    }

    /// The remote took `units` for this process at `now`, and had `remaining` left, full
    /// again in `reset` nanoseconds.
    pub(crate) fn refilled(&self, now: u64, units: u32, remaining: u64, reset: u64) {
        self.remote_remaining.store(remaining, Ordering::Relaxed);
        self.remote_reset.store(reset, Ordering::Relaxed);
        if units > 0 {
            // NOTE: the expiry first, then the units (release): a request that sees the
            // units sees a lease that covers them.
            self.expires
                .store(now.saturating_add(self.lease), Ordering::Release);
            self.units.fetch_add(u64::from(units), Ordering::AcqRel);
        }
        self.refilling.store(false, Ordering::Release);
    }

    /// The request that asked for a batch got none (the remote did not answer).
    pub(crate) fn refill_failed(&self) {
        self.refilling.store(false, Ordering::Release);
    }

    /// The remote rejected a request of `cost` at `now`, to be retried after `retry_after`
    /// nanoseconds: until then, requests of that cost or more are rejected here. The wait
    /// runs from when the answer arrived, a little after the remote's own time, so a
    /// request is never admitted here that the remote would reject.
    pub(crate) fn rejected(&self, now: u64, retry_after: u64, cost: u32) {
        self.blocked_cost.store(u64::from(cost), Ordering::Relaxed);
        self.blocked_until
            .store(now.saturating_add(retry_after), Ordering::Release);
    }

    /// Units left in the batch (tests).
    #[cfg(test)]
    pub(crate) fn units(&self) -> u64 {
        self.units.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_batch_is_spent_here_then_the_remote_decides_again() {
        let r = LocalReservation::new(8, 100 * MS);
        assert_eq!(r.decide(0, 1), None, "nothing held yet");
        assert_eq!(r.claim_refill(0), 1, "the first batch is small");
        assert_eq!(r.claim_refill(0), 0, "one request asks at a time");
        r.refilled(0, 1, 10, 50 * MS);
        assert_eq!(
            r.decide(MS, 1),
            Some(ReservedDecision::Allow {
                remaining: 10,
                reset: 50 * MS
            })
        );
        assert_eq!(r.decide(MS, 1), None, "spent");
        // Spent within the lease: the next batch is twice as large, up to the most.
        assert_eq!(r.claim_refill(2 * MS), 2);
        r.refilled(2 * MS, 2, 8, 50 * MS);
        assert_eq!(
            r.decide(3 * MS, 2),
            Some(ReservedDecision::Allow {
                remaining: 8,
                reset: 50 * MS
            })
        );
        for expected in [4, 8, 8] {
            assert_eq!(r.claim_refill(4 * MS), expected);
            r.refill_failed();
        }
    }

    #[test]
    fn units_left_at_the_end_of_the_lease_are_dropped_and_the_batch_shrinks() {
        let r = LocalReservation::new(8, 100 * MS);
        for _ in 0..3 {
            r.claim_refill(0);
            r.refill_failed();
        }
        r.next_batch.store(8, Ordering::Relaxed);
        assert_eq!(r.claim_refill(0), 8);
        r.refilled(0, 8, 0, 0);
        assert!(r.decide(99 * MS, 1).is_some());
        assert_eq!(r.units(), 7);
        assert_eq!(r.decide(100 * MS, 1), None, "the lease is over");
        assert_eq!(r.units(), 0, "dropped");
        assert_eq!(r.claim_refill(100 * MS), 4, "halved");
    }

    #[test]
    fn a_remote_rejection_is_repeated_here_until_its_wait_is_over() {
        let r = LocalReservation::new(8, 100 * MS);
        r.rejected(10 * MS, 5 * MS, 2);
        assert_eq!(
            r.decide(11 * MS, 2),
            Some(ReservedDecision::Reject {
                retry_after: 4 * MS
            })
        );
        assert_eq!(r.decide(11 * MS, 1), None, "a cheaper request may fit");
        assert_eq!(r.decide(15 * MS, 2), None, "the wait is over");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p ratelimit-layer
    //! --lib --release loom`: no interleaving spends more units than were taken.

    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    #[test]
    fn loom_reserved_units_are_never_spent_twice() {
        loom::model(|| {
            let r = Arc::new(LocalReservation::new(4, 1_000));
            r.claim_refill(0);
            r.refilled(0, 3, 0, 0);
            let spenders: Vec<_> = (0..2)
                .map(|_| {
                    let r = Arc::clone(&r);
                    thread::spawn(move || (0..2).filter(|_| r.decide(1, 1).is_some()).count())
                })
                .collect();
            let spent: usize = spenders.into_iter().map(|t| t.join().unwrap()).sum();
            assert_eq!(spent, 3, "three units, four requests");
            assert_eq!(r.units(), 0);
        });
    }

    #[test]
    fn loom_a_refill_while_others_spend_loses_no_unit_and_adds_none() {
        loom::model(|| {
            let r = Arc::new(LocalReservation::new(4, 1_000));
            r.claim_refill(0);
            r.refilled(0, 1, 0, 0);
            let refill = {
                let r = Arc::clone(&r);
                thread::spawn(move || {
                    let asked = r.claim_refill(1);
                    r.refilled(1, asked.min(2), 0, 0);
                    asked.min(2)
                })
            };
            let spender = {
                let r = Arc::clone(&r);
                thread::spawn(move || (0..2).filter(|_| r.decide(1, 1).is_some()).count())
            };
            let added = refill.join().unwrap();
            let spent = spender.join().unwrap();
            let left = usize::try_from(r.units()).unwrap();
            assert_eq!(
                spent + left,
                1 + usize::try_from(added).unwrap(),
                "every unit taken is spent or held"
            );
        });
    }
}
