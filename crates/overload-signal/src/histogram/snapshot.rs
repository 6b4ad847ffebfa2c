//! What a window of the histogram holds, and the figures the decision rule reads from it.

use metrics::Gauge;
use overload_core::telemetry::{LayerName, NAME_LABEL};

use super::attempts::AttemptClass;
use crate::metric_names;

/// The counts of one window of an [`AttemptHistogram`](super::AttemptHistogram).
///
/// ```
/// use overload_signal::{AttemptClass, AttemptHistogram};
/// use overload_signal::protocol::Attempt;
///
/// let h = AttemptHistogram::new();
/// for a in [Attempt::Number(0), Attempt::Number(5), Attempt::Unknown, Attempt::Malformed] {
///     h.record(a);
/// }
/// let s = h.snapshot();
/// assert_eq!(s.count(AttemptClass::Retry3OrMore), 1);
/// assert_eq!(s.count(AttemptClass::Malformed), 1);
/// assert_eq!(s.total(), 4);
/// assert_eq!(s.retries(), 1);
/// assert_eq!(s.retry_share(), Some(0.25));
/// // Nothing was answered with the stop signal: the pressure is the retry share.
/// assert_eq!(s.stopped(), 0);
/// assert_eq!(s.retry_pressure(), Some(0.25));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptSnapshot {
    counts: [u64; 6],
    stopped: u64,
}

impl AttemptSnapshot {
    /// A snapshot with these counts, indexed as [`AttemptClass::ALL`], and nothing
    /// [stopped](Self::stopped); for tests and for evaluating a [`StopRule`](crate::StopRule)
    /// on figures from elsewhere.
    pub const fn from_counts(counts: [u64; 6]) -> Self {
        Self { counts, stopped: 0 }
    }

    /// This snapshot with [`stopped`](Self::stopped) set to `stopped`.
    pub const fn with_stopped(mut self, stopped: u64) -> Self {
        self.stopped = stopped;
        self
    }

    /// The requests of one class.
    pub const fn count(&self, class: AttemptClass) -> u64 {
        self.counts[class.index()]
    }

    /// Every request in the window, whatever its counter.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The known retries in the window: attempt `1` and above.
    pub fn retries(&self) -> u64 {
        AttemptClass::ALL
            .iter()
            .filter(|c| c.is_retry())
            .map(|&c| self.count(c))
            .sum()
    }

    /// The share of the window's requests that are known retries, in `[0, 1]`; `None` when
    /// the window is empty.
    ///
    /// The denominator is every request, including those with an unknown or malformed
    /// counter: requests the server cannot judge dilute the share rather than inflate it, so
    /// clients that do not send the header can never make a server send the stop signal.
    pub fn retry_share(&self) -> Option<f64> {
        let total = self.total();
        // u64 -> f64 loses precision only above 2^53 requests, far beyond saturation.
        (total > 0).then(|| self.retries() as f64 / total as f64)
    }

    /// The requests of the window that were not known retries and that the
    /// [`OverloadSignalLayer`](crate::OverloadSignalLayer) answered with the stop signal
    /// because its rule fired: each stands for a retry the signal held back.
    ///
    /// Counted in the bucket of the answer, which is almost always the request's own.
    pub const fn stopped(&self) -> u64 {
        self.stopped
    }

    /// The share of the window's requests that were known retries **or** were told to stop
    /// retrying ([`stopped`](Self::stopped)), in `[0, 1]`; `None` when the window is empty.
    ///
    /// This is what a sustained [`StopRule`](crate::StopRule) judges: callers who obey the
    /// stop signal stop retrying, so their retries leave the window, but the answers that
    /// held those retries back take their place, and the share stays up for as long as the
    /// server keeps answering a large share of its traffic with the stop signal.
    pub fn retry_pressure(&self) -> Option<f64> {
        let total = self.total();
        let pressed = (self.retries() + self.stopped).min(total);
        // u64 -> f64 loses precision only above 2^53 requests, far beyond saturation.
        (total > 0).then(|| pressed as f64 / total as f64)
    }

    /// Sets the `metrics` gauges that describe this window, labelled `name` = `name` (see
    /// [`metric_names`]): [`WINDOW_REQUESTS`](metric_names::WINDOW_REQUESTS) per `attempt`
    /// label, [`WINDOW_RETRY_SHARE`](metric_names::WINDOW_RETRY_SHARE) and
    /// [`WINDOW_RETRY_PRESSURE`](metric_names::WINDOW_RETRY_PRESSURE).
    ///
    /// The [`OverloadSignalLayer`](crate::OverloadSignalLayer) sets the same gauges itself,
    /// labelled with its own [name](crate::OverloadSignalLayer::name), every bucket; this is
    /// for a histogram used without the layer. Registers the gauges with the current
    /// recorder on every call: call it periodically, not per request.
    ///
    /// ```
    /// use overload_signal::{AttemptHistogram, LayerName};
    ///
    /// let histogram = AttemptHistogram::new();
    /// histogram.snapshot().export_metrics(&LayerName::new("edge")?);
    /// # Ok::<(), overload_signal::ConfigError>(())
    /// ```
    pub fn export_metrics(&self, name: &LayerName) {
        AttemptWindowGauges::register(name).set(self);
    }
}

/// The gauges that describe one window of the histogram, for one layer name.
pub(crate) struct AttemptWindowGauges {
    requests: [Gauge; AttemptClass::ALL.len()],
    retry_share: Gauge,
    retry_pressure: Gauge,
}

impl AttemptWindowGauges {
    /// Registers the gauges with the current recorder, labelled `name` = `name`.
    pub(crate) fn register(name: &LayerName) -> Self {
        Self {
            requests: AttemptClass::ALL.map(|class| {
                metrics::gauge!(
                    metric_names::WINDOW_REQUESTS,
                    NAME_LABEL => name.label(),
                    "attempt" => class.label()
                )
            }),
            retry_share: metrics::gauge!(
                metric_names::WINDOW_RETRY_SHARE,
                NAME_LABEL => name.label()
            ),
            retry_pressure: metrics::gauge!(
                metric_names::WINDOW_RETRY_PRESSURE,
                NAME_LABEL => name.label()
            ),
        }
    }

    /// Sets the gauges to `window`'s figures; the shares read 0 when it is empty.
    pub(crate) fn set(&self, window: &AttemptSnapshot) {
        for (gauge, class) in self.requests.iter().zip(AttemptClass::ALL) {
            // u64 -> f64 loses precision only above 2^53 requests.
            gauge.set(window.count(class) as f64);
        }
        self.retry_share.set(window.retry_share().unwrap_or(0.0));
        self.retry_pressure
            .set(window.retry_pressure().unwrap_or(0.0));
    }
}
