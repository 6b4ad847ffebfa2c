//! The header names of the protocol (ours, gRPC's and Envoy's), and the value this crate
//! sends in `X-Overloaded`.

use http::HeaderName;

/// `X-Request-Attempt`: the attempt counter, `0` on the first try, `1` on the first retry.
pub const X_REQUEST_ATTEMPT: HeaderName = HeaderName::from_static("x-request-attempt");

/// `grpc-previous-rpc-attempts`: gRPC's own attempt counter (same meaning as ours), read only
/// on gRPC requests that do not carry [`X_REQUEST_ATTEMPT`].
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// `x-envoy-attempt-count`: Envoy's attempt counter, **1-based** (`1` on the first attempt,
/// `2` on the first retry), which Envoy sets on a request it forwards when the route or
/// virtual host has `include_request_attempt_count: true`, replacing what the client sent.
/// Read on every request, HTTP and gRPC: the value `n` counts as
/// [`Attempt::Number(n - 1)`](super::Attempt::Number); see [`Attempt`](super::Attempt)
/// for how it combines with the other counters.
pub const X_ENVOY_ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");

/// `X-Overloaded`: its presence on a response, with any value, means "the system is
/// overloaded, stop retrying".
pub const X_OVERLOADED: HeaderName = HeaderName::from_static("x-overloaded");

/// The value this crate sends in [`X_OVERLOADED`]. Receivers must not depend on it.
pub const STOP_RETRYING: &str = "stop-retrying";

/// `x-envoy-ratelimited`: set to `true` by Envoy on a response of its rate limiter; and by
/// this crate on every stop signal it sends (HTTP and gRPC), because Envoy never retries a
/// response that carries `x-envoy-ratelimited: true`, unless its retry policy's `retry_on`
/// names `envoy-ratelimited`. On a failure, a client of this workspace reads it (the value
/// `true`, in any case) as the stop signal; see [`is_stop_signal`](super::is_stop_signal).
pub const X_ENVOY_RATELIMITED: HeaderName = HeaderName::from_static("x-envoy-ratelimited");

/// `x-envoy-overloaded`: set (to `true`) by Envoy on a response it made itself when it shed
/// the request (a circuit breaker overflowed, the overload manager, maintenance mode). On a
/// failure, a client of this workspace reads its presence, whatever its value, as the stop
/// signal; see [`is_stop_signal`](super::is_stop_signal). Envoy itself retries an answer
/// that carries it: this crate's stop signal relies on [`X_ENVOY_RATELIMITED`] instead.
pub const X_ENVOY_OVERLOADED: HeaderName = HeaderName::from_static("x-envoy-overloaded");

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

/// `X-Request-Deadline`: when the request was sent and how long its sender waits for the
/// response's head, `t=<ms since the Unix epoch>, timeout=<ms>`; see
/// [`WireDeadline`](super::WireDeadline).
pub const X_REQUEST_DEADLINE: HeaderName = HeaderName::from_static("x-request-deadline");

/// `grpc-timeout`: how long the caller of a gRPC call waits, from when the server reads it.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// `x-envoy-expected-rq-timeout-ms`: how long Envoy still waits for this attempt, in
/// milliseconds, from when it forwarded it (what is left of its route timeout, or its
/// per-try timeout if that is shorter); set by Envoy on every request it forwards with a
/// timeout. See [`envoy_expected_rq_timeout`](super::envoy_expected_rq_timeout).
pub const X_ENVOY_EXPECTED_RQ_TIMEOUT_MS: HeaderName =
    HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

/// `X-Request-Criticality`: how much the caller needs the answer, one of `critical-plus`,
/// `critical`, `sheddable-plus`, `sheddable` (gRPC metadata of the same name); see
/// [`Criticality`](super::Criticality).
pub const X_REQUEST_CRITICALITY: HeaderName = HeaderName::from_static("x-request-criticality");
