//! Rejections: the node-local "retry later" and the system-wide "stop retrying".

use std::time::Duration;

use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};

use super::grpc::{GRPC_INVALID_ARGUMENT, GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE, media_is};
use super::headers::{
    GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, RATELIMIT, STOP_RETRYING,
    X_ENVOY_OVERLOADED, X_ENVOY_RATELIMITED, X_OVERLOADED,
};
use super::retry_after::{GrpcPushback, format_grpc_pushback, format_retry_after, grpc_pushback};

/// Which form of the protocol a message uses.
///
/// Non-exhaustive: a form may be added (gRPC-Web was); match with a wildcard arm, or ask
/// [`is_grpc`](Self::is_grpc) whether the outcome is a `grpc-status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// Plain HTTP: status codes carry the outcome.
    Http,
    /// gRPC over HTTP/2: HTTP `200` with the outcome in `grpc-status`.
    Grpc,
    /// gRPC-Web, binary (`content-type: application/grpc-web...`): as gRPC, HTTP `200` with
    /// the outcome in `grpc-status` (a trailers-only answer puts it in the headers), over
    /// HTTP/1.1 or HTTP/2.
    GrpcWeb,
    /// gRPC-Web, base64 text (`content-type: application/grpc-web-text...`, the default
    /// mode of the grpc-web browser client): as [`GrpcWeb`](Self::GrpcWeb).
    GrpcWebText,
}

impl Protocol {
    /// The protocol of a message with these headers: gRPC or gRPC-Web when its
    /// `content-type` says so ([`is_grpc`](super::is_grpc), [`is_grpc_web`](super::is_grpc_web)), HTTP
    /// otherwise.
    #[inline]
    pub fn of_headers(headers: &HeaderMap) -> Self {
        // NOTE: one look-up of `content-type`, then its bytes: this runs on every request.
        match headers.get(CONTENT_TYPE) {
            None => Protocol::Http,
            Some(content_type) => Self::of_content_type(content_type.as_bytes()),
        }
    }

    /// The protocol a `content-type` value names.
    fn of_content_type(ct: &[u8]) -> Self {
        if media_is(ct, b"application/grpc") {
            Protocol::Grpc
        } else if media_is(ct, b"application/grpc-web-text") {
            Protocol::GrpcWebText
        } else if media_is(ct, b"application/grpc-web") {
            Protocol::GrpcWeb
        } else {
            Protocol::Http
        }
    }

    /// The protocol of a request; see [`Protocol::of_headers`].
    #[inline]
    pub fn of_request<B>(request: &http::Request<B>) -> Self {
        Self::of_headers(request.headers())
    }

    /// Whether the outcome of a message is a gRPC status (`grpc-status`, HTTP `200`): gRPC
    /// and both forms of gRPC-Web.
    #[inline]
    pub const fn is_grpc(self) -> bool {
        matches!(self, Self::Grpc | Self::GrpcWeb | Self::GrpcWebText)
    }

    /// The `content-type` of an answer this crate builds in this protocol: `None` for HTTP
    /// (the body's own), `application/grpc`, `application/grpc-web+proto` or
    /// `application/grpc-web-text+proto`.
    pub const fn content_type(self) -> Option<&'static str> {
        match self {
            Self::Http => None,
            Self::Grpc => Some("application/grpc"),
            Self::GrpcWeb => Some("application/grpc-web+proto"),
            Self::GrpcWebText => Some("application/grpc-web-text+proto"),
        }
    }
}

/// Whether a response's headers carry the stop signal. Any of:
///
/// - an `X-Overloaded` header, with any value, even empty (this workspace's signal);
/// - a `grpc-retry-pushback-ms` that is negative or not a number (gRPC's retry design, A6,
///   reads both as "do not retry");
/// - `x-envoy-overloaded`, with any value (Envoy shed the request: a circuit breaker
///   overflowed, the overload manager, maintenance mode; Envoy's docs say its presence is
///   what matters, and Envoy writes `true`);
/// - `x-envoy-ratelimited: true`, the value compared without regard to case (Envoy's rate
///   limiter; also what every stop signal of this crate carries, so it is what reaches a
///   client through an Envoy that passed our servers' signal on). Another value is not
///   the signal: Envoy writes only `true`, and itself ignores anything else.
///
/// Envoy's two count as the stop signal as Envoy's own router treats a rate-limited
/// answer: never retried (Envoy retries an `x-envoy-overloaded` answer, but a tier that
/// sheds load at Envoy is overloaded as surely as one that says so itself).
///
/// A client that sees it on a failure must not retry, and should surface it to its caller;
/// [`Outcome`](super::Outcome) counts it on failures only.
pub fn is_stop_signal(headers: &HeaderMap) -> bool {
    headers.contains_key(X_OVERLOADED)
        || headers.contains_key(X_ENVOY_OVERLOADED)
        || envoy_ratelimited(headers)
        || matches!(grpc_pushback(headers), Some(GrpcPushback::Stop))
}

