//! The middleware: [`AdaptiveLimit`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use overload_core::clock::{Clock, TokioClock};
use overload_signal::protocol::{Criticality, Protocol, service_unavailable_response};
use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};
use tower_service::Service;

use super::future::{AdmissionGuard, ResponseFuture};
use super::state::{AdaptiveLimitState, CompleteRequest};

/// Admits requests up to an adaptive concurrency limit and rejects the rest at once; see
/// the [module docs](super).
///
/// Built by [`AdaptiveLimitLayer`](super::AdaptiveLimitLayer); clones share the same
/// limit. The wrapped service is reached with `get_ref`, `get_mut` and `into_inner`.
pub struct AdaptiveLimit<S, C = TokioClock> {
    inner: S,
    state: Arc<AdaptiveLimitState<C>>,
}

impl<S, C> AdaptiveLimit<S, C> {
    pub(super) const fn new(inner: S, state: Arc<AdaptiveLimitState<C>>) -> Self {
        Self { inner, state }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S: Clone, C> Clone for AdaptiveLimit<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            state: Arc::clone(&self.state),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for AdaptiveLimit<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimit")
            .field("inner", &self.inner)
            .field("state", &self.state)
            .finish()
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for AdaptiveLimit<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: 'static,
    ResBody: Default,
    C: Clock,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    /// Delegates to the inner service.
    ///
    /// Admission is decided in `call`: the limit counts requests in flight, which only
    /// `call` starts, and a rejection needs no capacity of the inner service. As with
    /// [`RateLimit`](crate::RateLimit), a rejected request leaves the readiness the inner
    /// service reserved for the next `call` on this instance.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        self.state.on_request();
        if self.state.has_exemptions() {
            let (parts, body) = request.into_parts();
            let exempt = self.state.exempts(&parts);
            let request = Request::from_parts(parts, body);
            if exempt {
                // NOTE: no slot, no sample, no count: a health check neither waits for nor
                // weighs on the limit.
                return ResponseFuture::exempt(self.inner.call(request));
            }
            return self.admit(request);
        }
        self.admit(request)
    }
}

impl<S, C> AdaptiveLimit<S, C> {
    /// Admits `request` under the limit, or rejects it.
    #[inline]
    fn admit<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S::Future, ResBody>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        ResBody: Default,
        C: Clock,
    {
        // NOTE: the level the server's criticality layer put in the extensions (it read the
        // header, capped for untrusted callers); none is the default level, `critical`.
        let level = Criticality::of(request.extensions());
        match self.state.try_admit(level) {
            Some(admitted) => {
                // NOTE: the guard exists before the inner `call` runs, so that a panic in it
                // (caught above, by a `CatchPanic` layer or the task) still frees the slot.
                let state = Arc::clone(&self.state) as Arc<dyn CompleteRequest>;
                let guard = AdmissionGuard::new(state, admitted);
                ResponseFuture::admitted(self.inner.call(request), guard)
            }
            None => {
                tracing::debug!(
                    name = %self.state.name(),
                    decision = RejectionKind::AtCapacity.as_str(),
                    criticality = level.as_str(),
                    retry_after_ms =
                        u64::try_from(self.state.retry_after.as_millis()).unwrap_or(u64::MAX),
                    "request rejected: at the adaptive limit"
                );
                let protocol = Protocol::of_request(&request);
                let mut response = rejection(protocol, self.state.retry_after);
                response.extensions_mut().insert(
                    Rejection::new(RejectionKind::AtCapacity, RejectionScope::Server)
                        .with_retry_after(self.state.retry_after)
                        .with_layer(self.state.name().clone()),
                );
                ResponseFuture::rejected(response)
            }
        }
    }
}

/// The rejection: HTTP `503 Service Unavailable` with `Retry-After`; gRPC (and gRPC-Web)
/// `UNAVAILABLE` with a `grpc-retry-pushback-ms` that invites a retry after the wait: the
/// protocol's row for a node at capacity, retry later (a negative pushback, and
/// `X-Overloaded`, are the overload layer's to add).
pub(super) fn rejection<B: Default>(protocol: Protocol, retry_after: Duration) -> Response<B> {
    service_unavailable_response(protocol, retry_after)
}
