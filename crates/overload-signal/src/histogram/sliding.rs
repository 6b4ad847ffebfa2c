//! The histogram itself and its builder: a [`Window`] of one counter per attempt class, and
//! one for the requests told to stop, per bucket.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::window::Window;

use super::attempts::AttemptClass;
use super::snapshot::AttemptSnapshot;
use crate::protocol::Attempt;

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
        AttemptSnapshot::from_counts(std::array::from_fn(|i| all[i])).with_stopped(all[STOPPED])
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
