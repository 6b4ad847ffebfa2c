//! Building a layer whose limit is kept in Redis: [`RateLimitBuilder::redis`] and
//! [`RedisLayerBuilder`].

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use overload_core::ConfigError;
use overload_core::clock::Clock;

use overload_core::telemetry::LayerName;

use super::decider::RedisDecider;
use super::key::RedisKey;
use super::script::RedisAlgorithm;
use super::secret::FleetSecret;
use super::state::RedisSettings;
use super::store::RedisStore;
use crate::algorithm::Limiter;
use crate::key::{KeyExtractor, MissingKey};
use crate::rate_limit::state::{RequestCost, rate_limit_policy};
use crate::rate_limit::{RateLimitBuilder, RateLimitLayer, Remote};

impl<L: RedisAlgorithm, C: Clock, E: KeyExtractor> RateLimitBuilder<L, C, E> {
    /// Keeps this limit in Redis, shared by every process that uses the same Redis and the
    /// same name: one limit for a fleet. Set everything else (keys, cost, name, headers,
    /// clock) before; the returned builder has the settings of the Redis limit itself, and
    /// builds a `RateLimitLayer<Remote>` (see [`Remote`] for what that asks of the inner
    /// service). See the [`redis`](crate::redis) module for how decisions are made and what
    /// happens when Redis is slow or away.
    ///
    /// The clock and the key cap (`max_keys`, `sweep_interval`) then serve the local
    /// fallback; keys in Redis expire on their own.
    ///
    /// Only with the feature `redis`, for a [`TokenBucket`](crate::TokenBucket) or a
    /// [`SlidingWindow`](crate::SlidingWindow).
    pub fn redis(self, store: RedisStore) -> RedisLayerBuilder<L, C, E> {
        RedisLayerBuilder {
            local: self,
            store,
            budget: RedisLayerBuilder::DEFAULT_BUDGET,
            local_share: RedisLayerBuilder::DEFAULT_LOCAL_SHARE,
            recheck_interval: RedisLayerBuilder::DEFAULT_RECHECK_INTERVAL,
            key_prefix: RedisLayerBuilder::DEFAULT_KEY_PREFIX.to_owned(),
            max_new_keys: RedisLayerBuilder::DEFAULT_MAX_NEW_KEYS,
            key_secret: None,
            reservation: 0,
            reservation_lease: RedisLayerBuilder::DEFAULT_RESERVATION_LEASE,
            lease_set: false,
            name: None,
        }
    }
}

/// Builds a [`RateLimitLayer<Remote>`] whose limit is kept in Redis; from
/// [`RateLimitBuilder::redis`]. Only with the feature `redis`.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::redis::RedisStore;
/// use ratelimit_layer::{RateLimitLayer, TokenBucket};
///
/// let store = RedisStore::new("redis://127.0.0.1:6379")?;
/// // The defaults: a 5 ms budget, the whole limit locally while Redis is away, a recheck
/// // every 500 ms, keys under `ratelimit`.
/// let layer = RateLimitLayer::builder(TokenBucket::new(300)?)
///     .redis(store.clone())
///     .build()?;
/// // Three processes share the limit: each takes a third while Redis is away.
/// let layer = RateLimitLayer::builder(TokenBucket::new(300)?)
///     .redis(store)
///     .local_share(1.0 / 3.0)
///     .budget(Duration::from_millis(10))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[must_use]
pub struct RedisLayerBuilder<L, C, E> {
    local: RateLimitBuilder<L, C, E>,
    store: RedisStore,
    budget: Duration,
    local_share: f64,
    recheck_interval: Duration,
    key_prefix: String,
    max_new_keys: u32,
    /// The fleet's secret, if given; else the one kept in Redis.
    key_secret: Option<Vec<u8>>,
    reservation: u32,
    reservation_lease: Duration,
    /// Whether `reservation_lease` was set: refused without a reservation.
    lease_set: bool,
    /// The name set on this builder, if any: refused when one was set before `redis`.
    name: Option<String>,
}

