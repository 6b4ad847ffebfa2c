//! [`DestinationSeries`]: what each destination's callers saw (the *effective* outcome of a
//! request, after its retries) beside what each attempt saw (the *actual* outcomes on the
//! wire), as Linkerd's `routes -o wide` shows them, in a bounded set of series.
//!
//! A destination is the throttle's: the request URI's scheme, host and port (the throttle's
//! [`ThrottleScope::Destination`](crate::throttle::ThrottleScope::Destination) key, whatever
//! scope the layer's throttle uses, and whether it has one). Its label, `server_address`,
//! is the host with the port when it is not the scheme's default (`api.internal`,
//! `10.0.0.7:8080`).
//!
//! The first `max` destinations a layer sees get series of their own, kept for the layer's
//! life (a recorder keeps every series it is given); every later one shares the series
//! `server_address="(other)"`. The table is fixed when the layer is built: `2 * max` slots
//! (a power of two), so a lookup probes a few slots at most.
//!
//! Cost on the request path once a destination's handles exist: a keyed hash of its scheme,
//! host and port (the throttle's), a probe of the table (one `Acquire` load per slot
//! probed), and one counter increment per attempt and per request; no lock, no allocation.
//! A new destination takes a lock and registers its four counters (and allocates its
//! label), once.

use std::fmt;
use std::sync::{OnceLock, PoisonError};

use http::Uri;
use metrics::{Counter, counter};
use overload_core::sync::{AtomicBool, AtomicU64, Mutex, Ordering};
use overload_core::telemetry::{LayerName, NAME_LABEL};

use crate::throttle::{DestinationKeys, Target, ThrottleScope, server_address};

/// Metric: requests by the outcome their caller got, after every retry (effective).
pub(crate) const REQUEST_OUTCOMES: &str = "backoff_layer_request_outcomes_total";
/// Metric: attempts by their own outcome (actual: what went over the wire).
pub(crate) const ATTEMPT_OUTCOMES: &str = "backoff_layer_attempt_outcomes_total";
/// The label naming a destination: OpenTelemetry's `server.address`, as a Prometheus label.
pub(crate) const SERVER_ADDRESS_LABEL: &str = "server_address";
/// The label of the outcome: [`SUCCESS`] or [`FAILURE`].
pub(crate) const OUTCOME_LABEL: &str = "outcome";
/// The outcome a caller (or an attempt) counts as a success.
pub(crate) const SUCCESS: &str = "success";
/// Every other outcome.
pub(crate) const FAILURE: &str = "failure";
/// The `server_address` of the series every destination beyond the bound shares.
pub(crate) const OTHER_SERVERS: &str = "(other)";

/// The four counters of one destination (or of `(other)`).
struct OutcomeCounters {
    /// Requests: `[success, failure]`.
    requests: [Counter; 2],
    /// Attempts: `[success, failure]`.
    attempts: [Counter; 2],
}

impl OutcomeCounters {
    fn register(name: &LayerName, server: &str) -> Self {
        let one = |metric: &'static str, outcome: &'static str| {
            counter!(
                metric,
                NAME_LABEL => name.label(),
                SERVER_ADDRESS_LABEL => server.to_owned(),
                OUTCOME_LABEL => outcome,
            )
        };
        Self {
            requests: [
                one(REQUEST_OUTCOMES, SUCCESS),
                one(REQUEST_OUTCOMES, FAILURE),
            ],
            attempts: [
                one(ATTEMPT_OUTCOMES, SUCCESS),
                one(ATTEMPT_OUTCOMES, FAILURE),
            ],
        }
    }
}

/// One slot of the table: a destination's key (0: free) and its counters.
struct SeriesSlot {
    key: AtomicU64,
    counters: OnceLock<OutcomeCounters>,
}

/// Where a request's outcomes are counted: a slot of the table, or `(other)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SeriesIndex(u32);

impl SeriesIndex {
    /// The series every destination beyond the bound shares.
    const OTHER: Self = Self(u32::MAX);
}

/// A layer's per-destination outcome counters; see the [module docs](self).
pub(crate) struct DestinationSeries {
    name: LayerName,
    keys: DestinationKeys,
    slots: Box<[SeriesSlot]>,
    /// Slots minus one (the slot count is a power of two); unused without slots.
    mask: usize,
    /// Destinations with series of their own, at most.
    max: usize,
    /// Destinations given a slot so far; held while one is given, so the bound is exact.
    claimed: Mutex<usize>,
    /// Set once `max` destinations have a slot: a destination not seen yet then goes to
    /// `(other)` without taking the lock.
    full: AtomicBool,
    other: OnceLock<OutcomeCounters>,
}

