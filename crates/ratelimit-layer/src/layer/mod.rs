//! The Tower layer: [`RateLimitLayer`], its builder, and what its services share.

#[cfg(feature = "redis")]
mod redis;
pub(crate) mod remote;
mod service;
pub(crate) mod shared;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::request::Parts;
use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use tower_layer::Layer;

#[cfg(feature = "redis")]
pub use redis::RedisLayerBuilder;
pub use service::RateLimit;
pub(crate) use service::respond;

use self::shared::{Cost, Decide, Global, Keyed, MissingKeyPolicy, Shared, policy};
use crate::algorithm::Limiter;
use crate::key::{ClientIp, HeaderKey, KeyExtractor, MissingKey, NoKey};
use crate::keyed::{self, KeyedLimiter};

/// Applies [`RateLimit`] to a service; see the [crate docs](crate).
///
/// Cheap to clone: clones (and the services they make) share the same limits.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::{RateLimitLayer, SlidingWindow, TokenBucket};
///
/// // The defaults: one global limit, cost 1 per request, policy `default`.
/// let layer = RateLimitLayer::new(TokenBucket::new(100)?);
///
/// // Customised: per client IP, heavier POSTs, a named policy on every response.
/// let layer = RateLimitLayer::builder(
///     SlidingWindow::builder(600).window(Duration::from_secs(60)).build()?,
/// )
/// .key_by_client_ip(ratelimit_layer::key::ClientIp::new())
/// .cost_by(|parts| if parts.method == http::Method::POST { 10 } else { 1 })
/// .policy_name("api")
/// .admitted_headers(true)
/// .build()?;
/// # let _ = layer;
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// The default policy name written in the `RateLimit-Policy` and `RateLimit` fields and
    /// in the metrics' `policy` label: `default`, the name the IETF draft's examples use.
    pub const DEFAULT_POLICY_NAME: &'static str = "default";

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
    /// interval, only when a new key arrives in that shard; the figure is this crate's
    /// choice.
    pub const DEFAULT_SWEEP_INTERVAL: Duration = keyed::DEFAULT_SWEEP_INTERVAL;

    /// One global limit with `limiter` and the defaults: cost 1 per request, policy name
    /// `default`, no `RateLimit` fields on admitted responses, time from [`TokioClock`].
    ///
    /// [`TokioClock`]: https://docs.rs/overload-signal/0.1/overload_signal/clock/struct.TokioClock.html
    pub fn new<L: Limiter>(limiter: L) -> Self {
        // NOTE: the default name is valid printable ASCII (every test that calls `new` builds
        // it), and `policy` accepts every window, so this cannot fail.
        let policy = policy(Self::DEFAULT_POLICY_NAME, &limiter)
            .expect("the default policy name is a valid structured field string");
        let window = limiter.window();
        let decide = Box::new(Global {
            limiter,
            clock: TokioClock::new(),
            state: L::State::default(),
        });
        Self {
            shared: Arc::new(Shared::new(
                decide,
                Cost::Fixed(Self::DEFAULT_COST),
                policy,
                Self::DEFAULT_POLICY_NAME,
                false,
                window,
            )),
        }
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
            cost: None,
            policy_name: Self::DEFAULT_POLICY_NAME.to_owned(),
            admitted_headers: false,
            missing_key: None,
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}

/// Builds a [`RateLimitLayer`]; from [`RateLimitLayer::builder`].
///
/// Its type parameters are the limiter `L`, the clock `C` (set with
/// [`clock`](Self::clock)) and the key extractor `E` (set with [`key_by`](Self::key_by);
/// [`NoKey`] for one global limit).
#[must_use]
pub struct RateLimitBuilder<L, C = TokioClock, E = NoKey> {
    limiter: L,
    clock: C,
    key: Option<E>,
    max_keys: usize,
    sweep_interval: Duration,
    cost: Option<Cost>,
    policy_name: String,
    admitted_headers: bool,
    missing_key: Option<MissingKey>,
}

