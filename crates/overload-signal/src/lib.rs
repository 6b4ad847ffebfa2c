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
//! # Feature flags
//!
//! This crate has no optional features.

mod error;
pub mod propagation;
pub mod protocol;

pub use error::{Overloaded, is_overloaded};
