//! What the layer reports: its metric handles, and the stop signal's episodes in its logs.

use std::time::Duration;

use metrics::{Counter, Gauge};
use overload_core::telemetry::{Ended, LayerName, MetricSet, NAME_LABEL};

use super::rejection::RejectionScope;
use super::rule::StopRule;
use crate::histogram::{AttemptSnapshot, AttemptWindowGauges};
use crate::metric_names::{self, CRITICALITY_LABEL};
use crate::protocol::Criticality;

/// What the layer answered in place of an inner service's error (the label `answer` of
/// `overload_signal_errors_answered_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ErrorAnswer {
    StopSignal = 0,
    DeadlineExceeded = 1,
    Throttled = 2,
    GaveUp = 3,
}

impl ErrorAnswer {
    const ALL: [Self; 4] = [
        Self::StopSignal,
        Self::DeadlineExceeded,
        Self::Throttled,
        Self::GaveUp,
    ];

    pub(super) const fn as_str(self) -> &'static str {
        match self {
            Self::StopSignal => "stop_signal",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::Throttled => "throttled",
            Self::GaveUp => "gave_up",
        }
    }
}

/// The layer's metric handles, each labelled [`NAME_LABEL`] with the layer's name.
///
/// NOTE: registered on the layer's first request (kept in a `LazyMetrics`), not when the
/// layer is built: an application often builds its router before it installs its recorder,
/// and a handle registered before the recorder is installed is a no-op for good. A recorder
/// installed after the first request does not receive this layer's metrics.
pub(crate) struct SignalMetrics {
    /// Indexed by [`RejectionScope`] (server, caller), then by the level's rank.
    stop_signals: [[Counter; 4]; 2],
    rejections_passed: [[Counter; 4]; 2],
    propagated_marker: Counter,
    propagated_response: Counter,
    /// Indexed by [`ErrorAnswer`].
    errors_answered: [Counter; 4],
    unkeyed: Counter,
    window: AttemptWindowGauges,
    window_per_caller_pressure: Gauge,
}

impl MetricSet for SignalMetrics {
    fn register(name: &LayerName) -> Self {
        let scoped = |metric: &'static str| {
            [RejectionScope::Server, RejectionScope::Caller].map(|scope| {
                Criticality::ALL.map(|level| {
                    metrics::counter!(
                        metric,
                        NAME_LABEL => name.label(),
                        "scope" => scope.as_str(),
                        CRITICALITY_LABEL => level.as_str()
                    )
                })
            })
        };
        let propagated = |via: &'static str| metrics::counter!(metric_names::PROPAGATED, NAME_LABEL => name.label(), "via" => via);
        Self {
            stop_signals: scoped(metric_names::STOP_SIGNALS),
            rejections_passed: scoped(metric_names::REJECTIONS_PASSED),
            propagated_marker: propagated("marker"),
            propagated_response: propagated("response"),
            errors_answered: ErrorAnswer::ALL.map(|answer| {
                metrics::counter!(
                    metric_names::ERRORS_ANSWERED,
                    NAME_LABEL => name.label(),
                    "answer" => answer.as_str()
                )
            }),
            unkeyed: metrics::counter!(metric_names::UNKEYED_REQUESTS, NAME_LABEL => name.label()),
            window: AttemptWindowGauges::register(name),
            window_per_caller_pressure: metrics::gauge!(
                metric_names::WINDOW_PER_CALLER_PRESSURE,
                NAME_LABEL => name.label()
            ),
        }
    }
}

impl SignalMetrics {
    /// A rejection answered with the stop signal because the rule fired.
    pub(super) fn stop_signal(&self, scope: RejectionScope, level: Criticality) {
        self.stop_signals[scope as usize][level.rank()].increment(1);
    }

    /// A rejection passed through because the rule did not fire (or, for a level above
    /// `sheddable`, because a lower level's rejections were still passed).
    pub(super) fn rejection_passed(&self, scope: RejectionScope, level: Criticality) {
        self.rejections_passed[scope as usize][level.rank()].increment(1);
    }

