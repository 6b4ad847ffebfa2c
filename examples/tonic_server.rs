//! A tonic server behind a rate limit and the overload layer, as the README's "A tonic
//! server" shows, called more often than its limit. The service is `tonic-health`'s health
//! service, standing for yours.
//!
//! Run from the repository's root: `cargo run --example tonic_server`. It prints how many
//! of 50 concurrent calls were answered `OK` and how many `RESOURCE_EXHAUSTED`, and the
//! pushback (`grpc-retry-pushback-ms`), `ratelimit-policy` and `ratelimit` metadata of one
//! rejection. It fails if the limit let every call through.

use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 10 calls a second, bursts of 5; the overload layer outside the limit.
    let limit = RateLimitLayer::new(TokenBucket::builder(10).burst(5).build()?);
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        // `Server::builder()`, with the peer address in each request (feature `tonic-0_14`).
        ratelimit_layer::tonic_0_14::server_builder()
            .layer(OverloadProtectionLayer::new(limit))
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("the server runs");
    });

    // 50 calls at once on one channel.
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let client = HealthClient::new(channel);
    let calls = (0..50).map(|_| {
        let mut client = client.clone();
        async move { client.check(HealthCheckRequest::default()).await }
    });
    let (mut ok, mut exhausted, mut rejection) = (0, 0, None);
    for answer in futures_util::future::join_all(calls).await {
        match answer {
            Ok(_) => ok += 1,
            Err(status) if status.code() == Code::ResourceExhausted => {
                exhausted += 1;
                rejection.get_or_insert(status);
            }
            Err(status) => return Err(format!("unexpected answer: {status}").into()),
        }
    }
    println!("OK: {ok}, RESOURCE_EXHAUSTED: {exhausted}");

    let rejection = rejection.ok_or("the limit let all 50 calls through")?;
    println!("one rejection's metadata:");
    for name in ["grpc-retry-pushback-ms", "ratelimit-policy", "ratelimit"] {
        let value = rejection.metadata().get(name).ok_or(format!("no {name}"))?;
        println!("  {name}: {}", value.to_str()?);
    }
    // A fresh bucket admits its whole burst; the rest of an instant's calls are rejected.
    assert!(ok >= 5, "the burst of 5 is served");
    assert!(exhausted > 0, "calls above the limit are rejected");
    Ok(())
}
