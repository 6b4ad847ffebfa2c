use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::header::CONTENT_LENGTH;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower_service::Service;

use super::StopRule;
use super::future::ResponseFuture;
use crate::histogram::{AttemptClass, AttemptHistogram};
use crate::metric_names;
use crate::propagation;
use crate::protocol::{self, Attempt, Protocol};

/// Server middleware that records attempt counters and answers with the stop signal when
/// the fleet is drowning in retries or a downstream call received it.
///
/// Made by [`OverloadSignalLayer`](super::OverloadSignalLayer); see the
/// [module docs](crate::signal) for what it does to each response.
#[derive(Clone)]
pub struct OverloadSignal<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> OverloadSignal<S> {
    /// Wraps `inner` with its own histogram and rule. Prefer
    /// [`OverloadSignalLayer`](super::OverloadSignalLayer), whose services share one
    /// histogram.
    pub fn new(inner: S, histogram: AttemptHistogram, rule: StopRule) -> Self {
        Self::from_shared(inner, Arc::new(Shared::new(histogram, rule)))
    }

    pub(super) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes this middleware, returning the wrapped service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The histogram this middleware records into.
    pub fn histogram(&self) -> &AttemptHistogram {
        &self.shared.histogram
    }
}

impl<S: fmt::Debug> fmt::Debug for OverloadSignal<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadSignal")
            .field("inner", &self.inner)
            .field("histogram", &self.shared.histogram)
            .field("rule", &self.shared.rule)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for OverloadSignal<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // No capacity of our own: readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let protocol = Protocol::of_request(&request);
        // NOTE: recorded before the inner stack runs, so rejected requests count too: a
        // storm of rejected retries is exactly what the histogram must see.
        self.shared.record(Attempt::from_request(&request));
        let inner = propagation::scope(self.inner.call(request));
        ResponseFuture::new(inner, protocol, Arc::clone(&self.shared))
    }
}

/// What every service made by one layer shares.
pub(crate) struct Shared {
    pub(super) histogram: AttemptHistogram,
    pub(super) rule: StopRule,
    /// One past the bucket whose window was last exported as gauges (0: never).
    exported: AtomicU64,
}

impl Shared {
    pub(super) fn new(histogram: AttemptHistogram, rule: StopRule) -> Self {
        Self {
            histogram,
            rule,
            exported: AtomicU64::new(0),
        }
    }

    pub(super) fn record(&self, attempt: Attempt) {
        let bucket = self.histogram.bucket_at(Instant::now());
        self.histogram
            .record_in_bucket(AttemptClass::of(attempt), bucket);
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
            self.histogram
                .snapshot_of_bucket(bucket.saturating_sub(1))
                .export_metrics();
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
            metrics::counter!(metric_names::PROPAGATED, "via" => "response").increment(1);
            return response;
        }
        if downstream_stop {
            tracing::debug!(
                status = %response.status(),
                "downstream call received the stop signal; propagating it"
            );
            rewrite_as_stop_signal(&mut response, protocol);
            metrics::counter!(metric_names::PROPAGATED, "via" => "marker").increment(1);
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
                metrics::counter!(metric_names::STOP_SIGNALS).increment(1);
            } else {
                metrics::counter!(metric_names::REJECTIONS_PASSED).increment(1);
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
