//! What a layer and its services share: the type-erased decision, the cost, the formatted
//! `RateLimit-Policy` value and the metric handles.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderValue;
use http::request::Parts;
use metrics::Counter;
use overload_core::clock::Clock;
use overload_core::{ConfigError, ConfigErrorKind};
use overload_signal::protocol::RateLimitPolicy;

use super::remote::RemoteDecide;
use crate::algorithm::{Decision, Limiter, QuotaStatus};
use crate::key::{KeyExtractor, MissingKey};
use crate::keyed::{KeyClass, KeyedLimiter};
use crate::metric_names;

/// Decides a request: the limiter with its state(s) and key extractor, type-erased.
pub(super) trait Decide: Send + Sync + 'static {
    /// The decision, the quota status when a rejection (always) or an admission (when
    /// `status_on_allow`) needs it for the `RateLimit` field, and the key class; `None` when
    /// the request has no key and the [`MissingKey`] policy is to reject it.
    fn decide(
        &self,
        parts: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)>;

    /// The missing-key policy of a keyed limit, shared with a remote decider so that both
    /// apply (and log, and count) the same one.
    fn missing_key_policy(&self) -> Option<Arc<MissingKeyPolicy>> {
        None
    }
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

pub(super) struct Global<L: Limiter, C> {
    pub(super) limiter: L,
    pub(super) clock: C,
    pub(super) state: L::State,
}

impl<L: Limiter, C: Clock> Decide for Global<L, C> {
    #[inline]
    fn decide(
        &self,
        _: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        let now = self.clock.now();
        let (decision, status) =
            check_and_status(&self.limiter, &self.state, now, cost, status_on_allow);
        Some((decision, status, KeyClass::Global))
    }
}

pub(super) struct Keyed<L: Limiter, C, E: KeyExtractor> {
    pub(super) map: KeyedLimiter<L, E::Key, C>,
    pub(super) extract: E,
    pub(super) unkeyed: L::State,
    pub(super) missing: Arc<MissingKeyPolicy>,
}

/// The [`MissingKey`] policy of a keyed layer, with its one-time log and its counter.
pub(crate) struct MissingKeyPolicy {
    policy: MissingKey,
    name: String,
    warned: AtomicBool,
    counter: OnceLock<Counter>,
}

impl MissingKeyPolicy {
    pub(super) fn new(policy: MissingKey, name: &str) -> Self {
        Self {
            policy,
            name: name.to_owned(),
            warned: AtomicBool::new(false),
            counter: OnceLock::new(),
        }
    }

    /// The policy, without applying it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn policy(&self) -> MissingKey {
        self.policy
    }

    /// Counts a request without a key, logs the first one, and says what to do with it.
    pub(crate) fn apply(&self) -> MissingKey {
        self.counter
            .get_or_init(|| {
                metrics::counter!(
                    metric_names::MISSING_KEY,
                    "policy" => self.name.clone(),
                    "action" => self.policy.as_str()
                )
            })
            .increment(1);
        if !self.warned.load(Ordering::Relaxed) && !self.warned.swap(true, Ordering::Relaxed) {
            self.warn();
        }
        self.policy
    }

    #[cold]
    fn warn(&self) {
        let action = match self.policy {
            MissingKey::Reject => "answering 500 without calling the service",
            MissingKey::Shared => "limiting every request without a key together, as one key",
            MissingKey::Bypass => "admitting every request without a key, unlimited",
        };
        tracing::warn!(
            policy = %self.name,
            missing_key = self.policy.as_str(),
            "ratelimit-layer: a request has no rate-limit key; {action} (the layer's missing-key \
             policy). Logged once; `ratelimit_layer_missing_key_total` counts every such \
             request. A client-IP key needs the peer address in the request's extensions: in \
             axum, serve with `into_make_service_with_connect_info::<SocketAddr>()` and read \
             `ConnectInfo`; in tonic, read `TcpConnectInfo`."
        );
    }
}

