//! One limit for a whole fleet, kept in Redis (feature `redis`).
//!
//! A local limit is set per process: with ten replicas behind a load balancer, ten local
//! buckets let ten times the intended rate through. Kept in Redis, one limit holds for every
//! process that shares it, with the same [`RateLimitLayer`](crate::RateLimitLayer), keys,
//! headers and metrics as a local one:
//!
//! ```no_run
//! use ratelimit_layer::redis::RedisStore;
//! use ratelimit_layer::{RateLimitLayer, TokenBucket};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), ratelimit_layer::ConfigError> {
//! // 300 requests per second (bursts of 30) for every process that uses this Redis,
//! // with the defaults: a 5 ms budget per decision, the whole limit locally when Redis is
//! // away.
//! let store = RedisStore::new("redis://127.0.0.1:6379")?;
//! let layer = RateLimitLayer::builder(TokenBucket::builder(300).burst(30).build()?)
//!     .redis(store)
//!     .build()?;
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! Customised: per client IP, a third of the limit per process while Redis is away (a
//! fleet of three), a 20 ms budget, and keys under `edge`:
//!
//! ```no_run
//! use std::time::Duration;
//! use ratelimit_layer::key::ClientIp;
//! use ratelimit_layer::redis::RedisStore;
//! use ratelimit_layer::{RateLimitLayer, SlidingWindow};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), ratelimit_layer::ConfigError> {
//! let store = RedisStore::new("redis://10.0.0.5:6379/2")?;
//! let layer = RateLimitLayer::builder(SlidingWindow::new(600)?)
//!     .key_by_client_ip(ClientIp::new())
//!     .name("api")
//!     .redis(store)
//!     .local_share(1.0 / 3.0)
//!     .budget(Duration::from_millis(20))
//!     .key_prefix("edge")
//!     .build()?;
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # How a decision is made
//!
//! Each decision is one atomic round trip: a Lua script, loaded once and then called by
//! its SHA-1 hash (`EVALSHA`; on `NOSCRIPT`, after Redis restarted or its scripts were
//! flushed, it is loaded again and the call repeated). The algorithms are the local ones,
//! computed in Redis on the Redis server's clock, so processes on hosts whose clocks
//! disagree still share one timeline:
//!
//! - [`TokenBucket`](crate::TokenBucket): GCRA on one string key holding the theoretical
//!   arrival time, in microseconds. The emission interval must be at least one microsecond
//!   (a million units per second of period).
//! - [`SlidingWindow`](crate::SlidingWindow): the paper's estimate on one hash key holding
//!   the window's number and the two counts. The window must be a whole number of
//!   microseconds, and `quota x window` in microseconds at most 2^53, so that the script's
//!   arithmetic (Lua's numbers are doubles) is exact.
//!
//! The fixed window is not offered: the sliding window costs the same round trip without
//! its edge bursts.
//!
//! Concurrent decisions share one connection per [`RedisStore`] and are pipelined on it
//! (redis-rs's multiplexed connection writes whatever is queued in one go), so a busy
//! process does not pay one connection, or one system call, per request.
//!
//! # Keys
//!
//! Keys are namespaced, `{prefix}:{name}:{algorithm}:` (the name is the layer's,
//! [`RateLimitBuilder::name`](crate::RateLimitBuilder::name)), followed by `g` for the global
//! limit, `u` for requests without a key, or `k:` and the key's bytes
//! ([`RedisKey`]; an IP address in its text form). They expire on their own once they hold
//! nothing a fresh key would not (a token bucket's key when its bucket is full again, a
//! sliding window's two windows after its last admission), so Redis memory is bounded by
//! the keys active within one burst or two windows.
//!
//! # When Redis is slow or away
//!
//! Redis is never a single point of failure. Each decision has a time budget (default
//! 5 ms, [`RedisLayerBuilder::budget`]); when Redis does
//! not answer within it, answers with an error, or cannot be reached, the request is decided
//! by a local limiter with a share of the limit
//! ([`local_share`](RedisLayerBuilder::local_share), default the whole limit). From then on
//! requests are decided locally at once, without waiting, and one request every
//! [`recheck_interval`](RedisLayerBuilder::recheck_interval) (default 500 ms) asks Redis
//! again; the first answer returns the limit to Redis. The connection reconnects by itself
//! in the background. A Redis failure is never an error response: the worst a client sees
//! is the local share's `429`.
//!
//! Redis away is an episode, logged once when it begins (`WARN`, "Redis cannot decide the
//! rate limit", with the reason and the error) and once when it ends (`INFO`, "Redis
//! answers again", with how long it was away), with the layer's name as the field `name`;
//! a request that falls back meanwhile is logged at `DEBUG` only. While no request asks
//! Redis (no traffic, or Redis away and no request's turn yet), the layer sends it a `PING`
//! every `recheck_interval` within the budget, so that Redis lost while the service is idle,
//! and Redis back while no request comes, are seen, logged and reported all the same.
//!
//! # Metrics
//!
//! Registered on the layer's first request, with the layer's name as the label `name`:
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_layer_redis_fallbacks_total` | counter | `name`, `reason` (`timeout`, `error`, `unavailable`) | requests decided locally instead of in Redis |
//! | `ratelimit_layer_redis_up` | gauge | `name` | 1 while decisions are made in Redis (Redis answers within the budget), 0 while they fall back; kept true without traffic by the `PING` above |
//!
//! The crate's other metrics (admitted, rejected, keys) count these requests as they count
//! local ones.
//!
//! # What a decision costs
//!
//! A round trip to Redis (tens of microseconds on the same host, see the workspace's
//! `BENCHMARKS.md`), plus what the client library allocates for a command and its reply.
//! This crate adds two allocations per decision: the boxed future of the round trip (the
//! client's requests borrow their connection, so an owned future has to be boxed) and the
//! boxed state holding the request while it waits (so that a local limit's response future
//! stays as small as it was). The key is written straight into the command's buffer, and
//! the script's constant arguments are formatted once, when the layer is built. Free
//! requests (cost 0) and requests above the limiter's capacity are decided without asking
//! Redis.
//!
//! Not done: a local reservation of tokens (taking a few at a time from Redis to save round
//! trips), which trades accuracy for fewer round trips; every decision asks Redis.

mod builder;
mod command;
mod connection;
mod decider;
mod key;
mod reserve;
mod script;
mod state;
mod store;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
#[cfg(test)]
mod tests;

pub use builder::RedisLayerBuilder;
pub use key::RedisKey;
pub use script::RedisAlgorithm;
pub use store::{RedisStore, RedisStoreBuilder, Unreachable};
