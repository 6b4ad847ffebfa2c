//! Criticality: what matters most is served first. An axum server behind a rate limit and
//! the overload layer, which read each request's level from `X-Request-Criticality` with no
//! code on the server; clients send `critical` requests at half the limit and `sheddable`
//! ones at four times it, for 3 seconds.
//!
//! Run from the repository's root: `cargo run --example criticality`. It prints, per level,
//! how many requests were sent and how many served: `sheddable` is shed, `critical` served.
//! It fails if more than a tenth of `critical` was rejected, or `sheddable` was not shed.
//!
//! A client behind `backoff-layer`'s retry layer sets the level with
//! `request.extensions_mut().insert(Criticality::Sheddable)` instead of the header.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::{net::TcpListener, task::JoinSet};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 50 requests a second, bursts of 20, for every level: nothing per level to configure.
    let limit = RateLimitLayer::new(TokenBucket::builder(50).burst(20).build()?);
    let app = Router::new()
        .route("/api", get(|| async { "hello" }))
        .layer(OverloadProtectionLayer::new(limit));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/api", listener.local_addr()?);
    tokio::spawn(async move {
        let app = ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app);
        axum::serve(listener, app).await.expect("the server runs");
    });

    // Every 10 ms, two `sheddable` requests (200 a second), and every 40 ms one `critical`
    // (25 a second): together 4.5 times the limit.
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut calls = JoinSet::new();
    for i in 0..300 {
        tick.tick().await;
        let critical = (i % 4 == 0).then_some(Criticality::Critical);
        for level in critical.into_iter().chain([Criticality::Sheddable; 2]) {
            let request = Request::get(&url)
                .header(X_REQUEST_CRITICALITY, level.as_str())
                .body(Empty::new())?;
            let call = client.request(request);
            calls.spawn(async move { (level, call.await.map(|response| response.status())) });
        }
    }
    // Per level: [sent, served].
    let mut counts = BTreeMap::<Criticality, [u32; 2]>::new();
    while let Some(call) = calls.join_next().await {
        let (level, status) = call?;
        let status = status.map_err(|e| format!("the server did not answer: {e}"))?;
        let count = counts.entry(level).or_default();
        count[0] += 1;
        match status {
            StatusCode::OK => count[1] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => return Err(format!("unexpected status {other}").into()),
        }
    }
    for (level, [sent, served]) in &counts {
        println!("{:<9} sent {sent:>3}, served {served:>3}", level.as_str());
    }

    let [sent, served] = counts[&Criticality::Critical];
    assert!(served * 10 >= sent * 9, "critical is served");
    let [sent, served] = counts[&Criticality::Sheddable];
    assert!(served * 2 < sent, "sheddable is shed");
    Ok(())
}
