//! What a [`RetryBudget`](super::RetryBudget) reports: its counters, labelled with its name,
//! and its refusals, logged once per episode.

use std::time::Duration;

use metrics::{Counter, counter};
use overload_core::telemetry::{Ended, LayerName, MetricSet, NAME_LABEL};
use overload_signal::protocol::Criticality;

/// Metric: withdrawals that succeeded.
pub(crate) const RETRIES_ALLOWED: &str = "backoff_layer_budget_retries_allowed_total";
/// Metric: withdrawals that were refused.
pub(crate) const RETRIES_REFUSED: &str = "backoff_layer_budget_retries_refused_total";

/// The label naming a request's level of criticality (`Criticality::as_str`).
pub(crate) const CRITICALITY_LABEL: &str = "criticality";

/// A budget's counters, registered on its first deposit (its first request).
pub(crate) struct RetryBudgetMetrics {
    pub(crate) allowed: Counter,
    /// Refusals, by the level of the request whose retry was refused (indexed by `rank()`).
    pub(crate) refused: [Counter; 4],
}

impl MetricSet for RetryBudgetMetrics {
    fn register(name: &LayerName) -> Self {
        Self {
            allowed: counter!(RETRIES_ALLOWED, NAME_LABEL => name.label()),
            refused: Criticality::ALL.map(|level| {
                counter!(
                    RETRIES_REFUSED,
                    NAME_LABEL => name.label(),
                    CRITICALITY_LABEL => level.as_str(),
                )
            }),
        }
    }
}

/// Logs, once, that the budget has begun refusing retries.
#[cold]
pub(crate) fn refusing_began(name: &LayerName, ratio: f64, window: Duration) {
    tracing::warn!(
        name = name.as_str(),
        ratio,
        window_secs = window.as_secs_f64(),
        "retry budget exhausted: retries are refused until first attempts earn more"
    );
}

/// Logs, once, that the budget has refused no retry for a whole window.
#[cold]
pub(crate) fn refusing_ended(name: &LayerName, ended: Ended) {
    tracing::info!(
        name = name.as_str(),
        lasted_ms = u64::try_from(ended.lasted.as_millis()).unwrap_or(u64::MAX),
        "retry budget no longer refusing retries"
    );
}
