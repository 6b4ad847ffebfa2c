//! Cheap server-side rejection above a rate, as a Tower layer.

mod algorithm;
mod clock;

pub use algorithm::{
    Decision, FixedWindow, FixedWindowState, InvalidLimit, Limiter, SlidingWindow,
    SlidingWindowState, TokenBucket, TokenBucketState,
};
pub use clock::{Clock, FakeClock, RealClock};