impl DestinationSeries {
    /// A table for `max` destinations with series of their own, for the layer `name`.
    /// Nothing is registered until a request comes.
    pub(crate) fn new(name: LayerName, max: usize) -> Self {
        // NOTE: at most half full, so a probe for an unknown destination meets a free
        // slot after a couple of steps; `max` is bounded by the builder.
        let len = if max == 0 {
            0
        } else {
            (2 * max).next_power_of_two()
        };
        Self {
            name,
            keys: DestinationKeys::new(ThrottleScope::Destination),
            slots: (0..len)
                .map(|_| SeriesSlot {
                    key: AtomicU64::new(0),
                    counters: OnceLock::new(),
                })
                .collect(),
            mask: len.saturating_sub(1),
            max,
            claimed: Mutex::new(0),
            full: AtomicBool::new(false),
            other: OnceLock::new(),
        }
    }

    /// The most destinations with series of their own.
    pub(crate) const fn max(&self) -> usize {
        self.max
    }

    /// The series of the request to `uri`, registered on its destination's first request.
    #[inline]
    pub(crate) fn index(&self, uri: &Uri) -> SeriesIndex {
        if self.slots.is_empty() {
            return self.other_index();
        }
        let target = Target::uri(uri);
        let key = self.keys.key(target);
        let start = (key >> 32) as usize & self.mask;
        for step in 0..self.slots.len() {
            let i = (start + step) & self.mask;
            match self.slots[i].key.load(Ordering::Acquire) {
                // NOTE: a key is stored (Release) only after its counters were set, and a
                // slot is never given up: a key seen here has its counters.
                k if k == key => return SeriesIndex(i as u32),
                0 => break,
                _ => {}
            }
        }
        // NOTE: a hostile or broken set of URLs past the bound costs this one relaxed load
        // per request, never the lock.
        if self.full.load(Ordering::Relaxed) {
            return self.other_index();
        }
        self.claim(key, target)
    }

    /// A slot for a destination not seen yet, or `(other)` when `max` have one.
    #[cold]
    fn claim(&self, key: u64, target: Target<'_>) -> SeriesIndex {
        let mut claimed = self.claimed.lock().unwrap_or_else(PoisonError::into_inner);
        let start = (key >> 32) as usize & self.mask;
        for step in 0..self.slots.len() {
            let i = (start + step) & self.mask;
            let slot = &self.slots[i];
            match slot.key.load(Ordering::Acquire) {
                // Claimed by another request while this one waited for the lock.
                k if k == key => return SeriesIndex(i as u32),
                0 if *claimed < self.max => {
                    let _ = slot.counters.get_or_init(|| {
                        OutcomeCounters::register(&self.name, &server_address(target.uri))
                    });
                    slot.key.store(key, Ordering::Release);
                    *claimed += 1;
                    if *claimed == self.max {
                        self.full.store(true, Ordering::Relaxed);
                    }
                    return SeriesIndex(i as u32);
                }
                0 => break,
                _ => {}
            }
        }
        drop(claimed);
        self.other_index()
    }

    #[inline]
    fn other_index(&self) -> SeriesIndex {
        let _ = self.other_counters();
        SeriesIndex::OTHER
    }

    fn other_counters(&self) -> &OutcomeCounters {
        self.other
            .get_or_init(|| OutcomeCounters::register(&self.name, OTHER_SERVERS))
    }

    #[inline]
    fn counters(&self, index: SeriesIndex) -> &OutcomeCounters {
        match self
            .slots
            .get(index.0 as usize)
            .and_then(|slot| slot.counters.get())
        {
            Some(counters) => counters,
            None => self.other_counters(),
        }
    }

    /// Counts an attempt whose outcome came back: a success by the layer's classifier (an
    /// answer that is not a failure and that it would not retry), or a failure.
    #[inline]
    pub(crate) fn attempt(&self, index: SeriesIndex, success: bool) {
        self.counters(index).attempts[usize::from(!success)].increment(1);
    }

