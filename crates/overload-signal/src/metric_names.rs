//! The names of the metrics this crate emits through the [`metrics`] facade.
//!
//! The crate never installs a recorder: without one, every metric is a no-op.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `overload_signal_stop_signals_total` | counter | | rejections answered with the stop signal because the decision rule fired |
//! | `overload_signal_rejections_passed_total` | counter | | rejections passed through because the rule did not fire |
//! | `overload_signal_propagated_total` | counter | `via`: `marker` or `response` | downstream stop signals passed up: `marker` when this layer rewrote a failure because the propagation marker was raised, `response` when the handler's response already carried the signal |
//! | `overload_signal_window_requests` | gauge | `attempt`: `0`, `1`, `2`, `3+`, `unknown`, `malformed` | requests in the attempt histogram's window, per attempt class |
//! | `overload_signal_window_retry_share` | gauge | | the window's retry share, 0 when empty |
//!
//! [`OverloadSignal`](crate::OverloadSignal) sets the window gauges with the first request
//! of each bucket (once a second by default), for the window that ended with the previous
//! bucket; when traffic stops they keep their last value.
//! [`AttemptSnapshot::export_metrics`](crate::AttemptSnapshot::export_metrics) sets the same
//! gauges from any snapshot.

/// Counter: rejections answered with the stop signal because the decision rule fired.
pub const STOP_SIGNALS: &str = "overload_signal_stop_signals_total";

/// Counter: rejections passed through because the decision rule did not fire.
pub const REJECTIONS_PASSED: &str = "overload_signal_rejections_passed_total";

/// Counter, label `via` (`marker` or `response`): downstream stop signals passed up.
pub const PROPAGATED: &str = "overload_signal_propagated_total";

/// Gauge, label `attempt` (`0`, `1`, `2`, `3+`, `unknown`, `malformed`): requests in the
/// histogram's window.
pub const WINDOW_REQUESTS: &str = "overload_signal_window_requests";

/// Gauge: the histogram window's retry share, 0 when the window is empty.
pub const WINDOW_RETRY_SHARE: &str = "overload_signal_window_retry_share";
