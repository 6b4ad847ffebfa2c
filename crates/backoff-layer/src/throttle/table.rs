//! [`DestinationTable`]: the destinations one throttle tracks, in a fixed table that the
//! request path reads and writes without a lock.
//!
//! The table has `buckets * WAYS` slots. A destination is a nonzero 64-bit key (a keyed hash
//! of its scheme and authority); its bucket is fixed by the key, and it takes the first free
//! way of that bucket. The keys of a bucket share one cache line, so a lookup reads one line;
//! each slot's counters sit on cache lines of their own, so two destinations used from two
//! cores never share a line.
//!
//! Who writes what:
//!
//! - **requests** claim a free way (a compare-and-swap from 0 to their key), add their
//!   outcome to the slot's counters (one `fetch_add`), count a refusal, and read the slot's
//!   probability;
//! - **the tick** (one at a time, see `tick`) takes the counters (a `swap` to 0, so no
//!   outcome is ever lost: each lands before or after the swap), stores the new probability,
//!   and releases a slot idle for long enough (its state reset first, then its way set back
//!   to 0).
//!
//! What is not exact, by design, and harmless:
//!
//! - an outcome recorded while its slot is being released is counted for whichever
//!   destination claims the slot next (a request in flight for longer than the idle time
//!   that released its slot is dropped instead: its ticket no longer matches);
//! - a destination whose first requests race with the release of an earlier way of its
//!   bucket can hold two ways for a while; lookups use the first, and the other, idle, is
//!   released.

use crate::throttle::rule::SentCounts;
use overload_core::sync::{AtomicU64, Ordering};

/// Ways per bucket: the keys of a bucket fill one 64-byte cache line.
pub(crate) const WAYS: usize = 8;

/// The keys of one bucket, on one cache line; 0 is a free way.
#[repr(align(64))]
struct DestinationBucket {
    keys: [AtomicU64; WAYS],
}

/// The counters of one slot since the last tick, and its refusal probability, on cache
/// lines of their own.
#[repr(align(128))]
struct DestinationState {
    accepts: AtomicU64,
    failures: AtomicU64,
    refusals: AtomicU64,
    /// In `rule::PROBABILITY_ONE` units.
    probability: AtomicU64,
}

impl DestinationState {
    fn new() -> Self {
        Self {
            accepts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            probability: AtomicU64::new(0),
        }
    }
}

/// A request's hold on its destination's slot: where to record its attempts' outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ThrottleTicket {
    index: u32,
    key: u64,
}

impl ThrottleTicket {
    /// The slot's index in the table.
    pub(crate) const fn index(self) -> usize {
        self.index as usize
    }
}

/// How one attempt sent to a destination ended, for the throttle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ThrottleOutcome {
    /// The destination answered, and not with a failure.
    Accepted,
    /// A capacity signal (the protocol's `Outcome::is_capacity_signal`): a timeout, an
    /// error, a `429`, `503` or `504`, a gRPC `UNAVAILABLE`, `RESOURCE_EXHAUSTED` or
    /// `DEADLINE_EXCEEDED`, the stop signal.
    Failed,
}

/// What [`DestinationTable::claim`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The destination already had a slot (another request claimed it meanwhile).
    Known(ThrottleTicket),
    /// This call claimed a free slot for the destination.
    New(ThrottleTicket),
    /// Every way of the destination's bucket holds another destination.
    Full,
}

/// The table; see the [module docs](self).
pub(crate) struct DestinationTable {
    buckets: Box<[DestinationBucket]>,
    states: Box<[DestinationState]>,
    /// Buckets minus one: the bucket count is a power of two.
    mask: u64,
}

