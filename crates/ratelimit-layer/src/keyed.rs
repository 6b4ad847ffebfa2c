//! Limits per key (client IP, API key, ...) with bounded memory: [`KeyedLimiter`].
//!
//! [`RateLimitBuilder::key_by`](crate::RateLimitBuilder::key_by) builds one for a layer;
//! use it directly to limit something other than HTTP requests.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use hashbrown::HashTable;
use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock, saturating_nanos};

use crate::algorithm::{Decision, Limiter, QuotaStatus};
use crate::metric_names;

/// The default cap on tracked keys; see
/// [`RateLimitLayer::DEFAULT_MAX_KEYS`](crate::RateLimitLayer::DEFAULT_MAX_KEYS).
pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;

/// The default interval between sweeps; see
/// [`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`](crate::RateLimitLayer::DEFAULT_SWEEP_INTERVAL).
pub(crate) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Fewest keys a shard is made to hold (unless `max_keys` itself is smaller).
const MIN_SHARD_CAP: usize = 256;

/// Which kind of limit a request was checked against; also the `key_class` label of the
/// rejection metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyClass {
    /// The one limit of a layer without keys.
    Global,
    /// The request's own key.
    Keyed,
    /// The shared overflow limit of keys that arrived while the map was at its cap.
    Overflow,
    /// The shared limit of requests from which no key could be extracted.
    Unkeyed,
}

impl KeyClass {
    /// The label value: `global`, `keyed`, `overflow` or `unkeyed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Global => "global",
            Self::Keyed => "keyed",
            Self::Overflow => "overflow",
            Self::Unkeyed => "unkeyed",
        }
    }
}

/// One limiter applied per key, in a sharded map whose memory is bounded.
///
/// # How keys are stored
///
/// Keys live in a fixed number of shards (a power of two, four per available CPU, at most
/// 256, and few enough that each holds at least 256 keys), each a hash table behind a
/// reader-writer lock. A key is hashed once, with std's DoS-resistant `RandomState` (peers
/// choose the keys), which both picks the shard and finds the entry. A request for a known
/// key takes the shard's *read* lock only: the per-key state is updated in place
/// (atomically for the token bucket), so requests for different keys, or for the same hot
/// key, do not serialise on a writer. A known key is looked up by reference (`&[u8]` for a
/// `Box<[u8]>` key), so checking it allocates nothing.
///
/// # Bounded memory
///
/// - **Idle eviction, lossless.** A key whose state equals a fresh one
///   ([`Limiter::is_idle`]: a full bucket, or windows that have passed) is removed by a sweep
///   of its shard, which runs when a new key arrives in that shard and the sweep interval
///   has passed. Forgetting such a key changes no decision.
/// - **A hard cap.** Each shard holds at most `ceil(max_keys / shards)` keys. **At the cap**
///   (after a due sweep, if any), a new key is *not* stored: its request is checked against
///   one shared *overflow* state with the same limit, [`KeyClass::Overflow`]. So a flood of
///   distinct keys cannot grow memory; the flood as a whole gets one key's quota; keys
///   already tracked keep their own limits. Once sweeps free room, new keys are tracked
///   again. Because the cap is per shard, a few new keys may go to the overflow state
///   shortly before `max_keys` keys are tracked in total (shards fill unevenly).
///
/// The map's heap use is at most [`memory_bound`](Self::memory_bound) bytes, plus whatever
/// heap the keys themselves own (none for IP addresses).
///
/// # Examples
///
/// ```
/// use std::net::IpAddr;
/// use ratelimit_layer::TokenBucket;
/// use ratelimit_layer::keyed::{KeyClass, KeyedLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelimit_layer::ConfigError> {
/// // The defaults: at most 100 000 keys, idle keys swept every second, tokio's clock.
/// let keyed: KeyedLimiter<_, IpAddr> = KeyedLimiter::new(TokenBucket::new(1)?);
/// let client: IpAddr = "192.0.2.1".parse().unwrap();
/// assert_eq!(keyed.check(&client, 1).1, KeyClass::Keyed);
/// assert!(!keyed.check(&client, 1).0.is_allowed());
///
/// // Customised: a smaller cap, reported as the `ratelimit_layer_keys` gauge.
/// let keyed: KeyedLimiter<_, IpAddr> = KeyedLimiter::builder(TokenBucket::new(1)?)
///     .max_keys(10_000)
///     .report_keys("edge")
///     .build()?;
/// # let _ = keyed;
/// # Ok(())
/// # }
/// ```
pub struct KeyedLimiter<L: Limiter, K, C = TokioClock> {
    limiter: L,
    clock: C,
    hasher: RandomState,
    shards: Box<[Shard<K, L::State>]>,
    shard_mask: usize,
    shard_cap: usize,
    sweep_interval: u64,
    len: AtomicUsize,
    overflow: L::State,
    keys_gauge: Option<LazyGauge>,
}

