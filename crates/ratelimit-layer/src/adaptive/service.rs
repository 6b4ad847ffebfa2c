//! The middleware: [`AdaptiveLimit`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use overload_core::clock::{Clock, TokioClock};
use overload_signal::protocol::{Protocol, format_retry_after, too_many_requests_response};
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
        match self.state.try_admit() {
            Some(admitted) => {
                // NOTE: the guard exists before the inner `call` runs, so that a panic in it
                // (caught above, by a `CatchPanic` layer or the task) still frees the slot.
                let state = Arc::clone(&self.state) as Arc<dyn CompleteRequest>;
                let guard = AdmissionGuard::new(state, admitted);
                ResponseFuture::admitted(self.inner.call(request), guard)
            }
            None => {
                let protocol = Protocol::of_request(&request);
                ResponseFuture::rejected(rejection(protocol, self.state.retry_after))
            }
        }
    }
}

/// The rejection: HTTP `503 Service Unavailable` with `Retry-After`; gRPC
/// `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`.
pub(super) fn rejection<B: Default>(protocol: Protocol, retry_after: Duration) -> Response<B> {
    match protocol {
        Protocol::Http => {
            let mut response = Response::new(B::default());
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
                .headers_mut()
                .insert(RETRY_AFTER, format_retry_after(retry_after));
            response
        }
        Protocol::Grpc => too_many_requests_response(protocol, retry_after),
    }
}
