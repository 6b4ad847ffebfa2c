//! The server layer: attempt histogram, the stop-retrying decision, and propagation.
//!
//! [`OverloadSignalLayer`] goes on a server, **outside** the rate limiter (and any load
//! shedder), so that it sees every request, including the ones they reject:
//!
//! ```text
//! network ──► OverloadSignalLayer ──► RateLimitLayer ──► handler
//! ```
//!
//! Under it, it never fires: the limiter answers before it sees the request. Mind the order
//! of your server's `.layer` calls (axum's `Router::layer` wraps what is already there, so
//! the last call is the outermost; tonic's `Server::layer` and tower's `ServiceBuilder` the
//! other way round), or use `ratelimit-layer`'s `OverloadProtectionLayer`, which puts the two
//! in the right order whichever way the server nests.
//!
//! # Examples
//!
//! With the defaults (a 10-second window in 10 buckets; the stop signal when more than 5 % of
//! at least 200 requests in the window are retries, or were told to stop retrying; callers
//! keyed by their peer address):
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use overload_signal::OverloadSignalLayer;
//! use tower::{ServiceBuilder, service_fn};
//!
//! let service = ServiceBuilder::new()
//!     .layer(OverloadSignalLayer::new())
//!     // .layer(rate_limit) goes here, inside.
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, Infallible>(Response::new(()))
//!     }));
//! # drop(service);
//! ```
//!
//! Customised: a 30-second window in 30 buckets, read with the coarse clock; the stop signal
//! above 10 % of at least 500 requests; callers keyed by an identity an authentication layer
//! put in the request, and only the counters of callers that presented a client certificate
//! trusted; named `public-api` in its metrics and logs:
//!
//! ```
//! use std::time::Duration;
//! use http::request::Parts;
//! use overload_core::clock::CoarseClock;
//! use overload_signal::{AttemptHistogram, OverloadSignalLayer, StopRule, Trust};
//!
//! #[derive(Clone)]
//! struct Tenant(u64);
//! /// Put in the request by the TLS acceptor when the caller presented a certificate.
//! #[derive(Clone)]
//! struct PeerCertificate;
//!
//! let histogram = AttemptHistogram::builder()
//!     .window(Duration::from_secs(30))
//!     .buckets(30)
//!     .clock(CoarseClock::new())
//!     .build()?;
//! let layer = OverloadSignalLayer::builder()
//!     .histogram(histogram.clone()) // keep a clone to read `histogram.snapshot()`
//!     .rule(StopRule::builder().retry_share(0.10).min_requests(500).build()?)
//!     .key_by(|parts: &Parts| parts.extensions.get::<Tenant>().map(|t| t.0))
//!     .trust(Trust::when(|_headers, extensions| {
//!         extensions.get::<PeerCertificate>().is_some()
//!     }))
//!     .name("public-api")
//!     .build()?;
//! # drop(layer);
//! # Ok::<(), overload_core::ConfigError>(())
//! ```
//!
//! # What it does to each request
//!
//! 1. **Records** the request's attempt counter ([`Attempt`](crate::protocol::Attempt):
//!    `X-Request-Attempt`, or `grpc-previous-rpc-attempts` on gRPC; unknown if the
//!    [trust predicate](OverloadSignalLayerBuilder::trust) refuses its caller) in its
//!    [`AttemptHistogram`](crate::AttemptHistogram) and in its caller's class (see
//!    [Trust](#trust-what-callers-can-and-cannot-do)), before the inner stack runs.
//! 2. Runs the inner stack inside a [propagation scope](crate::propagation), so a client
//!    layer used by the handler can report that a downstream call received the stop signal.
//! 3. Looks at the response. A success, or any answer that is not a failure (the
//!    protocol's [`Outcome::is_failure`](crate::protocol::Outcome::is_failure): HTTP 5xx or
//!    429 and their gRPC codes), passes after a status check: that is the admitted path. A
//!    failure is examined in this order:
//!    - it **already carries the stop signal** (the handler returned
//!      [`Overloaded`](crate::Overloaded) through its own mapping, or the `axum` feature's
//!      `IntoResponse`): passed on unchanged, counted as propagated;
//!    - a downstream call **received the stop signal** (the marker is raised):
//!      **answered with the stop signal**, counted as propagated. (A success or a deliberate
//!      4xx is never rewritten, marker or not: the handler recovered, with a fallback or a
//!      cached answer, or chose its answer, and neither is retried anyway);
//!    - it is a **limiter's rejection**: it carries a [`Rejection`] marker of kind
//!      [`RateLimited`](RejectionKind::RateLimited) or
//!      [`AtCapacity`](RejectionKind::AtCapacity) in its extensions, which every limit of
//!      `ratelimit-layer` inserts in the answers it makes. The [`StopRule`] judges the
//!      window: **answered with the stop signal** when it fires, passed through otherwise.
//!      A rejection that concerns the whole server ([`RejectionScope::Server`]) is judged on
//!      the whole server's window, and the rule must fire both on the plain figures and with
//!      each caller class's weight capped; one that concerns a caller over its own quota
//!      ([`RejectionScope::Caller`]) is judged on that caller's class alone;
//!    - anything else passes through untouched, headers and body included: a rejection of
//!      a request for what it is (a marker of kind [`MissingKey`](RejectionKind::MissingKey)
//!      or [`ExceedsCapacity`](RejectionKind::ExceedsCapacity): no retry pressure makes it
//!      the system's overload), and a `429` or `503` (gRPC 8 or 14) that no limiting layer
//!      marked: the handler's own, or an upstream's passed on by a gateway. (Unless the
//!      layer is told to [judge every rejection](OverloadSignalLayerBuilder::judge_every_rejection),
//!      for a limiter that cannot mark its answers: it then judges every capacity signal.)
//! 4. An **error** of the inner service (no response) passes through unchanged, unless a
//!    downstream call of the request was [marked](crate::propagation::Downstream) (in a
//!    server that is a tower proxy: its retry layer gave up, was throttled, or received the
//!    stop signal), or the error is an [`Overloaded`](crate::Overloaded). An error would
//!    reset the caller's connection, the most retryable failure there is; the layer answers
//!    instead: the stop signal (for a downstream's, and for a retry layer that spent its
//!    retry budget: a tier in a retry storm tells the tier above to stop), `504` for a
//!    deadline (gRPC `DEADLINE_EXCEEDED`), `503` with `Retry-After: 1` for a throttled call
//!    (gRPC `UNAVAILABLE` with pushback 1000), `502` when the retry layer gave up otherwise
//!    (gRPC `UNAVAILABLE`), counted in `overload_signal_errors_answered_total`. Across
//!    processes, each tier's retry budget bounds what the retryable ones (`502`, `503`,
//!    `504`) invite.
//!
//! Answering with the stop signal rewrites the response in place with
//! [`set_stop_signal`](crate::protocol::set_stop_signal): HTTP `503` with `X-Overloaded`, and
//! the retry invitations (`Retry-After`, `RateLimit`) removed; for gRPC and gRPC-Web,
//! `grpc-status: 14`, `grpc-retry-pushback-ms: -1`, and an empty body (trailers-only). The
//! response's [`Rejection`] then says [`StopRetrying`](RejectionKind::StopRetrying), so a
//! response mapper outside can shape the answer (see [`Rejection`]).
//!
//! # Levels
//!
//! Every request has a [level of criticality](crate::criticality): the one the layer
//! resolves itself when given [`CriticalityLayer`](crate::CriticalityLayer) settings
//! ([`OverloadSignalLayer::with_criticality`]; `ratelimit-layer`'s `OverloadProtectionLayer`
//! always does), else the one an outer `CriticalityLayer` put in the request's extensions,
//! else `critical`. The level changes two things:
//!
//! - **What is counted.** `overload_signal_stop_signals_total` and
//!   `overload_signal_rejections_passed_total` carry a `criticality` label: an operator sees
//!   which levels are told to stop, and which are merely rejected.
//! - **Who is told to stop first** (the SRE book's rule, that a level is treated worse only
//!   once every lower one is). A rejection judged on the **whole server's** window is
//!   answered with the stop signal only if the rule fires **and** no rejection of a lower
//!   level was passed through plainly within the last window (the histogram's, 10 seconds by
//!   default). So while `sheddable` rejections still go out as plain `429`s, a `critical`
//!   rejection is not turned into "stop retrying" either: it passes as a plain rejection (and
//!   is counted as passed). When a storm starts, the lowest level rejected is told to stop at
//!   once, each level above it at most one window after the last plain rejection of the
//!   levels below: the stop signal climbs the levels from the bottom, one window apart at
//!   most each, and reaches every level in a storm that lasts. Traffic of one level is
//!   judged exactly as before (nothing below it is ever rejected). The price: in the first
//!   windows of a storm, retries of the higher levels are still invited; they are the fewest
//!   (every limit of the workspace rejects a higher level only once the lower ones are shed)
//!   and their callers' retry budgets still bound them.
//! - A rejection judged on **one caller's** own window ([`RejectionScope::Caller`]) is not
//!   held back by other levels: it is about that caller's own retries, and another caller's
//!   plain `sheddable` rejection says nothing about them (were it otherwise, a caller could
//!   shield its own storm with a trickle of sheddable requests).
//!
//! The layer serves the inner service in the level it resolved
//! ([`criticality::current`](crate::criticality::current)), carried in the scope it installs
//! for downstream marks anyway: one swap of one thread-local per poll for both. A level it
//! resolves is never raised above an enclosing [`criticality::scope`](crate::criticality::scope)
//! of a lower level (an in-process call made from a sheddable task stays sheddable), though
//! the request's extensions keep the level its headers gave.
//!
//! # Trust: what callers can and cannot do
//!
//! The attempt counter comes from the caller and is not authenticated. A caller may send
//! any value; the stop signal it could provoke replaces other callers' *rejections* (never
//! an admitted request) with "do not retry". Three defences bound what a lying caller can
//! do, and this section is the threat model: each figure in it is asserted by the test
//! named beside it.
//!
//! - **Whose counters count: [`Trust`].** By default
//!   ([`Trust::private_networks`](crate::Trust::private_networks)), only the counters of
//!   callers on private, loopback and link-local networks are read, and not when they came
//!   through a proxy from elsewhere (see [`trust`]). Everyone else's claims to be a retry
//!   count as requests without a counter: they dilute the retry share, never raise it. So on the
//!   Internet no client's word counts unless you say so, and inside a private network no
//!   configuration is needed. The same setting decides whose deadlines' send times the
//!   [deadline layer](crate::deadline) believes.
//! - **Caller classes, by network.** Each request's [caller key](CallerKey) (by default
//!   [`PeerIp`]: its client's network, an IPv4 `/24` or an IPv6 `/48`, so that a handful of
//!   addresses rented together is one caller) is hashed, with a secret per-process seed,
//!   into one of [`OverloadSignalLayer::CALLER_CLASSES`] (128) classes; requests without a
//!   key form one more class. Each class's requests and retry pressure are counted over the
//!   same window as the histogram.
//! - **Each class's weight is bounded.** For a rejection that concerns the whole server,
//!   the rule must fire twice: on the window's plain retry pressure, and on the
//!   **per-caller pressure**, the mean of the classes' own pressures, each class weighing its
//!   requests but **at most as much as the median class**. A caller that sends more does
//!   not weigh more. Per-caller accounting can only prevent the stop signal, never cause it.
//! - **Caller-scoped rejections.** A keyed limit's rejection ([`RejectionScope::Caller`]) is
//!   judged on the rejected caller's own class: a caller that forges retries is told to stop
//!   when its own limit rejects it, and honest callers over their own limits keep their plain
//!   `429` whatever others send, unless they share the forger's class (its network's other
//!   clients, and with `k` callers about `k / 128` others).
//!
//! What that means, with the default rule (5 %) and `n` classes in use:
//!
//! | who | what they can do | what they cannot | test |
//! |---|---|---|---|
//! | **one client on the Internet** | nothing: its counters are not read (default trust) | make anyone else's rejection the stop signal, fake clock skew or a queue time, page anyone | `proxies_tests::behind_a_trusted_balancer_one_forger_cannot_make_the_server_say_stop`, `deadline::tests::an_internet_caller_cannot_fake_clock_skew_or_queue_time`, the rules' promtool tests |
//! | **one trusted caller** (or any caller, with [`Trust::everyone`](crate::Trust::everyone)) | move the per-caller pressure by about `1/n`, at most `2/(n + 1)`: 0.8 % (1.6 %) with every class in use; get the stop signal itself on a rejection of its own key | fire the rule alone while about 20 or more classes are in use | `callers::tests::one_class_s_pressure_moves_the_result_by_at_most_2_over_n_plus_1`, `one_forging_caller_among_many_cannot_make_the_server_say_stop`, `forged_attempts::one_forging_client_cannot_stop_the_honest_ones` (0 of about 1 000 honest rejections turned) |
//! | **a few clients of one network** (seven addresses of one `/24`, a `/48`'s worth of IPv6) | what one caller can: they are one class | more: 7 forgers of one `/24` among 70 honest networks turned 0 of 1 085 honest rejections into stop signals (at most 2 % asserted; keyed by address, as before, 968 of 1 079) | `forged_attempts::seven_forgers_of_one_network_are_one_caller` |
//! | **several networks colluding** (`m` networks in `m` classes) | move the per-caller pressure by about `m/n`: with every class in use, up to six cannot fire it alone; seven can (the same test's anchor, seven classes) | grow the layer's memory (the classes are fixed), touch an admitted request | the same test |
//! | **many networks colluding** (a botnet over more than about `5 % × n` classes) | make a storm out of nothing, indistinguishable from a real one: the other callers' rejected requests fail without a retry for as long as the server keeps rejecting more than the threshold of its traffic (the rule is [sustained](StopRuleBuilder::sustain)), or for a window once the forgery stops if it rejects less | touch an admitted request | the rule's own tests: what a real storm does |
//!
//! What the same callers can and cannot do to the layers around this one:
//!
//! | who | cannot | test |
//! |---|---|---|
//! | anyone | page the operator about clock skew or expiring deadlines: the alerts fire on more than 1 % of the requests carrying a deadline, from at least 3 callers a minute | `ops/prometheus/tower-overload.rules.test.yml` (one caller at 20 expired and 5 skewed requests a second fires neither) |
//! | one network minting keys (2 000 new IPv6 `/64`s a second from one `/48`) | push another network's new client into its own overflow limit: that client is admitted at its own key's quota, in the local map and in Redis | `ratelimit-layer`'s `layer::a_network_minting_keys_cannot_push_new_clients_of_other_networks_out`, `redis_failures::…_out_of_redis` |
//! | a client that chooses its key bytes | choose its Redis Cluster slot: 60 keys aimed at one slot spread 20, 19, 21 over three masters (keys are named by a keyed hash under a fleet secret) | `ratelimit-layer`'s `redis_deployments::slot_targeted_keys_spread_over_the_masters` |
//! | a client with a long token | escape its key: a header value over 256 bytes is keyed by its digest | `ratelimit-layer`'s `layer::a_long_bearer_token_is_a_key_of_its_own` |
//! | a downstream of a client stack (a third party answering with `X-Overloaded`) | make this server tell its own callers to stop, once its retry layer is built with `StopSignals::HonourOnly` (by default it can: right inside one organisation) | `suite::foreign_stop_signals::a_third_party_stop_signal_reaches_our_http_callers_only_when_passed_up` |
//! | anyone reaching a client's destinations (webhooks, a forward proxy) | grow the throttle's metric series past 35, or see user information in a label or a log | `backoff-layer`'s `telemetry::a_thousand_throttled_destinations_leave_a_bounded_set_of_series_and_no_secret` |
//! | an operator's typo | trust every client as a proxy: sets covering all of IPv4 or IPv6, or a network broader than a `/8`, are refused | `proxies_tests::trusting_the_clients_network_too_is_refused` |
//!
//! And some cases that need the operator:
//!
//! - **Fewer callers, fewer classes.** Under about 20 classes in use (an internal tier with
//!   a handful of upstream pods), one caller that sends only retries can fire the rule alone
//!   (with 16 classes in use it does, with 41 it cannot:
//!   `one_caller_among_few_fires_the_rule_alone_and_among_many_cannot`), and the sustained
//!   rule keeps the signal while the server rejects more than the threshold. There,
//!   [trust](OverloadSignalLayerBuilder::trust) only callers you run.
//! - **One caller can also hold the signal back.** The plain figure weighs requests by
//!   volume, with no cap per caller, and both figures must fire: a caller that sends many
//!   requests without retries (first tries, no counter at all, or retries no one trusts)
//!   dilutes the plain figure. With 1 000 honest first tries and 100 retries in the
//!   window (9 %, a storm), one caller adding 2 000 first tries brings it to 3.2 %, and the
//!   signal does not fire while it keeps that up
//!   (`one_caller_with_most_of_the_traffic_holds_the_signal_back`). A single client with
//!   most of a server's traffic has that weight whether it lies or not; the rate limiter in
//!   front is what bounds it.
//! - **A key the caller chooses** (a header it sets) lets one caller be many classes: key
//!   by something it cannot multiply.
//! - **When every request comes from one key** (behind a load balancer that is the peer,
//!   or a server that does not put the peer address in the request), there is one class,
//!   and the decision is the plain one: any trusted caller can forge a storm. The default key
//!   reads the peer address from a `SocketAddr` extension ([`peer_addr`]; see
//!   [The peer address](#the-peer-address)); a request without a key is counted
//!   (`overload_signal_unkeyed_requests_total`) and logged, at once and then at most once a
//!   minute while such requests keep coming. Behind a
//!   balancer, trust it with
//!   [`trusted_proxies`](OverloadSignalLayerBuilder::trusted_proxies): the layer then keys
//!   each request by the client address the balancer forwards (`X-Forwarded-For` or
//!   `Forwarded`, read only from the balancer's own address, never from anyone else's), and
//!   leaves that address in the request ([`ClientAddr`]) for the limiter inside, so the
//!   limit and this layer see the same callers from one setting (see [`TrustedProxies`]).
//!   [`TrustedProxies`] refuses sets that would trust the clients' own networks.
//! - **A load balancer that hides client addresses** (a TCP balancer on a private address,
//!   without the PROXY protocol) makes every client look like a private caller to the
//!   default trust: pass [`Trust::nobody`](crate::Trust::nobody) there, or resolve the
//!   client address yourself.
//! - Whatever they send, callers cannot grow the layer's memory: the classes are fixed.
//!
//! # The peer address
//!
//! The layers of this workspace read the connection's peer address from one place: a
//! [`SocketAddr`](std::net::SocketAddr) in the request's extensions ([`peer_addr`]), or the
//! client address a layer resolved behind trusted proxies ([`ClientAddr`], read first by
//! [`client_addr`]). Only server code can insert an extension; a client cannot. Frameworks
//! keep the peer in types of their own, one per major version, so the crate's adapters copy
//! it across, each behind a feature that names the version it covers:
//!
//! | server | how |
//! |---|---|
//! | axum 0.8 | `axum::serve(listener, overload_signal::axum_0_8::into_make_service_with_peer_addr(app))` (feature `axum-0_8`) |
//! | tonic 0.14, plain TCP or TLS | `overload_signal::tonic_0_14::server_builder()` in place of `Server::builder()` (feature `tonic-0_14`) |
//! | anything else (hyper, another major of axum or tonic, a Unix socket) | insert the peer's `SocketAddr` in each request's extensions, outside this layer |
//!
//! A server whose requests carry no peer address (and no [`ClientAddr`]) is set up wrong,
//! and no client can cause it: every connection has a peer. The layer says so at the first
//! such request that has no caller key, at `ERROR`, with the fix in the message, and then
//! at most once a minute while they keep coming (with how many came since the last line);
//! `overload_signal_unkeyed_requests_total` counts every one. The requests themselves are
//! served: they share one caller class, so the stop decision is the plain one for them. A
//! key of your own ([`key_by`](OverloadSignalLayerBuilder::key_by)) that finds none in a
//! request that does carry a peer address is logged the same way at `WARN` (a client can
//! cause that, by leaving out what the key reads).
//!
//! # Limits
//!
//! - Only what is in the response head is seen: a gRPC status sent in the trailers of a
//!   streamed body (rather than in a trailers-only response, the form rejections take) is
//!   not examined.
//! - An `Err` from the inner service passes through untouched: at the HTTP edge it closes
//!   the connection without a response, so services under this layer should answer with
//!   responses (axum and tonic do).
//!
//! # Propagation across tiers: two paths
//!
//! A handler that calls the next tier through `backoff-layer`'s retry layer, and gets the stop
//! signal back, must answer its own caller with the stop signal, or the tier above retries.
//!
//! - **The marker (no handler code).** The retry layer raises
//!   [`propagation::mark_stop_received`](crate::propagation::mark_stop_received) when it sees
//!   the stop signal, and returns `Err(Overloaded)`. The handler fails as it would for any
//!   downstream error (a 500, a 502, `?` into its error type); this layer sees the raised
//!   marker and replaces that failure with the stop signal. This works as long as the
//!   downstream call runs inside the request's future: a call made in a task the handler
//!   spawns (`tokio::spawn`) is outside the scope.
//! - **The typed error.** For spawned tasks, or to be explicit, return the
//!   [`Overloaded`](crate::Overloaded) error and map it to
//!   [`stop_signal_response`](crate::protocol::stop_signal_response). With the `axum`
//!   feature, `Overloaded` implements `IntoResponse`, so a handler returning
//!   `Result<_, Overloaded>` needs no mapping at all.
//!
//! # Example: three tiers
//!
//! Each tier is a server with this layer outside its rate limiter, whose handler calls the
//! next tier through a retrying client. When the bottom tier is overloaded and its callers'
//! retries pile up, its rejections become the stop signal; the middle tier's client stops
//! retrying and raises the marker, the middle tier's handler fails, its layer answers with
//! the stop signal; the top tier does the same; the top caller gets the stop signal, and no
//! tier retried after it was sent.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use overload_signal::{OverloadSignalLayer, propagation};
//! use overload_signal::protocol::{self, Attempt};
//! use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The bottom tier: overloaded, every request is rejected by its (here, stand-in) limiter,
//! // which marks its rejections as `ratelimit-layer`'s limits do.
//! let bottom = ServiceBuilder::new()
//!     .layer(OverloadSignalLayer::new())
//!     .service(service_fn(|_req: Request<()>| async {
//!         let mut r = Response::new(());
//!         *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
//!         r.extensions_mut()
//!             .insert(Rejection::new(RejectionKind::RateLimited, RejectionScope::Server));
//!         Ok::<_, Infallible>(r)
//!     }));
//!
//! // A middle (or top) tier: its handler calls the tier below through a client that, like
//! // backoff-layer's retry layer, raises the marker when it sees the stop signal.
//! fn tier<S>(
//!     below: S,
//! ) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible> + Clone
//! where
//!     S: Service<Request<()>, Response = Response<()>, Error = Infallible> + Clone,
//! {
//!     ServiceBuilder::new()
//!         .layer(OverloadSignalLayer::new())
//!         .service(service_fn(move |_req: Request<()>| {
//!             let below = below.clone();
//!             async move {
//!                 let down = below.oneshot(Request::new(())).await?;
//!                 if protocol::is_stop_signal(down.headers()) {
//!                     propagation::mark_stop_received(); // what the retry layer does
//!                     let mut r = Response::new(());
//!                     *r.status_mut() = StatusCode::BAD_GATEWAY; // the handler's own error
//!                     return Ok(r);
//!                 }
//!                 Ok(down)
//!             }
//!         }))
//! }
//! let mut top = tier(tier(bottom.clone()));
//!
//! // A storm: 300 requests reach the bottom tier, two thirds of them retries, from a caller
//! // on the private network (whose counters the default trust counts).
//! let mut storm = bottom.clone();
//! for n in 0..300u32 {
//!     let mut req = Request::new(());
//!     Attempt::set(req.headers_mut(), n % 3);
//!     req.extensions_mut().insert(std::net::SocketAddr::from(([10, 0, 0, 7], 40_000)));
//!     storm.ready().await.unwrap().call(req).await.unwrap();
//! }
//!
//! // The top caller now gets the stop signal through both tiers above.
//! let response = top.ready().await.unwrap().call(Request::new(())).await.unwrap();
//! assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert!(protocol::is_stop_signal(response.headers()));
//! # }
//! ```
//!
//! # Metrics
//!
//! Emitted through the [`metrics`](https://docs.rs/metrics) facade, every one labelled
//! `name` with the layer's [name](OverloadSignalLayerBuilder::name); see the
//! [crate docs](crate#metrics) for the list. The layer registers its metric handles on its
//! **first request** and keeps them: no registry lookup per request. Install the recorder
//! before the server takes traffic; a recorder installed after the first request does not
//! receive this layer's metrics. (Not when the layer is built: applications often build
//! their router before they install the recorder, and a handle registered then would stay a
//! no-op.)
//!
//! The window gauges describe the window that ended with the previous bucket (whole
//! buckets, so the figures are stable). They are set by the first request of each bucket
//! and, from the layer's first request on, by a task that wakes every bucket (1 second by
//! default) for as long as the layer lives: when traffic stops they fall to the empty
//! window's figures (0) once the last request's bucket has left the window, at most one
//! window and two buckets after that request (12 seconds by default). Without a tokio
//! runtime the task cannot start, and the gauges move only with requests.
//!
//! # Logs
//!
//! Through [`tracing`](https://docs.rs/tracing); this crate never installs a subscriber.
//! State changes are logged once each, never per request, with the layer's name in the
//! field `name`:
//!
//! - `WARN` **stop signal engaged**: the first rejection the rule turns into the stop signal
//!   after a quiet spell, with what it judged: `scope` (`server` or `caller`), `retry_share`
//!   (the share the rule compared: the retry pressure when it is sustained), `requests` and
//!   `threshold`;
//! - `INFO` **stop signal disengaged**: no rejection has been turned into the stop signal
//!   for one window of the histogram (10 seconds by default), with how long the episode
//!   `lasted` (from its first stop signal to its last). Checked every bucket by the task
//!   above;
//! - `ERROR` **requests without a peer address** (or `WARN` **requests without a caller
//!   key**, when they do carry one and a key of your own found none): at the first, then at
//!   most once a minute while they keep coming, with how many came since the last line and
//!   the fix (see [The peer address](#the-peer-address) and
//!   [Trust](#trust-what-callers-can-and-cannot-do)): a server set up so that one caller
//!   can forge a storm is a misconfiguration to fix, not a state that passes.
//!
//! Stop signals passed up from a downstream tier (propagation) are counted, not logged
//! above `DEBUG`: the tier that decided logs its own episode.

pub(crate) mod callers;
pub mod future;
mod ip_net;
mod layer;
pub(crate) mod levels;
mod peer;
mod proxies;
mod rejection;
mod rule;
mod service;
mod state;
mod telemetry;
pub mod trust;

#[cfg(test)]
mod tests;

pub use callers::CallerKey;
pub use ip_net::IpNet;
pub use layer::{OverloadSignalLayer, OverloadSignalLayerBuilder};
pub use peer::{ClientAddr, PeerIp, client_addr, peer_addr};
pub use proxies::{ForwardedHeader, TrustedProxies};
pub use rejection::{Rejection, RejectionKind, RejectionScope};
pub use rule::{StopRule, StopRuleBuilder};
pub use service::OverloadSignal;
pub(crate) use state::SignalState;
pub use trust::Trust;