// NOTE: the defaults on one instance of the type, so that they read
// `RedisLayerBuilder::DEFAULT_BUDGET`, without type parameters.
impl RedisLayerBuilder<(), (), ()> {
    /// The default time budget of a decision: 5 ms.
    ///
    /// A round trip to a Redis in the same data centre takes well under a millisecond
    /// (about 0.1 ms on the same host, see the workspace's `BENCHMARKS.md`); five times the
    /// usual worst leaves room for a busy Redis and a busy client, while a request that
    /// waited it out has lost only a few milliseconds. The figure is this crate's choice;
    /// Envoy's global rate limit filter allows 20 ms.
    pub const DEFAULT_BUDGET: Duration = Duration::from_millis(5);

    /// The default share of the limit a process applies locally while Redis is away: 1,
    /// the whole limit.
    ///
    /// No process then admits more than it was configured for, and a fleet of `n` admits
    /// up to `n` times the limit until Redis is back: the layer fails open to the local
    /// limit, as Envoy's global rate limit fails open (its default) but with a local limit
    /// behind it. Set `1/n` for a fleet of `n` behind an even load balancer.
    pub const DEFAULT_LOCAL_SHARE: f64 = 1.0;

    /// The default interval between two probes of Redis while it is away: 500 ms, so that
    /// fleet-wide limiting resumes within about half a second of Redis answering again
    /// (fleet-wide limiting is to resume within 2 s), for two small commands a second.
    pub const DEFAULT_RECHECK_INTERVAL: Duration = Duration::from_millis(500);

    /// The default cap on the keys a process makes in Redis: 1 000 new keys per second
    /// (and as many at once).
    ///
    /// Far above what real clients add (each client one key: 3.6 million new clients an
    /// hour per process), while a flood of made-up keys (one per request, from a header
    /// a client chooses) adds at most that many keys a second per process to Redis. The
    /// figure is this crate's choice; the local map's own cap is 100 000 keys.
    pub const DEFAULT_MAX_NEW_KEYS: u32 = 1_000;

    /// The default lease of the local reservation: 100 ms after the last batch came. Units
    /// not spent within it are dropped; a tenth of a second keeps a process from spending,
    /// much later, units the fleet counted long before.
    pub const DEFAULT_RESERVATION_LEASE: Duration = Duration::from_millis(100);

    /// How many failed decisions in a row turn Redis away: 3. A failed decision is one
    /// that Redis did not answer within its budget, or answered with an error (for the
    /// reservation, a batch's round trip); "in a row" means since the last decision Redis
    /// answered in time, each decision counted having started after the failure counted
    /// before it, so that the decisions in flight together when Redis stalls count as one.
    ///
    /// One is not enough: the rare decision over budget (a Redis in another zone, whose
    /// 99.9th percentile passes 5 ms; a pause of the client's runtime) would send the
    /// process to its local share for a recheck interval, and a fleet at the default share
    /// admits up to `n` times its limit while it does, and does so exactly when load is
    /// highest. Three in a row, each started after the last failed, take a Redis that has
    /// stopped answering at least three budgets to leave (15 ms with the defaults), a cost
    /// paid once per outage; a Redis that answers most decisions in time stays. Not a
    /// setting: raise the [`budget`](RedisLayerBuilder::budget) for a slower Redis.
    pub const AWAY_AFTER_FAILURES: u32 = 3;

    /// The default first part of every key: `ratelimit`. Keys are
    /// `{prefix}:{name}:{algorithm}:...`, the name being the layer's
    /// ([`RateLimitBuilder::name`]).
    pub const DEFAULT_KEY_PREFIX: &'static str = "ratelimit";

    /// The fewest bytes a [`key_secret`](RedisLayerBuilder::key_secret) may have: 16 (128
    /// bits).
    pub const MIN_KEY_SECRET_LEN: usize = super::secret::MIN_SECRET_LEN;
}

