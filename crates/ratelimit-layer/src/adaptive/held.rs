//! Requests held too long: admissions counted by generation, so that the layer's tick can
//! release, all at once and without visiting them, the requests still in flight after
//! [`release_after`](super::AdaptiveLimitBuilder::release_after).
//!
//! A generation is one epoch of admissions; the tick starts a new one every epoch (the
//! release bound). Three words, one per live generation, each pack the generation's tag,
//! an `EXPIRED` bit and the count of its admitted requests still in flight. Admission adds
//! one to the word of the current generation and remembers the generation; completion
//! takes one off that word while it is still live. At each epoch the tick expires the
//! generation before the previous one: its count is taken at once, those requests leave
//! the in-flight count and join the released count, and their completion later finds the
//! word expired (or reused) and counts nothing more. A request is released after between
//! one and two epochs in flight.
//!
//! Lock-free on the request path: one compare-and-swap on admission and one on completion,
//! no allocation. The tick's three steps run under a lock (only the tick takes it).

use std::sync::Mutex;
use std::time::Duration;

use overload_core::sync::{AtomicU64, Ordering};

/// The default bound, in target latencies (the baseline times the tolerance): 10. See
/// the reasons on [`AdaptiveLimitLayer`](super::AdaptiveLimitLayer)'s constants.
pub(super) const RELEASE_AFTER_TARGETS: f64 = 10.0;
/// The least default bound: 1 s.
pub(super) const RELEASE_AFTER_MIN: Duration = Duration::from_secs(1);
/// The most default bound: 30 s.
pub(super) const RELEASE_AFTER_MAX: Duration = Duration::from_secs(30);
/// The default bound before a baseline is known: 5 s.
pub(super) const RELEASE_AFTER_UNMEASURED: Duration = Duration::from_secs(5);

/// Bits of a word: the count of in-flight requests in the low 32, the generation's tag in
/// the next 31, and `EXPIRED` on top.
const COUNT_BITS: u32 = 32;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const TAG_MASK: u64 = (1 << 31) - 1;
const EXPIRED: u64 = 1 << 63;

/// The generations a word can belong to: the current one, the previous one (still live),
/// and the one before, expired.
const WORDS: u64 = 3;

/// The word of a live `generation` with no request in it.
const fn fresh(generation: u64) -> u64 {
    (generation & TAG_MASK) << COUNT_BITS
}

/// Whether `word` is `generation`'s and not expired.
const fn is_live(word: u64, generation: u64) -> bool {
    word & !COUNT_MASK == fresh(generation)
}

const fn index(generation: u64) -> usize {
    (generation % WORDS) as usize
}

/// The requests admitted in each live generation, and those released while still running.
pub(super) struct HeldRequests {
    /// The generation admissions join; written only by the tick. On a cache line of its
    /// own, apart from the words every admission writes, so that reading it costs no
    /// transfer of the line between cores.
    current: CacheLines<AtomicU64>,
    words: CacheLines<[AtomicU64; WORDS as usize]>,
    /// Requests released and still running, as a wrapping count: a released request that
    /// completes between the tick's expiry and its addition takes one off first, so read it
    /// with [`released`](Self::released).
    released: AtomicU64,
    /// When the current generation began (clock nanoseconds); the tick's alone.
    began: Mutex<u64>,
}

/// A value on cache lines of its own (128 bytes: two lines, for the adjacent-line
/// prefetcher).
#[repr(align(128))]
struct CacheLines<T>(T);

impl<T> std::ops::Deref for CacheLines<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What one epoch's change released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Released {
    /// Requests released.
    pub(super) count: u64,
    /// How long each had been in flight at least, in nanoseconds: the time since the end of
    /// the generation it was admitted in (at least one epoch).
    pub(super) age: u64,
}

impl HeldRequests {
    /// Generation 2 current and empty, generation 1 live and empty, generation 0 expired:
    /// the first epoch's change expires generation 1 and finds nothing.
    pub(super) fn new(now: u64) -> Self {
        // NOTE: starting at 2, so that `generation - 1` never wraps (and a wrapped tag never
        // meets a word of generation 0).
        Self {
            current: CacheLines(AtomicU64::new(2)),
            words: CacheLines([
                AtomicU64::new(fresh(0) | EXPIRED),
                AtomicU64::new(fresh(1)),
                AtomicU64::new(fresh(2)),
            ]),
            released: AtomicU64::new(0),
            began: Mutex::new(now),
        }
    }

    /// Counts a request the in-flight count just admitted in the current generation, and
    /// returns that generation, which the request hands back to [`complete`](Self::complete).
    #[inline]
    pub(super) fn admit(&self) -> u64 {
        loop {
            let generation = self.current.load(Ordering::Acquire);
            let word = &self.words[index(generation)];
            let mut seen = word.load(Ordering::Acquire);
            while is_live(seen, generation) {
                match word.compare_exchange_weak(
                    seen,
                    seen + 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return generation,
                    Err(actual) => seen = actual,
                }
            }
            // NOTE: the tick moved on between our two reads (it expired or reused the
            // word); it published the new generation before it touched the word, so the
            // next read of `current` is newer. A request that read the generation just
            // before the change joins the previous one and is released after one epoch
            // instead of two.
        }
    }

