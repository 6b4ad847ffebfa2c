//! The wire protocol every crate of this workspace speaks.
//!
//! Header names, the attempt counter, the "stop retrying" signal, `Retry-After` and
//! `grpc-retry-pushback-ms`, and the IETF `RateLimit` fields live here, once, so that the
//! client layer, the rate limiter and the overload layer cannot drift apart. The module
//! depends on `http` (and `httpdate` for HTTP-dates) only.
//!
//! # The protocol at a glance
//!
//! | what | HTTP | gRPC (`content-type: application/grpc...`) |
//! |---|---|---|
//! | attempt counter, request | `X-Request-Attempt: N`, decimal, `0` on the first try, `1` on the first retry, sent on every attempt | same header; `grpc-previous-rpc-attempts` (same meaning) is read when ours is absent |
//! | counter missing | [`Attempt::Unknown`]: not counted as a retry | same |
//! | counter malformed (empty, not decimal, signed, whitespace inside, over 64 bits, repeated with different values) | [`Attempt::Malformed`]: treated as unknown; never an error response, never a panic. Values above [`Attempt::CLAMP`] clamp to it | same |
//! | node-local rejection: retry later, elsewhere | `429 Too Many Requests`, `Retry-After: <whole seconds, rounded up, at least 1>`, `RateLimit-Policy: "default";q=100;w=1`, `RateLimit: "default";r=0;t=1` | HTTP `200`, `grpc-status: 8` (RESOURCE_EXHAUSTED), `grpc-retry-pushback-ms: <ms>` |
//! | system overloaded: **stop retrying** | `503 Service Unavailable`, `X-Overloaded: stop-retrying`; the header's presence, whatever its value, is the signal | HTTP `200`, `grpc-status: 14` (UNAVAILABLE), `grpc-retry-pushback-ms: -1`, `x-overloaded: stop-retrying` |
//!
//! # Examples
//!
//! Reading the attempt counter of an incoming request:
//!
//! ```
//! use http::Request;
//! use overload_signal::protocol::{Attempt, X_REQUEST_ATTEMPT};
//!
//! let first = Request::builder().header(X_REQUEST_ATTEMPT, "0").body(()).unwrap();
//! assert_eq!(Attempt::from_request(&first), Attempt::Number(0));
//!
//! let retry = Request::builder().header(X_REQUEST_ATTEMPT, "2").body(()).unwrap();
//! assert!(Attempt::from_request(&retry).is_retry());
//!
//! let junk = Request::builder().header(X_REQUEST_ATTEMPT, "-1").body(()).unwrap();
//! assert_eq!(Attempt::from_request(&junk), Attempt::Malformed);
//!
//! let none = Request::builder().body(()).unwrap();
//! assert_eq!(Attempt::from_request(&none), Attempt::Unknown);
//! ```
//!
//! Answering with, and recognising, the stop signal:
//!
//! ```
//! use http::StatusCode;
//! use overload_signal::protocol::{Protocol, is_stop_signal, stop_signal_response};
//!
//! let http = stop_signal_response::<()>(Protocol::Http);
//! assert_eq!(http.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert!(is_stop_signal(http.headers()));
//!
//! let grpc = stop_signal_response::<()>(Protocol::Grpc);
//! assert_eq!(grpc.status(), StatusCode::OK);
//! assert_eq!(grpc.headers()["grpc-status"], "14");
//! assert!(is_stop_signal(grpc.headers()));
//! ```
//!
//! A rate-limit rejection's headers:
//!
//! ```
//! use std::time::Duration;
//! use overload_signal::protocol::{RateLimitPolicy, RateLimitStatus, format_retry_after};
//!
//! assert_eq!(format_retry_after(Duration::from_millis(1_200)), "2");
//! let policy = RateLimitPolicy::new("default", 100, Duration::from_secs(1))?;
//! assert_eq!(policy.to_header_value(), "\"default\";q=100;w=1");
//! let status = RateLimitStatus::new("default", 0, Duration::from_millis(300))?;
//! assert_eq!(status.to_header_value(), "\"default\";r=0;t=1");
//! # Ok::<(), overload_core::ConfigError>(())
//! ```

