//! Criticality: how much each request matters, from the caller to the last tier, so that an
//! overloaded fleet sheds what matters least first.
//!
//! Every request carries one of four [levels](Criticality) (the SRE book's: `critical-plus`,
//! `critical`, `sheddable-plus`, `sheddable`), in the header `X-Request-Criticality` (gRPC
//! metadata of the same name). This module holds the server's side of it and the task-local
//! that carries it to a handler's downstream calls:
//!
//! - [`CriticalityLayer`]: a server layer that reads the level a request claims, caps it
//!   for callers the server does not [trust](crate::Trust), puts it in the request's
//!   extensions (where every limit of `ratelimit-layer` reads it, with
//!   [`Criticality::of`]: only a level other than `critical` is inserted, since most
//!   requests carry none) and runs the inner service in it. A request without a level, or with a malformed one, gets the server's default,
//!   `critical` unless configured; junk is never an error answer.
//! - [`current`], [`scope`], [`outgoing`]: the level of the request a task serves.
//!   `backoff-layer`'s retry layer sends [`outgoing`]'s answer on every attempt, so a
//!   handler's downstream calls carry its request's level without code. A call may carry a
//!   lower level (a [`Criticality`] in its request's extensions), never a higher one.
//!
//! # What the server guarantees
//!
//! Every limit of this workspace sheds from the bottom: while a lower level is still
//! admitted, no higher level is rejected. Each limit holds back a share of its capacity
//! from each level for the levels above it ([`Reserves`]: half from `sheddable`, a quarter
//! from `sheddable-plus`, a tenth from `critical` by default), but only while a level above
//! is active ([`RecentLevels`]), so a server whose traffic is all of one level is limited as
//! before. Each limit's docs state its form of the rule.
//!
//! # Who may claim what
//!
//! A level is the caller's word. A client on the Internet that claims `critical-plus` to
//! jump the queue must not get it: the layer caps the level of a caller it does not trust
//! at [`untrusted_max`](CriticalityLayerBuilder::untrusted_max) (`critical` by default, so
//! only trusted callers reach `critical-plus`), the default level included. A caller may
//! always claim less. Trust is the workspace's one [`Trust`](crate::Trust) setting (callers on private
//! networks by default); a server that decides levels itself (from an API key's tier, say)
//! inserts a [`Criticality`] in the request's extensions before this layer, which takes it
//! as it is.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use overload_signal::criticality::{self, CriticalityLayer};
//! use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};
//! use overload_signal::Trust;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), overload_signal::ConfigError> {
//! let layer = CriticalityLayer::builder()
//!     // Requests without a level are batch work on this server.
//!     .default_level(Criticality::SheddablePlus)
//!     .trust(Trust::everyone())
//!     .build()?;
//! let mut service = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|request: Request<()>| async move {
//!         // The handler runs in its request's level; so do its downstream calls.
//!         assert_eq!(Some(Criticality::of(request.extensions())), criticality::current());
//!         Ok::<_, Infallible>(Response::new(criticality::current()))
//!     }));
//! let sheddable = Request::builder().header(X_REQUEST_CRITICALITY, "sheddable").body(()).unwrap();
//! let answer = service.ready().await.unwrap().call(sheddable).await.unwrap();
//! assert_eq!(*answer.body(), Some(Criticality::Sheddable));
//! let plain = Request::new(());
//! let answer = service.ready().await.unwrap().call(plain).await.unwrap();
//! assert_eq!(*answer.body(), Some(Criticality::SheddablePlus));
//! # Ok(())
//! # }
//! ```

mod current;
mod layer;
mod service;
#[cfg(test)]
mod tests;

pub use crate::reserves::{RecentLevels, Reserves, ReservesBuilder};
pub use current::{CriticalityScope, current, outgoing, scope};
pub use layer::{CriticalityLayer, CriticalityLayerBuilder};
pub use service::CriticalityService;

pub use crate::protocol::Criticality;