/// Whether a line of `x-envoy-ratelimited` says `true`, in any case.
fn envoy_ratelimited(headers: &HeaderMap) -> bool {
    headers
        .get_all(X_ENVOY_RATELIMITED)
        .iter()
        .any(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"true"))
}

/// Completes a failure that carries the stop signal in some form (a handler's
/// `X-Overloaded` alone, Envoy's `x-envoy-overloaded` relayed, a gRPC pushback) into the
/// whole signal this crate sends: `X-Overloaded` (kept if present), `x-envoy-ratelimited:
/// true`, and for gRPC a pushback of `-1`. The status, the other headers and the body are
/// kept.
pub(crate) fn complete_stop_signal(headers: &mut HeaderMap, protocol: Protocol) {
    if !headers.contains_key(X_OVERLOADED) {
        headers.insert(X_OVERLOADED, HeaderValue::from_static(STOP_RETRYING));
    }
    headers.insert(X_ENVOY_RATELIMITED, HeaderValue::from_static(ENVOY_TRUE));
    if protocol.is_grpc() && !matches!(grpc_pushback(headers), Some(GrpcPushback::Stop)) {
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    }
}

/// The value Envoy writes in its `x-envoy-*` flags, and the only one it reads as set.
const ENVOY_TRUE: &str = "true";

const STOP_MESSAGE: &str = "system overloaded, stop retrying";
const RESOURCE_EXHAUSTED_MESSAGE: &str = "rate limit exceeded, retry later";
const AT_CAPACITY_MESSAGE: &str = "server at capacity, retry later";
const BAD_GATEWAY_MESSAGE: &str = "downstream call failed";
const EXCEEDS_CAPACITY_MESSAGE: &str =
    "the request's cost exceeds the rate limit's capacity: it can never be admitted";

/// A new response carrying the stop signal, with an empty (default) body.
///
/// - HTTP: `503 Service Unavailable`, `X-Overloaded: stop-retrying`,
///   `x-envoy-ratelimited: true`.
/// - gRPC (and gRPC-Web, with its own `content-type`): `200 OK`, `content-type:
///   application/grpc`, `grpc-status: 14`, `grpc-message`, `grpc-retry-pushback-ms: -1`,
///   `x-overloaded: stop-retrying`, `x-envoy-ratelimited: true`.
///
/// # Behind Envoy
///
/// `x-envoy-ratelimited: true` is what stops Envoy from retrying: measured with Envoy
/// 1.40, it retries a `503` that carries `X-Overloaded` or `x-envoy-overloaded` as any
/// other, and never one that carries `x-envoy-ratelimited: true` (HTTP or gRPC), unless
/// the retry policy's `retry_on` names `envoy-ratelimited`. **Do not name
/// `envoy-ratelimited`** in a route's or virtual host's `retry_on` in front of a server of
/// this workspace: Envoy would then retry every stop signal, up to its `num_retries`, and
/// multiply the load the signal exists to shed. Envoy passes the answer on to its own
/// client with its headers, so a client of this workspace behind it still sees the stop
/// signal ([`is_stop_signal`]).
///
/// A node-local rejection ([`too_many_requests_response`], [`service_unavailable_response`]:
/// `429` or `503` with `Retry-After`, "retry later, elsewhere") does **not** carry it:
/// Envoy may retry those, on another host, as they invite.
///
/// ```
/// use overload_signal::protocol::{Protocol, X_ENVOY_RATELIMITED, stop_signal_response};
///
/// let stop = stop_signal_response::<()>(Protocol::Http);
/// assert_eq!(stop.headers()[X_ENVOY_RATELIMITED], "true");
/// ```
pub fn stop_signal_response<B: Default>(protocol: Protocol) -> Response<B> {
    let mut response = Response::new(B::default());
    set_stop_signal(&mut response, protocol);
    response
}

