//! axum 0.8 (feature `axum-0_8`): the peer address where the layers read it, and
//! `IntoResponse` for [`Overloaded`].
//!
//! The layers of this workspace read the connection's peer address from a plain
//! [`SocketAddr`] request extension ([`peer_addr`](crate::signal::peer_addr)), whatever the
//! framework. axum 0.8 keeps it in its own `ConnectInfo<SocketAddr>` (when a router is
//! served with connect info); this module copies it across:
//!
//! - [`into_make_service_with_peer_addr`]: what `axum::serve` takes, for a `Router`, with the
//!   copy outermost, so that no order of `.layer` calls can put a layer that needs the
//!   peer outside it. The way to serve a router.
//! - [`AxumPeerAddrLayer`]: the copy as a Tower layer, for a service that is not a `Router`, or
//!   served some other way. It must be outside every layer that reads the peer address (in
//!   axum, added *after* them).
//!
//! A server on another major version of axum needs neither: insert the peer address as a
//! `SocketAddr` extension from that version's `ConnectInfo` (a dozen lines, as
//! [`AxumPeerAddr`] does), or turn on the feature of that version when this crate has one.
//!
//! ```no_run
//! use axum::{Router, routing::get};
//! use overload_signal::OverloadSignalLayer;
//! use overload_signal::axum_0_8::into_make_service_with_peer_addr;
//!
//! # async fn serve() -> std::io::Result<()> {
//! let app = Router::new()
//!     .route("/api", get(|| async { "hello" }))
//!     .layer(OverloadSignalLayer::new());
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! // In place of `app.into_make_service_with_connect_info::<SocketAddr>()`: axum's
//! // `ConnectInfo` is still there for handlers that extract it.
//! axum::serve(listener, into_make_service_with_peer_addr(app)).await
//! # }
//! ```

use std::net::SocketAddr;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::extract::connect_info::IntoMakeServiceWithConnectInfo;
use axum::response::{IntoResponse, Response};
use http::{Extensions, Request};
use tower_layer::Layer;
use tower_service::Service;

use crate::Overloaded;
use crate::protocol::{Protocol, stop_signal_response};

/// What `axum::serve` takes to serve `router` with the peer address in every request, where
/// the layers of this workspace read it: a [`SocketAddr`] extension, copied by
/// [`AxumPeerAddrLayer`] from axum's `ConnectInfo<SocketAddr>`.
///
/// The same as `router.layer(AxumPeerAddrLayer::new())
/// .into_make_service_with_connect_info::<SocketAddr>()`: the copy is the router's
/// outermost layer, outside every layer added before, whatever their order; and requests
/// keep axum's `ConnectInfo`, so handlers that extract it work as before.
///
/// ```no_run
/// use axum::{Router, routing::get};
/// use overload_signal::axum_0_8::into_make_service_with_peer_addr;
///
/// # async fn serve() -> std::io::Result<()> {
/// let app = Router::new().route("/", get(|| async { "hello" }));
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
/// axum::serve(listener, into_make_service_with_peer_addr(app)).await
/// # }
/// ```
pub fn into_make_service_with_peer_addr(
    router: Router,
) -> IntoMakeServiceWithConnectInfo<Router, SocketAddr> {
    router
        .layer(AxumPeerAddrLayer::new())
        .into_make_service_with_connect_info::<SocketAddr>()
}

/// Copies axum 0.8's `ConnectInfo<SocketAddr>` into a [`SocketAddr`] request extension,
/// where the layers of this workspace read the peer address; a request without it, or with
/// a `SocketAddr` already, goes through unchanged. Makes [`AxumPeerAddr`].
///
/// Outside every layer that reads the peer address: in axum, `.layer(..)` it after them
/// (the last call is the outermost). [`into_make_service_with_peer_addr`] does it for a
/// `Router`.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use http::Request;
/// use overload_signal::axum_0_8::AxumPeerAddrLayer;
/// use overload_signal::signal::peer_addr;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let service = ServiceBuilder::new()
///     .layer(AxumPeerAddrLayer::new())
///     .service(service_fn(|request: Request<()>| async move {
///         Ok::<_, std::convert::Infallible>(peer_addr(request.extensions()))
///     }));
/// let peer: SocketAddr = "192.0.2.7:50000".parse().unwrap();
/// let mut request = Request::new(());
/// request.extensions_mut().insert(ConnectInfo(peer));
/// assert_eq!(service.oneshot(request).await.unwrap(), Some(peer));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AxumPeerAddrLayer {
    _private: (),
}

