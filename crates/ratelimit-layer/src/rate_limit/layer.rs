//! The layer and its configuration: [`RateLimitLayer`] and [`RateLimitBuilder`].

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::request::Parts;
use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::{LayerName, LazyMetrics};
use overload_signal::criticality::Reserves;
use tower_layer::Layer;

use super::decide::{GlobalDecider, KeyedDecider, LocalDecide, MissingKeyPolicy, Shedding};
#[cfg(feature = "redis")]
use super::service::Remote;
use super::service::{Local, RateLimit};
use super::state::{RateLimitState, RequestCost, rate_limit_policy};
use crate::algorithm::Limiter;
use crate::key::{ClientIp, HeaderKey, KeyExtractor, MissingKey, NoKey};
use crate::keyed::{self, KeyedLimiter};

/// Applies [`RateLimit`] to a service; see the [crate docs](crate).
///
/// Cheap to clone: clones (and the services they make) share the same limits. Its
/// parameter says where the limit is decided: [`Local`] (the default) for every limit but
/// one kept in Redis, which is a `RateLimitLayer<Remote>` (feature `redis`; see
/// [`RateLimit`]).
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::{RateLimitLayer, SlidingWindow, TokenBucket};
///
/// // The defaults: one global limit, cost 1 per request, named `default`.
/// let layer = RateLimitLayer::new(TokenBucket::new(100)?);
///
/// // Customised: per client IP, heavier POSTs, named `api` (in the metrics, the logs and
/// // the `RateLimit-Policy` field), the fields on every response.
/// let layer = RateLimitLayer::builder(
///     SlidingWindow::builder(600).window(Duration::from_secs(60)).build()?,
/// )
/// .key_by_client_ip(ratelimit_layer::key::ClientIp::new())
/// .cost_by(|parts| if parts.method == http::Method::POST { 10 } else { 1 })
/// .name("api")
/// .admitted_headers(true)
/// .build()?;
/// # let _ = layer;
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
pub struct RateLimitLayer<M = Local> {
    pub(crate) state: Arc<RateLimitState>,
    mode: PhantomData<fn() -> M>,
}

impl RateLimitLayer {
    /// The name of a layer nobody named: `default` ([`LayerName::DEFAULT`], the workspace's
    /// name for an unnamed layer, and the policy name the IETF draft's examples use). Name
    /// your layers when a process has more than one rate limit.
    pub const DEFAULT_NAME: &'static str = LayerName::DEFAULT;

    /// The default cost (weight) of a request: 1, so that the rate counts requests.
    pub const DEFAULT_COST: u32 = 1;

    /// The default cap on the keys a keyed limit tracks: 100 000.
    ///
    /// With the token bucket and IP keys an entry takes 32 bytes, so the map stays under
    /// about 8 MiB (see [`KeyedLimiter::memory_bound`]); the figure is this crate's choice,
    /// large enough for the distinct clients a single server sees within a few seconds.
    pub const DEFAULT_MAX_KEYS: usize = keyed::DEFAULT_MAX_KEYS;

    /// The default interval between sweeps of idle keys in a shard of a keyed limit: one
    /// second.
    ///
    /// Sweeping costs one pass over a shard (at most `max_keys / shards` entries) per
    /// interval, when a new key arrives in that shard or when the layer's once-a-second tick
    /// finds it due; the figure is this crate's choice.
    pub const DEFAULT_SWEEP_INTERVAL: Duration = keyed::DEFAULT_SWEEP_INTERVAL;

    /// How long a limit must reject nothing before the episode its first rejection began is
    /// over: 10 seconds, the length of the workspace's sliding windows (the overload layer's
    /// attempt histogram, the retry budget), so that clients backing off between retries do
    /// not start a new episode with each wave.
    ///
    /// The first rejection of an episode is logged at `WARN` ("rate limit engaged"), its end
    /// at `INFO` ("rate limit released"), within a second of the quiet period passing (the
    /// layer checks every second); each rejection is logged at `TRACE`.
    pub const QUIET_PERIOD: Duration = Duration::from_secs(10);

