//! `ratelimit-layer`'s `OverloadProtectionLayer` (the overload layer outside a limiter, as
//! one layer) on real servers on 127.0.0.1, in the two servers whose `.layer` calls nest in
//! opposite orders, and the missing-key policy where the key goes missing in practice:
//!
//! - tonic: the stop signal fires behind the combined layer; the README's axum order copied
//!   onto tonic's `Server::layer` leaves the overload layer under the limiter, where it sees
//!   one request and never fires (finding 4 of the trust issue);
//! - axum: the stop signal fires for a storm against a global limit; against a per-client
//!   limit, the client that storms its own quota is told to stop and a client merely over
//!   its own quota keeps its plain `429`;
//! - axum served without the peer address (`into_make_service_with_peer_addr`): a
//!   per-client-IP limit answers `500` instead of putting every client in one bucket
//!   (finding 3).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_signal::axum_0_8::into_make_service_with_peer_addr;
use overload_signal::protocol::{self, Attempt};
use overload_signal::{OverloadSignalLayer, StopRule};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// The stop signal from the fifth request in the window with more than 10 % retries.
fn quick_rule() -> StopRule {
    StopRule::builder()
        .retry_share(0.1)
        .min_requests(5)
        .build()
        .unwrap()
}

/// A limit that admits `burst` requests, ever (a clock that never moves).
fn admits(burst: u32) -> ratelimit_layer::RateLimitBuilder<TokenBucket, FakeClock> {
    RateLimitLayer::builder(TokenBucket::builder(1).burst(burst).build().unwrap())
        .clock(FakeClock::new())
}

