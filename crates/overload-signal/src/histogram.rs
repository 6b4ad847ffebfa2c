//! A sliding-window histogram of the attempt counters a server receives.
//!
//! A server alone cannot tell whether it is the only one struggling; the attempt counters on
//! its incoming requests tell it. If a large share of them are retries, its callers are
//! seeing failures too, and the fleet is drowning in retries. [`AttemptHistogram`] keeps
//! that share for the last few seconds, cheaply enough to record every request.
//!
//! # How it works
//!
//! The window (default 10 seconds) is cut into buckets (default 10 buckets of 1 second). A
//! request is counted in the bucket of the moment it arrived, in one of six classes
//! ([`AttemptClass`]): attempt `0`, `1`, `2`, `3` or more, unknown (no counter sent) and
//! malformed. A [`snapshot`](AttemptHistogram::snapshot) sums the current bucket and the
//! ones before it that are still in the window, so the window it reports on is between
//! `window - window / buckets` and `window` long: a bucket leaves the window whole.
//!
//! Every counter is one 64-bit atomic word that holds both the count and the number of the
//! bucket it belongs to. Recording is one compare-and-swap on that word: a counter that
//! still holds an old bucket's count is reset and counted in the same step, so there is no
//! lock, no background task, and no moment where a reset can lose a concurrent increment.
//! A counter left over from an old bucket is simply ignored by snapshots.
//!
//! Time is read from [`tokio::time::Instant`], so tests run under
//! `tokio::time::pause()`.
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use overload_signal::AttemptHistogram;
//! use overload_signal::protocol::Attempt;
//!
//! // Defaults: 10 seconds in 10 buckets.
//! let histogram = AttemptHistogram::default();
//! histogram.record(Attempt::Number(0));
//! histogram.record(Attempt::Number(0));
//! histogram.record(Attempt::Number(0));
//! histogram.record(Attempt::Number(1));
//! let snapshot = histogram.snapshot();
//! assert_eq!(snapshot.total(), 4);
//! assert_eq!(snapshot.retries(), 1);
//! assert_eq!(snapshot.retry_share(), Some(0.25));
//!
//! // A 30-second window in 6 buckets of 5 seconds.
//! let histogram =
//!     AttemptHistogram::new(Duration::from_secs(30), NonZeroU32::new(6).unwrap()).unwrap();
//! assert_eq!(histogram.window(), Duration::from_secs(30));
//! ```

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::protocol::Attempt;

/// The class a request's attempt counter falls into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptClass {
    /// `X-Request-Attempt: 0`: a first try.
    First,
    /// `1`: the first retry.
    Retry1,
    /// `2`: the second retry.
    Retry2,
    /// `3` or more.
    Retry3OrMore,
    /// No counter was sent: not counted as a retry.
    Unknown,
    /// The counter could not be read: treated as unknown, counted apart.
    Malformed,
}

impl AttemptClass {
    /// Every class, in the order of their [`label`](AttemptClass::label)s.
    pub const ALL: [AttemptClass; 6] = [
        AttemptClass::First,
        AttemptClass::Retry1,
        AttemptClass::Retry2,
        AttemptClass::Retry3OrMore,
        AttemptClass::Unknown,
        AttemptClass::Malformed,
    ];

    /// The class of an attempt counter.
    pub const fn of(attempt: Attempt) -> Self {
        match attempt {
            Attempt::Number(0) => AttemptClass::First,
            Attempt::Number(1) => AttemptClass::Retry1,
            Attempt::Number(2) => AttemptClass::Retry2,
            Attempt::Number(_) => AttemptClass::Retry3OrMore,
            Attempt::Unknown => AttemptClass::Unknown,
            Attempt::Malformed => AttemptClass::Malformed,
        }
    }

    /// Whether requests of this class are known retries.
    pub const fn is_retry(self) -> bool {
        matches!(
            self,
            AttemptClass::Retry1 | AttemptClass::Retry2 | AttemptClass::Retry3OrMore
        )
    }

