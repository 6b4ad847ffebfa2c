//! The retry layer: [`RetryLayer`] and [`Retry`].
//!
//! See the [crate docs](crate) for the behaviour, defaults, outcomes and metrics.

mod config;
mod deadline;
mod destinations;
pub mod future;
mod hint;
mod layer;
mod level;
mod service;
mod stop;
mod telemetry;
#[cfg(test)]
mod tests;
mod trace;

pub use layer::{RetryBuilder, RetryLayer};
pub use service::Retry;
pub use stop::StopSignals;