impl<L: Limiter, C: Clock, E: KeyExtractor> Decide for Keyed<L, C, E> {
    #[inline]
    fn decide(
        &self,
        parts: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        match self.extract.extract(parts) {
            // NOTE: a borrowed key (a header's bytes) is looked up in place; only a key seen
            // for the first time is copied into the map.
            Some(key) => Some(self.map.check_with_status(&*key, cost, status_on_allow)),
            None => match self.missing.apply() {
                MissingKey::Reject => None,
                // NOTE: no status: nothing limits it, so no `RateLimit` field describes it.
                MissingKey::Bypass => Some((Decision::Allow, None, KeyClass::Unkeyed)),
                MissingKey::Shared => {
                    let now = self.map.clock().now();
                    let (decision, status) = check_and_status(
                        self.map.limiter(),
                        &self.unkeyed,
                        now,
                        cost,
                        status_on_allow,
                    );
                    Some((decision, status, KeyClass::Unkeyed))
                }
            },
        }
    }

    fn missing_key_policy(&self) -> Option<Arc<MissingKeyPolicy>> {
        Some(Arc::clone(&self.missing))
    }
}

pub(super) type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

/// What a request costs.
pub(super) enum Cost {
    Fixed(u32),
    By(Box<CostFn>),
}

/// The layer's counters, registered with the `metrics` recorder on first use (the first
/// request), so that a recorder installed after the layer was built still receives them,
/// and kept: a request costs no registry lookup.
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
                metrics::counter!(metric_names::REQUESTS_REJECTED, "policy" => policy.clone(), "key_class" => class.as_str())
            };
            Handles {
                admitted: metrics::counter!(metric_names::REQUESTS_ADMITTED, "policy" => policy.clone()),
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
    cost: Cost,
    pub(crate) policy: RateLimitPolicy,
    /// The `RateLimit-Policy` value, formatted once: it never changes.
    pub(crate) policy_header: HeaderValue,
    pub(crate) admitted_headers: bool,
    /// The limiter's window: the `Retry-After` of an over-capacity request.
    pub(crate) window: Duration,
    pub(crate) metrics: Metrics,
    /// A limiter that decides elsewhere (Redis, for a fleet), asked first; `decide` is then
    /// its local fallback. `None` for a local limit.
    pub(crate) remote: Option<Box<dyn RemoteDecide>>,
}

impl Shared {
    #[inline]
    pub(crate) fn cost(&self, parts: &Parts) -> u32 {
        match &self.cost {
            Cost::Fixed(cost) => *cost,
            Cost::By(f) => f(parts),
        }
    }

    #[inline]
    pub(crate) fn decide(
        &self,
        parts: &Parts,
        cost: u32,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        self.decide.decide(parts, cost, self.admitted_headers)
    }

    pub(super) fn new(
        decide: Box<dyn Decide>,
        cost: Cost,
        policy: RateLimitPolicy,
        policy_name: &str,
        admitted_headers: bool,
        window: Duration,
    ) -> Self {
        Self {
            decide,
            cost,
            policy_header: policy.to_header_value(),
            policy,
            admitted_headers,
            window,
            metrics: Metrics::new(policy_name),
            remote: None,
        }
    }

    /// The missing-key policy of a keyed limit, for a remote decider to share.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) fn missing_key_policy(&self) -> Option<Arc<MissingKeyPolicy>> {
        self.decide.missing_key_policy()
    }

    /// Asks `remote` first for every request, with `decide` as its local fallback.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) fn with_remote(mut self, remote: Box<dyn RemoteDecide>) -> Self {
        self.remote = Some(remote);
        self
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cost: &dyn fmt::Debug = match &self.cost {
            Cost::Fixed(cost) => cost,
            Cost::By(_) => &"by request",
        };
        f.debug_struct("Shared")
            .field("policy", &self.policy)
            .field("cost", cost)
            .field("admitted_headers", &self.admitted_headers)
            .field("remote", &self.remote.is_some())
            .finish_non_exhaustive()
    }
}

/// The `RateLimit-Policy` of `limiter` under `name`: validated, formatted once.
pub(super) fn policy<L: Limiter>(name: &str, limiter: &L) -> Result<RateLimitPolicy, ConfigError> {
    if name.is_empty() || !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(ConfigError::invalid(
            "policy_name",
            name,
            "non-empty printable ASCII (0x20 to 0x7e), which a structured field string can carry",
        ));
    }
    // NOTE: the field's `w` is whole seconds, at least 1, so a custom limiter's zero window
    // is written as `w=1` rather than refused.
    let window = limiter.window().max(Duration::from_nanos(1));
    RateLimitPolicy::new(name, limiter.quota(), window)
        .map_err(|e| ConfigError::new("policy_name", ConfigErrorKind::Invalid, e))
}