    /// Counts a request whose caller got its outcome: a success, or a failure (given up on,
    /// final failure, error, stop signal, refused by the throttle, deadline passed).
    #[inline]
    pub(crate) fn request(&self, index: SeriesIndex, success: bool) {
        self.counters(index).requests[usize::from(!success)].increment(1);
    }
}

impl fmt::Debug for DestinationSeries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestinationSeries")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn one_destination_one_slot_and_the_rest_in_other() {
        let series = DestinationSeries::new(LayerName::default(), 2);
        let a = series.index(&uri("http://a.test/x"));
        assert_eq!(
            series.index(&uri("http://A.test:80/y?z")),
            a,
            "one destination"
        );
        let b = series.index(&uri("https://a.test/x"));
        assert_ne!(b, a, "the scheme is part of the destination");
        assert_ne!(a, SeriesIndex::OTHER);
        assert_ne!(b, SeriesIndex::OTHER);
        assert_eq!(series.index(&uri("http://c.test/")), SeriesIndex::OTHER);
        assert_eq!(series.index(&uri("http://a.test/")), a, "still its own");
        assert_eq!(*series.claimed.lock().unwrap(), 2);
    }

    #[test]
    fn no_series_of_their_own_is_all_other() {
        let series = DestinationSeries::new(LayerName::default(), 0);
        assert_eq!(series.index(&uri("http://a.test/")), SeriesIndex::OTHER);
        assert_eq!(series.index(&uri("/relative")), SeriesIndex::OTHER);
    }

    /// A client whose URIs its users choose (a webhook sender) meets ten thousand hosts: the
    /// table stays at its size, and every host past the bound lands in `(other)`.
    #[test]
    fn a_flood_of_hosts_is_bounded() {
        let series = DestinationSeries::new(LayerName::default(), 32);
        assert_eq!(series.slots.len(), 64);
        let mut own = std::collections::HashSet::new();
        for i in 0..10_000 {
            let index = series.index(&uri(&format!("http://h{i}.test:{}/", 1000 + i % 7)));
            if index != SeriesIndex::OTHER {
                own.insert(index);
            }
        }
        assert_eq!(own.len(), 32);
        assert_eq!(*series.claimed.lock().unwrap(), 32);
        assert!(series.full.load(Ordering::Relaxed));
    }
}

/// Model tests under loom: `RUSTFLAGS="--cfg loom" cargo test -p backoff-layer --lib
/// --release loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    /// Two requests to a new destination at once: one slot, both told the same, and the
    /// slot's counters are there for whichever reads it first.
    #[test]
    fn loom_two_requests_to_a_new_destination_share_one_series() {
        loom::model(|| {
            let series = Arc::new(DestinationSeries::new(LayerName::default(), 2));
            let other = Arc::clone(&series);
            let t = thread::spawn(move || {
                let index = other.index(&uri("http://a.test/"));
                assert!(other.slots[index.0 as usize].counters.get().is_some());
                index
            });
            let mine = series.index(&uri("http://a.test/"));
            assert!(series.slots[mine.0 as usize].counters.get().is_some());
            assert_eq!(t.join().unwrap(), mine);
            assert_ne!(mine, SeriesIndex::OTHER);
            assert_eq!(*series.claimed.lock().unwrap(), 1);
            assert!(!series.full.load(Ordering::Relaxed));
        });
    }

    /// Room for one: two new destinations at once, one gets it, the other `(other)`, and
    /// the bound is exact.
    #[test]
    fn loom_the_bound_holds_when_two_destinations_race_for_the_last_slot() {
        loom::model(|| {
            let series = Arc::new(DestinationSeries::new(LayerName::default(), 1));
            let other = Arc::clone(&series);
            let t = thread::spawn(move || other.index(&uri("http://b.test/")));
            let a = series.index(&uri("http://a.test/"));
            let b = t.join().unwrap();
            assert!(
                (a == SeriesIndex::OTHER) != (b == SeriesIndex::OTHER),
                "exactly one has a series of its own: {a:?} {b:?}"
            );
            assert_eq!(*series.claimed.lock().unwrap(), 1);
            assert!(series.full.load(Ordering::Relaxed));
            // The winner keeps its series; the loser stays in `(other)`.
            assert_eq!(series.index(&uri("http://a.test/")), a);
            assert_eq!(series.index(&uri("http://b.test/")), b);
        });
    }
}