impl<L, C, E> RedisLayerBuilder<L, C, E> {
    /// How long a decision may wait for Redis before the local share decides instead;
    /// [`AWAY_AFTER_FAILURES`](RedisLayerBuilder::AWAY_AFTER_FAILURES) decisions in a row
    /// over it (or failed) turn Redis away. Default: 5 ms
    /// ([`DEFAULT_BUDGET`](RedisLayerBuilder::DEFAULT_BUDGET)).
    pub const fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The part of the limit (its rate and burst, or its quota, each rounded up) a process
    /// applies on its own while Redis is away, within `(0, 1]`. Default: 1, the whole limit
    /// ([`DEFAULT_LOCAL_SHARE`](RedisLayerBuilder::DEFAULT_LOCAL_SHARE)).
    pub const fn local_share(mut self, share: f64) -> Self {
        self.local_share = share;
        self
    }

    /// How often, while Redis is away, the layer probes it (requests are decided locally at
    /// once meanwhile; an answer within the store's response timeout brings Redis back),
    /// and, while no request asks it, checks it. Default: 500 ms
    /// ([`DEFAULT_RECHECK_INTERVAL`](RedisLayerBuilder::DEFAULT_RECHECK_INTERVAL)).
    pub const fn recheck_interval(mut self, interval: Duration) -> Self {
        self.recheck_interval = interval;
        self
    }

