//! The names of the metrics this crate emits through the [`metrics`] facade.
//!
//! The crate never installs a recorder: without one, every metric is a no-op. Every metric
//! carries the label `name` ([`NAME_LABEL`](overload_core::telemetry::NAME_LABEL)): the
//! [name](crate::OverloadSignalLayerBuilder::name) of the layer that wrote it, `"default"`
//! unless set. An [`OverloadSignalLayer`](crate::OverloadSignalLayer) and a
//! [`DeadlineLayer`](crate::DeadlineLayer) register every metric on their **first request**
//! (not when they are built) and keep the handles.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `overload_signal_stop_signals_total` | counter | `name`; `scope`: `server` or `caller`; `criticality`: the rejected request's level | rejections answered with the stop signal because the decision rule fired, on the whole server's window (`server`) or on the rejected caller's own (`caller`, for a [caller-scoped](crate::signal::RejectionScope) rejection) |
//! | `overload_signal_rejections_passed_total` | counter | `name`; `scope`: `server` or `caller`; `criticality`: the rejected request's level | rejections passed through because the rule did not fire, or (`server` only) because a lower level's rejections were still passed (see [`signal`](crate::signal#levels)) |
//! | `overload_signal_propagated_total` | counter | `name`; `via`: `marker` or `response` | downstream stop signals passed up: `marker` when this layer rewrote a failure because the propagation marker was raised, `response` when the handler's response already carried the signal |
//! | `overload_signal_errors_answered_total` | counter | `name`; `answer`: `stop_signal`, `deadline_exceeded`, `throttled` or `gave_up` | errors of the inner service answered as the protocol says because a downstream call of the request was marked (see [`propagation`](crate::propagation)): the stop signal, `504`, `503` or `502`, in place of a reset connection |
//! | `overload_signal_deadline_expired_total` | counter | `name`; `when`: `arrival` or `running` | requests a [`DeadlineLayer`](crate::DeadlineLayer) answered with `504` (gRPC `DEADLINE_EXCEEDED`) because their caller's deadline had passed: on `arrival` (the handler never ran), or while `running` (the work was cancelled) |
//! | `overload_signal_deadline_expired_queued_seconds` | histogram | `name` | for each request expired on arrival, the time since it was sent (from `X-Request-Deadline`'s `t`; 0 for a deadline without a send time): how long it queued |
//! | `overload_signal_deadline_malformed_total` | counter | `name` | `X-Request-Deadline`, `grpc-timeout` or `x-envoy-expected-rq-timeout-ms` fields that broke the protocol's rules, ignored |
//! | `overload_signal_deadline_skewed_total` | counter | `name` | `X-Request-Deadline` fields of trusted callers (see [`Trust`](crate::Trust)) sent further in the future than the skew allowance, or more than an hour in the past: the hosts' clocks disagree; the deadline was counted from arrival |
//! | `overload_signal_deadline_requests_total` | counter | `name` | requests that carried a deadline (or arrived in the scope of one): what the expired and skewed figures are a share of |
//! | `overload_signal_deadline_callers_total` | counter | `name`; `reason`: `expired` or `skewed` | caller-minutes: each caller class (a client network, hashed into 128 classes) counted once in each minute in which it sent an expired or skewed request; `rate(..[5m]) * 60` is about how many callers the figure comes from |
//! | `overload_signal_unkeyed_requests_total` | counter | `name` | requests without a [caller key](crate::signal::CallerKey): they share one caller class, so one of them can forge a storm for all; a server that counts any is set up wrong (each run of them is also logged at `WARN`, at most once a minute) |
//! | `overload_signal_window_requests` | gauge | `name`; `attempt`: `0`, `1`, `2`, `3+`, `unknown`, `malformed` | requests in the attempt histogram's window, per attempt class |
//! | `overload_signal_window_retry_share` | gauge | `name` | the window's retry share, 0 when empty |
//! | `overload_signal_window_retry_pressure` | gauge | `name` | the window's [retry pressure](crate::AttemptSnapshot::retry_pressure) (retries and requests told to stop), 0 when empty |
//! | `overload_signal_criticality_malformed_total` | counter | `name` | requests whose `X-Request-Criticality` was malformed, served at the default level |
//! | `overload_signal_criticality_capped_total` | counter | `name` | requests of callers the server does not trust that claimed a level above what they get, served at that level |
//! | `overload_signal_window_per_caller_pressure` | gauge | `name` | the same with each caller class's weight capped ([`signal`](crate::signal#trust-what-callers-can-and-cannot-do)), 0 when empty |
//!
//! [`OverloadSignal`](crate::OverloadSignal) sets the window gauges once per bucket (once a
//! second by default), for the window that ended with the previous bucket: with the first
//! request of the bucket, or, when none comes, from a task the layer starts on its first
//! request. So when traffic stops they fall to the empty window's figures (0) once the last
//! request's bucket has left the window: within one window and two buckets of that request.
//! [`AttemptSnapshot::export_metrics`](crate::AttemptSnapshot::export_metrics) sets the
//! same gauges (but the per-caller one) from any snapshot, under a name of your choice.

