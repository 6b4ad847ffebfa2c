//! The layer in a tonic server, end to end on 127.0.0.1, with the real gRPC health service,
//! keyed by the peer address the tonic 0.14 adapter copies from tonic's `TcpConnectInfo`.

use std::time::Duration;

use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::tonic_0_14::server_builder;
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn tonic_server_answers_resource_exhausted_with_pushback() {
    let layer = RateLimitLayer::builder(TokenBucket::builder(4).burst(1).build().unwrap())
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        server_builder()
            .layer(layer)
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
    let first = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(first.into_inner().status, 1, "SERVING");

    let status = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded, retry later");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "250"
    );

    server.abort();
}