    /// A downstream stop signal passed up: `marker` when the layer rewrote a failure,
    /// otherwise the response already carried it.
    pub(super) fn propagated(&self, marker: bool) {
        if marker {
            self.propagated_marker.increment(1);
        } else {
            self.propagated_response.increment(1);
        }
    }

    /// An inner service's error answered after a downstream call was marked.
    pub(super) fn error_answered(&self, answer: ErrorAnswer) {
        self.errors_answered[answer as usize].increment(1);
    }

    /// A request without a caller key.
    pub(super) fn unkeyed(&self) {
        self.unkeyed.increment(1);
    }

    /// Sets the window gauges: `window`'s figures, and its per-caller pressure (0 when the
    /// window is empty).
    pub(super) fn export_window(&self, window: &AttemptSnapshot, per_caller: Option<f64>) {
        self.window.set(window);
        self.window_per_caller_pressure
            .set(per_caller.unwrap_or(0.0));
    }
}

/// What the rule judged when it fired: the figures an operator needs to see why the layer
/// started answering with the stop signal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StopTrigger {
    /// Whose window was judged.
    pub(crate) scope: RejectionScope,
    /// The requests of that window.
    pub(crate) requests: u64,
    /// The share the rule compared with its threshold (the retry pressure when the rule is
    /// sustained, the plain retry share otherwise).
    pub(crate) retry_share: f64,
}

/// Logs, once per episode, that the layer has started answering rejections with the stop
/// signal.
pub(super) fn log_engaged(name: &LayerName, trigger: StopTrigger, rule: &StopRule) {
    tracing::warn!(
        name = name.as_str(),
        scope = trigger.scope.as_str(),
        retry_share = trigger.retry_share,
        requests = trigger.requests,
        threshold = rule.retry_share(),
        "overload-signal: stop signal engaged: the retry share of the last window is above \
         the threshold, rejections are answered with `stop retrying` until none has been \
         for a window"
    );
}

/// Logs that `count` requests without a caller key came since the last such line (at most
/// one per `interval`): at `ERROR` when the request that logs carries no peer address
/// (`no_peer`: the server is set up wrong, which no client can cause), with the fix; at
/// `WARN` otherwise (a key of the user's own found none, which a client can cause).
#[cold]
pub(super) fn log_unkeyed(name: &LayerName, count: u64, interval: Duration, no_peer: bool) {
    if no_peer {
        tracing::error!(
            name = name.as_str(),
            requests = count,
            "overload-signal: requests without a peer address: the server does not put the \
             connection's peer in its requests, so the layer cannot tell its callers apart: \
             they share one caller class, and any one of them can forge a retry storm for all \
             of them. The layers read a `SocketAddr` request extension. Fix: axum 0.8, serve \
             with `overload_signal::axum_0_8::into_make_service_with_peer_addr(app)` (feature \
             `axum-0_8`); tonic 0.14, build the server with \
             `overload_signal::tonic_0_14::server_builder()` (feature `tonic-0_14`); \
             `ratelimit-layer` has the same features and modules; any other server (another \
             major version of axum or tonic, hyper), insert the peer's `SocketAddr` in each \
             request's extensions, outside this layer. Logged again at most every \
             {interval:?} while it lasts; `overload_signal_unkeyed_requests_total` counts \
             every one."
        );
    } else {
        tracing::warn!(
            name = name.as_str(),
            requests = count,
            "overload-signal: requests without a caller key: the layer's key found none, so \
             they share one caller class, the stop decision cannot bound their retries per \
             caller, and any one of them can forge a retry storm for all of them. Give every \
             request a key (`OverloadSignalLayerBuilder::key_by`). Logged again at most every \
             {interval:?} while it lasts; `overload_signal_unkeyed_requests_total` counts \
             every one."
        );
    }
}

/// Logs that the layer has not answered a rejection with the stop signal for `quiet`.
pub(super) fn log_disengaged(name: &LayerName, ended: Ended, quiet: Duration) {
    tracing::info!(
        name = name.as_str(),
        lasted = ?ended.lasted,
        quiet = ?quiet,
        "overload-signal: stop signal disengaged: no rejection answered with it for a window"
    );
}