    /// The metric label of this class: `"0"`, `"1"`, `"2"`, `"3+"`, `"unknown"`,
    /// `"malformed"`.
    pub const fn label(self) -> &'static str {
        match self {
            AttemptClass::First => "0",
            AttemptClass::Retry1 => "1",
            AttemptClass::Retry2 => "2",
            AttemptClass::Retry3OrMore => "3+",
            AttemptClass::Unknown => "unknown",
            AttemptClass::Malformed => "malformed",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl From<Attempt> for AttemptClass {
    fn from(attempt: Attempt) -> Self {
        Self::of(attempt)
    }
}

/// Why a histogram configuration was refused.
///
/// A configuration is valid when:
///
/// - the number of buckets is at most [`AttemptHistogram::MAX_BUCKETS`] (1024);
/// - each bucket (`window / buckets`) is at least [`AttemptHistogram::MIN_BUCKET_WIDTH`]
///   (1 millisecond);
/// - the window is at most [`AttemptHistogram::MAX_WINDOW`] (24 hours).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidHistogram {
    kind: InvalidHistogramKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum InvalidHistogramKind {
    TooManyBuckets,
    BucketTooNarrow,
    WindowTooLong,
}

impl fmt::Display for InvalidHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            InvalidHistogramKind::TooManyBuckets => f.write_str("too many buckets: at most 1024"),
            InvalidHistogramKind::BucketTooNarrow => {
                f.write_str("bucket too narrow: window / buckets must be at least 1ms")
            }
            InvalidHistogramKind::WindowTooLong => f.write_str("window too long: at most 24h"),
        }
    }
}

impl std::error::Error for InvalidHistogram {}

// NOTE: each counter word packs the bucket number it belongs to (high 32 bits, wrapping)
// and the count (low 32 bits, saturating). Reading or writing either half alone would break
// the lock-free reset; always go through `tag`, `count` and `pack`.
const COUNT_BITS: u32 = 32;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

const fn tag(word: u64) -> u32 {
    (word >> COUNT_BITS) as u32
}

const fn count(word: u64) -> u64 {
    word & COUNT_MASK
}

const fn pack(tag: u32, count: u64) -> u64 {
    ((tag as u64) << COUNT_BITS) | count
}

/// The low 32 bits of a bucket number: the tag stored with its counters.
const fn tag_of_bucket(bucket: u64) -> u32 {
    bucket as u32
}

/// One bucket's six counters. Aligned to a cache line so that recording in the current
/// bucket never contends with a snapshot reading the others.
#[repr(align(64))]
#[derive(Default)]
struct Bucket {
    counters: [AtomicU64; 6],
}

struct Inner {
    start: Instant,
    bucket_nanos: u64,
    buckets: Box<[Bucket]>,
}

/// A sliding-window histogram of the `X-Request-Attempt` values a server sees.
///
/// Cheap to clone: clones share the same counts. Safe and lock-free to use from every
/// thread at once. See the [module docs](crate::histogram) for how it works.
///
/// Defaults: a 10-second window in 10 buckets of 1 second. Ten seconds is the window the
/// paper and the SRE book use for retry budgets, so server and clients judge retries over
/// the same span; 1-second buckets make the window slide in steps of a tenth of it.
///
/// # Limits
///
/// - Counts saturate at `u32::MAX` (about 4.3 billion) per bucket and class.
/// - A bucket's counters carry its number modulo 2<sup>32</sup>: a counter nobody touched
///   for 2<sup>32</sup> buckets, less at most 65,536 (136 years with 1-second buckets, 49
///   days with the narrowest, 1-millisecond, buckets) is mistaken for a recent one: a
///   snapshot may count it once, or the next request of that class and bucket may go
///   uncounted.
#[derive(Clone)]
pub struct AttemptHistogram {
    inner: Arc<Inner>,
}

impl fmt::Debug for AttemptHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptHistogram")
            .field("window", &self.window())
            .field("buckets", &self.inner.buckets.len())
            .finish_non_exhaustive()
    }
}

impl Default for AttemptHistogram {
    /// A 10-second window in 10 buckets of 1 second.
    fn default() -> Self {
        Self::new(Self::DEFAULT_WINDOW, Self::DEFAULT_BUCKETS)
            .expect("the default configuration is valid")
    }
}

impl AttemptHistogram {
    /// The default window: 10 seconds (the retry-budget window of the paper and the SRE book).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

    /// The default number of buckets: 10, so the window slides in 1-second steps.
    pub const DEFAULT_BUCKETS: NonZeroU32 = NonZeroU32::new(10).unwrap();

    /// The most buckets a window may have: 1024. A snapshot reads every bucket, so more
    /// would make the decision on a rejected request slow for no useful precision.
    pub const MAX_BUCKETS: u32 = 1024;

