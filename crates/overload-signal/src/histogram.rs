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
//! The histogram is a [`Window`] of six counters per bucket: recording
//! is one compare-and-swap on a counter of the recording thread's own stripe (so cores do not
//! contend on one word), which also resets a counter left over from an old bucket; there is no
//! lock, no background task, and no moment where a reset can lose a concurrent record. See
//! the [window's docs](overload_core::window) for the guarantees.
//!
//! Time is read from a [`Clock`], [`TokioClock`] by default, so tests run under
//! `tokio::time::pause()`.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use overload_signal::AttemptHistogram;
//! use overload_signal::protocol::Attempt;
//!
//! // Defaults: 10 seconds in 10 buckets.
//! let histogram = AttemptHistogram::new();
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
//! let histogram = AttemptHistogram::builder()
//!     .window(Duration::from_secs(30))
//!     .buckets(6)
//!     .build()?;
//! assert_eq!(histogram.window(), Duration::from_secs(30));
//! assert_eq!(histogram.bucket_width(), Duration::from_secs(5));
//! # Ok::<(), overload_core::ConfigError>(())
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::protocol::Attempt;
use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::window::Window;

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

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl From<Attempt> for AttemptClass {
    fn from(attempt: Attempt) -> Self {
        Self::of(attempt)
    }
}

/// The number of classes.
const CLASSES: usize = AttemptClass::ALL.len();

/// The counter, after the classes', of the requests that were not retries and were answered
/// with the stop signal by the decision rule.
const STOPPED: usize = CLASSES;

/// The counters per bucket: one per class, and the stopped requests.
const COUNTERS: usize = CLASSES + 1;

/// A sliding-window histogram of the `X-Request-Attempt` values a server sees.
///
/// Cheap to clone: clones share the same counts. Safe and lock-free to use from every
/// thread at once. See the [module docs](crate::histogram) for how it works.
///
/// Defaults ([`AttemptHistogram::new`], [`AttemptHistogram::builder`]): a **10-second window
/// in 10 buckets of 1 second**, on [`TokioClock`]. Ten seconds is the window the paper
/// ("Handling overloads in distributed systems") and the Google SRE book use for retry
/// budgets, so server and clients judge retries over the same span; 1-second buckets make the
/// window slide in steps of a tenth of it.
///
/// # Limits
///
/// - Counts saturate at `u32::MAX` (about 4.3 billion) per bucket, class and stripe (the
///   recording threads are spread over up to 16 stripes); snapshots add them up in `u64`.
/// - A bucket's counters carry its number modulo 2<sup>32</sup> (136 years of 1-second
///   buckets, 49 days of the narrowest, 1-millisecond, ones); each new bucket resets the
///   counters it reuses, so only a histogram that recorded nothing for a multiple of
///   2<sup>32</sup> buckets can, in a snapshot taken before its next record, count that old
///   bucket's requests once.
/// - A request recorded by a thread that read the clock, then stalled while the window moved
///   on past its bucket, is not counted: its bucket has left the window.
pub struct AttemptHistogram<C: Clock = TokioClock> {
    window: Arc<Window<COUNTERS, C>>,
}

impl<C: Clock> Clone for AttemptHistogram<C> {
    fn clone(&self) -> Self {
        Self {
            window: Arc::clone(&self.window),
        }
    }
}

impl<C: Clock> fmt::Debug for AttemptHistogram<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptHistogram")
            .field("window", &self.window())
            .field("buckets", &self.buckets())
            .finish_non_exhaustive()
    }
}

impl AttemptHistogram {
    /// The default window: 10 seconds (the retry-budget window of the paper and the SRE book).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

    /// The default number of buckets: 10, so the window slides in 1-second steps.
    pub const DEFAULT_BUCKETS: u32 = 10;

    /// The most buckets a window may have: 1024. A snapshot reads every bucket, so more
    /// would make the decision on a rejected request slow for no useful precision.
    pub const MAX_BUCKETS: u32 = 1024;

    /// The narrowest bucket: 1 millisecond.
    pub const MIN_BUCKET_WIDTH: Duration = Duration::from_millis(1);

    /// The longest window: 24 hours.
    pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

    /// A histogram with the defaults: 10 seconds in 10 buckets, on [`TokioClock`], starting
    /// now.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default histogram configuration is valid")
    }

    /// A builder that starts from the defaults.
    pub fn builder() -> AttemptHistogramBuilder {
        AttemptHistogramBuilder::new()
    }
}

