//! How the server handles connections: [`ServerConfig`] and what it says about abandoned
//! requests ([`Abandoned`]).

use std::num::NonZeroUsize;
use std::time::Duration;

use overload_core::ConfigError;

/// What the server does with a request whose client went away.
///
/// - [`Abandoned::Serve`] (the default): every request whose headers reached the server is
///   worked on to the end, even when its client has closed its connection (before the server
///   read the request, while the request waited in the kernel's listen queue, or while it was
///   in the model). Its response goes nowhere. This is the article's server (Go's `net/http`,
///   whose handler runs to its end whatever the connection does) and any thread-pool server
///   whose database query outlives its caller. Abandoned work keeps counting toward the
///   model's concurrency and slows everyone else down: it is what lets fixed-interval retries
///   keep a server down after a pause.
/// - [`Abandoned::Cancel`]: hyper's behaviour. When hyper sees a connection end (an HTTP/1
///   read that finds the end of the stream while a request is in progress, an HTTP/2 stream
///   reset), it drops the request's future, and the model's work for it stops at once; a
///   request read together with its client's FIN never starts. A server that cancels
///   abandoned work is much harder to collapse: timed-out attempts leave instead of piling up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Abandoned {
    /// Work on every received request to the end. The default.
    #[default]
    Serve,
    /// Stop working on a request when its connection ends (hyper's behaviour).
    Cancel,
}

/// How [`Server`](super::Server) handles connections. Build with [`ServerConfig::new`] (the
/// defaults) or [`ServerConfig::builder`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    abandoned: Abandoned,
    max_connections: NonZeroUsize,
    header_read_timeout: Duration,
}

impl ServerConfig {
    /// The default header read timeout: 10 seconds (the project's design; hyper's own
    /// default is 30 s, Go's `net/http` has none).
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

    /// The default cap on open connections: 10 000. Far above what the demo needs (1000
    /// clients and a 4096-connection listen queue), and under the descriptor limits of
    /// current systems; the binary lowers it when the process may not open that many files.
    pub const DEFAULT_MAX_CONNECTIONS: NonZeroUsize = NonZeroUsize::new(10_000).unwrap();

    /// The defaults: [`Abandoned::Serve`], [`DEFAULT_MAX_CONNECTIONS`](Self::DEFAULT_MAX_CONNECTIONS)
    /// and [`DEFAULT_HEADER_READ_TIMEOUT`](Self::DEFAULT_HEADER_READ_TIMEOUT).
    pub const fn new() -> Self {
        Self {
            abandoned: Abandoned::Serve,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
        }
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> ServerConfigBuilder {
        ServerConfigBuilder {
            config: Self::new(),
        }
    }

    /// What happens to requests whose client went away.
    pub const fn abandoned(&self) -> Abandoned {
        self.abandoned
    }

    /// The most connections open at once.
    ///
    /// When a new connection arrives and this many are open, the server closes the one that
    /// has waited longest without a request in progress (idle keep-alive connections and
    /// clients that have not finished sending their headers), so a flood of slow or silent
    /// connections cannot lock out `/healthz` or anyone else. When every open connection has
    /// a request in progress, new connections wait in the listen queue until one ends.
    pub const fn max_connections(&self) -> NonZeroUsize {
        self.max_connections
    }

    /// How long a connection without a request in progress may take to deliver a complete
    /// request head, counted from its accept or from the end of its previous response.
    ///
    /// It covers HTTP/1 and HTTP/2 alike (and a client that never says which it speaks). As
    /// with hyper's own header timeout, it also bounds how long a keep-alive connection may
    /// stay idle between requests.
    pub const fn header_read_timeout(&self) -> Duration {
        self.header_read_timeout
    }
}

impl Default for ServerConfig {
    /// The same as [`ServerConfig::new`].
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a [`ServerConfig`]; every setter starts from the defaults.
#[derive(Clone, Copy, Debug)]
pub struct ServerConfigBuilder {
    config: ServerConfig,
}

impl ServerConfigBuilder {
    /// What happens to requests whose client went away. Default: [`Abandoned::Serve`].
    pub const fn abandoned(mut self, abandoned: Abandoned) -> Self {
        self.config.abandoned = abandoned;
        self
    }

    /// The cap on open connections; see [`ServerConfig::max_connections`]. Default: 10 000.
    pub const fn max_connections(mut self, max: NonZeroUsize) -> Self {
        self.config.max_connections = max;
        self
    }

    /// The header read timeout; see [`ServerConfig::header_read_timeout`]. Default: 10 s.
    pub const fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.config.header_read_timeout = timeout;
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `header_read_timeout` when it is zero (every connection
    /// would be closed before its first request).
    pub fn build(self) -> Result<ServerConfig, ConfigError> {
        if self.config.header_read_timeout.is_zero() {
            return Err(ConfigError::out_of_range(
                "header_read_timeout",
                self.config.header_read_timeout,
                "greater than zero",
            ));
        }
        Ok(self.config)
    }
}