    /// The narrowest bucket: 1 millisecond.
    pub const MIN_BUCKET_WIDTH: Duration = Duration::from_millis(1);

    /// The longest window: 24 hours.
    pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

    /// A histogram over `window`, cut into `buckets` equal buckets, starting now.
    ///
    /// The window actually used is `buckets` times `window / buckets` (in whole
    /// nanoseconds), which can be a few nanoseconds shorter than `window`.
    ///
    /// # Errors
    ///
    /// See [`InvalidHistogram`] for the rules.
    pub fn new(window: Duration, buckets: NonZeroU32) -> Result<Self, InvalidHistogram> {
        let err = |kind| Err(InvalidHistogram { kind });
        if buckets.get() > Self::MAX_BUCKETS {
            return err(InvalidHistogramKind::TooManyBuckets);
        }
        if window > Self::MAX_WINDOW {
            return err(InvalidHistogramKind::WindowTooLong);
        }
        let width = window / buckets.get();
        if width < Self::MIN_BUCKET_WIDTH {
            return err(InvalidHistogramKind::BucketTooNarrow);
        }
        let bucket_nanos = u64::try_from(width.as_nanos())
            .expect("a bucket of at most 24h fits in 64 bits of nanoseconds");
        let buckets = (0..buckets.get()).map(|_| Bucket::default()).collect();
        Ok(Self {
            inner: Arc::new(Inner {
                start: Instant::now(),
                bucket_nanos,
                buckets,
            }),
        })
    }

    /// The window a snapshot covers at most.
    pub fn window(&self) -> Duration {
        self.bucket_width() * self.bucket_count()
    }

    /// The width of one bucket: the step in which the window slides.
    pub fn bucket_width(&self) -> Duration {
        Duration::from_nanos(self.inner.bucket_nanos)
    }

    fn bucket_count(&self) -> u32 {
        u32::try_from(self.inner.buckets.len()).expect("at most MAX_BUCKETS buckets")
    }

    /// Records a request's attempt counter, now.
    pub fn record(&self, attempt: Attempt) {
        self.record_in_bucket(AttemptClass::of(attempt), self.bucket_at(Instant::now()));
    }

    /// Records a request's attempt counter as of `now`: for tests, which need a late
    /// record. A `now` before the histogram was created counts in its first bucket.
    #[cfg(test)]
    fn record_at(&self, attempt: Attempt, now: Instant) {
        self.record_in_bucket(AttemptClass::of(attempt), self.bucket_at(now));
    }