    /// The first part of every key, to keep this application's keys apart from others in
    /// the same Redis database: 1 to 128 bytes of printable ASCII, without `{`, `}` or
    /// spaces (a brace would make a Cluster hash tag of it: every key of the limit in one
    /// slot); `:` is allowed (`myapp:ratelimit`). Default: `ratelimit`
    /// ([`DEFAULT_KEY_PREFIX`](RedisLayerBuilder::DEFAULT_KEY_PREFIX)).
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.key_prefix);
        self
    }

    /// The fleet's secret, that names each client's key in Redis: a key's name is
    /// HMAC-SHA-256 of the key under the secret (its first 128 bits, in hex), so that a
    /// client who chooses its key (a header) cannot choose the Redis Cluster slot, and so
    /// the master, its key lands on. At least 16 bytes
    /// ([`MIN_KEY_SECRET_LEN`](RedisLayerBuilder::MIN_KEY_SECRET_LEN)); 32 random bytes are
    /// ample. **Every process of a fleet must be given the same secret**: a process with
    /// another names every key otherwise, and each key's limit would admit once per secret.
    /// It is never logged, nor shown by `Debug`.
    ///
    /// Default: none given, the secret kept in Redis under `{prefix}:secret`: the first
    /// process that needs it makes it (64 random hex digits from the operating system,
    /// written with `SET NX`, so that two processes starting at once agree on one), and
    /// every process reads it there before its first keyed decision (a keyed request
    /// meanwhile is decided in Redis within its budget, or locally if Redis is away). Each
    /// process reads it again every 20 recheck intervals (10 s by default) and writes its
    /// own back if the key is gone (Redis flushed or restarted without persistence), so the
    /// fleet keeps one secret; if Redis holds another (made by a process while the key was
    /// gone), the process takes it and logs it at `WARN`. Give a secret where processes
    /// must agree without Redis's help (a Redis whose keys are evicted, or a fleet spread
    /// over several Redis databases with one limit each is fine either way); an operator may
    /// also write the key before the fleet starts.
    ///
    /// ```
    /// use ratelimit_layer::key::ClientIp;
    /// use ratelimit_layer::redis::RedisStore;
    /// use ratelimit_layer::{RateLimitLayer, TokenBucket};
    ///
    /// # fn secret_from_the_environment() -> Vec<u8> { vec![7; 32] }
    /// let layer = RateLimitLayer::builder(TokenBucket::new(100)?)
    ///     .key_by_client_ip(ClientIp::new())
    ///     .redis(RedisStore::new("redis://127.0.0.1:6379")?)
    ///     .key_secret(secret_from_the_environment())
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), ratelimit_layer::ConfigError>(())
    /// ```
    pub fn key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.key_secret = Some(secret.as_ref().to_vec());
        self
    }

    /// The cap on new keys this process makes in Redis, per second (and at once), for a
    /// keyed limit. A key over the cap (Redis does not hold it, and this process has made
    /// its share of new keys this second) is decided against the overflow limit of its
    /// client's network in Redis (IPv4 `/24`, IPv6 `/48`), with the same rate, as the local
    /// map does at its cap, so that one network minting keys spends its own overflow limit
    /// and not other networks' new clients'; keys Redis holds keep their own limits. The
    /// same figure caps the networks' overflow keys a process makes a second; past both,
    /// one last overflow limit is shared. Default: 1 000
    /// ([`DEFAULT_MAX_NEW_KEYS`](RedisLayerBuilder::DEFAULT_MAX_NEW_KEYS)). See the
    /// [module docs](crate::redis) for what it bounds.
    pub const fn max_new_keys(mut self, per_second: u32) -> Self {
        self.max_new_keys = per_second;
        self
    }

    /// Opts in to a local reservation of the global limit: each process holds up to
    /// `units` taken from Redis, spends them without a round trip within the
    /// [lease](Self::reservation_lease), asks for the next batch when half of one is left,
    /// and rejects without a round trip, until its wait is over, what Redis rejected
    /// before. Far fewer round trips, for a stated inaccuracy: in any window, the fleet
    /// admits at most `processes x units` more than the limit does (over time, never more
    /// than the limit). Choose at least twice what a process spends in a round trip to
    /// Redis, so that its requests do not wait for a batch. Default: 0, off: every decision
    /// asks Redis. A keyed limit's keys always ask Redis. See the
    /// [module docs](crate::redis).
    pub const fn reservation(mut self, units: u32) -> Self {
        self.reservation = units;
        self
    }

    /// How long after the last batch came the units the local reservation holds may be
    /// spent; what is left then is dropped. Default: 100 ms
    /// ([`DEFAULT_RESERVATION_LEASE`](RedisLayerBuilder::DEFAULT_RESERVATION_LEASE)).
    ///
    /// Only with a [`reservation`](Self::reservation): [`build`](Self::build) refuses it
    /// without one, where it would do nothing.
    pub const fn reservation_lease(mut self, lease: Duration) -> Self {
        self.reservation_lease = lease;
        self.lease_set = true;
        self
    }

    /// What the layer calls itself, as [`RateLimitBuilder::name`]: its metrics' `name`
    /// label, its logs' `name` field, its `RateLimit-Policy` name, and part of its keys in
    /// Redis, so that processes that share a limit share its name. Set it here or before
    /// [`redis`](RateLimitBuilder::redis), not both: [`build`](Self::build) refuses a name
    /// set twice rather than keep the last. Default: `default`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

