use std::fmt;
use std::sync::Arc;

use overload_core::clock::{Clock, TokioClock};
use tower_layer::Layer;

use super::service::{SignalDeadline, SignalDeadlineState};
use crate::{DeadlineLayer, OverloadSignalLayer};

/// Applies [`SignalDeadline`]: an [`OverloadSignalLayer`] around a [`DeadlineLayer`], as one
/// layer; see the [module docs](crate::signal_deadline).
///
/// Built from the two layers, whose state (histogram, rule, metrics, episodes) it shares
/// with them: read the window with the overload layer's `histogram()`. Cheap to clone;
/// `Clone + Send + Sync`. Its settings are the two layers' own, defaults included.
pub struct SignalDeadlineLayer<C: Clock = TokioClock> {
    shared: Arc<SignalDeadlineState<C>>,
}

impl<C: Clock> SignalDeadlineLayer<C> {
    /// `signal` around `deadline`, as one layer.
    pub fn new(signal: &OverloadSignalLayer<C>, deadline: &DeadlineLayer) -> Self {
        Self {
            shared: Arc::new(SignalDeadlineState::new(signal, deadline)),
        }
    }
}

impl<C: Clock> Clone for SignalDeadlineLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock> fmt::Debug for SignalDeadlineLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalDeadlineLayer")
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S, C: Clock> Layer<S> for SignalDeadlineLayer<C> {
    type Service = SignalDeadline<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        SignalDeadline::from_shared(inner, Arc::clone(&self.shared))
    }
}
