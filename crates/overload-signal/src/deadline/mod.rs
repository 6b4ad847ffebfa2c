//! Deadlines: servers that drop work nobody waits for, and tiers that never give their
//! downstream more time than their caller has left.
//!
//! A server that falls behind (paused, overloaded, restarted into a backlog) works on
//! requests whose clients gave up long ago, while every new request waits behind them: the
//! work nobody waits for keeps it down. Clients of this workspace say how long they wait
//! (`backoff-layer`'s retry layer sends it with every attempt), so do Envoy (what is left of
//! its route timeout, on every attempt it forwards) and gRPC clients, and [`DeadlineLayer`]
//! lets a server act on it:
//!
//! - a request whose deadline has **passed when it reaches the layer** is answered at once,
//!   without running the inner service: HTTP `504 Gateway Timeout`, gRPC
//!   `DEADLINE_EXCEEDED`
//!   ([`deadline_exceeded_response`](crate::protocol::deadline_exceeded_response)). The cost of an
//!   expired request is a header read, so a backlog of thousands drains in milliseconds;
//! - a request **still running at its deadline** is cancelled (its future dropped) and
//!   answered the same way, unless
//!   [`cancel_at_deadline(false)`](DeadlineLayerBuilder::cancel_at_deadline);
//! - the inner service **reads the time left**: [`time_left`] and [`current`], in its `call`
//!   and while its future runs;
//! - a downstream call made through `backoff-layer`'s retry layer, from that task, carries
//!   **what is left** of the deadline, never more: a lower tier drops the work the top
//!   caller gave up on.
//!
//! ```text
//! network ──► OverloadSignalLayer ──► DeadlineLayer ──► rate or adaptive limit ──► handler
//! ```
//!
//! Put it inside the overload layer (whose attempt histogram then sees every request, the
//! expired included) and outside any limiter, so that an expired request spends no token
//! and no concurrency slot. `ratelimit-layer`'s `OverloadProtectionLayer` takes one with its
//! `deadline(..)` setting and puts it there.
//!
//! # Examples
//!
//! With the defaults (a 250 ms skew allowance, work cancelled at its deadline):
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use overload_signal::DeadlineLayer;
//! use overload_signal::deadline;
//! use tower::{ServiceBuilder, service_fn};
//!
//! let service = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new())
//!     .service(service_fn(|_req: Request<()>| async {
//!         // Work worth doing only with time left for it.
//!         let left = deadline::time_left().unwrap_or(Duration::MAX);
//!         let body = if left > Duration::from_millis(50) { "full" } else { "cached" };
//!         Ok::<_, Infallible>(Response::new(body))
//!     }));
//! # drop(service);
//! ```
//!
//! Customised: named `api` in its metrics and logs; a 50 ms skew allowance (hosts kept in
//! step by chrony); handlers that must finish what they start are never cancelled:
//!
//! ```
//! use std::time::Duration;
//! use overload_signal::DeadlineLayer;
//!
//! let layer = DeadlineLayer::builder()
//!     .name("api")
//!     .skew_allowance(Duration::from_millis(50))
//!     .cancel_at_deadline(false)
//!     .build()?;
//! # drop(layer);
//! # Ok::<(), overload_core::ConfigError>(())
//! ```
//!
//! # Where a request's deadline comes from
//!
//! The earliest of those below that the layer believes: each is a tier (the caller, a
//! proxy, an outer layer) that stops waiting at that point, and work past the earliest is
//! wasted whichever it is. A later one never revives a request an earlier one expired.
//!
//! - `X-Request-Deadline: t=<ms since the Unix epoch>, timeout=<ms>`
//!   ([`WireDeadline`](crate::protocol::WireDeadline)): sent at `t` by the sender's clock, and
//!   waited for until `t + timeout`. The send time lets the layer see the time a request sat
//!   in the listen queue (or a proxy's), which a relative timeout cannot show: the request a
//!   server reads after a pause is as old as the pause. See the skew allowance below;
//! - `grpc-timeout`, on gRPC requests: gRPC's own, relative, counted from arrival at the
//!   layer (a gRPC server's queue is unseen; HTTP/2 keeps connections open, so gRPC
//!   requests seldom wait in a listen queue). A tonic server also enforces it itself, outside
//!   every layer of `Server::layer` (answering `CANCELLED`), so behind tonic the layer's
//!   value is the time left it gives the handler and its downstream calls;
//! - `x-envoy-expected-rq-timeout-ms`, on HTTP and gRPC requests alike: what is left of
//!   Envoy's route timeout for this attempt (or its per-try timeout, if shorter), in
//!   milliseconds, which Envoy sets on every request it forwards with a timeout
//!   ([`envoy_expected_rq_timeout`](crate::protocol::envoy_expected_rq_timeout)). Relative,
//!   as `grpc-timeout`: counted from arrival at the layer, so the time the request spent
//!   between Envoy and the layer (the connection, the listen queue) is not seen. A `0`,
//!   which Envoy never sends (it means "no timeout" in Envoy's own headers), is no deadline;
//! - a [`RequestDeadline`] already in the request's extensions (an outer layer's), and the
//!   [current](current()) deadline of the task calling the layer (one service calling
//!   another in-process).
//!
//! A malformed field is ignored and counted (`overload_signal_deadline_malformed_total`),
//! never an error response. A request without any deadline is served as if the layer were
//! not there.
//!
//! # Clock skew
//!
//! A send time is read on the server's clock, so the two hosts' clocks must agree to within
//! the **skew allowance** (250 ms by default; [`DeadlineLayer::DEFAULT_SKEW_ALLOWANCE`] says
//! why, and what happens beyond it). Within it, a request is dropped on arrival only once its
//! deadline has passed by more than the allowance, and cancelled at the deadline plus the
//! allowance: a server whose clock is ahead never drops work its callers still wait for. A
//! send time further than the allowance in the server's future shows that the clocks
//! disagree: the deadline is then counted from arrival (`timeout` alone), and the request is
//! counted as skewed.
//!
//! # Whose send times count
//!
//! A send time is the caller's word. The layer believes it only from the callers its
//! [`Trust`](crate::Trust) trusts ([`DeadlineLayerBuilder::trust`]; by default those on
//! private networks, see [`trust`](crate::signal::trust)); anyone else's `X-Request-Deadline`
//! counts from arrival, its `timeout` alone: it can only shorten that caller's own request,
//! and it is never counted as skew nor sampled as queue time. The relative timeouts,
//! `grpc-timeout` and `x-envoy-expected-rq-timeout-ms`, need no trust and are believed from
//! anyone: they need no clock, and a caller can only shorten its own request with them. A trusted send time more than [`DeadlineLayer::MAX_QUEUED`] (one hour) in
//! the past is a wrong clock, not a queue: counted as skew, and read from arrival.
//!
//! # The time left a request runs with
//!
//! What [`time_left`] and [`current`] say in the handler, and what its downstream calls
//! carry, for `X-Request-Deadline: t, timeout` read `queued` after `t` (on this server's
//! clock), with the allowance `A`:
//!
//! With a relative timeout (`grpc-timeout`, `x-envoy-expected-rq-timeout-ms`), the time left
//! on arrival is the timeout, and the work is cancelled when it has passed: there is no send
//! time to doubt, so no allowance. With several deadlines, the earliest is the time left,
//! and the earliest cancellation the one that applies.
//!
//! | the request | time left on arrival | cancelled after |
//! |---|---|---|
//! | `queued < timeout`: the deadline not yet passed, as the clocks place it | `timeout - queued`: what the caller has left, never more | `timeout - queued + A` |
//! | `timeout <= queued < timeout + A`: admitted only because this server's clock may be up to `A` ahead | `min(timeout + A - queued, timeout)`: the time until the work is cancelled, never more than the caller gave | `timeout + A - queued` |
//! | `t` in the future, by at most `A` | `timeout`, from arrival | `timeout + A` |
//! | `t` in the future, by more than `A` (skewed) | `timeout`, from arrival | `timeout` |
//! | `queued >= timeout + A`, or `timeout` is 0 | expired on arrival: `504`, the handler never runs | |
//!
//! So every request the layer admits runs with some time left, never more than its caller
//! gave: the second row is the layer's bet that the clocks disagree, and the handler's
//! downstream calls get the same bet rather than a deadline already past, at which every
//! one would fail at once. A zero `timeout` leaves nothing to give, whatever the clocks.
//!
//! The layer reads tokio's clock before the wall clock, so that time passing between the
//! two reads (a thread preempted on a loaded host) counts as time queued: the deadline it
//! places is never later than `t + timeout` as this server's clock reads it (`t` and
//! `timeout` are whole milliseconds, truncated by the sender, so never later than the
//! sender's own deadline either). A tier whose clock agrees with its caller's thus never
//! tells its downstream more than the caller has left (outside the second row).
//!
//! # What the caller gets
//!
//! | request | HTTP | gRPC |
//! |---|---|---|
//! | deadline passed on arrival (by more than the allowance), or a zero timeout | `504 Gateway Timeout`, empty body; the inner service is not called | `200`, `grpc-status: 4` (DEADLINE_EXCEEDED), trailers-only |
//! | still running at its deadline (plus the allowance), cancelling on | the same; the inner future is dropped | the same |
//! | anything else | the inner service's response, untouched | the same |
//!
//! gRPC-Web requests (`application/grpc-web...`) are read and answered as gRPC, in their own
//! `content-type`.
//!
//! `backoff-layer` retries a `504` from another server, as any gateway timeout, but never
//! after its own deadline: the retry layer of a caller whose deadline passed gives up.
//!
//! # Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) facade, registered on the layer's first
//! request, each with the label `name` (see [`metric_names`](crate::metric_names)):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `overload_signal_deadline_expired_total` | counter | `name`, `when` (`arrival`, `running`) |
//! | `overload_signal_deadline_expired_queued_seconds` | histogram | `name` |
//! | `overload_signal_deadline_malformed_total` | counter | `name` |
//! | `overload_signal_deadline_skewed_total` | counter | `name` |
//! | `overload_signal_deadline_requests_total` | counter | `name` |
//! | `overload_signal_deadline_callers_total` | counter | `name`, `reason` (`expired`, `skewed`) |
//!
//! `overload_signal_deadline_requests_total` counts the requests that carried a deadline (or
//! arrived in the scope of one): what the expired and skewed figures are a share of.
//! `overload_signal_deadline_callers_total` counts caller-minutes: each caller network (an
//! IPv4 `/24`, an IPv6 `/48`, hashed into 128 classes) once in each minute in which it sent
//! an expired (`reason="expired"`) or skewed (`reason="skewed"`) request, so that an alert
//! can ask how many callers a figure comes from, which one caller cannot fake.
//!
//! # Logs
//!
//! Through [`tracing`](https://docs.rs/tracing), once per episode, each with the field
//! `name`: a `WARN` when the layer starts dropping a trusted caller's expired requests, and
//! an `INFO` once none has expired for [`DeadlineLayer::QUIET`] (10 s); likewise for trusted
//! callers' send times the clocks cannot explain (clock skew beyond the allowance, or a send
//! time over [`DeadlineLayer::MAX_QUEUED`] old). An episode's end is noticed by the next request.
//! Each dropped or cancelled request is a `debug` event.
//!
//! # Limits
//!
//! The current deadline follows the request's future, not threads or tasks: a downstream
//! call made from a task the handler spawns does not inherit it. Take [`current`] before
//! spawning, move the [`RequestDeadline`] into the task, and put it in the extensions of the
//! requests it sends (or run the task's work inside [`scope`]).
//!
//! The layer does not put the deadline in the request's extensions: inserting an extension
//! allocates, and nothing on the admitted path of this workspace's layers does.

mod current;
pub mod future;
mod layer;
mod service;
mod state;
mod telemetry;
#[cfg(test)]
mod tests;
mod value;

pub use current::{DeadlineScope, current, scope, time_left};
pub use layer::{DeadlineLayer, DeadlineLayerBuilder};
pub use service::Deadline;
pub(crate) use service::call_arrived;
pub(crate) use state::{Arrival, DeadlineState};
pub use value::RequestDeadline;