impl DestinationTable {
    /// A table with room for at least `capacity` destinations: `capacity` rounded up to
    /// whole buckets of [`WAYS`], then to a power of two of buckets.
    pub(crate) fn new(capacity: usize) -> Self {
        let buckets = capacity.div_ceil(WAYS).max(1).next_power_of_two();
        Self {
            buckets: (0..buckets)
                .map(|_| DestinationBucket {
                    keys: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect(),
            states: (0..buckets * WAYS)
                .map(|_| DestinationState::new())
                .collect(),
            mask: buckets as u64 - 1,
        }
    }

    /// The number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.states.len()
    }

    fn bucket(&self, key: u64) -> (usize, &DestinationBucket) {
        // NOTE: the high half picks the bucket; keys are keyed hashes, uniform in every bit.
        let b = ((key >> 32) & self.mask) as usize;
        (b, &self.buckets[b])
    }

    fn ticket(bucket: usize, way: usize, key: u64) -> ThrottleTicket {
        ThrottleTicket {
            // NOTE: the builder bounds the capacity far below `u32::MAX`.
            index: (bucket * WAYS + way) as u32,
            key,
        }
    }

    /// The slot of destination `key` (nonzero), if it has one.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<ThrottleTicket> {
        let (b, bucket) = self.bucket(key);
        bucket
            .keys
            .iter()
            .position(|k| k.load(Ordering::Acquire) == key)
            .map(|way| Self::ticket(b, way, key))
    }

    /// Finds or claims a slot for destination `key` (nonzero).
    #[cold]
    pub(crate) fn claim(&self, key: u64) -> Claim {
        debug_assert_ne!(key, 0, "0 marks a free way");
        let (b, bucket) = self.bucket(key);
        if let Some(way) = bucket
            .keys
            .iter()
            .position(|k| k.load(Ordering::Acquire) == key)
        {
            return Claim::Known(Self::ticket(b, way, key));
        }
        for (way, slot) in bucket.keys.iter().enumerate() {
            match slot.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Claim::New(Self::ticket(b, way, key)),
                // Another request claimed this way for the same destination first.
                Err(current) if current == key => {
                    return Claim::Known(Self::ticket(b, way, key));
                }
                Err(_) => {}
            }
        }
        Claim::Full
    }

    fn holds(&self, ticket: ThrottleTicket) -> Option<&DestinationState> {
        let index = ticket.index();
        let key = self.buckets[index / WAYS].keys[index % WAYS].load(Ordering::Relaxed);
        (key == ticket.key).then(|| &self.states[index])
    }

    /// The refusal probability of the ticket's destination, in `rule::PROBABILITY_ONE`
    /// units.
    #[inline]
    pub(crate) fn probability(&self, ticket: ThrottleTicket) -> u64 {
        self.states[ticket.index()]
            .probability
            .load(Ordering::Relaxed)
    }

    /// Counts an attempt's outcome, unless the ticket's slot was released meanwhile.
    #[inline]
    pub(crate) fn record(&self, ticket: ThrottleTicket, outcome: ThrottleOutcome) {
        if let Some(state) = self.holds(ticket) {
            let counter = match outcome {
                ThrottleOutcome::Accepted => &state.accepts,
                ThrottleOutcome::Failed => &state.failures,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a request the throttle refused.
    pub(crate) fn refused(&self, ticket: ThrottleTicket) {
        if let Some(state) = self.holds(ticket) {
            state.refusals.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The key in slot `index` (0 when free). For the tick.
    pub(crate) fn key_at(&self, index: usize) -> u64 {
        self.buckets[index / WAYS].keys[index % WAYS].load(Ordering::Acquire)
    }

    /// Takes slot `index`'s outcomes and refusals since the previous call, leaving zero.
    /// For the tick.
    pub(crate) fn take(&self, index: usize) -> (SentCounts, u64) {
        let state = &self.states[index];
        let sent = SentCounts {
            accepts: state.accepts.swap(0, Ordering::Relaxed),
            failures: state.failures.swap(0, Ordering::Relaxed),
        };
        (sent, state.refusals.swap(0, Ordering::Relaxed))
    }

    /// The probability stored in slot `index`. For the tick.
    pub(crate) fn probability_at(&self, index: usize) -> u64 {
        self.states[index].probability.load(Ordering::Relaxed)
    }

    /// Stores slot `index`'s new probability. For the tick.
    pub(crate) fn set_probability(&self, index: usize, probability: u64) {
        self.states[index]
            .probability
            .store(probability, Ordering::Relaxed);
    }

    /// Frees slot `index` if it still holds `key`: its counters and probability are reset
    /// first, then its way is set free. For the tick.
    pub(crate) fn release(&self, index: usize, key: u64) -> bool {
        self.set_probability(index, 0);
        let _ = self.take(index);
        self.buckets[index / WAYS].keys[index % WAYS]
            .compare_exchange(key, 0, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }
}
