//! Cheap server-side rejection above a rate, as a Tower layer.

mod algorithm;
mod clock;
mod config;
mod key;
mod keyed;
mod layer;

pub use algorithm::{
    Decision, FixedWindow, FixedWindowState, InvalidLimit, Limiter, SlidingWindow,
    SlidingWindowState, TokenBucket, TokenBucketState,
};
pub use clock::{Clock, FakeClock, RealClock};
pub use config::{Algorithm, DEFAULT_RATE, KeyBy, RateLimitConfig, UnknownName};
pub use key::{
    ClientIp, DEFAULT_IPV6_PREFIX, ForwardedHeader, InvalidIpNet, IpNet, MAX_HEADER_KEY_LEN,
    header_value,
};
pub use keyed::{DEFAULT_MAX_KEYS, DEFAULT_SWEEP_INTERVAL, KeyClass, KeyedLimiter};
pub use layer::{
    DEFAULT_POLICY_NAME, InvalidConfig, METRIC_ADMITTED, METRIC_KEYS, METRIC_REJECTED, RateLimit,
    RateLimitBuilder, RateLimitLayer, ResponseFuture,
};
