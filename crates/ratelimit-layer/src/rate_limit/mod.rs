//! The rate limit as a Tower layer: [`RateLimitLayer`] and its builder, the [`RateLimit`]
//! middleware, and how a request is decided and answered.
//!
//! - `layer.rs`: [`RateLimitLayer`] and [`RateLimitBuilder`], the configuration;
//! - `service.rs`: [`RateLimit`], and where it decides: [`Local`], or `Remote` (Redis);
//! - `future.rs`: its response futures, public as [`crate::future`];
//! - `state.rs`: what every clone shares: the decision, the cost of a request, the
//!   `RateLimit-Policy` value, the metrics and the episode of the limit engaged;
//! - `decide.rs`: the local decision, global or keyed, and the missing-key policy;
//! - `response.rs`: the answer to a decided request (admitted, or the `429`);
//! - `remote_decision.rs`: the hook for a decision made elsewhere, which `crate::redis`
//!   implements (feature `redis`).

pub(crate) mod decide;
pub mod future;
mod layer;
#[cfg(feature = "redis")]
pub(crate) mod remote_decision;
mod response;
pub(crate) mod service;
pub(crate) mod state;

pub use layer::{RateLimitBuilder, RateLimitLayer};
#[cfg(feature = "redis")]
pub use service::Remote;
pub use service::{Local, RateLimit};
