//! An adaptive concurrency limit: survive overload with no capacity figure configured.
//!
//! A rate limit protects a server only when its rate is right: too high and it protects
//! nothing, too low and it turns good traffic away, and it is wrong again after every deploy
//! or when a dependency slows down. [`AdaptiveLimitLayer`] needs no figure: it measures the
//! latency of the requests it admits, finds how many requests the service can take at once
//! before they start to queue, and rejects the rest at once:
//!
//! | | HTTP | gRPC (`content-type: application/grpc...`; gRPC-Web alike) |
//! |---|---|---|
//! | rejected | `503 Service Unavailable`, `Retry-After` (whole seconds, at least 1) | HTTP `200`, `grpc-status: 14` (UNAVAILABLE), `grpc-retry-pushback-ms` (not negative: retry after it) |
//! | admitted | the inner response, untouched | same |
//! | exempt ([`exempt`](AdaptiveLimitBuilder::exempt): health checks) | the inner response, untouched, never rejected | same |
//!
//! Both rejections are the wire protocol's "node at capacity, retry later" row (the
//! [protocol table](overload_signal::protocol#the-protocol-at-a-glance)): the HTTP status
//! and the gRPC code say the same thing, `503` and `UNAVAILABLE`, and neither is the stop
//! signal (no `X-Overloaded`, no negative pushback). Each carries a [`Rejection`] of kind
//! [`AtCapacity`](overload_signal::signal::RejectionKind::AtCapacity) in its extensions,
//! for the overload layer and for your response mapper.
//!
//! [`Rejection`]: overload_signal::signal::Rejection
//!
//! Put `overload-signal`'s `OverloadSignalLayer` **outside** it, as outside any rate limiter
//! (one [`OverloadProtectionLayer`](crate::OverloadProtectionLayer) does it in the right
//! order in any server): when the attempt histogram shows that retries dominate, the
//! overload layer turns these rejections into the stop signal, so that clients stop
//! retrying instead of multiplying the load.
//!
//! # The algorithm: a gradient on a measured baseline
//!
//! The limit `L` bounds the requests in flight. Latencies of admitted requests are sampled
//! in windows (at least [`window`](AdaptiveLimitBuilder::window) long and at least
//! [`min_samples`](AdaptiveLimitBuilder::min_samples) outcomes; or sooner, see [requests
//! that take long](#requests-that-take-long)), and at the end of each window, with `s` the
//! window's latency percentile (the median by default) and `b` the baseline:
//!
//! ```text
//! gradient = clamp(b * tolerance / s, 0.5, 2)
//! L        = clamp(gradient * L + sqrt(L), min_limit, max_limit)   while gradient > 0.5
//! L        = clamp(gradient * L,           min_limit, max_limit)   while gradient = 0.5
//! ```
//!
//! While requests do not queue, `s` stays near `b`, the gradient is `tolerance` (1.25)
//! and `L` grows, by at least `sqrt(L)` per window, so the limit keeps looking for more
//! capacity; once they queue, `s` rises past `tolerance * b` and `L` shrinks. `L` settles
//! where `gradient * L + sqrt(L) = L`, that is where the latency is a little above
//! `tolerance * b` (by `1 / (1 - 1/sqrt(L))`: 1.35 times at `L` = 15, 1.11 times at 100).
//! Envoy's gradient controller adds a square-root headroom too, at every gradient (its
//! `sqrt(gradient * L)`, where this adds `sqrt(L)`, and not at the floor). The headroom keeps
//! one noisy window from cutting the limit under the service's knee; it is left out only when
//! the gradient is at its floor, so that a service much slower than the baseline (twice the
//! target or more) still drives the limit to its minimum, where the baseline is measured
//! again. Between once and twice the target the limit settles at `(r / (r - 1))²` instead,
//! with `r` the latency over the target (about 7 for `r` = 1.6, a dependency that doubled the
//! latency; 4 to 36 for `r` from 1.99 to 1.2), above the minimum. A queue's latency falls as
//! the limit falls; a latency that does not (a dependency that became slower, a stale
//! baseline) has the baseline measured again within a few windows (see **The baseline**
//! below). Two guards:
//!
//! - the limit grows only when at least half of it was in use during the window: a limit
//!   that traffic never reached says nothing, and growing it would let a burst in all at
//!   once;
//! - a window where at least [`failure_threshold`](AdaptiveLimitBuilder::failure_threshold)
//!   of the outcomes were [overload failures](#outcomes) (errors of the inner service, not
//!   responses) multiplies `L` by [`backoff`](AdaptiveLimitBuilder::backoff) (0.9),
//!   whatever the latency.
//!
//! **The start.** A new layer admits up to
//! [`initial_limit`](AdaptiveLimitBuilder::initial_limit) (20) requests at once from its
//! first request, and its first window (at least
//! [`probe_samples`](AdaptiveLimitBuilder::probe_samples), 50 outcomes) measures the first
//! baseline at that limit: nobody is turned away to measure it, so a process started into
//! a rolling deploy serves its share at once (and the limit grows from the next window on,
//! by at least `sqrt(L)` per window, if the share needs more than 20 at once). Or you seed
//! the baseline ([`baseline`](AdaptiveLimitBuilder::baseline)), and it tracks from the
//! first window.
//!
//! A first baseline measured **with the limit full and requests turned away** is in doubt:
//! a process started into overload may already have had a queue in front of the service at
//! the initial limit, and a baseline that holds a queue puts the target, and the limit, above
//! the service's knee. Such a baseline is measured again (a probe, below) at the **first
//! window that is overloaded** (it rejected requests and its latency was above the target),
//! instead of an interval later. The doubt ends when any probe ends, when the first
//! periodic probe falls due (from then on the interval decides), or, with no probe, at two
//! windows in a row that reject nobody (the limit has then met the demand; one may be a
//! lull, clients backing off). So a process in a rolling deploy whose service does not queue
//! (its latency stays within the target while the limit grows to its share) is probed at its
//! start at most once, and rarely: only when one window's latency is noisy enough to pass the
//! target (with exponential service times, a median of 50 samples does so in a fair share of
//! starts). The cost is one measurement of 50 requests at a quarter of the limit.
//!
//! **The baseline** `b` is the no-load latency, measured, not guessed. It is measured again
//! (a probe) when it matters and may be stale:
//!
//! - every [`probe_interval`](AdaptiveLimitBuilder::probe_interval) (60 s, with 15 %
//!   jitter) **while the service is overloaded**: the window rejected requests and its
//!   latency was above the target. A probe that falls due otherwise is put off by one
//!   interval: while nothing is rejected the baseline decides nothing, and while the latency
//!   is within the target a rejection only means the limit has not grown to the demand yet;
//!   measuring then would turn away a load the service can take. (Envoy measures on
//!   schedule whatever the load.)
//! - at the first overloaded window after a first baseline measured with the limit full and
//!   requests turned away (see **The start**), due or not;
//! - whenever the limit sat at its floor for 5 windows in a row (the service may have become
//!   slower for good), loaded or not; the limit reaches its floor only under a latency of
//!   twice the target or more (see the headroom above);
//! - when the service is overloaded and the limit has fallen by 30 % or more under the
//!   highest it held (full, rejecting) since the last measurement, while the latency did not
//!   fall with it, in three windows in a row, the gradient above its floor; at most once per
//!   `probe_interval`. While the limit is full, Little's law ties latency to it: a queue's
//!   latency falls in proportion to the limit, a stale baseline's (a dependency that became
//!   slower) stays; "did not fall" is "fell by less than the square root of the limit's
//!   fall". A dependency that doubled the latency is measured again within about a second,
//!   where the periodic probe took up to 69 s; a real loss of capacity (fewer workers) may
//!   cost one probe that finds the same baseline.
//!
//! A probe lowers the limit to [`probe_share`](AdaptiveLimitBuilder::probe_share) (a
//! quarter) of the limit in force, at least [`min_limit`](AdaptiveLimitBuilder::min_limit)
//! (3), until [`probe_samples`](AdaptiveLimitBuilder::probe_samples) (50) requests admitted
//! under it have completed; their percentile is the new baseline and the previous limit is
//! restored. Requests admitted before the probe started are not counted in it. A probe
//! lasts at most [`probe_timeout`](AdaptiveLimitBuilder::probe_timeout) (5 s): then the
//! previous limit comes back, with a new baseline if half the samples came in, the old one
//! otherwise, so a probe whose requests an outer timeout drops cannot hold the limit down.
//!
//! **Why this one.** A baseline taken from a slowly moving average (Netflix's Gradient2)
//! drifts upward under sustained overload, since every sample is already queued; a
//! minimum of single samples (Vegas) is meaningless when service times vary (the minimum
//! of exponential service times is near zero). Measuring a percentile at a low
//! concurrency, as Envoy's adaptive concurrency filter does, gives a baseline that does
//! not drift, at the price of a short period at a reduced limit per minute of overload;
//! comparing percentiles of whole windows keeps the noise of single requests out of the
//! limit.
//!
//! Sources: Envoy's adaptive concurrency filter (the gradient controller: the baseline
//! measured at low concurrency, the gradient clamped to `0.5..=2`, the `sqrt` headroom, the
//! p50 aggregate, the 25 % buffer, `min_concurrency` 3, 50 requests per measurement, 15 %
//! jitter, at most 1000); Netflix's concurrency-limits (the gradient idea, the initial limit
//! of 20, the AIMD backoff of 0.9 on drops); TCP Vegas (queueing is visible in latency before
//! it is visible in losses). The start at the initial limit, the probes at a share of the
//! limit only under overload, their deadline, and the early measurement when the latency does
//! not fall with the limit are this crate's, as are the
//! implementation and the combination.
//!
//! # Outcomes
//!
//! What each admitted request counts for is the "adaptive limit" column of the workspace's
//! one outcome table (`overload_signal::protocol`, "Outcomes"): **latency alone**, as
//! Envoy's adaptive concurrency filter. An admitted request ends in one of four ways:
//!
//! - a **response the service made**, whatever its status: 2xx, 4xx, a `500` from a bug,
//!   and a `429`, `503` or `504` (or gRPC `RESOURCE_EXHAUSTED`, `UNAVAILABLE`,
//!   `DEADLINE_EXCEEDED`) the handler made: its latency is a sample. A handler whose
//!   dependency is down answers `503` as fast as it answers anything; were that this
//!   service's overload, the limit would walk to its floor and shed the routes that never
//!   use the dependency. If the service itself slows down, its latency shows it;
//! - **left out**, neither a sample nor a failure:
//!   - a **rejection by a limiting layer inside this one** (its answer carries a
//!     [`Rejection`]: a global rate limit's `429`, a keyed limit's): the service never
//!     ran, and a rate limit under this one sheds what it must without driving this limit
//!     down;
//!   - the **stop signal** (`X-Overloaded`, a negative `grpc-retry-pushback-ms`; or an
//!     [`Overloaded`](overload_signal::Overloaded) error, alone or in a `tower::BoxError`'s
//!     chain), which a handler passes on from a downstream: it says how the downstream is
//!     doing;
//!   - **anything that ends a request during which a downstream call was marked** given
//!     up on, refused by its client-side throttle, or told to stop: a retry layer of
//!     `backoff-layer` below raises the marks in the overload layer's propagation scope
//!     ([`overload_signal::propagation`]), which is current while this limit runs under
//!     [`OverloadProtectionLayer`](crate::OverloadProtectionLayer). Such a request measures
//!     the downstream and its retries, not this service: its `502`, its error, even its
//!     `200` are left out. Without the overload layer outside, there are no marks, and these
//!     requests count as above. A downstream call that ran out of its **deadline** is the
//!     exception: the request's time is a latency sample, never a failure (its calls inherit
//!     what is left of its deadline, so a queueing service makes them run out: the time
//!     shows it);
//! - an **overload failure**: an error of the inner service (no response at all: a tower
//!   `Timeout` or `LoadShed` inside this layer), neither the stop signal nor marked. Counted
//!   toward the failure share ([`failure_threshold`](AdaptiveLimitBuilder::failure_threshold));
//!   its latency is not sampled (a fast failure says nothing about queueing);
//! - its future is **dropped** before it completes (the client went away, a timeout above
//!   fired): its slot is freed. If it ran longer than the baseline times the tolerance, the
//!   time it ran is sampled as its latency (a lower bound), so that a timeout layer above
//!   this one cannot hide a slowing service from the limit; a request dropped sooner
//!   records nothing (a client leaving says nothing about the service). Nothing dropped is
//!   sampled while the baseline is measured.
//!
//! # Requests that take long
//!
//! A request that does not end (an upload whose body trickles in, a long poll, a call to a
//! dependency that never answers) would hold its slot for good, and twenty of them would
//! hold a limit of twenty: every other request rejected, and no window closing, since
//! windows close on completions. Two rules keep that from happening:
//!
//! - **Held requests are released.** A request still in flight after
//!   [`release_after`](AdaptiveLimitBuilder::release_after) (by default ten times the
//!   target latency, the baseline times the tolerance, within 1 to 30 s; 5 s while no
//!   baseline is known) stops counting toward the limit: its slot comes back, and it counts
//!   once as a latency sample of the time it has run, which is evidence of overload, so
//!   many of them bring the limit down. When it ends at last, nothing more is counted. It is
//!   released between one and two bounds after admission, by the layer's tick (every
//!   100 ms). Released requests still run: they count toward
//!   [`max_limit`](AdaptiveLimitBuilder::max_limit) with those in flight, so a service that
//!   never answers holds at most that many, however long it lasts.
//! - **A window held full closes on time.** When the limit turned requests away in a
//!   window that has lasted twice its length, and nothing has completed for twice the
//!   window and the target latency (once a baseline is known), the tick closes the window
//!   whatever it holds: the
//!   requests that completed before show whether the service was fine with the limit in
//!   use, and the limit grows if so. (A window that is not held full still waits for its
//!   outcomes: the percentile of a handful of samples is noise.)
//!
//! Until then, the held requests hold their slots: twenty that arrive at once into a limit
//! of twenty, right after a window closed, leave nothing to learn from, and the other
//! requests are rejected for one to two bounds (1 to 2 s at the default for a fast
//! service). So do not let such requests reach the limit:
//!
//! - **exempt long polls and streams** ([`exempt`](AdaptiveLimitBuilder::exempt)): a
//!   request that is meant to last has no latency to measure;
//! - **a request-body timeout belongs inside the layer**, between it and the handler (for
//!   example tower-http's `RequestBodyTimeoutLayer` added after this one in a
//!   `ServiceBuilder`, or before it in axum's `Router::layer`), so that a slow upload fails
//!   and frees its slot within your timeout. The body is read inside the handler, after
//!   this layer admitted the request; a timeout outside cannot see it;
//! - give calls to dependencies a timeout (`backoff-layer`'s retry layer has a per-attempt
//!   one), so that a hung dependency answers `504` or `502` rather than never.
//!
//! `ratelimit_layer_adaptive_held_total` counts the requests released; a steady rate there
//! is one of these missing.
//!
//! # Criticality: shedding from the bottom
//!
//! Each request has a level, a
//! [`Criticality`](overload_signal::protocol::Criticality) (`sheddable` < `sheddable-plus` <
//! `critical` < `critical-plus`), which the limit reads from the request's extensions, where
//! `overload-signal`'s `CriticalityLayer` puts it (from the `x-request-criticality` header,
//! capped for untrusted callers); a request with none is `critical`. The limit never parses
//! the header itself.
//!
//! With `L` the limit in force, a request of level `c` is admitted only while, once it is,
//! the requests in flight (of every level) are at most `L − held(c)`, where `held(c)` is
//! `c`'s share of `L` in the layer's [`reserves`](AdaptiveLimitBuilder::reserves) **while a
//! higher level is active** (seen in the last 10 s), and 0 otherwise: the top of the limit
//! is open only to the levels above `c` while they come (Envoy's per-priority thresholds,
//! Netflix's partitioned limiter). By default `sheddable` may not take the top half of the
//! limit, `sheddable-plus` the top quarter, `critical` the top tenth, while a higher level
//! is active. What this gives:
//!
//! - **A lower level is always refused first.** At any moment, a request that would be
//!   admitted at a level would be admitted at every higher level: while a lower level is
//!   still admitted, no higher level is rejected.
//! - **A bound for each level.** Requests below `c` were each admitted with at most
//!   `L − held(c − 1)` in flight (the level just below `c` has the smallest share among
//!   them), so they never hold more than that. Hence: **when the requests in flight of level
//!   `c` and above number fewer than `held(c − 1) − held(c)`, level `c` is not rejected**
//!   (with the defaults and `critical` traffic beside a `sheddable` flood: `critical` is
//!   not rejected while fewer than half the limit of its requests are in flight). This
//!   holds once the lower requests in flight were all admitted while `c` was active (the
//!   first requests of a level back after 10 s of quiet may find the lower levels holding
//!   the whole limit, for as long as those take to end), and with `L` the limit at which
//!   they were admitted: when the limit
//!   falls (a window lowers it, or a **probe** holds it at a quarter of itself to measure
//!   the baseline, about once a minute under overload), the lower requests already in
//!   flight keep their slots until they end, and for that while, and during the probe, a
//!   higher level can be rejected. In the test below, that is 11 rejections of `critical`
//!   in 73 seconds of a flood, all in its one probe (0.08 %), and 7 in the first second,
//!   in the start-up's.
//! - **One level is limited exactly as without levels.** A share is held back only while a
//!   higher level is active, so traffic all of one level (a server where nobody sets a
//!   level: all `critical`) is decided request by request as with
//!   [`Reserves::none`](overload_signal::criticality::Reserves::none), which makes the limit
//!   blind to levels.
//!
//! The controller measures the service as before: a lower level that may take only
//! `L × (1 − share)` fills its part, the latency at that concurrency decides, and the limit
//! grows until the concurrency admitted fills the service (the limit settles near
//! `1 / (1 − share)` times the service's knee, so the capacity is used by the lower level
//! while the higher one is quiet). A window in which a level was turned away at its part
//! counts as a limit in use even when fewer than half of it were in flight (the rule that
//! keeps an idle limit from growing), or a share above one half would hold the limit, and
//! the lower level's goodput, down.
//!
//! Figures, under paused time, on 20 workers of 50 ms (400 requests a second, the
//! `adaptive_criticality` tests): `critical` at 200 a second beside a `sheddable` flood of
//! 4000 a second: the limit settles at 53 to 60, `critical` is served whole but in the one
//! probe (11 rejections), its latency p50 71 ms and p99 95 ms (the limit's target, as for
//! any admitted request: the service's queue is FIFO, so `critical` waits behind the
//! `sheddable` requests admitted before it), and `sheddable` takes the other 200 a second.
//! The same load on a limit without reserves rejects 89 % of `critical`. An overload of
//! `sheddable` alone beside 5 `critical` a second keeps 99 % of the capacity, with a
//! `sheddable` share of 50 % (the limit at about 57) and of 80 % (about 140).
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use overload_signal::protocol::Criticality;
//! use ratelimit_layer::AdaptiveLimitLayer;
//! use tower::{Layer, Service, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = AdaptiveLimitLayer::builder().initial_limit(4).build()?;
//! // A service that never answers: each admitted request holds its slot.
//! let mut service = layer.layer(service_fn(|_: Request<()>| {
//!     std::future::pending::<Result<Response<()>, Infallible>>()
//! }));
//! let request = |level: Criticality| {
//!     let mut request = Request::new(());
//!     request.extensions_mut().insert(level);
//!     request
//! };
//! let mut held = Vec::new();
//! held.push(service.ready().await?.call(request(Criticality::Critical)));
//! held.push(service.ready().await?.call(request(Criticality::Sheddable)));
//! // Two in flight: while `critical` is active, `sheddable` may take half the limit (2).
//! let refused = service.ready().await?.call(request(Criticality::Sheddable)).await?;
//! assert_eq!(refused.status(), 503);
//! // `critical` may take all of it.
//! held.push(service.ready().await?.call(request(Criticality::Critical)));
//! assert_eq!(layer.status().in_flight, 3);
//! # Ok(())
//! # }
//! ```
//!
//! A DAGOR-style admission level (the lowest level admitted, raised while the limit is
//! full) was not needed: the shares give the order at every request, with no state to move.
//!
//! # Examples
//!
//! With the defaults, in a `tower::ServiceBuilder`, under the overload layer:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use ratelimit_layer::{AdaptiveLimitLayer, OverloadProtectionLayer};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let service = ServiceBuilder::new()
//!     // The overload layer outside the limit, so that it sees the limit's rejections.
//!     .layer(OverloadProtectionLayer::new(AdaptiveLimitLayer::new()))
//!     .service(service_fn(|_: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("hello")))
//!     }));
//! let response = service.oneshot(Request::new(String::new())).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! Customised, in axum:
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use ratelimit_layer::{AdaptiveLimitLayer, OverloadProtectionLayer};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let adaptive = AdaptiveLimitLayer::builder()
//!     // Settle nearer the no-load latency, and never admit more than 200 at once.
//!     .tolerance(1.1)
//!     .max_limit(200)
//!     // A fresh process takes 60 at once from its first request.
//!     .initial_limit(60)
//!     // The load balancer's health checks are never refused.
//!     .exempt(|parts: &http::request::Parts| parts.uri.path() == "/healthz")
//!     .name("api")
//!     .build()?;
//! let status = adaptive.clone();
//! let app = Router::new()
//!     .route("/api", get(|| async { "hello" }))
//!     .route("/healthz", get(|| async { "ok" }))
//!     .layer(OverloadProtectionLayer::new(adaptive));
//! tokio::spawn(async move {
//!     loop {
//!         tokio::time::sleep(Duration::from_secs(1)).await;
//!         println!("limit: {}", status.status().limit);
//!     }
//! });
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8070").await?;
//! // The peer address in each request (feature `axum-0_8`): the overload layer tells
//! // callers apart by it.
//! axum::serve(listener, ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app))
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! In tonic, `tonic_0_14::server_builder().layer(OverloadProtectionLayer::new(AdaptiveLimitLayer::new()))`:
//! one layer, in the right order whichever way the server nests. Rejections are then
//! `UNAVAILABLE` with `grpc-retry-pushback-ms`.
//!
//! # Metrics
//!
//! Through the `metrics` facade, labelled `name` (the layer's
//! [`name`](AdaptiveLimitBuilder::name), `default` unless set), the request counters also
//! `criticality` (the request's level, as
//! [`Criticality::as_str`](overload_signal::protocol::Criticality::as_str) spells it:
//! `sheddable`, `sheddable-plus`, `critical`, `critical-plus`); the names are in
//! [`metric_names`](crate::metric_names). Registered on the layer's first request (not when
//! it is built, so a recorder installed after building the layer sees them) and kept.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `ratelimit_layer_adaptive_admitted_total` | counter, by `criticality` | requests passed to the inner service; counted per core, added to the counter by the layer's tick (every 100 ms) |
//! | `ratelimit_layer_adaptive_rejected_total` | counter, by `criticality` | requests rejected at the limit, or at their level's part of it |
//! | `ratelimit_layer_adaptive_limit` | gauge | the limit in force: set on the first request, then when a window closes |
//! | `ratelimit_layer_adaptive_baseline_seconds` | gauge | the measured no-load latency; 0 until the first measurement ends |
//! | `ratelimit_layer_adaptive_latency_seconds` | gauge | the last window's latency percentile; 0 before the first window closes, and again once no request has completed for [`QUIET_PERIOD`](AdaptiveLimitLayer::QUIET_PERIOD) (10 s) |
//! | `ratelimit_layer_adaptive_held_total` | counter | requests released for being in flight longer than [`release_after`](AdaptiveLimitBuilder::release_after) (see [requests that take long](#requests-that-take-long)) |
//! | `ratelimit_layer_adaptive_held_running` | gauge | those released requests still running, set at each release (once per bound); they count toward [`max_limit`](AdaptiveLimitBuilder::max_limit) |
//!
//! The limit and the baseline stay true while no request comes (nothing changes them); the
//! latency gauge describes a window of requests, so with no request to measure it falls to
//! 0 rather than repeat the last window's figure: read it with the admitted counter's rate.
//!
//! # Logs
//!
//! Through [`tracing`](https://docs.rs/tracing/0.1/tracing/), with the layer's name as the
//! field `name`: the first rejection of an episode at `WARN` ("adaptive limit engaged",
//! with the limit and the requests in flight), its end at `INFO` ("adaptive limit
//! released") once no request has been rejected for
//! [`QUIET_PERIOD`](AdaptiveLimitLayer::QUIET_PERIOD) (10 s; the layer's tick checks every
//! 100 ms), every rejection at `TRACE`, each window's figures at `TRACE`, and each release
//! of requests held too long at `DEBUG`.
//!
//! # What a request costs
//!
//! Admission is a look-up of the level in the request's extensions, a clock read, a read
//! (and at most 16 times a window a write) of the level's last-seen time and a read of
//! those of the levels above, a read of the released count, a compare-and-swap on the in-flight count,
//! one on the current generation's count of admissions, a read of the window's peak (an
//! atomic maximum when it grows), a clock read and an addition to the calling core's stripe
//! of the admitted count; completion is a compare-and-swap on its generation's count, an
//! atomic subtraction, a clock read and two atomic additions into the window's histogram.
//! The in-flight count is one shared word, as in any concurrency limit (tower's and
//! tower-acc's semaphores included). Once per window one thread (never a waiting one: the
//! lock is only tried) reads the histogram and moves the limit; once per bound the tick
//! releases the requests held too long, a generation at a time, without visiting them.
//! Nothing on the admitted path allocates.

mod builder;
mod controller;
pub mod future;
mod held;
mod layer;
mod levels;
#[cfg(all(test, loom))]
mod loom_tests;
mod measurement;
mod sampler;
mod service;
mod state;

pub use builder::AdaptiveLimitBuilder;
pub use layer::AdaptiveLimitLayer;
pub use service::AdaptiveLimit;
pub use state::Status;