    /// One global limit with `limiter` and the defaults: cost 1 per request, named
    /// `default`, no `RateLimit` fields on admitted responses, time from
    /// [`TokioClock`](crate::clock::TokioClock), shedding from the bottom with
    /// [`Reserves::new`] (see [`RateLimitBuilder::reserves`]).
    pub fn new<L: Limiter>(limiter: L) -> Self {
        // NOTE: the default name is valid and `rate_limit_policy` accepts every window (every
        // test that calls `new` builds it), so this cannot fail.
        let name = LayerName::default();
        let policy = rate_limit_policy(&name, &limiter)
            .expect("the default name is a valid structured field string");
        let window = limiter.window();
        let decide = Box::new(GlobalDecider {
            limiter,
            clock: TokioClock::new(),
            state: L::State::default(),
            shed: Shedding::new(Reserves::new()),
        });
        Self::from_state(RateLimitState::new(
            decide,
            RequestCost::Fixed(Self::DEFAULT_COST),
            policy,
            name,
            false,
            window,
            Self::QUIET_PERIOD,
        ))
    }

    /// A builder for a limit with `limiter`, starting from the defaults of
    /// [`new`](Self::new).
    pub fn builder<L: Limiter>(limiter: L) -> RateLimitBuilder<L> {
        RateLimitBuilder {
            limiter,
            clock: TokioClock::new(),
            key: None,
            max_keys: Self::DEFAULT_MAX_KEYS,
            sweep_interval: Self::DEFAULT_SWEEP_INTERVAL,
            keyed_settings: false,
            cost: None,
            name: Self::DEFAULT_NAME.to_owned(),
            name_set: false,
            admitted_headers: false,
            missing_key: None,
            reserves: Reserves::new(),
        }
    }
}

impl<M> RateLimitLayer<M> {
    pub(crate) fn from_state(state: RateLimitState) -> Self {
        Self {
            state: Arc::new(state),
            mode: PhantomData,
        }
    }
}

impl<M> Clone for RateLimitLayer<M> {
    fn clone(&self) -> Self {
        Self {
            state: Arc::clone(&self.state),
            mode: PhantomData,
        }
    }
}

impl<M> fmt::Debug for RateLimitLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("state", &self.state)
            .finish()
    }
}

impl<S, M> Layer<S> for RateLimitLayer<M> {
    type Service = RateLimit<S, M>;

    fn layer(&self, inner: S) -> RateLimit<S, M> {
        RateLimit::new(inner, Arc::clone(&self.state))
    }
}

/// A local limit where a [`Remote`] one is expected: for a program that chooses at run
/// time between a local limit and one kept in Redis, and keeps either in one type. It still
/// decides in `call`; its services need a `Clone` inner service, as every `Remote` one does.
#[cfg(feature = "redis")]
impl From<RateLimitLayer<Local>> for RateLimitLayer<Remote> {
    fn from(layer: RateLimitLayer<Local>) -> Self {
        Self {
            state: layer.state,
            mode: PhantomData,
        }
    }
}

/// Builds a [`RateLimitLayer`]; from [`RateLimitLayer::builder`].
///
/// Its type parameters are the limiter `L`, the clock `C` (set with
/// [`clock`](Self::clock)) and the key extractor `E` (set with [`key_by`](Self::key_by);
/// [`NoKey`] for one global limit).
#[must_use]
pub struct RateLimitBuilder<L, C = TokioClock, E = NoKey> {
    pub(crate) limiter: L,
    pub(crate) clock: C,
    pub(crate) key: Option<E>,
    pub(crate) max_keys: usize,
    pub(crate) sweep_interval: Duration,
    /// Whether `max_keys` or `sweep_interval` was set: refused on a limit without a key.
    pub(crate) keyed_settings: bool,
    pub(crate) cost: Option<RequestCost>,
    pub(crate) name: String,
    /// Whether `name` was called (a Redis builder refuses a second name).
    pub(crate) name_set: bool,
    pub(crate) admitted_headers: bool,
    pub(crate) missing_key: Option<MissingKey>,
    pub(crate) reserves: Reserves,
}

impl<L: Limiter, C: Clock, E: KeyExtractor> RateLimitBuilder<L, C, E> {
    /// Where the limiter reads the time. Default: [`TokioClock`], which follows tokio's
    /// paused time in tests; `FakeClock` (feature `test-util`) moves only when told to.
    ///
    /// [`TokioClock`]: crate::clock::TokioClock
    pub fn clock<C2: Clock>(self, clock: C2) -> RateLimitBuilder<L, C2, E> {
        RateLimitBuilder {
            limiter: self.limiter,
            clock,
            key: self.key,
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            keyed_settings: self.keyed_settings,
            cost: self.cost,
            name: self.name,
            name_set: self.name_set,
            admitted_headers: self.admitted_headers,
            missing_key: self.missing_key,
            reserves: self.reserves,
        }
    }

