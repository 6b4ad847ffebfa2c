//! The overload wire protocol, and server-side overload signalling for Tower.
//!
//! A retry storm starts when every client of an overloaded system retries, and every tier
//! of a multi-tier system retries too. This crate holds what clients and servers must agree
//! on to stop one:
//!
//! - [`protocol`]: header names, the `X-Request-Attempt` counter ([`protocol::Attempt`]),
//!   the "system overloaded, stop retrying" signal, `Retry-After` and
//!   `grpc-retry-pushback-ms`, and the IETF `RateLimit` fields. Every crate of this
//!   workspace uses it instead of repeating header names.
//! - [`Overloaded`]: the typed outcome a client surfaces when a server sent the stop signal.
//! - [`propagation`]: a request-scoped marker that carries a downstream stop signal up
//!   through a server without handler code.
//! - [`criticality`]: [`CriticalityLayer`], a server layer that sets each request's level of
//!   criticality (`X-Request-Criticality`, capped for callers it does not trust) and runs the
//!   handler in it; and the current level, which `backoff-layer`'s retry layer carries to
//!   downstream calls, so that a fleet sheds what matters least first, at every tier.
//! - [`deadline`]: [`DeadlineLayer`], a server layer that answers a request whose caller's
//!   deadline has passed at once, without running the handler, and cancels work still
//!   running at its deadline; and the current deadline of the request a task serves, which
//!   `backoff-layer`'s retry layer passes on to downstream calls ([`RequestDeadline`]).
//!
//! And the server side of the paper's second defence:
//!
//! - [`AttemptHistogram`]: a lock-free sliding-window histogram of the attempt counters a
//!   server receives, and the share of them that are retries, built on `overload-core`'s
//!   window: the one time-slotted atomic window of the workspace, which the retry budget of
//!   `backoff-layer` uses too.
//! - [`OverloadSignalLayer`]: a Tower layer, outside the rate limiter, that records every
//!   request, answers a rejection with "stop retrying" when the retry share says the whole
//!   fleet is drowning in retries ([`StopRule`]), and passes a downstream stop signal up to
//!   its own caller. See [`signal`] for the decision rule, the defaults and their reasons,
//!   the two propagation paths, and a three-tier example.
//! - [`signal_deadline`]: the overload layer around the deadline layer as one layer, which
//!   does what the two stacked do for less per request.
//!
//! # Example
//!
//! ```
//! use http::{Request, Response};
//! use overload_signal::protocol::{self, Attempt, Protocol};
//!
//! // Server side: read the attempt counter, answer with the stop signal.
//! let request = Request::builder()
//!     .header(protocol::X_REQUEST_ATTEMPT, "1")
//!     .body(())
//!     .unwrap();
//! assert!(Attempt::from_request(&request).is_retry());
//! let response: Response<()> = protocol::stop_signal_response(Protocol::of_request(&request));
//!
//! // Client side: recognise it, and do not retry.
//! assert!(protocol::is_stop_signal(response.headers()));
//! ```
//!
//! A server:
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use overload_signal::{AttemptHistogram, OverloadSignalLayer, StopRule};
//! use tower::{ServiceBuilder, service_fn};
//!
//! // Defaults: a 10-second window; stop signal above a 5 % retry share over 200 requests.
//! let layer = OverloadSignalLayer::new();
//!
//! // Customised: a 30-second window in 30 buckets; above 10 % over 500 requests; named
//! // `api` in its metrics and logs.
//! let histogram = AttemptHistogram::builder()
//!     .window(Duration::from_secs(30))
//!     .buckets(30)
//!     .build()?;
//! let layer = OverloadSignalLayer::builder()
//!     .histogram(histogram.clone())
//!     .rule(StopRule::builder().retry_share(0.10).min_requests(500).build()?)
//!     .name("api")
//!     .build()?;
//!
//! let service = ServiceBuilder::new()
//!     .layer(layer)
//!     // .layer(rate_limit) goes here, inside.
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, Infallible>(Response::new(()))
//!     }));
//! # drop(service);
//! // `histogram.snapshot()` reads the window at any time.
//! # Ok::<(), overload_core::ConfigError>(())
//! ```
//!
//! # Configuration
//!
//! Every configurable type has `new()` for its defaults and `builder()` with named
//! setters; a `build()` that can fail returns [`ConfigError`], which names the setting,
//! the value and the rule (`backoff-layer` and `ratelimit-layer` return the same type,
//! `overload-core`'s). Time is read through [`clock::Clock`] (`overload-core`'s module,
//! re-exported): tokio's clock by default, so tests run under paused time;
//! [`clock::CoarseClock`] where the clock read is most of the cost.
//!
//! # Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) facade; this crate never installs a
//! recorder. All names start with `overload_signal_`, and every metric carries the label
//! `name`: the layer's [name](OverloadSignalLayerBuilder::name) (`"default"` unless set;
//! name your layers when a process has more than one). An [`OverloadSignalLayer`] (and a
//! [`DeadlineLayer`]) registers its metrics on its **first request**, not when it is built, so a recorder installed
//! after the layer is built (and before traffic) sees every one. See [`metric_names`] for
//! what each one means.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `overload_signal_stop_signals_total` | counter | `name`, `scope` (`server`, `caller`), `criticality` (the request's level) |
//! | `overload_signal_rejections_passed_total` | counter | `name`, `scope` (`server`, `caller`), `criticality` (the request's level) |
//! | `overload_signal_propagated_total` | counter | `name`, `via` (`marker`, `response`) |
//! | `overload_signal_deadline_expired_total` | counter | `name`, `when` (`arrival`, `running`) |
//! | `overload_signal_deadline_expired_queued_seconds` | histogram | `name` |
//! | `overload_signal_deadline_malformed_total` | counter | `name` |
//! | `overload_signal_deadline_skewed_total` | counter | `name` |
//! | `overload_signal_deadline_requests_total` | counter | `name` |
//! | `overload_signal_deadline_callers_total` | counter | `name`, `reason` (`expired`, `skewed`) |
//! | `overload_signal_unkeyed_requests_total` | counter | `name` |
//! | `overload_signal_criticality_malformed_total` | counter | `name` |
//! | `overload_signal_criticality_capped_total` | counter | `name` |
//! | `overload_signal_window_requests` | gauge | `name`, `attempt` (`0`, `1`, `2`, `3+`, `unknown`, `malformed`) |
//! | `overload_signal_window_retry_share` | gauge | `name` |
//! | `overload_signal_window_retry_pressure` | gauge | `name` |
//! | `overload_signal_window_per_caller_pressure` | gauge | `name` |
//!
//! The window gauges are kept true while no request comes: they fall to 0 within a window
//! (and two buckets) of the last request. The layer also logs, once each, when it starts and
//! stops answering with the stop signal (see [`signal`](signal#logs)).
//!
//! # Traces
//!
//! Each decision the layers make on a request they do not simply pass is a `DEBUG` event of
//! the request's span (the current span while the layer runs: a server's trace layer,
//! tower-http's `TraceLayer` for one, opens it), with the layer's `name` and a field
//! `decision`:
//!
//! | `decision` | layer | other fields |
//! |---|---|---|
//! | `stop_signal`: a limiter's rejection answered with the stop signal | [`OverloadSignalLayer`] | `status`, `scope` (`server`, `caller`), `criticality` |
//! | `rejection_passed`: a limiter's rejection passed on as it is (retry pressure under the rule) | [`OverloadSignalLayer`] | `status`, `scope`, `criticality` |
//! | `stop_signal_propagated`: a downstream call received the stop signal | [`OverloadSignalLayer`] | `status` |
//! | `stop_signal`, `deadline_exceeded`, `throttled`, `gave_up`: the answer to an inner error after a downstream call failed | [`OverloadSignalLayer`] | `marks`, `status` |
//! | `deadline_expired`: the request's deadline had passed on arrival; not served | [`DeadlineLayer`] | `queued_ms` |
//! | `deadline_cancelled`: the deadline passed while the work ran; dropped | [`DeadlineLayer`] | |
//!
//! A request the layers let through unchanged records nothing. **Privacy**: no event
//! carries a client's address or key.
//!
//! # Feature flags
//!
//! None is on by default: the crate is plain Tower over `http`, and its layers read the
//! connection's peer address from a plain `SocketAddr` request extension
//! ([`signal::peer_addr`]), whatever the framework. Each framework feature names the major
//! version it covers, so an application on another version compiles none of it.
//!
//! - `axum-0_8`: module `axum_0_8`: the peer address adapter for axum 0.8
//!   (`into_make_service_with_peer_addr`, which is what `axum::serve` takes, and
//!   `AxumPeerAddrLayer`, which copies axum's `ConnectInfo<SocketAddr>` into the `SocketAddr`
//!   extension); and `axum::response::IntoResponse` for [`Overloaded`], so an axum handler
//!   can return `Result<_, Overloaded>` and answer with the stop signal.
//! - `tonic-0_14`: module `tonic_0_14`: the peer address adapter for tonic 0.14
//!   (`server_builder`, which is `Server::builder()` with the adapter outermost, and
//!   `TonicPeerAddrLayer`, which copies tonic's `TcpConnectInfo`, or `TlsConnectInfo` over TLS,
//!   into the `SocketAddr` extension).
//!
//! A server on another framework, or another version, inserts the peer's `SocketAddr` in
//! each request's extensions itself (see [`signal::peer_addr`]). A server whose requests carry
//! no peer address is told so at its first request, at `ERROR`, with the fix (see
//! [`signal`](signal#the-peer-address)). `ratelimit-layer` has the same two features, which
//! turn these on, and re-exports the two modules.
//! - `test-util` (off by default): `clock::FakeClock`, a clock that moves only when told
//!   to, for tests of code that takes a [`clock::Clock`]; and
//!   `OverloadSignalLayerBuilder::caller_seed`, which hashes caller keys with a fixed key so
//!   that a test puts the same callers in the same classes on every run.
//!
//! Model tests of the lock-free code run under [loom](https://docs.rs/loom) with
//! `RUSTFLAGS="--cfg loom"`; that `cfg` is not a feature and changes nothing in a normal
//! build.

