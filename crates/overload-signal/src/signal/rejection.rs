//! What a rejection made by one of this workspace's layers says about itself: the marker
//! the overload layer judges by ([`Rejection`]), why the request was refused
//! ([`RejectionKind`]), and whom the refusal concerns ([`RejectionScope`]).

use std::time::Duration;

use overload_core::telemetry::LayerName;

/// The marker of a rejection made by a limiting layer, in the rejection's response
/// extensions: why the request was refused, whom that concerns, the wait it asks for, and
/// which layer refused it.
///
/// `ratelimit-layer`'s limits (`RateLimitLayer`, the Redis-backed limit, `AdaptiveLimitLayer`)
/// insert it in every answer they make themselves, and the
/// [`OverloadSignalLayer`](super::OverloadSignalLayer) inserts (or updates) it when it
/// answers with the stop signal. Two readers rely on it:
///
/// - **The overload layer** turns into the stop signal only rejections that carry it (of
///   kind [`RateLimited`](RejectionKind::RateLimited) or
///   [`AtCapacity`](RejectionKind::AtCapacity)): a `429` or `503` the application made itself,
///   or one an upstream sent through a gateway, passes untouched, headers and body included,
///   unless the layer is told to [judge every
///   rejection](super::OverloadSignalLayerBuilder::judge_every_rejection).
/// - **Your code**, to shape what a rejection looks like (a JSON problem body, a content
///   type, CORS headers) without guessing the reason from the status: a response mapper
///   outside the layers reads it.
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{HeaderValue, Request, Response, StatusCode, header};
/// use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A limiter of your own marks the rejections it makes, so that an overload layer
/// // outside may turn them into the stop signal:
/// let limiter = service_fn(|_: Request<String>| async {
///     let mut rejection = Response::new(String::new());
///     *rejection.status_mut() = StatusCode::TOO_MANY_REQUESTS;
///     rejection.extensions_mut().insert(
///         Rejection::new(RejectionKind::RateLimited, RejectionScope::Server)
///             .with_retry_after(Duration::from_secs(1)),
///     );
///     Ok::<_, Infallible>(rejection)
/// });
///
/// // Outside every layer, give rejections a JSON problem body (RFC 9457).
/// let service = ServiceBuilder::new()
///     .map_response(|mut response: Response<String>| {
///         if let Some(rejection) = response.extensions().get::<Rejection>().cloned() {
///             let title = match rejection.kind() {
///                 RejectionKind::StopRetrying => "overloaded: do not retry",
///                 _ => "too many requests: retry later",
///             };
///             *response.body_mut() = format!(r#"{{"title":"{title}","status":{}}}"#,
///                 response.status().as_u16());
///             response.headers_mut().insert(
///                 header::CONTENT_TYPE,
///                 HeaderValue::from_static("application/problem+json"),
///             );
///         }
///         response
///     })
///     .service(limiter);
/// let response = service.oneshot(Request::new(String::new())).await.unwrap();
/// assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
/// assert!(response.body().contains("retry later"));
/// # }
/// ```
///
/// Only the head of a response is changed by the layers; a gRPC rejection's body must stay
/// empty (trailers-only), and so must a gRPC-Web one (`content-type:
/// application/grpc-web...`, answered with gRPC statuses in its own content type): shape
/// HTTP answers only ([`Protocol::of_headers`] on the request tells them apart).
///
/// [`Protocol::of_headers`]: crate::protocol::Protocol::of_headers
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    kind: RejectionKind,
    scope: RejectionScope,
    retry_after: Option<Duration>,
    layer: LayerName,
}

impl Rejection {
    /// A rejection of `kind` concerning `scope`, asking for no particular wait, made by a
    /// layer named `"default"`.
    pub fn new(kind: RejectionKind, scope: RejectionScope) -> Self {
        Self {
            kind,
            scope,
            retry_after: None,
            layer: LayerName::default(),
        }
    }

    /// The same, asking the client to wait `wait` before it retries (what `Retry-After` or
    /// `grpc-retry-pushback-ms` says).
    #[must_use]
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    /// The same, made by the layer named `layer`.
    #[must_use]
    pub fn with_layer(mut self, layer: LayerName) -> Self {
        self.layer = layer;
        self
    }

    /// Why the request was refused.
    pub const fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// Whom the refusal concerns.
    pub const fn scope(&self) -> RejectionScope {
        self.scope
    }

