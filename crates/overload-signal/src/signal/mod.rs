//! The server layer: attempt histogram, the stop-retrying decision, and propagation.
//!
//! [`OverloadSignalLayer`] goes on a server, **outside** the rate limiter (and any load
//! shedder), so that it sees every request, including the ones they reject:
//!
//! ```text
//! network ──► OverloadSignalLayer ──► RateLimitLayer ──► handler
//! ```
//!
//! # Examples
//!
//! With the defaults (a 10-second window in 10 buckets; the stop signal when more than 5 % of
//! at least 200 requests in the window are retries):
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
//! above 10 % of at least 500 requests:
//!
//! ```
//! use std::time::Duration;
//! use overload_signal::clock::CoarseClock;
//! use overload_signal::{AttemptHistogram, OverloadSignalLayer, StopRule};
//!
//! let histogram = AttemptHistogram::builder()
//!     .window(Duration::from_secs(30))
//!     .buckets(30)
//!     .clock(CoarseClock::new())
//!     .build()?;
//! let layer = OverloadSignalLayer::builder()
//!     .histogram(histogram.clone()) // keep a clone to read `histogram.snapshot()`
//!     .rule(StopRule::builder().retry_share(0.10).min_requests(500).build()?)
//!     .build();
//! # drop(layer);
//! # Ok::<(), overload_signal::ConfigError>(())
//! ```
//!
//! # What it does to each request
//!
//! 1. **Records** the request's attempt counter ([`Attempt`](crate::protocol::Attempt):
//!    `X-Request-Attempt`, or `grpc-previous-rpc-attempts` on gRPC) in its
//!    [`AttemptHistogram`](crate::AttemptHistogram), before the inner stack runs.
//! 2. Runs the inner stack inside a [propagation scope](crate::propagation), so a client
//!    layer used by the handler can report that a downstream call received the stop signal.
//! 3. Looks at the response. A success, or any answer that is not a failure a client would
//!    retry (HTTP 5xx or 429; gRPC `grpc-status` 2, 4, 8, 13, 14 or 15), passes after a
//!    status check: that is the admitted path. A failure is examined in this order:
//!    - it **already carries the stop signal** (the handler returned
//!      [`Overloaded`](crate::Overloaded) through its own mapping, or the `axum` feature's
//!      `IntoResponse`): passed on unchanged, counted as propagated;
//!    - a downstream call **received the stop signal** (the marker is raised):
//!      **answered with the stop signal**, counted as propagated. (A success or a deliberate
//!      4xx is never rewritten, marker or not: the handler recovered, with a fallback or a
//!      cached answer, or chose its answer, and neither is retried anyway);
//!    - it is a **rejection** (HTTP 429 or 503; gRPC `grpc-status` 8 or 14): the
//!      [`StopRule`] looks at the histogram's window. Retry share above the threshold with
//!      enough requests: **answered with the stop signal**; otherwise passed through;
//!    - anything else, and every `Err` of the inner service, passes through untouched.
//!
//! Answering with the stop signal rewrites the response in place with
//! [`set_stop_signal`](crate::protocol::set_stop_signal): HTTP `503` with `X-Overloaded`, and
//! the retry invitations (`Retry-After`, `RateLimit`) removed; for gRPC, `grpc-status: 14`,
//! `grpc-retry-pushback-ms: -1`, and an empty body (trailers-only).
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
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The bottom tier: overloaded, every request is rejected by its (here, stand-in) limiter.
//! let bottom = ServiceBuilder::new()
//!     .layer(OverloadSignalLayer::new())
//!     .service(service_fn(|_req: Request<()>| async {
//!         let mut r = Response::new(());
//!         *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
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
//! // A storm: 300 requests reach the bottom tier, two thirds of them retries.
//! let mut storm = bottom.clone();
//! for n in 0..300u32 {
//!     let mut req = Request::new(());
//!     Attempt::set(req.headers_mut(), n % 3);
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
//! Emitted through the [`metrics`](https://docs.rs/metrics) facade; see the
//! [crate docs](crate#metrics) for the names. The layer registers its metric handles once,
//! on first use (its first request, or the first response it decides), and keeps them: no
//! registry lookup per request. Install the recorder before the server takes traffic; a
//! recorder installed after the first request does not receive this layer's metrics. (Not
//! when the layer is built: applications often build their router before they install the
//! recorder, and a handle registered then would stay a no-op.)

pub mod future;
mod layer;
mod rule;
mod service;
mod shared;

#[cfg(test)]
mod tests;

pub use layer::{OverloadSignalLayer, OverloadSignalLayerBuilder};
pub use rule::{StopRule, StopRuleBuilder};
pub use service::OverloadSignal;
