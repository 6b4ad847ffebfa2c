//! What this crate's layers report: their metric handles, each set registered the
//! workspace's one way ([`LazyMetrics`](overload_core::telemetry::LazyMetrics): on the
//! layer's first request, then kept), and how often the layers wake to keep their gauges
//! and episodes true while no request comes.
//!
//! The names and labels are listed, for users, in [`metric_names`](crate::metric_names).

use std::time::Duration;

use metrics::{Counter, Gauge};
use overload_core::telemetry::{LayerName, MetricSet, NAME_LABEL};
use overload_signal::protocol::Criticality;

use crate::key::MissingKey;
use crate::keyed::KeyClass;
use crate::metric_names;

/// How often a layer of this crate wakes while it lives, once it has served a request:
/// every second. On each tick a rate limit sweeps its idle keys and reports how many are
/// left, and a layer ends the episode of a limit that has been quiet long enough. A second
/// keeps the gauges within one scrape of the truth, for a wake-up that costs a few atomic
/// reads.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// Every [`KeyClass`], in the order of [`RateLimitMetrics`]'s rejection counters.
const KEY_CLASSES: [KeyClass; 4] = [
    KeyClass::Global,
    KeyClass::Keyed,
    KeyClass::Overflow,
    KeyClass::Unkeyed,
];

const fn class_index(class: KeyClass) -> usize {
    match class {
        KeyClass::Global => 0,
        KeyClass::Keyed => 1,
        KeyClass::Overflow => 2,
        KeyClass::Unkeyed => 3,
    }
}

/// A rate limit's counters: `ratelimit_layer_requests_admitted_total` by `criticality`
/// and `ratelimit_layer_requests_rejected_total` by `key_class` and `criticality`.
pub(crate) struct RateLimitMetrics {
    /// Indexed by [`Criticality::rank`].
    admitted: [Counter; 4],
    /// In the order of [`KEY_CLASSES`], then by [`Criticality::rank`].
    rejected: [[Counter; 4]; 4],
}

impl MetricSet for RateLimitMetrics {
    fn register(name: &LayerName) -> Self {
        Self {
            admitted: Criticality::ALL.map(|level| {
                metrics::counter!(
                    metric_names::REQUESTS_ADMITTED,
                    NAME_LABEL => name.label(),
                    metric_names::CRITICALITY_LABEL => level.as_str()
                )
            }),
            rejected: KEY_CLASSES.map(|class| {
                Criticality::ALL.map(|level| {
                    metrics::counter!(
                        metric_names::REQUESTS_REJECTED,
                        NAME_LABEL => name.label(),
                        "key_class" => class.as_str(),
                        metric_names::CRITICALITY_LABEL => level.as_str()
                    )
                })
            }),
        }
    }
}

impl RateLimitMetrics {
    #[inline]
    pub(crate) fn rejected(&self, class: KeyClass, level: Criticality) -> &Counter {
        &self.rejected[class_index(class)][level.rank()]
    }

    #[inline]
    pub(crate) fn admitted(&self, level: Criticality) -> &Counter {
        &self.admitted[level.rank()]
    }
}

/// Every [`MissingKey`] policy, in the order of [`KeyedLimitMetrics`]'s counters.
const MISSING_KEY_ACTIONS: [MissingKey; 3] =
    [MissingKey::Reject, MissingKey::Shared, MissingKey::Bypass];

const fn action_index(action: MissingKey) -> usize {
    match action {
        MissingKey::Reject => 0,
        MissingKey::Shared => 1,
        MissingKey::Bypass => 2,
    }
}

/// A keyed rate limit's own metrics: the `ratelimit_layer_keys` gauge and
/// `ratelimit_layer_missing_key_total` by `action`.
pub(crate) struct KeyedLimitMetrics {
    pub(crate) keys: Gauge,
    /// In the order of [`MISSING_KEY_ACTIONS`].
    missing_key: [Counter; 3],
}

impl MetricSet for KeyedLimitMetrics {
    fn register(name: &LayerName) -> Self {
        Self {
            keys: metrics::gauge!(metric_names::KEYS, NAME_LABEL => name.label()),
            missing_key: MISSING_KEY_ACTIONS.map(|action| {
                metrics::counter!(
                    metric_names::MISSING_KEY,
                    NAME_LABEL => name.label(),
                    "action" => action.as_str()
                )
            }),
        }
    }
}

