//! What every service made by one layer shares, and the decision on each response.
//!
//! Its own module so that the service (which records) and the response future (which
//! decides) both depend on it and not on each other.

use std::sync::{Arc, OnceLock};

use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{Response, StatusCode};
use metrics::{Counter, Gauge};

use super::callers::{Caller, CallerKey, CallerLedger, KeyHashing, TrustFn};
use super::{RejectionScope, StopRule};
use crate::histogram::{AttemptClass, AttemptHistogram, AttemptSnapshot};
use crate::metric_names;
use crate::protocol::{self, Protocol};
use overload_core::clock::{Clock, TokioClock};
use overload_core::sync::{AtomicU64, Ordering};

/// What every service made by one layer shares.
pub(crate) struct Shared<C: Clock = TokioClock> {
    pub(super) histogram: AttemptHistogram<C>,
    pub(super) rule: StopRule,
    pub(super) callers: CallerLedger<C>,
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
    /// Indexed by scope: server, caller.
    stop_signals: [Counter; 2],
    rejections_passed: [Counter; 2],
    propagated_marker: Counter,
    propagated_response: Counter,
    window_requests: [Gauge; AttemptClass::ALL.len()],
    window_retry_share: Gauge,
    window_retry_pressure: Gauge,
    window_per_caller_pressure: Gauge,
}

impl Handles {
    fn register() -> Self {
        let scoped = |name: &'static str| {
            [
                metrics::counter!(name, "scope" => "server"),
                metrics::counter!(name, "scope" => "caller"),
            ]
        };
        Self {
            stop_signals: scoped(metric_names::STOP_SIGNALS),
            rejections_passed: scoped(metric_names::REJECTIONS_PASSED),
            propagated_marker: metrics::counter!(metric_names::PROPAGATED, "via" => "marker"),
            propagated_response: metrics::counter!(metric_names::PROPAGATED, "via" => "response"),
            window_requests: AttemptClass::ALL.map(
                |class| metrics::gauge!(metric_names::WINDOW_REQUESTS, "attempt" => class.label()),
            ),
            window_retry_share: metrics::gauge!(metric_names::WINDOW_RETRY_SHARE),
            window_retry_pressure: metrics::gauge!(metric_names::WINDOW_RETRY_PRESSURE),
            window_per_caller_pressure: metrics::gauge!(metric_names::WINDOW_PER_CALLER_PRESSURE),
        }
    }

    fn export(&self, window: &AttemptSnapshot, per_caller: Option<f64>) {
        for (gauge, class) in self.window_requests.iter().zip(AttemptClass::ALL) {
            // u64 -> f64 loses precision only above 2^53 requests.
            gauge.set(window.count(class) as f64);
        }
        self.window_retry_share
            .set(window.retry_share().unwrap_or(0.0));
        self.window_retry_pressure
            .set(window.retry_pressure().unwrap_or(0.0));
        self.window_per_caller_pressure
            .set(per_caller.unwrap_or(0.0));
    }
}

impl<C: Clock> Shared<C> {
    pub(super) fn new(
        histogram: AttemptHistogram<C>,
        rule: StopRule,
        key: Arc<dyn CallerKey>,
        trust: Option<Arc<TrustFn>>,
        hashing: KeyHashing,
    ) -> Self {
        Self {
            callers: CallerLedger::new(&histogram, key, trust, hashing),
            histogram,
            rule,
            exported: AtomicU64::new(0),
            metrics: OnceLock::new(),
        }
    }

    fn metrics(&self) -> &Handles {
        self.metrics.get_or_init(Handles::register)
    }

    /// Records a request: its attempt counter (if its caller is trusted) in the histogram,
    /// and in its caller class.
    pub(super) fn record(&self, parts: &Parts) -> Caller {
        let (attempt, lane) = self.callers.identify(parts);
        let class = AttemptClass::of(attempt);
        let bucket = self.histogram.bucket_now();
        self.histogram.record_in(bucket, class);
        let caller = self.callers.record(bucket, lane, class.is_retry());
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
            let last = bucket.saturating_sub(1);
            let window = self.histogram.snapshot_of(last);
            let per_caller = self.callers.per_caller_pressure(last);
            self.metrics().export(&window, per_caller);
        }
        caller
    }

    /// The response to send, given the inner stack's and whether a downstream call made
    /// while producing it received the stop signal.
    pub(super) fn respond<B: Default>(
        &self,
        mut response: Response<B>,
        protocol: Protocol,
        downstream_stop: bool,
        caller: Caller,
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
            let bucket = self.histogram.bucket_now();
            let scope = response
                .extensions()
                .get::<RejectionScope>()
                .copied()
                .unwrap_or_default();
            let stop = match scope {
                RejectionScope::Server => self.server_is_drowning(bucket),
                RejectionScope::Caller => self.caller_is_drowning(bucket, caller),
            };
            let scope_index = scope as usize;
            if stop {
                tracing::debug!(
                    status = %response.status(),
                    scope = scope.as_str(),
                    "rejection under high retry pressure; answering with the stop signal"
                );
                rewrite_as_stop_signal(&mut response, protocol);
                self.metrics().stop_signals[scope_index].increment(1);
                if self.rule.sustain() && !caller.retry {
                    // NOTE: the retry this answer holds back keeps the pressure up (see
                    // `StopRule::sustain`); a retry is already counted as one.
                    self.histogram.record_stopped_in(bucket);
                    self.callers.record_stopped(bucket, caller);
                }
            } else {
                self.metrics().rejections_passed[scope_index].increment(1);
            }
        }
        response
    }

    /// The rule on the whole server's window: its retry pressure, and the same with each
    /// caller class's weight capped, both above the threshold.
    fn server_is_drowning(&self, bucket: u64) -> bool {
        let window = self.histogram.snapshot_of(bucket);
        // NOTE: the plain rule first: it is cheap, and the per-caller figure is only ever
        // needed when it fires (per-caller accounting can prevent a stop signal, never cause
        // one).
        self.rule.should_stop(&window)
            && self
                .callers
                .per_caller_fires(&self.rule, bucket, window.total())
    }

    /// The rule on the rejected caller's own class.
    fn caller_is_drowning(&self, bucket: u64, caller: Caller) -> bool {
        let (requests, pressure) = self.callers.class_pressure(bucket, caller);
        self.rule.fires(requests, pressure)
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
