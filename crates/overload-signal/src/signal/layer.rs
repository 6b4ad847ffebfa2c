use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::StopRule;
use super::service::{OverloadSignal, Shared};
use crate::histogram::AttemptHistogram;

/// Applies [`OverloadSignal`] to a service: records every request's attempt counter, turns
/// rejections into the stop signal when the fleet is drowning in retries, and propagates a
/// downstream stop signal. See the [module docs](crate::signal).
///
/// Every service this layer makes shares one histogram, so an axum `Router::layer` (which
/// wraps each route) still judges the whole server's traffic. Cheap to clone; clones share
/// the histogram too.
#[derive(Clone)]
pub struct OverloadSignalLayer {
    shared: Arc<Shared>,
}

impl OverloadSignalLayer {
    /// A layer that records into `histogram` and decides with `rule`.
    ///
    /// Keep a clone of `histogram` to read its [`snapshot`](AttemptHistogram::snapshot)
    /// elsewhere (a status page, a test).
    pub fn new(histogram: AttemptHistogram, rule: StopRule) -> Self {
        Self {
            shared: Arc::new(Shared::new(histogram, rule)),
        }
    }

    /// The histogram this layer records into.
    pub fn histogram(&self) -> &AttemptHistogram {
        &self.shared.histogram
    }

    /// The rule this layer decides with.
    pub fn rule(&self) -> &StopRule {
        &self.shared.rule
    }
}

impl Default for OverloadSignalLayer {
    /// The default [`AttemptHistogram`] (10 seconds in 10 buckets) and the default
    /// [`StopRule`] (retry share above 5 % with at least 200 requests in the window).
    fn default() -> Self {
        Self::new(AttemptHistogram::default(), StopRule::default())
    }
}

impl fmt::Debug for OverloadSignalLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadSignalLayer")
            .field("histogram", &self.shared.histogram)
            .field("rule", &self.shared.rule)
            .finish()
    }
}

impl<S> Layer<S> for OverloadSignalLayer {
    type Service = OverloadSignal<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OverloadSignal::from_shared(inner, Arc::clone(&self.shared))
    }
}
