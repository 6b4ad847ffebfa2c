//! The names of the metrics this crate emits through the [`metrics`] facade.
//!
//! The crate never installs a recorder: without one, every metric is a no-op.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_layer_requests_admitted_total` | counter | `policy` | requests passed to the inner service |
//! | `ratelimit_layer_requests_rejected_total` | counter | `policy`, `key_class` (`global`, `keyed`, `overflow`, `unkeyed`) | requests answered with a rejection |
//! | `ratelimit_layer_keys` | gauge | `policy` | keys tracked by a keyed layer |
//! | `ratelimit_layer_missing_key_total` | counter | `policy`, `action` (`reject`, `shared`, `bypass`) | requests a keyed layer found no key in, by the [`MissingKey`](crate::key::MissingKey) policy applied |
//! | `ratelimit_layer_redis_fallbacks_total` | counter | `policy`, `reason` (`timeout`, `error`, `unavailable`) | requests of a limit kept in Redis decided locally instead |
//! | `ratelimit_layer_redis_up` | gauge | `policy` | 1 while a limit kept in Redis is decided there, 0 while it falls back |
//! | `ratelimit_layer_adaptive_admitted_total` | counter | `policy` | requests the adaptive limit passed on |
//! | `ratelimit_layer_adaptive_rejected_total` | counter | `policy` | requests the adaptive limit rejected |
//! | `ratelimit_layer_adaptive_limit` | gauge | `policy` | the adaptive limit in force |
//! | `ratelimit_layer_adaptive_baseline_seconds` | gauge | `policy` | its measured no-load latency |
//! | `ratelimit_layer_adaptive_latency_seconds` | gauge | `policy` | its last window's latency percentile |
//!
//! They are registered with the recorder on the first request (the keys gauge: on the first
//! change of the key count), not when the layer is built, and the handles are kept, so a
//! request costs no registry lookup. Install the recorder before serving traffic.
//!
//! [`metrics`]: https://docs.rs/metrics/0.24/metrics/

/// Counter, label `policy`: requests passed to the inner service.
pub const REQUESTS_ADMITTED: &str = "ratelimit_layer_requests_admitted_total";

/// Counter, labels `policy` and `key_class` (`global`, `keyed`, `overflow` or `unkeyed`, see
/// [`KeyClass`](crate::keyed::KeyClass)): requests answered with a rejection.
pub const REQUESTS_REJECTED: &str = "ratelimit_layer_requests_rejected_total";

/// Gauge, label `policy`: keys tracked by a keyed layer.
pub const KEYS: &str = "ratelimit_layer_keys";

/// Counter, labels `policy` and `action` (`reject`, `shared` or `bypass`, see
/// [`MissingKey`](crate::key::MissingKey)): requests a keyed layer found no key in.
pub const MISSING_KEY: &str = "ratelimit_layer_missing_key_total";

/// Counter, labels `policy` and `reason`: requests a limit kept in Redis (feature `redis`)
/// decided locally, with its local share, instead of in Redis. `reason` is `timeout` (Redis
/// did not answer within the time budget), `error` (Redis answered with an error, or the
/// connection failed) or `unavailable` (Redis was known to be away, so it was not asked).
pub const REDIS_FALLBACKS: &str = "ratelimit_layer_redis_fallbacks_total";

/// Gauge, label `policy`: 1 while a limit kept in Redis (feature `redis`) is decided in
/// Redis, 0 while it falls back to its local share. Set on each change.
pub const REDIS_UP: &str = "ratelimit_layer_redis_up";

/// Counter, label `policy`: requests the [adaptive limit](crate::adaptive) passed to the
/// inner service.
pub const ADAPTIVE_ADMITTED: &str = "ratelimit_layer_adaptive_admitted_total";

/// Counter, label `policy`: requests the [adaptive limit](crate::adaptive) rejected.
pub const ADAPTIVE_REJECTED: &str = "ratelimit_layer_adaptive_rejected_total";

/// Gauge, label `policy`: the [adaptive limit](crate::adaptive) in force, updated once per
/// sampling window.
pub const ADAPTIVE_LIMIT: &str = "ratelimit_layer_adaptive_limit";

/// Gauge, label `policy`, seconds: the adaptive limit's measured no-load latency.
pub const ADAPTIVE_BASELINE: &str = "ratelimit_layer_adaptive_baseline_seconds";

/// Gauge, label `policy`, seconds: the adaptive limit's last window's latency percentile.
pub const ADAPTIVE_LATENCY: &str = "ratelimit_layer_adaptive_latency_seconds";
