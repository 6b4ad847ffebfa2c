//! The latencies of one sampling window: a lock-free log-linear histogram.
//!
//! Every completed request adds one count to a bucket; the controller reads a percentile
//! once per window and empties the buckets. Buckets are log-linear in microseconds: 16
//! linear sub-buckets per power of two, so a value is known within 1/16 of its octave
//! (6.25 %), and linear interpolation inside the bucket does better. Recording is two
//! relaxed atomic additions and never allocates.

use overload_core::sync::{AtomicU64, Ordering};

// NOTE: the buckets stay std's atomics under `cfg(loom)`: each is an independent counter,
// summed once per window, that no decision of the admitted path reads, and 592 of them
// would multiply loom's state space for nothing. The counters the window's close decision
// reads (`samples`, `failures`) are loom's.
use std::sync::atomic::{AtomicU32, Ordering as StdOrdering};

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Octaves above the linear range: values up to 2^(36) microseconds (19 hours) have their
/// own bucket; longer ones share the last.
const OCTAVES: u64 = 36 - SUB_BITS as u64 + 1;
const BUCKETS: usize = (SUB + OCTAVES * SUB) as usize;

/// The bucket of a latency of `micros` microseconds.
#[inline]
fn bucket_of(micros: u64) -> usize {
    if micros < SUB {
        return micros as usize;
    }
    let exp = 63 - u64::from(micros.leading_zeros());
    let shift = exp - u64::from(SUB_BITS);
    let sub = (micros >> shift) & (SUB - 1);
    let index = SUB + shift * SUB + sub;
    // NOTE: values past the last octave land in the last bucket; a latency of 19 hours is
    // as bad as any longer one for the controller.
    (index as usize).min(BUCKETS - 1)
}

/// The lower bound and width, in microseconds, of bucket `index`.
fn bucket_range(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < SUB {
        return (index, 1);
    }
    let shift = (index - SUB) / SUB;
    let sub = (index - SUB) % SUB;
    let low = (SUB + sub) << shift;
    (low, 1 << shift)
}

/// A window's latencies and its failures.
pub(super) struct LatencySampler {
    buckets: Box<[AtomicU32]>,
    /// Latencies recorded (successes), and failures, since the last [`take`](Self::take).
    samples: AtomicU64,
    failures: AtomicU64,
}

/// What [`LatencySampler::take`] read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct LatencyWindow {
    /// Latencies recorded.
    pub(super) samples: u64,
    /// Failures recorded.
    pub(super) failures: u64,
    /// The requested percentile of the latencies, in nanoseconds (`None` without samples).
    pub(super) percentile: Option<u64>,
}

impl LatencySampler {
    pub(super) fn new() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            samples: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// Records a success that took `nanos`.
    #[inline]
    pub(super) fn record(&self, nanos: u64) {
        self.buckets[bucket_of(nanos / 1_000)].fetch_add(1, StdOrdering::Relaxed);
        self.samples.fetch_add(1, Ordering::Relaxed);
    }

    /// Records `count` latencies of `nanos` each (requests released for being held long).
    pub(super) fn record_many(&self, nanos: u64, count: u64) {
        // NOTE: a bucket counts in 32 bits; a window holds far fewer requests than that.
        let added = u32::try_from(count).unwrap_or(u32::MAX);
        self.buckets[bucket_of(nanos / 1_000)].fetch_add(added, StdOrdering::Relaxed);
        self.samples.fetch_add(u64::from(added), Ordering::Relaxed);
    }

    /// Records a failure (no latency: a failure's latency says nothing about queueing).
    #[inline]
    pub(super) fn record_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Outcomes (successes and failures) recorded since the last [`take`](Self::take).
    #[inline]
    pub(super) fn outcomes(&self) -> u64 {
        self.samples.load(Ordering::Relaxed) + self.failures.load(Ordering::Relaxed)
    }

