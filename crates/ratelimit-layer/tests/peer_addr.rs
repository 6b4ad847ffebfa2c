//! The peer address as a plain contract (issue 31, finding 8): the layers read a
//! `SocketAddr` (or `ClientAddr`) extension, and a server whose requests carry none says so
//! at once, at `ERROR`, with the fix, instead of answering `500` or putting every caller in
//! one class without a word.
//!
//! Before the fix the layers read axum 0.8's `ConnectInfo` and tonic 0.14's
//! `TcpConnectInfo` themselves: an application on another major version of axum had no peer
//! address, and learnt it from a `WARN` line that named a setup which did not help it
//! (`into_make_service_with_connect_info`, which it already used).

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use http::{Request, StatusCode};
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tower::ServiceExt;
use tracing::Level;

mod support;
use support::Logs;

/// What another major version of axum puts in a request: a `ConnectInfo` of its own type,
/// which no layer built against axum 0.8 can name.
#[derive(Clone, Copy, Debug)]
struct ConnectInfo<T>(T);

/// A request as another axum major serves it: its peer only in that `ConnectInfo`.
fn request_from(peer: &str) -> Request<axum::body::Body> {
    let mut request = Request::get("/api").body(axum::body::Body::empty()).unwrap();
    let peer: SocketAddr = peer.parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

/// Sends 50 requests from 50 clients (each of its own /24) through `app`; returns the
/// statuses.
async fn send(app: &Router) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for i in 0..50u8 {
        let response = app
            .clone()
            .oneshot(request_from(&format!("198.51.{i}.7:40000")))
            .await
            .unwrap_or_else(|e: Infallible| match e {});
        statuses.push(response.status());
    }
    statuses
}

/// The one `ERROR` line of `logs`, which must name the fix: the adapters' features, and the
/// plain contract for any other server.
fn the_one_error(logs: &Logs) -> String {
    let errors = logs.at(Level::ERROR, "");
    assert_eq!(errors.len(), 1, "one ERROR line, at the first request: {errors:#?}");
    let message = &errors[0].message;
    for fix in ["axum-0_8", "tonic-0_14", "SocketAddr"] {
        assert!(message.contains(fix), "the fix ({fix}) is named: {message}");
    }
    message.clone()
}

/// The README's axum server, served by another axum major: the overload layer finds no
/// caller. It says so once, at `ERROR`, at the first request; the requests are served.
#[tokio::test(start_paused = true)]
async fn the_readme_setup_without_a_peer_address_says_so_once_with_the_fix() {
    let (logs, _guard) = Logs::capture_from(&["ratelimit_layer", "overload_signal"]);
    let limit = RateLimitLayer::new(TokenBucket::builder(100).burst(20).build().unwrap());
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(OverloadProtectionLayer::new(limit));
    let statuses = send(&app).await;
    assert!(statuses.iter().take(20).all(|s| *s == StatusCode::OK), "{statuses:?}");
    let message = the_one_error(&logs);
    assert!(message.contains("overload-signal"), "{message}");
}

/// A per-client limit on a server without the peer address: every request is answered
/// `500` (the policy of a client-IP key, documented), and the server says why once, at
/// `ERROR`, with the fix, at the first request.
#[tokio::test(start_paused = true)]
async fn a_client_ip_limit_without_a_peer_address_says_so_once_with_the_fix() {
    let (logs, _guard) = Logs::capture_from(&["ratelimit_layer", "overload_signal"]);
    let limit = RateLimitLayer::builder(TokenBucket::builder(100).burst(20).build().unwrap())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(limit);
    let statuses = send(&app).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::INTERNAL_SERVER_ERROR),
        "{statuses:?}"
    );
    let message = the_one_error(&logs);
    assert!(message.contains("ratelimit-layer"), "{message}");
}
