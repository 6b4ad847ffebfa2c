//! A token bucket whose rate and burst change while it serves, without losing any key's
//! state and without admitting a burst: [`LiveTokenBucket`] and its [`TokenBucketHandle`].
//!
//! # The carry-over rule
//!
//! A GCRA key's state is its theoretical arrival time `TAT`; at an instant `c` its backlog
//! `d = max(0, TAT − c)` is `d / T` units in use (the units taken and not yet back), `T` the
//! emission interval. When the parameters change at `c` from (`T`, `B`) to (`T'`, `B'`),
//! the units in use are kept, up to the new burst:
//!
//! ```text
//! d' = min(d × T' / T, B' × T')      (rounded down to whole nanoseconds)
//! TAT' = c + d'                      (a key idle at c, TAT <= c, is left as it is)
//! ```
//!
//! So after the change the key has exactly the units free that the new limit would leave
//! it having had the same units in use: nothing the new limit admits is rejected, and from
//! `c` on at most `B' − d'/T' + L / T'` units (so never more than `B' + L / T'`) are
//! admitted in any interval of length `L`. A lowered rate therefore admits no burst (the
//! units in use stay in use, now coming back more slowly) and a raised rate admits at once
//! what it frees (the units in use come back sooner).
//!
//! The rule is applied lazily: each key's state carries the generation of the parameters
//! it was written under, and the first request of a key after a change converts its state
//! at the change's instant `c`, through every change it missed (the last
//! [`HISTORY`] changes are kept; a key idle for more changes than that converts from the
//! oldest kept, and an idle key, the usual case, needs no conversion at all).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use overload_core::ConfigError;
use overload_core::clock::Clock;
use overload_core::sync::{AtomicU64, Ordering};

use super::gcra::{TokenBucket, TokenBucketState};
use super::limiter::{Decision, Limiter, QuotaStatus};

/// How many past changes a [`LiveTokenBucket`] remembers to convert a key's state through.
pub const HISTORY: usize = 16;

/// A key's state written while a conversion is under way: the others wait for it (one
/// compare-and-swap).
const CONVERTING: u64 = u64::MAX;

/// The carry-over rule: `tat`, written under `old`, as the theoretical arrival time under
/// `new` from the change instant `at` (nanoseconds of the limiter's clock).
///
/// A key's backlog `d = max(0, TAT − at)` is `d / T` units in use (`T` the emission
/// interval). At a change from (`T`, `B`) to (`T'`, `B'`) the units in use are kept, up to
/// the new burst: `d' = min(d × T' / T, B' × T')` (rounded down) and `TAT' = at + d'`; a key
/// idle at `at` is left as it is. So after the change the key has exactly the units free
/// that the new limit would leave it having had the same units in use: nothing the new
/// limit admits is rejected, and from `at` on at most `B' + L / T'` units are admitted in
/// any interval of length `L` (a lowered rate admits no burst).
///
/// ```
/// use ratelimit_layer::algorithm::carry_over;
/// use ratelimit_layer::TokenBucket;
///
/// let old = TokenBucket::builder(10).burst(10).build()?; // T = 100 ms
/// let new = TokenBucket::builder(5).burst(10).build()?; // T' = 200 ms
/// // 4 units in use at 1 s (400 ms of backlog) stay 4 units in use: 800 ms.
/// assert_eq!(carry_over(&old, &new, 1_400_000_000, 1_000_000_000), 1_800_000_000);
/// // An idle key stays idle.
/// assert_eq!(carry_over(&old, &new, 500, 1_000_000_000), 500);
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
pub fn carry_over(old: &TokenBucket, new: &TokenBucket, tat: u64, at: u64) -> u64 {
    if tat <= at {
        return tat;
    }
    let backlog = u128::from(tat - at);
    let scaled = backlog * u128::from(new.emission) / u128::from(old.emission);
    // NOTE: capped at B' × T', which `TokenBucketBuilder::build` checked fits in a u64.
    let kept = u64::try_from(scaled.min(u128::from(new.tolerance))).unwrap_or(new.tolerance);
    at.saturating_add(kept)
}

/// One change of parameters: at `at`, from `from` to the parameters of generation
/// `generation`.
#[derive(Debug)]
struct Change {
    generation: u64,
    at: u64,
    from: TokenBucket,
}

/// The parameters in force and the changes that led to them.
#[derive(Debug)]
struct Snapshot {
    generation: u64,
    bucket: TokenBucket,
    /// The last [`HISTORY`] changes, oldest first.
    changes: Vec<Change>,
}