impl<L: Limiter, C: Clock, E: KeyExtractor> RateLimitBuilder<L, C, E> {
    /// Where the limiter reads the time. Default: [`TokioClock`], which follows tokio's
    /// paused time in tests; `FakeClock` (feature `test-util`) moves only when told to.
    ///
    /// [`TokioClock`]: https://docs.rs/overload-signal/0.1/overload_signal/clock/struct.TokioClock.html
    pub fn clock<C2: Clock>(self, clock: C2) -> RateLimitBuilder<L, C2, E> {
        RateLimitBuilder {
            limiter: self.limiter,
            clock,
            key: self.key,
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            cost: self.cost,
            policy_name: self.policy_name,
            admitted_headers: self.admitted_headers,
            missing_key: self.missing_key,
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
            cost: self.cost,
            policy_name: self.policy_name,
            admitted_headers: self.admitted_headers,
            missing_key: self.missing_key,
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
    /// or admit them unlimited ([`MissingKey::Bypass`]). The first such request is logged at
    /// `WARN` whatever the policy, and `ratelimit_layer_missing_key_total` counts them.
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
    /// the cap. Default: 100 000 ([`RateLimitLayer::DEFAULT_MAX_KEYS`]).
    pub const fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How often a shard of the key map sweeps idle keys. Default: one second
    /// ([`RateLimitLayer::DEFAULT_SWEEP_INTERVAL`]).
    pub const fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// The cost (weight) of every request. Default: 1 ([`RateLimitLayer::DEFAULT_COST`]).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = Some(Cost::Fixed(cost));
        self
    }

    /// The cost (weight) of each request, from its head: heavier requests take more of
    /// the quota. A cost of 0 is always admitted. A cost above the limiter's
    /// [capacity](Limiter::capacity) can never be admitted: it is rejected like any other,
    /// with `Retry-After` set to the limiter's window. Default: 1 for every request.
    pub fn cost_by<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(Cost::By(Box::new(cost)));
        self
    }

    /// The policy name written in `RateLimit-Policy` and `RateLimit`, and the `policy`
    /// label of the metrics. Default: `default` ([`RateLimitLayer::DEFAULT_POLICY_NAME`]).
    pub fn policy_name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.policy_name);
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` too (rejections
    /// always do). Default: `false`, because writing the `RateLimit` field costs an
    /// allocation per admitted request.
    pub const fn admitted_headers(mut self, enabled: bool) -> Self {
        self.admitted_headers = enabled;
        self
    }

    /// Builds the layer.
    ///
    /// Metrics are registered with the `metrics` recorder on the first request, so the
    /// recorder may be installed after the layer is built, as long as it is before traffic.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting, when:
    ///
    /// - a fixed `cost` exceeds the limiter's capacity (its burst or quota), so no request
    ///   could ever be admitted (kind `Conflict`);
    /// - `missing_key` is set on a limit without a key (kind `Conflict`);
    /// - `policy_name` is empty or not printable ASCII (kind `Invalid`);
    /// - `max_keys` or `sweep_interval` is zero (kind `OutOfRange`).
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if let Some(Cost::Fixed(cost)) = self.cost {
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
        let policy = policy(&self.policy_name, &self.limiter)?;
        let window = self.limiter.window();
        let decide: Box<dyn Decide> = match self.key {
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
                Box::new(Global {
                    limiter: self.limiter,
                    clock: self.clock,
                    state: L::State::default(),
                })
            }
            Some(extract) => Box::new(Keyed {
                map: KeyedLimiter::builder(self.limiter)
                    .clock(self.clock)
                    .max_keys(self.max_keys)
                    .sweep_interval(self.sweep_interval)
                    .report_keys(&self.policy_name)
                    .build()?,
                missing: Arc::new(MissingKeyPolicy::new(
                    self.missing_key.unwrap_or_else(|| extract.missing_key()),
                    &self.policy_name,
                )),
                extract,
                unkeyed: L::State::default(),
            }),
        };
        let cost = self
            .cost
            .unwrap_or(Cost::Fixed(RateLimitLayer::DEFAULT_COST));
        Ok(RateLimitLayer {
            shared: Arc::new(Shared::new(
                decide,
                cost,
                policy,
                &self.policy_name,
                self.admitted_headers,
                window,
            )),
        })
    }
}

impl<L: Limiter + fmt::Debug, C: fmt::Debug, E> fmt::Debug for RateLimitBuilder<L, C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cost: &dyn fmt::Debug = match &self.cost {
            None => &RateLimitLayer::DEFAULT_COST,
            Some(Cost::Fixed(cost)) => cost,
            Some(Cost::By(_)) => &"by request",
        };
        f.debug_struct("RateLimitBuilder")
            .field("limiter", &self.limiter)
            .field("clock", &self.clock)
            .field("keyed", &self.key.is_some())
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .field("cost", cost)
            .field("policy_name", &self.policy_name)
            .field("admitted_headers", &self.admitted_headers)
            .field("missing_key", &self.missing_key)
            .finish_non_exhaustive()
    }
}
