//! The names of the metrics this crate emits through the [`metrics`] facade.
//!
//! The crate never installs a recorder: without one, every metric is a no-op.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_layer_requests_admitted_total` | counter | `name`, `criticality` (`sheddable`, `sheddable-plus`, `critical`, `critical-plus`: the request's level, critical when it carries none) | requests passed to the inner service (counted per core and added once a second, by the layer's tick) |
//! | `ratelimit_layer_requests_rejected_total` | counter | `name`, `key_class` (`global`, `keyed`, `overflow`, `unkeyed`), `criticality` | requests answered with a rejection (`429`, or `413` for a cost above the limit's capacity); a lower level is rejected first, see [`RateLimitBuilder::reserves`](crate::RateLimitBuilder::reserves) |
//! | `ratelimit_layer_keys` | gauge | `name` | keys tracked by a keyed layer |
//! | `ratelimit_layer_missing_key_total` | counter | `name`, `action` (`reject`, `shared`, `bypass`) | requests a keyed layer found no key in, by the [`MissingKey`](crate::key::MissingKey) policy applied |
//! | `ratelimit_layer_redis_fallbacks_total` | counter | `name`, `reason` (`timeout`, `error`, `unavailable`) | requests of a limit kept in Redis decided locally instead |
//! | `ratelimit_layer_redis_up` | gauge | `name` | 1 while a limit kept in Redis is decided there, 0 while it falls back |
//! | `ratelimit_layer_adaptive_admitted_total` | counter | `name`, `criticality` | requests the adaptive limit passed on (counted per core and added once a second, by the layer's tick) |
//! | `ratelimit_layer_adaptive_rejected_total` | counter | `name`, `criticality` | requests the adaptive limit rejected |
//! | `ratelimit_layer_adaptive_limit` | gauge | `name` | the adaptive limit in force |
//! | `ratelimit_layer_adaptive_baseline_seconds` | gauge | `name` | its measured no-load latency |
//! | `ratelimit_layer_adaptive_latency_seconds` | gauge | `name` | its last window's latency percentile |
//! | `ratelimit_layer_adaptive_held_total` | counter | `name` | requests the adaptive limit released for being in flight longer than their bound (`release_after`) |
//! | `ratelimit_layer_adaptive_held_running` | gauge | `name` | those released requests still running (they count toward `max_limit`) |
//! | `ratelimit_layer_limits_reloads_total` | counter | `name`, `result` (`applied`, `refused`, `unreadable`) | changes of a limits file seen by [`limits_file::Reloader`](crate::limits_file::Reloader): applied, or refused (an error in the file, or the file unreadable) with the limits in force kept |
//!
//! Every metric carries the label `name`
//! ([`NAME_LABEL`](overload_core::telemetry::NAME_LABEL)): the name of the layer that wrote
//! it ([`RateLimitBuilder::name`](crate::RateLimitBuilder::name),
//! [`AdaptiveLimitBuilder::name`](crate::AdaptiveLimitBuilder::name)), `default` unless set,
//! so that two layers of one process are two series.
//!
//! Each is registered with the recorder on the layer's first request, not when the layer is
//! built (a recorder installed after building the layer, before traffic, sees them all), and
//! the handles are kept, so a request costs no registry lookup: the rate limit's counters and
//! (keyed) its keys gauge and missing-key counters; the Redis-backed limit's fallback
//! counters and its `redis_up` gauge; the adaptive limit's counters and gauges.
//!
//! The gauges stay true while no request comes: a keyed layer sweeps its idle keys and sets
//! `ratelimit_layer_keys` every second; the Redis-backed limit probes Redis while it is
//! away and while no request asks it, so `ratelimit_layer_redis_up` follows Redis; the adaptive
//! limit's latency gauge falls to 0 once no request has completed for 10 seconds (its limit
//! and baseline do not change without traffic).
//!
//! [`metrics`]: https://docs.rs/metrics/0.24/metrics/

/// Counter, labels `name` and `criticality`: requests passed to the inner service.
pub const REQUESTS_ADMITTED: &str = "ratelimit_layer_requests_admitted_total";

/// Counter, labels `name`, `key_class` (`global`, `keyed`, `overflow` or `unkeyed`, see
/// [`KeyClass`](crate::keyed::KeyClass)) and `criticality`: requests answered with a
/// rejection: `429`, or `413` for a request whose cost exceeds the limit's capacity.
pub const REQUESTS_REJECTED: &str = "ratelimit_layer_requests_rejected_total";