    /// The number of the bucket `now` falls in, counted from the histogram's creation.
    pub(crate) fn bucket_at(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.inner.start);
        // NOTE: 64 bits of nanoseconds last 584 years; saturating past that is harmless.
        // (Not `as_nanos()`: its 128-bit arithmetic costs more than the rest of a record.)
        let nanos = elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()));
        nanos / self.inner.bucket_nanos
    }

    pub(crate) fn record_in_bucket(&self, class: AttemptClass, bucket: u64) {
        let slots = self.inner.buckets.len() as u64;
        // `bucket % slots` is below `slots`, at most MAX_BUCKETS: the cast cannot truncate.
        let counter = &self.inner.buckets[(bucket % slots) as usize].counters[class.index()];
        let ours = tag_of_bucket(bucket);
        let mut word = counter.load(Ordering::Relaxed);
        loop {
            let theirs = tag(word);
            let next = if theirs == ours {
                let n = count(word);
                if n == COUNT_MASK {
                    return; // saturated
                }
                word + 1
            } else if recently_ahead(theirs, ours) {
                // A newer bucket already took this slot: we read the clock before a thread
                // that has since rolled it over, so our bucket has left the window.
                return;
            } else {
                // The slot still holds a bucket that has left the window: start ours.
                pack(ours, 1)
            };
            match counter.compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    /// The counts of the current window.
    pub fn snapshot(&self) -> AttemptSnapshot {
        self.snapshot_at(Instant::now())
    }

    /// The counts of the window that ends at `now`.
    pub fn snapshot_at(&self, now: Instant) -> AttemptSnapshot {
        self.snapshot_of_bucket(self.bucket_at(now))
    }

    pub(crate) fn snapshot_of_bucket(&self, current: u64) -> AttemptSnapshot {
        let slots = self.inner.buckets.len() as u64;
        let mut counts = [0u64; 6];
        // The current bucket and the `slots - 1` before it (fewer near the start).
        for bucket in current.saturating_sub(slots - 1)..=current {
            let expected = tag_of_bucket(bucket);
            let slot = &self.inner.buckets[(bucket % slots) as usize];
            for (sum, counter) in counts.iter_mut().zip(&slot.counters) {
                let word = counter.load(Ordering::Relaxed);
                if tag(word) == expected {
                    *sum += count(word);
                }
            }
        }
        AttemptSnapshot { counts }
    }
}

/// How far ahead of a record's bucket a slot's bucket may be for the record to be judged
/// late (and dropped) rather than the slot stale (and reset): 65,536 buckets.
///
/// NOTE: a slot's tag is only 32 bits, so "ahead" and "behind" cannot be told apart over the
/// whole circle. A record is late only if a thread stalled between reading the clock and
/// counting while others moved on by at least a window: a short distance ahead. A stale slot
/// is one nobody touched for a while, which looks like any distance behind, or, after 2^31
/// idle buckets, like a huge distance "ahead". Bounding "ahead" keeps both right except
/// within this many buckets of the documented 2^32 aliasing point.
const LATE_TOLERANCE: u32 = 1 << 16;

/// Whether tag `slot` is a bucket shortly after tag `ours`, on the wrapping 32-bit circle.
const fn recently_ahead(slot: u32, ours: u32) -> bool {
    let ahead = slot.wrapping_sub(ours);
    ahead != 0 && ahead <= LATE_TOLERANCE
}

/// The counts of one window of an [`AttemptHistogram`].
///
/// ```
/// use overload_signal::{AttemptClass, AttemptHistogram};
/// use overload_signal::protocol::Attempt;
///
/// let h = AttemptHistogram::default();
/// for a in [Attempt::Number(0), Attempt::Number(5), Attempt::Unknown, Attempt::Malformed] {
///     h.record(a);
/// }
/// let s = h.snapshot();
/// assert_eq!(s.count(AttemptClass::Retry3OrMore), 1);
/// assert_eq!(s.count(AttemptClass::Malformed), 1);
/// assert_eq!(s.total(), 4);
/// assert_eq!(s.retries(), 1);
/// assert_eq!(s.retry_share(), Some(0.25));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptSnapshot {
    counts: [u64; 6],
}

impl AttemptSnapshot {
    /// A snapshot with these counts, indexed as [`AttemptClass::ALL`]; for tests and for
    /// evaluating a [`StopRule`](crate::StopRule) on figures from elsewhere.
    pub const fn from_counts(counts: [u64; 6]) -> Self {
        Self { counts }
    }

    /// The requests of one class.
    pub const fn count(&self, class: AttemptClass) -> u64 {
        self.counts[class.index()]
    }

    /// Every request in the window, whatever its counter.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The known retries in the window: attempt `1` and above.
    pub fn retries(&self) -> u64 {
        AttemptClass::ALL
            .iter()
            .filter(|c| c.is_retry())
            .map(|&c| self.count(c))
            .sum()
    }

    /// The share of the window's requests that are known retries, in `[0, 1]`; `None` when
    /// the window is empty.
    ///
    /// The denominator is every request, including those with an unknown or malformed
    /// counter: requests the server cannot judge dilute the share rather than inflate it, so
    /// clients that do not send the header can never make a server send the stop signal.
    pub fn retry_share(&self) -> Option<f64> {
        let total = self.total();
        // u64 -> f64 loses precision only above 2^53 requests, far beyond saturation.
        (total > 0).then(|| self.retries() as f64 / total as f64)
    }