    /// The wait the rejection asks for, if any (none for the stop signal).
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The name of the layer that answered (its metrics' `name` label).
    pub const fn layer(&self) -> &LayerName {
        &self.layer
    }

    /// This rejection turned into the stop signal by the layer `layer`: kind
    /// [`StopRetrying`](RejectionKind::StopRetrying), no wait, the same scope.
    pub(crate) fn into_stop_signal(self, layer: &LayerName) -> Self {
        Self {
            kind: RejectionKind::StopRetrying,
            scope: self.scope,
            retry_after: None,
            layer: layer.clone(),
        }
    }

    /// Whether the overload layer may turn this rejection into the stop signal: a limit's
    /// refusal to take more now ([`RateLimited`](RejectionKind::RateLimited),
    /// [`AtCapacity`](RejectionKind::AtCapacity)). Never a request refused for what it is
    /// ([`MissingKey`](RejectionKind::MissingKey),
    /// [`ExceedsCapacity`](RejectionKind::ExceedsCapacity)): no retry pressure makes those
    /// the system's overload.
    pub(crate) const fn is_judged(&self) -> bool {
        matches!(
            self.kind,
            RejectionKind::RateLimited | RejectionKind::AtCapacity
        )
    }
}

/// Why a layer refused a request: the reason of a [`Rejection`].
///
/// Non-exhaustive: match with a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// Over a rate limit (HTTP `429`, gRPC `RESOURCE_EXHAUSTED`): retry after the wait,
    /// here or elsewhere.
    RateLimited,
    /// The server is at its concurrency limit (HTTP `503` with `Retry-After`, gRPC
    /// `UNAVAILABLE` with a pushback that is not negative): retry after the wait, elsewhere
    /// if possible.
    AtCapacity,
    /// A keyed limit found no key in the request and its policy is to refuse it (HTTP `500`,
    /// gRPC `INTERNAL`): the server is set up wrong, not overloaded.
    MissingKey,
    /// The request's cost exceeds a rate limit's capacity (its burst, or its quota), so no
    /// wait would ever let it in (HTTP `413`, gRPC `INVALID_ARGUMENT`): do not retry it. The
    /// request is wrong, not the server overloaded: never turned into the stop signal.
    ExceedsCapacity,
    /// The stop signal: the system is drowning in retries (or a downstream tier said so);
    /// do not retry (HTTP `503` with `X-Overloaded`, gRPC `UNAVAILABLE` with a negative
    /// pushback).
    StopRetrying,
}

impl RejectionKind {
    /// A short name: `rate_limited`, `at_capacity`, `missing_key`, `exceeds_capacity` or
    /// `stop_retrying`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::AtCapacity => "at_capacity",
            Self::MissingKey => "missing_key",
            Self::ExceedsCapacity => "exceeds_capacity",
            Self::StopRetrying => "stop_retrying",
        }
    }
}

/// Whom a rejection concerns: part of the [`Rejection`] a limiter puts in its answer, by
/// which the [`OverloadSignalLayer`](super::OverloadSignalLayer) judges it.
///
/// - [`Server`](Self::Server): the server as a whole is over its limit (a global rate
///   limit, a load shedder, an adaptive concurrency limit). The layer judges the whole
///   server's window, with each caller class's weight bounded, and answers with the stop
///   signal when the fleet is drowning in retries.
/// - [`Caller`](Self::Caller): the rejected caller is over its own limit (a keyed rate limit
///   rejecting one client IP, API key or tenant). The server is not overloaded, and other
///   callers' retries say nothing about this one, so the layer judges only the rejected
///   caller's own class: the stop signal when that caller is the one drowning the server in
///   retries, the plain rejection otherwise.
///
/// `ratelimit-layer` marks its keyed rejections `Caller`, every other one `Server`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RejectionScope {
    /// The server as a whole is over its limit. The default.
    #[default]
    Server = 0,
    /// The rejected caller is over its own limit.
    Caller = 1,
}

impl RejectionScope {
    /// The `scope` label of the layer's metrics: `server` or `caller`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Caller => "caller",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_says_what_it_is_and_becomes_the_stop_signal() {
        let name = LayerName::new("api").unwrap();
        let r = Rejection::new(RejectionKind::RateLimited, RejectionScope::Caller)
            .with_retry_after(Duration::from_secs(2))
            .with_layer(name.clone());
        assert_eq!(r.kind(), RejectionKind::RateLimited);
        assert_eq!(r.scope(), RejectionScope::Caller);
        assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(r.layer(), &name);
        assert!(r.is_judged());
        let stop = r.into_stop_signal(&LayerName::default());
        assert_eq!(stop.kind(), RejectionKind::StopRetrying);
        assert_eq!(stop.scope(), RejectionScope::Caller);
        assert_eq!(stop.retry_after(), None);
        assert!(!stop.is_judged());
        assert!(Rejection::new(RejectionKind::AtCapacity, RejectionScope::Server).is_judged());
        assert!(!Rejection::new(RejectionKind::MissingKey, RejectionScope::Server).is_judged());
        assert_eq!(RejectionKind::AtCapacity.as_str(), "at_capacity");
    }

    /// Issue 30, finding 7: a request too heavy for a limit's capacity is refused for what it
    /// is, so the overload layer never turns its refusal into the stop signal.
    #[test]
    fn a_request_too_heavy_for_the_limit_is_never_judged() {
        for scope in [RejectionScope::Caller, RejectionScope::Server] {
            let r = Rejection::new(RejectionKind::ExceedsCapacity, scope);
            assert!(!r.is_judged());
            assert_eq!(r.retry_after(), None);
        }
        assert_eq!(RejectionKind::ExceedsCapacity.as_str(), "exceeds_capacity");
    }
}
