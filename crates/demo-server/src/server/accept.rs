//! The accept loop: [`Server`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use overload_core::clock::TokioClock;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::config::ServerConfig;
use super::connection::Connection;
use super::registry::{ConnectionStats, Registry};

/// The demo server: an accept loop serving a [`Router`] under a [`ServerConfig`].
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    router: Router,
    config: ServerConfig,
    registry: Arc<Registry>,
}

impl Server {
    /// A server for `router` on `listener` (see [`listen`](super::listen) for a listener
    /// with a chosen listen queue).
    pub fn new(listener: TcpListener, router: Router, config: ServerConfig) -> Self {
        Self {
            listener,
            router,
            config,
            registry: Arc::new(Registry::default()),
        }
    }

    /// The address the server listens on.
    ///
    /// # Errors
    ///
    /// When the operating system cannot tell (it always can for a bound TCP socket).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The connection counts, shared with the running server.
    pub fn stats(&self) -> ConnectionStats {
        self.registry.stats().clone()
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets requests in progress
    /// finish (closing idle connections at once) and returns once every connection is
    /// closed. Requests detached by [`Abandoned::Serve`](super::Abandoned::Serve) whose
    /// connection is already gone are not waited for.
    ///
    /// # Errors
    ///
    /// None today: accept errors (a full descriptor table, a connection reset before it was
    /// accepted) are logged and retried, as a server must. The `Result` leaves room for
    /// fatal errors.
    pub async fn run<F>(self, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send,
    {
        let Self {
            listener,
            router,
            config,
            registry,
        } = self;
        let (draining, drain_rx) = watch::channel(false);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // NOTE: the header timeout is enforced per connection below, for HTTP/1 and HTTP/2
        // alike; hyper's own applies to HTTP/1 only and needs a timer, which is not set.
        builder.http1().keep_alive(true);
        let builder = Arc::new(builder);
        let clock = TokioClock::new();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_per_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors or memory: wait a little for connections to close
                    // rather than spin.
                    tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // NOTE: at the cap, the new connection waits here, accepted but not read, until
            // an idle one is closed or a busy one ends; meanwhile nothing else is accepted,
            // so later ones wait in the listen queue.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = registry.make_room(config.max_connections().get()) => {}
            }
            let track = registry.register(clock);
            let connection = Connection {
                stream,
                remote,
                router: router.clone(),
                config,
                builder: Arc::clone(&builder),
                track,
                registry: Arc::clone(&registry),
                draining: drain_rx.clone(),
            };
            tokio::spawn(connection.serve());
        }
        drop(listener);
        draining.send_replace(true);
        registry.closed_all().await;
        Ok(())
    }
}

fn is_per_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}
