//! tonic 0.14 (feature `tonic-0_14`): the peer address where the layers read it.
//!
//! The layers of this workspace read the connection's peer address from a plain
//! [`SocketAddr`] request extension ([`peer_addr`](crate::signal::peer_addr)), whatever the
//! framework. tonic 0.14's server keeps it in its own `TcpConnectInfo` (plain TCP) or
//! `TlsConnectInfo<TcpConnectInfo>` (over TLS, with tonic's TLS features); this module
//! copies it across:
//!
//! - [`server_builder`]: `Server::builder()` with the copy as its first, outermost layer,
//!   so that no `.layer` call after it can put a layer that needs the peer outside it. The
//!   way to build a server.
//! - [`TonicPeerAddrLayer`]: the copy as a Tower layer, for a server built some other way. It
//!   must be outside every layer that reads the peer address (in tonic, added *before*
//!   them: the first call is the outermost).
//!
//! The address is the one tonic's own `Request::remote_addr` gives: over plain TCP and over
//! tonic's TLS; none over a Unix socket or an incoming stream of your own (insert a
//! `SocketAddr` yourself there).
//!
//! ```no_run
//! use overload_signal::OverloadSignalLayer;
//! use overload_signal::tonic_0_14::server_builder;
//!
//! # async fn serve(greeter: tonic_health::pb::health_server::HealthServer<
//! #     impl tonic_health::pb::health_server::Health>) -> Result<(), tonic::transport::Error> {
//! // In place of `Server::builder()`.
//! server_builder()
//!     .layer(OverloadSignalLayer::new())
//!     .add_service(greeter)
//!     .serve("0.0.0.0:50051".parse().unwrap())
//!     .await
//! # }
//! ```

use std::net::SocketAddr;
use std::task::{Context, Poll};

use http::{Extensions, Request};
use tonic::metadata::MetadataMap;
use tonic::transport::Server;
use tonic::transport::server::TcpConnectInfo;
use tower_layer::{Identity, Layer, Stack};
use tower_service::Service;

/// `tonic::transport::Server::builder()` with [`TonicPeerAddrLayer`] as its first layer: the
/// outermost, outside every layer added after it, so every layer finds the peer address.
/// Every setting of the builder is there as usual (`Server<L>`'s methods).
///
/// ```
/// use std::time::Duration;
/// use overload_signal::tonic_0_14::server_builder;
///
/// let server = server_builder().timeout(Duration::from_secs(30));
/// # drop(server);
/// ```
pub fn server_builder() -> Server<Stack<TonicPeerAddrLayer, Identity>> {
    Server::builder().layer(TonicPeerAddrLayer::new())
}

/// Copies the peer address of tonic 0.14's connect info (`TcpConnectInfo`, or
/// `TlsConnectInfo<TcpConnectInfo>` over TLS) into a [`SocketAddr`] request extension,
/// where the layers of this workspace read it; a request without it, or with a
/// `SocketAddr` already, goes through unchanged. Makes [`TonicPeerAddr`].
///
/// Outside every layer that reads the peer address: in tonic, `.layer(..)` it before them
/// (the first call is the outermost). [`server_builder`] does it.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use overload_signal::signal::peer_addr;
/// use overload_signal::tonic_0_14::TonicPeerAddrLayer;
/// use tonic::transport::server::TcpConnectInfo;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let service = ServiceBuilder::new()
///     .layer(TonicPeerAddrLayer::new())
///     .service(service_fn(|request: Request<()>| async move {
///         Ok::<_, std::convert::Infallible>(peer_addr(request.extensions()))
///     }));
/// let peer: SocketAddr = "192.0.2.7:50000".parse().unwrap();
/// let mut request = Request::new(());
/// request.extensions_mut().insert(TcpConnectInfo {
///     local_addr: None,
///     remote_addr: Some(peer),
/// });
/// assert_eq!(service.oneshot(request).await.unwrap(), Some(peer));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TonicPeerAddrLayer {
    _private: (),
}

impl TonicPeerAddrLayer {
    /// The layer (it has no settings).
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl<S> Layer<S> for TonicPeerAddrLayer {
    type Service = TonicPeerAddr<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TonicPeerAddr::new(inner)
    }
}