/// The keys gauge, registered with the metrics recorder on its first change, so that a
/// recorder installed after the limiter was built still receives it.
struct LazyGauge {
    policy: String,
    gauge: OnceLock<metrics::Gauge>,
}

impl LazyGauge {
    fn set(&self, keys: usize) {
        #[allow(clippy::cast_precision_loss)]
        self.gauge
            .get_or_init(|| metrics::gauge!(metric_names::KEYS, "policy" => self.policy.clone()))
            .set(keys as f64);
    }
}

/// One shard, on its own cache lines so that two shards' locks never share one.
#[repr(align(128))]
struct Shard<K, S> {
    table: RwLock<ShardTable<K, S>>,
}

struct ShardTable<K, S> {
    entries: HashTable<(K, S)>,
    /// Clock time (nanoseconds) after which the next new key sweeps idle entries.
    next_sweep: u64,
}

impl<L: Limiter, K: Hash + Eq> KeyedLimiter<L, K, TokioClock> {
    /// A keyed limiter with the defaults: at most 100 000 keys
    /// ([`RateLimitLayer::DEFAULT_MAX_KEYS`](crate::RateLimitLayer::DEFAULT_MAX_KEYS)), idle
    /// keys swept at most once a second per shard
    /// ([`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`](crate::RateLimitLayer::DEFAULT_SWEEP_INTERVAL)),
    /// time from [`TokioClock`], no keys gauge.
    ///
    /// [`TokioClock`]: https://docs.rs/overload-signal/0.1/overload_signal/clock/struct.TokioClock.html
    pub fn new(limiter: L) -> Self {
        Self::assemble(
            limiter,
            TokioClock::new(),
            DEFAULT_MAX_KEYS,
            saturating_nanos(DEFAULT_SWEEP_INTERVAL),
            None,
        )
    }

    /// A builder starting from the defaults of [`new`](Self::new).
    pub fn builder(limiter: L) -> KeyedLimiterBuilder<L, K> {
        KeyedLimiterBuilder {
            limiter,
            clock: TokioClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            report_keys: None,
            key: PhantomData,
        }
    }
}

/// Builds a [`KeyedLimiter`]; from [`KeyedLimiter::builder`].
#[must_use]
pub struct KeyedLimiterBuilder<L, K, C = TokioClock> {
    limiter: L,
    clock: C,
    max_keys: usize,
    sweep_interval: Duration,
    report_keys: Option<String>,
    key: PhantomData<fn() -> K>,
}

impl<L: Limiter, K: Hash + Eq, C: Clock> KeyedLimiterBuilder<L, K, C> {
    /// Where the limiter reads the time. Default: [`TokioClock`], which follows tokio's
    /// paused time in tests.
    ///
    /// [`TokioClock`]: https://docs.rs/overload-signal/0.1/overload_signal/clock/struct.TokioClock.html
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedLimiterBuilder<L, K, C2> {
        KeyedLimiterBuilder {
            limiter: self.limiter,
            clock,
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            report_keys: self.report_keys,
            key: PhantomData,
        }
    }