impl Default for AttemptHistogram {
    /// The same as [`AttemptHistogram::new`]: 10 seconds in 10 buckets of 1 second.
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> AttemptHistogram<C> {
    /// The window a snapshot covers at most: the buckets times their width.
    pub fn window(&self) -> Duration {
        self.window.window()
    }

    /// The width of one bucket: the step in which the window slides.
    pub fn bucket_width(&self) -> Duration {
        self.window.slot_width()
    }

    /// The number of buckets.
    pub fn buckets(&self) -> u32 {
        self.window.slots()
    }

    /// The clock the histogram reads.
    pub fn clock(&self) -> &C {
        self.window.clock()
    }

    /// Records a request's attempt counter, now.
    #[inline]
    pub fn record(&self, attempt: Attempt) {
        self.record_in(self.bucket_now(), AttemptClass::of(attempt));
    }

    /// The counts of the current window.
    pub fn snapshot(&self) -> AttemptSnapshot {
        self.snapshot_of(self.bucket_now())
    }

    /// The number of the bucket the clock is in now.
    #[inline]
    pub(crate) fn bucket_now(&self) -> u64 {
        self.window.slot_now()
    }

    /// Records one request of `class` in bucket `bucket`.
    #[inline]
    pub(crate) fn record_in(&self, bucket: u64, class: AttemptClass) {
        self.window.add(bucket, class.index(), 1);
    }

    /// Records, in bucket `bucket`, that a request already recorded, which was not a known
    /// retry, was answered with the stop signal by the decision rule (see
    /// [`AttemptSnapshot::stopped`]).
    #[inline]
    pub(crate) fn record_stopped_in(&self, bucket: u64) {
        self.window.add(bucket, STOPPED, 1);
    }

    /// The counts of the window ending with bucket `bucket`.
    pub(crate) fn snapshot_of(&self, bucket: u64) -> AttemptSnapshot {
        let counts = self.window.counts(bucket);
        let all = counts.added_all();
        AttemptSnapshot {
            counts: std::array::from_fn(|i| all[i]),
            stopped: all[STOPPED],
        }
    }
}

/// Builds an [`AttemptHistogram`]; every setting starts at its default (see
/// [`AttemptHistogram`]).
#[derive(Debug)]
pub struct AttemptHistogramBuilder<C: Clock = TokioClock> {
    window: Duration,
    buckets: u32,
    clock: C,
}

impl AttemptHistogramBuilder {
    /// A builder with the defaults: 10 seconds in 10 buckets, on [`TokioClock`].
    pub fn new() -> Self {
        Self {
            window: AttemptHistogram::DEFAULT_WINDOW,
            buckets: AttemptHistogram::DEFAULT_BUCKETS,
            clock: TokioClock::new(),
        }
    }
}

impl Default for AttemptHistogramBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> AttemptHistogramBuilder<C> {
    /// How far back a snapshot reaches. Default: 10 seconds, the retry-budget window of the
    /// paper and the SRE book.
    ///
    /// Must be more than zero and at most [`AttemptHistogram::MAX_WINDOW`] (24 hours). The
    /// window used is `buckets` times `window / buckets` in whole nanoseconds, which can be a
    /// few nanoseconds shorter.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Into how many buckets the window is cut; it slides one bucket at a time. Default: 10.
    ///
    /// Must be from 1 to [`AttemptHistogram::MAX_BUCKETS`] (1024), and each bucket
    /// (`window / buckets`) at least [`AttemptHistogram::MIN_BUCKET_WIDTH`] (1 ms).
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.buckets = buckets;
        self
    }

    /// The clock the histogram reads. Default: [`TokioClock`], which follows tokio's paused
    /// time; [`CoarseClock`](overload_core::clock::CoarseClock) costs less per record.
    pub fn clock<C2: Clock>(self, clock: C2) -> AttemptHistogramBuilder<C2> {
        AttemptHistogramBuilder {
            window: self.window,
            buckets: self.buckets,
            clock,
        }
    }