/// Middleware that copies the peer address of tonic 0.14's connect info into a
/// [`SocketAddr`] request extension; made by [`TonicPeerAddrLayer`].
#[derive(Clone, Copy, Debug)]
pub struct TonicPeerAddr<S> {
    inner: S,
}

impl<S> TonicPeerAddr<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        Self { inner }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S, B> Service<Request<B>> for TonicPeerAddr<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let extensions = request.extensions_mut();
        // NOTE: a `SocketAddr` already there was put by the server's own connection code,
        // outside: it knows the peer at least as well.
        if extensions.get::<SocketAddr>().is_none() {
            if let Some(peer) = remote_addr(extensions) {
                extensions.insert(peer);
            }
        }
        self.inner.call(request)
    }
}

/// The peer address in tonic's connect info, as tonic's `Request::remote_addr` finds it.
fn remote_addr(extensions: &mut Extensions) -> Option<SocketAddr> {
    if let Some(info) = extensions.get::<TcpConnectInfo>() {
        return info.remote_addr();
    }
    // NOTE: over TLS the address is in `TlsConnectInfo<TcpConnectInfo>`, which tonic names
    // only with one of its TLS features, which the application turns on, not this crate
    // (it would compile rustls into every tonic server). So tonic, which knows whether it
    // has them, looks: the extensions move into a message-less `tonic::Request` and back
    // (moves of one pointer; an empty `MetadataMap` does not allocate).
    let request = tonic::Request::from_parts(MetadataMap::new(), std::mem::take(extensions), ());
    let peer = request.remote_addr();
    *extensions = request.into_parts().1;
    peer
}

#[cfg(test)]
mod tests {
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    use super::*;
    use crate::signal::peer_addr;

    /// The peer address the service inside the layer finds, and whether tonic's connect info
    /// is still there for handlers that read it.
    async fn seen(extensions: Extensions) -> (Option<SocketAddr>, bool) {
        let service = ServiceBuilder::new()
            .layer(TonicPeerAddrLayer::new())
            .service(service_fn(|request: Request<()>| async move {
                Ok::<_, std::convert::Infallible>((
                    peer_addr(request.extensions()),
                    request.extensions().get::<TcpConnectInfo>().is_some(),
                ))
            }));
        let mut request = Request::new(());
        *request.extensions_mut() = extensions;
        service.oneshot(request).await.unwrap()
    }

    /// Regression (issue 23, finding 1, kept through issue 31's plain contract): tonic's
    /// server puts the peer in `TcpConnectInfo` only.
    #[tokio::test]
    async fn the_layer_copies_tcp_connect_info_into_the_plain_contract() {
        let peer: SocketAddr = "203.0.113.9:41000".parse().unwrap();
        let mut extensions = Extensions::new();
        extensions.insert(TcpConnectInfo {
            local_addr: Some("127.0.0.1:50051".parse().unwrap()),
            remote_addr: Some(peer),
        });
        // Without the adapter the layers see no peer: they read the plain contract only.
        assert_eq!(peer_addr(&extensions), None);
        assert_eq!(seen(extensions).await, (Some(peer), true));
    }

    #[tokio::test]
    async fn other_extensions_stay_and_a_request_without_connect_info_passes() {
        #[derive(Clone, Debug, PartialEq)]
        struct Mine(u8);
        let mut extensions = Extensions::new();
        extensions.insert(Mine(7));
        let service = ServiceBuilder::new()
            .layer(TonicPeerAddrLayer::new())
            .service(service_fn(|request: Request<()>| async move {
                Ok::<_, std::convert::Infallible>((
                    peer_addr(request.extensions()),
                    request.extensions().get::<Mine>().cloned(),
                ))
            }));
        let mut request = Request::new(());
        *request.extensions_mut() = extensions;
        assert_eq!(
            service.oneshot(request).await.unwrap(),
            (None, Some(Mine(7)))
        );
    }

    #[tokio::test]
    async fn a_socket_addr_already_there_wins() {
        let outer: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let mut extensions = Extensions::new();
        extensions.insert(outer);
        extensions.insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("192.0.2.2:2".parse().unwrap()),
        });
        assert_eq!(seen(extensions).await.0, Some(outer));
    }
}