impl<L, C, E> RedisLayerBuilder<L, C, E>
where
    L: RedisAlgorithm,
    C: Clock,
    E: KeyExtractor,
    E::Lookup: RedisKey,
{
    /// Builds the layer. Nothing is sent to Redis until the first request.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting, when:
    ///
    /// - `budget`, `recheck_interval` or `reservation_lease` is zero, or `max_new_keys` is
    ///   (kind `OutOfRange`);
    /// - `reservation` is larger than the limiter's capacity (its burst, or its quota):
    ///   such a batch could never be filled (kind `OutOfRange`);
    /// - `local_share` is not finite (kind `NotFinite`) or not within `(0, 1]` (kind
    ///   `OutOfRange`), or leaves a local burst below a fixed cost (kind `Conflict`);
    /// - `key_prefix` is empty, longer than 128 bytes, or holds anything but printable ASCII
    ///   without `{`, `}` and spaces; or the layer's `name` holds a `{`, `}`, `:` or space
    ///   (kind `Invalid`): either would break the key layout (a brace makes a Cluster hash
    ///   tag, every key in one slot; a `:` in the name lets two layers' keys meet);
    /// - `key_secret` is shorter than 16 bytes (kind `OutOfRange`);
    /// - `reservation_lease` is set without a `reservation`, or `name` is set both before
    ///   `redis` and on this builder (kind `Conflict`);
    /// - the limiter cannot be computed exactly in Redis: a token bucket with more than one
    ///   unit per microsecond, a sliding window that is not whole microseconds or whose
    ///   `quota x window` in microseconds passes 2^53;
    /// - any rule of [`RateLimitBuilder::build`] breaks.
    pub fn build(self) -> Result<RateLimitLayer<Remote>, ConfigError> {
        for (field, value) in [
            ("budget", self.budget),
            ("recheck_interval", self.recheck_interval),
            ("reservation_lease", self.reservation_lease),
        ] {
            if value.is_zero() {
                return Err(ConfigError::out_of_range(field, value, "greater than zero"));
            }
        }
        if self.max_new_keys == 0 {
            return Err(ConfigError::out_of_range(
                "max_new_keys",
                self.max_new_keys,
                "at least 1",
            ));
        }
        let share = self.local_share;
        if !share.is_finite() {
            return Err(ConfigError::not_finite("local_share", share));
        }
        if share <= 0.0 || share > 1.0 {
            return Err(ConfigError::out_of_range(
                "local_share",
                share,
                "within (0, 1]",
            ));
        }
        if self.key_prefix.is_empty() {
            return Err(ConfigError::invalid(
                "key_prefix",
                &self.key_prefix,
                "non-empty",
            ));
        }
        // NOTE: the layout `{prefix}:{name}:{algorithm}:...` must hold no hash tag (a `{`
        // makes the part up to the next `}` every key's slot), and name one layer only.
        if self.key_prefix.len() > 128
            || !self
                .key_prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(ConfigError::invalid(
                "key_prefix",
                &self.key_prefix,
                "at most 128 bytes of printable ASCII with no `{`, `}` or space (a brace would \
                 put every key of the limit in one Redis Cluster slot)",
            ));
        }
        if let Some(secret) = &self.key_secret
            && secret.len() < RedisLayerBuilder::MIN_KEY_SECRET_LEN
        {
            // NOTE: the length only: a secret is never in a message.
            return Err(ConfigError::out_of_range(
                "key_secret",
                format_args!("{} bytes", secret.len()),
                "at least 16 bytes",
            ));
        }
        if self.lease_set && self.reservation == 0 {
            return Err(ConfigError::conflict(
                "reservation_lease",
                "reservation_lease applies to a local reservation only; set reservation too, \
                 or leave the lease out",
            ));
        }
        let mut local = self.local;
        if let Some(name) = self.name {
            if local.name_set {
                return Err(ConfigError::conflict(
                    "name",
                    format_args!(
                        "name set before redis ({:?}) and after it ({name:?}): set it once",
                        local.name
                    ),
                ));
            }
            local.name = name;
        }
        let full = local.limiter;
        let scripted = full.scripted()?;
        if u64::from(self.reservation) > full.capacity() {
            return Err(ConfigError::out_of_range(
                "reservation",
                self.reservation,
                &format!("at most the limit's capacity ({})", full.capacity()),
            ));
        }
        let fallback = full.share(share)?;
        if let Some(RequestCost::Fixed(cost)) = local.cost {
            let capacity = fallback.capacity();
            if u64::from(cost) > capacity && u64::from(cost) <= full.capacity() {
                return Err(ConfigError::conflict(
                    "local_share",
                    format_args!(
                        "local_share ({share}) leaves a local capacity of {capacity}, below the \
                         cost of every request ({cost}): Redis away, nothing would be admitted"
                    ),
                ));
            }
        }
        let name = LayerName::new(local.name.as_str())?;
        if name
            .as_str()
            .bytes()
            .any(|b| matches!(b, b'{' | b'}' | b':' | b' '))
        {
            return Err(ConfigError::invalid(
                "name",
                name.as_str(),
                "free of `{`, `}`, `:` and spaces for a limit kept in Redis, where it is part \
                 of every key (a brace would put every key in one Redis Cluster slot; a `:` \
                 would let two layers' keys meet)",
            ));
        }
        let full_policy = rate_limit_policy(&name, &full)?;
        let clock = Arc::new(local.clock);
        let (remote_key, local_key) = match local.key {
            None => (None, None),
            Some(extract) => {
                let extract = Arc::new(extract);
                (
                    Some(SharedExtractor(Arc::clone(&extract))),
                    Some(SharedExtractor(extract)),
                )
            }
        };
        let settings = RedisSettings {
            store: self.store,
            namespace: format!("{}:{}:{}:", self.key_prefix, name, scripted.tag).into_bytes(),
            scripted,
            budget: self.budget,
            recheck: self.recheck_interval,
            capacity: full.capacity(),
            max_new_keys: self.max_new_keys,
            secret: FleetSecret::new(self.key_secret.as_deref(), &self.key_prefix),
            reservation: (self.reservation > 0)
                .then_some((self.reservation, self.reservation_lease)),
            away_after: RedisLayerBuilder::AWAY_AFTER_FAILURES,
            name,
        };
        // The local fallback: the same layer with the local share of the limit.
        let fallback = RateLimitBuilder {
            limiter: fallback,
            clock: Arc::clone(&clock),
            key: local_key,
            max_keys: local.max_keys,
            sweep_interval: local.sweep_interval,
            keyed_settings: local.keyed_settings,
            cost: local.cost,
            name: local.name,
            name_set: true,
            admitted_headers: local.admitted_headers,
            missing_key: local.missing_key,
            reserves: local.reserves,
        }
        .into_state()?;
        // NOTE: one missing-key policy for both, so that a request without a key is logged and
        // counted once, and decided where the policy says.
        let remote = RedisDecider::new(
            settings,
            clock,
            remote_key,
            fallback.missing_key_policy(),
            fallback.shedding(),
        )?;
        // The fields advertise the fleet's limit, whichever decides a request.
        Ok(RateLimitLayer::from_state(fallback.with_remote(
            Box::new(remote),
            full_policy,
            full.window(),
        )))
    }
}