    /// Empties the window and returns what it held, with the `quantile` (within `0..=1`)
    /// of its latencies.
    ///
    /// A record racing with `take` lands in this window or the next one; the controller
    /// does not need more precision than that.
    pub(super) fn take(&self, quantile: f64) -> LatencyWindow {
        let mut counts = [0u32; BUCKETS];
        let mut total = 0u64;
        for (count, bucket) in counts.iter_mut().zip(self.buckets.iter()) {
            *count = bucket.swap(0, StdOrdering::Relaxed);
            total += u64::from(*count);
        }
        // NOTE: the counters are reset by subtracting what was read, not stored as zero, so
        // a record between the reads and the reset is kept for the next window.
        let samples = self.samples.load(Ordering::Relaxed);
        self.samples.fetch_sub(samples, Ordering::Relaxed);
        let failures = self.failures.load(Ordering::Relaxed);
        self.failures.fetch_sub(failures, Ordering::Relaxed);
        LatencyWindow {
            samples,
            failures,
            percentile: percentile(&counts, total, quantile),
        }
    }
}

/// The `quantile` of the histogram `counts` holding `total` values, in nanoseconds,
/// interpolated linearly inside its bucket.
fn percentile(counts: &[u32], total: u64, quantile: f64) -> Option<u64> {
    if total == 0 {
        return None;
    }
    // The rank of the value sought, 1-based: the smallest value has rank 1.
    let rank = ((quantile * total as f64).ceil() as u64).clamp(1, total);
    let mut below = 0u64;
    for (index, &count) in counts.iter().enumerate() {
        let count = u64::from(count);
        if count == 0 {
            continue;
        }
        if below + count >= rank {
            let (low, width) = bucket_range(index);
            // NOTE: the values of a bucket are taken as spread evenly over it; the k-th of
            // n sits at the middle of its 1/n slice.
            let within = (rank - below) as f64 - 0.5;
            let micros = low as f64 + width as f64 * within / count as f64;
            return Some((micros * 1_000.0) as u64);
        }
        below += count;
    }
    None
}

impl std::fmt::Debug for LatencySampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencySampler")
            .field("samples", &self.samples.load(Ordering::Relaxed))
            .field("failures", &self.failures.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        let mut next = 0;
        for index in 0..BUCKETS - 1 {
            let (low, width) = bucket_range(index);
            assert_eq!(low, next, "bucket {index}");
            assert_eq!(bucket_of(low), index);
            assert_eq!(bucket_of(low + width - 1), index);
            next = low + width;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn an_empty_window_has_no_percentile() {
        let s = LatencySampler::new();
        s.record_failure();
        let taken = s.take(0.5);
        assert_eq!((taken.samples, taken.failures), (0, 1));
        assert_eq!(taken.percentile, None);
        assert_eq!(s.outcomes(), 0, "take empties the window");
    }

    #[test]
    fn the_median_of_equal_latencies_is_that_latency_within_a_bucket() {
        let s = LatencySampler::new();
        for _ in 0..100 {
            s.record(100_000_000);
        }
        let p = s.take(0.5).percentile.unwrap() as f64;
        assert!((p / 100e6 - 1.0).abs() < 1.0 / 16.0, "{p}");
    }

    #[test]
    fn the_median_separates_two_groups() {
        let s = LatencySampler::new();
        for _ in 0..60 {
            s.record(10_000_000);
        }
        for _ in 0..40 {
            s.record(500_000_000);
        }
        let p50 = s.take(0.5).percentile.unwrap();
        assert!((9_000_000..11_000_000).contains(&p50), "{p50}");
    }

    proptest! {
        /// Any percentile is within one bucket (6.25 %) of the exact order statistic.
        #[test]
        fn percentile_is_within_a_bucket_of_the_exact_one(
            mut values in proptest::collection::vec(16u64..10_000_000_000, 1..300),
            q in 0.01f64..=1.0,
        ) {
            let s = LatencySampler::new();
            for &v in &values {
                s.record(v);
            }
            let got = s.take(q).percentile.unwrap() as f64;
            values.sort_unstable();
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
            let exact = values[rank - 1] as f64;
            prop_assert!((got - exact).abs() <= exact / 16.0 + 1_000.0, "{got} vs {exact}");
        }
    }
}
