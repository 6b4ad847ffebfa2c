//! What every service made by one layer shares, and the decision on each response.
//!
//! Its own module so that the service (which records) and the response future (which
//! decides) both depend on it and not on each other.

use std::sync::OnceLock;

use http::header::CONTENT_LENGTH;
use http::{Response, StatusCode};
use metrics::{Counter, Gauge};

use super::StopRule;
use crate::clock::{Clock, TokioClock};
use crate::histogram::{AttemptClass, AttemptHistogram, AttemptSnapshot};
use crate::metric_names;
use crate::protocol::{self, Attempt, Protocol};
use crate::sync::{AtomicU64, Ordering};

/// What every service made by one layer shares.
pub(crate) struct Shared<C: Clock = TokioClock> {
    pub(super) histogram: AttemptHistogram<C>,
    pub(super) rule: StopRule,
    /// One past the bucket whose window was last exported as gauges (0: never).
    exported: AtomicU64,
    /// The metric handles, registered on first use.
    metrics: OnceLock<Handles>,
}

/// The layer's metric handles.
///
/// NOTE: registered on first use (the first request, or the first response decided,
/// whichever comes first), not when the layer is built: an application often builds its
/// router before it installs its recorder, and a handle registered before the recorder is
/// installed is a no-op for good. A recorder installed after the first request does not
/// receive this layer's metrics.
struct Handles {
    stop_signals: Counter,
    rejections_passed: Counter,
    propagated_marker: Counter,
    propagated_response: Counter,
    window_requests: [Gauge; AttemptClass::ALL.len()],
    window_retry_share: Gauge,
}

impl Handles {
    fn register() -> Self {
        Self {
            stop_signals: metrics::counter!(metric_names::STOP_SIGNALS),
            rejections_passed: metrics::counter!(metric_names::REJECTIONS_PASSED),
            propagated_marker: metrics::counter!(metric_names::PROPAGATED, "via" => "marker"),
            propagated_response: metrics::counter!(metric_names::PROPAGATED, "via" => "response"),
            window_requests: AttemptClass::ALL.map(
                |class| metrics::gauge!(metric_names::WINDOW_REQUESTS, "attempt" => class.label()),
            ),
            window_retry_share: metrics::gauge!(metric_names::WINDOW_RETRY_SHARE),
        }
    }

    fn export(&self, window: &AttemptSnapshot) {
        for (gauge, class) in self.window_requests.iter().zip(AttemptClass::ALL) {
            // u64 -> f64 loses precision only above 2^53 requests.
            gauge.set(window.count(class) as f64);
        }
        self.window_retry_share
            .set(window.retry_share().unwrap_or(0.0));
    }
}

impl<C: Clock> Shared<C> {
    pub(super) fn new(histogram: AttemptHistogram<C>, rule: StopRule) -> Self {
        Self {
            histogram,
            rule,
            exported: AtomicU64::new(0),
            metrics: OnceLock::new(),
        }
    }

    fn metrics(&self) -> &Handles {
        self.metrics.get_or_init(Handles::register)
    }

    pub(super) fn record(&self, attempt: Attempt) {
        let bucket = self.histogram.bucket_now();
        self.histogram.record_in(bucket, AttemptClass::of(attempt));
        // The first request of each bucket refreshes the window gauges, with the window
        // that ended with the previous bucket (whole buckets, so the figure is stable).
        let mark = bucket + 1;
        let seen = self.exported.load(Ordering::Relaxed);
        if seen < mark
            && self
                .exported
                .compare_exchange(seen, mark, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let window = self.histogram.snapshot_of(bucket.saturating_sub(1));
            self.metrics().export(&window);
        }
    }

    /// The response to send, given the inner stack's and whether a downstream call made
    /// while producing it received the stop signal.
    pub(super) fn respond<B: Default>(
        &self,
        mut response: Response<B>,
        protocol: Protocol,
        downstream_stop: bool,
    ) -> Response<B> {
        // NOTE: every case below is a failure (rejections and stop signals included: 429,
        // 503 and gRPC 8 and 14 are failures), so successes and deliberate 4xx, the admitted
        // path, leave here after a status check.
        if !is_failure(&response, protocol) {
            return response;
        }
        if protocol::is_stop_signal(response.headers()) {
            // Already the stop signal: the handler mapped a downstream `Overloaded` itself
            // (or an inner layer sent it). Pass it on.
            self.metrics().propagated_response.increment(1);
            return response;
        }
        if downstream_stop {
            tracing::debug!(
                status = %response.status(),
                "downstream call received the stop signal; propagating it"
            );
            rewrite_as_stop_signal(&mut response, protocol);
            self.metrics().propagated_marker.increment(1);
            return response;
        }
        if is_rejection(&response, protocol) {
            let window = self.histogram.snapshot();
            if self.rule.should_stop(&window) {
                tracing::debug!(
                    status = %response.status(),
                    requests = window.total(),
                    retries = window.retries(),
                    "rejection with a high retry share; answering with the stop signal"
                );
                rewrite_as_stop_signal(&mut response, protocol);
                self.metrics().stop_signals.increment(1);
            } else {
                self.metrics().rejections_passed.increment(1);
            }
        }
        response
    }
}

/// A rejection the decision rule may turn into the stop signal: HTTP 429 or 503; for gRPC
/// also `grpc-status` 8 (RESOURCE_EXHAUSTED) or 14 (UNAVAILABLE) in a trailers-only response.
pub(super) fn is_rejection<B>(response: &Response<B>, protocol: Protocol) -> bool {
    if matches!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        return true;
    }
    protocol == Protocol::Grpc
        && matches!(
            protocol::grpc_status(response.headers()),
            Some(protocol::GRPC_RESOURCE_EXHAUSTED | protocol::GRPC_UNAVAILABLE)
        )
}

/// A failure a client would retry, which a downstream stop signal replaces: HTTP 5xx or
/// 429; for gRPC also the server-side failure codes in a trailers-only response.
pub(super) fn is_failure<B>(response: &Response<B>, protocol: Protocol) -> bool {
    let status = response.status();
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        return true;
    }
    // UNKNOWN (2), DEADLINE_EXCEEDED (4), RESOURCE_EXHAUSTED (8), INTERNAL (13),
    // UNAVAILABLE (14), DATA_LOSS (15): the codes gRPC maps from 5xx and 429. The others
    // are the caller's fault or a deliberate answer, and are never retried.
    protocol == Protocol::Grpc
        && matches!(
            protocol::grpc_status(response.headers()),
            Some(2 | 4 | 8 | 13 | 14 | 15)
        )
}

fn rewrite_as_stop_signal<B: Default>(response: &mut Response<B>, protocol: Protocol) {
    protocol::set_stop_signal(response, protocol);
    if protocol == Protocol::Grpc {
        // A gRPC stop signal is trailers-only: any message body must go.
        *response.body_mut() = B::default();
        response.headers_mut().remove(CONTENT_LENGTH);
    }
}
