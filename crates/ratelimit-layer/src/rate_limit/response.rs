//! The responses this layer answers with: a rejection ([`rejection`]), the refusal of a
//! request too heavy ever to be admitted ([`exceeds_capacity`]) and the refusal of a
//! request without a key ([`missing_key`]).

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};
use overload_signal::protocol::{
    GRPC_MESSAGE, GRPC_STATUS, Protocol, RATELIMIT, RATELIMIT_POLICY, exceeds_capacity_response,
    too_many_requests_response,
};
use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};

use super::state::RateLimitState;
use crate::algorithm::QuotaStatus;
use crate::keyed::KeyClass;

pub(super) fn rejection<B: Default>(
    state: &RateLimitState,
    protocol: Protocol,
    retry_after: Duration,
    status: QuotaStatus,
    class: KeyClass,
) -> Response<B> {
    let mut response = too_many_requests_response(protocol, retry_after);
    let advertised = state.advertised();
    let headers = response.headers_mut();
    headers.insert(RATELIMIT_POLICY, advertised.header.clone());
    headers.insert(
        RATELIMIT,
        advertised.policy.status(status.remaining, status.reset),
    );
    // NOTE: the marker makes this a limiter's rejection, the only kind an overload layer
    // outside may turn into the stop signal. A keyed one concerns this client's own quota,
    // and is judged on its retries alone; shared limits (global, overflow, unkeyed) concern
    // every client behind them.
    let scope = if class == KeyClass::Keyed {
        RejectionScope::Caller
    } else {
        RejectionScope::Server
    };
    response.extensions_mut().insert(
        Rejection::new(RejectionKind::RateLimited, scope)
            .with_retry_after(retry_after)
            .with_layer(state.name().clone()),
    );
    response
}

/// The answer to a request whose cost exceeds the limit's capacity: it can never be
/// admitted, so no `Retry-After` and no `RateLimit` (which says when quota comes back); the
/// `RateLimit-Policy` field shows the quota it exceeds. HTTP `413 Content Too Large`; gRPC
/// `grpc-status: 3` (`INVALID_ARGUMENT`) in a trailers-only response. Marked
/// [`RejectionKind::ExceedsCapacity`], which an overload layer outside never turns into the
/// stop signal, concerning the caller (whose request it is), with no wait.
pub(super) fn exceeds_capacity<B: Default>(
    state: &RateLimitState,
    protocol: Protocol,
) -> Response<B> {
    let mut response = exceeds_capacity_response(protocol);
    response
        .headers_mut()
        .insert(RATELIMIT_POLICY, state.advertised().header.clone());
    response.extensions_mut().insert(
        Rejection::new(RejectionKind::ExceedsCapacity, RejectionScope::Caller)
            .with_layer(state.name().clone()),
    );
    response
}

/// The answer to a request without a key under [`MissingKey::Reject`]: `500`, or for gRPC
/// `grpc-status: 13` (`INTERNAL`) in a trailers-only response.
///
/// [`MissingKey::Reject`]: crate::key::MissingKey::Reject
pub(super) fn missing_key<B: Default>(protocol: Protocol) -> Response<B> {
    let mut response = Response::new(B::default());
    match protocol.content_type() {
        None => *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
        Some(content_type) => {
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            headers.insert(GRPC_STATUS, HeaderValue::from_static("13"));
            headers.insert(
                GRPC_MESSAGE,
                HeaderValue::from_static("rate limit key missing"),
            );
        }
    }
    response
}
