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
//! The histogram is a [`Window`](overload_core::window::Window) of counters per bucket (one
//! per class, and one for the requests told to stop retrying): recording
//! is one compare-and-swap on a counter of the recording thread's own stripe (so cores do not
//! contend on one word), which also resets a counter left over from an old bucket; there is no
//! lock, no background task, and no moment where a reset can lose a concurrent record. See
//! the [window's docs](overload_core::window) for the guarantees.
//!
//! Time is read from a [`Clock`](overload_core::clock::Clock),
//! [`TokioClock`](overload_core::clock::TokioClock) by default, so tests run under
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

mod attempts;
mod sliding;
mod snapshot;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(test)]
mod tests;

pub use attempts::AttemptClass;
pub use sliding::{AttemptHistogram, AttemptHistogramBuilder};
pub use snapshot::AttemptSnapshot;
pub(crate) use snapshot::AttemptWindowGauges;
