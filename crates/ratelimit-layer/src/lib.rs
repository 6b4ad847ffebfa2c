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
//! | admitted | the inner response; with [`admitted_headers`](RateLimitBuilder::admitted_headers), plus `RateLimit-Policy` and `RateLimit` | same |
//!
//! The layer is `Clone + Send + Sync` (clones share the limits), generic over request and
//! response bodies (rejections use `ResBody::default()`), and fits `axum::Router::layer`,
//! `tower::ServiceBuilder` and tonic's `Server::builder().layer(..)`. It never calls the
//! inner service for a rejected request.
//!
//! # Algorithms
//!
//! Three, behind one trait ([`Limiter`]), each deciding `allow / reject(retry_after)` for a
//! request of a given cost (weight), with the remaining quota and reset time for the
//! headers:
//!
//! - [`TokenBucket`]: rate `R`, burst `B`, as GCRA on a single `AtomicU64`, lock-free. At
//!   most `R*L + B` units in any interval of length `L`.
//! - [`FixedWindow`]: a count per window; up to **twice** the quota across a window edge.
//! - [`SlidingWindow`]: the paper's estimate `r = c_n + (1 - (t mod w)/w) * c_{n-1}`.
//!
//! Time comes from a [`Clock`]: [`RealClock`] reads [`tokio::time::Instant`] (so paused
//! tokio tests control it), [`FakeClock`] moves only when told to.
//!
//! # Keys
//!
//! One global limit by default; or one per client IP ([`ClientIp`], forwarding headers
//! ignored unless proxies are named), per header value ([`header_value`]), or per whatever a
//! closure extracts. Keys live in a [`KeyedLimiter`]: sharded, read-locked on the hot path,
//! idle keys evicted losslessly, and a hard cap beyond which new keys share one overflow
//! limit, so memory is bounded ([`KeyedLimiter::memory_bound`]).
//!
//! # Examples
//!
//! With defaults: one global token bucket, 100 per second, bursts of 20, in a
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
//! let layer = RateLimitLayer::new(TokenBucket::per_second(100, 20)?)?;
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
//! Customised, in axum: per client IP from axum's `ConnectInfo`, a sliding window, heavier
//! uploads, and the `RateLimit` fields on every response:
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{Router, extract::ConnectInfo, routing::get};
//! use ratelimit_layer::{ClientIp, RateLimitLayer, SlidingWindow};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder(SlidingWindow::new(600, Duration::from_secs(60))?)
//!     // axum puts the peer address in `ConnectInfo`; the layer reads it through this
//!     // function (it does not depend on axum).
//!     .key_by_client_ip(ClientIp::from_extension(|ci: &ConnectInfo<SocketAddr>| Some(ci.0)))
//!     .cost_by(|parts| if parts.method == http::Method::POST { 10 } else { 1 })
//!     .policy_name("api")
//!     .admitted_headers(true)
//!     .build()?;
//! let app = Router::new().route("/api", get(|| async { "hello" })).layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8070").await?;
//! // `ConnectInfo` exists only with `into_make_service_with_connect_info`.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! In tonic, where rejections become `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`:
//!
//! ```no_run
//! use ratelimit_layer::{ClientIp, RateLimitLayer, TokenBucket};
//! use tonic::transport::Server;
//! use tonic::transport::server::TcpConnectInfo;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder(TokenBucket::per_second(1_000, 100)?)
//!     .key_by_client_ip(ClientIp::from_extension(|ci: &TcpConnectInfo| ci.remote_addr()))
//!     .build()?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! Server::builder()
//!     .layer(layer)
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! From command-line flags, through [`RateLimitConfig`] (`Algorithm` and `KeyBy` parse
//! from `token-bucket|fixed-window|sliding-window` and `global|ip`):
//!
//! ```
//! use ratelimit_layer::{RateLimitConfig, KeyBy};
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
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Metrics
//!
//! Through the [`metrics`] facade; this crate never installs a recorder. They are registered
//! with the recorder on the first request (not when the layer is built), so install the
//! recorder before serving traffic.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_layer_requests_admitted_total` | counter | `policy` | requests passed to the inner service |
//! | `ratelimit_layer_requests_rejected_total` | counter | `policy`, `key_class` (`global`, `keyed`, `overflow`, `unkeyed`) | requests answered with a rejection |
//! | `ratelimit_layer_keys` | gauge | `policy` | keys tracked by a keyed layer |
//!
//! Rejections are also logged through [`tracing`] at `TRACE` level.
//!
//! # Feature flags
//!
//! This crate has no optional features.

mod algorithm;
mod clock;
mod config;
mod key;
mod keyed;
mod layer;

pub use algorithm::{
    Decision, FixedWindow, FixedWindowState, InvalidLimit, Limiter, QuotaStatus, SlidingWindow,
    SlidingWindowState, TokenBucket, TokenBucketState,
};
pub use clock::{Clock, FakeClock, RealClock};
pub use config::{Algorithm, DEFAULT_RATE, KeyBy, RateLimitConfig, UnknownName};
pub use key::{
    ClientIp, DEFAULT_IPV6_PREFIX, ForwardedHeader, InvalidIpNet, IpNet, MAX_HEADER_KEY_LEN,
    header_value,
};
pub use keyed::{DEFAULT_MAX_KEYS, DEFAULT_SWEEP_INTERVAL, KeyClass, KeyedLimiter};
pub use layer::{
    DEFAULT_POLICY_NAME, InvalidConfig, METRIC_ADMITTED, METRIC_KEYS, METRIC_REJECTED, RateLimit,
    RateLimitBuilder, RateLimitLayer, ResponseFuture,
};
