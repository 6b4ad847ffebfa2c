//! `OverloadSignalLayer` in the other places it must fit, end to end on 127.0.0.1:
//!
//! - a tonic server, in front of `ratelimit-layer`: gRPC `RESOURCE_EXHAUSTED` rejections
//!   become the gRPC stop signal (`UNAVAILABLE`, pushback `-1`) once the attempt counters
//!   show a retry storm;
//! - the second propagation path: an axum handler whose downstream call runs in a spawned
//!   task (outside the propagation scope) returns `Overloaded`, and the `axum` feature's
//!   `IntoResponse` answers with the stop signal.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use backoff_layer::RetryLayer;
use backoff_layer::backoff::Fixed;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use integration_tests::TestServer;
use overload_signal::protocol::{self, Protocol};
use overload_signal::{OverloadSignalLayer, Overloaded, StopRule, is_overloaded};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{Layer, ServiceBuilder, ServiceExt};

#[tokio::test]
async fn tonic_rejections_become_the_grpc_stop_signal_in_a_retry_storm() {
    // One request admitted, ever (a fake clock that never moves); the overload layer judges
    // after 5 requests with more than 10 % retries.
    let limit = RateLimitLayer::builder(TokenBucket::new(1).unwrap())
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let signal = OverloadSignalLayer::builder()
        .rule(
            StopRule::builder()
                .retry_share(0.1)
                .min_requests(5)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let histogram = signal.histogram().clone();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        // With the peer address where the overload layer reads it.
        overload_signal::tonic_0_14::server_builder()
            .layer(ServiceBuilder::new().layer(signal).layer(limit))
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
    let mut client = HealthClient::new(channel);
    let check = |attempt: &'static str| {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request
            .metadata_mut()
            .insert("x-request-attempt", attempt.parse().unwrap());
        request
    };

    // First try: admitted.
    let ok = client.check(check("0")).await.unwrap();
    assert_eq!(ok.into_inner().status, 1, "SERVING");
    // Retries, rejected by the limiter; until the window holds 5 requests the rejection
    // passes through as the node-local RESOURCE_EXHAUSTED.
    for _ in 0..3 {
        let status = client.check(check("1")).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.metadata().get("x-overloaded").is_none());
    }
    // The fifth request: 4 retries of 5, the rule fires: the gRPC stop signal.
    for _ in 0..3 {
        let status = client.check(check("2")).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(
            status.metadata().get("grpc-retry-pushback-ms").unwrap(),
            "-1"
        );
        assert_eq!(
            status.metadata().get("x-overloaded").unwrap(),
            "stop-retrying"
        );
        assert_eq!(status.message(), "system overloaded, stop retrying");
    }
    let window = histogram.snapshot();
    assert_eq!(window.total(), 7);
    assert_eq!(window.retries(), 6);
    server.abort();
}

#[tokio::test]
async fn overloaded_from_a_spawned_task_answers_with_the_stop_signal() {
    // The downstream tier always answers with the stop signal.
    let downstream = TestServer::start(|_req: Request<hyper::body::Incoming>| async {
        protocol::stop_signal_response::<Full<Bytes>>(Protocol::Http)
    })
    .await
    .unwrap();
    let url = downstream.url("/api");
    let client = RetryLayer::builder()
        .backoff(Fixed::every(Duration::from_millis(10)).unwrap())
        .build()
        .unwrap()
        .layer(
            Client::builder(TokioExecutor::new())
                .build_http::<backoff_layer::ReplayBody<Empty<Bytes>>>(),
        );

    // The handler calls downstream from a spawned task, so the propagation marker cannot
    // reach the layer; it returns the typed error instead, and `IntoResponse` does the rest.
    let handler = move || {
        let client = client.clone();
        let url = url.clone();
        async move {
            let call = client.oneshot(Request::get(url).body(Empty::new()).unwrap());
            match tokio::spawn(call).await.unwrap() {
                Ok(_) => Ok("ok"),
                Err(e) if is_overloaded(&*e) => Err(Overloaded::new()),
                Err(e) => panic!("unexpected downstream error: {e}"),
            }
        }
    };
    let app = Router::new()
        .route("/api", get(handler))
        .layer(OverloadSignalLayer::new());

    let response = app
        .oneshot(
            Request::get("/api")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(protocol::is_stop_signal(response.headers()));
}
