//! The sharded map of per-key states ([`KeyedLimiter`]), and which of its limits a request
//! was checked against ([`KeyClass`]).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use hashbrown::HashTable;
use overload_core::clock::{Clock, TokioClock};

use super::network::network_of;
use crate::algorithm::{Decision, Limiter, QuotaStatus};

/// Which kind of limit a request was checked against; also the `key_class` label of the
/// rejection metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyClass {
    /// The one limit of a layer without keys.
    Global,
    /// The request's own key.
    Keyed,
    /// An overflow limit of new keys that arrived while the map (or, in Redis, the cap on
    /// new keys) was at its cap: the one of the request's client's network (IPv4 /24, IPv6
    /// /48), or, past the cap on networks too, the last one all share.
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

/// Fewest keys a shard is made to hold (unless `max_keys` itself is smaller).
const MIN_SHARD_CAP: usize = 256;

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
///   has passed, or when [`sweep_due`](Self::sweep_due) is called (a
///   [`RateLimitLayer`](crate::RateLimitLayer) calls it every second, so that idle keys
///   are forgotten, and its keys gauge falls, when no new key comes). Forgetting such a key
///   changes no decision.
/// - **A hard cap.** Each shard holds at most `ceil(max_keys / shards)` keys. **At the cap**
///   (after a due sweep, if any), a new key is *not* stored: its request is checked against
///   the *overflow* state of its client's network ([`KeyClass::Overflow`]), with the same
///   limit as a key. So a flood of distinct keys cannot grow memory; keys already tracked
///   keep their own limits; once sweeps free room, new keys are tracked again. Because the
///   cap is per shard, a few new keys may go to an overflow state shortly before
///   `max_keys` keys are tracked in total (shards fill unevenly).
///
/// # Fair admission past the cap
///
/// A client's network is its address ([`check_from`](Self::check_from); a layer passes
/// its key extractor's [`client_addr`](crate::key::KeyExtractor::client_addr)) taken at
/// IPv4 `/24` or IPv6 `/48`; requests without an address are one network. Each network's
/// new keys past the cap share one overflow state of its own, so a network that mints
/// keys (an IPv6 `/48` holds 65 536 `/64` keys) spends its own key's quota, and a new
/// client of another network is admitted at a key's quota of its own (tested: 2 000 new
/// `/64` keys a second from one `/48` against a map of 1 000 keys, and one new client of
/// another network admitted at its full burst). What holds, and what does not:
///
/// - Two new clients of one network past the cap share that network's quota (a NAT, an
///   office); keys already tracked keep their own.
/// - The overflow states of at most [`MAX_OVERFLOW_NETWORKS`](Self::MAX_OVERFLOW_NETWORKS)
///   networks (1 024) are kept; idle ones are swept at most once per sweep interval. Past
///   that, new keys of further networks share one last overflow state: a client holding
///   more than 1 024 networks (an IPv6 `/38`, or 1 024 IPv4 `/24`s) at once can still push
///   new clients of networks it has not reached into one key's quota.
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
/// // Customised: a smaller cap, idle keys swept every 5 seconds.
/// let keyed: KeyedLimiter<_, IpAddr> = KeyedLimiter::builder(TokenBucket::new(1)?)
///     .max_keys(10_000)
///     .sweep_interval(std::time::Duration::from_secs(5))
///     .build()?;
/// # let _ = keyed;
/// # Ok(())
/// # }
/// ```
pub struct KeyedLimiter<L: Limiter, K, C = TokioClock> {
    limiter: L,
    clock: C,
    hasher: RandomState,
    shards: Box<[KeyShard<K, L::State>]>,
    shard_mask: usize,
    shard_cap: usize,
    pub(super) sweep_interval: u64,
    len: AtomicUsize,
    /// The overflow states of networks past the cap.
    networks: Mutex<NetworkTable<L::State>>,
    /// The last overflow state, shared by new keys past the cap whose network has none
    /// (the table of networks full).
    overflow: L::State,
}

/// The overflow states of networks ([`network_of`]) whose new keys came past the cap.
struct NetworkTable<S> {
    entries: HashTable<(u64, S)>,
    /// Clock time (nanoseconds) after which a full table may be swept again.
    next_sweep: u64,
}

/// One shard, on its own cache lines so that two shards' locks never share one.
#[repr(align(128))]
struct KeyShard<K, S> {
    table: RwLock<KeyShardTable<K, S>>,
}

struct KeyShardTable<K, S> {
    entries: HashTable<(K, S)>,
    /// Clock time (nanoseconds) after which the next new key sweeps idle entries.
    next_sweep: u64,
}