/// The label of the rate limit's request counters that carries the request's criticality:
/// `criticality`, valued `sheddable`, `sheddable-plus`, `critical` or `critical-plus`
/// ([`Criticality::as_str`](overload_signal::protocol::Criticality::as_str)); a request
/// without one counts as `critical`.
pub const CRITICALITY_LABEL: &str = "criticality";

/// Gauge, label `name`: keys tracked by a keyed layer, set every second after a sweep of
/// idle keys.
pub const KEYS: &str = "ratelimit_layer_keys";

/// Counter, labels `name` and `action` (`reject`, `shared` or `bypass`, see
/// [`MissingKey`](crate::key::MissingKey)): requests a keyed layer found no key in.
pub const MISSING_KEY: &str = "ratelimit_layer_missing_key_total";

/// Counter, labels `name` and `reason`: requests a limit kept in Redis (feature `redis`)
/// decided locally, with its local share, instead of in Redis. `reason` is `timeout` (Redis
/// did not answer within the time budget), `error` (Redis answered with an error, or the
/// connection failed) or `unavailable` (Redis was known to be away, so it was not asked).
pub const REDIS_FALLBACKS: &str = "ratelimit_layer_redis_fallbacks_total";

/// Gauge, label `name`: 1 while a limit kept in Redis (feature `redis`) is decided in
/// Redis, 0 while it falls back to its local share. Set on each change; while Redis is
/// away, and while no request asks it, the layer probes it every recheck interval, which
/// keeps it true.
pub const REDIS_UP: &str = "ratelimit_layer_redis_up";

/// Counter, labels `name` and `criticality` (the request's level, `sheddable` to
/// `critical-plus`): requests the [adaptive limit](crate::adaptive) passed to the
/// inner service.
pub const ADAPTIVE_ADMITTED: &str = "ratelimit_layer_adaptive_admitted_total";

/// Counter, labels `name` and `criticality` (the request's level): requests the [adaptive
/// limit](crate::adaptive) rejected.
pub const ADAPTIVE_REJECTED: &str = "ratelimit_layer_adaptive_rejected_total";

/// Gauge, label `name`: the [adaptive limit](crate::adaptive) in force, updated once per
/// sampling window.
pub const ADAPTIVE_LIMIT: &str = "ratelimit_layer_adaptive_limit";

/// Gauge, label `name`, seconds: the adaptive limit's measured no-load latency.
pub const ADAPTIVE_BASELINE: &str = "ratelimit_layer_adaptive_baseline_seconds";

/// Gauge, label `name`, seconds: the adaptive limit's last window's latency percentile; 0
/// before the first window closes and once no request has completed for 10 seconds.
pub const ADAPTIVE_LATENCY: &str = "ratelimit_layer_adaptive_latency_seconds";

/// Counter, label `name`: requests the [adaptive limit](crate::adaptive) released for being
/// in flight longer than their bound
/// ([`release_after`](crate::AdaptiveLimitBuilder::release_after)): their slots came back,
/// and each counted once as a latency sample of the time it had run. A steady rate here is
/// a route that should be [exempt](crate::AdaptiveLimitBuilder::exempt) (a long poll, a
/// stream) or a request body that needs a timeout inside the layer.
pub const ADAPTIVE_HELD: &str = "ratelimit_layer_adaptive_held_total";

/// Gauge, label `name`: the requests the [adaptive limit](crate::adaptive) released that are
/// still running, set each time it releases (once per bound). They count toward
/// [`max_limit`](crate::AdaptiveLimitBuilder::max_limit) with those in flight: near it, the
/// service is piling up work that never ends.
pub const ADAPTIVE_HELD_RUNNING: &str = "ratelimit_layer_adaptive_held_running";

/// Counter, labels `name` and `result` (`applied`, `refused`, `unreadable`): changes of a
/// [limits file](crate::limits_file) seen by its
/// [`Reloader`](crate::limits_file::Reloader), each counted once: applied, or refused (an
/// error in the file, or the file cannot be read) with the limits in force kept.
pub const LIMITS_RELOADS: &str = "ratelimit_layer_limits_reloads_total";
