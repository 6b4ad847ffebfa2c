//! The demo server's connection handling: the accept loop around [`app()`](crate::app()).
//!
//! `axum::serve` is a fine default, but the demo server needs four things it does not do:
//!
//! - **the article's semantics for abandoned requests** ([`Abandoned`]): a request whose
//!   bytes reached the server is worked on to the end even when its client has gone, as in
//!   the article's Go server and most thread-pool servers;
//! - **a header read timeout**: a connection that has no request in progress must deliver a
//!   request's headers within [`ServerConfig::header_read_timeout`], or it is closed;
//! - **a cap on open connections** that keeps `/healthz` answering under a flood of idle or
//!   slow connections ([`ServerConfig::max_connections`]);
//! - counters of the connections closed by each rule ([`ConnectionStats`]).
//!
//! It keeps what `axum::serve` gives: HTTP/1 and HTTP/2 on one port (hyper-util's `auto`
//! connection builder), the client's address in every request's extensions, both as a
//! plain `SocketAddr` (what the layers read: the overload layer's caller key and `--key
//! ip`; what `overload_signal::axum_0_8::into_make_service_with_peer_addr` provides) and as
//! [`ConnectInfo<SocketAddr>`](axum::extract::ConnectInfo) (what
//! `into_make_service_with_connect_info` provides, for handlers that extract it), and
//! graceful shutdown (stop accepting, let requests in progress finish, close idle
//! connections).
//!
//! # Why requests of closed connections did not reach the model
//!
//! hyper's HTTP/1 connection calls the service as soon as it has parsed a request's headers,
//! and reads on while the response is prepared, to notice a client that goes away. When the
//! read finds the end of the stream, hyper ends the connection (unless half-close is allowed)
//! and drops the response future, and hyper-util's Tower adapter only calls the Tower service
//! from inside that future. A client that timed out while the server was stopped has closed
//! its connection, so on resume the server reads its request and its FIN together: the
//! request was parsed, and then dropped before any of the application ran. With
//! [`Abandoned::Serve`] the request is handed to its own task in the very call hyper makes, so
//! it runs to the end whatever happens to the connection; with [`Abandoned::Cancel`] (hyper's
//! own behaviour) it does not.
//!
//! # Example
//!
//! ```no_run
//! use demo_server::app::{AppConfig, app};
//! use demo_server::model::{LatencyModel, Model};
//! use demo_server::server::{Server, ServerConfig, listen};
//!
//! # #[tokio::main]
//! # async fn main() -> std::io::Result<()> {
//! let listener = listen("127.0.0.1:8070".parse().unwrap(), 4096)?;
//! let router = app(AppConfig::new(Model::new(LatencyModel::default())));
//! let server = Server::new(listener, router, ServerConfig::new());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

mod accept;
mod config;
mod connection;
pub mod metric_names;
mod registry;
mod socket;

#[cfg(test)]
mod tests;

pub use accept::Server;
pub use config::{Abandoned, ServerConfig, ServerConfigBuilder};
pub use registry::ConnectionStats;
pub use socket::{connections_within, listen, raise_open_files_limit};