impl Snapshot {
    /// `tat`, written under generation `from`, converted to this snapshot's parameters.
    fn convert(&self, tat: u64, from: u64) -> u64 {
        let mut tat = tat;
        for (i, change) in self.changes.iter().enumerate() {
            if change.generation <= from {
                continue;
            }
            let to = self
                .changes
                .get(i + 1)
                .map_or(&self.bucket, |next| &next.from);
            // NOTE: a key older than the history converts from the oldest parameters kept.
            tat = carry_over(&change.from, to, tat, change.at);
        }
        tat
    }
}

/// A [`TokenBucket`] whose rate and burst a [`TokenBucketHandle`] changes while it serves,
/// carrying every key's state over by the rule of [`carry_over`]. It is a
/// [`Limiter`]: a layer or a keyed map uses it as it would a [`TokenBucket`].
///
/// The parameters are one `Arc` swapped lock-free ([`arc_swap`]); a request reads them
/// with one atomic load. A key's first request after a change converts its state once.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::clock::{Clock, FakeClock};
/// use ratelimit_layer::{Limiter, TokenBucket};
/// use ratelimit_layer::algorithm::LiveTokenBucket;
///
/// let clock = FakeClock::new();
/// let (bucket, handle) = LiveTokenBucket::new(TokenBucket::builder(10).burst(10).build()?, clock.clone());
/// let state = Default::default();
/// for _ in 0..10 {
///     assert!(bucket.check(&state, clock.now(), 1).is_allowed());
/// }
/// clock.advance(Duration::from_millis(500)); // 5 units back
/// handle.set_rate(1)?; // T' = 1 s: the 5 units in use now come back in 5 s
/// for _ in 0..5 {
///     assert!(bucket.check(&state, clock.now(), 1).is_allowed());
/// }
/// assert!(!bucket.check(&state, clock.now(), 1).is_allowed());
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
pub struct LiveTokenBucket {
    params: Arc<ArcSwap<Snapshot>>,
}

impl std::fmt::Debug for LiveTokenBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveTokenBucket")
            .field("bucket", &self.params.load().bucket)
            .finish()
    }
}

/// The state of one [`LiveTokenBucket`] key: its theoretical arrival time and the
/// generation of the parameters it was written under.
#[derive(Debug, Default)]
pub struct LiveTokenBucketState {
    inner: TokenBucketState,
    generation: AtomicU64,
}

/// Changes a [`LiveTokenBucket`]'s parameters; cheap to clone, usable from any thread.
pub struct TokenBucketHandle {
    params: Arc<ArcSwap<Snapshot>>,
    clock: Arc<dyn Clock>,
    /// Serializes changes (never a request): each reads the last and writes the next.
    write: Arc<std::sync::Mutex<()>>,
}

impl std::fmt::Debug for TokenBucketHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBucketHandle")
            .field("bucket", &self.params.load().bucket)
            .finish_non_exhaustive()
    }
}

impl Clone for TokenBucketHandle {
    fn clone(&self) -> Self {
        Self {
            params: Arc::clone(&self.params),
            clock: Arc::clone(&self.clock),
            write: Arc::clone(&self.write),
        }
    }
}

impl LiveTokenBucket {
    /// A live bucket starting with `bucket`'s parameters, and its handle; `clock` must be
    /// the clock the bucket's caller reads (a change takes effect at its `now`).
    pub fn new(bucket: TokenBucket, clock: impl Clock) -> (Self, TokenBucketHandle) {
        let params = Arc::new(ArcSwap::from_pointee(Snapshot {
            generation: 0,
            bucket,
            changes: Vec::new(),
        }));
        let handle = TokenBucketHandle {
            params: Arc::clone(&params),
            clock: Arc::new(clock),
            write: Arc::new(std::sync::Mutex::new(())),
        };
        (Self { params }, handle)
    }

    /// The parameters in force.
    pub fn current(&self) -> TokenBucket {
        self.params.load().bucket.clone()
    }

