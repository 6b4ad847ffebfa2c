//! The names of the metrics this crate emits through the [`metrics`] facade.
//!
//! The crate never installs a recorder: without one, every metric is a no-op.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_layer_requests_admitted_total` | counter | `policy` | requests passed to the inner service |
//! | `ratelimit_layer_requests_rejected_total` | counter | `policy`, `key_class` (`global`, `keyed`, `overflow`, `unkeyed`) | requests answered with a rejection |
//! | `ratelimit_layer_keys` | gauge | `policy` | keys tracked by a keyed layer |
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