impl<L: fmt::Debug, C: fmt::Debug, E> fmt::Debug for RedisLayerBuilder<L, C, E>
where
    L: Limiter,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLayerBuilder")
            .field("local", &self.local)
            .field("store", &self.store)
            .field("budget", &self.budget)
            .field("local_share", &self.local_share)
            .field("recheck_interval", &self.recheck_interval)
            .field("key_prefix", &self.key_prefix)
            .field("max_new_keys", &self.max_new_keys)
            .field(
                "key_secret",
                &if self.key_secret.is_some() {
                    "given"
                } else {
                    "kept in Redis"
                },
            )
            .field("reservation", &self.reservation)
            .field("reservation_lease", &self.reservation_lease)
            .finish()
    }
}

/// One key extractor for the remote limit and its local fallback.
struct SharedExtractor<E>(Arc<E>);

impl<E: KeyExtractor> KeyExtractor for SharedExtractor<E> {
    type Key = E::Key;
    type Lookup = E::Lookup;

    #[inline]
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, E::Lookup>> {
        self.0.extract(parts)
    }

    fn missing_key(&self) -> MissingKey {
        self.0.missing_key()
    }

    fn client_addr(&self, parts: &Parts) -> Option<IpAddr> {
        self.0.client_addr(parts)
    }
}
