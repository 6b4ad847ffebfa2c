//! The Tower layer: [`RateLimitLayer`] and [`RateLimit`].

mod future;
mod service;

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderName;
use http::request::Parts;
use metrics::Counter;
use overload_signal::ConfigError;
use overload_signal::protocol::RateLimitPolicy;
use tower_layer::Layer;

pub use future::ResponseFuture;
pub use service::RateLimit;

use crate::algorithm::{Decision, InvalidLimit, Limiter, QuotaStatus};
use crate::clock::{Clock, RealClock};
use crate::key::{ClientIp, header_value};
use crate::keyed::{DEFAULT_MAX_KEYS, DEFAULT_SWEEP_INTERVAL, KeyClass, KeyedLimiter};

/// Metric: counter of admitted requests, labelled `policy`.
pub const METRIC_ADMITTED: &str = "ratelimit_layer_requests_admitted_total";
/// Metric: counter of rejected requests, labelled `policy` and `key_class` (`global`,
/// `keyed`, `overflow` or `unkeyed`, see [`KeyClass`]).
pub const METRIC_REJECTED: &str = "ratelimit_layer_requests_rejected_total";
/// Metric: gauge of keys tracked by a keyed layer, labelled `policy`.
pub const METRIC_KEYS: &str = "ratelimit_layer_keys";

/// The default policy name written in the `RateLimit-Policy` and `RateLimit` fields:
/// `default` (the name the IETF draft's examples use).
pub const DEFAULT_POLICY_NAME: &str = "default";

/// Why a [`RateLimitLayer`] could not be built.
///
/// The rules: the limiter's own ([`InvalidLimit`]); a fixed cost no larger than the
/// limiter's capacity ([`InvalidLimit::CostExceedsCapacity`]); a valid policy name (non-empty
/// printable ASCII, a [`ConfigError`] from [`RateLimitPolicy::new`]); a key cap of at least one
/// ([`ZeroMaxKeys`](Self::ZeroMaxKeys)); a burst only with the token bucket
/// ([`BurstWithWindow`](Self::BurstWithWindow)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidConfig {
    /// The limiter's parameters or the request cost.
    Limit(InvalidLimit),
    /// The policy name.
    Policy(ConfigError),
    /// A keyed limit with room for no key.
    ZeroMaxKeys,
    /// A burst was given for a window algorithm, which has none (its quota is the rate).
    BurstWithWindow,
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limit(e) => e.fmt(f),
            Self::Policy(e) => e.fmt(f),
            Self::ZeroMaxKeys => f.write_str("rate limit max keys must not be zero"),
            Self::BurstWithWindow => f.write_str(
                "rate limit burst applies to the token bucket only; windows admit the rate per window",
            ),
        }
    }
}

impl std::error::Error for InvalidConfig {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Limit(e) => Some(e),
            Self::Policy(e) => Some(e),
            Self::ZeroMaxKeys | Self::BurstWithWindow => None,
        }
    }
}

impl From<InvalidLimit> for InvalidConfig {
    fn from(e: InvalidLimit) -> Self {
        Self::Limit(e)
    }
}

impl From<ConfigError> for InvalidConfig {
    fn from(e: ConfigError) -> Self {
        Self::Policy(e)
    }
}

/// Decides a request: the limiter with its state(s) and key extractor, type-erased.
trait Decide: Send + Sync + 'static {
    /// The decision, the quota status when a rejection (always) or an admission (when
    /// `status_on_allow`) needs it for the `RateLimit` field, and the key class.
    fn decide(
        &self,
        parts: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass);
}

/// `limiter.check`, plus its status when the response will report it.
#[inline]
fn check_and_status<L: Limiter>(
    limiter: &L,
    state: &L::State,
    now: u64,
    cost: u32,
    status_on_allow: bool,
) -> (Decision, Option<QuotaStatus>) {
    let decision = limiter.check(state, now, cost);
    let want = !decision.is_allowed() || status_on_allow;
    (decision, want.then(|| limiter.status(state, now)))
}

struct Global<L: Limiter, C> {
    limiter: L,
    clock: C,
    state: L::State,
}

impl<L: Limiter, C: Clock> Decide for Global<L, C> {
    #[inline]
    fn decide(
        &self,
        _: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass) {
        let now = self.clock.now();
        let (decision, status) =
            check_and_status(&self.limiter, &self.state, now, cost, status_on_allow);
        (decision, status, KeyClass::Global)
    }
}

struct Keyed<L: Limiter, K, C, F> {
    map: KeyedLimiter<L, K, C>,
    extract: F,
    unkeyed: L::State,
}

