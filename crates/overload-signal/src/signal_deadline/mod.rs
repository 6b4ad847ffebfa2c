//! The overload layer with the deadline layer inside it, as one middleware:
//! [`SignalDeadlineLayer`].
//!
//! It does what [`OverloadSignalLayer`](crate::OverloadSignalLayer) around
//! [`DeadlineLayer`](crate::DeadlineLayer) does, to every request and every response, with
//! the histogram, the rule, the metrics and the logs of the two layers it is built from
//! (their names and settings included): the overload layer records the request (and sees
//! the deadline layer's `504` for an expired one), the deadline layer answers an expired
//! request at once, and runs a live one in its deadline's scope. It does it for less: one
//! service where there were two (one clone for each request a server's router clones its
//! service for, one shared allocation for the two layers' state), one pass over the request's
//! header names for both layers' fields (the protocol, the attempt counters, the deadlines),
//! where each layer looked its own up.
//!
//! `ratelimit-layer`'s `OverloadProtectionLayer` uses it when given a deadline layer; use it
//! directly where the two layers would otherwise be stacked by hand, the overload layer
//! outside.
//!
//! # Examples
//!
//! With the defaults of both layers:
//!
//! ```
//! use overload_signal::signal_deadline::SignalDeadlineLayer;
//! use overload_signal::{DeadlineLayer, OverloadSignalLayer};
//! use tower::ServiceBuilder;
//!
//! let signal = OverloadSignalLayer::new();
//! let layer = SignalDeadlineLayer::new(&signal, &DeadlineLayer::new());
//! let service = ServiceBuilder::new().layer(layer).service_fn(|_: http::Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(()))
//! });
//! # drop(service);
//! // `signal.histogram()` reads the window the combined layer records into.
//! # let _ = signal.histogram();
//! ```
//!
//! Customised: a named overload layer with a stricter rule, and a deadline layer that lets
//! admitted work run to its end:
//!
//! ```
//! use overload_signal::signal_deadline::SignalDeadlineLayer;
//! use overload_signal::{DeadlineLayer, OverloadSignalLayer, StopRule};
//!
//! # fn main() -> Result<(), overload_signal::ConfigError> {
//! let signal = OverloadSignalLayer::builder()
//!     .name("public")
//!     .rule(StopRule::builder().retry_share(0.02).build()?)
//!     .build()?;
//! let deadline = DeadlineLayer::builder().cancel_at_deadline(false).build()?;
//! let layer = SignalDeadlineLayer::new(&signal, &deadline);
//! # drop(layer);
//! # Ok(())
//! # }
//! ```

mod layer;
mod service;

pub use layer::SignalDeadlineLayer;
pub use service::SignalDeadline;

#[cfg(test)]
mod tests;