/// Turns an existing response into the stop signal, in place: status and signal headers are
/// set as in [`stop_signal_response`] (`x-envoy-ratelimited: true` included, so that an
/// Envoy in front does not retry it: see [Behind Envoy](stop_signal_response#behind-envoy));
/// `Retry-After` and `RateLimit` fields, which invite a retry, are removed; other headers
/// and the body are kept.
///
/// For gRPC, only a trailers-only response (empty body, status in headers) is well-formed
/// afterwards; callers rewriting a gRPC response should give it an empty body.
pub fn set_stop_signal<B>(response: &mut Response<B>, protocol: Protocol) {
    let headers = response.headers_mut();
    headers.remove(RETRY_AFTER);
    headers.remove(RATELIMIT);
    headers.insert(X_OVERLOADED, HeaderValue::from_static(STOP_RETRYING));
    headers.insert(X_ENVOY_RATELIMITED, HeaderValue::from_static(ENVOY_TRUE));
    match protocol.content_type() {
        None => {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        Some(content_type) => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            headers.insert(GRPC_STATUS, HeaderValue::from(GRPC_UNAVAILABLE));
            headers.insert(GRPC_MESSAGE, HeaderValue::from_static(STOP_MESSAGE));
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
            *response.status_mut() = StatusCode::OK;
        }
    }
}

/// A new node-local rejection ("retry later, elsewhere") with an empty (default) body.
///
/// - HTTP: `429 Too Many Requests`, `Retry-After` in whole seconds, rounded up, at least 1.
/// - gRPC (and gRPC-Web, with its own `content-type`): `200 OK`, `content-type:
///   application/grpc`, `grpc-status: 8`, `grpc-message`, `grpc-retry-pushback-ms` in whole
///   milliseconds, rounded up.
///
/// The IETF `RateLimit` fields are the caller's to add; see
/// [`RateLimitPolicy`](super::RateLimitPolicy) and [`RateLimitStatus`](super::RateLimitStatus).
pub fn too_many_requests_response<B: Default>(
    protocol: Protocol,
    retry_after: Duration,
) -> Response<B> {
    retry_later_response(
        protocol,
        retry_after,
        StatusCode::TOO_MANY_REQUESTS,
        GRPC_RESOURCE_EXHAUSTED,
        RESOURCE_EXHAUSTED_MESSAGE,
    )
}

/// A new node-local rejection because the server is at its capacity (a concurrency limit:
/// "retry later, elsewhere", not "stop retrying"), with an empty (default) body.
///
/// - HTTP: `503 Service Unavailable`, `Retry-After` in whole seconds, rounded up, at least
///   1, and no `X-Overloaded`.
/// - gRPC (and gRPC-Web, with its own `content-type`): `200 OK`, `grpc-status: 14`
///   (UNAVAILABLE, gRPC's code for HTTP 503), `grpc-message`, and a non-negative
///   `grpc-retry-pushback-ms` in whole milliseconds, rounded up: a retry is welcome after it
///   (a negative one would be the stop signal).
pub fn service_unavailable_response<B: Default>(
    protocol: Protocol,
    retry_after: Duration,
) -> Response<B> {
    retry_later_response(
        protocol,
        retry_after,
        StatusCode::SERVICE_UNAVAILABLE,
        GRPC_UNAVAILABLE,
        AT_CAPACITY_MESSAGE,
    )
}

/// A new answer to a request whose cost exceeds a rate limit's capacity (its burst, or its
/// quota), with an empty (default) body: the request can never be admitted, however long
/// the client waits, so the answer is not one a client retries.
///
/// - HTTP: `413 Content Too Large` (the request is larger than the server is willing to
///   process), no `Retry-After`.
/// - gRPC (and gRPC-Web, with its own `content-type`): `200 OK`, `grpc-status: 3`
///   (INVALID_ARGUMENT: wrong whatever the server's state, unlike `RESOURCE_EXHAUSTED`),
///   `grpc-message`, no pushback.
///
/// The `RateLimit-Policy` field, which shows the client the quota its request exceeds, is
/// the caller's to add; a `RateLimit` field would say when quota comes back, which helps no
/// such request.
///
/// ```
/// use overload_signal::protocol::{Outcome, OutcomeClass, Protocol, exceeds_capacity_response};
///
/// let http = exceeds_capacity_response::<()>(Protocol::Http);
/// assert_eq!(http.status(), 413);
/// assert!(http.headers().get("retry-after").is_none());
/// let grpc = exceeds_capacity_response::<()>(Protocol::Grpc);
/// assert_eq!(grpc.headers()["grpc-status"], "3");
/// // Neither is a failure a client retries.
/// let outcome = Outcome::of_response(Protocol::Grpc, grpc.status(), grpc.headers());
/// assert_eq!(outcome.class(), OutcomeClass::ClientError);
/// ```
pub fn exceeds_capacity_response<B: Default>(protocol: Protocol) -> Response<B> {
    final_answer(
        protocol,
        StatusCode::PAYLOAD_TOO_LARGE,
        GRPC_INVALID_ARGUMENT,
        EXCEEDS_CAPACITY_MESSAGE,
    )
}