    /// Builds the histogram; its first bucket starts at the clock's origin.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when `buckets` is not from 1 to 1024, `window`
    /// is zero or longer than 24 hours, or a bucket (`window / buckets`) is narrower than 1 ms.
    pub fn build(self) -> Result<AttemptHistogram<C>, ConfigError> {
        if self.buckets == 0 || self.buckets > AttemptHistogram::MAX_BUCKETS {
            return Err(ConfigError::out_of_range(
                "buckets",
                self.buckets,
                "within 1..=1024",
            ));
        }
        if self.window.is_zero() {
            return Err(ConfigError::out_of_range(
                "window",
                self.window,
                "more than zero",
            ));
        }
        if self.window > AttemptHistogram::MAX_WINDOW {
            return Err(ConfigError::out_of_range(
                "window",
                self.window,
                "at most 24h",
            ));
        }
        let width = self.window / self.buckets;
        if width < AttemptHistogram::MIN_BUCKET_WIDTH {
            return Err(ConfigError::conflict(
                "buckets",
                format_args!(
                    "window ({:?}) divided by buckets ({}) must be at least 1ms, got {width:?}",
                    self.window, self.buckets
                ),
            ));
        }
        let window = Window::<COUNTERS>::builder()
            .window(self.window)
            .slots(self.buckets)
            .clock(self.clock)
            .build()?;
        Ok(AttemptHistogram {
            window: Arc::new(window),
        })
    }
}

/// The counts of one window of an [`AttemptHistogram`].
///
/// ```
/// use overload_signal::{AttemptClass, AttemptHistogram};
/// use overload_signal::protocol::Attempt;
///
/// let h = AttemptHistogram::new();
/// for a in [Attempt::Number(0), Attempt::Number(5), Attempt::Unknown, Attempt::Malformed] {
///     h.record(a);
/// }
/// let s = h.snapshot();
/// assert_eq!(s.count(AttemptClass::Retry3OrMore), 1);
/// assert_eq!(s.count(AttemptClass::Malformed), 1);
/// assert_eq!(s.total(), 4);
/// assert_eq!(s.retries(), 1);
/// assert_eq!(s.retry_share(), Some(0.25));
/// // Nothing was answered with the stop signal: the pressure is the retry share.
/// assert_eq!(s.stopped(), 0);
/// assert_eq!(s.retry_pressure(), Some(0.25));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptSnapshot {
    counts: [u64; 6],
    stopped: u64,
}

impl AttemptSnapshot {
    /// A snapshot with these counts, indexed as [`AttemptClass::ALL`], and nothing
    /// [stopped](Self::stopped); for tests and for evaluating a [`StopRule`](crate::StopRule)
    /// on figures from elsewhere.
    pub const fn from_counts(counts: [u64; 6]) -> Self {
        Self { counts, stopped: 0 }
    }