/// The label of the request's [`Criticality`](crate::protocol::Criticality) on the metrics
/// that count requests by level: its values are
/// [`Criticality::as_str`](crate::protocol::Criticality::as_str) (`sheddable`,
/// `sheddable-plus`, `critical`, `critical-plus`).
pub const CRITICALITY_LABEL: &str = "criticality";

/// Counter, labels `name`, `scope` (`server` or `caller`) and `criticality`: rejections
/// answered with the stop signal because the decision rule fired.
pub const STOP_SIGNALS: &str = "overload_signal_stop_signals_total";

/// Counter, labels `name`, `scope` (`server` or `caller`) and `criticality`: rejections
/// passed through because the decision rule did not fire (or a lower level's rejections
/// were still passed).
pub const REJECTIONS_PASSED: &str = "overload_signal_rejections_passed_total";

/// Counter, labels `name` and `via` (`marker` or `response`): downstream stop signals passed
/// up.
pub const PROPAGATED: &str = "overload_signal_propagated_total";

/// Counter, labels `name` and `answer` (`stop_signal`, `deadline_exceeded`, `throttled`,
/// `gave_up`): errors of the inner service answered because a downstream call was marked.
pub const ERRORS_ANSWERED: &str = "overload_signal_errors_answered_total";

/// Counter, labels `name` and `when` (`arrival` or `running`): requests answered with the
/// deadline's outcome because their caller's deadline had passed.
pub const DEADLINE_EXPIRED: &str = "overload_signal_deadline_expired_total";

/// Histogram, label `name`: for each request expired on arrival, seconds since it was sent.
pub const DEADLINE_EXPIRED_QUEUED: &str = "overload_signal_deadline_expired_queued_seconds";

/// Counter, label `name`: deadline fields that broke the protocol's rules, ignored.
pub const DEADLINE_MALFORMED: &str = "overload_signal_deadline_malformed_total";

/// Counter, label `name`: deadline fields sent further in the future than the skew
/// allowance, read from arrival.
pub const DEADLINE_SKEWED: &str = "overload_signal_deadline_skewed_total";

/// Counter, label `name`: requests that carried a deadline (or arrived in the scope of
/// one): what the expired and skewed figures are a share of.
pub const DEADLINE_REQUESTS: &str = "overload_signal_deadline_requests_total";

/// Counter, labels `name` and `reason` (`expired` or `skewed`): caller-minutes, each caller
/// class (a client network, hashed into 128 classes) counted once in each minute in which it
/// sent such a request. Its rate times 60 is about how many callers the figure comes from.
pub const DEADLINE_CALLERS: &str = "overload_signal_deadline_callers_total";

/// Counter, label `name`: requests without a caller key (see
/// [`CallerKey`](crate::signal::CallerKey)). Registered with the layer's other metrics, so it
/// reads 0 on a server set up right: alert on any increase.
pub const UNKEYED_REQUESTS: &str = "overload_signal_unkeyed_requests_total";

/// Gauge, labels `name` and `attempt` (`0`, `1`, `2`, `3+`, `unknown`, `malformed`):
/// requests in the histogram's window.
pub const WINDOW_REQUESTS: &str = "overload_signal_window_requests";

/// Gauge, label `name`: the histogram window's retry share, 0 when the window is empty.
pub const WINDOW_RETRY_SHARE: &str = "overload_signal_window_retry_share";

/// Gauge, label `name`: the histogram window's retry pressure (known retries and requests
/// answered with the stop signal, over all requests), 0 when the window is empty.
pub const WINDOW_RETRY_PRESSURE: &str = "overload_signal_window_retry_pressure";

/// Gauge, label `name`: the window's retry pressure with each caller class's weight capped
/// at the median class's, as the layer's decision computes it; 0 when the window is empty.
pub const WINDOW_PER_CALLER_PRESSURE: &str = "overload_signal_window_per_caller_pressure";

/// Counter, label `name`: requests whose `X-Request-Criticality` was malformed (not one of
/// the four levels, or repeated with different levels), served at the default level.
pub const CRITICALITY_MALFORMED: &str = "overload_signal_criticality_malformed_total";

/// Counter, label `name`: requests from callers the server does not trust that claimed a
/// level above what such callers get, served at that level instead.
pub const CRITICALITY_CAPPED: &str = "overload_signal_criticality_capped_total";
