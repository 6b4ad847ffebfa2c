use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::StopRule;
use super::service::OverloadSignal;
use super::shared::Shared;
use crate::clock::{Clock, TokioClock};
use crate::histogram::AttemptHistogram;

/// Applies [`OverloadSignal`] to a service: records every request's attempt counter, turns
/// rejections into the stop signal when the fleet is drowning in retries, and propagates a
/// downstream stop signal. See the [module docs](crate::signal).
///
/// Every service this layer makes shares one histogram, so an axum `Router::layer` (which
/// wraps each route) still judges the whole server's traffic. Cheap to clone; clones share
/// the histogram too. `C` is the histogram's clock.
///
/// Defaults ([`OverloadSignalLayer::new`], [`OverloadSignalLayer::builder`]): the default
/// [`AttemptHistogram`] (10 seconds in 10 buckets of 1 second, the paper's and the SRE
/// book's retry-budget window) and the default [`StopRule`] (retry share above 5 %, half the
/// usual 10 % client budget, with at least 200 requests in the window).
pub struct OverloadSignalLayer<C: Clock = TokioClock> {
    shared: Arc<Shared<C>>,
}

impl OverloadSignalLayer {
    /// A layer with the defaults: the default [`AttemptHistogram`] and [`StopRule`].
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder that starts from the defaults.
    pub fn builder() -> OverloadSignalLayerBuilder {
        OverloadSignalLayerBuilder {
            histogram: AttemptHistogram::new(),
            rule: StopRule::new(),
        }
    }
}

impl Default for OverloadSignalLayer {
    /// The same as [`OverloadSignalLayer::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> OverloadSignalLayer<C> {
    /// The histogram this layer records into.
    pub fn histogram(&self) -> &AttemptHistogram<C> {
        &self.shared.histogram
    }

    /// The rule this layer decides with.
    pub fn rule(&self) -> &StopRule {
        &self.shared.rule
    }
}

impl<C: Clock> Clone for OverloadSignalLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock> fmt::Debug for OverloadSignalLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadSignalLayer")
            .field("histogram", &self.shared.histogram)
            .field("rule", &self.shared.rule)
            .finish()
    }
}

impl<S, C: Clock> Layer<S> for OverloadSignalLayer<C> {
    type Service = OverloadSignal<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        OverloadSignal::from_shared(inner, Arc::clone(&self.shared))
    }
}

/// Builds an [`OverloadSignalLayer`] from a histogram and a rule, both already validated;
/// each starts at its default. [`build`](Self::build) cannot fail.
pub struct OverloadSignalLayerBuilder<C: Clock = TokioClock> {
    histogram: AttemptHistogram<C>,
    rule: StopRule,
}

impl<C: Clock> OverloadSignalLayerBuilder<C> {
    /// The histogram to record into. Default: [`AttemptHistogram::new`] (10 seconds in 10
    /// buckets, on tokio's clock).
    ///
    /// Keep a clone of it to read its [`snapshot`](AttemptHistogram::snapshot) elsewhere (a
    /// status page, a test); [`OverloadSignalLayer::histogram`] returns it too.
    pub fn histogram<C2: Clock>(
        self,
        histogram: AttemptHistogram<C2>,
    ) -> OverloadSignalLayerBuilder<C2> {
        OverloadSignalLayerBuilder {
            histogram,
            rule: self.rule,
        }
    }

    /// The rule that decides when a rejection becomes the stop signal. Default:
    /// [`StopRule::new`] (retry share above 5 % with at least 200 requests).
    pub fn rule(mut self, rule: StopRule) -> Self {
        self.rule = rule;
        self
    }

    /// Builds the layer.
    pub fn build(self) -> OverloadSignalLayer<C> {
        OverloadSignalLayer {
            shared: Arc::new(Shared::new(self.histogram, self.rule)),
        }
    }
}

impl<C: Clock> fmt::Debug for OverloadSignalLayerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadSignalLayerBuilder")
            .field("histogram", &self.histogram)
            .field("rule", &self.rule)
            .finish()
    }
}
