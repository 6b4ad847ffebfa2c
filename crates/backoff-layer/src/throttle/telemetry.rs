//! What a throttle reports: its counters and per-destination gauges, labelled with its name,
//! and each destination's throttling, logged once when it begins and once when it ends.

use std::time::Duration;

use metrics::{Counter, Gauge, counter, gauge};
use overload_core::telemetry::{Ended, LayerName, MetricSet, NAME_LABEL};
use overload_signal::protocol::Criticality;

/// Metric: requests refused by the throttle (not sent).
pub(crate) const REFUSED: &str = "backoff_layer_throttle_refused_total";
/// Metric: requests to a destination the table had no room for (never throttled).
pub(crate) const UNTRACKED: &str = "backoff_layer_throttle_untracked_total";
/// Metric: a destination's refusal probability.
pub(crate) const PROBABILITY: &str = "backoff_layer_throttle_probability";
/// The label naming a destination (`http://10.0.0.7:8080`).
pub(crate) const DESTINATION_LABEL: &str = "destination";

/// The label naming a request's level of criticality (`Criticality::as_str`).
pub(crate) const CRITICALITY_LABEL: &str = "criticality";

/// A throttle's counters, registered on its first request.
pub(crate) struct ThrottleMetrics {
    /// Refusals by the request's level (indexed by `rank()`).
    pub(crate) refused: [Counter; 4],
    pub(crate) untracked: Counter,
}

impl MetricSet for ThrottleMetrics {
    fn register(name: &LayerName) -> Self {
        Self {
            refused: Criticality::ALL.map(|level| {
                counter!(
                    REFUSED,
                    NAME_LABEL => name.label(),
                    CRITICALITY_LABEL => level.as_str(),
                )
            }),
            untracked: counter!(UNTRACKED, NAME_LABEL => name.label()),
        }
    }
}

/// The `destination` label of the series every destination without one of its own shares.
pub(crate) const OTHER_DESTINATIONS: &str = "(other)";

/// The gauge of `destination`'s refusal probability.
pub(crate) fn probability_gauge(name: &LayerName, destination: &str) -> Gauge {
    gauge!(PROBABILITY, NAME_LABEL => name.label(), DESTINATION_LABEL => destination.to_owned())
}

/// Logs, once, that the throttle began refusing requests to `destination`.
#[cold]
pub(crate) fn throttling_began(name: &LayerName, destination: &str, probability: f64) {
    tracing::warn!(
        name = name.as_str(),
        destination,
        probability,
        "destination keeps failing: client-side throttling refuses part of its requests \
         locally, and sends the rest as probes"
    );
}

/// Logs, once, that the throttle no longer refuses requests to `destination`.
#[cold]
pub(crate) fn throttling_ended(name: &LayerName, destination: &str, lasted: Duration) {
    tracing::info!(
        name = name.as_str(),
        destination,
        lasted_ms = u64::try_from(lasted.as_millis()).unwrap_or(u64::MAX),
        "destination accepts requests again: client-side throttling ended"
    );
}

/// Logs, once, that requests went to a destination the table had no room for.
#[cold]
pub(crate) fn untracked_began(name: &LayerName, capacity: usize) {
    tracing::warn!(
        name = name.as_str(),
        capacity,
        "client-side throttle full: requests to destinations it has no room for are sent \
         without throttling"
    );
}

/// Logs, once, that no request went to an untracked destination for a while.
#[cold]
pub(crate) fn untracked_ended(name: &LayerName, ended: Ended) {
    tracing::info!(
        name = name.as_str(),
        lasted_ms = u64::try_from(ended.lasted.as_millis()).unwrap_or(u64::MAX),
        "client-side throttle tracks every destination again"
    );
}