    /// Limits each key that `extract` returns separately: a [`ClientIp`], a
    /// [`HeaderKey`], a closure `|parts: &Parts| -> Option<K>`, or a [`KeyExtractor`] of
    /// your own. Requests without a key follow the [`missing_key`](Self::missing_key)
    /// policy. Default: one global limit.
    ///
    /// Keep keys small: the key cap bounds their number, not the heap they own.
    pub fn key_by<E2: KeyExtractor>(self, extract: E2) -> RateLimitBuilder<L, C, E2> {
        RateLimitBuilder {
            limiter: self.limiter,
            clock: self.clock,
            key: Some(extract),
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            keyed_settings: self.keyed_settings,
            cost: self.cost,
            name: self.name,
            name_set: self.name_set,
            admitted_headers: self.admitted_headers,
            missing_key: self.missing_key,
            reserves: self.reserves,
        }
    }

    /// Limits each client IP address separately; see [`ClientIp`] for where the address
    /// comes from and how proxies are trusted. The same as `key_by(client_ip)`. Default:
    /// one global limit.
    pub fn key_by_client_ip(self, client_ip: ClientIp) -> RateLimitBuilder<L, C, ClientIp> {
        self.key_by(client_ip)
    }

    /// Limits each value of header `name` (an API key, a tenant id) separately; see
    /// [`HeaderKey`]. Requests without it share one limit, unless
    /// [`missing_key`](Self::missing_key) says otherwise. The same as
    /// `key_by(HeaderKey::new(name))`. Default: one global limit.
    pub fn key_by_header(self, name: HeaderName) -> RateLimitBuilder<L, C, HeaderKey> {
        self.key_by(HeaderKey::new(name))
    }

    /// What a keyed limit does with a request its extractor finds no key in: answer `500`
    /// ([`MissingKey::Reject`]), limit all such requests together ([`MissingKey::Shared`]),
    /// or admit them unlimited ([`MissingKey::Bypass`]). The first such request is logged
    /// whatever the policy (at `ERROR`, with the fix, for a [`ClientIp`] key: the server does
    /// not put the peer address in its requests; at `WARN` otherwise), and
    /// `ratelimit_layer_missing_key_total` counts them.
    ///
    /// Default: the extractor's own ([`KeyExtractor::missing_key`]): `Reject` for
    /// [`ClientIp`] and closures (a missing peer address means the server does not provide
    /// it, and every client would otherwise share one bucket), `Shared` for [`HeaderKey`] (a
    /// client may send no API key).
    ///
    /// Only for a keyed limit: [`build`](Self::build) refuses it without
    /// [`key_by`](Self::key_by).
    pub const fn missing_key(mut self, policy: MissingKey) -> Self {
        self.missing_key = Some(policy);
        self
    }