impl KeyedLimitMetrics {
    pub(crate) fn missing_key(&self, action: MissingKey) -> &Counter {
        &self.missing_key[action_index(action)]
    }
}

/// Why a request of a limit kept in Redis was decided locally: the `reason` label of
/// `ratelimit_layer_redis_fallbacks_total`.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RedisFallbackReason {
    /// Redis did not answer within the time budget.
    Timeout,
    /// Redis answered with an error, or the connection failed.
    Error,
    /// Redis was known to be away, so it was not asked.
    Unavailable,
}

#[cfg(feature = "redis")]
impl RedisFallbackReason {
    const ALL: [Self; 3] = [Self::Timeout, Self::Error, Self::Unavailable];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Unavailable => "unavailable",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Timeout => 0,
            Self::Error => 1,
            Self::Unavailable => 2,
        }
    }
}

/// A Redis-backed limit's own metrics: `ratelimit_layer_redis_fallbacks_total` by `reason`
/// and the `ratelimit_layer_redis_up` gauge.
#[cfg(feature = "redis")]
pub(crate) struct RedisLimitMetrics {
    /// In the order of [`RedisFallbackReason::ALL`].
    fallbacks: [Counter; 3],
    pub(crate) up: Gauge,
}

#[cfg(feature = "redis")]
impl MetricSet for RedisLimitMetrics {
    fn register(name: &LayerName) -> Self {
        Self {
            fallbacks: RedisFallbackReason::ALL.map(|reason| {
                metrics::counter!(
                    metric_names::REDIS_FALLBACKS,
                    NAME_LABEL => name.label(),
                    "reason" => reason.as_str()
                )
            }),
            up: metrics::gauge!(metric_names::REDIS_UP, NAME_LABEL => name.label()),
        }
    }
}

#[cfg(feature = "redis")]
impl RedisLimitMetrics {
    pub(crate) fn fallback(&self, reason: RedisFallbackReason) -> &Counter {
        &self.fallbacks[reason.index()]
    }
}

/// The adaptive limit's metrics.
/// The label of the adaptive limit's per-level counters: a request's
/// [`Criticality`], as [`Criticality::as_str`] spells it.
const CRITICALITY_LABEL: &str = "criticality";

pub(crate) struct AdaptiveLimitMetrics {
    /// By [`Criticality::rank`](overload_signal::protocol::Criticality::rank), labelled
    /// `criticality`.
    pub(crate) admitted: [Counter; 4],
    pub(crate) rejected: [Counter; 4],
    pub(crate) limit: Gauge,
    pub(crate) baseline: Gauge,
    pub(crate) latency: Gauge,
    pub(crate) held: Counter,
    pub(crate) held_running: Gauge,
}

impl MetricSet for AdaptiveLimitMetrics {
    fn register(name: &LayerName) -> Self {
        Self {
            admitted: Criticality::ALL.map(|level| {
                metrics::counter!(
                    metric_names::ADAPTIVE_ADMITTED,
                    NAME_LABEL => name.label(),
                    CRITICALITY_LABEL => level.as_str()
                )
            }),
            rejected: Criticality::ALL.map(|level| {
                metrics::counter!(
                    metric_names::ADAPTIVE_REJECTED,
                    NAME_LABEL => name.label(),
                    CRITICALITY_LABEL => level.as_str()
                )
            }),
            limit: metrics::gauge!(metric_names::ADAPTIVE_LIMIT, NAME_LABEL => name.label()),
            baseline: metrics::gauge!(
                metric_names::ADAPTIVE_BASELINE,
                NAME_LABEL => name.label()
            ),
            latency: metrics::gauge!(
                metric_names::ADAPTIVE_LATENCY,
                NAME_LABEL => name.label()
            ),
            held: metrics::counter!(metric_names::ADAPTIVE_HELD, NAME_LABEL => name.label()),
            held_running: metrics::gauge!(
                metric_names::ADAPTIVE_HELD_RUNNING,
                NAME_LABEL => name.label()
            ),
        }
    }
}
