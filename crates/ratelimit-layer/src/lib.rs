//! Cheap server-side rejection above a rate, as a Tower layer.
//!
//! A server's first defence against overload (the paper's section on rate limiting): above a
//! known rate, reject at once and cheaply, so that the requests that are admitted keep their
//! latency. [`RateLimitLayer`] decides each request before the inner service sees it and
//! answers a rejected one itself, with the workspace's wire protocol
//! ([`overload_signal::protocol`]):
//!
//! | | HTTP | gRPC (`content-type: application/grpc...`) |
//! |---|---|---|
//! | rejected | `429 Too Many Requests`, `Retry-After` (whole seconds, rounded up, at least 1), `RateLimit-Policy`, `RateLimit` | HTTP `200`, `grpc-status: 8` (RESOURCE_EXHAUSTED), `grpc-retry-pushback-ms`, and the same `RateLimit` fields |
//! | its cost exceeds the limit's capacity (burst or quota): never admissible, not to be retried | `413 Content Too Large`, `RateLimit-Policy`; no `Retry-After`, no `RateLimit` | HTTP `200`, `grpc-status: 3` (INVALID_ARGUMENT), `grpc-message`, the same `RateLimit-Policy`; no pushback |
//! | admitted | the inner response; with [`admitted_headers`](RateLimitBuilder::admitted_headers), plus `RateLimit-Policy` and `RateLimit` | same |
//!
//! `RateLimit-Policy` advertises the limit as the IETF draft defines it: `q` units per `w`
//! whole seconds, where `w` is the time the limiter takes to refill its whole capacity at
//! its rate (the burst for a token bucket, the quota for a window), rounded up to whole
//! seconds, at least one, and `q` what its rate admits over `w`, rounded down; `RateLimit`'s
//! `r` (what the limiter holds now) is then never above `q`, and its `t` never above `w`. A
//! `10 per 100 ms` bucket with a burst of 10 is `q=100;w=1`; `60 per minute` with a burst
//! of 60 is `q=60;w=60`. See [`Limiter`] for each algorithm's figures.
//!
//! The layer is `Clone + Send + Sync` (clones share the limits), generic over request and
//! response bodies (rejections use `ResBody::default()`), and fits `axum::Router::layer`,
//! `tower::ServiceBuilder` and tonic's `Server::builder().layer(..)`. It never calls the
//! inner service for a rejected request, and asks nothing of it but to be a `Service`: a
//! `tower::util::BoxService`, which is not `Clone`, is limited as well as an axum route. Only
//! a limit kept in Redis, whose decision comes after a round trip, needs a `Clone` inner
//! service, as tower's own `Buffer` and `AsyncFilter` do: its layer is a
//! `RateLimitLayer<Remote>` (see [`Local`] and `Remote`).
//!
//! [`overload_signal::protocol`]: https://docs.rs/overload-signal/0.1/overload_signal/protocol/index.html
//!
//! # Algorithms
//!
//! Three, behind one trait ([`Limiter`]), each deciding `allow / reject(retry_after)` for a
//! request of a given cost (weight), with the remaining quota and reset time for the
//! headers (module [`algorithm`]):
//!
//! - [`TokenBucket`]: rate `R`, burst `B`, as GCRA on a single `AtomicU64`, lock-free. At
//!   most `R*L + B` units in any interval of length `L`.
//! - [`FixedWindow`]: a count per window; up to **twice** the quota across a window edge.
//! - [`SlidingWindow`]: the paper's estimate `r = c_n + (1 - (t mod w)/w) * c_{n-1}`.
//!
//! Time comes from a [`Clock`] (this crate re-exports `overload-core`'s [`clock`] module as
//! its own `clock`): [`TokioClock`] by default, which follows tokio's paused time in tests;
//! `FakeClock`, which moves only when told to, with the `test-util` feature. Set it with
//! [`RateLimitBuilder::clock`].
//!
//! [`Clock`]: crate::clock::Clock
//! [`clock`]: crate::clock
//! [`TokioClock`]: crate::clock::TokioClock
//!
//! # Without a rate: the adaptive limit
//!
//! [`AdaptiveLimitLayer`] needs no figure at all: it measures the latency of the requests
//! it admits, estimates how many the service can take at once, and rejects the rest with
//! `503` and `Retry-After` (gRPC: `UNAVAILABLE` with a pushback). See [`adaptive`] for the
//! algorithm, its sources and its defaults.
//!
//! # Limits changed while serving
//!
//! Every limit has a handle that changes it at run time, for every clone of the layer and
//! every service it made, without losing any key's state and without admitting a burst:
//!
//! | limit | what changes | how |
//! |---|---|---|
//! | token bucket | rate, burst | [`LiveTokenBucket::new`](algorithm::LiveTokenBucket::new) gives the limiter and a [`TokenBucketHandle`](algorithm::TokenBucketHandle) (`set_rate`, `set_burst`, `set`) |
//! | fixed or sliding window | quota | [`LiveWindow`](algorithm::LiveWindow) and its [`WindowHandle::set_quota`](algorithm::WindowHandle::set_quota) |
//! | adaptive limit | its bounds | [`AdaptiveLimitLayer::set_bounds`]`(min, max)` |
//! | the overload layer's stop rule | its threshold, or any of its settings | [`OverloadSignalLayer::set_rule`](overload_signal::OverloadSignalLayer::set_rule); `layer.set_rule(layer.rule().to_builder().retry_share(0.1).build()?)` changes the threshold alone |
//!
//! A token bucket keeps each key's units in use across a change, up to the new burst: a
//! lowered rate admits no burst, a raised one refuses nothing the new rate admits
//! ([`carry_over`](algorithm::carry_over) has the rule), and `RateLimit-Policy` states the
//! new limit from the next answer on. Give the live bucket and its layer one clock: a change
//! takes effect at that clock's `now`.
//!
//! ```
//! use ratelimit_layer::algorithm::LiveTokenBucket;
//! use ratelimit_layer::clock::TokioClock;
//! use ratelimit_layer::{RateLimitLayer, TokenBucket};
//!
//! let clock = TokioClock::new();
//! let (bucket, handle) =
//!     LiveTokenBucket::new(TokenBucket::builder(100).burst(20).build()?, clock);
//! let layer = RateLimitLayer::builder(bucket).clock(clock).build()?;
//! // Later, while serving (an admin endpoint, a configuration watcher):
//! handle.set_rate(50)?;
//! # let _ = layer;
//! # Ok::<(), ratelimit_layer::ConfigError>(())
//! ```
//!
//! Limits per route and per tenant can come from a TOML file instead, reloaded when it
//! changes ([`limits_file`]). A limit kept in Redis ([`redis`]) cannot be changed while
//! serving yet: it takes a plain [`TokenBucket`] or [`SlidingWindow`].
//!
//! # Keys
//!
//! One global limit by default; or one per client IP ([`key::ClientIp`], forwarding
//! headers ignored unless proxies are named), per header value ([`key::HeaderKey`]), or per
//! whatever a closure or a [`key::KeyExtractor`] extracts. A request without a key follows
//! an explicit [`key::MissingKey`] policy, chosen at build time (`500`, one shared limit, or
//! no limit; by default `500` for client IPs, whose absence means the server does not
//! provide them, and one shared limit for header keys); such requests are counted, and
//! logged at the first and then at most once a minute while they keep coming (at `ERROR`,
//! with the fix, when a client IP is missing). A client IP is read from the `SocketAddr`
//! extension the server puts in each request ([`key::ClientIp`]; see
//! [Feature flags](#feature-flags) for axum and tonic). A keyed rejection tells an overload
//! layer outside that it concerns one caller (see [`protect`]). Keys live in a
//! [`keyed::KeyedLimiter`]: sharded, read-locked on the hot path, idle keys evicted
//! losslessly, and a hard cap beyond which each network's new keys share an overflow limit
//! of that network's own (one network minting keys cannot push other networks' new clients
//! out), so memory is bounded ([`keyed::KeyedLimiter::memory_bound`]). A known key is checked without
//! allocating, whichever built-in extractor found it.
//!
//! # With the overload signal
//!
//! `overload-signal`'s overload layer goes outside the limiter, so that it sees the
//! rejections and can turn them into "stop retrying" when the fleet is drowning in retries.
//! [`OverloadProtectionLayer`] holds both in that order, so it is right in axum (whose
//! `Router::layer` makes the last call the outermost) and in tonic (whose `Server::layer`
//! makes the first call the outermost) alike; it wraps any limiting layer that answers
//! rejections with `429`/`503` or gRPC `8`/`14`. See [`protect`].
//!
//! # Configuration
//!
//! Every type follows one convention: `new` takes what has no default (a rate, a limiter),
//! `builder` returns named setters starting from the defaults, and `build` returns
//! [`ConfigError`] (`overload-core`'s, re-exported), whose message names the setting, the
//! value and the rule.
//!
//! Every layer has a name ([`RateLimitBuilder::name`], [`AdaptiveLimitBuilder::name`]),
//! `default` unless set: the `name` label of its metrics and the `name` field of its logs,
//! and for a rate limit the policy name of its `RateLimit-Policy` and `RateLimit` fields on
//! the wire. Name your layers when a process has more than one of a kind.
//!
//! # Examples
//!
//! With defaults: one global token bucket, 100 per second (bursts of 100), in a
//! `tower::ServiceBuilder`:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use ratelimit_layer::{RateLimitLayer, TokenBucket};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::new(TokenBucket::new(100)?);
//! let service = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("hello")))
//!     }));
//! let response = service.oneshot(Request::new(String::new())).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! Customised, in axum: per client IP (the peer address, which `axum_0_8` puts where the
//! layers read it; feature `axum-0_8`), a sliding window, heavier uploads, and the
//! `RateLimit` fields on every response:
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use ratelimit_layer::axum_0_8::into_make_service_with_peer_addr;
//! use ratelimit_layer::{RateLimitLayer, SlidingWindow};
//! use ratelimit_layer::key::ClientIp;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let window = SlidingWindow::builder(600).window(Duration::from_secs(60)).build()?;
//! let layer = RateLimitLayer::builder(window)
//!     // The peer address, from the `SocketAddr` extension.
//!     .key_by_client_ip(ClientIp::new())
//!     .cost_by(|parts| if parts.method == http::Method::POST { 10 } else { 1 })
//!     .name("api")
//!     .admitted_headers(true)
//!     .build()?;
//! let app = Router::new().route("/api", get(|| async { "hello" })).layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8070").await?;
//! // Puts the peer address in every request, outside every layer.
//! axum::serve(listener, into_make_service_with_peer_addr(app)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! In tonic, where rejections become `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`,
//! behind the overload layer (one [`OverloadProtectionLayer`], so the order cannot be
//! wrong), which tells callers apart by the same address (tonic's, which `tonic_0_14` puts
//! where the layers read it; feature `tonic-0_14`):
//!
//! ```no_run
//! use overload_signal::OverloadSignalLayer;
//! use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
//! use ratelimit_layer::key::ClientIp;
//! use ratelimit_layer::tonic_0_14::server_builder;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limit = RateLimitLayer::builder(TokenBucket::builder(1_000).burst(100).build()?)
//!     .key_by_client_ip(ClientIp::new())
//!     .build()?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! // `Server::builder()` with the peer address copied outermost.
//! server_builder()
//!     .layer(OverloadProtectionLayer::new(limit))
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! From command-line flags, through [`config::RateLimitConfig`] (its `Algorithm` and
//! `KeyBy` parse from `token-bucket|fixed-window|sliding-window` and `global|ip`):
//!
//! ```
//! use ratelimit_layer::config::{KeyBy, RateLimitConfig};
//!
//! let layer = RateLimitConfig {
//!     rate: 1_000,
//!     burst: Some(100),
//!     algorithm: "token-bucket".parse()?,
//!     key: "ip".parse::<KeyBy>()?,
//!     ..RateLimitConfig::default()
//! }
//! .layer()?;
//! # let _ = layer;
//! # Ok::<(), ratelimit_layer::ConfigError>(())
//! ```
//!
//! # Metrics
//!
//! Through the [`metrics`] facade; this crate never installs a recorder. The names are in
//! [`metric_names`]. Every metric carries the label `name`, the layer's name, so two rate
//! limits in one process are two series. They are registered with the recorder on the
//! layer's **first request** (not when the layer is built, so a recorder installed after
//! building the layer, before traffic, sees every one of them) and the handles are kept, so
//! a request costs no registry lookup.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_layer_requests_admitted_total` | counter | `name`, `criticality` (`sheddable`, `sheddable-plus`, `critical`, `critical-plus`: the request's level, critical when it carries none) | requests passed to the inner service; counted per core and added to the counter once a second (by the layer's tick, and when the layer is dropped), so that the cores do not share one cache line per request |
//! | `ratelimit_layer_requests_rejected_total` | counter | `name`, `key_class` (`global`, `keyed`, `overflow`, `unkeyed`), `criticality` | requests answered with a rejection |
//! | `ratelimit_layer_keys` | gauge | `name` | keys tracked by a keyed layer; idle keys are swept and the gauge set every second, so it falls when clients go away, traffic or not |
//! | `ratelimit_layer_missing_key_total` | counter | `name`, `action` (`reject`, `shared`, `bypass`) | requests a keyed layer found no key in |
//!
//! The [adaptive limit](adaptive#metrics) and the [Redis-backed limit](redis#metrics)
//! (feature `redis`) have their own, listed there and in [`metric_names`].
//!
//! [`metrics`]: https://docs.rs/metrics/0.24/metrics/
//!
//! # Logs
//!
//! Through [`tracing`], with the layer's name as the field `name`. A limit that starts
//! rejecting is an episode, logged once when it begins (`WARN`, "rate limit engaged", at the
//! first rejection) and once when it ends (`INFO`, "rate limit released", once nothing has
//! been rejected for [`RateLimitLayer::QUIET_PERIOD`], 10 seconds), never once per request
//! above `DEBUG`. Requests a keyed layer finds no key in are logged at
//! the first, then at most once a minute while they keep coming (with their count): at
//! `ERROR`, with the fix, when the key is the client IP (the server does not put the peer
//! address in its requests, which no client can cause), at `WARN` otherwise.
//!
//! [`tracing`]: https://docs.rs/tracing/0.1/tracing/
//!
//! # Traces
//!
//! Each decision that refuses a request is a `DEBUG` event of the request's span (the
//! current span while the layer runs: a server's trace layer, tower-http's `TraceLayer`
//! for one, opens it), with the layer's `name` and a field `decision`:
//!
//! | `decision` | layer | other fields |
//! |---|---|---|
//! | `rate_limited` (`429`, gRPC `RESOURCE_EXHAUSTED`) | [`RateLimitLayer`] | `key_class` (`keyed`, `global`, ...), `criticality`, `retry_after_ms` |
//! | `missing_key` | [`RateLimitLayer`] under `MissingKey::Reject` | `criticality` |
//! | `exceeds_capacity` (`413`) | [`RateLimitLayer`] | `key_class`, `criticality`, `capacity` |
//! | `at_capacity` (`503`, gRPC `UNAVAILABLE`) | [`AdaptiveLimitLayer`] | `criticality` (a lower level is shed first), `retry_after_ms` |
//!
//! The overload layer outside records its own (`rejection_passed`, `stop_signal`: see
//! `overload-signal`'s crate docs). An admitted request records nothing. **Privacy**: an
//! event names the key's class, never the key: no client address or API key is recorded.
//!
//! # What a request costs
//!
//! An admitted request allocates nothing in this layer, with the global limit or any
//! built-in key (client IP, header value), once its key is known; the test
//! `tests/no_alloc.rs` counts. The metric handles are registered once and kept. A rejection
//! builds its response: the `RateLimit-Policy` value is formatted once, at build time, and
//! cloned; `Retry-After` and `RateLimit`, which change, are written per rejection.
//! [`admitted_headers`](RateLimitBuilder::admitted_headers) writes `RateLimit` on every
//! admitted response too, at the cost of that allocation.
//!
//! # Rejections you can shape
//!
//! Every answer a limit of this crate makes itself carries an
//! `overload_signal::signal::Rejection` in its extensions: why (`RateLimited`,
//! `AtCapacity`, `MissingKey`, `ExceedsCapacity`), whom it concerns, the wait it asks for
//! and the layer's name.
//! The overload layer outside judges only such marked rejections (a `429` or `503` your
//! handler makes, or an upstream's, passes untouched), and a response mapper outside both
//! can give rejections a body of your own (a JSON problem, CORS headers) without guessing
//! the reason from the status; see [`protect`] for an example. gRPC and gRPC-Web requests
//! (`content-type: application/grpc-web...`) get gRPC statuses.
//!
//! # Feature flags
//!
//! None is on by default. The layers read the connection's peer address (the client-IP key
//! [`key::ClientIp::new`], the overload layer's caller key) from a plain `SocketAddr` request
//! extension, whatever the framework; each framework feature names the major version it
//! covers, so an application on another version compiles none of it.
//!
//! - `axum-0_8`: module `axum_0_8` (`overload-signal`'s, re-exported; turns on its feature
//!   of the same name, which compiles `axum` without default features):
//!   `into_make_service_with_peer_addr(app)`, what `axum::serve` takes, with the peer address
//!   copied from axum's `ConnectInfo` into the `SocketAddr` extension; and `IntoResponse` for
//!   `overload_signal::Overloaded`.
//! - `tonic-0_14`: module `tonic_0_14` (likewise; compiles tonic's server transport):
//!   `server_builder()`, `Server::builder()` with the peer address copied from tonic's
//!   `TcpConnectInfo` (or `TlsConnectInfo` over TLS) as its outermost layer.
//!
//! A server on another framework or version inserts the peer's `SocketAddr` in each
//! request's extensions itself. A server whose requests carry no peer address is told so at
//! its first request, at `ERROR`, with the fix in the message (see [`key::ClientIp`]).
//! - `test-util` (off by default): enables `overload-core`'s `test-util` feature, so that
//!   `clock::FakeClock`, a clock that moves only when told to, exists for tests (and, with
//!   `redis`, `redis::testing`).
//! - `redis` (off by default): one limit for a fleet, kept in Redis (one node or a Redis
//!   Cluster, over TCP or TLS with rustls), with an opt-in local reservation; see
//!   [`redis`].

pub mod adaptive;
pub mod algorithm;
pub mod config;
pub mod key;
pub mod keyed;
pub mod limits_file;
pub mod metric_names;
pub mod protect;
mod rate_limit;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "redis", loom))]
mod remote_health;
#[cfg(any(feature = "redis", loom))]
mod reservation;
mod telemetry;

#[cfg(all(feature = "axum-0_8", not(loom)))]
pub use overload_signal::axum_0_8;
#[cfg(all(feature = "tonic-0_14", not(loom)))]
pub use overload_signal::tonic_0_14;

// NOTE: not inlined: the module is `overload-core`'s, documented there.
#[doc(no_inline)]
pub use overload_core::clock;

pub use adaptive::{AdaptiveLimit, AdaptiveLimitBuilder, AdaptiveLimitLayer};
pub use algorithm::{Decision, FixedWindow, Limiter, SlidingWindow, TokenBucket};
pub use overload_core::{ConfigError, ConfigErrorKind};
pub use protect::{DeadlineSlot, OverloadProtectionLayer, OverloadProtectionLayerBuilder};
#[cfg(feature = "redis")]
pub use rate_limit::Remote;
pub use rate_limit::future;
pub use rate_limit::{Local, RateLimit, RateLimitBuilder, RateLimitLayer};

// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