    /// The cap on tracked keys of a keyed limit; see [`KeyedLimiter`] for what happens at
    /// the cap. A keyed limit's setting: refused on a limit without a key. Default: 100 000
    /// ([`RateLimitLayer::DEFAULT_MAX_KEYS`]).
    pub const fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self.keyed_settings = true;
        self
    }

    /// How often a shard of the key map sweeps idle keys. A keyed limit's setting: refused
    /// on a limit without a key. Default: one second
    /// ([`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`]).
    pub const fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self.keyed_settings = true;
        self
    }

    /// The cost (weight) of every request. Default: 1 ([`RateLimitLayer::DEFAULT_COST`]).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = Some(RequestCost::Fixed(cost));
        self
    }

    /// The cost (weight) of each request, from its head: heavier requests take more of
    /// the quota. A cost of 0 is always admitted. A cost above the limiter's
    /// [capacity](Limiter::capacity) (its burst, or its quota) can never be admitted, so it
    /// is not answered as a rejection to retry: HTTP `413 Content Too Large` with the
    /// `RateLimit-Policy` field and no `Retry-After` (gRPC `INVALID_ARGUMENT`), marked
    /// `RejectionKind::ExceedsCapacity`. Default: 1 for every request.
    pub fn cost_by<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(RequestCost::By(Box::new(cost)));
        self
    }

    /// What the layer calls itself: the `name` label of its metrics, the `name` field of
    /// its logs, and the policy name of its `RateLimit-Policy` and `RateLimit` fields on the
    /// wire (`RateLimit-Policy: "api";q=100;w=1`); with Redis, also part of its keys, so
    /// processes that share a limit share its name. Non-empty printable ASCII, at most 128
    /// bytes. Default: `default` ([`RateLimitLayer::DEFAULT_NAME`]); name your layers when
    /// a process has more than one rate limit, so their metrics and logs are told apart.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self.name_set = true;
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` too (`429`
    /// rejections always do). Default: `false`, because writing the `RateLimit` field costs an
    /// allocation per admitted request.
    pub const fn admitted_headers(mut self, enabled: bool) -> Self {
        self.admitted_headers = enabled;
        self
    }

    /// The share of the limit's [capacity](Limiter::capacity) each level of criticality may
    /// not take while a higher level is active: how the limit sheds from the bottom.
    /// Default: [`Reserves::new`] (sheddable 0.5, sheddable-plus 0.25, critical 0.1,
    /// critical-plus 0); [`Reserves::none`] limits every level alike, exactly as a limit
    /// without criticality.
    ///
    /// A request's level is the `Criticality` in its extensions (put there by
    /// `overload_signal::criticality::CriticalityLayer`, outside this layer, which reads
    /// the `X-Request-Criticality` header with its trust cap); without one it is critical.
    /// For every request the layer notes its level in a `RecentLevels` of its own (which
    /// levels came within the last 10 seconds, `RecentLevels::DEFAULT_WINDOW`), then admits
    /// a request of level `c` only if, once its cost is taken, at least `share(c) ×
    /// capacity` units (rounded up) are still free, and only while a higher level has been
    /// seen within the window; otherwise it is rejected like any other (`429` with
    /// `Retry-After` and the `RateLimit` fields), and nothing is taken. Traffic of one level
    /// is therefore limited exactly as with `Reserves::none()`. A keyed limit has one
    /// `RecentLevels` for the layer, all keys together: a critical request on any key holds
    /// back a share of every key's capacity from the sheddable requests.
    ///
    /// What that guarantees depends on the algorithm; each says it in its docs
    /// ([`TokenBucket`](crate::TokenBucket), [`FixedWindow`](crate::FixedWindow),
    /// [`SlidingWindow`](crate::SlidingWindow)). The `Retry-After` of a request refused for
    /// the held-back share is the time until a request of its level would be admitted with
    /// the share still held back; if its cost and the share together exceed the capacity
    /// (no wait frees that much), at least the 10 s window, by when the higher levels will
    /// have gone quiet if they stop now.
    ///
    /// A limit kept in Redis ([`redis`](Self::redis)) applies the same rule there: the
    /// held-back units (of the fleet's capacity) go to the script with the request, in the
    /// same round trip, and its local fallback applies them to the local share while Redis
    /// is away; one `RecentLevels` serves both. A request with units held back never takes
    /// from the local reservation ([`reservation`](crate::redis::RedisLayerBuilder::reservation)):
    /// it asks Redis, which knows what is left.
    ///
    /// ```
    /// use overload_signal::criticality::Reserves;
    /// use overload_signal::protocol::Criticality;
    /// use ratelimit_layer::{RateLimitLayer, TokenBucket};
    ///
    /// // Sheddable requests leave 80% of the burst to the others while they are active.
    /// let reserves = Reserves::builder()
    ///     .share(Criticality::Sheddable, 0.8)
    ///     .build()?;
    /// let layer = RateLimitLayer::builder(TokenBucket::new(100)?)
    ///     .reserves(reserves)
    ///     .build()?;
    /// // Class-blind, as before criticality.
    /// let blind = RateLimitLayer::builder(TokenBucket::new(100)?)
    ///     .reserves(Reserves::none())
    ///     .build()?;
    /// # let _ = (layer, blind);
    /// # Ok::<(), ratelimit_layer::ConfigError>(())
    /// ```
    pub const fn reserves(mut self, reserves: Reserves) -> Self {
        self.reserves = reserves;
        self
    }

    /// Builds the layer.
    ///
    /// Metrics are registered with the `metrics` recorder on the layer's first request, so
    /// the recorder may be installed after the layer is built, as long as it is before
    /// traffic.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting, when:
    ///
    /// - a fixed `cost` exceeds the limiter's capacity (its burst or quota), so no request
    ///   could ever be admitted (kind `Conflict`);
    /// - `missing_key`, `max_keys` or `sweep_interval` is set on a limit without a key (kind
    ///   `Conflict`): it would do nothing;
    /// - `name` is empty, longer than 128 bytes, or not printable ASCII (kind `Invalid`);
    /// - `max_keys` or `sweep_interval` is zero (kind `OutOfRange`).
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        Ok(RateLimitLayer::from_state(self.into_state()?))
    }

    /// What [`build`](Self::build) builds, for a layer of either kind.
    pub(crate) fn into_state(self) -> Result<RateLimitState, ConfigError> {
        if let Some(RequestCost::Fixed(cost)) = self.cost {
            let capacity = self.limiter.capacity();
            if u64::from(cost) > capacity {
                return Err(ConfigError::conflict(
                    "cost",
                    format_args!(
                        "cost ({cost}) must not exceed the limiter's capacity ({capacity}, its \
                         burst or quota): no such request could ever be admitted"
                    ),
                ));
            }
        }
        let name = LayerName::new(self.name)?;
        let policy = rate_limit_policy(&name, &self.limiter)?;
        let window = self.limiter.window();
        let decide: Box<dyn LocalDecide> = match self.key {
            None => {
                // NOTE: checked without a key too, so that a setting is refused whatever the key.
                keyed::check_settings(self.max_keys, self.sweep_interval)?;
                if let Some(policy) = self.missing_key {
                    return Err(ConfigError::conflict(
                        "missing_key",
                        format_args!(
                            "missing_key ({policy:?}) applies to a keyed limit only; set \
                             key_by too, or leave missing_key out"
                        ),
                    ));
                }
                if self.keyed_settings {
                    return Err(ConfigError::conflict(
                        "max_keys",
                        "max_keys and sweep_interval apply to a keyed limit only; set key_by \
                         too, or leave them out",
                    ));
                }
                Box::new(GlobalDecider {
                    limiter: self.limiter,
                    clock: self.clock,
                    state: L::State::default(),
                    shed: Shedding::new(self.reserves),
                })
            }
            Some(extract) => Box::new(KeyedDecider {
                map: KeyedLimiter::builder(self.limiter)
                    .clock(self.clock)
                    .max_keys(self.max_keys)
                    .sweep_interval(self.sweep_interval)
                    .build()?,
                missing: Arc::new(MissingKeyPolicy::new(
                    self.missing_key.unwrap_or_else(|| extract.missing_key()),
                    LazyMetrics::new(name.clone()),
                    // NOTE: a client-IP key is missing only when the request carries no peer
                    // address, which no client can cause: the server is set up wrong, and
                    // the log says so at `ERROR` with the fix.
                    (&extract as &dyn std::any::Any).is::<ClientIp>(),
                )),
                extract,
                unkeyed: L::State::default(),
                shed: Shedding::new(self.reserves),
            }),
        };
        let cost = self
            .cost
            .unwrap_or(RequestCost::Fixed(RateLimitLayer::DEFAULT_COST));
        Ok(RateLimitState::new(
            decide,
            cost,
            policy,
            name,
            self.admitted_headers,
            window,
            RateLimitLayer::QUIET_PERIOD,
        ))
    }
}

impl<L: Limiter + fmt::Debug, C: fmt::Debug, E> fmt::Debug for RateLimitBuilder<L, C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cost: &dyn fmt::Debug = match &self.cost {
            None => &RateLimitLayer::DEFAULT_COST,
            Some(RequestCost::Fixed(cost)) => cost,
            Some(RequestCost::By(_)) => &"by request",
        };
        f.debug_struct("RateLimitBuilder")
            .field("limiter", &self.limiter)
            .field("clock", &self.clock)
            .field("keyed", &self.key.is_some())
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .field("cost", cost)
            .field("name", &self.name)
            .field("admitted_headers", &self.admitted_headers)
            .field("missing_key", &self.missing_key)
            .field("reserves", &self.reserves)
            .finish_non_exhaustive()
    }
}
