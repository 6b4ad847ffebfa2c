//! The wire protocol every crate of this workspace speaks.
//!
//! Header names, the attempt counter, the deadline (`X-Request-Deadline`, `grpc-timeout`),
//! the "stop retrying" signal, `Retry-After` and `grpc-retry-pushback-ms`, and the IETF
//! `RateLimit` fields live here, once, so that the
//! client layer, the rate limiter and the overload layer cannot drift apart. The module
//! depends on `http` (and `httpdate` for HTTP-dates) only.
//!
//! # The protocol at a glance
//!
//! | what | HTTP | gRPC (`content-type: application/grpc...`; gRPC-Web alike, in its own `content-type`) |
//! |---|---|---|
//! | attempt counter, request | `X-Request-Attempt: N`, decimal, `0` on the first try, `1` on the first retry, sent on every attempt | same header; `grpc-previous-rpc-attempts` (same meaning) is read when ours is absent |
//! | counter missing | [`Attempt::Unknown`]: not counted as a retry | same |
//! | counter malformed (empty, not decimal, signed, whitespace inside, over 64 bits, repeated with different values) | [`Attempt::Malformed`]: treated as unknown; never an error response, never a panic. Values above [`Attempt::CLAMP`] clamp to it | same |
//! | node-local rejection: retry later, elsewhere | `429 Too Many Requests`, `Retry-After: <whole seconds, rounded up, at least 1>`, `RateLimit-Policy: "default";q=100;w=1`, `RateLimit: "default";r=0;t=1` | HTTP `200`, `grpc-status: 8` (RESOURCE_EXHAUSTED), `grpc-retry-pushback-ms: <ms>` |
//! | how long the caller still waits | `X-Request-Deadline: t=<ms since the Unix epoch>, timeout=<ms>`: when the attempt was sent, on the sender's clock, and how long from then the sender waits for the response's head ([`WireDeadline`]). A receiver measures the time the request queued from `t`, trusts `t` to within a skew allowance, and falls back on `timeout` from arrival when `t` lies further in its future. Malformed: ignored and counted, never an error response | `grpc-timeout` (gRPC's own): what is left of the caller's deadline when the attempt is sent, never more than the caller gave; read from arrival |
//! | the deadline passed before the request was served | `504 Gateway Timeout` | HTTP `200`, `grpc-status: 4` (DEADLINE_EXCEEDED) |
//! | node at capacity (a concurrency limit): retry later, elsewhere | `503 Service Unavailable`, `Retry-After: <whole seconds>`, no `X-Overloaded` ([`service_unavailable_response`]) | HTTP `200`, `grpc-status: 14` (UNAVAILABLE), `grpc-retry-pushback-ms: <ms>`, never negative |
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
mod deadline;
mod grpc;
mod headers;
mod ratelimit_fields;
mod retry_after;
mod stop;

pub use attempt::Attempt;
pub use deadline::{
    MalformedDeadline, WireDeadline, deadline_exceeded_response, format_grpc_timeout, grpc_timeout,
    parse_grpc_timeout,
};
pub use grpc::{
    GRPC_DEADLINE_EXCEEDED, GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE, grpc_status, is_grpc,
    is_grpc_web,
};
pub use headers::{
    GRPC_MESSAGE, GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, GRPC_TIMEOUT,
    IDEMPOTENCY_KEY, RATELIMIT, RATELIMIT_POLICY, STOP_RETRYING, X_OVERLOADED, X_REQUEST_ATTEMPT,
    X_REQUEST_DEADLINE,
};
pub use ratelimit_fields::{RateLimitPolicy, RateLimitStatus};
pub use retry_after::{
    GrpcPushback, format_grpc_pushback, format_retry_after, grpc_pushback, parse_grpc_pushback,
    parse_retry_after, retry_after,
};
pub use stop::{
    Protocol, is_stop_signal, service_unavailable_response, set_stop_signal, stop_signal_response,
    too_many_requests_response,
};