#[cfg(all(feature = "axum-0_8", not(loom)))]
pub mod axum_0_8;
pub mod criticality;
pub mod deadline;
mod error;
pub mod histogram;
pub mod metric_names;
pub mod propagation;
pub mod protocol;
// NOTE: public as `criticality::{Reserves, RecentLevels}`; a leaf of its own so that the
// overload layer (`signal`) uses `RecentLevels` without importing `criticality`.
mod reserves;
pub mod signal;
pub mod signal_deadline;
#[cfg(test)]
mod test_logs;
#[cfg(all(feature = "tonic-0_14", not(loom)))]
pub mod tonic_0_14;

pub use criticality::{CriticalityLayer, CriticalityLayerBuilder};
pub use deadline::{Deadline, DeadlineLayer, DeadlineLayerBuilder, RequestDeadline};
pub use error::{Overloaded, is_overloaded};
pub use histogram::{AttemptClass, AttemptHistogram, AttemptHistogramBuilder, AttemptSnapshot};
pub use overload_core::telemetry::LayerName;
pub use overload_core::{ConfigError, ConfigErrorKind};
pub use signal::Trust;
pub use signal::trust;
pub use signal::{
    OverloadSignal, OverloadSignalLayer, OverloadSignalLayerBuilder, StopRule, StopRuleBuilder,
};

// NOTE: not inlined: the module is `overload-core`'s, documented there.
#[doc(no_inline)]
pub use overload_core::clock;

// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