/// A new answer of a proxy whose downstream call failed without an answer to pass on (its
/// retry layer gave up), with an empty (default) body.
///
/// - HTTP: `502 Bad Gateway`.
/// - gRPC (and gRPC-Web, with its own `content-type`): `200 OK`, `grpc-status: 14`
///   (UNAVAILABLE, gRPC's code for HTTP 502), `grpc-message`, no pushback.
pub fn bad_gateway_response<B: Default>(protocol: Protocol) -> Response<B> {
    final_answer(
        protocol,
        StatusCode::BAD_GATEWAY,
        GRPC_UNAVAILABLE,
        BAD_GATEWAY_MESSAGE,
    )
}

/// An answer that invites no particular wait, with an empty (default) body: `status` over
/// HTTP; over gRPC (and gRPC-Web), `200 OK` with `code` and `message`, trailers-only, no
/// pushback.
pub(super) fn final_answer<B: Default>(
    protocol: Protocol,
    status: StatusCode,
    code: u16,
    message: &'static str,
) -> Response<B> {
    let mut response = Response::new(B::default());
    match protocol.content_type() {
        None => *response.status_mut() = status,
        Some(content_type) => {
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            headers.insert(GRPC_STATUS, HeaderValue::from(code));
            headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
        }
    }
    response
}

/// A "retry later" answer: `status` with `Retry-After` over HTTP; over gRPC (and gRPC-Web),
/// `code` and `message` with a non-negative pushback.
fn retry_later_response<B: Default>(
    protocol: Protocol,
    retry_after: Duration,
    status: StatusCode,
    code: u16,
    message: &'static str,
) -> Response<B> {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    match protocol.content_type() {
        None => {
            headers.insert(RETRY_AFTER, format_retry_after(retry_after));
            *response.status_mut() = status;
        }
        Some(content_type) => {
            grpc_retry_later(headers, content_type, code, message, retry_after);
        }
    }
    response
}