    /// The cap on tracked keys (rounded up to a multiple of the shard count); see
    /// [`KeyedLimiter`] for what happens at the cap. Default: 100 000
    /// ([`RateLimitLayer::DEFAULT_MAX_KEYS`](crate::RateLimitLayer::DEFAULT_MAX_KEYS)).
    pub const fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The interval between sweeps of idle keys in a shard. Default: one second
    /// ([`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`](crate::RateLimitLayer::DEFAULT_SWEEP_INTERVAL)).
    pub const fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Reports the number of tracked keys as the gauge `ratelimit_layer_keys`
    /// ([`metric_names::KEYS`]) with label `policy`, registered with the `metrics` recorder
    /// when the count first changes. Default: not reported.
    pub fn report_keys(mut self, policy: &str) -> Self {
        self.report_keys = Some(policy.to_owned());
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of kind `OutOfRange` when `max_keys` or `sweep_interval` is zero.
    pub fn build(self) -> Result<KeyedLimiter<L, K, C>, ConfigError> {
        check_settings(self.max_keys, self.sweep_interval)?;
        Ok(KeyedLimiter::assemble(
            self.limiter,
            self.clock,
            self.max_keys,
            saturating_nanos(self.sweep_interval),
            self.report_keys,
        ))
    }
}

/// The rules of [`KeyedLimiterBuilder::build`], shared with the layer's builder.
pub(crate) fn check_settings(max_keys: usize, sweep_interval: Duration) -> Result<(), ConfigError> {
    if max_keys == 0 {
        return Err(ConfigError::out_of_range("max_keys", 0, "at least 1"));
    }
    if sweep_interval.is_zero() {
        // NOTE: a zero interval would sweep a whole shard for every new key: a flood of
        // distinct keys would cost O(cap) per request.
        return Err(ConfigError::out_of_range(
            "sweep_interval",
            sweep_interval,
            "greater than zero",
        ));
    }
    Ok(())
}

impl<L: Limiter + fmt::Debug, K, C: fmt::Debug> fmt::Debug for KeyedLimiterBuilder<L, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiterBuilder")
            .field("limiter", &self.limiter)
            .field("clock", &self.clock)
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .field("report_keys", &self.report_keys)
            .finish()
    }
}

