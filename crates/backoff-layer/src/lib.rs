//! A Tower retry layer that does not cause retry storms.
//!
//! Wrap any `Service<http::Request<B>>` (a hyper-util `Client`, a tonic `Channel`, ...) with
//! [`RetryLayer`] and its transient failures are retried in a way that is safe for the
//! server:
//!
//! - **backoff with jitter** between attempts ([`backoff`]; the article's exponential
//!   backoff with normal jitter by default), with a random generator of its own per request;
//! - a **retry budget** ([`budget`]) that caps the extra load retries may add;
//! - the **attempt counter** `X-Request-Attempt: N` on every attempt (`0` first), so servers
//!   can see how much of their load is retries;
//! - **respect for a server that says stop**: a failure carrying the stop signal
//!   (`X-Overloaded`, or a negative `grpc-retry-pushback-ms`) is never retried; a success is
//!   a success whatever its headers;
//! - **no multiplication**: what a retry layer gave up on is final for every retry layer
//!   above it in the process, so nested layers of 3 attempts send 3, not 9;
//! - `Retry-After` and `grpc-retry-pushback-ms` as a **lower bound** on the next wait, even
//!   above the strategy's own maximum, up to
//!   [`max_retry_after`](RetryBuilder::max_retry_after) (30 s by default): a longer hint gives
//!   up at once rather than park the request;
//! - an overall **deadline**, 15 s by default (Envoy's default route timeout), that holds in
//!   every state: no wait passes it and no attempt is sent after it, a wait for the inner
//!   service's readiness included. It bounds the wait for the final response's head, never
//!   a response body. **The caller's own deadline** is folded into it: a
//!   [`RequestDeadline`](overload_signal::deadline::RequestDeadline) in the request's
//!   extensions, the current deadline of a handler behind `overload-signal`'s
//!   `DeadlineLayer` (so a tier passes on what is left of its own), or a `grpc-timeout`
//!   (`X-Request-Deadline`) already on the request. See [Deadlines on the
//!   wire](#deadlines-on-the-wire);
//! - a **per-attempt timeout** whose expiry is a retryable failure;
//! - **gRPC by gRPC's rules**: requests with `content-type: application/grpc...` are retried
//!   on retryable status codes (`UNAVAILABLE` and `RESOURCE_EXHAUSTED` by default), whatever
//!   their method, with the pushback honoured;
//! - **body replay**: request bodies up to 64 KiB are kept while they stream, and sent again
//!   byte for byte ([`ReplayBody`]); larger bodies are sent once and never retried;
//! - **tonic as a first-class user** (the `tonic` feature): `RetryLayer::new().for_tonic()`
//!   wraps a `Channel` for a generated client, with the stop signal as a matchable
//!   `Status::unavailable`;
//! - a **client-side throttle** per destination ([`throttle`]): when a destination keeps
//!   failing, most of its requests fail at once with [`Throttled`], never sent, and a few
//!   probe it, so a failed server is not buried under work its callers gave up on; a
//!   destination that accepts at least half of what it is sent is never refused anything;
//! - **criticality on the wire and shed from the bottom**: every attempt carries
//!   `X-Request-Criticality` (gRPC metadata alike) with the level its request may claim, a
//!   handler's calls inheriting its own request's level; the throttle and the budget refuse
//!   lower levels first. See [Criticality](#criticality);
//! - **an operator can tell layers apart**: every metric carries the layer's
//!   [`name`](RetryBuilder::name), and a state change (the budget refusing retries, the
//!   downstream saying stop) is logged once when it begins and once when it ends.
//!
//! # Examples
//!
//! With every default (3 attempts, the article's backoff, a 10% retry budget, the default
//! classification, a 15 s deadline, server hints waited for up to 30 s, 64 KiB replay
//! buffer, a client-side throttle per destination, the name `"default"`):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), backoff_layer::BoxError> {
//! use backoff_layer::RetryLayer;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new())
//!     .service(service_fn(|request: Request<_>| async move {
//!         // stands in for a hyper-util `Client`
//!         Ok::<_, std::io::Error>(Response::new(String::from("hello")))
//!     }));
//! let request = Request::get("http://127.0.0.1:8070/api").body(String::new())?;
//! let response = client.oneshot(request).await?;
//! assert_eq!(response.body(), "hello");
//! # Ok(())
//! # }
//! ```
//!
//! Customised: named after its downstream, five attempts, decorrelated jitter, a 2 s timeout
//! per attempt, a 10 s deadline, server hints waited for up to 5 s, and a budget shared by
//! every client of one downstream, named after it:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use backoff_layer::backoff::Decorrelated;
//! use backoff_layer::budget::{Budget, RetryBudget};
//! use backoff_layer::RetryLayer;
//!
//! let budget: Arc<dyn Budget> =
//!     Arc::new(RetryBudget::builder().name("payments").ratio(0.2).build()?);
//! let backoff = Decorrelated::builder()
//!     .base(Duration::from_millis(50))
//!     .cap(Duration::from_secs(5))
//!     .build()?;
//! let layer = RetryLayer::builder()
//!     .name("payments")
//!     .max_attempts(5)
//!     .backoff(backoff)
//!     .attempt_timeout(Duration::from_secs(2))
//!     .deadline(Duration::from_secs(10))
//!     .max_retry_after(Duration::from_secs(5))
//!     .shared_budget(budget)
//!     .build()?;
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Defaults
//!
//! | setting | default | source |
//! |---|---|---|
//! | [`name`](RetryBuilder::name) | `"default"` | |
//! | [`max_attempts`](RetryBuilder::max_attempts) | 3, the first included | SRE book, AWS SDKs, Polly |
//! | [`deadline`](RetryBuilder::deadline) | 15 s until the final response's head, or the caller's if earlier; sent in `X-Request-Deadline`, never as `grpc-timeout`; [`no_deadline`](RetryBuilder::no_deadline) removes it | Envoy's default route timeout |
//! | [`attempt_timeout`](RetryBuilder::attempt_timeout) | none | hyper-util's client |
//! | [`max_retry_after`](RetryBuilder::max_retry_after) | 30 s, and never past the deadline | Envoy, gRPC |
//! | [`backoff`](RetryBuilder::backoff) | [`Exponential`](backoff::Exponential): 100 ms, x2, jitter 0.1, at most 15 min | the article |
//! | [`budget`](RetryBuilder::budget) | a [`RetryBudget`](budget::RetryBudget), named after the layer: retries at most 10% of first attempts over 10 s, plus 1 per second | paper, SRE book |
//! | [`classifier`](RetryBuilder::classifier) | [`DefaultClassifier`](classify::DefaultClassifier) | RFC 9110, Envoy, .NET, gRPC |
//! | [`body_limit`](RetryBuilder::body_limit) | 64 KiB | linkerd |
//! | [`max_destination_series`](RetryBuilder::max_destination_series) | 32 destinations with outcome series of their own, the rest in `(other)` | the throttle's gauges |
//! | [`throttle`](RetryBuilder::throttle) | a [`Throttle`](throttle::Throttle) named after the layer: per destination, 2 s window, K = 2, at most 90 % refused; [`no_throttle`](RetryBuilder::no_throttle) removes it | the SRE book, gRPC-Go, Envoy; see [`throttle`] |
//!
//! [`RetryBuilder`] says more about each, with its associated constant.
//!
//! # Configuration
//!
//! Every configurable type of this crate follows one convention, shared with
//! `overload-signal` and `ratelimit-layer`: `X::new()` gives the defaults (each stated in
//! its docs with its source, and an associated constant such as
//! [`RetryLayer::DEFAULT_MAX_ATTEMPTS`]); `X::builder()` returns a builder with one named
//! setter per setting; `build()` checks the settings and returns a [`ConfigError`] that
//! names the setting, the value and the rule it broke:
//!
//! ```
//! use backoff_layer::{ConfigErrorKind, RetryLayer};
//! use backoff_layer::backoff::Exponential;
//!
//! let err = Exponential::builder().jitter(1.5).build().unwrap_err();
//! assert_eq!(err.field(), "jitter");
//! assert_eq!(err.kind(), ConfigErrorKind::OutOfRange);
//! assert_eq!(err.to_string(), "jitter must be within 0..=1, got 1.5");
//!
//! let err = RetryLayer::builder().max_attempts(0).build().unwrap_err();
//! assert_eq!(err.to_string(), "max_attempts must be at least 1, got 0");
//! ```
//!
//! # The inner service's body type
//!
//! The inner service receives `http::Request<ReplayBody<B>>`, where `B` is the caller's
//! body type. hyper-util's legacy `Client<C, ReplayBody<B>>` takes it as is. tonic's
//! `Channel` takes `tonic::body::Body` only: with the `tonic` feature,
//! `RetryLayer::for_tonic` gives a layer whose inner service takes that body (see
//! [`adapter`] and the next section).
//!
//! # tonic
//!
//! With the `tonic` feature, a generated client takes the retrying `Channel` as it is; the
//! client's type can be named (`HealthClient<Retry<Channel, Tonic>>`):
//!
//! ```no_run
//! # #[cfg(feature = "tonic")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use backoff_layer::adapter::Tonic;
//! use backoff_layer::{Retry, RetryLayer, is_overloaded};
//! use tonic::transport::Channel;
//! use tonic_health::pb::HealthCheckRequest;
//! use tonic_health::pb::health_client::HealthClient;
//! use tower::ServiceBuilder;
//!
//! let channel = Channel::from_static("http://127.0.0.1:50051").connect().await?;
//! let mut client: HealthClient<Retry<Channel, Tonic>> = HealthClient::new(
//!     ServiceBuilder::new()
//!         .layer(RetryLayer::new().for_tonic())
//!         .service(channel),
//! );
//! match client.check(HealthCheckRequest::default()).await {
//!     Ok(response) => { /* backoff_layer::RetryInfo in response.extensions() */ }
//!     Err(status) if is_overloaded(&status) => {
//!         // status.code() == tonic::Code::Unavailable, `x-overloaded` in its metadata
//!     }
//!     Err(status) => {
//!         let attempts = Tonic::attempts(&status); // from `grpc-previous-rpc-attempts`
//!         # let _ = attempts;
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Wrapping a gRPC client in the layer is the opt-in to retries, as a retry policy in a
//! service config is in gRPC: gRPC requests are retried whatever their method (all are
//! `POST`). gRPC rules apply to any gRPC request, with or without the feature: retryable
//! status codes (`UNAVAILABLE` and `RESOURCE_EXHAUSTED` by default, configurable with
//! [`RetryBuilder::grpc_retryable_codes`]) read from the response headers, where every
//! rejection puts them (a status in trailers comes after the response has started, and is
//! final); `grpc-retry-pushback-ms` as a lower bound on the wait, a negative one as the stop
//! signal; and `grpc-timeout` as the next section says.
//!
//! # Deadlines on the wire
//!
//! Every attempt tells the server how long it is waited for, so that a server (with
//! `overload-signal`'s `DeadlineLayer`) can drop work nobody waits for any more, and a lower
//! tier never gets more time than the top caller has left:
//!
//! | request | field | value | from |
//! |---|---|---|---|
//! | HTTP | `X-Request-Deadline: t=<ms since the Unix epoch>, timeout=<ms>` | the attempt's send time, and the time until its window ends: the per-attempt timeout, or what is left of the deadline, whichever is first | any deadline, the default 15 s included |
//! | gRPC | `grpc-timeout` | the time until the per-attempt timeout, or what is left of a deadline you set ([`RetryBuilder::deadline`]) or of the caller's, whichever is first | never the default deadline |
//!
//! Why the default deadline goes on the wire for HTTP and not for gRPC: `X-Request-Deadline`
//! promises a wait for the response's **head**, which is what the layer's deadline bounds,
//! and a server's `DeadlineLayer` cancels work only until the head (a body streams on). A
//! gRPC server applies `grpc-timeout` to the **whole call**, stream included, so the
//! default deadline sent there would end a long server-streaming call at 15 s; a deadline
//! you set, or one the caller gave (tonic's `Request::set_timeout` writes `grpc-timeout`),
//! is a promise about the call, and is sent.
//!
//! The caller's deadline (see the deadline bullet above) bounds the retry loop: no attempt
//! is sent after it (none at all when it has passed already), no wait passes it, and the
//! call ends with [`GiveUpReason::Deadline`] (`DEADLINE_EXCEEDED` through the tonic
//! adapter). Each attempt carries what is left of it, never more than the caller gave: a
//! caller's `grpc-timeout` is rewritten on every attempt, never copied.
//! # Criticality
//!
//! Every attempt carries `X-Request-Criticality` (the same name in gRPC metadata: a tonic
//! request's metadata is its headers) with the level
//! [`criticality::outgoing`](overload_signal::criticality::outgoing) gives for what the
//! request asks: a [`Criticality`](overload_signal::protocol::Criticality) in its
//! extensions, or else an `X-Request-Criticality` written by hand; never above the level of
//! the request being served (a handler behind `overload-signal`'s `CriticalityLayer`), so a
//! handler's downstream calls carry its request's level with no code, and a call may ask for
//! a lower level, never a higher one. With neither (no level asked, no request served), no
//! header is sent; a hand-written value that is not a level is removed. Retries carry the
//! same level as the first attempt.
//!
//! The same level, `critical` when none, is what the layer's limits shed by, from the
//! bottom:
//!
//! - the [throttle](throttle#levels-of-criticality) refuses every lower-level request to a
//!   failing destination before it refuses a higher one (it places its refusals on the
//!   lowest levels first, sending in total what its rule decides);
//! - the [retry budget](budget::RetryBudget#levels-of-criticality) lets a lower level
//!   draw only from the allowance above a reserve while a higher level is active, so in a
//!   storm `sheddable` retries stop before `critical` ones.
//!
//! A client whose requests are all of one level is throttled and budgeted exactly as
//! without levels.
//!
//! # What is retried
//!
//! The [`classify::DefaultClassifier`]: connect errors and timeouts, and `429`, `502`, `503`
//! (without the stop signal) and `504` responses, and gRPC's retryable codes; only for
//! idempotent methods (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE`), requests
//! carrying `Idempotency-Key`, or gRPC requests. Bring your own with
//! [`RetryBuilder::classifier`]. Whatever the classifier says, the layer never retries a
//! failure carrying the stop signal, an error a retry layer below gave up on
//! ([`classify::is_final`]), a response a retry layer below gave up on, or a failure that
//! comes back after the deadline.
//!
//! # Outcomes
//!
//! Every outcome is typed and matchable:
//!
//! | outcome | what the caller gets |
//! |---|---|
//! | a response the classifier calls final (a success, a `404`, ...) | `Ok(response)`, with [`RetryInfo`] `{ attempts, gave_up: None }` in its extensions |
//! | a retryable response, retries exhausted | `Ok(response)` (the last one), with `RetryInfo { gave_up: Some(reason) }`: [`GiveUpReason::MaxAttempts`], [`BudgetExhausted`](GiveUpReason::BudgetExhausted), [`Deadline`](GiveUpReason::Deadline), [`BodyNotReplayable`](GiveUpReason::BodyNotReplayable), [`NotRetryable`](GiveUpReason::NotRetryable) or [`RetryAfterTooLong`](GiveUpReason::RetryAfterTooLong) |
//! | a failure (`429`, `5xx` and their gRPC codes: the protocol's `Outcome::is_failure`) carrying the stop signal | `Err`, an [`Overloaded`] (`err.is::<Overloaded>()`, or [`is_overloaded`] anywhere in a source chain); the request-scoped marker of [`overload_signal::propagation`](https://docs.rs/overload-signal/latest/overload_signal/propagation/index.html) is raised |
//! | the same, from a layer set to honour stop signals without passing them up ([`StopSignals::HonourOnly`], for a third party) | `Ok(response)`, the failure itself with the stop signal taken out, with `RetryInfo { gave_up: Some(`[`GiveUpReason::StopSignal`]`) }`; the marker says the call was given up on, never the stop signal |
//! | an error the classifier calls final | `Err`, the inner service's error, boxed, unchanged |
//! | a retryable error, retries exhausted | `Err`, a [`GaveUp`] with the same reasons, the last error as its `source()` |
//! | the last attempt timed out | as a retryable error, the source being [`AttemptTimedOut`] |
//! | no response head before the deadline (15 s by default): a downstream that never answers | `Err`, a [`GaveUp`] ([`Deadline`](GiveUpReason::Deadline)) whose source is an [`AttemptTimedOut`] |
//! | the deadline passed while the inner service was not ready for the next attempt | `Err`, a [`GaveUp`] ([`Deadline`](GiveUpReason::Deadline)) whose source is an [`AttemptTimedOut`] |
//! | the caller's deadline had passed before the request reached the layer | `Err`, a [`GaveUp`] ([`Deadline`](GiveUpReason::Deadline), 0 attempts) whose source is an [`AttemptTimedOut`]; nothing is sent |
//! | refused by the client-side throttle: its destination keeps failing | `Err`, a [`Throttled`] (`err.is::<Throttled>()`, or [`is_throttled`] in a source chain), at once: the request was never sent |
//! | what a retry layer below returned after giving up (a [`GaveUp`], an [`Overloaded`], a [`Throttled`], a response whose `RetryInfo` has a reason) | returned unchanged |
//!
//! With `RetryLayer::for_tonic`, the same outcomes reach a generated client as tonic
//! `Status`es; [`adapter`] (the `Tonic` adapter, with the feature) says how.
//!
//! **Behind Envoy.** Envoy's own answers are the stop signal too: a failure carrying
//! `x-envoy-overloaded` (Envoy shed the request: a circuit breaker overflowed, its overload
//! manager, maintenance mode) or `x-envoy-ratelimited: true` (Envoy's rate limiter, or a
//! server of this workspace's stop signal passed on by Envoy) is never retried, spends no
//! retry budget, counts as a failure in the throttle (as every stop signal does), and is
//! passed up or honoured only by [`StopSignals`] like ours. A plain `503` from Envoy (an
//! upstream reset, no healthy host) is still retried. The layer sends the destination
//! nothing of its caller's proxy counters (`x-envoy-attempt-count`,
//! `grpc-previous-rpc-attempts`, which a gateway forwarding its request's headers would
//! carry): its own `X-Request-Attempt` counts its attempts, and a server reads the largest
//! counter it is sent.
//!
//! **Whose stop signals go up.** By default a downstream's stop signal is honoured and
//! passed up: the server this client runs in tells its own callers to stop too. That is
//! right inside one organisation, whose services judge overload by the same rule; a third
//! party's `X-Overloaded` would make our server tell its callers to stop on its word. Build
//! the layer in front of a third party with
//! [`stop_signals(StopSignals::HonourOnly)`](RetryBuilder::stop_signals): still never
//! retried, never passed up.
//!
//! **In a server that is a proxy.** Besides the stop signal, the layer marks the request's
//! [propagation scope](https://docs.rs/overload-signal/latest/overload_signal/propagation/index.html)
//! when it gives up (a deadline apart from other reasons) and when its throttle refuses a
//! call. `overload-signal`'s overload layer, outside, answers its caller from these marks
//! when the error reaches it (the stop signal, `504`, `503` with `Retry-After`, `502`),
//! instead of letting the error reset the caller's connection; the workspace's [outcomes
//! table](https://docs.rs/overload-signal/latest/overload_signal/protocol/index.html#outcomes)
//! has every row.
//!
//! # Metrics
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade (install any recorder;
//! none is installed here). Every metric carries the label `name`, the layer's
//! [`name`](RetryBuilder::name) (`"default"` unless set), so two layers of one process (one
//! per downstream, say) are two series; the budget's carry the budget's name, which is the
//! layer's for the budget a layer makes itself (see [`budget`](budget#whose-name)), and the
//! throttle's the throttle's, likewise.
//!
//! **Where they register:** a layer registers its metrics, and its default budget and
//! throttle their own, on its **first request**, with the recorder installed then, and keeps
//! the handles (no lookup per request): install the recorder before the first request;
//! building the layer before the recorder is fine. Every series is registered at zero then,
//! every `backoff_layer_gave_up_total` reason included; a destination's
//! `backoff_layer_throttle_probability` is registered the first time it is throttled, for
//! at most 32 destinations per throttle, the rest sharing one series (see the
//! [throttle's metrics](throttle#metrics)): a layer's series are bounded whatever
//! destinations it reaches. A destination's four outcome series
//! (`backoff_layer_request_outcomes_total`, `backoff_layer_attempt_outcomes_total`) are
//! registered on its first request, for the first
//! [`max_destination_series`](RetryBuilder::max_destination_series) (32) destinations of
//! the layer, the rest sharing `server_address="(other)"` (see [Effective and
//! actual](#effective-and-actual)).
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `backoff_layer_requests_total` | counter | `name` | requests (first attempts sent; a request the throttle refused is not one) |
//! | `backoff_layer_attempts_total` | counter | `name` | attempts sent, first ones included |
//! | `backoff_layer_retries_total` | counter | `name` | attempts after the first |
//! | `backoff_layer_gave_up_total` | counter | `name`, `reason` | give-ups, `reason`: `max_attempts`, `budget`, `deadline`, `body_not_replayable`, `not_retryable`, `retry_after_too_long` |
//! | `backoff_layer_stop_signals_total` | counter | `name` | failures carrying the stop signal |
//! | `backoff_layer_retry_delay_seconds` | histogram | `name` | the wait before each retry |
//! | `backoff_layer_request_outcomes_total` | counter | `name`, `server_address`, `outcome` (`success`, `failure`) | **effective**: requests by the outcome their caller got, after every retry, counted when the caller gets it |
//! | `backoff_layer_attempt_outcomes_total` | counter | `name`, `server_address`, `outcome` (`success`, `failure`) | **actual**: attempts by their own outcome, counted when it comes back |
//! | `backoff_layer_budget_retries_allowed_total` | counter | `name` (the budget's) | retries the [`RetryBudget`](budget::RetryBudget) let through |
//! | `backoff_layer_budget_retries_refused_total` | counter | `name` (the budget's), `criticality` (`sheddable`, `sheddable-plus`, `critical`, `critical-plus`: the request's level) | retries the budget refused |
//! | `backoff_layer_throttle_refused_total` | counter | `name` (the throttle's), `criticality` (the request's level, as above) | requests the client-side throttle refused, never sent |
//! | `backoff_layer_throttle_untracked_total` | counter | `name` (the throttle's) | requests to destinations the throttle had no room for, sent unthrottled |
//! | `backoff_layer_throttle_probability` | gauge | `name` (the throttle's), `destination` (`http://10.0.0.7:8080`: scheme, host and port) | a destination's refusal probability; registered the first time it is throttled; `destination="(other)"` for every destination beyond the first 32 throttled |
//!
//! ## Effective and actual
//!
//! What the callers of a destination saw beside what the wire carried, as Linkerd's
//! `linkerd viz routes -o wide` shows `EFFECTIVE_SUCCESS` and `EFFECTIVE_RPS` beside
//! `ACTUAL_SUCCESS` and `ACTUAL_RPS`. An effective success ratio near 1 over an actual one
//! of 0.6 is a destination failing 40 % of its attempts whose failures the retries hide; the
//! ratio of the two rates (actual over effective) is the load the retries add. The
//! `ops/prometheus` rules record both per `name` and `server_address`.
//!
//! - **Destination**: the request URI's scheme, host and port, as the client-side
//!   throttle's (whatever the throttle's scope, and with the throttle off), never the user
//!   information, path or query. Label `server_address`: OpenTelemetry's `server.address`
//!   as a Prometheus label, the host (lower case) with `:port` when the port is not the
//!   scheme's default (`api.internal`, `10.0.0.7:8080`, `[::1]:3000`); `(no authority)`
//!   for a URI without one (a tonic client not built `with_origin`). The scheme is not in
//!   the label: `http://a` and `https://a` are one series.
//! - **Bounded**: the first 32 destinations a layer sends to
//!   ([`RetryBuilder::max_destination_series`], 0 to 1 024) get series of their own, kept
//!   for the layer's life; every later one is counted in `server_address="(other)"`. A
//!   layer has at most `4 * (32 + 1)` of these series and a fixed table (64 slots), whatever
//!   URLs its users send it.
//! - **An attempt's success** is what the layer's classifier would not retry and that is
//!   not a failure: an answer that is not a failure in the protocol's [outcomes
//!   table](https://docs.rs/overload-signal/latest/overload_signal/protocol/index.html#outcomes)
//!   (a failure is a `429`, a `5xx`, or a gRPC server failure or capacity code such as
//!   `UNAVAILABLE` or `INTERNAL` in the response's head), that the classifier calls final.
//!   So a `200`, a `304`, a `404` and a gRPC `NOT_FOUND` are successes (as Linkerd counts
//!   them, a client error is the caller's), and so is a gRPC call whose status comes in
//!   trailers (the destination took the call); a `500` (final
//!   by default) is a failure; so are every retryable answer (`429`, `502`, `503`, `504`,
//!   and what a classifier of your own retries), every error (a timeout, a refused
//!   connection), the stop signal, and what a retry layer below gave up on.
//! - **A request's success** is its last attempt's, when the layer returns it as is: a
//!   request whose retryable failure was given up on (retries exhausted, the budget, the
//!   deadline, ...) is one failure, whatever its attempts were; so is a request the
//!   throttle refused (no attempt), one whose caller's deadline had passed (no attempt),
//!   and one ended by the stop signal (passed up or honoured only).
//! - **Not counted**: a request whose future its caller dropped, and its attempt in
//!   flight: their outcome never came. Over a window, `backoff_layer_attempt_outcomes_total`
//!   falls short of `backoff_layer_attempts_total` by the attempts in flight or dropped.
//!
//! Cost: a keyed hash of the destination (the throttle's) and a probe of the layer's table
//! per request, one counter increment per attempt and per request; a new destination takes
//! a lock once, to register its series.
//!
//! # Logs
//!
//! Through [`tracing`](https://docs.rs/tracing), a state change is logged once when it
//! begins, at `WARN`, and once when it ends, at `INFO` with `lasted_ms` (from its first
//! occurrence to its last), never once per request; each event has the field `name`:
//!
//! | state | begins | ends | `name` |
//! |---|---|---|---|
//! | the retry budget refusing retries | at the first refusal | after a whole budget window (10 s by default) without one | the budget's |
//! | the downstream saying stop retrying | at the first failure carrying the stop signal | after [`RetryLayer::STOP_SIGNAL_QUIET`] (10 s) without one | the layer's |
//! | a destination throttled by the client (with the field `destination`) | the first slot its refusal probability is above 0 | the first slot it is 0 again | the throttle's |
//!
//! An end is noticed by the **next request** after the quiet period (no task runs for it):
//! a client that stops sending logs the end when it sends again, its `lasted_ms` unchanged.
//! The throttle's are noticed by its ticker, a task that closes its window's slots every
//! 200 ms while the throttle lives.
//!
//! # Traces
//!
//! Through [`tracing`](https://docs.rs/tracing), with the attribute names of
//! OpenTelemetry's [HTTP client conventions](https://opentelemetry.io/docs/specs/semconv/http/http-spans/),
//! so that [`tracing-opentelemetry`](https://docs.rs/tracing-opentelemetry) exports them as
//! they are (the setup is [below](#exporting-to-opentelemetry)). Each request through the
//! layer is a span, and each attempt a child span of it, all at `DEBUG` (the level of
//! tower-http's `TraceLayer` spans): a filter at `INFO` keeps none of them,
//! `backoff_layer=debug` keeps them all.
//!
//! | span | `otel.kind` | fields |
//! |---|---|---|
//! | `retry`, one per request, a child of the caller's current span | `internal` | `otel.name` (the method, `GET`), `http.request.method`, `server.address`, `server.port`, `url.full`; when it ends: `http.response.status_code` and `error.type` of the last attempt, `retry.attempts` (attempts sent), `retry.gave_up` (a [`GiveUpReason::as_str`], `stop_signal` included, when the layer stopped on a retryable failure) |
//! | `attempt`, one per attempt, a child of `retry` | `client` | `attempt` (the `X-Request-Attempt` value), `otel.name`, `http.request.method`, `server.address`, `server.port`, `url.full`, `http.request.resend_count` (**retries only**: 1 on the first retry, absent on the first attempt, as the convention asks), `http.response.status_code`, `error.type`; for gRPC, `rpc.system` (`grpc`), `rpc.service`, `rpc.method`, `rpc.grpc.status_code`, and `otel.name` is `package.Service/Method` |
//!
//! The `attempt` span is OpenTelemetry's HTTP client span (one per physical request); the
//! `retry` span is the logical operation its convention says a retrying client may add as
//! their parent. `error.type` is the status code as text for a `4xx` or `5xx` (`"503"`),
//! the `grpc-status` for a gRPC failure (`"14"`), and for an error without an answer a
//! kind: `timeout`, `connect`, `overloaded`, `throttled`, or `_OTHER`. A gRPC status sent
//! in trailers (a call that streamed) is not seen by the layer, which reads response heads;
//! `rpc.grpc.status_code` is set when the head carries it (every rejection does).
//!
//! **Privacy**: `url.full` leaves out the user and password of the authority and replaces
//! the value of every query parameter with `REDACTED` (`/search?q=REDACTED&key=REDACTED`):
//! query strings carry tokens and signatures, and the convention asks for their removal.
//! No header is recorded.
//!
//! Events, at `DEBUG`, in the `retry` span (their message is the event's name in
//! OpenTelemetry):
//!
//! | event | fields | when |
//! |---|---|---|
//! | `retry wait` | `duration_ms`, `cause` (`backoff`, `retry_after` or `pushback`: the longer of the backoff's delay and the server's `Retry-After` or `grpc-retry-pushback-ms`, the backoff's on a tie), `http.request.resend_count` (of the retry it waits for) | before each retry |
//! | `throttle refused` | (the span's `error.type` is `throttled`, `retry.attempts` 0, and it has no `attempt` child) | the client-side throttle refused the request: nothing was sent |
//! | `budget refused` | `retry.attempts` | the retry budget refused a retry (a `gave up` follows) |
//! | `stop signal` | `retry.attempts`, `policy` (`pass_up`, `honour_only`) | an attempt's failure carried the stop signal: not retried |
//! | `gave up` | `retry.attempts`, `reason` (a [`GiveUpReason::as_str`]) | the layer stopped on a retryable failure |
//!
//! A success needs no event: its trace is the `retry` span and one `attempt`. An attempt
//! cut short by the per-attempt timeout is also logged (`attempt timed out`). A request
//! that was retried twice and then stopped is one `retry` span with three `attempt`
//! children, the second and third carrying `http.request.resend_count` 1 and 2, and in the
//! `retry` span two `retry wait` events and the `stop signal` event (the crate's test
//! `tests/suite/traces.rs` captures exactly that).
//!
//! **Cost.** With no subscriber interested in them, the spans cost a check of the
//! callsite's cached interest each, and no field is computed (no allocation): measured
//! within noise of the layer without them (see `BENCHMARKS.md`). With a subscriber, the
//! fields are computed once per span, `url.full` formatted by the subscriber itself.
//!
//! ## Exporting to OpenTelemetry
//!
//! This crate installs no subscriber (nor a metrics recorder): the application does. To
//! export the spans through [`tracing-opentelemetry`](https://docs.rs/tracing-opentelemetry)
//! over OTLP, with these versions in `Cargo.toml`:
//!
//! ```toml
//! opentelemetry = "0.33"
//! opentelemetry_sdk = "0.33"
//! opentelemetry-otlp = "0.33"   # OTLP over HTTP (protobuf)
//! tracing-opentelemetry = "0.34"
//! tracing-subscriber = { version = "0.3", features = ["env-filter"] }
//! ```
//!
//! install, at the start of `main`, a subscriber whose filter keeps the layers' `DEBUG`
//! spans and events (those of `overload-signal` and `ratelimit-layer` too, which record
//! their decisions as events of the server's request span):
//!
//! ```text
//! use opentelemetry::trace::TracerProvider as _;
//! use opentelemetry_otlp::WithExportConfig;
//! use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt};
//!
//! let exporter = opentelemetry_otlp::SpanExporter::builder()
//!     .with_http()
//!     .with_endpoint("http://127.0.0.1:4318/v1/traces")
//!     .build()?;
//! let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
//!     .with_batch_exporter(exporter)
//!     .with_resource(opentelemetry_sdk::Resource::builder().with_service_name("checkout").build())
//!     .build();
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::EnvFilter::new(
//!         "info,backoff_layer=debug,overload_signal=debug,ratelimit_layer=debug,tower_http=debug",
//!     ))
//!     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("checkout")))
//!     .init();
//! // ... and `provider.shutdown()?` before the process exits, to flush the last batch.
//! ```
//!
//! # Feature flags
//!
//! - `tower` (default): recognise `tower::timeout::error::Elapsed` as a retryable timeout,
//!   for stacks that put tower's `Timeout` under the retry layer.
//! - `tonic` (off by default): `RetryLayer::for_tonic` and the `adapter::Tonic` adapter, so
//!   a generated tonic client wraps a `Channel` without mapping bodies or errors by hand;
//!   tonic's `TimeoutExpired` counts as a timeout and its `ConnectError` as a connect error.
//!   Off by default because only tonic users should pay for tonic; it enables no tonic
//!   feature of its own.
//! - `reqwest` (off by default): [`reqwest::Reqwest`](crate::reqwest), a `reqwest::Client`
//!   as the layer's inner service, so a reqwest user gets the whole stack (streaming bodies
//!   replayed too); reqwest's connect errors and timeouts count as such. It enables no
//!   reqwest feature (TLS and the rest stay the user's choice).
//! - `reqwest-middleware` (off by default; enables `reqwest`): `reqwest::RetryMiddleware`,
//!   the layer as a `reqwest_middleware::Middleware` for a `ClientWithMiddleware`, the way
//!   `reqwest-retry`'s users compose.

pub mod adapter;
pub mod backoff;
pub mod body;
pub mod budget;
pub mod classify;
mod error;
#[cfg(feature = "tonic")]
mod grpc;
mod outcome;
#[cfg(feature = "reqwest")]
pub mod reqwest;
mod retry;
pub mod throttle;

pub use body::ReplayBody;
pub use error::BoxError;
pub use outcome::{AttemptTimedOut, GaveUp, GiveUpReason, RetryInfo};
// NOTE: not inlined: the module is `overload-core`'s, documented there. The retry budget
// takes a clock (`RetryBudgetBuilder::clock`): a user names one without naming that crate.
#[doc(no_inline)]
pub use overload_core::clock;
pub use overload_core::{ConfigError, ConfigErrorKind};
pub use overload_signal::{Overloaded, is_overloaded};
pub use retry::future;
pub use retry::{Retry, RetryBuilder, RetryLayer, StopSignals};
pub use throttle::{Throttled, is_throttled};

// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
