//! One limit for a whole fleet, kept in Redis (feature `redis`): one node, a Redis
//! Cluster, over TCP or TLS.
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
//! // away, no local reservation.
//! let store = RedisStore::new("redis://127.0.0.1:6379")?;
//! let layer = RateLimitLayer::builder(TokenBucket::builder(300).burst(30).build()?)
//!     .redis(store)
//!     .build()?;
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! Customised: a Redis Cluster, per client IP, a third of the limit per process while Redis
//! is away (a fleet of three), a 20 ms budget, keys under `edge`; and a global limit on a
//! managed Redis over TLS with a local reservation of up to 20 units per round trip:
//!
//! ```no_run
//! use std::time::Duration;
//! use ratelimit_layer::key::ClientIp;
//! use ratelimit_layer::redis::RedisStore;
//! use ratelimit_layer::{RateLimitLayer, SlidingWindow, TokenBucket};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = RedisStore::cluster(["redis://10.0.0.5:6379", "redis://10.0.0.6:6379"])?;
//! let per_client = RateLimitLayer::builder(SlidingWindow::new(600)?)
//!     .key_by_client_ip(ClientIp::new())
//!     .name("api")
//!     .redis(cluster)
//!     .local_share(1.0 / 3.0)
//!     .budget(Duration::from_millis(20))
//!     .key_prefix("edge")
//!     .build()?;
//! let managed = RedisStore::builder("rediss://:secret@redis.example.com:6380")
//!     .ca_certificate(std::fs::read("/etc/redis-tls/ca.pem")?)
//!     .build()?;
//! let global = RateLimitLayer::builder(TokenBucket::builder(20_000).burst(2_000).build()?)
//!     .name("global")
//!     .redis(managed)
//!     .reservation(20)
//!     .build()?;
//! # let _ = (per_client, global);
//! # Ok(())
//! # }
//! ```
//!
//! # Which Redis
//!
//! - **One node**: `redis://[user:password@]host[:port][/db]`, or `redis+unix:///path`.
//! - **A Redis Cluster** ([`RedisStore::cluster`]): its seed nodes; the store reads the slot
//!   map, sends each decision to the node that holds its key (each decision touches one key,
//!   so one slot), follows `MOVED` and `ASK`, and reads the slot map again when a master is
//!   lost and a replica promoted. Tested with 3 masters and a replica each: a master killed
//!   under load, each process fell back for 2 to 3 s (back within 0.3 s of the replica
//!   being promoted, within one response timeout when the Cluster client had stopped
//!   answering), then shared the limit again; the bound is under [When Redis is slow, away,
//!   or silent](#when-redis-is-slow-away-or-silent).
//! - **TLS**: `rediss://`, verified against the system's roots or a CA you give
//!   ([`RedisStoreBuilder::ca_certificate`]), with a client certificate
//!   ([`RedisStoreBuilder::client_certificate`]) where the service asks for one. Checks
//!   cannot be turned off. For a Cluster, every seed `rediss://`. rustls with the process's
//!   default crypto provider: install yours at start; if there is none at the first
//!   connection, ring's is installed (see [`RedisStoreBuilder::build`]).
//! - **Sentinel is not supported**: redis-rs (this crate's client) resolves the master
//!   through the Sentinels once per client, and its connections keep talking to the old
//!   master after a failover; following `+switch-master` would be a client of this crate's
//!   own. Behind one address that follows the master (a managed service's primary endpoint,
//!   a proxy that checks `role:master`), a failover is followed: a connection that reaches
//!   the old master, now a replica answering `READONLY`, is replaced by a new one.
//!
//! Redis 5.0 or later (6.0 for TLS): the scripts write after reading the server's `TIME`,
//! which Redis allows by default from 5.0 (script effects replication). Tested with Redis
//! 7.0. The **`maxmemory-policy` must not evict these keys**: `allkeys-*` evicts any key,
//! and every `volatile-*` policy evicts keys with a time to live, which every key of this
//! crate has (`volatile-ttl` takes the shortest first: these); an evicted key is a fresh
//! bucket, so a client gets its limit again. Keep `noeviction` (Redis's default: at full
//! memory a write fails, and the layer falls back), or a Redis (or database, with a policy
//! of its own) for the limits.
//!
//! # How a decision is made
//!
//! Each decision is one atomic round trip: a Lua script called by its SHA-1 hash
//! (`EVALSHA`; on `NOSCRIPT`, after Redis restarted or its scripts were flushed, or on a
//! Cluster node that never ran it, the same call is sent as `EVAL` with the code, which goes
//! where the key goes and caches it there). The algorithms are the local ones, computed in
//! Redis on the Redis server's clock, so processes on hosts whose clocks disagree still
//! share one timeline:
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
//! its edge bursts. Nor, yet, are the live limiters of [limits changed while
//! serving](crate#limits-changed-while-serving): a limit kept in Redis keeps the rate it was
//! built with.
//!
//! **The server's clock going back** (a step, or a failover to a replica whose clock is
//! behind) does not reject for the length of the step: a token bucket whose arrival time
//! lies further ahead than its tolerance allows is taken as just emptied, and rejects for
//! at most one emission interval; a sliding window whose stored window is ahead counts in
//! it as the current one, and rejects for at most a window. A clock stepping forward
//! refills buckets at once, as locally.
//!
//! Concurrent decisions share one connection per node and are pipelined on it
//! (redis-rs's multiplexed connection writes whatever is queued in one go), so a busy
//! process does not pay one connection, or one system call, per request.
//!
//! # Keys
//!
//! Keys are namespaced, `{prefix}:{name}:{algorithm}:` (the name is the layer's,
//! [`RateLimitBuilder::name`](crate::RateLimitBuilder::name)), followed by `g` for the global
//! limit, `u` for requests without a key, `o:` and a network's name or `o` for the overflow
//! limits below, or `k:` and the key's name. They expire on their own once they hold
//! nothing a fresh key would not (a token bucket's key when its bucket is full again, a
//! sliding window's two windows after its last admission).
//!
//! **A client cannot choose its Cluster slot.** A key's name is not the client's key but a
//! keyed hash of it under the fleet's secret: HMAC-SHA-256 of the key's bytes
//! ([`RedisKey`]; an IP address in its text form), its first 128 bits in 32 hex digits. A
//! Cluster puts a key in slot `CRC16(key) mod 16384`; CRC16 is public, so with the client's
//! bytes in the name a client that chooses its key (a header) could compute, offline, keys
//! that all land on one slot, and so one master (tested: 60 keys aimed at one slot under
//! that scheme spread 20, 19 and 21 over three masters now). Without the secret it cannot.
//! Hex digits hold no `{` or `}`, and the prefix and the layer's name are checked for them
//! (and for spaces; the name for `:` too) when the layer is built, so no part of a key is a
//! hash tag. The secret is [`RedisLayerBuilder::key_secret`], or by default one kept in Redis
//! under `{prefix}:secret`, made once by the first process that needs it (`SET NX`) and read
//! by every other: every process of a fleet names a key alike, and one that finds another
//! secret there takes it and says so at `WARN` (see
//! [`key_secret`](RedisLayerBuilder::key_secret)). What does not hold: a client still
//! chooses how many keys it makes (the cap below bounds them), and someone who can read the
//! secret (from Redis, or the configuration) can aim keys at a slot again.
//!
//! **A cap on new keys** ([`RedisLayerBuilder::max_new_keys`], default 1 000 a second per
//! process): a keyed request whose key Redis does not hold makes it only while the process
//! has made fewer than that many this second (a token bucket of that rate and burst);
//! otherwise it is decided against the overflow limit of its client's network (the same
//! rate; counted with `key_class="overflow"`), as the local map does at its cap, and the
//! first such request of an episode is logged at `WARN`. Keys Redis holds keep their own
//! limits.
//!
//! **Fair admission past the cap.** A client's network is its address (the key extractor's
//! [`client_addr`](crate::key::KeyExtractor::client_addr): the address
//! [`ClientIp`](crate::key::ClientIp) keys by, or the client address the server resolved)
//! taken at IPv4 `/24` or IPv6 `/48`; requests without an address are one network. Each
//! network has an overflow limit of its own (`o:` and the network's name under the
//! secret), so a network that mints keys (an IPv6 `/48` holds 65 536 `/64` keys) spends the
//! cap and its own overflow limit, and a new client of another network is admitted at a
//! key's quota of its own (tested: 2 000 new `/64` keys a second from one `/48` against a
//! cap of 100 a second, and one new client of another network admitted at its full burst).
//! This is the local map's rule. A process makes networks' overflow keys at most
//! `max_new_keys` a second too; past that, new keys of further networks share one last
//! overflow limit (`o`): a client holding thousands of networks at once (an IPv6 `/32`)
//! can still push new clients of networks it has not reached into one key's quota. Two new
//! clients of one network past the cap share that network's quota.
//!
//! So a flood of made-up keys (a client inventing a header value per request) holds at
//! most `processes x max_new_keys x (1 s + a key's life)` keys in Redis, and as many
//! networks' overflow keys, a key's life being one emission interval per unit taken for a
//! token bucket and two windows for a sliding window: for three processes and a sliding
//! window of a second, 9 000 keys, about 2.2 MB at the 247 bytes a key took in Redis 7.0
//! (measured: 3 000 made-up keys in 1.4 s with a cap of 200 a second left 481 keys, the
//! bound being 482). Without the cap, every made-up key was a key. **Key by a header only
//! after authenticating it** (a layer that checks an API key before this one): an
//! unauthenticated header lets one client spread its requests over as many limits as it
//! invents, up to the cap.
//!
//! # When Redis is slow, away, or silent
//!
//! Redis is never a single point of failure. Each decision has a time budget (default
//! 5 ms, [`RedisLayerBuilder::budget`]); when Redis does not answer within it, answers with
//! an error, or cannot be reached, the request is decided by a local limiter with a share
//! of the limit ([`local_share`](RedisLayerBuilder::local_share), default the whole limit).
//! A Redis failure is never an error response: the worst a client sees is the local
//! share's `429`.
//!
//! **Redis is turned away by failures in a row, not by one**
//! ([`AWAY_AFTER_FAILURES`](RedisLayerBuilder::AWAY_AFTER_FAILURES): 3). A failure is a
//! decision Redis did not answer within its budget, or answered with an error; "in a row"
//! is since the last decision Redis answered in time, each failure counted having started
//! after the one counted before it, so that the decisions in flight together when Redis
//! stalls count as one. One failure is not enough: a decision over budget now and then (a
//! Redis in another zone whose 99.9th percentile passes 5 ms, a pause of the client) would
//! otherwise send the process to its local share for a recheck interval, and a fleet at
//! the default share would admit up to `n` times its limit then, exactly when load is
//! highest. A Redis that stops answering costs the requests meanwhile their budget, until
//! three in a row have failed: 15 ms with the defaults, once per outage.
//!
//! From then on every request is decided locally at once, without waiting, and the layer
//! probes Redis every [`recheck_interval`](RedisLayerBuilder::recheck_interval) (default
//! 500 ms) in the background, about the key whose decision failed (`EXISTS`, which a Cluster
//! sends to that key's node) or with `PING`; **the first answer within the store's
//! [`response_timeout`](RedisStoreBuilder::response_timeout)** (default 1 s) returns the
//! limit to Redis, whose decisions then say again whether it answers within the budget (a
//! Redis that answers, but always later than the budget, is back for three decisions every
//! recheck interval).
//!
//! - **A connection that goes silent without closing** (a failover that moved the address,
//!   a firewall or a proxy that drops the flow, a frozen host): a decision cannot tell,
//!   since it gives up after its budget; the probe waits the response timeout and, left
//!   unanswered, replaces the connection and asks the new one at once. Once the path is
//!   back, decisions are back on Redis within `recheck_interval + response_timeout +
//!   connect_timeout`: **2.5 s with the defaults** (measured 0.5 s through a black-holing
//!   proxy of the tests' own). The kernel watches too: TCP keepalive (10 s idle, a probe
//!   every 5 s, 3 unanswered) and on Linux `TCP_USER_TIMEOUT` (10 s) drop a connection whose
//!   packets vanish.
//! - **A Cluster failover** (a master lost, its replica promoted): the Cluster takes about
//!   twice its `cluster-node-timeout` to promote the replica (15 s is Redis's default;
//!   2 to 2.7 s with 1 s in the tests), and the lost master's keys fall back meanwhile. Once
//!   the Cluster serves the key's slot again, a process is back on Redis within
//!   `recheck_interval + 3 × response_timeout`: **3.5 s with the defaults** (typically one
//!   response timeout). That holds even when redis-rs's Cluster client has stopped
//!   answering for good, which redis-rs 1.2's can under a failover (its task waits for a
//!   lock that a request it no longer polls holds): a probe left unanswered for the
//!   response timeout, by its own timer or by the client's, replaces the client with one
//!   made from the seeds and every node the Cluster named (each connection asks `CLUSTER
//!   SLOTS` once made), and asks the new one at once. The bound assumes the new client
//!   reaches the Cluster within the response timeout: a lost node whose address is silent
//!   (a host gone, rather than a process) costs it up to
//!   [`connect_timeout`](RedisStoreBuilder::connect_timeout), and a probe more.
//! - **A failure that comes late** does not undo a return: the health has a generation per
//!   change, and a request that started before Redis came back (and times out after)
//!   leaves it up.
//! - **A decision that timed out may still be applied**: Redis takes its unit when it reads
//!   the command, after the layer decided the request locally. Only decisions in flight
//!   before Redis was turned away can (none is sent while it is away), each is one `timeout`
//!   (or `error`) fallback, and each only takes units from the fleet's limit: the drift is
//!   at most those counters times the cost, and never admits beyond the limit. A batch of
//!   the reservation that comes late is kept if it comes within a lease, and lost
//!   otherwise: the fleet admits less for it, never more.
//! - **Across runtimes**: the recheck runs on the runtime of the request that started it,
//!   and is started again by the next request on another runtime once that one has shut
//!   down (a client kept in a `static`, a runtime per call); so is a probe whose runtime
//!   dropped it.
//!
//! Redis away is an episode, logged once when it begins (`WARN`, "Redis cannot decide the
//! rate limit", with the reason and the error) and once when it ends (`INFO`, "Redis
//! answers again", with how long it was away), with the layer's name as the field `name`;
//! a request that falls back meanwhile is logged at `DEBUG` only, as is a failure that
//! does not turn Redis away. While no request asks Redis, the layer checks it every
//! `recheck_interval` too, so that Redis lost while the service is idle (one probe without
//! an answer within the response timeout turns it away), and Redis back while no request
//! comes, are seen, logged and reported.
//!
//! # Local speed: the reservation
//!
//! Every decision in Redis costs a round trip and the work of the script on the Redis
//! host; measured on one 2-core machine, the full stack served 0.55 to 0.66 of its local
//! throughput that way. [`RedisLayerBuilder::reservation`] (opt-in, global limits) makes a
//! process take up to that many units at a time from Redis and spend them without a round
//! trip within a lease ([`reservation_lease`](RedisLayerBuilder::reservation_lease),
//! default 100 ms after the last batch came; what is left then is dropped). What Redis
//! rejected is rejected locally until its `Retry-After` is over, once the units the
//! process holds are spent, nothing giving units back before.
//!
//! - **Batches are asked for ahead**: when half of a batch is left, the request that sees
//!   it starts the next round trip, in a task of its own, so that requests do not wait
//!   for it. **Choose `reservation` at least twice what a process spends in a round trip
//!   to Redis** (its rate times the round trip), with room for a slow one: requests then
//!   never wait. The first batch is the whole reservation; a batch then doubles when it was
//!   spent within its lease and halves when units were left at its end.
//! - **Requests that find too few units wait for the batch** under way (one round trip at
//!   a time, never one per request), each within its own budget; the next batch covers
//!   twice the units of the requests that waited for the last. A request whose budget ends
//!   while it waits is decided locally (a `timeout` fallback), and **counts no failure**:
//!   whether Redis answers in time is for the batch's own round trip to say, which has a
//!   whole budget. A batch asked for ahead counts no failure either (no request waits for
//!   it); one that requests wait for does.
//!
//! The trade-off, as a figure: every unit spent was taken from Redis first, so over time the
//! fleet admits no more than the limit, but a unit may be spent up to a lease after the
//! last batch came, and a process never holds more than `reservation` units (what a batch
//! brings beyond is dropped): **in any window, the fleet admits at most `processes x
//! reservation` units more than the limit alone would** (measured before batches were
//! asked for ahead: three processes, 10 units each, 300 per second with bursts of 30 under
//! three times that load: 326 in the busiest second, the bound being 360). With a limit
//! nobody reaches and batches of 1 000, the full stack served 0.93 to 1.18 of its local
//! throughput (the machine loaded), with about 200 round trips for 200 000 requests (also
//! measured before; asked for at half a batch, they are about twice as many). Through a
//! Redis 3 ms away (the tests' proxy), with the default budget and a reservation of 2 000,
//! 64 requests in flight (about 28 000 a second, 280 round trips in 10 s) fell back never
//! after the first second in ten runs of 10 s on a 2-core machine shared with other
//! builds, and once in the first (the crate's `redis_load` test); without the reservation,
//! 2 to 4 % of them timed out, Redis staying up. The `RateLimit` field of a request decided
//! locally reports what Redis had left at the last batch, plus the units the process still
//! holds.
//!
//! # Metrics
//!
//! Registered on the layer's first request, with the layer's name as the label `name`:
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_layer_redis_fallbacks_total` | counter | `name`, `reason` (`timeout`, `error`, `unavailable`) | requests decided locally instead of in Redis |
//! | `ratelimit_layer_redis_up` | gauge | `name` | 1 while decisions are made in Redis, 0 while they fall back; kept true without traffic by the probe above |
//!
//! The crate's other metrics (admitted, rejected, keys) count these requests as they count
//! local ones; requests over the cap on new keys are rejected with `key_class="overflow"`.
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
//! requests (cost 0), requests above the limiter's capacity, and requests the reservation
//! decides are decided without asking Redis, and allocate nothing more than a local limit.

mod builder;
mod command;
mod connection;
mod decider;
mod key;
mod reserve;
mod script;
mod secret;
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

#[cfg(test)]
mod shedding_tests;