/// A tonic health server on 127.0.0.1 behind `$layer`s (each given to `Server::layer`, in
/// order), and a client connected to it. (A macro: tonic's bounds on a layer are long to
/// write out.)
macro_rules! tonic_server {
    ($($layer:expr),+) => {{
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // `Server::builder()` with the peer address in each request, as the README shows.
        let mut server = overload_signal::tonic_0_14::server_builder()$(.layer($layer))+;
        tokio::spawn(async move {
            server
                .add_service(health)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        HealthClient::new(channel)
    }};
}

/// Sends 10 health checks, each claiming to be a second retry; returns the gRPC codes.
async fn ten_retries(client: &mut HealthClient<Channel>) -> Vec<tonic::Code> {
    let mut codes = Vec::new();
    for _ in 0..10 {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request
            .metadata_mut()
            .insert("x-request-attempt", "2".parse().unwrap());
        let code = match client.check(request).await {
            Ok(_) => tonic::Code::Ok,
            Err(status) => {
                if status.code() == tonic::Code::Unavailable {
                    assert_eq!(
                        status.metadata().get("x-overloaded").unwrap(),
                        "stop-retrying"
                    );
                    assert_eq!(
                        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
                        "-1"
                    );
                }
                status.code()
            }
        };
        codes.push(code);
    }
    codes
}

#[tokio::test]
async fn tonic_fires_the_stop_signal_behind_the_combined_layer() {
    use tonic::Code::{Ok, ResourceExhausted as Limited, Unavailable as Stop};
    // Callers told apart by their TCP peer, which tonic puts in every request.
    let signal = OverloadSignalLayer::builder()
        .rule(quick_rule())
        .key_by(|parts: &Parts| {
            parts
                .extensions
                .get::<TcpConnectInfo>()?
                .remote_addr()
                .map(|a| a.ip())
        })
        .build()
        .unwrap();
    let histogram = signal.histogram().clone();
    let protection = OverloadProtectionLayer::builder(admits(1).build().unwrap())
        .signal(signal)
        .build()
        .unwrap();
    let mut client = tonic_server!(protection);
    let codes = ten_retries(&mut client).await;
    assert_eq!(
        codes,
        [
            Ok, Limited, Limited, Limited, Stop, Stop, Stop, Stop, Stop, Stop
        ]
    );
    assert_eq!(histogram.snapshot().total(), 10, "it saw every request");
}

#[tokio::test]
async fn tonic_with_the_axum_order_never_fires() {
    // The README's former axum stack, `.layer(limit).layer(signal)`, copied onto tonic:
    // tonic's `Server::layer` makes the first call the outermost, so the limiter answers
    // first and the overload layer only ever sees the one request it admits.
    let signal = OverloadSignalLayer::builder()
        .rule(quick_rule())
        .build()
        .unwrap();
    let histogram = signal.histogram().clone();
    let mut client = tonic_server!(admits(1).build().unwrap(), signal);
    let codes = ten_retries(&mut client).await;
    assert_eq!(codes[0], tonic::Code::Ok);
    assert!(
        codes[1..]
            .iter()
            .all(|&c| c == tonic::Code::ResourceExhausted),
        "{codes:?}"
    );
    assert_eq!(histogram.snapshot().total(), 1, "it saw one request");
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn client_from(source: Ipv4Addr) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(IpAddr::V4(source)));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Serves `/api` behind `protection` on 127.0.0.1, with or without the peer address.
async fn axum_server<L>(protection: L, peer_addr: bool) -> String
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<axum::extract::Request> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Response:
        axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Error:
        Into<std::convert::Infallible> + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Future: Send + 'static,
{
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(protection);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    tokio::spawn(async move {
        if peer_addr {
            axum::serve(listener, into_make_service_with_peer_addr(app)).await
        } else {
            axum::serve(listener, app).await
        }
        .unwrap();
    });
    url
}

/// Sends a request with attempt counter `attempt`; returns its status and whether it
/// carried the stop signal.
async fn get_with(client: &HttpClient, url: &str, attempt: u32) -> (StatusCode, bool) {
    let mut request = Request::get(url).body(Empty::new()).unwrap();
    Attempt::set(request.headers_mut(), attempt);
    let response = client.request(request).await.unwrap();
    (
        response.status(),
        protocol::is_stop_signal(response.headers()),
    )
}

#[tokio::test]
async fn axum_fires_the_stop_signal_behind_the_combined_layer() {
    // A global limit that admits one request; retries pile up behind it.
    let protection = OverloadProtectionLayer::builder(admits(1).build().unwrap())
        .signal(
            OverloadSignalLayer::builder()
                .rule(quick_rule())
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let url = axum_server(protection, true).await;
    let client = client_from(Ipv4Addr::LOCALHOST);
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(get_with(&client, &url, 1).await);
    }
    let (ok, limited, stop) = (
        (StatusCode::OK, false),
        (StatusCode::TOO_MANY_REQUESTS, false),
        (StatusCode::SERVICE_UNAVAILABLE, true),
    );
    assert_eq!(answers, [ok, limited, limited, limited, stop, stop]);
}

#[tokio::test]
async fn axum_per_client_limits_stop_only_the_client_that_storms() {
    // Each client IP may send 2 requests, ever; the overload layer tells callers apart by the
    // same address, which the server puts in every request.
    let client_ip = ClientIp::new();
    let limit = admits(2)
        .key_by_client_ip(client_ip.clone())
        .build()
        .unwrap();
    let protection = OverloadProtectionLayer::builder(limit)
        .signal(
            OverloadSignalLayer::builder()
                .rule(quick_rule())
                .key_by(client_ip)
                // The same classes on every run (two clients share one with a chance of 1 in
                // 128 under a random key).
                .caller_seed(1)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let url = axum_server(protection, true).await;
    let (storm, calm) = (
        client_from(Ipv4Addr::new(127, 0, 21, 1)),
        client_from(Ipv4Addr::new(127, 0, 22, 1)),
    );
    // The calm client sends first tries over its quota, the storm client retries.
    let mut calm_answers = Vec::new();
    let mut storm_answers = Vec::new();
    for _ in 0..8 {
        calm_answers.push(get_with(&calm, &url, 0).await);
        storm_answers.push(get_with(&storm, &url, 2).await);
    }
    // The whole server's window is half retries, but each rejection concerns one client:
    // the calm one's stay plain 429s.
    assert!(
        calm_answers[2..]
            .iter()
            .all(|&a| a == (StatusCode::TOO_MANY_REQUESTS, false)),
        "{calm_answers:?}"
    );
    // The storm client is told to stop once its own class holds 5 requests.
    assert_eq!(
        storm_answers[4..],
        [(StatusCode::SERVICE_UNAVAILABLE, true); 4]
    );
}

#[tokio::test]
async fn axum_without_connect_info_answers_500_rather_than_one_shared_bucket() {
    // Regression for finding 3: the key is the peer address, which an axum server puts in
    // its requests only when served with it; without it every client shared one bucket,
    // silently.
    let client_ip = ClientIp::new();
    let limit = admits(2).key_by_client_ip(client_ip).build().unwrap();
    let url = axum_server(OverloadProtectionLayer::new(limit), false).await;
    let client = client_from(Ipv4Addr::LOCALHOST);
    for _ in 0..3 {
        assert_eq!(
            get_with(&client, &url, 0).await,
            (StatusCode::INTERNAL_SERVER_ERROR, false)
        );
    }
    // Served with it, the same layer limits per client.
    let client_ip = ClientIp::new();
    let limit = admits(2).key_by_client_ip(client_ip).build().unwrap();
    let url = axum_server(OverloadProtectionLayer::new(limit), true).await;
    let statuses = [
        get_with(&client, &url, 0).await.0,
        get_with(&client, &url, 0).await.0,
        get_with(&client, &url, 0).await.0,
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}