impl AxumPeerAddrLayer {
    /// The layer (it has no settings).
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl<S> Layer<S> for AxumPeerAddrLayer {
    type Service = AxumPeerAddr<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AxumPeerAddr::new(inner)
    }
}

/// Middleware that copies axum 0.8's `ConnectInfo<SocketAddr>` into a [`SocketAddr`]
/// request extension; made by [`AxumPeerAddrLayer`].
#[derive(Clone, Copy, Debug)]
pub struct AxumPeerAddr<S> {
    inner: S,
}

impl<S> AxumPeerAddr<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        Self { inner }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S, B> Service<Request<B>> for AxumPeerAddr<S>
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
        copy_peer(request.extensions_mut());
        self.inner.call(request)
    }
}

/// Inserts the `SocketAddr` of axum's `ConnectInfo`, unless one is there already.
#[inline]
fn copy_peer(extensions: &mut Extensions) {
    // NOTE: a `SocketAddr` already there was put by the server's own connection code,
    // outside: it knows the peer at least as well.
    if extensions.get::<SocketAddr>().is_some() {
        return;
    }
    if let Some(&ConnectInfo(peer)) = extensions.get::<ConnectInfo<SocketAddr>>() {
        extensions.insert(peer);
    }
}

/// A handler that returns `Err(Overloaded)` answers with the HTTP stop signal: `503
/// Service Unavailable`, `X-Overloaded: stop-retrying`, empty body.
///
/// ```
/// use axum::response::IntoResponse;
/// use overload_signal::{Overloaded, protocol};
///
/// // In a handler: `async fn h() -> Result<String, Overloaded> { call_next_tier().await }`
/// let response = Overloaded::new().into_response();
/// assert_eq!(response.status(), 503);
/// assert!(protocol::is_stop_signal(response.headers()));
/// ```
impl IntoResponse for Overloaded {
    fn into_response(self) -> Response {
        stop_signal_response(Protocol::Http)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;
    use crate::signal::{ClientAddr, client_addr, peer_addr};

    /// The router's answer: the peer address its handler found, as text.
    async fn seen(router: Router, extensions: Extensions) -> String {
        let mut request = Request::get("/").body(axum::body::Body::empty()).unwrap();
        *request.extensions_mut() = extensions;
        let response = router
            .oneshot(request)
            .await
            .unwrap_or_else(|e: Infallible| match e {});
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    fn reporting() -> Router {
        Router::new().route(
            "/",
            get(|request: Request<axum::body::Body>| async move {
                format!("{:?}", peer_addr(request.extensions()))
            }),
        )
    }

    #[tokio::test]
    async fn the_layer_copies_connect_info_into_the_plain_contract() {
        let peer: SocketAddr = "198.51.100.4:9".parse().unwrap();
        let mut extensions = Extensions::new();
        extensions.insert(ConnectInfo(peer));
        // Without the adapter the layers see no peer: they read the plain contract only.
        assert_eq!(peer_addr(&extensions), None);
        assert_eq!(client_addr(&extensions), None);
        let router = reporting().layer(AxumPeerAddrLayer::new());
        assert_eq!(seen(router, extensions).await, format!("Some({peer})"));
    }

    #[tokio::test]
    async fn a_socket_addr_already_there_wins_and_a_request_without_connect_info_passes() {
        let (outer, info): (SocketAddr, SocketAddr) = (
            "192.0.2.1:1".parse().unwrap(),
            "192.0.2.2:2".parse().unwrap(),
        );
        let mut extensions = Extensions::new();
        extensions.insert(outer);
        extensions.insert(ConnectInfo(info));
        let router = reporting().layer(AxumPeerAddrLayer::new());
        assert_eq!(
            seen(router.clone(), extensions).await,
            format!("Some({outer})")
        );
        assert_eq!(seen(router, Extensions::new()).await, "None");
    }

    #[test]
    fn a_resolved_client_address_still_wins_over_the_copied_peer() {
        let mut extensions = Extensions::new();
        extensions.insert(ConnectInfo("10.0.0.2:40000".parse::<SocketAddr>().unwrap()));
        copy_peer(&mut extensions);
        assert_eq!(client_addr(&extensions), Some("10.0.0.2".parse().unwrap()));
        extensions.insert(ClientAddr::new("203.0.113.9".parse().unwrap()));
        assert_eq!(
            client_addr(&extensions),
            Some("203.0.113.9".parse().unwrap())
        );
    }
}
