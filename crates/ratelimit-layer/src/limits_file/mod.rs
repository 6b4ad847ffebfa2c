//! Limits per route and per tenant from a TOML file, validated whole, reloaded when it
//! changes ([`LimitsWatcher`]), and put in force by a [`LimitsLayer`]:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = ratelimit_layer::limits_file::LimitsLayer::from_file("limits.toml", "api")?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/api", axum::routing::get(|| async { "hello" }))
//!     .layer(limits);
//! # drop(app);
//! # Ok(())
//! # }
//! ```
//!
//! # The file
//!
//! ```toml
//! # The header whose value names the tenant (optional; needed by `[tenant.*]`).
//! tenant_header = "x-tenant"
//!
//! # The limit of a request that no tenant and no route below names. Required.
//! [default]
//! rate = 100        # units per period; required, at least 1
//! period = "1s"     # optional, default "1s"; units ns, us, ms, s, m, h
//! burst = 100       # optional, default the rate
//! key = "ip"        # optional: "ip" (each client IP address, the default here and for
//!                   # routes) or "global" (all the entry's requests together)
//!
//! # Routes: `exact` (the whole path) or `prefix` (the path starts with it), one of the two.
//! # An exact route wins over every prefix; among prefixes the longest wins.
//! [[route]]
//! prefix = "/api/"
//! rate = 50
//! burst = 10
//!
//! [[route]]
//! exact = "/health"
//! rate = 1000
//!
//! # Tenants, by the value of `tenant_header`. A tenant's limit wins over the routes'.
//! # A tenant's `key` is "global" unless set: one bucket for all the tenant's requests.
//! [tenant.acme]
//! rate = 1000
//! burst = 200
//! ```
//!
//! Why TOML: it is the format Rust users read every day (`Cargo.toml`), it has comments,
//! and it has no indentation to get wrong. Every error names the file, the line and the
//! column, and what is wrong; a file with any error is refused whole ([`Limits::load`]).
//!
//! ```
//! use ratelimit_layer::limits_file::Limits;
//!
//! let limits = Limits::parse("limits.toml", r#"
//!     tenant_header = "x-tenant"
//!     [default]
//!     rate = 100
//!     [[route]]
//!     prefix = "/api/"
//!     rate = 50
//!     [tenant.acme]
//!     rate = 1000
//! "#)?;
//! assert_eq!(limits.limit_for("/api/items", None).rate(), 50);
//! assert_eq!(limits.limit_for("/api/items", Some("acme")).rate(), 1000);
//! assert_eq!(limits.limit_for("/", Some("other")).rate(), 100);
//!
//! let err = Limits::parse("limits.toml", "[default]\nrate = 0\n").unwrap_err();
//! assert_eq!(err.to_string(), "limits.toml:2:8: [default]: rate must be at least 1, got 0");
//! # Ok::<(), ratelimit_layer::limits_file::LimitsFileError>(())
//! ```
//!
//! # Reloading
//!
//! [`LimitsLayer::from_file`] looks at the file every 250 ms ([`LimitsWatcher::INTERVAL`]),
//! by its SHA-256, so the symbolic link swap of a Kubernetes `ConfigMap` volume is seen too:
//! a change is in force within a second, and each entry kept across it keeps its clients'
//! state. A file with any error is refused whole: at startup `from_file` returns the error
//! (`limits.toml:LINE:COL: what`); later the limits in force stay, the reason is logged at
//! `WARN`, and `ratelimit_layer_limits_reloads_total{result="refused"}` counts it.
//!
//! Write the file whole and rename it over the old one, as editors and `ConfigMap` volumes
//! do: a look that catches a file rewritten in place half-way may refuse it, or put in force
//! a shorter file that happens to parse, until the next look.

mod layer;
mod limits;
mod routes;
mod service;
mod watch;

pub use layer::{LimitsLayer, LimitsLayerBuilder, LimitsLayerError};
pub use limits::{EntryId, EntryLimit, Limits, LimitsFileError};
pub use service::LimitsService;
pub use watch::{LimitsWatcher, RELOADS_TOTAL, ReloadOutcome, Reloader};

#[cfg(test)]
mod tests;
