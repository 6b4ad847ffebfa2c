//! The retry layer: [`RetryLayer`] and [`Retry`].
//!
//! See the [crate docs](crate) for the behaviour, defaults, outcomes and metrics.

pub mod future;
mod layer;
mod service;

use std::sync::Arc;
use std::time::Duration;

pub use layer::{RetryBuilder, RetryLayer};
pub use service::Retry;

use crate::backoff::{Backoff, Seeds};
use crate::budget::Budget;
use crate::classify::Classify;

/// Everything a [`Retry`] needs, shared by all its clones and requests.
pub(crate) struct Config {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) budget: Arc<dyn Budget>,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) body_limit: usize,
    pub(crate) seeds: Arc<Seeds>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // NOTE: `Budget` is not `Debug`; it is left out.
        f.debug_struct("Config")
            .field("max_attempts", &self.max_attempts)
            .field("deadline", &self.deadline)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("backoff", &self.backoff)
            .field("classifier", &self.classifier)
            .field("body_limit", &self.body_limit)
            .finish_non_exhaustive()
    }
}

/// Metric names; documented in the crate docs.
pub(crate) mod metric {
    pub(crate) const REQUESTS: &str = "backoff_layer_requests_total";
    pub(crate) const ATTEMPTS: &str = "backoff_layer_attempts_total";
    pub(crate) const RETRIES: &str = "backoff_layer_retries_total";
    pub(crate) const GAVE_UP: &str = "backoff_layer_gave_up_total";
    pub(crate) const STOP_SIGNALS: &str = "backoff_layer_stop_signals_total";
    pub(crate) const RETRY_DELAY: &str = "backoff_layer_retry_delay_seconds";
}