mod attempt;
mod ratelimit_fields;
mod retry_after;
mod stop;

pub use attempt::Attempt;
pub use ratelimit_fields::{RateLimitPolicy, RateLimitStatus};
pub use retry_after::{
    GrpcPushback, format_grpc_pushback, format_retry_after, grpc_pushback, parse_grpc_pushback,
    parse_retry_after, retry_after,
};
pub use stop::{
    Protocol, is_stop_signal, set_stop_signal, stop_signal_response, too_many_requests_response,
};

use http::HeaderName;
use http::header::HeaderMap;

/// `X-Request-Attempt`: the attempt counter, `0` on the first try, `1` on the first retry.
pub const X_REQUEST_ATTEMPT: HeaderName = HeaderName::from_static("x-request-attempt");

/// `grpc-previous-rpc-attempts`: gRPC's own attempt counter (same meaning as ours), read only
/// on gRPC requests that do not carry [`X_REQUEST_ATTEMPT`].
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// `X-Overloaded`: its presence on a response, with any value, means "the system is
/// overloaded, stop retrying".
pub const X_OVERLOADED: HeaderName = HeaderName::from_static("x-overloaded");

/// The value this crate sends in [`X_OVERLOADED`]. Receivers must not depend on it.
pub const STOP_RETRYING: &str = "stop-retrying";

/// `grpc-status`: the gRPC status code, in headers for trailers-only responses.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-message`: the human-readable gRPC status message.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// `grpc-retry-pushback-ms`: the gRPC server's retry delay in milliseconds; negative means
/// "do not retry".
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// `RateLimit-Policy` (IETF httpapi ratelimit-headers draft): the quota and its window.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// `RateLimit` (IETF httpapi ratelimit-headers draft): what is left and when it resets.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `Idempotency-Key`: a request carrying it may be retried whatever its method.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// gRPC status code `RESOURCE_EXHAUSTED` (8): the protocol's node-local rejection.
pub const GRPC_RESOURCE_EXHAUSTED: u16 = 8;

/// gRPC status code `UNAVAILABLE` (14): used with a negative pushback for the stop signal.
pub const GRPC_UNAVAILABLE: u16 = 14;

/// Whether a message with these headers is gRPC: its `content-type` is `application/grpc`
/// or starts with `application/grpc+` / `application/grpc;` (case-insensitive).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(http::header::CONTENT_TYPE) else {
        return false;
    };
    let ct = ct.as_bytes();
    const GRPC: &[u8] = b"application/grpc";
    if ct.len() < GRPC.len() || !ct[..GRPC.len()].eq_ignore_ascii_case(GRPC) {
        return false;
    }
    matches!(ct.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// The gRPC status carried in `grpc-status` in these headers, if any and well-formed.
///
/// Only trailers-only responses (the form rejections take) carry it in headers; a status in
/// the trailers of a streamed body is not visible here.
pub fn grpc_status(headers: &HeaderMap) -> Option<u16> {
    let v = headers.get(GRPC_STATUS)?.to_str().ok()?.trim();
    if v.is_empty() || v.len() > 5 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ct(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn grpc_content_types() {
        assert!(is_grpc(&ct("application/grpc")));
        assert!(is_grpc(&ct("application/grpc+proto")));
        assert!(is_grpc(&ct("Application/GRPC+json")));
        assert!(is_grpc(&ct("application/grpc;charset=utf-8")));
        assert!(!is_grpc(&ct("application/grpc-web")));
        assert!(!is_grpc(&ct("application/json")));
        assert!(!is_grpc(&ct("application/grp")));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn grpc_status_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(grpc_status(&h), None);
        h.insert(GRPC_STATUS, HeaderValue::from_static("8"));
        assert_eq!(grpc_status(&h), Some(8));
        h.insert(GRPC_STATUS, HeaderValue::from_static("x"));
        assert_eq!(grpc_status(&h), None);
        h.insert(GRPC_STATUS, HeaderValue::from_static("999999"));
        assert_eq!(grpc_status(&h), None);
    }
}