impl<L: Limiter, K: Hash + Eq, C: Clock> KeyedLimiter<L, K, C> {
    /// `max_keys` at least one, `sweep_interval` in nanoseconds and above zero.
    fn assemble(
        limiter: L,
        clock: C,
        max_keys: usize,
        sweep_interval: u64,
        report_keys: Option<String>,
    ) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        // NOTE: a power of two, so that a mask picks the shard. The cap is enforced per shard,
        // so each shard must hold enough keys (256) for hashing to spread them evenly.
        let per_shard_floor = (max_keys / MIN_SHARD_CAP).max(1);
        let largest_pow2_under_max = 1usize << (usize::BITS - 1 - per_shard_floor.leading_zeros());
        let shards = (cpus * 4)
            .next_power_of_two()
            .clamp(1, 256)
            .min(largest_pow2_under_max);
        let shard_cap = max_keys.div_ceil(shards);
        Self {
            limiter,
            clock,
            hasher: RandomState::new(),
            shards: (0..shards)
                .map(|_| Shard {
                    table: RwLock::new(ShardTable {
                        entries: HashTable::new(),
                        next_sweep: 0,
                    }),
                })
                .collect(),
            shard_mask: shards - 1,
            shard_cap,
            sweep_interval,
            len: AtomicUsize::new(0),
            overflow: L::State::default(),
            keys_gauge: report_keys.map(|policy| LazyGauge {
                policy,
                gauge: OnceLock::new(),
            }),
        }
    }

    fn report(&self, keys: usize) {
        if let Some(gauge) = &self.keys_gauge {
            gauge.set(keys);
        }
    }

    /// The limiter applied to each key.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The cap on tracked keys, rounded up to a multiple of the shard count.
    pub fn max_keys(&self) -> usize {
        self.shard_cap * self.shards.len()
    }

    /// The number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides a request of `cost` units for `key`, now.
    ///
    /// A known key takes its shard's read lock only. A new key is stored (under the write
    /// lock) unless the request leaves its state idle (a free or over-capacity request) or
    /// the shard is at its cap, in which case the shared overflow state decides.
    #[inline]
    pub fn check<Q>(&self, key: &Q, cost: u32) -> (Decision, KeyClass)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned,
        Q::Owned: Into<K>,
    {
        let (decision, _, class) = self.check_inner(key, cost, false, false);
        (decision, class)
    }

    /// As [`check`](Self::check), and also reads the key's [`QuotaStatus`] right after the
    /// decision (under the same lock) when the request is rejected, or admitted and
    /// `on_allow` is set: what a response's `RateLimit` field reports.
    #[inline]
    pub fn check_with_status<Q>(
        &self,
        key: &Q,
        cost: u32,
        on_allow: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned,
        Q::Owned: Into<K>,
    {
        self.check_inner(key, cost, on_allow, true)
    }

    #[inline]
    fn decide(
        &self,
        state: &L::State,
        now: u64,
        cost: u32,
        on_allow: bool,
        on_reject: bool,
    ) -> (Decision, Option<QuotaStatus>) {
        let decision = self.limiter.check(state, now, cost);
        let want = if decision.is_allowed() {
            on_allow
        } else {
            on_reject
        };
        (decision, want.then(|| self.limiter.status(state, now)))
    }

    #[inline]
    fn check_inner<Q>(
        &self,
        key: &Q,
        cost: u32,
        on_allow: bool,
        on_reject: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned,
        Q::Owned: Into<K>,
    {
        let now = self.clock.now();
        let hash = self.hasher.hash_one(key);
        // NOTE: hashbrown indexes buckets with the low bits and tags them with the top 7;
        // the shard comes from the middle bits so the three stay independent.
        let shard = &self.shards[(hash >> 32) as usize & self.shard_mask];
        {
            let table = shard.table.read().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, state)) = table.entries.find(hash, |(k, _)| k.borrow() == key) {
                let (decision, status) = self.decide(state, now, cost, on_allow, on_reject);
                return (decision, status, KeyClass::Keyed);
            }
        }
        self.check_new(shard, hash, key, now, cost, on_allow, on_reject)
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn check_new<Q>(
        &self,
        shard: &Shard<K, L::State>,
        hash: u64,
        key: &Q,
        now: u64,
        cost: u32,
        on_allow: bool,
        on_reject: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned,
        Q::Owned: Into<K>,
    {
        let mut table = shard.table.write().unwrap_or_else(PoisonError::into_inner);
        // Another request may have inserted the key between the two locks.
        if let Some((_, state)) = table.entries.find(hash, |(k, _)| k.borrow() == key) {
            let (decision, status) = self.decide(state, now, cost, on_allow, on_reject);
            return (decision, status, KeyClass::Keyed);
        }
        if now >= table.next_sweep {
            table.next_sweep = now.saturating_add(self.sweep_interval);
            self.sweep(&mut table, now);
        }
        if table.entries.len() >= self.shard_cap {
            tracing::debug!(
                shard_cap = self.shard_cap,
                "rate limit key map shard is full; checking a new key against the overflow limit"
            );
            let (decision, status) = self.decide(&self.overflow, now, cost, on_allow, on_reject);
            return (decision, status, KeyClass::Overflow);
        }
        let state = L::State::default();
        let (decision, status) = self.decide(&state, now, cost, on_allow, on_reject);
        if !self.limiter.is_idle(&state, now) {
            let hasher = &self.hasher;
            table
                .entries
                .insert_unique(hash, (key.to_owned().into(), state), |(k, _)| {
                    hasher.hash_one(k)
                });
            let len = self.len.fetch_add(1, Ordering::Relaxed) + 1;
            self.report(len);
        }
        (decision, status, KeyClass::Keyed)
    }

    fn sweep(&self, table: &mut ShardTable<K, L::State>, now: u64) {
        let before = table.entries.len();
        table
            .entries
            .retain(|(_, state)| !self.limiter.is_idle(state, now));
        let removed = before - table.entries.len();
        if removed > 0 {
            let len = self.len.fetch_sub(removed, Ordering::Relaxed) - removed;
            self.report(len);
        }
    }

    /// Sweeps every shard now, removing idle keys whatever the sweep interval; returns how
    /// many were removed. Sweeps also happen on their own as new keys arrive.
    pub fn evict_idle(&self) -> usize {
        let now = self.clock.now();
        let before = self.len();
        for shard in &self.shards {
            let mut table = shard.table.write().unwrap_or_else(PoisonError::into_inner);
            self.sweep(&mut table, now);
        }
        before.saturating_sub(self.len())
    }

    /// Bytes of heap the map's tables hold now (not counting heap owned by the keys).
    pub fn allocated_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.table
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entries
                    .allocation_size()
            })
            .sum::<usize>()
            + self.shards.len() * size_of::<Shard<K, L::State>>()
    }

    /// The most heap the map can ever hold, whatever keys arrive (not counting heap owned
    /// by the keys): the shards themselves, plus for each shard a table grown to hold its
    /// cap. A table holds `7/8` of its buckets, a power of two; each bucket costs one entry
    /// (`size_of::<(K, L::State)>()`) and one control byte, plus 16 trailing control bytes.
    pub fn memory_bound(&self) -> usize {
        let buckets = if self.shard_cap < 8 {
            if self.shard_cap < 4 { 4 } else { 8 }
        } else {
            (self.shard_cap * 8).div_ceil(7).next_power_of_two()
        };
        let per_table = buckets * (size_of::<(K, L::State)>() + 1) + 16 + 16;
        self.shards.len() * (per_table + size_of::<Shard<K, L::State>>())
    }
}

