//! What a request gets once its limit is decided: the inner service's future (admitted),
//! or the rejection this layer answers with ([`respond`]).

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use overload_signal::protocol::{
    GRPC_MESSAGE, GRPC_STATUS, Protocol, RATELIMIT, RATELIMIT_POLICY, too_many_requests_response,
};
use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};
use tower_service::Service;

use super::future::ResponseFuture;
use super::state::RateLimitState;
use crate::algorithm::{Decision, QuotaStatus};
use crate::keyed::KeyClass;

/// The answer to a request once its limit is decided, with the metrics counted; `decided`
/// is `None` for a request without a key that the missing-key policy rejects.
///
/// NOTE: the admitted path is all that is inline; building a rejection, or the `RateLimit`
/// fields of an admitted response, is out of line, so that a server's hot path carries
/// none of that code.
#[inline]
pub(crate) fn respond<S, ReqBody, ResBody>(
    state: &RateLimitState,
    inner: &mut S,
    parts: Parts,
    body: ReqBody,
    decided: Option<(Decision, Option<QuotaStatus>, KeyClass)>,
) -> ResponseFuture<S::Future, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    match decided {
        Some((Decision::Allow, status, _)) => {
            state.count_admitted();
            // NOTE: `decide` reads the status for admissions when the fields are wanted; a
            // request admitted without a limit (no key, `MissingKey::Bypass`) has none, and
            // no field describes it.
            let fields = match status {
                Some(status) if state.admitted_headers => Some(admitted_fields(state, status)),
                _ => None,
            };
            ResponseFuture::admitted(inner.call(Request::from_parts(parts, body)), fields)
        }
        Some((Decision::Reject { retry_after }, status, class)) => ResponseFuture::answered(
            refuse(state, &parts.headers, Some((retry_after, status, class))),
        ),
        Some((Decision::OverCapacity { .. }, status, class)) => ResponseFuture::answered(refuse(
            state,
            &parts.headers,
            Some((state.window, status, class)),
        )),
        None => ResponseFuture::answered(refuse(state, &parts.headers, None)),
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields of an admitted response.
#[inline(never)]
fn admitted_fields(state: &RateLimitState, status: QuotaStatus) -> Box<(HeaderValue, HeaderValue)> {
    Box::new((
        state.policy_header.clone(),
        state.policy.status(status.remaining, status.reset),
    ))
}

/// The answer to a request the layer refuses: over the limit, to be retried after the
/// duration given, or without a key that the missing-key policy rejects (`refused` is
/// `None`).
#[inline(never)]
fn refuse<B: Default>(
    state: &RateLimitState,
    headers: &HeaderMap,
    refused: Option<(Duration, Option<QuotaStatus>, KeyClass)>,
) -> Response<B> {
    let protocol = Protocol::of_headers(headers);
    let Some((retry_after, status, class)) = refused else {
        let mut response = missing_key(protocol);
        response.extensions_mut().insert(
            Rejection::new(RejectionKind::MissingKey, RejectionScope::Server)
                .with_layer(state.name().clone()),
        );
        return response;
    };
    // NOTE: `decide` reads the status for every rejection; a missing one (never expected) is
    // reported as a full window.
    let status = status.unwrap_or(QuotaStatus {
        remaining: 0,
        reset: state.window,
    });
    state.rejected(class, retry_after);
    rejection(state, protocol, retry_after, status, class)
}

fn rejection<B: Default>(
    state: &RateLimitState,
    protocol: Protocol,
    retry_after: Duration,
    status: QuotaStatus,
    class: KeyClass,
) -> Response<B> {
    let mut response = too_many_requests_response(protocol, retry_after);
    let headers = response.headers_mut();
    headers.insert(RATELIMIT_POLICY, state.policy_header.clone());
    headers.insert(
        RATELIMIT,
        state.policy.status(status.remaining, status.reset),
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

/// The answer to a request without a key under [`MissingKey::Reject`]: `500`, or for gRPC
/// `grpc-status: 13` (`INTERNAL`) in a trailers-only response.
///
/// [`MissingKey::Reject`]: crate::key::MissingKey::Reject
fn missing_key<B: Default>(protocol: Protocol) -> Response<B> {
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
