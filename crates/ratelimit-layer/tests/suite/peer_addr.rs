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
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tower::ServiceExt;
use tracing::Level;

use crate::support;
use support::Logs;

/// What another major version of axum puts in a request: a `ConnectInfo` of its own type,
/// which no layer built against axum 0.8 can name.
#[derive(Clone, Copy, Debug)]
struct ConnectInfo<T>(T);

/// A request as another axum major serves it: its peer only in that `ConnectInfo`.
fn request_from(peer: &str) -> Request<axum::body::Body> {
    let mut request = Request::get("/api")
        .body(axum::body::Body::empty())
        .unwrap();
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
    assert_eq!(
        errors.len(),
        1,
        "one ERROR line, at the first request: {errors:#?}"
    );
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
    assert!(
        statuses.iter().take(20).all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
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
        statuses
            .iter()
            .all(|s| *s == StatusCode::INTERNAL_SERVER_ERROR),
        "{statuses:?}"
    );
    let message = the_one_error(&logs);
    assert!(message.contains("ratelimit-layer"), "{message}");
}

/// A limit of one request per client (the bucket never refills: the clock does not move),
/// keyed by the client IP from the plain contract.
fn one_per_client() -> RateLimitLayer {
    RateLimitLayer::builder(TokenBucket::builder(1).burst(1).build().unwrap())
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap()
}

/// Two clients, each of its own /24 (and so of its own caller class however callers are
/// grouped); 127.0.0.0/8 all answers on the loopback interface.
const CLIENTS: [[u8; 4]; 2] = [[127, 0, 1, 1], [127, 0, 2, 1]];

/// A real axum 0.8 server served through the adapter: the limit keys each client by its own
/// address (two peers, two keys), and handlers still extract axum's `ConnectInfo`.
#[tokio::test]
async fn axum_served_through_the_adapter_keys_each_client() {
    use axum::extract::ConnectInfo;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;
    use ratelimit_layer::axum_0_8::into_make_service_with_peer_addr;

    let app = Router::new()
        .route(
            "/api",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }),
        )
        // Added last, so outermost in axum: still inside the adapter.
        .layer(OverloadProtectionLayer::new(one_per_client()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, into_make_service_with_peer_addr(app))
            .await
            .unwrap();
    });

    let (logs, _guard) = Logs::capture_from(&["ratelimit_layer", "overload_signal"]);
    let mut answers = Vec::new();
    for (client, times) in [(CLIENTS[0], 2), (CLIENTS[1], 1)] {
        let mut connector = HttpConnector::new();
        connector.set_local_address(Some(client.into()));
        let http = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(connector);
        for _ in 0..times {
            let response = http
                .request(Request::get(&url).body(Empty::new()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            answers.push((status, String::from_utf8(body.to_vec()).unwrap()));
        }
    }
    assert_eq!(
        answers,
        [
            (StatusCode::OK, "127.0.1.1".to_owned()),
            (StatusCode::TOO_MANY_REQUESTS, String::new()),
            (StatusCode::OK, "127.0.2.1".to_owned()),
        ]
    );
    assert_eq!(logs.at(Level::ERROR, ""), [], "every request had its peer");
    server.abort();
}

/// What one gRPC call got: `Ok`, or the status code.
async fn check(channel: tonic::transport::Channel) -> Result<(), tonic::Code> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await
        .map(drop)
        .map_err(|status| status.code())
}

/// A real tonic 0.14 server over plain TCP, with the adapter as its first (outermost)
/// layer: the limit keys each client by its own address.
#[tokio::test]
async fn tonic_through_the_adapter_layer_keys_each_client() {
    use ratelimit_layer::tonic_0_14::TonicPeerAddrLayer;
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Endpoint, Server};

    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        Server::builder()
            .layer(TonicPeerAddrLayer::new())
            .layer(OverloadProtectionLayer::new(one_per_client()))
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let (logs, _guard) = Logs::capture_from(&["ratelimit_layer", "overload_signal"]);
    let mut answers = Vec::new();
    for (client, times) in [(CLIENTS[0], 2), (CLIENTS[1], 1)] {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .local_address(Some(client.into()))
            .connect()
            .await
            .unwrap();
        for _ in 0..times {
            answers.push(check(channel.clone()).await);
        }
    }
    assert_eq!(
        answers,
        [Ok(()), Err(tonic::Code::ResourceExhausted), Ok(())]
    );
    assert_eq!(logs.at(Level::ERROR, ""), [], "every request had its peer");
    server.abort();
}

/// A real tonic 0.14 server over TLS, built with `server_builder`: the peer address is in
/// `TlsConnectInfo<TcpConnectInfo>`, and the limit keys each client by it.
#[tokio::test]
async fn tonic_over_tls_through_server_builder_keys_each_client() {
    use ratelimit_layer::tonic_0_14::server_builder;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    let server_cert = params.signed_by(&server_key, &ca, &ca_key).unwrap();

    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let identity = Identity::from_pem(server_cert.pem(), server_key.serialize_pem());
    let server = tokio::spawn(async move {
        server_builder()
            .tls_config(ServerTlsConfig::new().identity(identity))
            .unwrap()
            .layer(OverloadProtectionLayer::new(one_per_client()))
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let (logs, _guard) = Logs::capture_from(&["ratelimit_layer", "overload_signal"]);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    let mut answers = Vec::new();
    for (client, times) in [(CLIENTS[0], 2), (CLIENTS[1], 1)] {
        let channel = Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls.clone())
            .unwrap()
            .local_address(Some(client.into()))
            .connect()
            .await
            .unwrap();
        for _ in 0..times {
            answers.push(check(channel.clone()).await);
        }
    }
    assert_eq!(
        answers,
        [Ok(()), Err(tonic::Code::ResourceExhausted), Ok(())]
    );
    assert_eq!(logs.at(Level::ERROR, ""), [], "every request had its peer");
    server.abort();
}
