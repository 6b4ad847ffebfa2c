//! The demo backend: the article's and the paper's latency models behind the full overload
//! stack.
//!
//! - [`model`]: latency models as Tower services, runnable in process and under paused tokio
//!   time: the article's server ([`model::ArticleModel`]), the paper's M/M/10 server
//!   ([`model::MmcModel`]), and a [`model::PauseSwitch`] that freezes a model like `SIGSTOP`.
//! - [`app()`]: the axum router of the `demo-server` binary (`GET /api`, `/healthz`,
//!   `/metrics`), with the overload layers in front of the model ([`app::Stack`]: the
//!   overload signal, the deadline layer, a rate or adaptive limit) and an optional
//!   [`downstream`] tier.
//! - [`peers`]: other projects' overload protection (tower's `ConcurrencyLimit` +
//!   `LoadShed`, tower-resilience's adaptive limiter, little-loadshedder) as a
//!   [`app::Stack::Peer`], for benchmarks.
//! - [`server`]: the binary's connection handling around the router: what happens to the
//!   work of a client that went away ([`server::Abandoned`]), a header read timeout, a cap on
//!   open connections, graceful shutdown.
//! - [`duration`] and [`size`]: command-line durations (`500ms`) and sizes (`1MiB`).
//!
//! The binary's flags and a load-testing walk-through are in the crate's README.
//!
//! # Example
//!
//! The article's server behind the full stack, tested with `oneshot`:
//!
//! ```
//! use demo_server::app::{AppConfig, Stack, app};
//! use demo_server::model::{LatencyModel, Model};
//! use overload_signal::OverloadSignalLayer;
//! use ratelimit_layer::config::RateLimitConfig;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let stack = Stack::Full {
//!     overload: OverloadSignalLayer::new(),
//!     rate_limit: RateLimitConfig { rate: 250, burst: Some(5), ..Default::default() }
//!         .layer()?
//!         .into(),
//! };
//! let model = Model::new(LatencyModel::default());
//! let router = app(AppConfig::new(model.clone()).stack(stack));
//!
//! let request = http::Request::get("/api").body(axum::body::Body::empty())?;
//! let response = router.oneshot(request).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(model.last_delay(), std::time::Duration::from_millis(100));
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! This crate has no optional features.

pub mod app;
pub mod downstream;
pub mod duration;
pub mod model;
pub mod peers;
pub mod server;
pub mod size;

pub use app::app;