impl<L, K, C, F> Decide for Keyed<L, K, C, F>
where
    L: Limiter,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
{
    #[inline]
    fn decide(
        &self,
        parts: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> (Decision, Option<QuotaStatus>, KeyClass) {
        match (self.extract)(parts) {
            Some(key) => self.map.check_with_status(&key, cost, status_on_allow),
            None => {
                let now = self.map.clock().now();
                let (decision, status) = check_and_status(
                    self.map.limiter(),
                    &self.unkeyed,
                    now,
                    cost,
                    status_on_allow,
                );
                (decision, status, KeyClass::Unkeyed)
            }
        }
    }
}

type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

/// The layer's counters, registered with the `metrics` recorder on first use (the first
/// request), so that a recorder installed after the layer was built still receives them.
pub(crate) struct Metrics {
    policy: String,
    handles: OnceLock<Handles>,
}

struct Handles {
    admitted: Counter,
    rejected: [Counter; 4],
}

impl Metrics {
    fn new(policy: &str) -> Self {
        Self {
            policy: policy.to_owned(),
            handles: OnceLock::new(),
        }
    }

    #[inline]
    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let policy = &self.policy;
            let rejected = |class: KeyClass| {
                metrics::counter!(METRIC_REJECTED, "policy" => policy.clone(), "key_class" => class.as_str())
            };
            Handles {
                admitted: metrics::counter!(METRIC_ADMITTED, "policy" => policy.clone()),
                // NOTE: in the declaration order of `KeyClass`; `rejected` indexes by it.
                rejected: [
                    rejected(KeyClass::Global),
                    rejected(KeyClass::Keyed),
                    rejected(KeyClass::Overflow),
                    rejected(KeyClass::Unkeyed),
                ],
            }
        })
    }

    #[inline]
    pub(crate) fn admitted(&self) -> &Counter {
        &self.handles().admitted
    }

    #[inline]
    pub(crate) fn rejected(&self, class: KeyClass) -> &Counter {
        &self.handles().rejected[class as usize]
    }
}

/// What every clone of a layer and its services shares.
pub(crate) struct Shared {
    decide: Box<dyn Decide>,
    fixed_cost: u32,
    cost_fn: Option<Box<CostFn>>,
    pub(crate) policy: RateLimitPolicy,
    pub(crate) admitted_headers: bool,
    /// The limiter's window: the `Retry-After` of an over-capacity request.
    pub(crate) window: Duration,
    pub(crate) metrics: Metrics,
}

impl Shared {
    #[inline]
    pub(crate) fn cost(&self, parts: &Parts) -> u32 {
        match &self.cost_fn {
            Some(f) => f(parts),
            None => self.fixed_cost,
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("policy", &self.policy)
            .field("fixed_cost", &self.fixed_cost)
            .field("admitted_headers", &self.admitted_headers)
            .finish_non_exhaustive()
    }
}

/// Applies [`RateLimit`] to a service; see the [crate docs](crate).
///
/// Cheap to clone: clones (and the services they make) share the same limits.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// One global limit with the defaults: cost 1 per request, policy name `default`, no
    /// `RateLimit` fields on admitted responses.
    ///
    /// # Errors
    ///
    /// None in practice with these defaults; the `Result` is that of
    /// [`RateLimitBuilder::build`].
    pub fn new<L: Limiter>(limiter: L) -> Result<Self, InvalidConfig> {
        Self::builder(limiter).build()
    }

    /// A builder for a limit with `limiter`, on the real clock.
    pub fn builder<L: Limiter>(limiter: L) -> RateLimitBuilder<L> {
        Self::builder_with_clock(limiter, RealClock::new())
    }