    /// Sets the `metrics` gauges that describe this window (see the
    /// [crate docs](crate#metrics)): `overload_signal_window_requests` per `attempt` label,
    /// and `overload_signal_window_retry_share`.
    pub fn export_metrics(&self) {
        for class in AttemptClass::ALL {
            metrics::gauge!(crate::metric_names::WINDOW_REQUESTS, "attempt" => class.label())
                .set(self.count(class) as f64);
        }
        metrics::gauge!(crate::metric_names::WINDOW_RETRY_SHARE)
            .set(self.retry_share().unwrap_or(0.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn h(window: u64, buckets: u32) -> AttemptHistogram {
        AttemptHistogram::new(secs(window), NonZeroU32::new(buckets).unwrap()).unwrap()
    }

    fn record_n(h: &AttemptHistogram, attempt: Attempt, n: usize) {
        for _ in 0..n {
            h.record(attempt);
        }
    }

    #[test]
    fn classes() {
        assert_eq!(AttemptClass::of(Attempt::Number(0)), AttemptClass::First);
        assert_eq!(AttemptClass::of(Attempt::Number(1)), AttemptClass::Retry1);
        assert_eq!(AttemptClass::of(Attempt::Number(2)), AttemptClass::Retry2);
        assert_eq!(
            AttemptClass::of(Attempt::Number(3)),
            AttemptClass::Retry3OrMore
        );
        assert_eq!(
            AttemptClass::of(Attempt::Number(Attempt::CLAMP)),
            AttemptClass::Retry3OrMore
        );
        assert_eq!(AttemptClass::of(Attempt::Unknown), AttemptClass::Unknown);
        assert_eq!(
            AttemptClass::of(Attempt::Malformed),
            AttemptClass::Malformed
        );
        for (i, c) in AttemptClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }

    #[test]
    fn invalid_configurations_are_refused() {
        let n = |b| NonZeroU32::new(b).unwrap();
        let e = AttemptHistogram::new(secs(10), n(1025)).unwrap_err();
        assert_eq!(e.to_string(), "too many buckets: at most 1024");
        let e = AttemptHistogram::new(Duration::from_millis(10), n(11)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bucket too narrow: window / buckets must be at least 1ms"
        );
        let e = AttemptHistogram::new(Duration::ZERO, n(1)).unwrap_err();
        assert_eq!(e.kind, InvalidHistogramKind::BucketTooNarrow);
        let e = AttemptHistogram::new(secs(24 * 3600 + 1), n(10)).unwrap_err();
        assert_eq!(e.to_string(), "window too long: at most 24h");
        assert!(AttemptHistogram::new(Duration::from_millis(10), n(10)).is_ok());
        assert!(AttemptHistogram::new(secs(24 * 3600), n(1024)).is_ok());
    }

    #[test]
    fn window_is_whole_buckets() {
        let h = AttemptHistogram::new(
            Duration::from_nanos(10_000_000_007),
            NonZeroU32::new(10).unwrap(),
        )
        .unwrap();
        assert_eq!(h.bucket_width(), Duration::from_nanos(1_000_000_000));
        assert_eq!(h.window(), secs(10));
        let d = AttemptHistogram::default();
        assert_eq!(d.window(), secs(10));
        assert_eq!(d.bucket_width(), secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn snapshot_math() {
        let h = AttemptHistogram::default();
        assert_eq!(h.snapshot().total(), 0);
        assert_eq!(h.snapshot().retry_share(), None);
        record_n(&h, Attempt::Number(0), 60);
        record_n(&h, Attempt::Number(1), 10);
        record_n(&h, Attempt::Number(2), 5);
        record_n(&h, Attempt::Number(3), 3);
        record_n(&h, Attempt::Number(40), 2);
        record_n(&h, Attempt::Unknown, 15);
        record_n(&h, Attempt::Malformed, 5);
        let s = h.snapshot();
        assert_eq!(s.count(AttemptClass::First), 60);
        assert_eq!(s.count(AttemptClass::Retry1), 10);
        assert_eq!(s.count(AttemptClass::Retry2), 5);
        assert_eq!(s.count(AttemptClass::Retry3OrMore), 5);
        assert_eq!(s.count(AttemptClass::Unknown), 15);
        assert_eq!(s.count(AttemptClass::Malformed), 5);
        assert_eq!(s.total(), 100);
        assert_eq!(s.retries(), 20);
        // Unknown and malformed dilute the share: 20 of 100, not 20 of 80.
        assert_eq!(s.retry_share(), Some(0.2));
        assert_eq!(
            s,
            AttemptSnapshot::from_counts([60, 10, 5, 5, 15, 5]),
            "from_counts is indexed as AttemptClass::ALL"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_unknown_is_share_zero() {
        let h = AttemptHistogram::default();
        record_n(&h, Attempt::Unknown, 3);
        assert_eq!(h.snapshot().retry_share(), Some(0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn window_slides_one_bucket_at_a_time() {
        let h = h(10, 10);
        // One request per second for 10 seconds: a retry in the first second, then first tries.
        h.record(Attempt::Number(1));
        for _ in 1..10 {
            tokio::time::advance(secs(1)).await;
            h.record(Attempt::Number(0));
        }
        let s = h.snapshot();
        assert_eq!(s.total(), 10);
        assert_eq!(s.retries(), 1);
        // 9.999 s after the start: the first bucket is still in the window.
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(h.snapshot().total(), 10);
        assert_eq!(h.snapshot().retries(), 1);
        // 10 s after the start: the first bucket (and its retry) has left; nothing else.
        tokio::time::advance(Duration::from_millis(1)).await;
        let s = h.snapshot();
        assert_eq!(s.total(), 9);
        assert_eq!(s.retries(), 0);
        assert_eq!(s.retry_share(), Some(0.0));
        // Each further second drops one more bucket.
        for left in (0..9).rev() {
            tokio::time::advance(secs(1)).await;
            assert_eq!(h.snapshot().total(), left);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn expired_bucket_is_reset_when_its_slot_is_reused() {
        let h = h(4, 4);
        record_n(&h, Attempt::Number(2), 7);
        // Exactly one window later the same slot is reused: old counts must not leak in.
        tokio::time::advance(secs(4)).await;
        record_n(&h, Attempt::Number(2), 1);
        record_n(&h, Attempt::Number(0), 1);
        let s = h.snapshot();
        assert_eq!(s.count(AttemptClass::Retry2), 1);
        assert_eq!(s.total(), 2);
        // Many windows later, a slot whose counters were never rewritten is ignored too.
        tokio::time::advance(secs(4 * 1000 + 1)).await;
        assert_eq!(h.snapshot().total(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_gap_longer_than_window_empties_it() {
        let h = h(10, 10);
        record_n(&h, Attempt::Number(1), 50);
        tokio::time::advance(secs(3600)).await;
        assert_eq!(h.snapshot().total(), 0);
        h.record(Attempt::Number(0));
        assert_eq!(h.snapshot().total(), 1);
        assert_eq!(h.snapshot().retries(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn late_record_for_a_bucket_already_rolled_over_is_dropped() {
        let h = h(2, 2);
        let then = Instant::now();
        tokio::time::advance(secs(2)).await;
        h.record(Attempt::Number(0)); // bucket 2 takes slot 0
        h.record_at(Attempt::Number(1), then); // bucket 0, slot 0: left the window
        let s = h.snapshot();
        assert_eq!(s.total(), 1);
        assert_eq!(s.retries(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn snapshot_at_reads_a_past_or_future_window() {
        let h = h(10, 10);
        let start = Instant::now();
        record_n(&h, Attempt::Number(1), 2);
        tokio::time::advance(secs(5)).await;
        record_n(&h, Attempt::Number(0), 3);
        assert_eq!(h.snapshot_at(start).total(), 2);
        assert_eq!(h.snapshot().total(), 5);
        assert_eq!(h.snapshot_at(start + secs(12)).total(), 3);
        assert_eq!(h.snapshot_at(start + secs(15)).total(), 0);
    }

    #[test]
    fn counter_word_packing() {
        assert_eq!(tag(pack(7, 9)), 7);
        assert_eq!(count(pack(7, 9)), 9);
        assert_eq!(tag(pack(u32::MAX, COUNT_MASK)), u32::MAX);
        assert!(recently_ahead(2, 1));
        assert!(!recently_ahead(1, 2));
        assert!(!recently_ahead(5, 5));
        assert!(recently_ahead(1 + LATE_TOLERANCE, 1));
        assert!(!recently_ahead(2 + LATE_TOLERANCE, 1));
        // Across the 32-bit wrap.
        assert!(recently_ahead(0, u32::MAX));
        assert!(!recently_ahead(u32::MAX, 0));
    }

    #[test]
    fn counts_saturate_instead_of_wrapping_into_the_tag() {
        let h = h(10, 10);
        let counter = &h.inner.buckets[3].counters[AttemptClass::Retry1.index()];
        counter.store(pack(3, COUNT_MASK - 1), Ordering::Relaxed);
        for _ in 0..3 {
            h.record_in_bucket(AttemptClass::Retry1, 3);
        }
        assert_eq!(tag(counter.load(Ordering::Relaxed)), 3);
        assert_eq!(h.snapshot_of_bucket(3).retries(), COUNT_MASK);
    }

    #[test]
    fn bucket_numbers_past_the_tag_wrap() {
        let h = h(10, 10);
        let near = (1u64 << 32) - 1;
        // Slots last used shortly before (a fresh histogram's slots say "bucket 0", which
        // is in the documented aliasing zone as seen from bucket 2^32 - 31).
        for b in h.inner.buckets.iter() {
            for c in &b.counters {
                c.store(pack(tag_of_bucket(near - 40), 5), Ordering::Relaxed);
            }
        }
        // Steady traffic up to the wrap, so every slot holds a recent bucket.
        for bucket in near - 30..near {
            h.record_in_bucket(AttemptClass::First, bucket);
            h.record_in_bucket(AttemptClass::Retry1, bucket);
        }
        assert_eq!(h.snapshot_of_bucket(near - 1).total(), 20);
        h.record_in_bucket(AttemptClass::Retry1, near);
        h.record_in_bucket(AttemptClass::First, near + 1);
        let s = h.snapshot_of_bucket(near + 1);
        // Buckets near-8 ..= near-1 (2 each), near (1) and near+1 (1).
        assert_eq!(s.total(), 18);
        assert_eq!(s.retries(), 9);
        // Window near+1 ..= near+10: only near+1's request.
        assert_eq!(h.snapshot_of_bucket(near + 10).total(), 1);
        assert_eq!(h.snapshot_of_bucket(near + 11).total(), 0);
    }

    #[test]
    fn slot_idle_for_more_than_2_pow_31_buckets_is_reset_not_ignored() {
        // Regression: comparing tags on the bare wrapping circle judged such a slot "newer"
        // and dropped every record into it.
        let h = h(10, 10);
        let later = (1u64 << 31) + 10;
        h.record_in_bucket(AttemptClass::Retry1, later);
        let s = h.snapshot_of_bucket(later);
        assert_eq!(s.total(), 1);
        assert_eq!(s.retries(), 1);
    }

    proptest::proptest! {
        /// Against a naive model (every event kept with its bucket number), for any number
        /// of buckets and any sequence of records with gaps (including gaps longer than the
        /// window), every snapshot counts exactly the events of its window.
        #[test]
        fn snapshots_match_a_naive_model(
            slots in 1u32..12,
            events in proptest::collection::vec((0u64..30, 0usize..6), 0..200),
            lookahead in 0u64..30,
        ) {
            let h = AttemptHistogram::new(
                Duration::from_millis(u64::from(slots) * 10),
                NonZeroU32::new(slots).unwrap(),
            )
            .unwrap();
            let mut bucket = 0u64;
            let mut model: Vec<(u64, AttemptClass)> = Vec::new();
            for (gap, class) in events {
                // Mostly small steps, sometimes a jump past the window.
                bucket += if gap < 25 { gap / 5 } else { gap };
                let class = AttemptClass::ALL[class];
                h.record_in_bucket(class, bucket);
                model.push((bucket, class));
                for at in [bucket, bucket + lookahead] {
                    let oldest = at.saturating_sub(u64::from(slots) - 1);
                    let mut expected = [0u64; 6];
                    for &(b, c) in &model {
                        if (oldest..=at).contains(&b) {
                            expected[c.index()] += 1;
                        }
                    }
                    proptest::prop_assert_eq!(
                        h.snapshot_of_bucket(at),
                        AttemptSnapshot::from_counts(expected)
                    );
                }
            }
        }
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        let h = h(10, 10);
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let h = h.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        h.record_in_bucket(AttemptClass::of(Attempt::Number(t % 2)), 0);
                    }
                });
            }
        });
        let s = h.snapshot_of_bucket(0);
        assert_eq!(s.total(), 40_000);
        assert_eq!(s.retries(), 20_000);
    }

    #[test]
    fn concurrent_rollover_loses_nothing_in_the_new_bucket() {
        // Threads race to reset a slot from bucket 0 to bucket 10 (same slot): whoever
        // resets counts itself, the others increment; nothing is lost or double-reset.
        let h = h(10, 10);
        for _ in 0..100 {
            h.record_in_bucket(AttemptClass::First, 0);
        }
        std::thread::scope(|s| {
            for _ in 0..4 {
                let h = h.clone();
                s.spawn(move || {
                    for _ in 0..5_000 {
                        h.record_in_bucket(AttemptClass::First, 10);
                    }
                });
            }
        });
        assert_eq!(h.snapshot_of_bucket(10).total(), 20_000);
    }
}