    /// Brings `state` to the generation of a snapshot at least as recent as its own, and
    /// returns that snapshot.
    fn converted(&self, state: &LiveTokenBucketState) -> arc_swap::Guard<Arc<Snapshot>> {
        loop {
            let snap = self.params.load();
            let seen = state.generation.load(Ordering::Acquire);
            if seen == snap.generation {
                return snap;
            }
            if seen == CONVERTING || seen > snap.generation {
                // Another request converts it, or converted it to a newer snapshot.
                #[cfg(loom)]
                loom::hint::spin_loop();
                #[cfg(not(loom))]
                std::hint::spin_loop();
                continue;
            }
            if state
                .generation
                .compare_exchange(seen, CONVERTING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // NOTE: requests of older generations still in their compare-and-swap loop see
            // the word change and retry, under the parameters they loaded (one decision
            // each, at most, around the change instant).
            let _ = state
                .inner
                .tat
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                    Some(snap.convert(tat, seen))
                });
            state.generation.store(snap.generation, Ordering::Release);
            return snap;
        }
    }

    /// `state`'s theoretical arrival time under the parameters in force, without writing.
    fn peek(
        &self,
        state: &LiveTokenBucketState,
    ) -> (arc_swap::Guard<Arc<Snapshot>>, TokenBucketState) {
        let snap = self.params.load();
        let tat = state.inner.tat.load(Ordering::Acquire);
        let seen = state.generation.load(Ordering::Acquire);
        let tat = if seen == CONVERTING || seen >= snap.generation {
            tat
        } else {
            snap.convert(tat, seen)
        };
        (
            snap,
            TokenBucketState {
                tat: AtomicU64::new(tat),
            },
        )
    }
}

impl Limiter for LiveTokenBucket {
    type State = LiveTokenBucketState;

    fn check_holding_back(
        &self,
        state: &LiveTokenBucketState,
        now: u64,
        cost: u32,
        held_back: u64,
    ) -> Decision {
        let snap = self.converted(state);
        snap.bucket
            .check_holding_back(&state.inner, now, cost, held_back)
    }

    fn status(&self, state: &LiveTokenBucketState, now: u64) -> QuotaStatus {
        let (snap, inner) = self.peek(state);
        snap.bucket.status(&inner, now)
    }

    fn is_idle(&self, state: &LiveTokenBucketState, now: u64) -> bool {
        // NOTE: idle under the old parameters is idle under any: the rule keeps TAT <= c.
        let (snap, inner) = self.peek(state);
        snap.bucket.is_idle(&inner, now)
    }

    fn quota(&self) -> u64 {
        self.params.load().bucket.quota()
    }

    fn window(&self) -> Duration {
        self.params.load().bucket.window()
    }

    fn capacity(&self) -> u64 {
        self.params.load().bucket.capacity()
    }
}

impl TokenBucketHandle {
    /// The parameters in force.
    pub fn current(&self) -> TokenBucket {
        self.params.load().bucket.clone()
    }

    /// Puts `bucket`'s parameters in force now; every key's state is carried over at this
    /// instant. Setting the parameters in force changes nothing.
    pub fn set(&self, bucket: TokenBucket) {
        let _ = self.update(|_| Ok::<_, ConfigError>(bucket));
    }

    /// Changes the rate (units per the bucket's period), keeping the period and the burst.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketBuilder::build`](super::TokenBucketBuilder::build); nothing changes.
    pub fn set_rate(&self, rate: u32) -> Result<(), ConfigError> {
        self.update(|now| {
            TokenBucket::builder(rate)
                .period(now.period())
                .burst(now.burst())
                .build()
        })
    }

    /// Changes the burst, keeping the rate and the period.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketBuilder::build`](super::TokenBucketBuilder::build); nothing changes.
    pub fn set_burst(&self, burst: u32) -> Result<(), ConfigError> {
        self.update(|now| {
            TokenBucket::builder(now.rate())
                .period(now.period())
                .burst(burst)
                .build()
        })
    }

    /// Puts in force what `next` makes of the parameters in force, changes serialized.
    fn update(
        &self,
        next: impl FnOnce(&TokenBucket) -> Result<TokenBucket, ConfigError>,
    ) -> Result<(), ConfigError> {
        let _write = self
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = self.params.load_full();
        let bucket = next(&last.bucket)?;
        if last.bucket == bucket {
            return Ok(());
        }
        let at = self.clock.now();
        let mut changes: Vec<Change> = last
            .changes
            .iter()
            .skip(last.changes.len().saturating_sub(HISTORY - 1))
            .map(|c| Change {
                generation: c.generation,
                at: c.at,
                from: c.from.clone(),
            })
            .collect();
        let generation = last.generation + 1;
        changes.push(Change {
            generation,
            at,
            from: last.bucket.clone(),
        });
        self.params.store(Arc::new(Snapshot {
            generation,
            bucket,
            changes,
        }));
        Ok(())
    }
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;

#[cfg(all(test, loom))]
#[path = "live_loom_tests.rs"]
mod loom_tests;
