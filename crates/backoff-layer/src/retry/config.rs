//! [`RetryConfig`]: everything a retry layer's requests share.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use overload_core::clock::{Clock, TokioClock, WallClock};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics};

use super::destinations::DestinationSeries;
use super::telemetry::{RetryMetrics, STOP_SIGNAL_QUIET, stop_signals_began, stop_signals_ended};
use crate::backoff::{Backoff, Seeds};
use crate::budget::Budget;
use crate::classify::Classify;
use crate::throttle::Throttle;

use super::stop::StopSignals;

/// Everything a [`Retry`](super::Retry) needs, shared by all its clones and requests.
pub(crate) struct RetryConfig {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Duration>,
    /// Whether gRPC attempts carry the deadline in `grpc-timeout`: only a deadline set
    /// with `RetryBuilder::deadline`, never the default one, which would cut a long
    /// server-streaming call on the server's side. (HTTP attempts carry any deadline in
    /// `X-Request-Deadline`, which promises a wait for the response's head only.)
    pub(crate) deadline_on_wire: bool,
    /// Where `X-Request-Deadline`'s send time is read.
    // NOTE: a trait object rather than a type parameter: only simulations and tests set
    // it, and a parameter would burden every type a user names (`Retry<Channel, Tonic>`).
    pub(crate) wall: Arc<dyn WallClock>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) max_retry_after: Duration,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) budget: Arc<dyn Budget>,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) body_limit: usize,
    pub(crate) seeds: Arc<Seeds>,
    /// Whether a downstream's stop signal is passed up, or honoured only.
    pub(crate) stop_signal_policy: StopSignals,
    /// The client-side throttle, shared by every clone of the layer; `None` when turned
    /// off.
    pub(crate) throttle: Option<Throttle>,
    /// The layer's name and its metric handles, registered on the first request; read
    /// through [`RetryConfig::metrics`].
    pub(crate) metrics: LazyMetrics<RetryMetrics>,
    /// Effective and actual outcomes per destination, registered per destination on its
    /// first request.
    pub(crate) destinations: DestinationSeries,
    /// Failures carrying the stop signal: begins at the first, ends after
    /// [`STOP_SIGNAL_QUIET`] without one.
    pub(crate) stop_signals: Episode,
    /// The episodes' clock.
    pub(crate) clock: TokioClock,
}

impl RetryConfig {
    /// The layer's metric handles.
    ///
    /// Registered with the recorder installed when the layer serves its first request, then
    /// kept: each request costs one atomic load here instead of a registry lookup per
    /// metric. Registering on first use rather than when the layer is built lets an
    /// application build its clients before it installs its recorder.
    // NOTE: a recorder installed after the first request never sees this layer's metrics;
    // the `metrics` facade has the same rule for any handle kept.
    #[inline]
    pub(crate) fn metrics(&self) -> &RetryMetrics {
        self.metrics.get()
    }

    /// The layer's name.
    pub(crate) const fn name(&self) -> &LayerName {
        self.metrics.name()
    }

    /// Counts a failure carrying the stop signal, and logs it if it begins an episode.
    pub(crate) fn stop_signal_seen(&self) {
        self.metrics().stop_signals.increment(1);
        if self.stop_signals.seen(self.clock.now()) {
            stop_signals_began(self.name());
        }
    }

    /// Ends the stop-signal episode if none has come for [`STOP_SIGNAL_QUIET`]: called on
    /// every request, so an episode ends on the first request after a quiet period.
    #[inline]
    pub(crate) fn end_quiet_episodes(&self) {
        if self.stop_signals.is_active() {
            self.end_stop_signals();
        }
    }

    #[cold]
    fn end_stop_signals(&self) {
        if let Some(ended) = self
            .stop_signals
            .quiet_for(STOP_SIGNAL_QUIET, self.clock.now())
        {
            stop_signals_ended(self.name(), ended);
        }
    }
}

impl fmt::Debug for RetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NOTE: `Budget` is not `Debug`; it is left out.
        f.debug_struct("RetryConfig")
            .field("name", self.name())
            .field("max_attempts", &self.max_attempts)
            .field("deadline", &self.deadline)
            .field("deadline_on_wire", &self.deadline_on_wire)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("max_retry_after", &self.max_retry_after)
            .field("backoff", &self.backoff)
            .field("classifier", &self.classifier)
            .field("body_limit", &self.body_limit)
            .field("stop_signals", &self.stop_signal_policy)
            .field("throttle", &self.throttle)
            .field("max_destination_series", &self.destinations.max())
            .finish_non_exhaustive()
    }
}
