//! Limits per key (client IP, API key, ...) with bounded memory: [`KeyedLimiter`].
//!
//! [`RateLimitBuilder::key_by`](crate::RateLimitBuilder::key_by) builds one for a layer;
//! use it directly to limit something other than HTTP requests.

mod builder;
mod map;
mod network;
#[cfg(test)]
mod tests;

pub use builder::KeyedLimiterBuilder;
pub(crate) use builder::{DEFAULT_MAX_KEYS, DEFAULT_SWEEP_INTERVAL, check_settings};
pub use map::{KeyClass, KeyedLimiter};
#[cfg(feature = "redis")]
pub(crate) use network::network_of;
