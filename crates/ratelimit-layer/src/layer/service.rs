//! The [`RateLimit`] service.

use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderValue, Request, Response, StatusCode};
use overload_signal::protocol::{
    GRPC_MESSAGE, GRPC_STATUS, Protocol, RATELIMIT, RATELIMIT_POLICY, too_many_requests_response,
};
use overload_signal::signal::RejectionScope;
use tower_service::Service;

use super::shared::Shared;
use crate::algorithm::{Decision, QuotaStatus};
use crate::future::{Deciding, ResponseFuture};
use crate::keyed::KeyClass;

/// Rejects requests above a rate before they reach the inner service; see the
/// [crate docs](crate).
///
/// Built by [`RateLimitLayer`](crate::RateLimitLayer); clones share the same limits. The
/// wrapped service is reached with `get_ref`, `get_mut` and `into_inner`.
///
/// The wrapped service must be `Clone` (axum's routes and tonic's services are): a limit
/// kept elsewhere (`RateLimitBuilder::redis`, with the feature `redis`) decides after a
/// round trip, so the response future takes the service that was
/// made ready and leaves a clone in its place. A local limit never clones it.
#[derive(Clone, Debug)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimit<S> {
    pub(crate) const fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S, ReqBody>;

    /// Delegates to the inner service.
    ///
    /// The limit is decided in `call`, where the request is visible; this layer needs no
    /// capacity of its own. As with every short-circuiting `tower-http` layer, a rejected
    /// request leaves the readiness the inner service reserved for the next `call` on this
    /// instance (or releases it when the instance is dropped, as axum and hyper do per
    /// request).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let shared = &self.shared;
        let cost = shared.cost(&parts);
        if let Some(decision) = shared.remote.as_ref().and_then(|r| r.start(&parts, cost)) {
            // NOTE: the decision comes later, so the future takes the service that was made
            // ready and leaves an unpolled clone here (tower's `mem::replace` pattern): the
            // next `call` on this instance comes after its own `poll_ready`.
            let clone = self.inner.clone();
            let service = mem::replace(&mut self.inner, clone);
            return ResponseFuture::deciding(Deciding {
                decision,
                service,
                parts,
                body,
                cost,
                shared: Arc::clone(shared),
            });
        }
        let decided = shared.decide(&parts, cost);
        respond(shared, &mut self.inner, parts, body, decided)
    }
}

/// What a request gets once its limit is decided: the inner service's future (admitted) or
/// the rejection, with the metrics counted; `None` is a request without a key that the
/// missing-key policy rejects.
pub(crate) fn respond<S, ReqBody, ResBody>(
    shared: &Shared,
    inner: &mut S,
    parts: Parts,
    body: ReqBody,
    decided: Option<(Decision, Option<QuotaStatus>, KeyClass)>,
) -> ResponseFuture<S::Future, ResBody, S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    let Some((decision, status, class)) = decided else {
        let protocol = Protocol::of_headers(&parts.headers);
        return ResponseFuture::rejected(missing_key(protocol));
    };
    let retry_after = match decision {
        Decision::Allow => {
            shared.metrics.admitted().increment(1);
            // NOTE: `decide` reads the status for admissions when the fields are wanted; a
            // request admitted without a limit (no key, `MissingKey::Bypass`) has none, and
            // no field describes it.
            let fields = status.filter(|_| shared.admitted_headers).map(|status| {
                (
                    shared.policy_header.clone(),
                    shared.policy.status(status.remaining, status.reset),
                )
            });
            let future = inner.call(Request::from_parts(parts, body));
            return ResponseFuture::admitted(future, fields);
        }
        Decision::Reject { retry_after } => retry_after,
        Decision::OverCapacity { .. } => shared.window,
    };
    // NOTE: `decide` reads the status for every rejection; a missing one (never expected) is
    // reported as a full window.
    let status = status.unwrap_or(QuotaStatus {
        remaining: 0,
        reset: shared.window,
    });
    shared.metrics.rejected(class).increment(1);
    tracing::trace!(key_class = class.as_str(), ?retry_after, "rate limited");
    let protocol = Protocol::of_headers(&parts.headers);
    ResponseFuture::rejected(rejection(shared, protocol, retry_after, status, class))
}

fn rejection<B: Default>(
    shared: &Shared,
    protocol: Protocol,
    retry_after: Duration,
    status: QuotaStatus,
    class: KeyClass,
) -> Response<B> {
    let mut response = too_many_requests_response(protocol, retry_after);
    let headers = response.headers_mut();
    headers.insert(RATELIMIT_POLICY, shared.policy_header.clone());
    headers.insert(
        RATELIMIT,
        shared.policy.status(status.remaining, status.reset),
    );
    if class == KeyClass::Keyed {
        // NOTE: this client is over its own quota; an overload layer outside judges the
        // rejection on this caller's retries, not the whole server's. Shared limits (global,
        // overflow, unkeyed) concern every client behind them, and say nothing.
        response.extensions_mut().insert(RejectionScope::Caller);
    }
    response
}

/// The answer to a request without a key under [`MissingKey::Reject`]: `500`, or for gRPC
/// `grpc-status: 13` (`INTERNAL`) in a trailers-only response.
///
/// [`MissingKey::Reject`]: crate::key::MissingKey::Reject
fn missing_key<B: Default>(protocol: Protocol) -> Response<B> {
    let mut response = Response::new(B::default());
    match protocol {
        Protocol::Http => *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
        Protocol::Grpc => {
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(GRPC_STATUS, HeaderValue::from_static("13"));
            headers.insert(
                GRPC_MESSAGE,
                HeaderValue::from_static("rate limit key missing"),
            );
        }
    }
    response
}
