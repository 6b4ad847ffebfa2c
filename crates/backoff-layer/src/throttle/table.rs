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
use overload_signal::protocol::Criticality;

/// The levels of criticality, one counter each: indexed by `Criticality::rank()`.
pub(crate) const LEVELS: usize = Criticality::ALL.len();

/// Ways per bucket: the keys of a bucket fill one 64-byte cache line.
pub(crate) const WAYS: usize = 8;

/// The keys of one bucket, on one cache line; 0 is a free way.
#[repr(align(64))]
struct DestinationBucket {
    keys: [AtomicU64; WAYS],
}

/// The counters of one slot since the last tick, by level, and its refusal probabilities,
/// on cache lines of their own (120 bytes: one 128-byte block).
#[repr(align(128))]
struct DestinationState {
    /// Outcomes by the level of the request that sent the attempt (indexed by rank): one
    /// `fetch_add` per attempt, as without levels; the rule reads their sums.
    accepts: [AtomicU64; LEVELS],
    failures: [AtomicU64; LEVELS],
    /// Refusals by level: two levels' 32-bit counts per word, each saturating.
    refusals: [AtomicU64; LEVELS / 2],
    /// The destination's refusal probability as the rule decided it, in
    /// `rule::PROBABILITY_ONE` units.
    probability: AtomicU64,
    /// The probability a request of each level is refused: the destination's, shared
    /// among the levels from the bottom (`rule::split`).
    level_probability: [AtomicU64; LEVELS],
}

impl DestinationState {
    fn new() -> Self {
        Self {
            accepts: std::array::from_fn(|_| AtomicU64::new(0)),
            failures: std::array::from_fn(|_| AtomicU64::new(0)),
            refusals: std::array::from_fn(|_| AtomicU64::new(0)),
            probability: AtomicU64::new(0),
            level_probability: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// What one slot's requests did since the last tick, by level (indexed by rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LevelCounts {
    /// Outcomes of the attempts sent.
    pub(crate) sent: [SentCounts; LEVELS],
    /// Requests refused.
    pub(crate) refusals: [u64; LEVELS],
}

impl LevelCounts {
    /// The outcomes of every level together: what the rule reads.
    pub(crate) fn sent(&self) -> SentCounts {
        self.sent
            .iter()
            .fold(SentCounts::default(), |sum, &c| sum.add(c))
    }

    /// Refusals of every level together.
    pub(crate) fn refusals(&self) -> u64 {
        self.refusals
            .iter()
            .fold(0, |sum, &n| sum.saturating_add(n))
    }

    /// Each level's requests: attempts sent and requests refused.
    pub(crate) fn offered(&self) -> [u64; LEVELS] {
        std::array::from_fn(|rank| self.sent[rank].sent().saturating_add(self.refusals[rank]))
    }
}

/// A request's hold on its destination's slot: where to record its attempts' outcomes, and
/// the level they count for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ThrottleTicket {
    index: u32,
    level: Criticality,
    key: u64,
}

impl ThrottleTicket {
    /// The slot's index in the table.
    pub(crate) const fn index(self) -> usize {
        self.index as usize
    }

    /// The level the ticket's outcomes count for.
    pub(crate) const fn level(self) -> Criticality {
        self.level
    }

    /// The same hold, for a request of `level` (a ticket is `critical`'s until then).
    #[inline]
    pub(crate) const fn at(mut self, level: Criticality) -> Self {
        self.level = level;
        self
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
            level: Criticality::Critical,
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

    /// The probability that a request of the ticket's level to its destination is refused,
    /// in `rule::PROBABILITY_ONE` units.
    #[inline]
    pub(crate) fn probability(&self, ticket: ThrottleTicket) -> u64 {
        self.states[ticket.index()].level_probability[ticket.level.rank()].load(Ordering::Relaxed)
    }

    /// Counts an attempt's outcome for its level, unless the ticket's slot was released
    /// meanwhile.
    #[inline]
    pub(crate) fn record(&self, ticket: ThrottleTicket, outcome: ThrottleOutcome) {
        if let Some(state) = self.holds(ticket) {
            let counters = match outcome {
                ThrottleOutcome::Accepted => &state.accepts,
                ThrottleOutcome::Failed => &state.failures,
            };
            counters[ticket.level.rank()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a request of the ticket's level the throttle refused.
    pub(crate) fn refused(&self, ticket: ThrottleTicket) {
        if let Some(state) = self.holds(ticket) {
            let rank = ticket.level.rank();
            let shift = 32 * (rank % 2);
            // NOTE: a saturating add within the level's half of the word: a count never
            // spills into its neighbour's (a compare-and-swap loop, on the refusing path
            // only).
            let _ = state.refusals[rank / 2].fetch_update(
                Ordering::Relaxed,
                Ordering::Relaxed,
                |word| {
                    let count = (word >> shift) & u64::from(u32::MAX);
                    (count < u64::from(u32::MAX)).then(|| word + (1 << shift))
                },
            );
        }
    }

    /// The key in slot `index` (0 when free). For the tick.
    pub(crate) fn key_at(&self, index: usize) -> u64 {
        self.buckets[index / WAYS].keys[index % WAYS].load(Ordering::Acquire)
    }

    /// Takes slot `index`'s outcomes and refusals since the previous call, every level
    /// together, leaving zero. For the tick.
    pub(crate) fn take(&self, index: usize) -> (SentCounts, u64) {
        let counts = self.take_levels(index);
        (counts.sent(), counts.refusals())
    }

    /// Takes slot `index`'s outcomes and refusals since the previous call, by level,
    /// leaving zero. For the tick.
    pub(crate) fn take_levels(&self, index: usize) -> LevelCounts {
        let state = &self.states[index];
        let words = [
            state.refusals[0].swap(0, Ordering::Relaxed),
            state.refusals[1].swap(0, Ordering::Relaxed),
        ];
        LevelCounts {
            sent: std::array::from_fn(|rank| SentCounts {
                accepts: state.accepts[rank].swap(0, Ordering::Relaxed),
                failures: state.failures[rank].swap(0, Ordering::Relaxed),
            }),
            refusals: std::array::from_fn(|rank| {
                (words[rank / 2] >> (32 * (rank % 2))) & u64::from(u32::MAX)
            }),
        }
    }

    /// The probability the rule decided for slot `index`'s destination. For the tick.
    pub(crate) fn probability_at(&self, index: usize) -> u64 {
        self.states[index].probability.load(Ordering::Relaxed)
    }

    /// The probability of each level of slot `index`'s destination. For the tick.
    pub(crate) fn level_probabilities_at(&self, index: usize) -> [u64; LEVELS] {
        let state = &self.states[index];
        std::array::from_fn(|rank| state.level_probability[rank].load(Ordering::Relaxed))
    }

    /// Stores slot `index`'s new probability, the same for every level.
    pub(crate) fn set_probability(&self, index: usize, probability: u64) {
        self.set_probabilities(index, probability, [probability; LEVELS]);
    }

    /// Stores slot `index`'s new probability and each level's. For the tick.
    pub(crate) fn set_probabilities(&self, index: usize, probability: u64, levels: [u64; LEVELS]) {
        let state = &self.states[index];
        state.probability.store(probability, Ordering::Relaxed);
        for (slot, level) in state.level_probability.iter().zip(levels) {
            slot.store(level, Ordering::Relaxed);
        }
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
