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
//! Most fleets retry in a proxy: an Envoy sidecar or gateway (Istio, Envoy Gateway, Contour,
//! App Mesh) retries for the service by its route's retry policy. The server layers read
//! what Envoy sends and answer with what it obeys: nothing to change in code, three settings
//! of the route.
//!
//! - **`include_request_attempt_count: true`** on the route or virtual host. Envoy then
//!   sends `x-envoy-attempt-count` (`1` on the first attempt), which the overload layer
//!   counts as it counts `X-Request-Attempt` (the largest of the counters a request carries
//!   counts, so our client's first try retried by a sidecar is a retry; see [`Attempt`]).
//!   Without it the server cannot tell Envoy's retries from first tries, and never sends the
//!   stop signal on their account. Istio sets it on the virtual hosts it generates; Contour's
//!   setting is `includeRequestAttemptCount`.
//! - **A `retry_on` that does not name `envoy-ratelimited`.** Measured with Envoy 1.40,
//!   Envoy retries a `503` that carries `X-Overloaded` alone, or its own
//!   `x-envoy-overloaded`, and a gRPC stop signal whose only mark is its negative pushback,
//!   like any other failure; it never retries an answer that carries
//!   `x-envoy-ratelimited: true` unless the policy's `retry_on` names `envoy-ratelimited`.
//!   So every stop signal this crate sends carries `x-envoy-ratelimited: true`, and Envoy
//!   passes it on, headers and all, to its own client. Istio's default policy
//!   (`connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes` with
//!   `503`) and one that adds `429` and `resource-exhausted` are both safe; a policy that
//!   names `envoy-ratelimited` retries every stop signal, up to `num_retries`, and brings the
//!   storm back. A node-local rejection (`429` or `503` with `Retry-After`) does not carry
//!   the header: Envoy may retry it, elsewhere, as it invites.
//! - **The route's `timeout`.** Envoy sends what is left of it on every attempt as
//!   `x-envoy-expected-rq-timeout-ms`, and the [deadline layer](crate::DeadlineLayer)
//!   cancels work still queued or running when it passes (the earliest of the deadlines a
//!   request carries counts). That value is relative, counted from when the server reads the
//!   request, so a request that waited in a stalled server's listen queue looks new. For
//!   such requests to be dropped on arrival, let Envoy send the absolute deadline as well,
//!   in `X-Request-Deadline` ([`WireDeadline`]), whose send time the deadline layer believes
//!   from the callers it [trusts](crate::Trust) (by default those on private networks: a
//!   sidecar's or an internal gateway's address), within its skew allowance. On the route,
//!   with `timeout` the route's timeout in milliseconds:
//!
//! ```yaml
//! request_headers_to_add:
//! - header: { key: x-request-deadline, value: "t=%START_TIME(%s%3f)%, timeout=15000" }
//!   append_action: ADD_IF_ABSENT   # an edge Envoy: OVERWRITE_IF_EXISTS_OR_ADD
//! ```
//!
//! `ADD_IF_ABSENT` keeps a caller's own `X-Request-Deadline` (a client of this workspace
//! sends one), which then reaches the server from Envoy's address, trusted: right for a
//! sidecar or an internal gateway, whose callers are trusted anyway. An edge Envoy, whose
//! callers are not, overwrites it. An edge Envoy should also show its clients' addresses
//! (`use_remote_address: true`, which appends each to `X-Forwarded-For`): Envoy passes a
//! client's own `X-Request-Attempt` on untouched, and the default trust counts a claimed
//! retry only from private networks (see [`Attempt`], "Counters from proxies and other
//! clients").
//!
//! A client of this workspace behind Envoy reads Envoy's own shedding
//! (`x-envoy-overloaded`) and rate limiting (`x-envoy-ratelimited: true`) as the stop
//! signal, as Envoy's own router reads a rate-limited answer: not retried, no retry budget
//! spent, counted by the client-side throttle.
//!
//! The headers each side writes and reads:
//!
//! | header | on | written by | read by |
//! |---|---|---|---|
//! | `X-Request-Attempt: N` (`0`: first try) | request | `backoff-layer`'s `RetryLayer`, on every attempt | the overload layer (trusted callers); Envoy passes it on |
//! | `x-envoy-attempt-count: N` (`1`: first attempt) | request | Envoy, with `include_request_attempt_count` (replacing a client's) | the overload layer, as `N - 1` (trusted callers); `RetryLayer` removes a caller's before sending |
//! | `grpc-previous-rpc-attempts: N` | request | gRPC clients in every language | the overload layer, on gRPC requests (trusted callers); `RetryLayer` removes a caller's |
//! | `x-envoy-expected-rq-timeout-ms` | request | Envoy: what is left of the route timeout | the deadline layer, from arrival, from anyone |
//! | `X-Overloaded: stop-retrying` | response | the stop signal | `RetryLayer` (stop); Envoy retries it unless it also carries the next one, and passes it on |
//! | `x-envoy-ratelimited: true` | response | the stop signal; Envoy's rate limiter | Envoy: never retried unless `retry_on` names `envoy-ratelimited`; `RetryLayer`: stop |
//! | `x-envoy-overloaded` | response | Envoy, when it sheds (circuit breaker, overload manager) | `RetryLayer`: stop; Envoy's own retries do not stop on it |
//! | `grpc-retry-pushback-ms: -1` | response | the gRPC stop signal | `RetryLayer` and every gRPC client (gRPC A6): stop; Envoy passes it on |
//!
//! # gRPC clients in other languages
//!
//! gRPC's own clients (Python, C++, Ruby and PHP on C-core; Java, Go and Node alike, by
//! gRPC's retry design, A6) retry by their service config, and the server layers work with
//! them as they are: they send `grpc-previous-rpc-attempts` on retries, which the overload
//! layer counts (from the callers it trusts), and a negative `grpc-retry-pushback-ms`, the
//! gRPC stop signal, makes them fail the call at once with `UNAVAILABLE`, whatever their
//! `retryPolicy`. Keep their `retryThrottling` on: a channel with a small `maxTokens`
//! throttles itself within a few failures; the stop signal is for the fleet as a whole, and
//! for every new process, which starts with a full bucket. Between such clients and the
//! server, an Envoy stops retrying the stop signal only because it carries
//! `x-envoy-ratelimited: true` (above).
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