impl<L: Limiter + fmt::Debug, K, C: fmt::Debug> fmt::Debug for KeyedLimiter<L, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("limiter", &self.limiter)
            .field("clock", &self.clock)
            .field("shards", &self.shards.len())
            .field("shard_cap", &self.shard_cap)
            .field("len", &self.len.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SlidingWindow, TokenBucket};
    use overload_core::clock::FakeClock;
    use std::net::{IpAddr, Ipv4Addr};

    fn with_clock<L: Limiter, K: Hash + Eq>(
        limiter: L,
        clock: FakeClock,
        max_keys: usize,
    ) -> KeyedLimiter<L, K, FakeClock> {
        KeyedLimiter::builder(limiter)
            .clock(clock)
            .max_keys(max_keys)
            .build()
            .unwrap()
    }

    fn bucket(rate: u32, burst: u32) -> TokenBucket {
        TokenBucket::builder(rate).burst(burst).build().unwrap()
    }

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    #[test]
    fn status_is_read_only_when_asked() {
        let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 2), FakeClock::new(), 16);
        let (d, status, _) = keyed.check_with_status(&ip(1), 1, false);
        assert_eq!((d, status), (Decision::Allow, None));
        let (d, status, _) = keyed.check_with_status(&ip(1), 1, true);
        assert_eq!(d, Decision::Allow);
        assert_eq!(
            status,
            Some(QuotaStatus {
                remaining: 0,
                reset: Duration::from_secs(2)
            })
        );
        let (d, status, _) = keyed.check_with_status(&ip(1), 1, false);
        assert!(!d.is_allowed());
        assert_eq!(status.map(|s| s.remaining), Some(0));
    }

    #[test]
    fn keys_have_their_own_limits() {
        let clock = FakeClock::new();
        let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 2), clock, 100);
        for _ in 0..2 {
            assert!(keyed.check(&ip(1), 1).0.is_allowed());
        }
        assert!(!keyed.check(&ip(1), 1).0.is_allowed());
        assert!(keyed.check(&ip(2), 1).0.is_allowed());
        assert_eq!(keyed.len(), 2);
    }

    #[test]
    fn borrowed_lookups_store_owned_keys() {
        let keyed: KeyedLimiter<_, Box<[u8]>, _> = with_clock(bucket(1, 1), FakeClock::new(), 100);
        let key: &[u8] = b"api-key-1";
        assert!(keyed.check(key, 1).0.is_allowed());
        assert!(!keyed.check(key, 1).0.is_allowed());
        assert_eq!(keyed.len(), 1);
    }

    #[test]
    fn idle_keys_are_evicted_without_changing_decisions() {
        let clock = FakeClock::new();
        let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(10, 1), clock.clone(), 100);
        for n in 0..50 {
            assert!(keyed.check(&ip(n), 1).0.is_allowed());
        }
        assert_eq!(keyed.len(), 50);
        assert_eq!(keyed.evict_idle(), 0, "nothing is idle yet");
        clock.advance(Duration::from_millis(100));
        assert_eq!(keyed.evict_idle(), 50);
        assert!(keyed.is_empty());
        // A swept key starts fresh, which is exactly the state it was in.
        assert!(keyed.check(&ip(0), 1).0.is_allowed());
    }

    #[test]
    fn sweeps_run_on_their_own_as_new_keys_arrive() {
        let clock = FakeClock::new();
        let keyed: KeyedLimiter<_, IpAddr, _> =
            with_clock(SlidingWindow::new(5).unwrap(), clock.clone(), 1_000);
        for n in 0..200 {
            let _ = keyed.check(&ip(n), 1);
        }
        assert_eq!(keyed.len(), 200);
        clock.advance(Duration::from_secs(2));
        // NOTE: 100 new keys reach every shard (there are two) but with odds of 2^-99.
        assert_eq!(keyed.shards(), 2);
        for n in 1_000..1_100 {
            let _ = keyed.check(&ip(n), 1);
        }
        assert_eq!(keyed.len(), 100, "the 200 idle keys were swept");
    }

    #[test]
    fn at_the_cap_new_keys_share_the_overflow_limit() {
        let clock = FakeClock::new();
        let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 3), clock.clone(), 16);
        let cap = keyed.max_keys();
        let mut classes = std::collections::HashMap::new();
        let mut overflow_admitted = 0;
        for n in 0..1_000 {
            let (decision, class) = keyed.check(&ip(n), 1);
            *classes.entry(class).or_insert(0) += 1;
            if class == KeyClass::Overflow && decision.is_allowed() {
                overflow_admitted += 1;
            }
        }
        assert_eq!(keyed.len(), cap);
        assert!(keyed.len() <= 16 + keyed.shards());
        assert_eq!(classes[&KeyClass::Keyed], cap);
        assert_eq!(classes[&KeyClass::Overflow], 1_000 - cap);
        assert_eq!(
            overflow_admitted, 3,
            "the flood as a whole gets one key's burst"
        );
        // Tracked keys keep their own limit.
        assert!(keyed.check(&ip(0), 1).0.is_allowed());
        assert_eq!(keyed.check(&ip(0), 1).1, KeyClass::Keyed);
        // Once the tracked keys are idle, a sweep makes room again.
        clock.advance(Duration::from_secs(10));
        assert_eq!(keyed.check(&ip(5_000), 1).1, KeyClass::Keyed);
    }

    /// A token bucket that counts `is_idle` calls: the work sweeps do.
    struct CountingSweeps {
        inner: TokenBucket,
        idle_checks: AtomicUsize,
    }

    impl Limiter for CountingSweeps {
        type State = <TokenBucket as Limiter>::State;
        fn check(&self, state: &Self::State, now: u64, cost: u32) -> Decision {
            self.inner.check(state, now, cost)
        }
        fn status(&self, state: &Self::State, now: u64) -> QuotaStatus {
            self.inner.status(state, now)
        }
        fn is_idle(&self, state: &Self::State, now: u64) -> bool {
            self.idle_checks.fetch_add(1, Ordering::Relaxed);
            self.inner.is_idle(state, now)
        }
        fn quota(&self) -> u64 {
            self.inner.quota()
        }
        fn window(&self) -> Duration {
            self.inner.window()
        }
        fn capacity(&self) -> u64 {
            self.inner.capacity()
        }
    }

    #[test]
    fn a_flood_at_the_cap_does_not_sweep_on_every_request() {
        // Regression guard: sweeping a full shard for each new key would make a flood of
        // distinct keys cost O(cap) per request.
        let clock = FakeClock::new();
        let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(
            CountingSweeps {
                inner: TokenBucket::builder(1)
                    .period(Duration::from_secs(3_600))
                    .burst(1)
                    .build()
                    .unwrap(),
                idle_checks: AtomicUsize::new(0),
            },
            clock.clone(),
            100,
        );
        for n in 0..10_000 {
            let _ = keyed.check(&ip(n), 1);
        }
        let checks = keyed.limiter().idle_checks.load(Ordering::Relaxed);
        // One check per stored key (is the new state idle?), and one sweep per shard when
        // it was first used; nothing per overflowed request.
        assert!(
            checks <= 100 + 100,
            "{checks} idle checks for 10 000 requests"
        );
        clock.advance(Duration::from_secs(1));
        let _ = keyed.check(&ip(20_000), 1);
        let after = keyed.limiter().idle_checks.load(Ordering::Relaxed);
        assert!(
            after - checks <= 100 + 1,
            "one sweep of at most the cap per interval"
        );
    }

    #[test]
    fn over_capacity_and_free_requests_store_nothing() {
        let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 3), FakeClock::new(), 16);
        assert_eq!(
            keyed.check(&ip(1), 4).0,
            Decision::OverCapacity { capacity: 3 }
        );
        assert!(keyed.check_with_status(&ip(1), 4, true).1.is_some());
        assert!(keyed.check(&ip(1), 0).0.is_allowed());
        assert!(keyed.is_empty());
    }

    #[test]
    fn invalid_builds_name_the_setting() {
        let err = KeyedLimiter::<_, IpAddr>::builder(bucket(1, 1))
            .max_keys(0)
            .build()
            .unwrap_err();
        assert_eq!(err.to_string(), "max_keys must be at least 1, got 0");
        let err = KeyedLimiter::<_, IpAddr>::builder(bucket(1, 1))
            .sweep_interval(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "sweep_interval must be greater than zero, got 0ns"
        );
        let keyed = KeyedLimiter::<_, IpAddr>::new(bucket(1, 1));
        assert!(keyed.max_keys() >= DEFAULT_MAX_KEYS);
        assert_eq!(keyed.sweep_interval, 1_000_000_000);
    }

    #[test]
    fn memory_stays_under_the_bound() {
        let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 1), FakeClock::new(), 1_000);
        let bound = keyed.memory_bound();
        for n in 0..20_000 {
            let _ = keyed.check(&ip(n), 1);
            if n % 997 == 0 {
                assert!(keyed.allocated_bytes() <= bound);
            }
        }
        assert!(keyed.allocated_bytes() <= bound);
        assert!(keyed.len() <= keyed.max_keys());
    }
}
