//! What the deadline layer reports: its metric handles, and the episodes it logs.

use std::time::Duration;

use metrics::{Counter, Histogram};
use overload_core::telemetry::{Ended, LayerName, MetricSet, NAME_LABEL};

use crate::metric_names;

/// The layer's metric handles, each labelled [`NAME_LABEL`] with the layer's name.
///
/// NOTE: registered on the layer's first request (kept in a `LazyMetrics`), as every layer
/// of the workspace does, so a recorder installed after the layer is built sees them.
pub(crate) struct DeadlineMetrics {
    expired_on_arrival: Counter,
    expired_running: Counter,
    expired_queued: Histogram,
    malformed: Counter,
    skewed: Counter,
    with_deadline: Counter,
    expired_callers: Counter,
    skewed_callers: Counter,
}

impl MetricSet for DeadlineMetrics {
    fn register(name: &LayerName) -> Self {
        let expired = |when: &'static str| metrics::counter!(metric_names::DEADLINE_EXPIRED, NAME_LABEL => name.label(), "when" => when);
        Self {
            expired_on_arrival: expired("arrival"),
            expired_running: expired("running"),
            expired_queued: metrics::histogram!(
                metric_names::DEADLINE_EXPIRED_QUEUED,
                NAME_LABEL => name.label()
            ),
            malformed: metrics::counter!(metric_names::DEADLINE_MALFORMED, NAME_LABEL => name.label()),
            skewed: metrics::counter!(metric_names::DEADLINE_SKEWED, NAME_LABEL => name.label()),
            with_deadline: metrics::counter!(metric_names::DEADLINE_REQUESTS, NAME_LABEL => name.label()),
            expired_callers: metrics::counter!(metric_names::DEADLINE_CALLERS, NAME_LABEL => name.label(), "reason" => "expired"),
            skewed_callers: metrics::counter!(metric_names::DEADLINE_CALLERS, NAME_LABEL => name.label(), "reason" => "skewed"),
        }
    }
}

impl DeadlineMetrics {
    /// A request answered at once because its deadline had passed when it arrived, after
    /// `queued` since it was sent.
    pub(super) fn expired_on_arrival(&self, queued: Duration) {
        self.expired_on_arrival.increment(1);
        self.expired_queued.record(queued.as_secs_f64());
    }

    /// A request whose work was cancelled at its deadline.
    pub(super) fn expired_running(&self) {
        self.expired_running.increment(1);
    }

    /// A deadline field that broke the protocol's rules, ignored.
    pub(super) fn malformed(&self) {
        self.malformed.increment(1);
    }

    /// A trusted caller's send time the clocks cannot explain: read from arrival.
    pub(super) fn skewed(&self) {
        self.skewed.increment(1);
    }

    /// A request that carried a deadline, or arrived in the scope of one.
    pub(super) fn with_deadline(&self) {
        self.with_deadline.increment(1);
    }

    /// A caller class's first expired request of the minute.
    pub(super) fn expired_caller(&self) {
        self.expired_callers.increment(1);
    }

    /// A caller class's first skewed request of the minute.
    pub(super) fn skewed_caller(&self) {
        self.skewed_callers.increment(1);
    }
}

/// Logs that the layer has started answering requests whose deadline passed.
pub(super) fn expiring_began(name: &LayerName, queued: Duration) {
    tracing::warn!(
        name = name.as_str(),
        queued_ms = u64::try_from(queued.as_millis()).unwrap_or(u64::MAX),
        "overload-signal: dropping expired requests: requests arrive after their callers \
         stopped waiting (they queued longer than their deadline) and are answered at once, \
         without running the handler"
    );
}

/// Logs that no request has expired for `quiet`.
pub(super) fn expiring_ended(name: &LayerName, ended: Ended, quiet: Duration) {
    tracing::info!(
        name = name.as_str(),
        lasted_ms = u64::try_from(ended.lasted.as_millis()).unwrap_or(u64::MAX),
        quiet = ?quiet,
        "overload-signal: no longer dropping expired requests"
    );
}

/// Logs, once per episode, that senders' clocks are ahead of this server's by more than the
/// skew allowance.
pub(super) fn skew_began(name: &LayerName, allowance: Duration) {
    tracing::warn!(
        name = name.as_str(),
        allowance = ?allowance,
        "overload-signal: clock skew: requests carry a send time further in the future than \
         the skew allowance; their deadlines are counted from arrival. Check the hosts' time \
         synchronisation"
    );
}

/// Logs that no request has been sent from the future for `quiet`.
pub(super) fn skew_ended(name: &LayerName, ended: Ended, quiet: Duration) {
    tracing::info!(
        name = name.as_str(),
        lasted_ms = u64::try_from(ended.lasted.as_millis()).unwrap_or(u64::MAX),
        quiet = ?quiet,
        "overload-signal: clock skew no longer seen"
    );
}