impl<L: Limiter, K: Hash + Eq, C: Clock> KeyedLimiter<L, K, C> {
    /// `max_keys` at least one, `sweep_interval` in nanoseconds and above zero.
    pub(super) fn assemble(limiter: L, clock: C, max_keys: usize, sweep_interval: u64) -> Self {
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
                .map(|_| KeyShard {
                    table: RwLock::new(KeyShardTable {
                        entries: HashTable::new(),
                        next_sweep: 0,
                    }),
                })
                .collect(),
            shard_mask: shards - 1,
            shard_cap,
            sweep_interval,
            len: AtomicUsize::new(0),
            networks: Mutex::new(NetworkTable {
                entries: HashTable::new(),
                next_sweep: 0,
            }),
            overflow: L::State::default(),
        }
    }

    /// The most networks whose overflow states are kept at once: 1 024, this crate's
    /// choice (tens of kilobytes). Past it, the new keys of further networks share one last
    /// overflow state; see [Fair admission past the cap](Self#fair-admission-past-the-cap).
    pub const MAX_OVERFLOW_NETWORKS: usize = 1_024;

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
        let (decision, _, class) = self.check_inner(key, || None, cost, |_| 0, false, false);
        (decision, class)
    }

    /// As [`check`](Self::check), and also reads the key's [`QuotaStatus`] right after the
    /// decision (under the same lock) when the request is rejected, or admitted and
    /// `on_allow` is set: what a response's `RateLimit` field reports.
    ///
    /// A new key past the cap is charged to the network of no address; use
    /// [`check_from`](Self::check_from) to charge it to its client's.
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
        self.check_inner(key, || None, cost, |_| 0, on_allow, true)
    }

    /// As [`check_with_status`](Self::check_with_status), for a request from `client`: a
    /// new key past the cap is decided against the overflow state of `client`'s network
    /// (IPv4 `/24`, IPv6 `/48`; `None` is one network of its own), so that one network
    /// minting keys cannot push other networks' new clients out. See
    /// [Fair admission past the cap](Self#fair-admission-past-the-cap).
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use ratelimit_layer::TokenBucket;
    /// use ratelimit_layer::keyed::{KeyClass, KeyedLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratelimit_layer::ConfigError> {
    /// let keyed: KeyedLimiter<_, String> = KeyedLimiter::builder(TokenBucket::new(1)?)
    ///     .max_keys(1)
    ///     .build()?;
    /// let client: IpAddr = "192.0.2.1".parse().unwrap();
    /// let other: IpAddr = "198.51.100.1".parse().unwrap();
    /// // The map is full after one key: a second key is charged to its network.
    /// assert_eq!(keyed.check_from("a", Some(client), 1, false).2, KeyClass::Keyed);
    /// assert!(keyed.check_from("b", Some(client), 1, false).0.is_allowed());
    /// assert!(!keyed.check_from("c", Some(client), 1, false).0.is_allowed());
    /// // Another network's new key has a quota of its own.
    /// let (decision, _, class) = keyed.check_from("d", Some(other), 1, false);
    /// assert!(decision.is_allowed());
    /// assert_eq!(class, KeyClass::Overflow);
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn check_from<Q>(
        &self,
        key: &Q,
        client: Option<IpAddr>,
        cost: u32,
        on_allow: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned,
        Q::Owned: Into<K>,
    {
        self.check_inner(key, || client, cost, |_| 0, on_allow, true)
    }

    /// As [`check_from`](Self::check_from), with the client's address asked only for a new
    /// key past the cap (a layer's requests, whose address costs extension look-ups), and
    /// the units held back from the request (see [`Limiter::check_holding_back`]) asked
    /// once, with the time of the decision.
    #[inline]
    pub(crate) fn check_lazy<Q>(
        &self,
        key: &Q,
        client: impl FnOnce() -> Option<IpAddr>,
        cost: u32,
        held_back: impl FnOnce(u64) -> u64,
        on_allow: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned,
        Q::Owned: Into<K>,
    {
        self.check_inner(key, client, cost, held_back, on_allow, true)
    }

    #[inline]
    fn decide(
        &self,
        state: &L::State,
        now: u64,
        (cost, held): (u32, u64),
        on_allow: bool,
        on_reject: bool,
    ) -> (Decision, Option<QuotaStatus>) {
        let decision = self.limiter.check_holding_back(state, now, cost, held);
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
        client: impl FnOnce() -> Option<IpAddr>,
        cost: u32,
        held_back: impl FnOnce(u64) -> u64,
        on_allow: bool,
        on_reject: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned,
        Q::Owned: Into<K>,
    {
        let now = self.clock.now();
        // NOTE: the cost and the units held back from it travel together.
        let cost = (cost, held_back(now));
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
        self.check_new(shard, hash, key, client, now, cost, on_allow, on_reject)
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn check_new<Q>(
        &self,
        shard: &KeyShard<K, L::State>,
        hash: u64,
        key: &Q,
        client: impl FnOnce() -> Option<IpAddr>,
        now: u64,
        cost: (u32, u64),
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
            drop(table);
            tracing::debug!(
                shard_cap = self.shard_cap,
                "rate limit key map shard is full; checking a new key against its network's \
                 overflow limit"
            );
            let network = network_of(client());
            let (decision, status) = self.decide_overflow(network, now, cost, on_allow, on_reject);
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
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        (decision, status, KeyClass::Keyed)
    }

    /// A new key past the cap: the overflow state of its network, made if the table of
    /// networks has room (after a due sweep of its idle states), or else the last one.
    fn decide_overflow(
        &self,
        network: u64,
        now: u64,
        cost: (u32, u64),
        on_allow: bool,
        on_reject: bool,
    ) -> (Decision, Option<QuotaStatus>) {
        let hash = self.hasher.hash_one(network);
        let mut table = self.networks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, state)) = table.entries.find(hash, |(n, _)| *n == network) {
            return self.decide(state, now, cost, on_allow, on_reject);
        }
        if table.entries.len() >= Self::MAX_OVERFLOW_NETWORKS && now >= table.next_sweep {
            // NOTE: at most once per sweep interval, so that a flood of networks costs no
            // sweep of the table per request.
            table.next_sweep = now.saturating_add(self.sweep_interval);
            table
                .entries
                .retain(|(_, state)| !self.limiter.is_idle(state, now));
        }
        if table.entries.len() >= Self::MAX_OVERFLOW_NETWORKS {
            return self.decide(&self.overflow, now, cost, on_allow, on_reject);
        }
        let state = L::State::default();
        let decided = self.decide(&state, now, cost, on_allow, on_reject);
        if !self.limiter.is_idle(&state, now) {
            let hasher = &self.hasher;
            table
                .entries
                .insert_unique(hash, (network, state), |(n, _)| hasher.hash_one(n));
        }
        decided
    }

    /// Removes the networks' idle overflow states.
    fn sweep_networks(&self, now: u64) {
        let mut table = self.networks.lock().unwrap_or_else(PoisonError::into_inner);
        table
            .entries
            .retain(|(_, state)| !self.limiter.is_idle(state, now));
    }

    fn sweep(&self, table: &mut KeyShardTable<K, L::State>, now: u64) {
        let before = table.entries.len();
        table
            .entries
            .retain(|(_, state)| !self.limiter.is_idle(state, now));
        let removed = before - table.entries.len();
        if removed > 0 {
            self.len.fetch_sub(removed, Ordering::Relaxed);
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
        self.sweep_networks(now);
        before.saturating_sub(self.len())
    }

    /// Sweeps each shard whose sweep interval has passed since its last sweep, removing its
    /// idle keys; returns how many were removed.
    ///
    /// A shard is swept at most once per interval, by this or by a new key that arrives in
    /// it, so calling it often costs one read lock per shard and nothing more. A
    /// [`RateLimitLayer`](crate::RateLimitLayer) calls it every second, so that the keys of
    /// clients that went away are forgotten even when no new key arrives.
    pub fn sweep_due(&self) -> usize {
        let now = self.clock.now();
        let before = self.len();
        for shard in &self.shards {
            // NOTE: read first, so that a shard not due costs no write lock.
            let due = now
                >= shard
                    .table
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .next_sweep;
            if !due {
                continue;
            }
            let mut table = shard.table.write().unwrap_or_else(PoisonError::into_inner);
            if now >= table.next_sweep {
                table.next_sweep = now.saturating_add(self.sweep_interval);
                self.sweep(&mut table, now);
            }
        }
        {
            let mut networks = self.networks.lock().unwrap_or_else(PoisonError::into_inner);
            if !networks.entries.is_empty() && now >= networks.next_sweep {
                networks.next_sweep = now.saturating_add(self.sweep_interval);
                networks
                    .entries
                    .retain(|(_, state)| !self.limiter.is_idle(state, now));
            }
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
            + self.shards.len() * size_of::<KeyShard<K, L::State>>()
            + self
                .networks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entries
                .allocation_size()
    }

    /// The most heap the map can ever hold, whatever keys arrive (not counting heap owned
    /// by the keys): the shards themselves, plus for each shard a table grown to hold its
    /// cap, plus the networks' overflow states grown to
    /// [`MAX_OVERFLOW_NETWORKS`](Self::MAX_OVERFLOW_NETWORKS). A table holds `7/8` of its
    /// buckets, a power of two; each bucket costs one entry (`size_of::<(K, L::State)>()`)
    /// and one control byte, plus 16 trailing control bytes.
    pub fn memory_bound(&self) -> usize {
        fn table_bytes(cap: usize, entry: usize) -> usize {
            let buckets = if cap < 8 {
                if cap < 4 { 4 } else { 8 }
            } else {
                (cap * 8).div_ceil(7).next_power_of_two()
            };
            buckets * (entry + 1) + 16 + 16
        }
        let per_table = table_bytes(self.shard_cap, size_of::<(K, L::State)>());
        self.shards.len() * (per_table + size_of::<KeyShard<K, L::State>>())
            + table_bytes(Self::MAX_OVERFLOW_NETWORKS, size_of::<(u64, L::State)>())
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
