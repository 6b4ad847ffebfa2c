//! The retry layer's metrics: names (documented in the crate docs) and kept handles.

use metrics::{Counter, Histogram, counter, histogram};

use crate::outcome::GiveUpReason;

pub(crate) const REQUESTS: &str = "backoff_layer_requests_total";
pub(crate) const ATTEMPTS: &str = "backoff_layer_attempts_total";
pub(crate) const RETRIES: &str = "backoff_layer_retries_total";
pub(crate) const GAVE_UP: &str = "backoff_layer_gave_up_total";
pub(crate) const STOP_SIGNALS: &str = "backoff_layer_stop_signals_total";
pub(crate) const RETRY_DELAY: &str = "backoff_layer_retry_delay_seconds";

/// Every metric of one layer, registered once.
pub(crate) struct Metrics {
    pub(crate) requests: Counter,
    pub(crate) attempts: Counter,
    pub(crate) retries: Counter,
    pub(crate) stop_signals: Counter,
    pub(crate) retry_delay: Histogram,
    /// `backoff_layer_gave_up_total{reason}`, one series per reason, in the order of
    /// [`Metrics::gave_up`]'s match.
    gave_up: [Counter; 6],
}

impl Metrics {
    /// Registers every metric with the current recorder (the thread's local recorder if one
    /// is set, else the global one). Every `gave_up` series is registered, at zero, so that
    /// a rate over it exists before the first give-up.
    pub(crate) fn register() -> Self {
        let gave_up = |reason: GiveUpReason| counter!(GAVE_UP, "reason" => reason.as_str());
        Self {
            requests: counter!(REQUESTS),
            attempts: counter!(ATTEMPTS),
            retries: counter!(RETRIES),
            stop_signals: counter!(STOP_SIGNALS),
            retry_delay: histogram!(RETRY_DELAY),
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

    /// The give-up counter of `reason`.
    pub(crate) const fn gave_up(&self, reason: GiveUpReason) -> &Counter {
        let i = match reason {
            GiveUpReason::MaxAttempts => 0,
            GiveUpReason::BudgetExhausted => 1,
            GiveUpReason::Deadline => 2,
            GiveUpReason::BodyNotReplayable => 3,
            GiveUpReason::NotRetryable => 4,
            GiveUpReason::RetryAfterTooLong => 5,
        };
        &self.gave_up[i]
    }
}