    /// A builder for a limit with `limiter`, reading time from `clock` (a
    /// [`FakeClock`](crate::FakeClock) in tests).
    pub fn builder_with_clock<L: Limiter, C: Clock>(
        limiter: L,
        clock: C,
    ) -> RateLimitBuilder<L, C> {
        RateLimitBuilder {
            limiter,
            clock,
            key: None,
            max_keys: DEFAULT_MAX_KEYS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            cost: 1,
            cost_fn: None,
            policy_name: DEFAULT_POLICY_NAME.to_owned(),
            admitted_headers: false,
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}

/// Everything a keyed limit needs to build its [`Decide`], given the limiter and clock.
type KeySetup<L, C> = Box<dyn FnOnce(L, C, usize, Duration, &str) -> Box<dyn Decide> + Send>;

/// Builds a [`RateLimitLayer`]; from [`RateLimitLayer::builder`].
pub struct RateLimitBuilder<L: Limiter, C = RealClock> {
    limiter: L,
    clock: C,
    key: Option<KeySetup<L, C>>,
    max_keys: usize,
    sweep_interval: Duration,
    cost: u32,
    cost_fn: Option<Box<CostFn>>,
    policy_name: String,
    admitted_headers: bool,
}

impl<L: Limiter, C: Clock> RateLimitBuilder<L, C> {
    /// Limits each client IP address separately; see [`ClientIp`] for where the address
    /// comes from and how proxies are trusted. Default: one global limit.
    #[must_use]
    pub fn key_by_client_ip(self, client_ip: ClientIp) -> Self {
        self.key_by(move |parts: &Parts| client_ip.client_ip(parts))
    }

    /// Limits each value of header `name` (an API key, a tenant id) separately; see
    /// [`header_value`]. Requests without it share one limit. Default: one global limit.
    #[must_use]
    pub fn key_by_header(self, name: HeaderName) -> Self {
        self.key_by(header_value(name))
    }

    /// Limits each key that `extract` returns separately; requests for which it returns
    /// `None` share one limit. Default: one global limit.
    ///
    /// Keep keys small: the key cap bounds their number, not the heap they own.
    #[must_use]
    pub fn key_by<K, F>(mut self, extract: F) -> Self
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    {
        self.key = Some(Box::new(
            move |limiter, clock, max_keys, sweep, policy: &str| {
                Box::new(Keyed {
                    map: KeyedLimiter::with_clock(limiter, clock, max_keys)
                        .sweep_interval(sweep)
                        .report_keys(policy),
                    extract,
                    unkeyed: L::State::default(),
                })
            },
        ));
        self
    }

    /// The cap on tracked keys of a keyed limit; see [`KeyedLimiter`] for what happens at
    /// the cap. Default: [`DEFAULT_MAX_KEYS`] (100 000).
    #[must_use]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How often a shard of the key map sweeps idle keys. Default:
    /// [`DEFAULT_SWEEP_INTERVAL`] (one second).
    #[must_use]
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// The cost (weight) of every request. Default: 1.
    #[must_use]
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self.cost_fn = None;
        self
    }

    /// The cost (weight) of each request, from its head: heavier requests take more of
    /// the quota. A cost of 0 is always admitted. A cost above the limiter's
    /// [capacity](Limiter::capacity) can never be admitted: it is rejected like any other,
    /// with `Retry-After` set to the limiter's window. Default: 1 for every request.
    #[must_use]
    pub fn cost_by<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost_fn = Some(Box::new(cost));
        self
    }

    /// The policy name written in `RateLimit-Policy` and `RateLimit`, and the `policy`
    /// label of the metrics. Default: [`DEFAULT_POLICY_NAME`] (`default`).
    #[must_use]
    pub fn policy_name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.policy_name);
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` too (rejections
    /// always do). Default: `false`, because writing the fields costs an allocation per
    /// admitted request.
    #[must_use]
    pub fn admitted_headers(mut self, enabled: bool) -> Self {
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
    /// A fixed cost above the limiter's capacity, an invalid policy name, or a zero key
    /// cap on a keyed limit; see [`InvalidConfig`].
    pub fn build(self) -> Result<RateLimitLayer, InvalidConfig> {
        if self.cost_fn.is_none() && u64::from(self.cost) > self.limiter.capacity() {
            return Err(InvalidLimit::CostExceedsCapacity {
                cost: self.cost,
                capacity: self.limiter.capacity(),
            }
            .into());
        }
        let policy = RateLimitPolicy::new(
            &self.policy_name,
            self.limiter.quota(),
            self.limiter.window(),
        )?;
        let window = self.limiter.window();
        let decide: Box<dyn Decide> = match self.key {
            None => Box::new(Global {
                limiter: self.limiter,
                clock: self.clock,
                state: L::State::default(),
            }),
            Some(setup) => {
                if self.max_keys == 0 {
                    return Err(InvalidConfig::ZeroMaxKeys);
                }
                setup(
                    self.limiter,
                    self.clock,
                    self.max_keys,
                    self.sweep_interval,
                    &self.policy_name,
                )
            }
        };
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                decide,
                fixed_cost: self.cost,
                cost_fn: self.cost_fn,
                metrics: Metrics::new(&self.policy_name),
                policy,
                admitted_headers: self.admitted_headers,
                window,
            }),
        })
    }
}

impl<L: Limiter + fmt::Debug, C: fmt::Debug> fmt::Debug for RateLimitBuilder<L, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitBuilder")
            .field("limiter", &self.limiter)
            .field("clock", &self.clock)
            .field("keyed", &self.key.is_some())
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .field("cost", &self.cost)
            .field("policy_name", &self.policy_name)
            .field("admitted_headers", &self.admitted_headers)
            .finish_non_exhaustive()
    }
}