/// A trailers-only gRPC answer inviting a retry after `retry_after`.
fn grpc_retry_later(
    headers: &mut HeaderMap,
    content_type: &'static str,
    status: u16,
    message: &'static str,
    retry_after: Duration,
) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(GRPC_STATUS, HeaderValue::from(status));
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
    headers.insert(GRPC_RETRY_PUSHBACK_MS, format_grpc_pushback(retry_after));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Outcome, grpc_status, retry_after};
    use http::HeaderName;

    #[test]
    fn http_stop_signal_row() {
        let r = stop_signal_response::<()>(Protocol::Http);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[X_OVERLOADED], "stop-retrying");
        assert!(is_stop_signal(r.headers()));
    }

    #[test]
    fn grpc_stop_signal_row() {
        let r = stop_signal_response::<()>(Protocol::Grpc);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(grpc_status(r.headers()), Some(14));
        assert_eq!(r.headers()[GRPC_RETRY_PUSHBACK_MS], "-1");
        assert_eq!(r.headers()[X_OVERLOADED], "stop-retrying");
        assert_eq!(grpc_pushback(r.headers()), Some(GrpcPushback::Stop));
        assert!(is_stop_signal(r.headers()));
    }

    #[test]
    fn signal_is_the_header_presence_whatever_its_value() {
        let mut h = HeaderMap::new();
        assert!(!is_stop_signal(&h));
        h.insert(X_OVERLOADED, HeaderValue::from_static(""));
        assert!(is_stop_signal(&h));
        h.insert(X_OVERLOADED, HeaderValue::from_static("yes please"));
        assert!(is_stop_signal(&h));
    }

    #[test]
    fn negative_pushback_alone_is_the_signal() {
        let mut h = HeaderMap::new();
        h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-5"));
        assert!(is_stop_signal(&h));
        h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("250"));
        assert!(!is_stop_signal(&h));
        // gRPC's retry design (A6): a pushback that does not parse means "do not retry".
        h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("junk"));
        assert!(is_stop_signal(&h));
    }

    #[test]
    fn plain_503_is_not_the_signal() {
        let r = Response::builder().status(503).body(()).unwrap();
        assert!(!is_stop_signal(r.headers()));
    }

    #[test]
    fn set_stop_signal_rewrites_a_429_and_drops_retry_invitations() {
        let mut r =
            too_many_requests_response::<String>(Protocol::Http, Duration::from_millis(1500));
        r.headers_mut()
            .insert(RATELIMIT, HeaderValue::from_static("x"));
        *r.body_mut() = "slow down".to_owned();
        set_stop_signal(&mut r, Protocol::Http);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().get(RETRY_AFTER).is_none());
        assert!(r.headers().get(RATELIMIT).is_none());
        assert!(is_stop_signal(r.headers()));
        assert_eq!(r.body(), "slow down");
    }

    /// Issue 32: every stop signal this crate sends, new or rewritten, HTTP or gRPC, carries
    /// `x-envoy-ratelimited: true` (Envoy 1.40 retries a 503 with `X-Overloaded` or
    /// `x-envoy-overloaded`, never one with it); a node-local "retry later" never does.
    #[test]
    fn every_stop_signal_carries_what_envoy_obeys_and_no_retry_later_does() {
        for protocol in [
            Protocol::Http,
            Protocol::Grpc,
            Protocol::GrpcWeb,
            Protocol::GrpcWebText,
        ] {
            let new = stop_signal_response::<()>(protocol);
            assert_eq!(new.headers()[X_ENVOY_RATELIMITED], "true", "{protocol:?}");
            let mut rewritten = too_many_requests_response::<()>(protocol, Duration::from_secs(1));
            set_stop_signal(&mut rewritten, protocol);
            assert_eq!(rewritten.headers()[X_ENVOY_RATELIMITED], "true");
            assert_eq!(
                rewritten
                    .headers()
                    .get_all(X_ENVOY_RATELIMITED)
                    .iter()
                    .count(),
                1
            );
            for later in [
                too_many_requests_response::<()>(protocol, Duration::from_secs(1)),
                service_unavailable_response::<()>(protocol, Duration::from_secs(1)),
                exceeds_capacity_response::<()>(protocol),
                bad_gateway_response::<()>(protocol),
            ] {
                assert!(
                    later.headers().get(X_ENVOY_RATELIMITED).is_none(),
                    "{protocol:?}"
                );
                assert!(!is_stop_signal(later.headers()));
            }
        }
    }

    /// Issue 32: Envoy's own answers are the stop signal for our clients:
    /// `x-envoy-overloaded` (Envoy shed the request) whatever its value, and
    /// `x-envoy-ratelimited` when it says `true` (Envoy writes `true`; any case is read).
    #[test]
    fn envoys_overloaded_and_ratelimited_answers_are_the_stop_signal() {
        for value in ["true", "", "1"] {
            let mut h = HeaderMap::new();
            h.insert(X_ENVOY_OVERLOADED, HeaderValue::from_static(value));
            assert!(is_stop_signal(&h), "x-envoy-overloaded: {value:?}");
        }
        for (value, stop) in [
            ("true", true),
            ("TRUE", true),
            (" True ", true),
            ("false", false),
            ("", false),
            ("1", false),
            ("yes", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(X_ENVOY_RATELIMITED, HeaderValue::from_static(value));
            assert_eq!(is_stop_signal(&h), stop, "x-envoy-ratelimited: {value:?}");
        }
        let mut h = HeaderMap::new();
        h.append(X_ENVOY_RATELIMITED, HeaderValue::from_static("false"));
        h.append(X_ENVOY_RATELIMITED, HeaderValue::from_static("true"));
        assert!(is_stop_signal(&h), "any line saying true");
        // On a failure only, as ours.
        let on = |code: u16, name: HeaderName| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static("true"));
            Outcome::of_response(Protocol::Http, StatusCode::from_u16(code).unwrap(), &h)
        };
        assert!(on(503, X_ENVOY_OVERLOADED).is_stop_signal());
        assert!(on(429, X_ENVOY_RATELIMITED).is_stop_signal());
        assert!(!on(200, X_ENVOY_RATELIMITED).is_stop_signal());
        assert!(!on(404, X_ENVOY_OVERLOADED).is_stop_signal());
    }

    #[test]
    fn http_rejection_row() {
        let r = too_many_requests_response::<()>(Protocol::Http, Duration::from_millis(1));
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert!(!is_stop_signal(r.headers()));
        let r = too_many_requests_response::<()>(Protocol::Http, Duration::from_millis(2001));
        assert_eq!(
            retry_after(r.headers(), std::time::SystemTime::UNIX_EPOCH),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn grpc_rejection_row() {
        let r = too_many_requests_response::<()>(Protocol::Grpc, Duration::from_millis(250));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(grpc_status(r.headers()), Some(8));
        assert_eq!(
            grpc_pushback(r.headers()),
            Some(GrpcPushback::Delay(Duration::from_millis(250)))
        );
        assert!(!is_stop_signal(r.headers()));
    }

    #[test]
    fn protocol_detection() {
        let req = http::Request::builder()
            .header(CONTENT_TYPE, "application/grpc+proto")
            .body(())
            .unwrap();
        assert_eq!(Protocol::of_request(&req), Protocol::Grpc);
        let req = http::Request::builder().body(()).unwrap();
        assert_eq!(Protocol::of_request(&req), Protocol::Http);
        let ct = |v: &'static str| {
            let req = http::Request::builder()
                .header(CONTENT_TYPE, v)
                .body(())
                .unwrap();
            Protocol::of_request(&req)
        };
        assert_eq!(ct("application/grpc-web+proto"), Protocol::GrpcWeb);
        assert_eq!(ct("application/grpc-web-text"), Protocol::GrpcWebText);
        assert_eq!(ct("application/json"), Protocol::Http);
        assert!(Protocol::GrpcWeb.is_grpc() && Protocol::GrpcWebText.is_grpc());
        assert!(!Protocol::Http.is_grpc());
    }

    /// Regression (issue 23, finding 4): gRPC-Web requests were answered with HTTP statuses
    /// (`429`, `503`), which a gRPC-Web client reads as a transport failure; they get the
    /// gRPC statuses, in gRPC-Web's own content type.
    #[test]
    fn grpc_web_answers_carry_grpc_statuses_in_their_own_content_type() {
        for (protocol, content_type) in [
            (Protocol::GrpcWeb, "application/grpc-web+proto"),
            (Protocol::GrpcWebText, "application/grpc-web-text+proto"),
        ] {
            let limited = too_many_requests_response::<()>(protocol, Duration::from_millis(250));
            let full = service_unavailable_response::<()>(protocol, Duration::from_secs(1));
            let stop = stop_signal_response::<()>(protocol);
            for (r, code) in [(&limited, 8), (&full, 14), (&stop, 14)] {
                assert_eq!(r.status(), StatusCode::OK, "{protocol:?}");
                assert_eq!(r.headers()[CONTENT_TYPE], content_type);
                assert_eq!(grpc_status(r.headers()), Some(code));
            }
            assert!(!is_stop_signal(limited.headers()) && !is_stop_signal(full.headers()));
            assert!(is_stop_signal(stop.headers()));
        }
    }

    #[test]
    fn bad_gateway_rows() {
        let r = bad_gateway_response::<()>(Protocol::Http);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert!(!is_stop_signal(r.headers()));
        let r = bad_gateway_response::<()>(Protocol::GrpcWeb);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc-web+proto");
        assert_eq!(grpc_status(r.headers()), Some(14));
        assert!(r.headers().get(GRPC_RETRY_PUSHBACK_MS).is_none());
    }

    #[test]
    fn at_capacity_rows_invite_a_retry() {
        let r = service_unavailable_response::<()>(Protocol::Http, Duration::from_millis(1));
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert!(!is_stop_signal(r.headers()));
        let r = service_unavailable_response::<()>(Protocol::Grpc, Duration::from_millis(1500));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(grpc_status(r.headers()), Some(14));
        assert_eq!(
            grpc_pushback(r.headers()),
            Some(GrpcPushback::Delay(Duration::from_millis(1500)))
        );
        assert!(!is_stop_signal(r.headers()));
    }
}
