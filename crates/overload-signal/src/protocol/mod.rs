//! The wire protocol every crate of this workspace speaks.
//!
//! Header names, the attempt counter, the deadline (`X-Request-Deadline`, `grpc-timeout`,
//! Envoy's `x-envoy-expected-rq-timeout-ms`),
//! the "stop retrying" signal, `Retry-After` and `grpc-retry-pushback-ms`, and the IETF
//! `RateLimit` fields live here, once, so that the
//! client layer, the rate limiter and the overload layer cannot drift apart. The module
//! depends on `http` (and `httpdate` for HTTP-dates) only.
//!
//! # The protocol at a glance
//!
//! | what | HTTP | gRPC (`content-type: application/grpc...`; gRPC-Web alike, in its own `content-type`) |
//! |---|---|---|
//! | attempt counter, request | `X-Request-Attempt: N`, decimal, `0` on the first try, `1` on the first retry, sent on every attempt | same header; `grpc-previous-rpc-attempts` (same meaning, sent by gRPC clients in every language) is read too |
//! | attempt counter from a proxy, request | `x-envoy-attempt-count: N`, **1-based** (`1` on the first attempt), which Envoy sets when the route or virtual host has `include_request_attempt_count: true`; `N` counts as attempt `N - 1`, `0` is malformed | same |
//! | several counters on one request | the **largest well-formed** one is the request's counter (a request retried by any tier is a retry here: our client's first try retried by an Envoy sidecar carries `X-Request-Attempt: 0`, `x-envoy-attempt-count: 2`, and is the first retry); none well-formed and one malformed: malformed. Counted only from callers the [`Trust`](crate::Trust) setting trusts, whichever header claims the retry; the default trusts an Envoy on a loopback or private address | same |
//! | counter missing | [`Attempt::Unknown`]: not counted as a retry | same |
//! | counter malformed (empty, not decimal, signed, whitespace inside, over 64 bits, repeated with different values) | [`Attempt::Malformed`]: treated as unknown; never an error response, never a panic. Values above [`Attempt::CLAMP`] clamp to it | same |
//! | node-local rejection: retry later, elsewhere | `429 Too Many Requests`, `Retry-After: <whole seconds, rounded up, at least 1>`, `RateLimit-Policy: "default";q=100;w=1`, `RateLimit: "default";r=0;t=1` | HTTP `200`, `grpc-status: 8` (RESOURCE_EXHAUSTED), `grpc-retry-pushback-ms: <ms>` |
//! | a request whose cost exceeds a rate limit's capacity: never admissible, do not retry ([`exceeds_capacity_response`]) | `413 Content Too Large`, `RateLimit-Policy` (the quota it exceeds); no `Retry-After`, no `RateLimit` | HTTP `200`, `grpc-status: 3` (INVALID_ARGUMENT), `grpc-message`; no pushback |
//! | how long the caller still waits | `X-Request-Deadline: t=<ms since the Unix epoch>, timeout=<ms>`: when the attempt was sent, on the sender's clock, and how long from then the sender waits for the response's head ([`WireDeadline`]). A receiver measures the time the request queued from `t`, trusts `t` to within a skew allowance, and falls back on `timeout` from arrival when `t` lies further in its future. Malformed: ignored and counted, never an error response | `grpc-timeout` (gRPC's own): what is left of the caller's deadline when the attempt is sent, never more than the caller gave; read from arrival |
//! | how long a proxy still waits (request) | `x-envoy-expected-rq-timeout-ms: <ms>` (Envoy's, [`envoy_expected_rq_timeout`]): what is left of Envoy's route timeout for this attempt, or its per-try timeout if shorter; 1 to 15 digits, `0` is no deadline; read from arrival, from anyone (relative: no clock to trust). Malformed: ignored and counted | the same header (Envoy sets it on gRPC requests too) |
//! | several deadlines on one request | the **earliest** of those the receiver believes: `X-Request-Deadline` (its send time only from trusted callers; from anyone else, its `timeout` from arrival), `x-envoy-expected-rq-timeout-ms`; each is a tier that stops waiting then | the earliest of `X-Request-Deadline`, `grpc-timeout` and `x-envoy-expected-rq-timeout-ms`, as for HTTP |
//! | how much the caller needs the answer | `X-Request-Criticality: <level>`, one of `critical-plus`, `critical`, `sheddable-plus`, `sheddable` ([`Criticality`]; ASCII case ignored, `_` for `-` accepted); absent, malformed or repeated with different levels: the server's default (`critical` unless configured). A server caps what callers it does not [trust](crate::Trust) may claim (`critical` by default), and a handler's downstream calls carry its request's level, never a higher one ([`criticality`](crate::criticality)) | the same header, as gRPC metadata |
//! | the deadline passed before the request was served | `504 Gateway Timeout` | HTTP `200`, `grpc-status: 4` (DEADLINE_EXCEEDED) |
//! | node at capacity (a concurrency limit): retry later, elsewhere | `503 Service Unavailable`, `Retry-After: <whole seconds>`, no `X-Overloaded` ([`service_unavailable_response`]) | HTTP `200`, `grpc-status: 14` (UNAVAILABLE), `grpc-retry-pushback-ms: <ms>`, never negative |
//! | system overloaded: **stop retrying** | `503 Service Unavailable`, `X-Overloaded: stop-retrying`, `x-envoy-ratelimited: true` (what stops Envoy from retrying it). Read as the signal on a failure: `X-Overloaded` with any value, Envoy's `x-envoy-overloaded` with any value, or `x-envoy-ratelimited: true` (any case) ([`is_stop_signal`]) | HTTP `200`, `grpc-status: 14` (UNAVAILABLE), `grpc-retry-pushback-ms: -1`, `x-overloaded: stop-retrying`, `x-envoy-ratelimited: true`; read as the signal: the same headers as HTTP, or a pushback negative or not a number |
//!
//! # Behind Envoy
//!
//! Envoy (and the meshes and gateways built on it: Istio, Envoy Gateway, Contour) retries by
//! its route's retry policy. Measured with Envoy 1.40, it retries a `503` that carries
//! `X-Overloaded` or its own `x-envoy-overloaded`, and never an answer that carries
//! `x-envoy-ratelimited: true` unless the policy's `retry_on` names `envoy-ratelimited`;
//! so every stop signal this crate sends carries `x-envoy-ratelimited: true`, and Envoy
//! passes it on, headers and all, to its own client. An operator keeps it working by
//! **not naming `envoy-ratelimited` in `retry_on`** (an Envoy that names it retries every
//! stop signal, up to `num_retries`), and lets Envoy count its attempts with
//! `include_request_attempt_count: true` on the route or virtual host. A node-local
//! rejection (`429` or `503` with `Retry-After`) does not carry the header: Envoy may retry
//! it, elsewhere, as it invites. A client of this workspace behind Envoy reads Envoy's own
//! shedding (`x-envoy-overloaded`) and rate limiting (`x-envoy-ratelimited: true`) as the
//! stop signal, as Envoy's own router reads a rate-limited answer.
//!
//! # Outcomes
//!
//! Every layer that judges an answer asks one classification, [`Outcome`], and nothing
//! else: this table is the only list of what counts as what in the workspace. Its
//! [classes](OutcomeClass) are disjoint; the questions a layer asks are
//! [`is_capacity_signal`](Outcome::is_capacity_signal) (the caller should send less: a
//! capacity signal or the stop signal), [`is_failure`](Outcome::is_failure) (a server
//! failure, a capacity signal or the stop signal: what a client would retry, and the only
//! answers the stop signal counts on), [`is_server_failure`](Outcome::is_server_failure)
//! and [`is_stop_signal`](Outcome::is_stop_signal). Whether a failure is *retried* is the
//! retry layer's classifier's question (by method and idempotency too); its default answer
//! is in the table.
//!
//! | outcome | class | retry layer (default classifier) | client-side throttle | adaptive limit | overload layer |
//! |---|---|---|---|---|---|
//! | `1xx`–`3xx`; gRPC `OK`; a gRPC status sent in trailers (the call was taken) | success | final | accepted | latency sample | untouched |
//! | `4xx` but `429`; gRPC `CANCELLED` (1), `INVALID_ARGUMENT` (3), `NOT_FOUND` (5), `ALREADY_EXISTS` (6), `PERMISSION_DENIED` (7), `FAILED_PRECONDITION` (9), `ABORTED` (10), `OUT_OF_RANGE` (11), `UNAUTHENTICATED` (16) | client error | final | accepted | latency sample | untouched |
//! | `500`, `501`, `505`–`599`; gRPC `UNKNOWN` (2), `UNIMPLEMENTED` (12), `INTERNAL` (13), `DATA_LOSS` (15) | server failure | final | accepted: a bug is not overload | latency sample | the stop signal if a downstream call of the request received it, else untouched |
//! | `502` | server failure | retried | accepted | latency sample | as above |
//! | `429`, `503`, `504`; gRPC `DEADLINE_EXCEEDED` (4), `RESOURCE_EXHAUSTED` (8), `UNAVAILABLE` (14) | capacity signal | retried (gRPC: 8 and 14; the codes are configurable) | failed | latency sample | a rejection marked by a limit of this workspace: judged by the stop rule; a downstream stop signal: rewritten as it; else untouched (judged too with [`judge_every_rejection`](crate::OverloadSignalLayerBuilder::judge_every_rejection)) |
//! | any failure above carrying the stop signal (`X-Overloaded`; a `grpc-retry-pushback-ms` negative or not a number; Envoy's `x-envoy-overloaded`, or `x-envoy-ratelimited: true`) | stop signal | never retried: an [`Overloaded`](crate::Overloaded) error | failed | left out | passed on, completed into this crate's whole signal (`X-Overloaded`, `x-envoy-ratelimited: true`; for gRPC a pushback of `-1`) |
//! | a limit's own rejection (it carries a [`Rejection`](crate::signal::Rejection)) | (its status's) | (its status's) | (its status's) | left out: the service never ran | `RateLimited`, `AtCapacity`: judged by the stop rule; `MissingKey`, `ExceedsCapacity`: untouched |
//! | an error: a timeout, a refused connection | capacity signal | retried | failed | an overload failure (see its docs), unless marked | passed on as the error, or answered (below) |
//! | an error: any other (a reset connection, a TLS failure, ...) | capacity signal | final (the request may have been processed) | failed | as above | as above |
//! | an [`Overloaded`](crate::Overloaded) error | stop signal | final | failed | left out | the stop signal, marked or not (a retry layer behind a `Buffer` runs outside the request's scope) |
//! | `backoff-layer`'s `Throttled`: a call the throttle refused to send | none: nothing was sent | final | not counted | left out | `503` with `Retry-After: 1` (gRPC `UNAVAILABLE`, pushback 1000) |
//! | `backoff-layer`'s `GaveUp`: a retry layer below gave up | (its last outcome's) | final: retries never multiply in one process (across processes each tier's budget bounds them, and a spent budget tells the tier above to stop) | failed: each layer's throttle counts what it sent, the inner one its attempts, the outer one this error | left out; for a deadline, a latency sample | `504` for a deadline (gRPC `DEADLINE_EXCEEDED`), the stop signal for a spent retry budget, else `502` (gRPC `UNAVAILABLE`) |
//!
//! "Left out" (adaptive limit) and "answered" (overload layer) rely on the
//! [`propagation`](crate::propagation) marks that `backoff-layer`'s retry layer raises in
//! the request's scope: what a downstream did is not a measure of this service, and an
//! error in a proxy becomes an answer instead of a reset connection. The adaptive limit
//! leaves out whatever ends a request during which a downstream call was given up on,
//! throttled or told to stop, whichever row it falls in; a request whose downstream call
//! ran out of its deadline is a latency sample (the time is what a queueing service shows:
//! its calls inherit what is left of its requests' deadlines). A retry layer that spends
//! its budget marks the stop signal, so that a tier in a retry storm tells the tier above
//! to stop rather than invite its retries.
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
mod criticality;
mod deadline;
mod fields;
mod grpc;
mod headers;
mod outcome;
mod ratelimit_fields;
mod retry_after;
mod stop;
mod timeout;