    /// Ends a request of `generation`: `true` when it still counted (the caller gives its
    /// slot back), `false` when the tick had released it (its slot went back then; it
    /// leaves the released count here, and counts nothing more).
    #[inline]
    pub(super) fn complete(&self, generation: u64) -> bool {
        let word = &self.words[index(generation)];
        let mut seen = word.load(Ordering::Acquire);
        while is_live(seen, generation) {
            // NOTE: a live word of this generation counts this request: its count is at
            // least 1. An expired or reused word is never written here, so a request is
            // taken off once, by this call or by the tick, never both.
            match word.compare_exchange_weak(seen, seen - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => seen = actual,
            }
        }
        self.released.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Once `epoch` nanoseconds have passed since the current generation began, starts the
    /// next one and releases the generation before the previous one; `None` before, or
    /// while another thread is at it. The caller takes the released requests off the
    /// in-flight count.
    pub(super) fn advance(&self, now: u64, epoch: u64) -> Option<Released> {
        let mut began = match self.began.try_lock() {
            Ok(began) => began,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if now.saturating_sub(*began) < epoch {
            return None;
        }
        let generation = self.current.load(Ordering::Acquire);
        let next = generation + 1;
        // NOTE: the three steps in this order. The word the next generation takes held
        // the generation expired at the last change: its requests are in the released
        // count already, and their completions find the word reused and count nothing.
        // Publishing after the reset means an admission never finds the new generation's
        // word stale; expiring after publishing means an admission that finds its word
        // expired reads the new generation on its next try.
        self.words[index(next)].store(fresh(next), Ordering::Release);
        self.current.store(next, Ordering::Release);
        let expired = generation - 1;
        let before = self.words[index(expired)].fetch_or(EXPIRED, Ordering::AcqRel);
        debug_assert!(is_live(before, expired), "a generation expires once");
        let count = before & COUNT_MASK;
        if count > 0 {
            self.released.fetch_add(count, Ordering::AcqRel);
        }
        let age = now.saturating_sub(*began);
        *began = now;
        Some(Released { count, age })
    }

    /// Requests released and still running.
    #[inline]
    pub(super) fn released(&self) -> usize {
        // NOTE: the count may read one below zero for a moment (see the field); that is 0.
        let released = self.released.load(Ordering::Acquire) as i64;
        usize::try_from(released).unwrap_or(0)
    }

    /// When the current generation began.
    #[cfg(all(test, not(loom)))]
    fn began(&self) -> u64 {
        *self
            .began
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for HeldRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldRequests")
            .field("generation", &self.current.load(Ordering::Relaxed))
            .field("released", &self.released())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const EPOCH: u64 = 1_000;

    #[test]
    fn a_request_completed_within_its_epochs_is_never_released() {
        let held = HeldRequests::new(0);
        let g = held.admit();
        assert_eq!(
            held.advance(EPOCH, EPOCH),
            Some(Released {
                count: 0,
                age: EPOCH
            })
        );
        assert!(held.complete(g), "still counted one epoch on");
        assert_eq!(held.advance(2 * EPOCH, EPOCH).unwrap().count, 0);
        assert_eq!(held.released(), 0);
    }

    #[test]
    fn a_request_in_flight_two_epochs_is_released_once() {
        let held = HeldRequests::new(0);
        let early = held.admit();
        assert!(held.advance(EPOCH - 1, EPOCH).is_none(), "not due yet");
        assert_eq!(held.began(), 0);
        held.advance(EPOCH, EPOCH).unwrap();
        let late = held.admit();
        assert_ne!(early, late);
        let released = held.advance(2 * EPOCH + 5, EPOCH).unwrap();
        assert_eq!(
            released,
            Released {
                count: 1,
                age: EPOCH + 5
            }
        );
        assert_eq!(held.released(), 1);
        assert!(
            !held.complete(early),
            "released: its slot went back at the tick"
        );
        assert_eq!(held.released(), 0);
        assert!(held.complete(late), "one epoch old: still counted");
        // Many epochs later, a released request whose word was reused counts nothing.
        let stuck = held.admit();
        for i in 3..10 {
            held.advance(i * EPOCH + 5, EPOCH).unwrap();
        }
        assert_eq!(held.released(), 1);
        assert!(!held.complete(stuck));
        assert_eq!(held.released(), 0);
    }

    #[test]
    fn counts_are_per_generation() {
        let held = HeldRequests::new(0);
        let a: Vec<_> = (0..5).map(|_| held.admit()).collect();
        held.advance(EPOCH, EPOCH).unwrap();
        let b: Vec<_> = (0..3).map(|_| held.admit()).collect();
        assert!(held.complete(a[0]) && held.complete(b[0]));
        assert_eq!(held.advance(2 * EPOCH, EPOCH).unwrap().count, 4);
        assert_eq!(held.advance(3 * EPOCH, EPOCH).unwrap().count, 2);
        assert_eq!(held.released(), 6);
    }
}
