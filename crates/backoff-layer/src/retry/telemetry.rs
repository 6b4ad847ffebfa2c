//! What a retry layer reports: its metrics (names documented in the crate docs), labelled
//! with its name, and its state changes, logged once.

use std::time::Duration;

use metrics::{Counter, Histogram, counter, histogram};
use overload_core::telemetry::{Ended, LayerName, MetricSet, NAME_LABEL};

use crate::outcome::GiveUpReason;

pub(crate) const REQUESTS: &str = "backoff_layer_requests_total";
pub(crate) const ATTEMPTS: &str = "backoff_layer_attempts_total";
pub(crate) const RETRIES: &str = "backoff_layer_retries_total";
pub(crate) const GAVE_UP: &str = "backoff_layer_gave_up_total";
pub(crate) const STOP_SIGNALS: &str = "backoff_layer_stop_signals_total";
pub(crate) const RETRY_DELAY: &str = "backoff_layer_retry_delay_seconds";

/// How long a layer must go without a stop signal before its "downstream says stop
/// retrying" episode ends: 10 seconds, the window over which `overload-signal` decides to
/// send the signal (its attempt histogram's default) and the retry budget's default window.
pub(crate) const STOP_SIGNAL_QUIET: Duration = Duration::from_secs(10);

/// Every metric of one layer, registered once, on the layer's first request.
pub(crate) struct RetryMetrics {
    pub(crate) requests: Counter,
    pub(crate) attempts: Counter,
    pub(crate) retries: Counter,
    pub(crate) stop_signals: Counter,
    pub(crate) retry_delay: Histogram,
    /// `backoff_layer_gave_up_total{name, reason}`, one series per reason, in the order of
    /// [`RetryMetrics::gave_up`]'s match.
    gave_up: [Counter; 6],
}

impl MetricSet for RetryMetrics {
    /// Registers every metric, labelled `name`. Every `gave_up` series is registered, at
    /// zero, so that a rate over it exists before the first give-up.
    fn register(name: &LayerName) -> Self {
        let gave_up = |reason: GiveUpReason| counter!(GAVE_UP, NAME_LABEL => name.label(), "reason" => reason.as_str());
        Self {
            requests: counter!(REQUESTS, NAME_LABEL => name.label()),
            attempts: counter!(ATTEMPTS, NAME_LABEL => name.label()),
            retries: counter!(RETRIES, NAME_LABEL => name.label()),
            stop_signals: counter!(STOP_SIGNALS, NAME_LABEL => name.label()),
            retry_delay: histogram!(RETRY_DELAY, NAME_LABEL => name.label()),
            gave_up: [
                gave_up(GiveUpReason::MaxAttempts),
                gave_up(GiveUpReason::BudgetExhausted),
                gave_up(GiveUpReason::Deadline),
                gave_up(GiveUpReason::BodyNotReplayable),
                gave_up(GiveUpReason::NotRetryable),
                gave_up(GiveUpReason::RetryAfterTooLong),
            ],
        }
    }
}

impl RetryMetrics {
    /// The give-up counter of `reason`.
    /// The counter of `reason`; `None` for [`GiveUpReason::StopSignal`], counted in
    /// `stop_signals` instead.
    pub(crate) const fn gave_up(&self, reason: GiveUpReason) -> Option<&Counter> {
        let i = match reason {
            GiveUpReason::MaxAttempts => 0,
            GiveUpReason::BudgetExhausted => 1,
            GiveUpReason::Deadline => 2,
            GiveUpReason::BodyNotReplayable => 3,
            GiveUpReason::NotRetryable => 4,
            GiveUpReason::RetryAfterTooLong => 5,
            GiveUpReason::StopSignal => return None,
        };
        Some(&self.gave_up[i])
    }
}

/// Logs, once, that the downstream has begun answering with the stop signal.
#[cold]
pub(crate) fn stop_signals_began(name: &LayerName) {
    tracing::warn!(
        name = name.as_str(),
        "downstream says stop retrying: failures carrying the stop signal are not retried"
    );
}

/// Logs, once, that no stop signal has come for [`STOP_SIGNAL_QUIET`].
#[cold]
pub(crate) fn stop_signals_ended(name: &LayerName, ended: Ended) {
    tracing::info!(
        name = name.as_str(),
        lasted_ms = u64::try_from(ended.lasted.as_millis()).unwrap_or(u64::MAX),
        "downstream no longer says stop retrying"
    );
}