pub use attempt::Attempt;
pub use criticality::{Criticality, UnknownCriticality};
pub use deadline::{MalformedDeadline, WireDeadline, deadline_exceeded_response};
pub(crate) use fields::RequestFields;
pub use grpc::{
    GRPC_DEADLINE_EXCEEDED, GRPC_INVALID_ARGUMENT, GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE,
    grpc_status, is_grpc, is_grpc_web,
};
pub use headers::{
    GRPC_MESSAGE, GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, GRPC_TIMEOUT,
    IDEMPOTENCY_KEY, RATELIMIT, RATELIMIT_POLICY, STOP_RETRYING, X_ENVOY_ATTEMPT_COUNT,
    X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_ENVOY_OVERLOADED, X_ENVOY_RATELIMITED, X_OVERLOADED,
    X_REQUEST_ATTEMPT, X_REQUEST_CRITICALITY, X_REQUEST_DEADLINE,
};
pub use outcome::{Outcome, OutcomeClass};
pub use ratelimit_fields::{RateLimitPolicy, RateLimitStatus};
pub use retry_after::{
    GrpcPushback, format_grpc_pushback, format_retry_after, grpc_pushback, parse_grpc_pushback,
    parse_retry_after, retry_after,
};
pub(crate) use stop::complete_stop_signal;
pub use stop::{
    Protocol, bad_gateway_response, exceeds_capacity_response, is_stop_signal,
    service_unavailable_response, set_stop_signal, stop_signal_response,
    too_many_requests_response,
};
pub use timeout::{
    envoy_expected_rq_timeout, format_grpc_timeout, grpc_timeout, parse_envoy_expected_rq_timeout,
    parse_grpc_timeout,
};
