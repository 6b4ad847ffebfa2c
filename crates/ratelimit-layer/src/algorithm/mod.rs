//! The three rate-limiting algorithms, behind one trait.
//!
//! | algorithm | state per key | admits at most, in any interval of length `L` | notes |
//! |---|---|---|---|
//! | [`TokenBucket`] (GCRA) | one `AtomicU64`, lock-free | `L / T + B` units, `T` the emission interval, `B` the burst | smooth; no edge effect |
//! | [`FixedWindow`] | window number and count, under a per-key mutex | `2 * quota` units when `L` straddles a window edge | cheapest to explain; bursts at edges |
//! | [`SlidingWindow`] | window number and two counts, under a per-key mutex | about `quota` units per window | the paper's estimate, no stored timestamps |
//!
//! A limiter ([`Limiter`]) holds only configuration; the state it updates is a separate
//! value ([`Limiter::State`]), one per key, so one limiter serves a single global limit
//! and a keyed map alike. All of them take the time as nanoseconds from a
//! [`Clock`] and a cost (weight) per request: a heavier request takes more of the quota. A
//! cost of zero is always admitted and consumes nothing.
//!
//! Each algorithm takes what it cannot do without in `new` (the rate, or the quota) and
//! the rest through its builder; every invalid setting is a [`ConfigError`](crate::ConfigError)
//! naming it:
//!
//! ```
//! use std::time::Duration;
//! use ratelimit_layer::{FixedWindow, SlidingWindow, TokenBucket};
//!
//! // 100 per second, bursts of 100 (the defaults).
//! let bucket = TokenBucket::new(100)?;
//! // 100 per second, bursts of 20.
//! let bucket = TokenBucket::builder(100).burst(20).build()?;
//! // 600 per minute in a sliding window.
//! let sliding = SlidingWindow::builder(600).window(Duration::from_secs(60)).build()?;
//! // A zero burst is refused by name.
//! let err = TokenBucket::builder(100).burst(0).build().unwrap_err();
//! assert_eq!(err.to_string(), "burst must be at least 1, got 0");
//! # let _ = (bucket, sliding, FixedWindow::new(1)?);
//! # Ok::<(), ratelimit_layer::ConfigError>(())
//! ```
//!
//! [`Clock`]: crate::clock::Clock

mod fixed_window;
mod gcra;
mod limiter;
mod live;
mod live_window;
mod sliding_window;
mod validate;

pub use fixed_window::{FixedWindow, FixedWindowBuilder, FixedWindowState};
pub use gcra::{TokenBucket, TokenBucketBuilder, TokenBucketState};
pub use limiter::{Decision, Limiter, QuotaStatus};
pub use live::{HISTORY, LiveTokenBucket, LiveTokenBucketState, TokenBucketHandle, carry_over};
pub use live_window::{LiveWindow, WindowAlgorithm, WindowHandle};
#[cfg(feature = "redis")]
pub(crate) use sliding_window::SlidingWindowView;
pub use sliding_window::{SlidingWindow, SlidingWindowBuilder, SlidingWindowState};

#[cfg(test)]
mod shedding_tests;