    /// This snapshot with [`stopped`](Self::stopped) set to `stopped`.
    pub const fn with_stopped(mut self, stopped: u64) -> Self {
        self.stopped = stopped;
        self
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

    /// The requests of the window that were not known retries and that the
    /// [`OverloadSignalLayer`](crate::OverloadSignalLayer) answered with the stop signal
    /// because its rule fired: each stands for a retry the signal held back.
    ///
    /// Counted in the bucket of the answer, which is almost always the request's own.
    pub const fn stopped(&self) -> u64 {
        self.stopped
    }

    /// The share of the window's requests that were known retries **or** were told to stop
    /// retrying ([`stopped`](Self::stopped)), in `[0, 1]`; `None` when the window is empty.
    ///
    /// This is what a sustained [`StopRule`](crate::StopRule) judges: callers who obey the
    /// stop signal stop retrying, so their retries leave the window, but the answers that
    /// held those retries back take their place, and the share stays up for as long as the
    /// server keeps answering a large share of its traffic with the stop signal.
    pub fn retry_pressure(&self) -> Option<f64> {
        let total = self.total();
        let pressed = (self.retries() + self.stopped).min(total);
        // u64 -> f64 loses precision only above 2^53 requests, far beyond saturation.
        (total > 0).then(|| pressed as f64 / total as f64)
    }

    /// Sets the `metrics` gauges that describe this window (see the
    /// [crate docs](crate#metrics)): `overload_signal_window_requests` per `attempt` label,
    /// `overload_signal_window_retry_share` and `overload_signal_window_retry_pressure`.
    pub fn export_metrics(&self) {
        for class in AttemptClass::ALL {
            metrics::gauge!(crate::metric_names::WINDOW_REQUESTS, "attempt" => class.label())
                .set(self.count(class) as f64);
        }
        metrics::gauge!(crate::metric_names::WINDOW_RETRY_SHARE)
            .set(self.retry_share().unwrap_or(0.0));
        metrics::gauge!(crate::metric_names::WINDOW_RETRY_PRESSURE)
            .set(self.retry_pressure().unwrap_or(0.0));
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use overload_core::ConfigErrorKind;
    use overload_core::clock::FakeClock;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn h(window: u64, buckets: u32) -> (AttemptHistogram<FakeClock>, FakeClock) {
        let clock = FakeClock::new();
        let h = AttemptHistogram::builder()
            .window(secs(window))
            .buckets(buckets)
            .clock(clock.clone())
            .build()
            .unwrap();
        (h, clock)
    }

    fn record_n<C: Clock>(h: &AttemptHistogram<C>, attempt: Attempt, n: usize) {
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
    fn invalid_configurations_are_refused_by_name() {
        let cases = [
            (
                AttemptHistogram::builder().buckets(1025),
                "buckets",
                ConfigErrorKind::OutOfRange,
                "buckets must be within 1..=1024, got 1025",
            ),
            (
                AttemptHistogram::builder().buckets(0),
                "buckets",
                ConfigErrorKind::OutOfRange,
                "buckets must be within 1..=1024, got 0",
            ),
            (
                AttemptHistogram::builder()
                    .window(Duration::from_millis(10))
                    .buckets(11),
                "buckets",
                ConfigErrorKind::Conflict,
                "window (10ms) divided by buckets (11) must be at least 1ms, got 909.09µs",
            ),
            (
                AttemptHistogram::builder().window(Duration::ZERO),
                "window",
                ConfigErrorKind::OutOfRange,
                "window must be more than zero, got 0ns",
            ),
            (
                AttemptHistogram::builder().window(secs(24 * 3600 + 1)),
                "window",
                ConfigErrorKind::OutOfRange,
                "window must be at most 24h, got 86401s",
            ),
        ];
        for (builder, field, kind, message) in cases {
            let e = builder.build().unwrap_err();
            assert_eq!((e.field(), e.kind()), (field, kind));
            assert_eq!(e.to_string(), message);
        }
        let ok = |window, buckets| {
            AttemptHistogram::builder()
                .window(window)
                .buckets(buckets)
                .build()
                .is_ok()
        };
        assert!(ok(Duration::from_millis(10), 10));
        assert!(ok(secs(24 * 3600), 1024));
    }

    #[test]
    fn window_is_whole_buckets() {
        let h = AttemptHistogram::builder()
            .window(Duration::from_nanos(10_000_000_007))
            .buckets(10)
            .build()
            .unwrap();
        assert_eq!(h.bucket_width(), Duration::from_nanos(1_000_000_000));
        assert_eq!(h.window(), secs(10));
        let d = AttemptHistogram::new();
        assert_eq!(d.window(), secs(10));
        assert_eq!(d.bucket_width(), secs(1));
        assert_eq!(d.buckets(), 10);
        assert_eq!(
            format!("{d:?}"),
            "AttemptHistogram { window: 10s, buckets: 10, .. }"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn snapshot_math() {
        let h = AttemptHistogram::new();
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

    #[test]
    fn stopped_requests_count_as_pressure_in_their_bucket() {
        let (h, clock) = h(10, 10);
        record_n(&h, Attempt::Number(0), 8);
        record_n(&h, Attempt::Number(1), 2);
        h.record_stopped_in(h.bucket_now());
        h.record_stopped_in(h.bucket_now());
        let s = h.snapshot();
        assert_eq!((s.total(), s.retries(), s.stopped()), (10, 2, 2));
        assert_eq!(s.retry_share(), Some(0.2));
        assert_eq!(s.retry_pressure(), Some(0.4));
        assert_eq!(
            s,
            AttemptSnapshot::from_counts([8, 2, 0, 0, 0, 0]).with_stopped(2)
        );
        // They leave the window with their bucket.
        clock.advance(secs(10));
        assert_eq!(h.snapshot().stopped(), 0);
        assert_eq!(h.snapshot().retry_pressure(), None);
    }

    #[test]
    fn only_unknown_is_share_zero() {
        let (h, _) = h(10, 10);
        record_n(&h, Attempt::Unknown, 3);
        assert_eq!(h.snapshot().retry_share(), Some(0.0));
    }

    /// The default clock follows tokio's paused time.
    #[tokio::test(start_paused = true)]
    async fn window_slides_one_bucket_at_a_time_in_paused_time() {
        let h = AttemptHistogram::new();
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

    #[test]
    fn expired_bucket_is_reset_when_its_slot_is_reused() {
        let (h, clock) = h(4, 4);
        record_n(&h, Attempt::Number(2), 7);
        // Exactly one window later the same slot is reused: old counts must not leak in.
        clock.advance(secs(4));
        record_n(&h, Attempt::Number(2), 1);
        record_n(&h, Attempt::Number(0), 1);
        let s = h.snapshot();
        assert_eq!(s.count(AttemptClass::Retry2), 1);
        assert_eq!(s.total(), 2);
        // Many windows later, a slot whose counters were never rewritten is ignored too.
        clock.advance(secs(4 * 1000 + 1));
        assert_eq!(h.snapshot().total(), 0);
    }

    #[test]
    fn idle_gap_longer_than_window_empties_it() {
        let (h, clock) = h(10, 10);
        record_n(&h, Attempt::Number(1), 50);
        clock.advance(secs(3600));
        assert_eq!(h.snapshot().total(), 0);
        h.record(Attempt::Number(0));
        assert_eq!(h.snapshot().total(), 1);
        assert_eq!(h.snapshot().retries(), 0);
    }

    #[test]
    fn late_record_for_a_bucket_already_rolled_over_is_dropped() {
        let (h, clock) = h(2, 2);
        let then = h.bucket_now();
        clock.advance(secs(2));
        h.record(Attempt::Number(0)); // bucket 2 takes bucket 0's counters
        h.record_in(then, AttemptClass::Retry1); // bucket 0: left the window
        let s = h.snapshot();
        assert_eq!(s.total(), 1);
        assert_eq!(s.retries(), 0);
    }

    #[test]
    fn bucket_numbers_past_the_tag_wrap() {
        let (h, _) = h(10, 10);
        let near = (1u64 << 32) - 1;
        // Steady traffic up to the wrap.
        for bucket in near - 30..near {
            h.record_in(bucket, AttemptClass::First);
            h.record_in(bucket, AttemptClass::Retry1);
        }
        assert_eq!(h.snapshot_of(near - 1).total(), 20);
        h.record_in(near, AttemptClass::Retry1);
        h.record_in(near + 1, AttemptClass::First);
        let s = h.snapshot_of(near + 1);
        // Buckets near-8 ..= near-1 (2 each), near (1) and near+1 (1).
        assert_eq!(s.total(), 18);
        assert_eq!(s.retries(), 9);
        // Window near+1 ..= near+10: only near+1's request.
        assert_eq!(h.snapshot_of(near + 10).total(), 1);
        assert_eq!(h.snapshot_of(near + 11).total(), 0);
    }

    #[test]
    fn slot_idle_for_more_than_2_pow_31_buckets_is_reset_not_ignored() {
        // Regression: comparing tags on the bare wrapping circle judged such a slot "newer"
        // and dropped every record into it.
        let (h, _) = h(10, 10);
        let later = (1u64 << 31) + 10;
        h.record_in(later, AttemptClass::Retry1);
        let s = h.snapshot_of(later);
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
            let h = AttemptHistogram::builder()
                .window(Duration::from_millis(u64::from(slots) * 10))
                .buckets(slots)
                .clock(FakeClock::new())
                .build()
                .unwrap();
            let mut bucket = 0u64;
            let mut model: Vec<(u64, AttemptClass)> = Vec::new();
            for (gap, class) in events {
                // Mostly small steps, sometimes a jump past the window.
                bucket += if gap < 25 { gap / 5 } else { gap };
                let class = AttemptClass::ALL[class];
                h.record_in(bucket, class);
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
                        h.snapshot_of(at),
                        AttemptSnapshot::from_counts(expected)
                    );
                }
            }
        }
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        let (h, _) = h(10, 10);
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let h = h.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        h.record(Attempt::Number(t % 2));
                    }
                });
            }
        });
        let s = h.snapshot();
        assert_eq!(s.total(), 40_000);
        assert_eq!(s.retries(), 20_000);
    }

    #[test]
    fn concurrent_rollover_loses_nothing_in_the_new_bucket() {
        // Threads race to reset a slot from bucket 0 to bucket 10 (same slot): whoever
        // resets counts itself, the others increment; nothing is lost or double-reset.
        let (h, clock) = h(10, 10);
        for _ in 0..100 {
            h.record(Attempt::Number(0));
        }
        clock.advance(secs(16)); // bucket 16 reuses bucket 0's counters (a ring of 16)
        std::thread::scope(|s| {
            for _ in 0..4 {
                let h = h.clone();
                s.spawn(move || {
                    for _ in 0..5_000 {
                        h.record(Attempt::Number(0));
                    }
                });
            }
        });
        assert_eq!(h.snapshot().total(), 20_000);
    }
}
